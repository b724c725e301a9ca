#!/usr/bin/env bash
# graphmark natively (N threads of one process, one context), then its plain and graph
# requests from N processes of one thread each under NVIDIA MPS.
set -u
export NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=32
D=$(dirname $0); nvcc -O2 -arch=sm_90 -o /tmp/gm $D/graphmark.cu -lcuda || exit 1
[ -n "${SKIP_NATIVE:-}" ] || { echo "## one process, N threads"; /tmp/gm 1 ${NATIVE_N:-1 8 16}; }
export CUDA_MPS_PIPE_DIRECTORY=/tmp/gm-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/gm-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY; nvidia-cuda-mps-control -d
# NVIDIA MPS's clients keep the default hardware queues (as under bench.py); one client first
# starts its server.
unset CUDA_DEVICE_MAX_CONNECTIONS; ONLY=0 /tmp/gm 0.2 1 > /dev/null
for v in ${MPS_VARIANTS:-0 1 3 4}; do for n in ${MPS_N:-8 16}; do
  at=$(( $(date +%s) + 4 ))
  for i in $(seq $n); do ONLY=$v START_AT=$at /tmp/gm 1 1 > /tmp/gm.$i.txt & done; wait
  cat /tmp/gm.*.txt | awk -v n=$n '{split($3,a,"k"); s+=a[1]; name=$2} END {printf "NVIDIA MPS, %d processes: %s %.1fk requests/s\n", n, name, s}'
  rm -f /tmp/gm.*.txt
done; done
echo quit | nvidia-cuda-mps-control
