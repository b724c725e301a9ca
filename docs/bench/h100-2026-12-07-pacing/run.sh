#!/usr/bin/env bash
# Batch pacing (launch batching holds a slowly posted run only while CPUs are contended) on the
# GPU, and the N=64 hold, one command:
#   1. The MLP, ResNet-18 and BERT-base at N=8 beside NVIDIA MPS: pacing off (the default) and on.
#   2. fair.c: 64 threads of one native process, each a stream of one context, spin kernels over
#      all SMs, with 32 and with 8 hardware queues (CUDA_DEVICE_MAX_CONNECTIONS).
#   3. ResNet-18 at N=64 through mps with a green context per client (N64_MODES: others).
# /proc/pressure/cpu is sampled each second throughout (pressure.txt, beside steps.txt's times).
# Results in $OUT/p.tgz, re-made after each part. Carry .device-bin (release binaries).
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/p; rm -rf $W; mkdir -p $W
rm -rf /tmp/mps-real-nvidia-pipe /tmp/mps-real-pipe /tmp/mps-real-bench
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/p.tgz p); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
(while :; do echo "$(( $(date +%s)-t0 ))s $(head -1 /proc/pressure/cpu 2>/dev/null) | $(cat /proc/loadavg)"; sleep 1; done) > $W/pressure.txt &
PRESSURE=$!
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md 2>/dev/null; grep "^round" $W/$n.txt | tail -20
  grep -r "launch batching: [0-9]" $W/$n/mps-logs > $W/$n.batching.txt 2>/dev/null
  grep -r "in the server's hands for\|in its ring untaken" $W/$n/mps-logs > $W/$n.stalls.txt 2>/dev/null
  rm -rf $W/$n/mps-logs
  pkill -x mps-control; pkill -x mps-server
}
bench n8 ${N8_TIMEOUT:-300} --models ${N8_MODELS:-mlp,resnet18,bert} --clients 8 --rounds 1 --seconds 4 \
  --modes ${N8_MODES:-nvidia-mps,mps,mps:--batch-pacing=on}
cuda_h=$(ls /usr/local/cuda/include/cuda.h 2>/dev/null || find / -name cuda.h -path '*cu13/include/*' 2>/dev/null | head -1)
cc -O2 -I$(dirname $cuda_h) $ROOT/docs/bench/h100-2026-12-06-locks/fair.c -o $W/fair -lcuda -lpthread
for c in 32 8; do CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 30 $W/fair 64 4 20 > $W/fair.$c.txt 2>&1; S "fair $c rc=$?"; head -1 $W/fair.$c.txt
  echo "fewest:"; tail -n +2 $W/fair.$c.txt | sort -n | head -3; echo "most:"; tail -n +2 $W/fair.$c.txt | sort -n | tail -1
  echo "longest:"; tail -n +2 $W/fair.$c.txt | sort -n -k4 | tail -2; done
bench n64 ${N64_TIMEOUT:-100} --models resnet18 --clients 64 --rounds 1 --seconds 4 \
  --modes ${N64_MODES:-mps:--context-per-client=on}
kill $PRESSURE
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
