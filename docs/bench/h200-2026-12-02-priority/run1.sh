#!/usr/bin/env bash
# Client priorities on the device: the priority suite, the real-programs suite through mps,
# launches from threads of one process in the primary context or in green contexts of their
# own, and the latency client beside two trainers. Results in $OUT/p.tgz (re-made after each
# step).
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/p; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/p.tgz p); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > $W/gpu.txt
nproc >> $W/gpu.txt
MPS_TEST_BACKEND=cuda timeout 90 scripts/test-gpu run priority workers > $W/test-gpu.log 2>&1
S "test-gpu priority workers rc=$?"; grep -E "test result|beside|median" $W/test-gpu.log
cc -O2 -o $W/ctxscale docs/bench/h200-2026-12-02-priority/ctxscale.c -I/usr/local/cuda/include \
  -L/usr/local/cuda/lib64/stubs -lcuda -lpthread > $W/ctxscale-build.txt 2>&1
S "ctxscale build rc=$?"
for w in graph plain; do for n in 1 8 16; do for c in primary green; do
  timeout 30 $W/ctxscale kernels/test_kernels.ptx $c $w $n 2 >> $W/ctxscale.txt 2>&1
done; done; done
S "ctxscale rc=$?"; cat $W/ctxscale.txt
timeout 220 python3 $R/qos.py $B $W/qos --seconds 5 --rounds 1 --scenarios 4,5,7,9,10 > $W/qos.txt 2>&1
S "qos rc=$?"; tail -8 $W/qos.txt
timeout 120 python3 $R/runner.py $B $W/runner --modes native,mps --limit 45 > $W/runner.txt 2>&1
S "runner rc=$?"; tail -14 $W/runner.txt
pkill -f mps-control; pkill -f mps-server; echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
rm -rf $W/qos/err $W/runner/err
S done
