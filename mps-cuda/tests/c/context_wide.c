/* What CUDA 12 asks of a whole context, as PyTorch and cuDNN look it up: cuCtxGetId,
 * cuCtxRecordEvent (an event that waits for every stream of the context, a non-blocking one
 * too), cuCtxWaitEvent (every stream waits), cuCtxGetDevResource (the SMs the program is told
 * of), the green-context forms on an ordinary context, and cuGetProcAddress of the empty name.
 * Each stream's work is made slow by a kernel that waits (spin_ns), so that work not waited for
 * shows. Results as NVIDIA's driver 580 gives them.
 * Usage: context_wide <test_kernels.ptx> */
#include <string.h>

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

/* Every word of q, read back on stream s (then synchronised), must be `want`. */
static void expect_all(CUdeviceptr q, CUstream s, uint32_t want, const char *what) {
    static uint32_t host[N];
    CHECK(cuMemcpyDtoHAsync_v2(host, q, sizeof host, s));
    CHECK(cuStreamSynchronize(s));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += host[i] != want;
    ASSERT(wrong == 0, "%s: %d of %d words are not %u (first %u)", what, wrong, N, want, host[0]);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext primary, other;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&primary, 0));
    CHECK(cuCtxSetCurrent(primary));

    /* cuCtxGetId: one per context, NULL the current one's. */
    unsigned long long id = 0, again = 0, other_id = 0;
    CHECK(cuCtxGetId(primary, &id));
    CHECK(cuCtxGetId(NULL, &again));
    ASSERT(id != 0 && id == again, "ids %llu and %llu of the current context", id, again);
    EXPECT(cuCtxGetId(primary, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuCtxCreate_v2(&other, 0, 0));
    CHECK(cuCtxGetId(other, &other_id));
    ASSERT(other_id != 0 && other_id != id, "a created context's id %llu (primary %llu)",
           other_id, id);
    CHECK(cuCtxSetCurrent(primary));
    printf("context ids: distinct, NULL is the current context's\n");

    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&spin, mod, "spin_ns"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
    CUdeviceptr p, q;
    CHECK(cuMemAlloc_v2(&counter, 4));
    CHECK(cuMemAlloc_v2(&p, N * 4));
    CHECK(cuMemAlloc_v2(&q, N * 4));
    CHECK(cuMemsetD32_v2(p, 0, N));
    CHECK(cuMemsetD32_v2(q, 0, N));
    CUstream blocking, free1, free2;
    CHECK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    CHECK(cuStreamCreate(&free1, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&free2, CU_STREAM_NON_BLOCKING));
    CUevent all, ready, foreign;
    CHECK(cuEventCreate(&all, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&ready, CU_EVENT_DEFAULT));

    /* cuCtxRecordEvent: the event completes after the work of every stream, the non-blocking
     * one's too, which is read back on another non-blocking stream that waits for nothing else. */
    spin_then_fill(blocking, 20 * MS, p, 3);
    spin_then_fill(free1, 40 * MS, q, 4);
    CHECK(cuCtxRecordEvent(primary, all));
    CHECK(cuEventSynchronize(all));
    expect_all(p, free2, 3, "cuCtxRecordEvent: the blocking stream's work");
    expect_all(q, free2, 4, "cuCtxRecordEvent: the non-blocking stream's work");
    printf("cuCtxRecordEvent: waits for every stream\n");

    /* cuCtxWaitEvent: later work of every stream, a non-blocking one too, waits for the event. */
    spin_then_fill(free1, 40 * MS, p, 7);
    CHECK(cuEventRecord(ready, free1));
    CHECK(cuCtxWaitEvent(primary, ready));
    CHECK(cuMemcpyDtoDAsync_v2(q, p, N * 4, free2));
    expect_all(q, free2, 7, "cuCtxWaitEvent: a non-blocking stream's later copy");
    printf("cuCtxWaitEvent: every stream waits\n");

    /* The refusals: no context, no event, an event of another context. */
    EXPECT(cuCtxRecordEvent(NULL, all), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxWaitEvent(NULL, all), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxRecordEvent(primary, NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuCtxWaitEvent(primary, NULL), CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuCtxSetCurrent(other));
    CHECK(cuEventCreate(&foreign, CU_EVENT_DEFAULT));
    CHECK(cuCtxSetCurrent(primary));
    EXPECT(cuCtxRecordEvent(primary, foreign), CUDA_ERROR_INVALID_HANDLE);

    /* While a stream of the context captures, both are refused and the capture invalidated. */
    CUgraph g = NULL;
    CHECK(cuStreamBeginCapture_v2(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuCtxRecordEvent(primary, all), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cuStreamEndCapture(blocking, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* cuCtxGetDevResource: the SMs are the multiprocessor count the program is told of. */
    CUdevResource r;
    memset(&r, 0xff, sizeof r);
    int sms = 0;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
    CHECK(cuCtxGetDevResource(primary, &r, CU_DEV_RESOURCE_TYPE_SM));
    ASSERT(r.type == CU_DEV_RESOURCE_TYPE_SM && (int)r.sm[0] == sms, "type %d, %u SMs of %d",
           r.type, r.sm[0], sms);
    /* NVIDIA's driver on an H200: 132 SMs, partitions of at least 8, aligned to 8. */
    ASSERT(r.sm[1] >= 1 && r.sm[1] <= r.sm[0] && r.sm[2] >= 1 && r.sm[2] <= r.sm[0],
           "partition size %u, co-scheduled alignment %u of %u SMs", r.sm[1], r.sm[2], r.sm[0]);
    /* mps splits no client's SMs: the smallest partition is all of them. */
    if (mps_only()) ASSERT(r.sm[1] == r.sm[0] && r.sm[2] == 1, "mps's partition figures");
    EXPECT(cuCtxGetDevResource(primary, &r, 0), CUDA_ERROR_INVALID_RESOURCE_TYPE);
    EXPECT(cuCtxGetDevResource(primary, NULL, CU_DEV_RESOURCE_TYPE_SM), CUDA_ERROR_INVALID_VALUE);
    printf("cuCtxGetDevResource: the device's multiprocessor count\n");

    /* An ordinary context is no green context. */
    EXPECT(cuGreenCtxGetId(primary, &id), CUDA_ERROR_INVALID_CONTEXT);

    /* The empty name is no function: NULL and SYMBOL_NOT_FOUND; the first form NOT_FOUND. */
    void *fn = &fn;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CHECK(cuGetProcAddress_v2("", &fn, 0, 0, &status));
    ASSERT(fn == NULL && status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "empty name: %p, %d",
           fn, (int)status);
    fn = &fn;
    EXPECT(cuGetProcAddress("", &fn, 12000, 0), CUDA_ERROR_NOT_FOUND);
    /* NVIDIA's driver leaves the pointer as it was there (measured on the H200); mps clears it. */
    if (mps_only()) ASSERT(fn == NULL, "empty name, first form: %p", fn);
    const char *names[] = {"cuCtxGetId", "cuCtxRecordEvent", "cuCtxWaitEvent",
                           "cuCtxGetDevResource", "cuGreenCtxGetDevResource",
                           "cuGreenCtxGetId", "cuGreenCtxRecordEvent", "cuGreenCtxWaitEvent"};
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
        CHECK(cuGetProcAddress_v2(names[i], &fn, 12090, 0, &status));
        ASSERT(fn != NULL && status == CU_GET_PROC_ADDRESS_SUCCESS, "%s not handed out", names[i]);
    }

    CHECK(cuEventDestroy_v2(foreign));
    CHECK(cuCtxDestroy_v2(other));
    CHECK(cuStreamDestroy_v2(blocking));
    CHECK(cuStreamDestroy_v2(free1));
    CHECK(cuStreamDestroy_v2(free2));
    CHECK(cuEventDestroy_v2(all));
    CHECK(cuEventDestroy_v2(ready));
    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    return finish("context_wide");
}
