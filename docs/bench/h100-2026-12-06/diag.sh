#!/usr/bin/env bash
# ResNet-18 at N=64 through mps: which processes fall behind and where their threads and the
# server's, sampled during the window; then the same N with a thread per client.
# Results in $OUT/d.tgz. Carry .device-bin.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/d; D=$W/diag
rm -rf $W /tmp/mps-real-bench /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe; mkdir -p $D
GDB=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/d.tgz d); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; echo "gdb=$GDB"; } > $W/machine.txt
cpu() { for p in $(pgrep -f "serve.py infer"); do echo "$p $(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null)"; done | sort > $D/cpu.$1; }
threads() { for t in /proc/$1/task/*; do echo "$(basename $t) $(cat $t/comm) $(awk '{print $3, $14+$15}' $t/stat) $(cat $t/wchan) | $(cat $t/syscall)"; done; }
sampler() {
  while [ ! -e /tmp/mps-real-bench/go ]; do sleep 0.2; done
  sleep 1.5; cpu a; sleep 1.5; cpu b
  join $D/cpu.a $D/cpu.b | awk '{print $3-$2, $1}' | sort -n > $D/cpu-delta
  local sp; sp=$(pgrep -x mps-server | head -1)
  threads $sp > $D/threads.server.1
  for p in $(head -2 $D/cpu-delta | awk '{print $2}'); do
    threads $p > $D/threads.$p
    timeout 40 $GDB -p $p -batch -ex "thread apply all bt 30" > $D/bt.$p 2>&1
  done
  threads $sp > $D/threads.server.2
  timeout 60 $GDB -p $sp -batch -ex "thread apply all bt 25" > $D/bt.server 2>&1
  S "sampled"
}
sampler &
(cd $R && timeout 200 python3 bench.py $B $W/n64 --models resnet18 --clients 64 --rounds 1 --seconds 10 --modes mps > $W/n64.txt 2>&1)
S "n64 rc=$?"; cat $W/n64/bench.md; wait
pkill -x mps-control; pkill -x mps-server; sleep 1
(cd $R && timeout 130 python3 bench.py $B $W/n64b --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes "mps:--session-workers=0" > $W/n64b.txt 2>&1)
S "n64b rc=$?"; cat $W/n64b/bench.md
pkill -x mps-control; pkill -x mps-server
S done
