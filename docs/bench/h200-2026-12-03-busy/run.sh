#!/usr/bin/env bash
# Held runs that wait on while their stream is busy (--batch-hold-busy-us), on the GPU.
#   STEP=check: the graphs, gpu and e2e suites, then ResNet-18 and BERT-base at N=16 in two
#               rounds beside NVIDIA MPS, with the busy hold (the default, 200 us), without it
#               (--batch-hold-busy-us=0: the build before) and with a plain 200 us hold.
#   STEP=sleep: the graphs, gpu, e2e and workers suites of the build whose workers sleep while
#               they hold a run, then N=16 as above in $MODES (.device-bin/spin: the build of
#               the check step, whose workers spun while holding).
#   STEP=sizes: the same models at N=8 and N=32, one round, in $MODES.
# Results in $OUT/busy.tgz, re-made after each step; each mps mode's batching summed from its
# server logs, and what ended its runs.
set -u
STEP=${STEP:-check}
MODES=${MODES:-nvidia-mps,mps:--batch-hold-busy-us=0,mps,mps:--batch-hold-us=200}
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/busy; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/busy.tgz busy); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $W/machine.txt
run() { # name timeout args...
  local n=$1 t=$2; shift 2
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md
  for d in $W/$n/mps-logs/*/; do
    m=$(basename $d)
    grep -h "launch batching: [0-9]" $d/server-*.log 2>/dev/null |
      awk -v m=$m '{ for (i = 1; i <= NF; i++) { if ($i == "runs" && $(i+1) == "launched") h += $(i-1); if ($i == "not") u += $(i-1) } c++ }
        END { printf "%s: %d client logs, %d runs launched from cached graphs, %d not\n", m, c, h, u }'
    grep -h "runs ended by" $d/server-*.log 2>/dev/null | sed 's/^.*runs ended by/  ended by/' | head -4
  done | tee $W/$n-batching.txt
  pkill -f mps-control; pkill -f mps-server
}
if [ $STEP = check ] || [ $STEP = sleep ]; then
  SUITES="graphs gpu e2e"; [ $STEP = sleep ] && SUITES="graphs gpu e2e workers"
  MPS_TEST_BACKEND=cuda timeout 120 scripts/test-gpu run $SUITES > $W/test-gpu.log 2>&1
  S "test-gpu $SUITES rc=$?"; grep -E "test result|skip|FAIL|panicked" $W/test-gpu.log | head -20
  run n16 ${N16_TIMEOUT:-440} --models resnet18,bert --clients 16 --rounds 2 --seconds 4 --modes $MODES
else
  run n8 ${N8_TIMEOUT:-200} --models resnet18,bert --clients 8 --rounds 1 --seconds 4 --modes $MODES
  run n32 ${N32_TIMEOUT:-300} --models resnet18,bert --clients 32 --rounds 1 --seconds 4 --modes $MODES
fi
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
