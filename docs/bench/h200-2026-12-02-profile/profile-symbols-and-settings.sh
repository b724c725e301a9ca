#!/usr/bin/env bash
# perf of the server's and the client library's symbols (16 BERT processes through mps), then
# the server's settings side by side at N=16 (bench.py). Results in $OUT/q.tgz.
set -u
export NCCL_NVLS_ENABLE=0
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/q; rm -rf $W; mkdir -p $W
tar xJf .traces/perf.tar.xz -C /tmp
printf '#!/bin/sh\nexec /tmp/perfb/lib/ld-linux-x86-64.so.2 --library-path /tmp/perfb/lib /tmp/perfb/perf "$@"\n' > /tmp/PERF; chmod +x /tmp/PERF; PERF=/tmp/PERF
P=/tmp/ppipe
daemon() { rm -rf $P; mkdir -m 700 -p $P; mkdir -p $1
  $B/mps-control -f --server $B/mps-server --pipe-dir $P --log-dir $1 --server-arg=--max-streams --server-arg=255 > $1/daemon.out 2>&1 &
  for i in $(seq 100); do [ -S $P/control.sock ] && break; sleep 0.1; done; }
quit() { $B/mps-control --pipe-dir $P quit >/dev/null 2>&1; sleep 2; pkill -f mps-control; pkill -f mps-server; sleep 0.5; }
cd $R
t0=$(date +%s)
n=mpsbert; d=/tmp/m-$n; rm -rf $d; mkdir -p $d; pids=()
daemon $W/l-mps
for i in $(seq 0 15); do env MPS_PIPE_DIRECTORY=$P $B/mps-run timeout 120 python3 $R/serve.py infer bert $d $i 8 > $W/$n.$i.out 2>/dev/null & pids+=($!); done
for t in $(seq 400); do [ $(ls $d | grep -c ready) -ge 16 ] && break; sleep 0.2; done
touch $d/go; sleep 2
timeout 30 $PERF record -e cpu-clock -F 999 -a -o /tmp/$n.data -- sleep 3 > $W/$n.rec 2>&1
wait "${pids[@]}"; quit
for s in mps-server libmpscuda.so libcuda.so.580.159.04 '[kernel.kallsyms]' '[vdso]' libc.so.6; do
  echo "== $s"; timeout 60 $PERF report -i /tmp/$n.data --stdio --no-children --dsos "$s" --sort sym 2>/dev/null | grep -v "^#" | grep "%" | head -45
done > $W/$n.syms
timeout 60 $PERF report -i /tmp/$n.data --stdio --no-children --sort dso 2>/dev/null | grep -v "^#" | grep "%" | head -30 > $W/$n.dso
timeout 60 $PERF report -i /tmp/$n.data --stdio --no-children --comm client-w3 --sort dso,sym 2>/dev/null | grep -v "^#" | grep "%" | head -40 > $W/$n.w3
echo "perf done $(( $(date +%s)-t0 ))s"; head -20 $W/$n.syms
cd $OUT && tar czf q.tgz -C /tmp q
cd $R && timeout 400 python3 bench.py $B /tmp/q/bench --models bert,resnet18 --clients 16 --rounds 1 --seconds 4 \
  --modes nvidia-mps,mps,mps:--launch-batching=off,mps:--session-workers=4,mps:--session-workers=8 > /tmp/q/bench.out 2>&1
echo "bench rc=$? $(( $(date +%s)-t0 ))s"; tail -5 /tmp/q/bench.out
rm -rf /tmp/q/bench/err
cd $OUT && tar czf q.tgz -C /tmp q
