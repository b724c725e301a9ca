#!/usr/bin/env bash
# Where a real model's synchronise wait goes at N=8, one command per STEP:
#   STEP=sync  threads.cu (one process, one context, a thread and stream each: mps-bench's
#              `infer` request command by command or as a graph) at 1, 8 and 16 threads, with 8
#              and 32 connections; ResNet-18 and BERT-base at N=8 beside NVIDIA MPS, each in
#              mps's default, with batch pacing off (every repeating run held) and with launch
#              batching off (every command submitted as it comes), one round, the server's
#              threads' CPU (top -H) every 2 s meanwhile; mps-bench infer and infer-graph at N=8
#              and 16 beside NVIDIA MPS; ResNet-18 at N=1 likewise; BERT-base at N=16 beside
#              NVIDIA MPS, by default and with launch batching off; within DEADLINE (570) s.
#              Every mps client writes where its stream waits went (MPS_CLIENT_WAIT_STATS).
#   STEP=pace  ResNet-18 and BERT-base at N=8 beside NVIDIA MPS and the build before
#              (.device-bin/old: its mps-server and mps-control), and with launch batching off;
#              BERT-base at N=16 beside NVIDIA MPS and the build before; mps-bench infer at N=8
#              and 16 beside NVIDIA MPS; ResNet-18 at N=16 as BERT-base; one round each, as
#              DEADLINE allows.
# Results in $OUT/$STEP.tgz, re-made after each part. Carry .device-bin (scripts/test-gpu build,
# and mps-bench beside it). Each bench part sums its mps clients' "launch batching:" lines into
# NAME.batching-sum.txt and keeps the "slowly posted runs" lines in NAME.batching.txt.
set -u
export NCCL_NVLS_ENABLE=0
# Every mps client writes where its stream waits went (NAME.waits.txt).
export MPS_CLIENT_WAIT_STATS=1
STEP=${STEP:-sync}
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
sampler() { # sample the servers' threads while a bench part runs
  while sleep 2; do
    for p in $(pgrep -x mps-server); do
      echo "== $(date +%s.%N) $p"; top -H -b -n 1 -p $p | sed -n '7,30p'
    done
  done
}
case $STEP in
sync)
  nvcc -O2 -o $W/threads $ROOT/docs/bench/h200-2026-12-07-sync/threads.cu -lpthread > $W/nvcc.txt 2>&1 || cat $W/nvcc.txt
  for c in 8 32; do for m in plain graph; do for t in 1 8 16; do
    CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 30 $W/threads $m $t 5000 | sed "s/^/connections=$c /"
  done; done; done 2>&1 | tee $W/threads.txt
  S "threads"
  sampler > $W/top.txt 2>&1 & SP=$!
  M="nvidia-mps,mps,mps:--batch-pacing=off,mps:--launch-batching=off"
  bench r8 ${NT8:-200} --models resnet18 --clients 8 --rounds 1 --seconds 4 --modes $M
  bench b8 ${NT8:-200} --models bert --clients 8 --rounds 1 --seconds 4 --modes $M
  kill $SP
  timeout 90 $B/mps-bench run --modes nvidia-mps,mps --workloads infer,infer-graph --clients 8,16 \
    --ptx $ROOT/kernels/test_kernels.ptx --server $B/mps-server --out $W/mb > $W/mb.txt 2>&1
  S "mps-bench rc=$?"; grep "^|" $W/mb.txt | head -20
  bench r1 ${NT1:-100} --models resnet18 --clients 1 --rounds 1 --seconds 4 --modes $M
  bench b16 ${NT16:-150} --models bert --clients 16 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps,mps:--launch-batching=off
  ;;
pace)
  M="nvidia-mps,mps@old,mps,mps:--launch-batching=off"
  bench r8 ${NT8:-130} --models resnet18 --clients 8 --rounds 1 --seconds 4 --modes ${MR8:-$M}
  bench b8 ${NT8:-150} --models bert --clients 8 --rounds 1 --seconds 4 --modes ${MB8:-$M}
  bench b16 ${NT16:-130} --models bert --clients 16 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps@old,mps
  [ "$(left)" -gt 40 ] && timeout 30 $B/mps-bench run --modes nvidia-mps,mps --workloads infer \
    --clients 8,16 --ptx $ROOT/kernels/test_kernels.ptx --server $B/mps-server --out $W/mb \
    > $W/mb.txt 2>&1
  S "mps-bench rc=$?"; grep "^|" $W/mb.txt | head -20
  bench r16 ${NT16:-130} --models resnet18 --clients 16 --rounds 1 --seconds 4 \
    --modes nvidia-mps,mps@old,mps
  ;;
esac
nvidia_quit
pkill -x mps-control; pkill -x mps-server
S done
