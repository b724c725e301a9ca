#!/usr/bin/env bash
# Held runs whose commands go unrung: a worker that yields while its CPU is not wanted (mps)
# against one that sleeps at once (mps@old, fcff238), beside NVIDIA MPS, on the GPU.
#   STEP=n16:  the graphs, gpu, e2e and workers suites; ResNet-18 and BERT-base at N=16, two
#              rounds of 4 s, in $MODES.
#   STEP=wide: the same at N=8 (two rounds) and N=32 ($N32_ROUNDS rounds, default one).
#   STEP=more: mps-bench infer and infer-graph at N=8 and 16; qos.py's latency client beside
#              trainers (NVIDIA MPS capped; mps alone, below normal, reserving 25%); 64
#              ResNet-18 processes through mps.
# Results in $OUT/$STEP.tgz, re-made after each part. Carry .device-bin (release binaries,
# the build to compare in .device-bin/old).
set -u
STEP=${STEP:-n16}
MODES=${MODES:-nvidia-mps,mps@old,mps}
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/$STEP; rm -rf $W; mkdir -p $W
t0=$(date +%s)
# USE_OLD=1: the build in .device-bin/old serves as mps (and for mps-bench and qos.py).
[ -n "${USE_OLD:-}" ] && cp $B/old/* $B/
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/$STEP.tgz $STEP); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $W/machine.txt
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  # Per mps mode, from the servers' logs: runs launched from graphs and not, and the
  # clients' doorbell rings against their commands.
  for d in $W/$n/mps-logs/*/; do
    grep -h "launch batching: [0-9]" $d/server-*.log 2>/dev/null | awk -v m=$(basename $d) '
      { for (i = 1; i <= NF; i++) { if ($i == "runs" && $(i+1) == "launched") h += $(i-1); if ($i == "not") u += $(i-1);
          if ($i == "rings:") r += $(i+1); if ($i == "commands)") c += $(i-1) } }
      END { printf "%s: %d runs from graphs, %d not; %d doorbell rings for %d commands\n", m, h, u, r, c }'
  done | tee $W/$n-batching.txt
  rm -rf $W/$n/mps-logs
  pkill -f mps-control; pkill -f mps-server
}
if [ $STEP = n16 ] && [ "${TESTS:-1}" = 0 ]; then
  bench n16 ${N16_TIMEOUT:-440} --models resnet18,bert --clients 16 --rounds 2 --seconds 4 --modes $MODES
elif [ $STEP = n16 ]; then
  MPS_TEST_BACKEND=cuda timeout 120 scripts/test-gpu run graphs gpu e2e workers > $W/test-gpu.log 2>&1
  S "test-gpu rc=$?"; grep -E "test result|skip|FAIL|panicked" $W/test-gpu.log | head -20
  bench n16 ${N16_TIMEOUT:-440} --models resnet18,bert --clients 16 --rounds 2 --seconds 4 --modes $MODES
elif [ $STEP = wide ]; then
  bench n8 ${N8_TIMEOUT:-260} --models resnet18,bert --clients 8 --rounds 2 --seconds 4 --modes $MODES
  bench n32 ${N32_TIMEOUT:-300} --models resnet18,bert --clients 32 --rounds ${N32_ROUNDS:-1} --seconds 4 --modes $MODES
else
  timeout 70 $B/mps-bench run --modes nvidia-mps,mps --workloads infer,infer-graph --clients 8,16 \
    --ptx $B/test_kernels.ptx --server $B/mps-server --out $W/mb > $W/mb.txt 2>&1
  S "mps-bench rc=$?"; grep "^|" $W/mb.txt | head -20
  timeout 200 python3 $R/qos.py $B $W/qos --seconds 5 --rounds 1 --scenarios 4,5,7,9 > $W/qos.txt 2>&1
  S "qos rc=$?"; rm -rf $W/qos/err; tail -8 $W/qos.txt
  bench n64 ${N64_TIMEOUT:-150} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps
fi
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
