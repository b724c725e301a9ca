#!/usr/bin/env bash
# Runs held for a slowly posting client in pieces of 32 commands (the server's SLOW_RUN) against
# the build before (.device-bin/old, whose runs end after 256 commands whoever posts them) and
# NVIDIA MPS: BERT-base at N=16 in two rounds, ResNet-18 at N=16 and 8 and BERT-base at N=8 in
# one, as DEADLINE (560) s allows; SET=2 runs BERT-base and ResNet-18 at N=32 and the MLP at N=16
# instead, SET=3 BERT-base and ResNet-18 at N=16 once each. Every mps client writes where its stream waits went
# (MPS_CLIENT_WAIT_STATS).
# Results in $OUT/$STEP.tgz, re-made after each part. Carry .device-bin (scripts/test-gpu build,
# and mps-bench beside it). Each bench part sums its mps clients' "launch batching:" lines into
# NAME.batching-sum.txt and keeps the "slowly posted runs" lines in NAME.batching.txt.
set -u
export NCCL_NVLS_ENABLE=0
# Every mps client writes where its stream waits went (NAME.waits.txt).
export MPS_CLIENT_WAIT_STATS=1
STEP=${STEP:-slow-pieces}
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/$STEP; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/$STEP.tgz $STEP); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
nvidia_quit() { echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - t0) )); }
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  [ "$(left)" -lt 30 ] && { S "$n skipped: no time left"; return; }
  [ "$t" -gt "$(left)" ] && t=$(( $(left) - 5 ))
  nvidia_quit; rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; grep -H "^mps client" $W/$n/err/*.err > $W/$n.waits.txt 2>/dev/null; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  for d in $W/$n/mps-logs/*/; do
    local m=$(basename $d)
    grep -r "launch batching:" $d > $W/$n.$m.batching.txt 2>/dev/null
    echo -n "$m: "
    grep -h "runs launched" $W/$n.$m.batching.txt | sed -E 's/.*: ([0-9]+) runs launched from cached graphs, ([0-9]+) not \(graphs made: ([0-9]+); shapes learned: ([0-9]+); held runs that left their shape: ([0-9]+); doorbell rings: ([0-9]+) for ([0-9]+) commands.*/\1 \2 \3 \4 \5 \6 \7/' \
      | awk '{n++; for (i = 1; i <= 7; i++) t[i] += $i} END {printf "clients %d, hits %d, not %d, graphs %d, shapes %d, left %d, rings %d for %d commands\n", n, t[1], t[2], t[3], t[4], t[5], t[6], t[7]}'
    grep -h "slowly posted" $W/$n.$m.batching.txt | sed -E 's/.*runs: ([0-9]+) held, ([0-9]+) submitted.*/\1 \2/' \
      | awk '{n++; h += $1; p += $2} END {printf "  slowly posted runs: %d held, %d passed (%d clients)\n", h, p, n}'
  done | tee $W/$n.batching-sum.txt
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  wc -l $W/$n.stalls.txt; rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
M="nvidia-mps,mps@old,mps"
if [ "${SET:-1}" = 3 ]; then
  # A third set: BERT-base and ResNet-18 at N=16, one round each, mps@old being whichever build
  # .device-bin/old holds (its BUILD file names it).
  cat $B/old/BUILD > $W/old-build.txt 2>/dev/null
  bench b16 160 --models bert --clients 16 --rounds 1 --seconds 4 --modes $M
  bench r16 90 --models resnet18 --clients 16 --rounds 1 --seconds 4 --modes $M
  nvidia_quit; pkill -x mps-control; pkill -x mps-server; S done; exit 0
fi
if [ "${SET:-1}" = 2 ]; then
  # A second set: N=32 for both real models and the MLP at N=16, one round each.
  bench b32 200 --models bert --clients 32 --rounds 1 --seconds 4 --modes $M
  bench r32 150 --models resnet18 --clients 32 --rounds 1 --seconds 4 --modes $M
  bench m16 80 --models mlp --clients 16 --rounds 1 --seconds 4 --modes $M
  nvidia_quit; pkill -x mps-control; pkill -x mps-server; S done; exit 0
fi
bench b16 300 --models bert --clients 16 --rounds 2 --seconds 4 --modes $M
bench r16 90 --models resnet18 --clients 16 --rounds 1 --seconds 4 --modes $M
bench r8 75 --models resnet18 --clients 8 --rounds 1 --seconds 4 --modes $M
bench b8 100 --models bert --clients 8 --rounds 1 --seconds 4 --modes $M
nvidia_quit
pkill -x mps-control; pkill -x mps-server
S done
