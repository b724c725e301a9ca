#!/usr/bin/env bash
# Shapes matched only where a run begins (and the library's occupancy memo): the e2e and
# cuda-programs suites on the GPU, then bench.sh's N=16 run in four modes: NVIDIA MPS, the
# build before the parameter updates (.device-bin/old), the parameter updates alone
# (.device-bin/params) and this build. Results in $OUT/anchor.tgz and $OUT/bench.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; W=/tmp/anchor; rm -rf $W; mkdir -p $W; t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/anchor.tgz anchor); }
MPS_TEST_BACKEND=cuda timeout 120 scripts/test-gpu run e2e cuda-programs > $W/test-gpu.log 2>&1
S "test-gpu e2e cuda-programs rc=$?"; grep -E "test result|FAIL|panicked" $W/test-gpu.log | head
MODES=nvidia-mps,mps@old,mps@params,mps N16_TIMEOUT=440 N8_BEFORE=0 \
  docs/bench/h200-2026-12-03-params/bench.sh
S done
