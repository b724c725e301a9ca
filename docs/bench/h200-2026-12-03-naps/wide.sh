#!/usr/bin/env bash
# The build with contended yields (and the one before it, in .device-bin/old) beside NVIDIA MPS
# at N=8 (ResNet-18, BERT-base) and N=32 (ResNet-18); mps-bench infer and infer-graph at N=8
# and 16; the workers and e2e suites on the GPU; what single driver calls cost natively and
# through mps (callcost.c); a third round of BERT-base at N=16 if time allows; what ended the
# clients' runs (the server's log). Results in $OUT/wide.tgz, re-made after each step.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/wide; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/wide.tgz wide); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $W/machine.txt
cc -O2 -o /tmp/callcost docs/bench/h200-2026-12-03-naps/callcost.c -l:libcuda.so.1 2> $W/callcost-build.txt
/tmp/callcost $B/test_kernels.ptx 200000 > $W/callcost-native.txt 2>&1; S "callcost native rc=$?"
export MPS_PIPE_DIRECTORY=/tmp/cc-pipe MPS_LOG_DIRECTORY=/tmp/cc-log; mkdir -p $MPS_PIPE_DIRECTORY $MPS_LOG_DIRECTORY
$B/mps-server > $W/callcost-server.log 2>&1 & SP=$!; sleep 2
timeout 60 $B/mps-run /tmp/callcost $B/test_kernels.ptx 200000 > $W/callcost-mps.txt 2>&1; S "callcost mps rc=$?"
kill $SP; wait $SP; unset MPS_PIPE_DIRECTORY MPS_LOG_DIRECTORY
paste $W/callcost-native.txt $W/callcost-mps.txt
MPS_TEST_BACKEND=cuda timeout 150 scripts/test-gpu run workers e2e > $W/test-gpu.log 2>&1
S "test-gpu workers e2e rc=$?"; grep -E "test result|skip|FAIL" $W/test-gpu.log | head
timeout 60 $B/mps-bench run --modes nvidia-mps,mps --workloads infer,infer-graph --clients 8,16 \
  --ptx $B/test_kernels.ptx --server $B/mps-server --out $W/mb > $W/mb.txt 2>&1
S "mps-bench rc=$?"; grep "^|" $W/mb.txt | grep -E "requests_per_s|p99" | head -12
cd $R
timeout 150 python3 bench.py $B $W/n8 --models resnet18,bert --clients 8 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps@old,mps > $W/n8.txt 2>&1
S "n8 rc=$?"; rm -rf $W/n8/err; cat $W/n8/bench.md
timeout 150 python3 bench.py $B $W/n32 --models resnet18 --clients 32 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps@old,mps > $W/n32.txt 2>&1
S "n32 rc=$?"; rm -rf $W/n32/err; cat $W/n32/bench.md
# A third round of BERT-base at N=16, while the command's time allows.
if [ $(( $(date +%s)-t0 )) -lt 430 ]; then
  timeout 100 python3 bench.py $B $W/bert16 --models bert --clients 16 --rounds 1 --seconds 4 \
    --modes mps,mps@old,nvidia-mps > $W/bert16.txt 2>&1
  S "bert16 rc=$?"; rm -rf $W/bert16/err; cat $W/bert16/bench.md
fi
grep -h "launch batching: runs ended by" $W/*/mps-logs/server-*.log > $W/enders.txt 2>/dev/null
pkill -f mps-control; pkill -f mps-server
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
