; A kernel for the GPU test of SM partitions: thread 0 of each block busy-waits `ns`
; nanoseconds (so that blocks stay resident and spread over the SMs they may use), then writes
; the id of the SM it ran on to out[blockIdx.x]. sm_ids.ptx is generated from this file by:
;
;   llc -march=nvptx64 -mcpu=sm_75 -mattr=+ptx64 -o sm_ids.ptx sm_ids.ll

target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"

declare i32 @llvm.nvvm.read.ptx.sreg.smid()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()

define void @sm_ids(i32 addrspace(1)* %out, i64 %ns) {
entry:
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %first = icmp eq i32 %tid, 0
  br i1 %first, label %start, label %done

start:
  %t0 = call i64 asm sideeffect "mov.u64 $0, %globaltimer;", "=l"()
  br label %spin

spin:
  %t = call i64 asm sideeffect "mov.u64 $0, %globaltimer;", "=l"()
  %elapsed = sub i64 %t, %t0
  %waiting = icmp ult i64 %elapsed, %ns
  br i1 %waiting, label %spin, label %record

record:
  %sm = call i32 @llvm.nvvm.read.ptx.sreg.smid()
  %block = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %index = zext i32 %block to i64
  %slot = getelementptr i32, i32 addrspace(1)* %out, i64 %index
  store volatile i32 %sm, i32 addrspace(1)* %slot
  br label %done

done:
  ret void
}

!nvvm.annotations = !{!0}
!0 = !{void (i32 addrspace(1)*, i64)* @sm_ids, !"kernel", i32 1}
