#!/usr/bin/env bash
# Batched runs whose memsets move and whose kernels change geometry, served by one graph whose
# nodes are given the run's work (cuGraphExecMemsetNodeSetParams, cuGraphExecKernelNodeSetParams
# with the grid), one command per STEP:
#   STEP=one  the graphs, gpu, e2e and workers suites (scripts/test-gpu run); ResNet-18 and
#             BERT-base at N=16 beside NVIDIA MPS; BERT-base at N=32 beside NVIDIA MPS; within
#             DEADLINE (570) seconds.
#   STEP=rounds  the MLP, ResNet-18 and BERT-base at N=16, 8 and 32 (CLIENTS) beside NVIDIA
#             MPS and the build before these changes (.device-bin/old: 60637be's mps-server and
#             mps-control), in ROUNDS (2) rounds, as DEADLINE allows.
#   STEP=ab   the graphs and e2e suites; the MLP, ResNet-18 and BERT-base at N=16 beside NVIDIA
#             MPS and the build before these changes (.device-bin/old), one round; BERT-base
#             at N=32 beside NVIDIA MPS.
#   STEP=ab2  as ab in the order that matters most, for a short command: BERT-base at N=16
#             beside NVIDIA MPS and the build before, the graphs and e2e suites (or SUITES),
#             ResNet-18 at N=16 likewise.
#   STEP=rest mps-bench infer and infer-graph at N=8 and 16 beside NVIDIA MPS; the latency
#             client beside trainers (qos.py, QOS its arguments: five scenarios of 5 s by
#             default); ResNet-18 at N=64.
#   STEP=last as rest, then the three models at N=8 beside NVIDIA MPS as time allows.
# Results in $OUT/$STEP.tgz, re-made after each part. Carry .device-bin (scripts/test-gpu build,
# and mps-bench beside it; for mps@old, .device-bin/old holds mps-server and mps-control built
# from the build compared against, with this build's mps-run and libmpscuda.so beside them).
# Each bench part sums its mps clients' "launch batching:" lines into NAME.batching-sum.txt.
set -u
export NCCL_NVLS_ENABLE=0
STEP=${STEP:-one}
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/$STEP; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/$STEP.tgz $STEP); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
nvidia_quit() { echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - t0) )); }
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  [ "$(left)" -lt 30 ] && { S "$n skipped: no time left"; return; }
  [ "$t" -gt "$(left)" ] && t=$(( $(left) - 5 ))
  nvidia_quit; rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  grep -r "launch batching:" $W/$n/mps-logs > $W/$n.batching.txt 2>/dev/null
  grep -h "runs launched" $W/$n.batching.txt | sed -E 's/.*: ([0-9]+) runs launched from cached graphs, ([0-9]+) not \(graphs made: ([0-9]+); shapes learned: ([0-9]+); held runs that left their shape: ([0-9]+); doorbell rings: ([0-9]+) for ([0-9]+) commands.*/\1 \2 \3 \4 \5 \6 \7/' \
    | awk '{n++; for (i = 1; i <= 7; i++) t[i] += $i} END {if (n) printf "clients %d, hits %d, not %d, graphs %d, shapes %d, left %d, rings %d for %d commands\n", n, t[1], t[2], t[3], t[4], t[5], t[6], t[7]}' \
    | tee $W/$n.batching-sum.txt
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  wc -l $W/$n.stalls.txt; rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
suites() { # timeout suites...
  local t=$1; shift
  timeout $t scripts/test-gpu run "$@" > $W/suites.txt 2>&1
  S "suites rc=$?"; grep -E "^== |^test result|FAILED|panicked" $W/suites.txt | tail -30
  sed -n '/^== summary/,$p' $W/suites.txt
}
case $STEP in
one)
  suites ${NTS:-200} graphs gpu e2e workers
  bench n16 ${NT16:-150} --models resnet18,bert --clients 16 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps
  bench n32 ${NT32:-150} --models bert --clients 32 --rounds 1 --seconds 4 --modes nvidia-mps,mps
  ;;
ab)
  suites ${NTS:-120} graphs e2e
  bench n16 ${NT16:-260} --models mlp,resnet18,bert --clients 16 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps@old,mps
  bench n32 ${NT32:-100} --models bert --clients 32 --rounds 1 --seconds 4 --modes nvidia-mps,mps
  ;;
ab2)
  bench n16-bert ${NT16:-90} --models bert --clients 16 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps@old,mps
  suites ${NTS:-60} ${SUITES:-graphs e2e}
  bench n16-resnet18 ${NT16:-90} --models resnet18 --clients 16 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps@old,mps
  ;;
rounds)
  for n in ${CLIENTS:-16 8 32}; do
    bench n$n 560 --models ${MODELS:-mlp,resnet18,bert} --clients $n --rounds ${ROUNDS:-2} \
      --seconds 4 --modes ${MODES:-nvidia-mps,mps@old,mps}
  done
  ;;
rest|last)
  timeout 80 $B/mps-bench run --modes nvidia-mps,mps --workloads infer,infer-graph --clients 8,16 \
    --ptx $ROOT/kernels/test_kernels.ptx --server $B/mps-server --out $W/mb > $W/mb.txt 2>&1
  S "mps-bench rc=$?"; grep "^|" $W/mb.txt | head -20
  (cd $R && timeout 200 python3 qos.py $B $W/qos ${QOS:---seconds 5 --rounds 1 --scenarios 4,5,7,9,10} \
    > $W/qos.txt 2>&1)
  S "qos rc=$?"; tail -30 $W/qos.txt
  pkill -x mps-control; pkill -x mps-server
  bench n64 ${NT64:-200} --models resnet18 --clients 64 --rounds 1 --seconds 4 --modes mps
  [ $STEP = last ] && bench n8 560 --models mlp,resnet18,bert --clients 8 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps
  ;;
esac
nvidia_quit
pkill -x mps-control; pkill -x mps-server
S done
