#!/usr/bin/env bash
# Session threads asking for a short scheduler slice (--worker-slice-us): ResNet-18 and
# BERT-base at N=16 and ResNet-18 at N=32 beside NVIDIA MPS and the server without it, then
# mps-bench infer and infer-graph at N=8 and 16. Results in $OUT/d.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/d; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/d.tgz d); }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/gpu.txt
cat $W/gpu.txt
MB() { timeout 45 $B/mps-bench run --workloads infer,infer-graph --clients 8,16 --scale 10 \
  --ptx $B/test_kernels.ptx --server $B/mps-server "$@"; }
MB --modes nvidia-mps,mps --out $W/mbA > $W/mbA.txt 2>&1; S "mps-bench A rc=$?"
MB --modes mps --server-args="--worker-slice-us 100" --out $W/mbB > $W/mbB.txt 2>&1; S "mps-bench B rc=$?"
grep -h "^|" $W/mbA.txt $W/mbB.txt | head -24
cd $R
S1=mps:--worker-slice-us=100
timeout 320 python3 bench.py $B $W/n16 --models resnet18,bert --clients 16 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps,$S1,$S1,--yield-us=0,$S1,--spin-us=0,--yield-us=0 > $W/n16.txt 2>&1
S "n16 rc=$?"; tail -6 $W/n16.txt
timeout 150 python3 bench.py $B $W/n32 --models resnet18 --clients 32 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps,$S1 > $W/n32.txt 2>&1
S "n32 rc=$?"; tail -4 $W/n32.txt
rm -rf $W/n16/err $W/n32/err
pkill -f mps-control; pkill -f mps-server; echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
