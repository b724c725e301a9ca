#!/usr/bin/env bash
# 64 real-model processes through mps at once (NVIDIA MPS serves 48): ResNet-18, then the MLP.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/n64; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; rm -rf $W/*/err; (cd /tmp && tar czf $OUT/n64.tgz n64); }
cd $R
for m in resnet18 mlp; do
  timeout 115 python3 bench.py $B $W/$m --models $m --clients 64 --rounds 1 --seconds 4 --modes mps \
    > $W/$m.txt 2>&1
  S "$m rc=$?"; tail -3 $W/$m.txt; free -g | head -2
done
pkill -f mps-control; pkill -f mps-server
S done
