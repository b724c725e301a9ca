#!/usr/bin/env bash
# Real models with the session workers napping while the CPUs are taken: N=16 side by side
# with napping off, the workers suite, N=8 and 32, mps-bench infer and infer-graph.
# Results in $OUT/f.tgz (re-made after each step).
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/f; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; cd $OUT && tar czf f.tgz -C /tmp f; cd $R; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > $W/gpu.txt
git -C $ROOT log -1 --format=%h > $W/commit.txt 2>/dev/null
cd $R
timeout 200 python3 bench.py $B $W/n16 --models bert,resnet18 --clients 16 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps,mps:--nap-when-busy=off > $W/n16.txt 2>&1
S "n16 rc=$?"; tail -5 $W/n16.txt
cd $ROOT && MPS_TEST_BACKEND=cuda timeout 60 scripts/test-gpu run workers > $W/test-gpu-workers.log 2>&1
S "workers rc=$?"; grep "test result" $W/test-gpu-workers.log
cd $R
timeout 150 python3 bench.py $B $W/n832 --models resnet18 --clients 8,32 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps > $W/n832.txt 2>&1
S "resnet18 n8,32 rc=$?"; tail -5 $W/n832.txt
timeout 70 python3 bench.py $B $W/bert8 --models bert --clients 8 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps > $W/bert8.txt 2>&1
S "bert n8 rc=$?"; tail -4 $W/bert8.txt
cd $ROOT
timeout 45 $B/mps-bench run --modes nvidia-mps,mps --workloads infer,infer-graph --clients 8,16 \
  --ptx $B/test_kernels.ptx --server $B/mps-server --out $W/mb > $W/mb.txt 2>&1
S "mps-bench rc=$?"; grep "^|" $W/mb.txt | head -12
timeout 30 $B/mps-bench run --modes mps --server-args="--nap-when-busy off" --workloads infer,infer-graph --clients 8,16 \
  --ptx $B/test_kernels.ptx --server $B/mps-server --out $W/mb-off > $W/mb-off.txt 2>&1
S "mps-bench nap off rc=$?"; grep "^|" $W/mb-off.txt | head -8
rm -rf $W/n16/err $W/n832/err $W/bert8/err
pkill -f mps-control; pkill -f mps-server; echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control 2>/dev/null
S done
