#!/usr/bin/env bash
# Where the CPU goes with 16 BERT-base processes through mps, and what the clients' own threads
# cost, on the GPU.
#   STEP=profile: the graphs, gpu, e2e and workers suites; perf of every CPU (cpu-clock, 999 Hz,
#                 3 s) with 16 BERT-base processes through mps, by thread, library and symbol;
#                 then BERT-base at N=16 in $MODES, two rounds.
#   STEP=bench:   $MODELS at N=$CLIENTS in $MODES, $ROUNDS rounds of 4 s.
#   STEP=lazy:    the graphs, gpu, e2e and workers suites; then ResNet-18 and BERT-base at N=16
#                 in two rounds and at N=32 in one, in $MODES.
# Results in $OUT/$TAG.tgz (TAG=cpu unless set), re-made after each step. Carry .device-bin and .traces (perf).
set -u
STEP=${STEP:-profile}
MODES=${MODES:-nvidia-mps,mps,nvidia-mps:OMP_NUM_THREADS=1,mps:OMP_NUM_THREADS=1}
export NCCL_NVLS_ENABLE=0
TAG=${TAG:-cpu}
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/$TAG; rm -rf $W; mkdir -p $W
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/$TAG.tgz $TAG); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node"; } > $W/machine.txt
bench() { # name timeout args...
  local n=$1 t=$2; shift 2
  (cd $R && timeout $t python3 bench.py $B $W/$n "$@" > $W/$n.txt 2>&1)
  S "$n rc=$?"; rm -rf $W/$n/err; cat $W/$n/bench.md
  # Per mps mode, from the servers' logs: runs launched from graphs and not, and the
  # clients' doorbell rings against their commands.
  for d in $W/$n/mps-logs/*/; do
    grep -h "launch batching: [0-9]" $d/server-*.log 2>/dev/null | awk -v m=$(basename $d) '
      { for (i = 1; i <= NF; i++) { if ($i == "runs" && $(i+1) == "launched") h += $(i-1); if ($i == "not") u += $(i-1);
          if ($i == "rings:") r += $(i+1); if ($i == "commands)") c += $(i-1) } }
      END { printf "%s: %d runs from graphs, %d not; %d doorbell rings for %d commands\n", m, h, u, r, c }'
  done | tee $W/$n-batching.txt
  pkill -f mps-control; pkill -f mps-server
}
if [ $STEP = profile ]; then
  MPS_TEST_BACKEND=cuda timeout 150 scripts/test-gpu run graphs gpu e2e workers > $W/test-gpu.log 2>&1
  S "test-gpu rc=$?"; grep -E "test result|skip|FAIL|panicked" $W/test-gpu.log | head -20
  tar xJf .traces/perf.tar.xz -C /tmp
  PERF="/tmp/perfb/lib/ld-linux-x86-64.so.2 --library-path /tmp/perfb/lib /tmp/perfb/perf"
  P=/tmp/cpupipe; rm -rf $P; mkdir -m 700 -p $P; mkdir -p $W/logs
  $B/mps-control -f --server $B/mps-server --pipe-dir $P --log-dir $W/logs > $W/logs/daemon.out 2>&1 &
  for i in $(seq 100); do [ -S $P/control.sock ] && break; sleep 0.1; done
  d=/tmp/cpu-barrier; rm -rf $d; mkdir -p $d; pids=()
  for i in $(seq 0 15); do env MPS_PIPE_DIRECTORY=$P $B/mps-run timeout 120 python3 $R/serve.py infer bert $d $i 8 > $W/serve.$i.out 2>/dev/null & pids+=($!); done
  for t in $(seq 400); do [ $(ls $d | grep -c ready) -ge 16 ] && break; sleep 0.2; done
  touch $d/go; sleep 2
  timeout 30 $PERF record -e cpu-clock -F 999 -a -o /tmp/cpu.data -- sleep 3 > $W/perf-record.txt 2>&1
  top -H -b -n 1 -d 1 -w 200 | head -60 > $W/top.txt
  wait "${pids[@]}"
  $B/mps-control --pipe-dir $P quit >/dev/null 2>&1; sleep 2; pkill -f mps-control; pkill -f mps-server
  python3 - $W <<'PY' | tee $W/serve.txt
import glob, json, sys
rs = [json.loads(open(f).read().strip().splitlines()[-1]) for f in glob.glob(sys.argv[1] + "/serve.*.out") if open(f).read().strip()]
print("served", len(rs), "req/s", round(sum(r["requests"] / r["seconds"] for r in rs)),
      "cpu ms/request", round(sum(r["cpu_ms"] for r in rs) / len(rs), 2), "p99 max", round(max(r["p99_ms"] for r in rs), 2))
PY
  R1() { timeout 90 $PERF report -i /tmp/cpu.data --stdio --no-children "$@" 2>/dev/null | grep -v "^#" | grep "%" ; }
  R1 --sort comm | head -60 > $W/perf-threads.txt
  R1 --sort dso | head -40 > $W/perf-libraries.txt
  R1 --sort comm,dso | head -80 > $W/perf-threads-libraries.txt
  for s in mps-server libmpscuda.so '[kernel.kallsyms]' '[vdso]' libc.so.6; do
    echo "== $s"; R1 --dsos "$s" --sort sym | head -50
  done > $W/perf-symbols.txt
  R1 --dsos libcuda.so.580.159.04 --sort comm,sym | head -40 > $W/perf-driver.txt
  S "profile"; cat $W/serve.txt; head -30 $W/perf-libraries.txt
  bench n16 ${N16_TIMEOUT:-300} --models bert --clients 16 --rounds 2 --seconds 4 --modes $MODES
elif [ $STEP = lazy ]; then
  MPS_TEST_BACKEND=cuda timeout 120 scripts/test-gpu run graphs gpu e2e workers > $W/test-gpu.log 2>&1
  S "test-gpu rc=$?"; grep -E "test result|skip|FAIL|panicked" $W/test-gpu.log | head -20
  bench n16 ${N16_TIMEOUT:-300} --models resnet18,bert --clients 16 --rounds 2 --seconds 4 --modes $MODES
  bench n32 ${N32_TIMEOUT:-170} --models resnet18,bert --clients 32 --rounds 1 --seconds 4 --modes $MODES
else
  bench bench ${BENCH_TIMEOUT:-500} --models $MODELS --clients $CLIENTS --rounds ${ROUNDS:-2} --seconds 4 --modes $MODES
fi
echo quit | CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-real-nvidia-pipe nvidia-cuda-mps-control >/dev/null 2>&1
S done
