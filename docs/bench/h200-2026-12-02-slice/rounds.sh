#!/usr/bin/env bash
# BERT-base and ResNet-18 at N=16 in three rounds: NVIDIA MPS, mps, mps with --worker-slice-us 100.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/r; rm -rf $W; mkdir -p $W
cd $R
timeout 560 python3 bench.py $B $W/n16 --models bert,resnet18 --clients 16 --rounds 3 --seconds 4 \
  --modes nvidia-mps,mps,mps:--worker-slice-us=100 > $W/n16.txt 2>&1
echo "rc=$?"; tail -5 $W/n16.txt; rm -rf $W/n16/err; (cd /tmp && tar czf $OUT/r.tgz r)
pkill -f mps-server; echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
