#!/usr/bin/env bash
# perf profiles of 16 BERT processes through mps and under NVIDIA MPS, then wait-policy
# variants side by side (bench.py). Results in $OUT/p.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/p; rm -rf $W; mkdir -p $W
tar xJf .traces/perf.tar.xz -C /tmp
printf '#!/bin/sh\nexec /tmp/perfb/lib/ld-linux-x86-64.so.2 --library-path /tmp/perfb/lib /tmp/perfb/perf "$@"\n' > /tmp/PERF; chmod +x /tmp/PERF; PERF=/tmp/PERF
$PERF --version > $W/perf.version 2>&1
P=/tmp/ppipe; NP=/tmp/pnv
daemon() { rm -rf $P; mkdir -m 700 -p $P; mkdir -p $1
  $B/mps-control -f --server $B/mps-server --pipe-dir $P --log-dir $1 --server-arg=--max-streams --server-arg=255 > $1/daemon.out 2>&1 &
  DPID=$!
  for i in $(seq 100); do [ -S $P/control.sock ] && break; sleep 0.1; done; }
quit() { $B/mps-control --pipe-dir $P quit >/dev/null 2>&1; sleep 2; pkill -f mps-control; pkill -f mps-server; sleep 0.5; }
cd $R
many() { # $1 name $2 model, rest: prefix
  local n=$1 m=$2; shift 2; local d=/tmp/m-$n; rm -rf $d; mkdir -p $d; pids=()
  for i in $(seq 0 15); do "$@" timeout 120 python3 $R/serve.py infer $m $d $i 10 > $W/$n.$i.out 2>$W/$n.$i.err & pids+=($!); done
  for t in $(seq 400); do [ $(ls $d | grep -c ready) -ge 16 ] && break; sleep 0.2; done
  touch $d/go; sleep 2
  timeout 30 $PERF record -e cpu-clock -F 999 -a -g -o /tmp/$n.data -- sleep 3 > $W/$n.rec 2>&1
  top -H -b -n 1 -d 1 -w 200 | head -50 > $W/$n.top
  wait "${pids[@]}"
  timeout 90 $PERF report -i /tmp/$n.data --stdio --no-children -g none --sort comm 2>/dev/null | grep -v "^#" | grep "%" | head -40 > $W/$n.comm
  timeout 90 $PERF report -i /tmp/$n.data --stdio --no-children -g none --sort comm,dso,sym 2>/dev/null | grep -v "^#" | grep "%" | head -150 > $W/$n.sym
  timeout 90 $PERF report -i /tmp/$n.data --stdio --no-children -g none --sort dso 2>/dev/null | grep -v "^#" | grep "%" | head -40 > $W/$n.dso
  python3 - $W $n <<'PY'
import json,sys,glob
w,n=sys.argv[1:3]; rs=[json.loads(open(f).read().strip().splitlines()[-1]) for f in glob.glob(f"{w}/{n}.[0-9]*.out") if open(f).read().strip()]
print(n, "served", len(rs), "req/s", round(sum(r["requests"]/r["seconds"] for r in rs)), "p99 max", round(max(r["p99_ms"] for r in rs),2) if rs else None)
PY
  rm -f $W/$n.[0-9]*.out
}
t0=$(date +%s)
daemon $W/l-mps; many mpsbert bert env MPS_PIPE_DIRECTORY=$P $B/mps-run; quit
echo "mps done $(( $(date +%s)-t0 ))s"
mkdir -p $W/nv; CUDA_MPS_PIPE_DIRECTORY=$NP CUDA_MPS_LOG_DIRECTORY=$W/nv nvidia-cuda-mps-control -d
many nvbert bert env CUDA_MPS_PIPE_DIRECTORY=$NP
echo quit | CUDA_MPS_PIPE_DIRECTORY=$NP nvidia-cuda-mps-control; sleep 2
echo "nv done $(( $(date +%s)-t0 ))s"
head -30 $W/mpsbert.comm; head -30 $W/nvbert.comm; head -25 $W/mpsbert.dso; head -25 $W/nvbert.dso
cd $OUT && tar czf p.tgz -C /tmp p
cd $R && timeout 330 python3 bench.py $B /tmp/p/bench --models bert,resnet18 --clients 16 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps,mps:MPS_CLIENT_YIELD_US=0,mps:--spin-us=0,--yield-us=50,MPS_CLIENT_YIELD_US=100 > /tmp/p/bench.out 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s"; tail -12 /tmp/p/bench.out
rm -rf /tmp/p/bench/err
cd $OUT && tar czf p.tgz -C /tmp p
