#!/usr/bin/env bash
# Whether holding other driver calls back for stream capture's start and graph instantiation
# ends the N=64 hold, one command:
#   1. capture.c natively: 63 launcher threads and 1 capturer (then 60 and 4), without and with
#      the launchers holding back (GATE=1): whether NVIDIA's driver keeps a capture waiting
#      behind launches in one process, and whether holding back ends it.
#   2. ResNet-18 at N=64: mps@old (.device-bin/old, the server before the gate) and mps
#      (.device-bin, with it).
#   3. ResNet-18 and BERT-base at N=16 beside NVIDIA MPS, both builds.
# Results in $OUT/g.tgz, re-made after each part. Carry .device-bin. SKIP=1,3 skips parts;
# MODES64 and MODES16 change parts 2 and 3.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/g; rm -rf $W; mkdir -p $W
HERE=$(cd "$(dirname "$0")" && pwd)
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/g.tgz g); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
skip() { case ",${SKIP:-}," in *",$1,"*) return 0;; esac; return 1; }
nvidia_quit() { echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  nvidia_quit; rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  grep -r "launch batching: [0-9]" $W/$n/mps-logs > $W/$n.batching.txt 2>/dev/null
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  wc -l $W/$n.stalls.txt; rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
if ! skip 1; then
  cuda_h=$(ls /usr/local/cuda/include/cuda.h 2>/dev/null || find / -name cuda.h -path '*cu13/include/*' 2>/dev/null | head -1)
  cc -O2 -I$(dirname $cuda_h) $HERE/capture.c -o $W/capture -lcuda -lpthread
  for shape in "63 1" "60 4"; do for g in 0 1; do
    GATE=$g timeout 30 $W/capture $shape 4 > $W/capture.${shape/ /-}.gate$g.txt 2>&1
    S "capture $shape gate $g rc=$?"; cat $W/capture.${shape/ /-}.gate$g.txt
  done; done
fi
skip 2 || bench n64 ${N64_TIMEOUT:-170} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes ${MODES64:-mps@old,mps}
skip 3 || bench n16 ${NT16:-170} --models resnet18,bert --clients 16 --rounds 1 --seconds 4 --modes ${MODES16:-nvidia-mps,mps@old,mps}
nvidia_quit
S done
