#!/usr/bin/env bash
# The rest: several PyTorch processes in one group (the product check fixed), the runtime suite
# and the attacks suite with room for their length on a GPU.
set -u
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/c; rm -rf $W; mkdir -p $W
S() { echo "$(date +%T) $*" | tee -a $W/steps.txt; tar czf $OUT/c.tgz -C /tmp c 2>/dev/null; }
id mpstest >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin mpstest 2>&1 | tail -1
chmod o+rx $ROOT $B; chmod -R o+rX $B
S start
timeout 45 python3 $R/group_limits.py $B $W/group-limits > $W/group-limits.txt 2>&1; S "group_limits rc=$?"
tail -14 $W/group-limits.txt | cut -c1-250
pkill -f mps-control; pkill -f mps-server
suite() { # $1 suite, $2 seconds
  timeout $2 scripts/test-gpu run $1 > $W/test-gpu-$1.log 2>&1; S "test-gpu $1 rc=$?"
  sed -n '/== summary/,$p' $W/test-gpu-$1.log | grep -v "it needs two" | tail -6
  grep -E "^test .*FAILED|panicked" $W/test-gpu-$1.log | head -4 | cut -c1-300
}
suite cuda-runtime 100
suite attacks 105
pkill -f mps-control; pkill -f mps-server; S end
