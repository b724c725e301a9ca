#!/usr/bin/env bash
# Real models through mps once the busy sampler queries each stream under its own lock
# (725a988), beside NVIDIA MPS, on the GPU.
#   STEP=e: ResNet-18 at N=64 through mps; ResNet-18 and BERT-base at N=32 beside NVIDIA MPS.
#   STEP=f: the MLP, ResNet-18 and BERT-base at N=8 and N=16 beside NVIDIA MPS, one round.
#   STEP=g: the gpu, graphs, e2e and workers suites.
#   STEP=h: ResNet-18 at N=64 through mps: the defaults, launch batching off, a green context
#           per client; 64 busy streams of one native process (fair.c); the MLP at N=8 beside
#           NVIDIA MPS, batching on and off; BERT-base at N=32 through mps, batching on and off
#           and with session workers that sleep at once (no spinning or yielding).
# Results in $OUT/$STEP.tgz, re-made after each part. Carry .device-bin (release binaries).
set -u
STEP=${STEP:-e}
MODES=${MODES:-nvidia-mps,mps}
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/$STEP; rm -rf $W; mkdir -p $W
rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/$STEP.tgz $STEP); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $W/machine.txt
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  grep -r "launch batching: [0-9]" $W/$n/mps-logs > $W/$n.batching.txt 2>/dev/null
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  [ $n = n64 ] || rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
if [ $STEP = e ]; then
  bench n64 ${N64_TIMEOUT:-100} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps
  bench n32 ${N32_TIMEOUT:-200} --models resnet18,bert --clients 32 --rounds 1 --seconds 4 --modes $MODES
elif [ $STEP = f ]; then
  bench n8 ${N8_TIMEOUT:-170} --models mlp,resnet18,bert --clients 8 --rounds 1 --seconds 4 --modes $MODES
  bench n16 ${N16_TIMEOUT:-200} --models mlp,resnet18,bert --clients 16 --rounds 1 --seconds 4 --modes $MODES
elif [ $STEP = h ]; then
  # Where the server's threads are 1 and 2.5 s into the first N=64 window (batching on): each
  # thread's name, state, CPU ticks, kernel wait channel, system call and kernel stack.
  threads() { for t in /proc/$1/task/*; do echo "$(basename $t) $(cat $t/comm) $(awk '{print $3, $14+$15}' $t/stat) $(cat $t/wchan) | $(cat $t/syscall)"; sed 's/^/    /' $t/stack 2>/dev/null; done; }
  sampler() {
    while [ ! -e /tmp/mps-real-bench/go ]; do sleep 0.1; done
    sleep 1; threads $(pgrep -x mps-server | head -1) > $W/threads.server.1
    sleep 1.5; threads $(pgrep -x mps-server | head -1) > $W/threads.server.2
  }
  sampler &
  bench n64 ${N64_TIMEOUT:-170} --models resnet18 --clients 64 --rounds 1 --seconds 4 \
    --modes ${N64_MODES:-mps,mps:--launch-batching=off,mps:--context-per-client=on}
  # The same in one native process: 64 threads, each a stream, one context.
  cuda_h=$(ls /usr/local/cuda/include/cuda.h 2>/dev/null || find / -name cuda.h -path '*cu13/include/*' 2>/dev/null | head -1)
  cc -O2 -I$(dirname $cuda_h) $ROOT/docs/bench/h100-2026-12-06-locks/fair.c -o $W/fair -lcuda -lpthread
  for c in 32 8; do CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 30 $W/fair 64 4 20 > $W/fair.$c.txt 2>&1; S "fair $c rc=$?"; head -4 $W/fair.$c.txt; done
  bench n8 ${N8_TIMEOUT:-100} --models mlp --clients 8 --rounds 1 --seconds 4 --modes nvidia-mps,mps,mps:--launch-batching=off
  bench n32 ${N32_TIMEOUT:-170} --models bert --clients 32 --rounds 1 --seconds 4 \
    --modes ${N32_MODES:-mps,mps:--launch-batching=off,mps:--spin-us=0,--yield-us=0}
else
  for s in ${SUITES:-gpu graphs e2e workers}; do
    (cd $ROOT && timeout ${SUITE_TIMEOUT:-150} scripts/test-gpu run $s > $W/$s.txt 2>&1); S "$s rc=$?"
    tail -4 $W/$s.txt; pkill -x mps-control; pkill -x mps-server
  done
fi
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
