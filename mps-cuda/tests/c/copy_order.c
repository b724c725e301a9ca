/* A synchronous copy from pageable memory is on the device when the call returns: two 4 MiB
 * buffers copied with cuMemcpyHtoD, then read at once by a kernel on a CU_STREAM_NON_BLOCKING
 * stream (which the legacy stream does not order), round after round with new data each time.
 * This is mps's promise, not CUDA's: CUDA's docs let such a copy return once the bytes are staged
 * for DMA, and natively on an H200 a round's kernel read a buffer's tail before its copy landed
 * (round 7: out[1048569] = 582, want 583). Through mps only (MPS_ONLY=1).
 * Usage: copy_order <test_kernels.ptx> */
#include <stdlib.h>

#include "cuda_api.h"

#define N (1 << 20)
#define ROUNDS 12

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    requires_mps("copy_order");
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CUmodule mod;
    CUfunction add;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&add, mod, "add_f32"));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    float *a = malloc(N * sizeof(float)), *b = malloc(N * sizeof(float)),
          *c = malloc(N * sizeof(float));
    ASSERT(a && b && c, "out of host memory");
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc_v2(&da, N * sizeof(float)));
    CHECK(cuMemAlloc_v2(&db, N * sizeof(float)));
    CHECK(cuMemAlloc_v2(&dc, N * sizeof(float)));
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++) {
            a[i] = (float)(i % 1000 + round);
            b[i] = (float)round;
        }
        CHECK(cuMemcpyHtoD_v2(da, a, N * sizeof(float)));
        CHECK(cuMemcpyHtoD_v2(db, b, N * sizeof(float)));
        uint64_t n = N;
        void *params[] = {&da, &db, &dc, &n};
        CHECK(cuLaunchKernel(add, 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
        CHECK(cuMemcpyDtoHAsync_v2(c, dc, N * sizeof(float), s));
        CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < N; i++) {
            float want = (float)(i % 1000 + 2 * round);
            ASSERT(c[i] == want, "round %d: out[%d] = %.0f, want %.0f", round, i, c[i], want);
        }
    }
    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuCtxDestroy_v2(ctx));
    free(a);
    free(b);
    free(c);
    return finish("copy_order");
}
