#!/usr/bin/env bash
# The build with graph-parameter updates on the GPU: the graphs, gpu and e2e suites, then the
# real-programs suite natively, through mps and under a 50% share. Results in $OUT/check.tgz,
# re-made after each step.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; W=/tmp/check; rm -rf $W; mkdir -p $W; t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/check.tgz check); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $W/machine.txt
cat $W/machine.txt
MPS_TEST_BACKEND=cuda timeout 240 scripts/test-gpu run graphs gpu e2e > $W/test-gpu.log 2>&1
S "test-gpu graphs gpu e2e rc=$?"; grep -E "test result|skip|FAIL|panicked" $W/test-gpu.log | head -20
timeout 300 python3 mps-cuda/tests/real/runner.py .device-bin $W/real --modes native,mps,share50 \
  --limit 45 > $W/real.txt 2>&1
S "runner rc=$?"; cat $W/real/table.md 2>/dev/null | cut -c1-300 | head -20
grep -h "launch batching:" $W/real/mps-logs/server-*.log 2>/dev/null | sed 's/^.*launch batching/launch batching/' | sort | uniq -c | sort -rn | head -20 > $W/batching.txt
cat $W/batching.txt
pkill -f mps-control; pkill -f mps-server
S done
