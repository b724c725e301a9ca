#!/usr/bin/env bash
# Verification: the real-programs suite in every mode, the GPU suites of the daemon (control,
# attacks with two other users, groups) and of the CUDA library, several PyTorch processes in
# one group, the C programs natively.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=$PWD; B=$ROOT/.device-bin; R=$ROOT/mps-cuda/tests/real; W=/tmp/a; rm -rf $W; mkdir -p $W
S() { echo "$(date +%T) $*" | tee -a $W/steps.txt; tar czf $OUT/a.tgz -C /tmp a 2>/dev/null; }
id mpstest >/dev/null 2>&1 || useradd -M -s /usr/sbin/nologin mpstest 2>&1 | tail -1
chmod o+rx $ROOT $B; chmod -R o+rX $B; id mpstest; id nobody
S start
timeout 270 python3 $R/runner.py $B $W/suite --limit 45 > $W/suite.txt 2>&1; S "suite rc=$?"
cut -c1-260 $W/suite/table.md; pkill -f mps-control; pkill -f mps-server; sleep 1
suite() { # $1 suite, $2 seconds
  timeout $2 scripts/test-gpu run $1 > $W/test-gpu-$1.log 2>&1; S "test-gpu $1 rc=$?"
  sed -n '/== summary/,$p' $W/test-gpu-$1.log | grep -v "it needs two" | tail -6
  grep -E "^test .*FAILED|panicked" $W/test-gpu-$1.log | head -4 | cut -c1-300
}
suite attacks 45
suite groups 40
timeout 50 python3 $R/group_limits.py $B $W/group-limits > $W/group-limits.txt 2>&1; S "group_limits rc=$?"
tail -14 $W/group-limits.txt | cut -c1-250
suite cuda-programs 55
w=$(mktemp -d); mkdir $w/link; ln -s $B/libmpscuda.so $w/link/libcuda.so
for n in pinned_memset unified_copy mem_pool graph_build; do
  cc -std=c11 -O1 -pthread -I mps-cuda/tests/c mps-cuda/tests/c/$n.c -o $w/$n -L $w/link -lcuda -ldl 2>$w/$n.cc || { echo "cc $n failed: $(head -3 $w/$n.cc)"; continue; }
  timeout 20 $w/$n kernels/test_kernels.ptx > $w/$n.out 2>&1; rc=$?
  echo "native $n rc=$rc: $(tail -1 $w/$n.out)"; [ $rc = 0 ] || tail -8 $w/$n.out
done > $W/native-c.txt 2>&1
S "native C"; cut -c1-250 $W/native-c.txt
suite cuda-runtime 55
suite control 45
pkill -f mps-control; pkill -f mps-server; S end
