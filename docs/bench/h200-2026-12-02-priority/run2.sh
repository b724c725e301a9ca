#!/usr/bin/env bash
# A green context per client (--context-per-client on) against the primary context's streams:
# ctxscale's modes and memory, mps-bench infer and infer-graph at N=8 and 16 in alternating
# runs, ResNet-18 and BERT-base at N=16 side by side. Results in $OUT/q.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/q; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/q.tgz q); }
git -C $ROOT log -1 --format=%h > $W/commit.txt 2>/dev/null
cc -O2 -o $W/ctxscale docs/bench/h200-2026-12-02-priority/ctxscale.c -I/usr/local/cuda/include \
  -L/usr/local/cuda/lib64/stubs -lcuda -lpthread > $W/ctxscale-build.txt 2>&1
S "ctxscale build rc=$?"
for a in "primary graph 16" "green graph 16" "shared graph 16" "primary graph 64" "green graph 64" \
         "primary plain 16" "green plain 16"; do
  timeout 30 $W/ctxscale kernels/test_kernels.ptx $a 2 >> $W/ctxscale.txt 2>&1
done
S "ctxscale rc=$?"; cat $W/ctxscale.txt
MB() { timeout 70 $B/mps-bench run --workloads infer,infer-graph --clients 8,16 \
  --ptx $B/test_kernels.ptx --server $B/mps-server "$@"; }
for r in 0 1; do
  MB --modes nvidia-mps,mps --out $W/mbA$r > $W/mbA$r.txt 2>&1; S "mps-bench A$r rc=$?"
  MB --modes mps --server-args="--context-per-client on" --out $W/mbB$r > $W/mbB$r.txt 2>&1; S "mps-bench B$r rc=$?"
done
grep -h "^|" $W/mbA0.txt $W/mbB0.txt | head -20
cd $R
timeout 230 python3 bench.py $B $W/n16 --models resnet18,bert --clients 16 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps,mps:--context-per-client=on > $W/n16.txt 2>&1
S "n16 rc=$?"; tail -5 $W/n16.txt
grep -h "context of its own\|error\|ERROR" $W/n16/mps-logs/*.log 2>/dev/null | head -5
rm -rf $W/n16/err
pkill -f mps-control; pkill -f mps-server; echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
