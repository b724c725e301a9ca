#!/usr/bin/env bash
# Speed: the launch path before (b0df9d2) and after, in alternating rounds; real models at
# N=16 and 32 (NVIDIA MPS, mps, mps with its session workers never yielding-then-looking);
# the latency client beside trainers.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; O=$ROOT/.device-bin/old; R=$ROOT/mps-cuda/tests/real; W=$OUT/b; mkdir -p $W
S() { echo "$(date +%T) $*" | tee -a $W/steps.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee $W/gpu.txt
for r in 0 1; do
  for v in old new; do
    if [ $v = old ]; then BB=$O; else BB=$B; fi
    timeout 75 $BB/mps-bench run --modes mps --workloads rtt,launch-rate,tiny,infer --clients 1,16 \
      --ptx $BB/test_kernels.ptx --server $BB/mps-server --out $W/lp-$v-$r > $W/lp-$v-$r.txt 2>&1
    S "launch path $v round $r rc=$?"
  done
done
grep -h "^|" $W/lp-old-0.txt $W/lp-new-0.txt | head -30
timeout 240 python3 $R/bench.py $B $W/bench --models resnet18,bert --clients 16 \
  --modes nvidia-mps,mps,mps:--yield-us=0 --rounds 1 --seconds 4 > $W/bench.txt 2>&1
S "bench rc=$?"; tail -8 $W/bench.txt
timeout 160 python3 $R/qos.py $B $W/qos --seconds 5 --rounds 1 --scenarios 4,5,7,9 > $W/qos.txt 2>&1
S "qos rc=$?"; tail -9 $W/qos.txt
pkill -f mps-control; pkill -f mps-server; echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
cd $OUT && tar czf b.tgz b && rm -rf b
