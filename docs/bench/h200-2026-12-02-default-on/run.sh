#!/usr/bin/env bash
# --context-per-client on as the default: every GPU suite, the real-programs suite, mps-bench
# infer and infer-graph and ResNet-18 and BERT-base at N=16 beside NVIDIA MPS and the server
# with the option off. Results in $OUT/d.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/d; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/d.tgz d); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $W/gpu.txt; nproc >> $W/gpu.txt
MPS_TEST_BACKEND=cuda timeout 290 scripts/test-gpu run > $W/test-gpu.log 2>&1
S "test-gpu rc=$?"; grep -E "^test result|FAILED|failed|summary|skip" $W/test-gpu.log | tail -30
pkill -f mps-control; pkill -f mps-server
timeout 70 python3 $R/runner.py $B $W/runner --modes native,mps --limit 45 > $W/runner.txt 2>&1
S "runner rc=$?"; tail -14 $W/runner.txt
MB() { timeout 40 $B/mps-bench run --workloads infer,infer-graph --clients 8,16 --scale 10 \
  --ptx $B/test_kernels.ptx --server $B/mps-server "$@"; }
MB --modes nvidia-mps,mps --out $W/mbA > $W/mbA.txt 2>&1; S "mps-bench A rc=$?"
MB --modes mps --server-args="--context-per-client off" --out $W/mbB > $W/mbB.txt 2>&1; S "mps-bench B rc=$?"
grep -h "^|" $W/mbA.txt $W/mbB.txt | head -24
cd $R
timeout 150 python3 bench.py $B $W/n16 --models resnet18,bert --clients 16 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps,mps:--context-per-client=off > $W/n16.txt 2>&1
S "n16 rc=$?"; tail -6 $W/n16.txt
rm -rf $W/n16/err $W/runner/err
pkill -f mps-control; pkill -f mps-server; echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
