#!/usr/bin/env bash
# The driver's writers given priority (`--driver-writer-priority on`: other calls held back once
# a capture's start or an instantiation has waited 200 µs, for 1 ms at most) against without,
# and session workers that neither spin nor yield, one command per STEP:
#   STEP=a  1. ResNet-18 at N=64 through mps, priority off and on.
#           2. ResNet-18 and BERT-base at N=16 beside NVIDIA MPS, priority off and on, and
#              workers that sleep at once (--spin-us 0 --yield-us 0), in ROUNDS16 rounds.
#   STEP=b  the gpu, graphs, e2e and workers suites (scripts/test-gpu run), with the priority
#           on (a wrapper in place of .device-bin/mps-server passes the flag); then BERT-base's and
#           ResNet-18's driver calls in 500 requests, natively (trace_driver.c).
#   STEP=c  ResNet-18 and BERT-base at N=32, the modes of part 2 and clients that do not spin
#           or yield either; then mps-bench infer and infer-graph at N=8 and 16 beside NVIDIA MPS.
#   STEP=one  1 (N=64), 2 in one round, BERT-base's trace and the graphs, gpu and workers suites,
#           within DEADLINE (570) seconds.
# Results in $OUT/$STEP.tgz, re-made after each part. Carry .device-bin (scripts/test-gpu build,
# and mps-bench beside it).
set -u
export NCCL_NVLS_ENABLE=0
STEP=${STEP:-a}
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/$STEP; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/$STEP.tgz $STEP); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
nvidia_quit() { echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  nvidia_quit; rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  grep -r "launch batching:" $W/$n/mps-logs > $W/$n.batching.txt 2>/dev/null
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  wc -l $W/$n.stalls.txt; rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
PRIO=mps:--driver-writer-priority=on
QUIET=mps:--spin-us=0,--yield-us=0
# Clients whose waits sleep at once too.
QUIETER=$QUIET,MPS_CLIENT_SPIN_US=0,MPS_CLIENT_YIELD_US=0
suites() { # timeout suites...
  local t=$1; shift
  # The real binary keeps its name (tests look for mps-server processes).
  mkdir -p $B/real && mv $B/mps-server $B/real/mps-server
  printf '#!/bin/sh\nexec %s --driver-writer-priority on "$@"\n' $B/real/mps-server > $B/mps-server
  chmod +x $B/mps-server
  timeout $t scripts/test-gpu run "$@" > $W/suites.txt 2>&1
  S "suites rc=$?"; grep -E "^test result|FAILED|panicked" $W/suites.txt | tail -20
  sed -n '/^== summary/,$p' $W/suites.txt
  # scripts/test-gpu looks for servers left behind under .device-bin/ itself.
  pgrep -af "$B/real/mps-server" && { echo "servers left running"; pkill -KILL -f "^$B/real/mps-server"; }
  mv $B/real/mps-server $B/mps-server
}
traces() { # models...
  # Each model's driver calls per request, natively (the calls that end a batched run).
  HERE=$(cd "$(dirname "$0")" && pwd)
  cc -O2 -shared -fPIC -o $W/libtr.so $HERE/trace_driver.c -ldl -lpthread
  for m in "$@"; do
    LD_PRELOAD=$W/libtr.so TRACE_OUT=$W/trace.$m.txt timeout 120 python3 $HERE/trace_model.py $m 500 > $W/trace.$m.out 2>&1
    S "trace $m rc=$?"; awk '/^== steady/{f=1;next} /^==/{f=0} f' $W/trace.$m.txt | sort -rn | head -25
  done
}
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - t0) )); }
case $STEP in
one)
  # The most wanted parts of a, b and c in one command of at most DEADLINE seconds.
  bench n64 ${NT64:-170} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps,$PRIO
  bench n16 ${NT16:-200} --models resnet18,bert --clients 16 --rounds 1 --seconds 4 \
    --modes ${MODES16:-nvidia-mps,mps,$PRIO,$QUIET}
  traces bert
  [ "$(left)" -gt 60 ] && suites $(( $(left) - 5 )) graphs gpu workers
  ;;
a)
  bench n64 ${NT64:-200} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps,$PRIO
  bench n16 ${NT16:-380} --models resnet18,bert --clients 16 --rounds ${ROUNDS16:-2} --seconds 4 \
    --modes nvidia-mps,mps,$PRIO,$QUIET
  ;;
b)
  suites ${NTS:-560} gpu graphs e2e workers
  traces bert resnet18
  ;;
c)
  bench n32 ${NT32:-560} --models resnet18,bert --clients 32 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps,$PRIO,$QUIET,$QUIETER
  timeout 80 $B/mps-bench run --modes nvidia-mps,mps --workloads infer,infer-graph --clients 8,16 \
    --ptx $ROOT/kernels/test_kernels.ptx --server $B/mps-server --out $W/mb > $W/mb.txt 2>&1
  S "mps-bench rc=$?"; grep "^|" $W/mb.txt | head -20
  ;;
esac
nvidia_quit
pkill -x mps-control; pkill -x mps-server
S done
