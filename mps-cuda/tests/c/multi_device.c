/* A driver-API program that uses every device it sees: each device's name, UUID and memory; a
 * primary context per device, with a module, allocations, a launch and copies in each, checked
 * by values that differ per device; switching the current context between devices; a library
 * loaded once and its kernel launched on each device; a created context on the last device;
 * copies between devices (cuMemcpyPeer, cuMemcpyPeerAsync) and an event of one device waited
 * for in a stream of another. With one device it does what applies to one.
 * Usage: multi_device <test_kernels.ptx>. With MPS_TEST_HOLD set it prints "holding" once the
 * work of every device is done, and keeps its memory until its standard input closes, so that
 * a test can look at the servers meanwhile. */
#include <string.h>

#include "cuda_api.h"

#define N (1 << 16)
#define MAX_DEVICES 8

static float host[N];

/* Copies device `d`'s `p` back (in the current context) and checks element i is scale * i. */
static void expect_scaled(CUdeviceptr p, float scale, const char *what, int d) {
    CHECK(cuMemcpyDtoH_v2(host, p, sizeof host));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += host[i] != scale * (float)i;
    ASSERT(wrong == 0, "device %d, %s: %d of %d wrong (last %f)", d, what, wrong, N,
           host[N - 1]);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CHECK(cuInit(0));
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    ASSERT(count >= 1 && count <= MAX_DEVICES, "%d devices", count);
    if (count < 1 || count > MAX_DEVICES) return finish("multi_device");
    printf("devices: %d\n", count);
    CUdevice dev;
    EXPECT(cuDeviceGet(&dev, count), CUDA_ERROR_INVALID_DEVICE);

    CUuuid uuid[MAX_DEVICES];
    for (int d = 0; d < count; d++) {
        CHECK(cuDeviceGet(&dev, d));
        ASSERT(dev == d, "cuDeviceGet(%d) gave %d", d, dev);
        char name[256] = {0};
        size_t total = 0;
        int major = 0;
        CHECK(cuDeviceGetName(name, sizeof name, dev));
        CHECK(cuDeviceTotalMem_v2(&total, dev));
        CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
        CHECK(cuDeviceGetUuid_v2(&uuid[d], dev));
        ASSERT(total > 0 && major > 0, "device %d: %zu bytes, cc %d", d, total, major);
        printf("device %d: %s\n", d, name);
        for (int e = 0; e < d; e++)
            ASSERT(memcmp(&uuid[e], &uuid[d], sizeof uuid[d]) != 0,
                   "devices %d and %d have one UUID", e, d);
    }

    /* Each device's primary context has a state of its own: flags set on the last device are
     * its alone, and none is active before it is retained. */
    int last = count - 1;
    unsigned int flags = 0;
    int active = 0;
    CHECK(cuDevicePrimaryCtxSetFlags_v2(last, CU_CTX_SCHED_BLOCKING_SYNC));
    for (int d = 0; d < count; d++) {
        CHECK(cuDevicePrimaryCtxGetState(d, &flags, &active));
        unsigned int want = d == last ? CU_CTX_SCHED_BLOCKING_SYNC : 0;
        ASSERT(active == 0 && flags == want, "device %d: active %d, flags %#x", d, active, flags);
    }

    /* Per device: its primary context, a module, a + b = c with b = (d + 1) * a, so that each
     * device's result is its own: c = (d + 2) * i. */
    CUcontext ctx[MAX_DEVICES];
    CUdeviceptr a[MAX_DEVICES], b[MAX_DEVICES], c[MAX_DEVICES];
    CUmodule mod[MAX_DEVICES];
    uint64_t n = N;
    for (int d = 0; d < count; d++) {
        CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d));
        for (int e = 0; e < d; e++) ASSERT(ctx[e] != ctx[d], "devices %d and %d share a context", e, d);
        CHECK(cuCtxSetCurrent(ctx[d]));
        CUdevice cur = -1;
        CHECK(cuCtxGetDevice(&cur));
        ASSERT(cur == d, "the current context's device is %d, not %d", cur, d);
        CUfunction add;
        CHECK(cuModuleLoadData(&mod[d], ptx));
        CHECK(cuModuleGetFunction(&add, mod[d], "add_f32"));
        CHECK(cuMemAlloc_v2(&a[d], sizeof host));
        CHECK(cuMemAlloc_v2(&b[d], sizeof host));
        CHECK(cuMemAlloc_v2(&c[d], sizeof host));
        for (int i = 0; i < N; i++) host[i] = (float)i;
        CHECK(cuMemcpyHtoD_v2(a[d], host, sizeof host));
        for (int i = 0; i < N; i++) host[i] = (float)(d + 1) * (float)i;
        CHECK(cuMemcpyHtoD_v2(b[d], host, sizeof host));
        void *params[] = {&a[d], &b[d], &c[d], &n};
        CHECK(cuLaunchKernel(add, N / 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
        expect_scaled(c[d], (float)(d + 2), "add_f32", d);
        for (int e = 0; e < count; e++) {
            CHECK(cuDevicePrimaryCtxGetState(e, &flags, &active));
            ASSERT(active == (e <= d), "device %d's primary context active %d with %d retained",
                   e, active, d + 1);
        }
    }

    /* Back to each device in turn: its memory and results are where they were left. */
    for (int d = count - 1; d >= 0; d--) {
        CHECK(cuCtxSetCurrent(ctx[d]));
        CUdevice cur = -1;
        CHECK(cuCtxGetDevice(&cur));
        ASSERT(cur == d, "after switching, the device is %d, not %d", cur, d);
        expect_scaled(c[d], (float)(d + 2), "after a context switch", d);
        CHECK(cuCtxSynchronize());
    }

    /* A library loaded once (as cudart loads its kernels) and its kernel launched on every
     * device: each device's b becomes (d + 10) * i by affine_f32 (y = scale * x + shift). */
    CHECK(cuCtxSetCurrent(ctx[0]));
    CUlibrary lib;
    CUkernel affine;
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&affine, lib, "affine_f32"));
    for (int d = 0; d < count; d++) {
        CHECK(cuCtxSetCurrent(ctx[d]));
        struct {
            float scale, shift;
            uint64_t n;
        } by = {(float)(d + 10), 0.0f, N};
        void *params[] = {&by, &a[d], &b[d]};
        CHECK(cuLaunchKernel((CUfunction)affine, N / 256, 1, 1, 256, 1, 1, 0, NULL, params,
                             NULL));
        expect_scaled(b[d], (float)(d + 10), "a library's kernel", d);
    }
    CHECK(cuLibraryUnload(lib));

    /* A created context on the last device, current over the primary one. */
    CUcontext created;
    CHECK(cuCtxCreate_v2(&created, 0, last));
    CUdevice cur = -1;
    CHECK(cuCtxGetDevice(&cur));
    ASSERT(cur == last, "a context created on device %d is on %d", last, cur);
    CUdeviceptr scratch;
    CHECK(cuMemAlloc_v2(&scratch, 4096));
    CHECK(cuMemsetD32_v2(scratch, 0x5a5a5a5au, 1024));
    uint32_t word = 0;
    CHECK(cuMemcpyDtoH_v2(&word, scratch + 4092, 4));
    ASSERT(word == 0x5a5a5a5au, "memset on device %d left %#x", last, word);
    CHECK(cuCtxDestroy_v2(created));

    if (count >= 2) {
        /* Device 0's c (2i) into device 1's a, then device 1's c (3i) into device 0's a. */
        CHECK(cuMemcpyPeer(a[1], ctx[1], c[0], ctx[0], sizeof host));
        CHECK(cuCtxSetCurrent(ctx[1]));
        expect_scaled(a[1], 2.0f, "cuMemcpyPeer from device 0", 1);
        CUstream s1;
        CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
        CHECK(cuMemcpyPeerAsync(a[0], ctx[0], c[1], ctx[1], sizeof host, s1));
        CHECK(cuStreamSynchronize(s1));
        CHECK(cuCtxSetCurrent(ctx[0]));
        expect_scaled(a[0], 3.0f, "cuMemcpyPeerAsync from device 1", 0);

        /* An event of device 0 waited for in a stream of device 1. */
        CUevent e0;
        CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
        CHECK(cuMemsetD32_v2(c[0], 0, N));
        CHECK(cuEventRecord(e0, NULL));
        CHECK(cuCtxSetCurrent(ctx[1]));
        CHECK(cuStreamWaitEvent(s1, e0, 0));
        CHECK(cuEventQuery(e0));
        CHECK(cuStreamSynchronize(s1));

        if (mps_only()) {
            /* Through mps no device reaches another's memory (GPUs linked by NVLink do,
             * natively), so peer access is refused as CUDA refuses it between such devices. */
            int can = 1;
            CHECK(cuDeviceCanAccessPeer(&can, 0, 1));
            ASSERT(can == 0, "device 0 says it can access device 1");
            EXPECT(cuCtxEnablePeerAccess(ctx[0], 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
            EXPECT(cuCtxDisablePeerAccess(ctx[0]), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
            /* An event is recorded only in a stream of its own device. */
            EXPECT(cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
        }
        CHECK(cuStreamDestroy_v2(s1));
        CHECK(cuCtxSetCurrent(ctx[0]));
        CHECK(cuEventDestroy_v2(e0));
    }

    if (getenv("MPS_TEST_HOLD")) {
        printf("holding\n");
        fflush(stdout);
        while (getchar() != EOF) {
        }
    }

    for (int d = 0; d < count; d++) {
        CHECK(cuCtxSetCurrent(ctx[d]));
        CHECK(cuMemFree_v2(a[d]));
        CHECK(cuMemFree_v2(b[d]));
        CHECK(cuMemFree_v2(c[d]));
        CHECK(cuModuleUnload(mod[d]));
        CHECK(cuDevicePrimaryCtxRelease_v2(d));
        CHECK(cuDevicePrimaryCtxGetState(d, &flags, &active));
        ASSERT(active == 0, "device %d's released primary context is active", d);
    }
    return finish("multi_device");
}
