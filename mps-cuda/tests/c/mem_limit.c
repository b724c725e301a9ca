/* cuMemGetInfo under a client memory limit (MPS_PINNED_DEVICE_MEM_LIMIT set by the test to
 * 0=64M): the limit is the total, allocations come off the free figure, and what does not fit is
 * CUDA_ERROR_OUT_OF_MEMORY. Through mps only (MPS_ONLY=1). Usage: mem_limit <test_kernels.ptx> */
#include "cuda_api.h"

#define MIB (1024ull * 1024ull)

int main(void) {
    requires_mps("mem_limit");
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    size_t free0 = 0, total = 0, free1 = 0;
    CHECK(cuMemGetInfo_v2(&free0, &total));
    ASSERT(total == 64 * MIB, "total %zu, expected the 64 MiB limit", total);
    ASSERT(free0 <= total, "free %zu above total %zu", free0, total);
    CUdeviceptr p, q;
    CHECK(cuMemAlloc_v2(&p, 16 * MIB));
    CHECK(cuMemGetInfo_v2(&free1, &total));
    ASSERT(free0 - free1 >= 16 * MIB, "free went from %zu to %zu", free0, free1);
    EXPECT(cuMemAlloc_v2(&q, 60 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemFree_v2(p));
    CHECK(cuMemAlloc_v2(&q, 60 * MIB));
    CHECK(cuMemFree_v2(q));
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("mem_limit");
}
