#!/usr/bin/env bash
# Device run 1: the GPU suites on the merged code, the driver-API library with nvcc-built
# programs, and the launch path before and after (mps-bench, mps mode).
set -u
R=$PWD; B=$R/.device-bin/run1
mkdir -p /work && ln -sfn "$R" /work/main          # test binaries hold /work/main paths
cp -r "$B/target" "$R/"
nvidia-smi -L > "$OUT/machine.txt"; nproc >> "$OUT/machine.txt"; date -u >> "$OUT/machine.txt"
L=$OUT/tests.log
cd /work/main
export MPS_TEST_BACKEND=cuda
for t in gpu e2e control daemon_fs; do
  echo "=== $t" >> "$L"
  timeout 240 ./target/debug/deps/$t-* --nocapture >> "$L" 2>&1; echo "=== $t rc=$?" >> "$L"
done
echo "=== mps-cuda programs" >> "$L"
timeout 120 ./target/debug/deps/programs-a1704d9d8ef2ee8d --nocapture >> "$L" 2>&1; echo "=== rc=$?" >> "$L"
# nvcc-built driver-API program through mps-run, with PTX, fatbin and cubin images
export PATH=/usr/local/cuda/bin:$PATH
{
nvcc -O2 -I mps-cuda/tests/c mps-cuda/tests/c/vector_add.c -o /tmp/vadd_drv -lcuda && \
nvcc --fatbin -arch=sm_90 kernels/test_kernels.cu -o /tmp/k.fatbin && \
nvcc --cubin -arch=sm_90 kernels/test_kernels.cu -o /tmp/k.cubin
mkdir -p /tmp/mpsd /tmp/mpsl && (./target/debug/mps-server --backend cuda --pipe-dir /tmp/mpsd --log-dir /tmp/mpsl >/tmp/mpsl/stderr 2>&1 &)
sleep 3
for m in kernels/test_kernels.ptx /tmp/k.fatbin /tmp/k.cubin; do
  echo "--- native $m"; /tmp/vadd_drv $m
  echo "--- mps-run $m"; MPS_PIPE_DIRECTORY=/tmp/mpsd MPS_CUDA_LOG=1 timeout 60 ./target/debug/mps-run /tmp/vadd_drv $m
done
pkill -f 'mps-server --backend cuda --pipe-dir /tmp/mpsd'
} >> "$L" 2>&1
unset MPS_TEST_BACKEND
echo "=== bench before" >> "$L"
timeout 150 $B/before/mps-bench run --modes mps --workloads rtt,launch-rate,tiny,spin --clients 1,16 --server $B/before/mps-server --out $OUT/before >> "$L" 2>&1; echo "rc=$?" >> "$L"
echo "=== bench after" >> "$L"
timeout 200 $B/after/mps-bench run --modes native,mps --workloads rtt,launch-rate,tiny,spin --clients 1,16 --server $B/after/mps-server --out $OUT/after >> "$L" 2>&1; echo "rc=$?" >> "$L"
pkill -f mps-server; pkill -f mps-control; true
