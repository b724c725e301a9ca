#!/usr/bin/env bash
# Real models beside NVIDIA MPS with graph-parameter updates: ResNet-18 and BERT-base at N=16
# in two rounds, then at N=8 in one, in $MODES (default NVIDIA MPS, the build before in
# .device-bin/old, this one). What each build's batching did is summed from its server logs.
# Results in $OUT/bench.tgz, re-made after each step.
set -u
MODES=${MODES:-nvidia-mps,mps@old,mps}
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/bench; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/bench.tgz bench); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > $W/machine.txt
cd $R
run() { # name timeout args...
  local n=$1 t=$2; shift 2
  timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md
  for m in $(echo $MODES | tr , '\n' | grep ^mps | tr @ _); do
    grep -h "launch batching: [0-9]" $W/$n/mps-logs/$m/server-*.log 2>/dev/null |
      awk -v m=$m '{ for (i = 1; i <= NF; i++) { if ($i == "runs" && $(i+1) == "launched") h += $(i-1); if ($i == "not") u += $(i-1) } c++ }
        END { printf "%s: %d client logs, %d runs launched from cached graphs, %d not\n", m, c, h, u }'
  done | tee $W/$n-batching.txt
  pkill -f mps-control; pkill -f mps-server
}
[ "${N16:-1}" = 1 ] && run n16 ${N16_TIMEOUT:-330} --models resnet18,bert --clients 16 --rounds 2 --seconds 4 --modes $MODES
if [ $(( $(date +%s)-t0 )) -lt ${N8_BEFORE:-400} ]; then
  run n8 ${N8_TIMEOUT:-150} --models resnet18,bert --clients 8 --rounds 1 --seconds 4 --modes $MODES
fi
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
