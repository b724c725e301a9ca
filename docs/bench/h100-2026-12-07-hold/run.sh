#!/usr/bin/env bash
# Where 64 ResNet-18 clients' cluster launches wait, and batch pacing at N=16 and N=32, one command:
#   1. ResNet-18 at N=64 through mps (defaults). At the server's first stall line, each server
#      thread's kernel state (/proc) and then every thread's backtrace (cuda-gdb attached once;
#      the server keeps its symbols) where GDB_ATTACH=1. The attach pauses the server: that
#      run's numbers are not a measurement (and on 2026-12-07 cuda-gdb printed no backtraces).
#      Then the same under NVIDIA MPS (N64_MODES).
#   2. fair.c with one cluster launch a request (CLUSTER=2), without and with 100 KB of dynamic
#      shared memory a block: whether NVIDIA's driver holds cluster launches of one context.
#   3. MODELS at N (N=16 by default) beside NVIDIA MPS: batch pacing off (the default) and on.
# Results in $OUT/h.tgz, re-made after each part. Carry .device-bin (release binaries).
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/h; rm -rf $W; mkdir -p $W
rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/h.tgz h); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
nvidia_quit() { echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  nvidia_quit; rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  grep -r "launch batching: [0-9]" $W/$n/mps-logs > $W/$n.batching.txt 2>/dev/null
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
threads() { for t in /proc/$1/task/*; do echo "$(basename $t) $(cat $t/comm) $(awk '{print $3, $14+$15}' $t/stat) $(cat $t/wchan) | $(cat $t/syscall)"; sed 's/^/    /' $t/stack 2>/dev/null; done; }
GDB=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
if [ ${SKIP_N64:-0} = 0 ]; then
  (
    for i in $(seq 1 400); do
      if grep -rqs "in the server's hands for" $W/n64/mps-logs; then
        p=$(pgrep -x mps-server | head -1); echo "stall seen at $(date -u +%T.%N)" > $W/stall.when
        threads $p > $W/threads.stall
        if [ ${GDB_ATTACH:-0} = 1 ]; then
          timeout 90 $GDB -batch -p $p -ex "set pagination off" -ex "info threads" -ex "thread apply all bt 16" > $W/bt.txt 2>&1
          echo "gdb done at $(date -u +%T.%N) rc=$?" >> $W/stall.when
        fi
        break
      fi; sleep 0.2
    done
  ) &
  bench n64 ${N64_TIMEOUT:-200} --models resnet18 --clients 64 --rounds 1 --seconds 4 \
    --modes ${N64_MODES:-mps,nvidia-mps}
  wait
fi
if [ ${SKIP_FAIR:-0} = 0 ]; then
cuda_h=$(ls /usr/local/cuda/include/cuda.h 2>/dev/null || find / -name cuda.h -path '*cu13/include/*' 2>/dev/null | head -1)
cc -O2 -I$(dirname $cuda_h) $ROOT/docs/bench/h100-2026-12-06-locks/fair.c -o $W/fair -lcuda -lpthread
for sh in 0 100000; do
  CUDA_DEVICE_MAX_CONNECTIONS=32 CLUSTER=2 SHMEM=$sh timeout 30 $W/fair 64 4 20 > $W/fair.cluster.$sh.txt 2>&1
  S "fair cluster shmem $sh rc=$?"; head -1 $W/fair.cluster.$sh.txt; tail -n +2 $W/fair.cluster.$sh.txt | sort -n | head -2
  echo "longest:"; tail -n +2 $W/fair.cluster.$sh.txt | sort -n -k4 | tail -1
  echo "slowest launch call:"; tail -n +2 $W/fair.cluster.$sh.txt | sort -n -k8 | tail -1
done
fi
bench n${N:-16} ${NT:-330} --models ${MODELS:-mlp,resnet18,bert} --clients ${N:-16} --rounds 1 --seconds 4 \
  --modes ${MODES:-nvidia-mps,mps,mps:--batch-pacing=on}
nvidia_quit
S done
