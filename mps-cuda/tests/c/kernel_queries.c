/* What PyTorch and cuBLASLt ask of the context and its kernels: the stream priority range,
 * context limits, kernel attributes (and the two a program may set), occupancy. The figures are
 * the device's, so the checks are relations that hold on any device: natively, through mps on
 * a GPU, and on the simulator; what only mps refuses runs with MPS_ONLY=1.
 * Usage: kernel_queries <test_kernels.ptx> */
#include <stdio.h>
#include <string.h>

#include "cuda_api.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction fill;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));

    int least = 1, greatest = 1;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
    ASSERT(least == 0 && greatest < 0, "priorities %d to %d", least, greatest);
    CHECK(cuCtxGetStreamPriorityRange(NULL, &greatest));

    size_t stack = 0, heap = 0;
    CHECK(cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE));
    CHECK(cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE));
    ASSERT(stack > 0 && heap > 0, "stack %zu, heap %zu", stack, heap);
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack));
    EXPECT(cuCtxGetLimit(&stack, 99), CUDA_ERROR_INVALID_VALUE);
    if (mps_only()) {
        /* The server's context is every client's: a limit is not changed. */
        EXPECT(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, stack * 2), CUDA_ERROR_NOT_SUPPORTED);
    }

    CHECK(cuModuleLoadData(&module, ptx));
    CHECK(cuModuleGetFunction(&fill, module, "fill_u32"));
    int threads = 0, regs = 0, shared = -1, dynamic = 0, optin = 0, per_sm = 0;
    CHECK(cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fill));
    CHECK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, fill));
    CHECK(cuFuncGetAttribute(&shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fill));
    CHECK(cuFuncGetAttribute(&dynamic, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fill));
    CHECK(cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev));
    CHECK(cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev));
    ASSERT(threads >= 256 && threads <= 1024, "max threads per block %d", threads);
    ASSERT(regs > 0 && shared >= 0, "%d registers, %d bytes of shared memory", regs, shared);
    ASSERT(dynamic > 0 && dynamic + shared <= optin, "dynamic %d, opt-in %d", dynamic, optin);
    EXPECT(cuFuncGetAttribute(&threads, 99, fill), CUDA_ERROR_INVALID_VALUE);

    /* A program raises its kernel's dynamic shared memory, and reads it back. */
    int want = optin - shared, got = 0;
    CHECK(cuFuncSetAttribute(fill, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, want));
    CHECK(cuFuncGetAttribute(&got, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fill));
    ASSERT(got == want, "max dynamic shared memory %d after setting %d", got, want);
    EXPECT(cuFuncSetAttribute(fill, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, want + 1),
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuFuncSetAttribute(fill, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 50));
    CHECK(cuFuncGetAttribute(&got, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, fill));
    ASSERT(got == 50, "carveout %d after setting 50", got);

    /* A global the module lacks is not found, in a module and in a library alike. */
    CUdeviceptr global = 0;
    size_t global_size = 0;
    EXPECT(cuModuleGetGlobal_v2(&global, &global_size, module, "no_such_global"),
           CUDA_ERROR_NOT_FOUND);

    /* A library's kernel, asked per device as cuBLASLt does. */
    CUlibrary lib;
    CUkernel kernel;
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuLibraryGetKernel(&kernel, lib, "fill_u32"));
    EXPECT(cuLibraryGetGlobal(&global, &global_size, lib, "no_such_global"), CUDA_ERROR_NOT_FOUND);
    CHECK(cuKernelGetAttribute(&got, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel, dev));
    ASSERT(got == threads, "the library's kernel takes %d threads, the module's %d", got, threads);
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024, kernel, dev));
    CHECK(cuKernelGetAttribute(&got, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, kernel, dev));
    ASSERT(got == 1024, "the kernel's dynamic shared memory %d after setting 1024", got);
    /* Non-portable cluster sizes allowed, as cublasCreate allows them: kept and read back. */
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, kernel, dev));
    CHECK(cuKernelGetAttribute(&got, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, kernel,
                               dev));
    ASSERT(got == 1, "non-portable cluster sizes allowed: %d after setting 1", got);
    /* Clusters at once on the device: of 2 blocks, and of 16 now that the kernel allows them. */
    CUfunction kfn;
    CHECK(cuKernelGetFunction(&kfn, kernel));
    CUlaunchAttribute cl = {CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, {0}, {{0}}};
    cl.value.clusterDim.x = 2;
    cl.value.clusterDim.y = cl.value.clusterDim.z = 1;
    CUlaunchConfig each = {2, 1, 1, 128, 1, 1, 0, NULL, &cl, 1};
    int pairs = 0, sixteens = 0;
    CHECK(cuOccupancyMaxActiveClusters(&pairs, kfn, &each));
    cl.value.clusterDim.x = each.gridDimX = 16;
    CHECK(cuOccupancyMaxActiveClusters(&sixteens, kfn, &each));
    ASSERT(pairs >= 1 && sixteens >= 1 && sixteens < pairs, "%d clusters of 2, %d of 16", pairs,
           sixteens);
    if (mps_only()) {
        EXPECT(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 2, kernel,
                                    dev),
               CUDA_ERROR_INVALID_VALUE);
        /* What a launch through mps never uses but could change a kernel is refused. */
        EXPECT(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, 2, kernel, dev),
               CUDA_ERROR_NOT_SUPPORTED);
    }

    /* Occupancy: what fits on one SM, and the shared memory that keeps blocks fitting. */
    int blocks = 0, fewer = 0;
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fill, 256, 0));
    ASSERT(blocks >= 1 && blocks * 256 <= per_sm, "%d blocks of 256 threads per SM", blocks);
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&fewer, fill, 256, 64 * 1024, 0));
    ASSERT(fewer >= 1 && fewer < blocks, "%d blocks with 64 KiB each, %d without", fewer, blocks);
    size_t room = 0;
    CHECK(cuOccupancyAvailableDynamicSMemPerBlock(&room, fill, 2, 256));
    ASSERT(room >= 48 * 1024 && room <= (size_t)optin, "%zu bytes for 2 blocks", room);
    /* NVIDIA's driver leaves the shared memory it reserves per block out of that figure (on an
     * H200 2 blocks of `room` bytes do not fit, 1 KiB less each do): what mps owes is the
     * driver's answers, so the check allows for it. */
    int reserved = 0;
    CHECK(cuDeviceGetAttribute(&reserved, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
                               dev));
    ASSERT(reserved >= 0 && (size_t)reserved < room, "%d bytes reserved per block", reserved);
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&fewer, fill, 256, room - reserved));
    ASSERT(fewer >= 2, "%d blocks fit with the %zu bytes (less %d reserved) that leave room for 2",
           fewer, room, reserved);

    /* Asked again before each launch, as some programs ask: the same figure every time, and
     * the launches' work done. */
    CUstream s;
    CUdeviceptr buf;
    unsigned long long n = 256;
    unsigned value = 0;
    void *args[] = {&buf, &value, &n};
    CHECK(cuStreamCreate(&s, 1));
    CHECK(cuMemAlloc_v2(&buf, n * 4));
    for (value = 1; value <= 32; value++) {
        int again = 0;
        CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&again, fill, 256, 0));
        ASSERT(again == blocks, "%d blocks of 256 threads per SM, then %d", blocks, again);
        CHECK(cuLaunchKernel(fill, 1, 1, 1, 256, 1, 1, 0, s, args, NULL));
    }
    CHECK(cuStreamSynchronize(s));
    unsigned last[256];
    CHECK(cuMemcpyDtoH_v2(last, buf, sizeof last));
    for (int i = 0; i < 256; i++) ASSERT(last[i] == 32, "word %d is %u after the launches", i, last[i]);
    CHECK(cuMemFree_v2(buf));
    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuLibraryUnload(lib));

    /* A cache preference: taken, an out-of-range one refused. */
    CHECK(cuFuncSetCacheConfig(fill, 1));
    EXPECT(cuFuncSetCacheConfig(fill, 4), CUDA_ERROR_INVALID_VALUE);

    /* The PCI address: domain:bus:device.function, and back to the device. */
    char bus_id[13] = {0};
    CHECK(cuDeviceGetPCIBusId(bus_id, sizeof bus_id, dev));
    unsigned domain = 0, bus = 0, slot = 0, function = 9;
    ASSERT(sscanf(bus_id, "%4x:%2x:%2x.%1x", &domain, &bus, &slot, &function) == 4 &&
               strlen(bus_id) == 12 && function == 0,
           "PCI bus id %s", bus_id);
    int pci_bus = -1;
    CHECK(cuDeviceGetAttribute(&pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev));
    ASSERT((unsigned)pci_bus == bus, "bus %x in %s, attribute %x", bus, bus_id, pci_bus);
    CUdevice by_id = -1;
    CHECK(cuDeviceGetByPCIBusId(&by_id, bus_id));
    ASSERT(by_id == dev, "device %d for %s", by_id, bus_id);
    EXPECT(cuDeviceGetByPCIBusId(&by_id, "not a bus id"), CUDA_ERROR_INVALID_VALUE);

    CHECK(cuModuleUnload(module));
    CHECK(cuCtxDestroy_v2(ctx));
    free(ptx);
    return finish("kernel_queries");
}
