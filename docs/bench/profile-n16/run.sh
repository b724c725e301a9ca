#!/usr/bin/env bash
# Where the CPUs go with 16 BERT-base processes (batch 1, fp16, mps-cuda/tests/real/serve.py
# from one barrier): perf of every CPU (cpu-clock, 999 Hz, 3 s) through mps (the daemon and
# mps-run from .device-bin), then under NVIDIA MPS. By thread, by library, mps-server's and
# libmpscuda's symbols, and NVIDIA's driver by thread and symbol. Carry .device-bin
# (scripts/test-gpu build) and .traces (scripts/perf-bundle). Results in $OUT/profile-n16.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/profile-n16
rm -rf $W; mkdir -p $W/logs
t0=$(date +%s)
S() { echo "$(( $(date +%s)-t0 ))s $*" | tee -a $W/steps.txt; (cd /tmp && tar czf $OUT/profile-n16.tgz profile-n16); }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r; } > $W/machine.txt
cat $W/machine.txt
tar xJf .traces/perf.tar.xz -C /tmp
PERF="/tmp/perfb/lib/ld-linux-x86-64.so.2 --library-path /tmp/perfb/lib /tmp/perfb/perf"
NP=/tmp/profile-nvidia-pipe
nvidia_quit() { echo quit | CUDA_MPS_PIPE_DIRECTORY=$NP nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; }
# serve NAME PREFIX...: 16 processes, each started by PREFIX, perf while they serve.
serve() {
  local n=$1; shift
  local d=/tmp/profile-barrier; rm -rf $d; mkdir -p $d; local pids=()
  for i in $(seq 0 15); do
    "$@" timeout 120 python3 $R/serve.py infer bert $d $i 8 > $W/$n.serve.$i.out 2>/dev/null & pids+=($!)
  done
  for t in $(seq 600); do [ $(ls $d | grep -c ready) -ge 16 ] && break; sleep 0.2; done
  touch $d/go; sleep 2
  timeout 30 $PERF record -e cpu-clock -F 999 -a -o /tmp/$n.data -- sleep 3 > $W/$n.perf-record.txt 2>&1
  top -H -b -n 1 -d 1 -w 200 | head -60 > $W/$n.top.txt
  wait "${pids[@]}"
  python3 - $W $n <<'PY' | tee $W/$n.serve.txt
import glob, json, sys
rs = []
for f in glob.glob(f"{sys.argv[1]}/{sys.argv[2]}.serve.*.out"):
    lines = open(f).read().strip().splitlines()
    if lines and lines[-1].startswith("{"):
        rs.append(json.loads(lines[-1]))
if rs:
    print(sys.argv[2], "served", len(rs), "req/s", round(sum(r["requests"] / r["seconds"] for r in rs)),
          "cpu ms/request", round(sum(r["cpu_ms"] for r in rs) / len(rs), 2),
          "p99 max", round(max(r["p99_ms"] for r in rs), 2))
else:
    print(sys.argv[2], "served none")
PY
}
report() { # NAME
  local n=$1
  R1() { timeout 90 $PERF report -i /tmp/$n.data --stdio --no-children "$@" 2>/dev/null | grep -v "^#" | grep "%" ; }
  R1 --sort comm | head -60 > $W/$n.perf-threads.txt
  R1 --sort dso | head -40 > $W/$n.perf-libraries.txt
  R1 --sort comm,dso | head -80 > $W/$n.perf-threads-libraries.txt
  for s in mps-server libmpscuda.so '[kernel.kallsyms]' '[vdso]' libc.so.6; do
    echo "== $s"; R1 --dsos "$s" --sort sym | head -50
  done > $W/$n.perf-symbols.txt
  local drv=$(basename $(readlink -f /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null || echo libcuda.so.1))
  R1 --dsos $drv --sort comm,sym | head -60 > $W/$n.perf-driver.txt
  S "$n report"; head -25 $W/$n.perf-libraries.txt
}
P=/tmp/profile-pipe; rm -rf $P; mkdir -m 700 -p $P
$B/mps-control -f --server $B/mps-server --pipe-dir $P --log-dir $W/logs > $W/logs/daemon.out 2>&1 &
for i in $(seq 100); do [ -S $P/control.sock ] && break; sleep 0.1; done
serve mps env MPS_PIPE_DIRECTORY=$P $B/mps-run
$B/mps-control --pipe-dir $P quit >/dev/null 2>&1; sleep 2; pkill -x mps-control; pkill -x mps-server
grep -rh "launch batching:" $W/logs > $W/mps.batching.txt 2>/dev/null; rm -rf $W/logs
S "mps served"
report mps
mkdir -p $NP $W/nvidia-logs
CUDA_MPS_PIPE_DIRECTORY=$NP CUDA_MPS_LOG_DIRECTORY=$W/nvidia-logs nvidia-cuda-mps-control -d
serve nvidia-mps env CUDA_MPS_PIPE_DIRECTORY=$NP
nvidia_quit
S "nvidia-mps served"
report nvidia-mps
rm -f /tmp/*.data
S done
