#!/usr/bin/env bash
# Batch pacing at N=16 and N=32, and where 64 ResNet-18 clients' session workers are when the
# server first reports a stall, one command:
#   1. MODELS at N=16 beside NVIDIA MPS: batch pacing off (the default) and on.
#   2. ResNet-18 at N=64 through mps (defaults), mps-server with stackdump.so preloaded. At the
#      first stall line every server thread writes its return addresses three times, at 0, 0.5
#      and 1 s (stackdump <pid>); resolve.py names them against the saved maps and the binaries'
#      symbols (the server keeps its own).
#   3. MODELS at N=32 as in 1.
# Results in $OUT/h.tgz, re-made after each part. Carry .device-bin (release binaries).
# SKIP=1,3 skips parts; N64_TIMEOUT, NT16, NT32 bound each part; MODELS16, MODELS32 and MODES32
# change parts 1 and 3.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/h; rm -rf $W; mkdir -p $W
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/h.tgz h); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
skip() { case ",${SKIP:-}," in *",$1,"*) return 0;; esac; return 1; }
nvidia_quit() { echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
bench() { # name timeout bin-dir args...
  local n=$1 t=$2 b=$3; shift 3
  nvidia_quit; rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
  (cd $R && timeout $t python3 bench.py $b $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  grep -r "launch batching: [0-9]" $W/$n/mps-logs > $W/$n.batching.txt 2>/dev/null
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
pacing() { # N timeout models modes
  bench n$1 $2 $B --models $3 --clients $1 --rounds 1 --seconds 4 --modes $4
}
PACING=nvidia-mps,mps,mps:--batch-pacing=on
skip 1 || pacing 16 ${NT16:-240} ${MODELS16:-mlp,resnet18,bert} $PACING
if ! skip 2; then
  cc -O2 -shared -fPIC -o $W/stackdump.so $HERE/stackdump.c && cc -O2 -DSTACKDUMP_MAIN -o $W/stackdump $HERE/stackdump.c || S "stackdump build failed"
  # The same binaries, mps-server started with the preload (mps-control passes its environment).
  B2=$W/bin; mkdir -p $B2 $W/dump; for f in $B/*; do ln -s $f $B2/; done; rm $B2/mps-server
  printf '#!/bin/sh\nSTACKDUMP_DIR=%s LD_PRELOAD=%s exec %s "$@"\n' $W/dump $W/stackdump.so $B/mps-server > $B2/mps-server
  chmod +x $B2/mps-server
  (
    for i in $(seq 1 600); do
      if grep -rqs "in the server's hands for" $W/n64/mps-logs; then
        p=$(pgrep -x mps-server | head -1); echo "stall seen at $(date -u +%T.%N)" > $W/stall.when
        cp /proc/$p/maps $W/dump/maps
        for t in /proc/$p/task/*; do echo "$(basename $t) $(cat $t/comm)"; done > $W/dump/comm
        for k in 1 2 3; do $W/stackdump $p >> $W/stall.when; echo "dump $k at $(date -u +%T.%N)" >> $W/stall.when; sleep 0.5; done
        break
      fi; sleep 0.1
    done
  ) &
  bench n64 ${N64_TIMEOUT:-150} $B2 --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps
  wait
  python3 $HERE/resolve.py $W/dump client-w > $W/stacks.txt 2>&1
  S "stacks rc=$?"; tail -25 $W/stacks.txt
fi
skip 3 || pacing 32 ${NT32:-300} ${MODELS32:-mlp,resnet18,bert} ${MODES32:-$PACING}
nvidia_quit
S done
