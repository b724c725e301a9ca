#!/usr/bin/env bash
# The three real models at N = 8, 16, 32 and 64 beside NVIDIA MPS, with each process's figures
# kept (which process was served least, and the slowest request), on the GPU.
#   STEP=a: the MLP, ResNet-18 and BERT-base at N=8, two rounds; the MLP at N=16, two rounds.
#   STEP=b: the three at N=32, one round; ResNet-18 at N=64 (NVIDIA MPS serves 48), one round.
#   STEP=c: one round of each: the three at N=8 and 32, the MLP at N=16, ResNet-18 at N=64
#           through mps.
# Results in $OUT/$STEP.tgz, re-made after each part. Carry .device-bin (release binaries).
set -u
STEP=${STEP:-a}
MODES=${MODES:-nvidia-mps,mps}
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/$STEP; rm -rf $W; mkdir -p $W
rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/$STEP.tgz $STEP); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $W/machine.txt
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  [ $n = n64 ] || rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
if [ $STEP = a ]; then
  bench n8 ${N8_TIMEOUT:-330} --models mlp,resnet18,bert --clients 8 --rounds 2 --seconds 4 --modes $MODES
  bench n16 ${N16_TIMEOUT:-180} --models mlp --clients 16 --rounds 2 --seconds 4 --modes $MODES
elif [ $STEP = d ]; then
  bench n64 100 --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps
  bench n8 130 --models resnet18,bert --clients 8 --rounds 1 --seconds 4 --modes $MODES
elif [ $STEP = c ]; then
  bench n8 ${N8_TIMEOUT:-150} --models mlp,resnet18,bert --clients 8 --rounds 1 --seconds 4 --modes $MODES
  bench n64 ${N64_TIMEOUT:-100} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps
  bench n16 ${N16_TIMEOUT:-60} --models mlp --clients 16 --rounds 1 --seconds 4 --modes $MODES
  bench n32 ${N32_TIMEOUT:-240} --models mlp,resnet18,bert --clients 32 --rounds 1 --seconds 4 --modes $MODES
else
  bench n32 ${N32_TIMEOUT:-330} --models mlp,resnet18,bert --clients 32 --rounds 1 --seconds 4 --modes $MODES
  bench n64 ${N64_TIMEOUT:-220} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes $MODES
fi
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
