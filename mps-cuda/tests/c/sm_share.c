/* The multiprocessor count a client of mps is told: the SMs of its share (the test sets
 * MPS_ACTIVE_THREAD_PERCENTAGE, and EXPECT_SMS where it knows the count), as NVIDIA's MPS tells
 * its clients, since libraries size kernels by it; the kernels still run. It prints the count.
 * Through mps only (MPS_ONLY=1).
 * Usage: sm_share <test_kernels.ptx> */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_api.h"

int main(void) {
    requires_mps("sm_share");
    const char *want_text = getenv("EXPECT_SMS");
    CUcontext ctx;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));
    int sms = 0;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    printf("multiprocessor count %d\n", sms);
    if (want_text != NULL) {
        int want = atoi(want_text);
        ASSERT(sms == want, "the multiprocessor count is %d, expected the share's %d", sms, want);
    }
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 4096));
    CHECK(cuMemsetD8_v2(p, 7, 4096));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemFree_v2(p));
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("sm_share");
}
