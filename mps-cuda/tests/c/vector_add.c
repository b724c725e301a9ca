/* A driver-API program as people write them: device queries, a created context, a PTX module,
 * add_f32 launched with kernelParams and saxpy_f32 with an `extra` parameter buffer, a library
 * and its kernel launched as a function. Usage: vector_add <test_kernels.ptx> */
#include <string.h>

#include "cuda_api.h"

#define N (1 << 20)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);

    CUdevice dev;
    CUcontext ctx;
    EXPECT(cuDeviceGet(&dev, 0), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cuInit(0));
    int version = 0, count = 0;
    CHECK(cuDriverGetVersion(&version));
    ASSERT(version == 13000, "driver version %d", version);
    CHECK(cuDeviceGetCount(&count));
    ASSERT(count >= 1, "%d devices", count);
    CHECK(cuDeviceGet(&dev, 0));
    EXPECT(cuDeviceGet(&dev, count), CUDA_ERROR_INVALID_DEVICE);
    char name[256] = {0};
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    size_t total = 0;
    CHECK(cuDeviceTotalMem_v2(&total, dev));
    int sms = 0, warp = 0, major = 0, clock = 0;
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CHECK(cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev));
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&clock, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev));
    ASSERT(sms > 0 && warp == 32 && major > 0 && clock > 0 && total > 0,
           "sms %d warp %d cc %d clock %d kHz mem %zu", sms, warp, major, clock, total);
    /* An attribute past CU_DEVICE_ATTRIBUTE_MAX is refused, as the driver refuses it. */
    EXPECT(cuDeviceGetAttribute(&clock, 100000, dev), CUDA_ERROR_INVALID_VALUE);
    CUuuid a, b;
    CHECK(cuDeviceGetUuid_v2(&a, dev));
    CHECK(cuDeviceGetUuid_v2(&b, dev));
    ASSERT(memcmp(&a, &b, sizeof a) == 0, "the uuid changed");
    printf("device: %s, %d SMs, %zu MiB\n", name, sms, total >> 20);

    CUdeviceptr p;
    EXPECT(cuMemAlloc_v2(&p, 16), CUDA_ERROR_INVALID_CONTEXT); /* no context yet */
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));
    CUcontext cur = NULL;
    CHECK(cuCtxGetCurrent(&cur));
    ASSERT(cur == ctx, "the created context is not current");
    CUdevice cdev = -1;
    CHECK(cuCtxGetDevice(&cdev));
    ASSERT(cdev == 0, "context device %d", cdev);
    CUcontext popped = NULL;
    CHECK(cuCtxPopCurrent_v2(&popped));
    ASSERT(popped == ctx, "popped %p, not the created context", (void *)popped);
    EXPECT(cuCtxGetDevice(&cdev), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxPopCurrent_v2(&popped), CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxPushCurrent_v2(ctx));

    /* The loading mode is the driver's default, lazy (2), unless CUDA_MODULE_LOADING asks for
     * eager (1): the CUDA runtime loads the images of a library such as cuBLAS by it. */
    int mode = 0;
    const char *asked = getenv("CUDA_MODULE_LOADING");
    CHECK(cuModuleGetLoadingMode(&mode));
    ASSERT(mode == (asked && strcmp(asked, "EAGER") == 0 ? 1 : 2), "loading mode %d", mode);

    CUmodule mod;
    CUfunction add, saxpy, missing;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&add, mod, "add_f32"));
    CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy_f32"));
    /* The same image from its file (Triton's kernels come so); a missing file is not found. */
    CUmodule from_file;
    CUfunction add_again;
    CHECK(cuModuleLoad(&from_file, argv[1]));
    CHECK(cuModuleGetFunction(&add_again, from_file, "add_f32"));
    CHECK(cuModuleUnload(from_file));
    EXPECT(cuModuleLoad(&from_file, "/nonexistent/test_kernels.ptx"), CUDA_ERROR_FILE_NOT_FOUND);
    /* Into a handle of its own: the driver may write to it even when it fails. */
    EXPECT(cuModuleGetFunction(&missing, mod, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    /* A fatbin whose one cubin is for another architecture (sm_75) has no code for this device:
     * the driver's own result comes back, not a generic one (cuBLAS probes its per-architecture
     * images and skips those that fail with this one). The simulator runs no cubin at all. */
    int minor = 0;
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    if (major * 10 + minor != 75) {
        struct {
            uint32_t magic;
            uint16_t version, header;
            uint64_t size;
            uint16_t kind, part_version;
            uint32_t part_header;
            uint64_t part_size, part_padded;
            uint16_t format_minor, format_major;
            uint32_t arch, name_offset, name_len;
            uint64_t flags, zero, uncompressed;
            unsigned char elf[64];
        } fatbin = {0xba55ed50, 1, 16, 128, 2, 0x0101, 64, 64, 64, 7, 1, 75, 0, 0, 0x11, 0, 0,
                    {0x7f, 'E', 'L', 'F', 2, 1, 1}};
        CUmodule other;
        EXPECT(cuModuleLoadData(&other, &fatbin), CUDA_ERROR_NO_BINARY_FOR_GPU);
    }
    size_t off = 0, size = 0;
    CHECK(cuFuncGetParamInfo(add, 3, &off, &size));
    ASSERT(off == 24 && size == 8, "add_f32 parameter 3 at %zu, %zu bytes", off, size);

    float *ha = malloc(N * sizeof(float)), *hb = malloc(N * sizeof(float));
    float *hc = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        ha[i] = (float)i;
        hb[i] = 2.0f * (float)i;
    }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc_v2(&da, N * sizeof(float)));
    CHECK(cuMemAlloc_v2(&db, N * sizeof(float)));
    CHECK(cuMemAlloc_v2(&dc, N * sizeof(float)));
    CHECK(cuMemcpyHtoD_v2(da, ha, N * sizeof(float)));
    CHECK(cuMemcpyHtoD_v2(db, hb, N * sizeof(float)));
    uint64_t n = N;
    void *params[] = {&da, &db, &dc, &n};
    /* A launch past the device's limits fails in the call itself, as the driver's does, and
     * the stream carries on. */
    EXPECT(cuLaunchKernel(add, 0, 1, 1, 256, 1, 1, 0, NULL, params, NULL),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(add, 1, 1, 1, 2048, 1, 1, 0, NULL, params, NULL),
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuLaunchKernel(add, 256, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuMemcpyDtoH_v2(hc, dc, N * sizeof(float)));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += hc[i] != 3.0f * (float)i;
    ASSERT(wrong == 0, "%d of %d sums wrong", wrong, N);

    /* The same through cuLaunchKernelEx (into db: a + b = 3i again). */
    void *ex_params[] = {&da, &db, &db, &n};
    CUlaunchConfig config = {64, 1, 1, 256, 1, 1, 0, NULL, NULL, 0};
    CHECK(cuLaunchKernelEx(&config, add, ex_params, NULL));
    CHECK(cuMemcpyDtoH_v2(hc, db, N * sizeof(float)));
    ASSERT(hc[N - 1] == 3.0f * (float)(N - 1), "cuLaunchKernelEx: %f", hc[N - 1]);
    /* A cluster of one block asks for nothing beyond a plain launch (cuBLASLt passes one). */
    CUlaunchAttribute cluster = {CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, {0}, {{0}}};
    cluster.value.clusterDim.x = cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    CHECK(cuLaunchKernelEx(&config, add, ex_params, NULL)); /* db = a + 3a */
    CHECK(cuMemcpyDtoH_v2(hc, db, N * sizeof(float)));
    ASSERT(hc[N - 1] == 4.0f * (float)(N - 1), "a cluster of one: %f", hc[N - 1]);
    /* Programmatic dependent launch allowed (cuBLASLt allows it on Hopper): a permission the
     * plain launch, which waits for the kernel before it, satisfies. db = a + 4a. */
    CUlaunchAttribute pdl = {CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, {0}, {{0}}};
    pdl.value.programmaticStreamSerializationAllowed = 1;
    config.attrs = &pdl;
    CHECK(cuLaunchKernelEx(&config, add, ex_params, NULL));
    CHECK(cuMemcpyDtoH_v2(hc, db, N * sizeof(float)));
    ASSERT(hc[N - 1] == 5.0f * (float)(N - 1), "programmatic serialisation: %f", hc[N - 1]);
    /* Clusters of two blocks (the grid is 64 blocks): db = a + 5a. */
    cluster.value.clusterDim.x = 2;
    config.attrs = &cluster;
    CHECK(cuLaunchKernelEx(&config, add, ex_params, NULL));
    CHECK(cuMemcpyDtoH_v2(hc, db, N * sizeof(float)));
    ASSERT(hc[N - 1] == 6.0f * (float)(N - 1), "clusters of two: %f", hc[N - 1]);
    if (mps_only()) {
        /* Clusters that do not divide the grid: CUDA_ERROR_INVALID_CLUSTER_SIZE, which CUDA
         * documents for "a kernel launch error due to cluster misconfiguration". */
        cluster.value.clusterDim.x = 3;
        EXPECT(cuLaunchKernelEx(&config, add, ex_params, NULL), CUDA_ERROR_INVALID_CLUSTER_SIZE);
        /* Launches of another kind are not supported through mps: refused, never ignored. */
        CUlaunchAttribute coop = {CU_LAUNCH_ATTRIBUTE_COOPERATIVE, {0}, {{0}}};
        coop.value.cooperative = 1;
        config.attrs = &coop;
        EXPECT(cuLaunchKernelEx(&config, add, ex_params, NULL), CUDA_ERROR_NOT_SUPPORTED);
    }

    /* saxpy through `extra`: dc = 0.5 * da + dc, from a buffer laid out as the kernel's
     * parameters are (float at 0, pointers at 8 and 16, count at 24). */
    unsigned char buf[32] = {0};
    float alpha = 0.5f;
    memcpy(buf, &alpha, 4);
    memcpy(buf + 8, &da, 8);
    memcpy(buf + 16, &dc, 8);
    memcpy(buf + 24, &n, 8);
    size_t buf_size = sizeof buf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &buf_size,
                     CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(saxpy, 128, 1, 1, 128, 1, 1, 0, NULL, NULL, extra));
    EXPECT(cuLaunchKernel(saxpy, 1, 1, 1, 1, 1, 1, 0, NULL, params, extra),
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemcpyDtoH_v2(hc, dc, N * sizeof(float)));
    wrong = 0;
    for (int i = 0; i < N; i++) wrong += hc[i] != 3.5f * (float)i;
    ASSERT(wrong == 0, "%d of %d saxpy results wrong", wrong, N);

    /* A library's kernel, launched as cudart does: the CUkernel handle as the function. */
    CUlibrary lib;
    CUkernel kern;
    CUfunction fill;
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kern, lib, "fill_u32"));
    CHECK(cuKernelGetFunction(&fill, kern));
    uint32_t value = 0xabcd1234u;
    void *fill_params[] = {&dc, &value, &n};
    CHECK(cuLaunchKernel((CUfunction)kern, 64, 1, 1, 128, 1, 1, 0, NULL, fill_params, NULL));
    CHECK(cuMemcpyDtoH_v2(hc, dc, N * sizeof(float)));
    uint32_t first;
    memcpy(&first, &hc[N - 1], 4);
    ASSERT(first == value, "fill_u32 wrote %#x", first);
    CHECK(cuLibraryUnload(lib));
    /* Handles used after their module, library or context is gone: CUDA leaves that undefined
     * (NVIDIA's driver may succeed or crash); mps refuses them. */
    if (mps_only())
        EXPECT(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, NULL, fill_params, NULL),
               CUDA_ERROR_INVALID_HANDLE);

    CHECK(cuMemFree_v2(da));
    CHECK(cuMemFree_v2(db));
    CHECK(cuMemFree_v2(0)); /* nothing to free: success, as cuBLAS expects */
    CHECK(cuModuleUnload(mod));
    if (mps_only())
        EXPECT(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
               CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuCtxDestroy_v2(ctx)); /* frees dc with it */
    CHECK(cuCtxGetCurrent(&cur));
    ASSERT(cur == NULL, "the destroyed context is still current");
    if (mps_only()) EXPECT(cuCtxSetCurrent(ctx), CUDA_ERROR_INVALID_CONTEXT);

    /* The primary context, as cudart uses it. */
    CUcontext primary;
    unsigned int flags = 1;
    int active = 0;
    CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    ASSERT(active == 1 && flags == 0, "primary context active %d flags %u", active, flags);
    CHECK(cuCtxSetCurrent(primary));
    CHECK(cuMemAlloc_v2(&p, 4096));
    CHECK(cuMemsetD32_v2(p, 7, 1024));
    uint32_t word = 0;
    CHECK(cuMemcpyDtoH_v2(&word, p + 4092, 4));
    ASSERT(word == 7, "memset left %u", word);
    /* A launch into its legacy stream (p = p + p over 4 words), then the same once the context
     * is gone: the second must not succeed on what the first resolved. The kernel is a library's,
     * which belongs to no context and outlives it. */
    CUlibrary plib;
    CUkernel padd;
    CHECK(cuLibraryLoadData(&plib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&padd, plib, "add_f32"));
    float one = 1.0f;
    memcpy(&word, &one, 4);
    CHECK(cuMemsetD32_v2(p, word, 4));
    n = 4;
    void *pparams[] = {&p, &p, &p, &n};
    CHECK(cuLaunchKernel((CUfunction)padd, 1, 1, 1, 32, 1, 1, 0, NULL, pparams, NULL));
    CHECK(cuStreamSynchronize(NULL));
    float two = 0.0f;
    CHECK(cuMemcpyDtoH_v2(&two, p + 12, 4));
    ASSERT(two == 2.0f, "add_f32 in the primary context left %f", two);
    CHECK(cuDevicePrimaryCtxRelease_v2(dev));
    CHECK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
    ASSERT(active == 0, "the released primary context is active");
    EXPECT(cuMemAlloc_v2(&p, 16), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    if (mps_only()) {
        EXPECT(cuLaunchKernel((CUfunction)padd, 1, 1, 1, 32, 1, 1, 0, NULL, pparams, NULL),
               CUDA_ERROR_CONTEXT_IS_DESTROYED);
        EXPECT(cuStreamSynchronize(NULL), CUDA_ERROR_CONTEXT_IS_DESTROYED);
        EXPECT(cuMemsetD32_v2(p, 7, 1024), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    CHECK(cuLibraryUnload(plib));
    return finish("vector_add");
}
