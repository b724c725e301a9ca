#!/usr/bin/env bash
# A green context per client, checked: ctxscale with the 32 hardware queues the server gives its
# context, mps-bench infer and infer-graph (--scale 10) in three alternating pairs of runs,
# ResNet-18 and BERT-base at N=16 in two rounds. Results in $OUT/r.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/r; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/r.tgz r); }
cc -O2 -o $W/ctxscale docs/bench/h200-2026-12-02-priority/ctxscale.c -I/usr/local/cuda/include \
  -L/usr/local/cuda/lib64/stubs -lcuda -lpthread > $W/ctxscale-build.txt 2>&1
for a in "primary graph 16" "green graph 16" "shared graph 16" "primary plain 16" "green plain 16"; do
  CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 30 $W/ctxscale kernels/test_kernels.ptx $a 2 >> $W/ctxscale-32.txt 2>&1
done
S "ctxscale rc=$?"; cat $W/ctxscale-32.txt
MB() { timeout 90 $B/mps-bench run --workloads infer,infer-graph --clients 8,16 --scale 10 \
  --ptx $B/test_kernels.ptx --server $B/mps-server "$@"; }
for r in 0 1 2; do
  MB --modes nvidia-mps,mps --out $W/mbA$r > $W/mbA$r.txt 2>&1; S "mps-bench A$r rc=$?"
  MB --modes mps --server-args="--context-per-client on" --out $W/mbB$r > $W/mbB$r.txt 2>&1; S "mps-bench B$r rc=$?"
done
cd $R
timeout 300 python3 bench.py $B $W/n16 --models resnet18,bert --clients 16 --rounds 2 --seconds 4 \
  --modes mps,mps:--context-per-client=on > $W/n16.txt 2>&1
S "n16 rc=$?"; tail -4 $W/n16.txt
grep -h "context of its own" $W/n16/mps-logs/*.log | head -2
rm -rf $W/n16/err
pkill -f mps-control; pkill -f mps-server
S done
