#!/usr/bin/env bash
# Real models at N=16 in two rounds: NVIDIA MPS; mps as it was (the build of the commit before
# this change, in .device-bin/old); mps with napping workers, contended yields and lazy rings;
# and the same with the server's naps off (`--nap-when-busy off`). Results in $OUT/ab.tgz,
# re-made after each step.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/ab; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/ab.tgz ab); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
cd $R
timeout 560 python3 bench.py $B $W/n16 --models resnet18,bert --clients 16 --rounds 2 --seconds 4 \
  --modes nvidia-mps,mps@old,mps,mps:--nap-when-busy=off > $W/n16.txt 2>&1
S "n16 rc=$?"; rm -rf $W/n16/err; cat $W/n16/bench.md
pkill -f mps-control; pkill -f mps-server
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
