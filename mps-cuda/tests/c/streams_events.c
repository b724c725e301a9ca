/* Streams, events, cuStreamWaitEvent and the legacy default stream's ordering, each made
 * observable by a kernel that waits (spin_ns) before the work another stream must not overtake.
 * Usage: streams_events <test_kernels.ptx> */
#include "cuda_api.h"

#define N 4096
#define MS 1000000ull

static CUfunction spin, fill;
static CUdeviceptr counter;

static void spin_then_fill(CUstream s, unsigned long long ns, CUdeviceptr p, uint32_t value) {
    uint64_t n = N;
    void *spin_params[] = {&ns, &counter};
    void *fill_params[] = {&p, &value, &n};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, spin_params, NULL));
    CHECK(cuLaunchKernel(fill, 16, 1, 1, 128, 1, 1, 0, s, fill_params, NULL));
}

/* Every word of q (synchronously read back) must be `want`. */
static void expect_all(CUdeviceptr q, uint32_t want, const char *what) {
    static uint32_t host[N];
    CHECK(cuMemcpyDtoH_v2(host, q, sizeof host));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += host[i] != want;
    ASSERT(wrong == 0, "%s: %d of %d words are not %u (first %u)", what, wrong, N, want, host[0]);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&spin, mod, "spin_ns"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
    CUdeviceptr p, q;
    CHECK(cuMemAlloc_v2(&counter, 4));
    CHECK(cuMemAlloc_v2(&p, N * 4));
    CHECK(cuMemAlloc_v2(&q, N * 4));
    CUstream a, b;
    CHECK(cuStreamCreate(&a, CU_STREAM_DEFAULT));
    CHECK(cuStreamCreate(&b, CU_STREAM_DEFAULT));
    CUevent start, done, stop, untimed;
    CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&done, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING));

    /* b copies p only after a's event: a waits 20 ms before it fills p. */
    CHECK(cuMemsetD32_v2(q, 0, N));
    CHECK(cuEventRecord(start, a));
    spin_then_fill(a, 20 * MS, p, 5);
    CHECK(cuEventRecord(done, a));
    CHECK(cuStreamWaitEvent(b, done, 0));
    CHECK(cuMemcpyDtoDAsync_v2(q, p, N * 4, b));
    CHECK(cuEventRecord(stop, b));
    CHECK(cuStreamSynchronize(b));
    expect_all(q, 5, "cuStreamWaitEvent");
    CHECK(cuEventQuery(done));
    CHECK(cuEventSynchronize(stop));
    float ms = -1;
    CHECK(cuEventElapsedTime_v2(&ms, start, stop));
    ASSERT(ms >= 18.0f, "the 20 ms wait took %.3f ms between events", ms);
    CHECK(cuEventRecord(untimed, b));
    CHECK(cuEventSynchronize(untimed));
    EXPECT(cuEventElapsedTime_v2(&ms, start, untimed), CUDA_ERROR_INVALID_HANDLE);

    /* A query does not wait: a stream busy for a second is not ready, then it is. */
    spin_then_fill(a, 1000 * MS, p, 6);
    EXPECT(cuStreamQuery(a), CUDA_ERROR_NOT_READY);
    CHECK(cuStreamSynchronize(a));
    CHECK(cuStreamQuery(a));

    /* The legacy default stream waits for earlier work in blocking streams... */
    spin_then_fill(a, 20 * MS, p, 9);
    CHECK(cuMemcpyDtoD_v2(q, p, N * 4));
    expect_all(q, 9, "legacy stream after a blocking stream");

    /* ...and blocking streams wait for earlier work in the legacy stream (NULL and
     * CU_STREAM_LEGACY alike). */
    spin_then_fill(NULL, 20 * MS, p, 11);
    CHECK(cuMemcpyDtoDAsync_v2(q, p, N * 4, b));
    CHECK(cuStreamSynchronize(b));
    expect_all(q, 11, "blocking stream after the legacy stream");
    spin_then_fill(CU_STREAM_LEGACY, 20 * MS, p, 12);
    CHECK(cuMemcpyDtoDAsync_v2(q, p, N * 4, a));
    CHECK(cuStreamSynchronize(a));
    expect_all(q, 12, "blocking stream after CU_STREAM_LEGACY");

    /* cuMemcpyPeer between two contexts of one device follows the source context's work: its
     * legacy stream fills p after 20 ms, and the copy into the other context's memory sees it. */
    CUcontext other;
    CUdeviceptr r;
    CHECK(cuCtxCreate_v2(&other, 0, 0));
    CHECK(cuMemAlloc_v2(&r, N * 4));
    CHECK(cuMemsetD32_v2(r, 0, N));
    CHECK(cuCtxSetCurrent(ctx));
    spin_then_fill(CU_STREAM_LEGACY, 20 * MS, p, 13);
    CHECK(cuMemcpyPeer(r, other, p, ctx, N * 4));
    CHECK(cuCtxSetCurrent(other));
    expect_all(r, 13, "cuMemcpyPeer after the source context's work");
    CHECK(cuMemFree_v2(r));
    CHECK(cuCtxDestroy_v2(other));
    CHECK(cuCtxSetCurrent(ctx));

    CHECK(cuCtxSynchronize());
    CHECK(cuStreamDestroy_v2(a));
    CHECK(cuStreamDestroy_v2(b));
    /* Destroyed handles: undefined in CUDA, refused by mps. */
    if (mps_only()) EXPECT(cuStreamSynchronize(a), CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuEventRecord(start, 0));
    CHECK(cuEventDestroy_v2(start));
    if (mps_only()) EXPECT(cuEventQuery(start), CUDA_ERROR_INVALID_HANDLE);
    /* Also where this thread has just recorded it (and may have kept it at hand). */
    if (mps_only()) EXPECT(cuEventRecord(start, 0), CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("streams_events");
}
