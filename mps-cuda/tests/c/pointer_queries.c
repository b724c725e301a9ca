/* Pointer queries on each kind of memory, as Triton's launcher (DEVICE_POINTER of every
 * pointer argument), XLA (MEMORY_TYPE, several at once) and cudart (cudaPointerGetAttributes)
 * ask them: device allocations, page-locked host buffers, pageable memory, and mapped and
 * unmapped parts of a reservation; and cuMemGetAddressRange.
 * Usage: pointer_queries <test_kernels.ptx> */
#define _DEFAULT_SOURCE
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"

#define MIB ((size_t)1 << 20)

/* One attribute of `p` that is a word (pointer, device address or size). */
static unsigned long long word(int attr, CUdeviceptr p) {
    unsigned long long v = 0;
    CHECK(cuPointerGetAttribute(&v, attr, p));
    return v;
}

/* One attribute of `p` that is a 32-bit integer or a boolean. */
static int small(int attr, CUdeviceptr p) {
    int v = 0;
    CHECK(cuPointerGetAttribute(&v, attr, p));
    return v;
}

/* A library's exit handler (cuFFT's) asks about a pointer after the main thread's thread-local
 * storage is gone: CUDA answers as ever (unknown memory is zeroes among several). */
static void at_exit(void) {
    int attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER};
    unsigned int type = 7;
    CUdeviceptr dp = 1;
    void *data[] = {&type, &dp};
    CUresult r = cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)(uintptr_t)&type);
    CUcontext ctx = NULL;
    CUresult rc = cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS || type != 0 || dp != 0 || rc != CUDA_SUCCESS) {
        fprintf(stderr, "at exit: cuPointerGetAttributes returned %d (type %u, device %#llx), "
                "cuCtxGetCurrent %d\n", r, type, dp, rc);
        _exit(1);
    }
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));

    /* Device memory. */
    CUdeviceptr d = 0, d2 = 0;
    CHECK(cuMemAlloc_v2(&d, MIB));
    CHECK(cuMemAlloc_v2(&d2, MIB));
    CUdeviceptr in = d + 4096 + 16;
    ASSERT(small(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, in) == CU_MEMORYTYPE_DEVICE, "memory type");
    ASSERT(word(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, in) == in, "device pointer");
    ASSERT(word(CU_POINTER_ATTRIBUTE_CONTEXT, in) == (unsigned long long)(uintptr_t)ctx,
           "context");
    ASSERT(small(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, in) == 0, "device ordinal");
    ASSERT(small(CU_POINTER_ATTRIBUTE_IS_MANAGED, in) == 0, "managed");
    ASSERT(small(CU_POINTER_ATTRIBUTE_MAPPED, in) == 1, "mapped");
    if (mps_only()) {
        /* A boolean is a whole 32-bit integer, as callers that do not clear theirs expect. */
        int whole = 0x5a5a5a5a;
        CHECK(cuPointerGetAttribute(&whole, CU_POINTER_ATTRIBUTE_MAPPED, in));
        ASSERT(whole == 1, "MAPPED wrote %#x", whole);
    }
    ASSERT(word(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, in) == d, "range start");
    ASSERT(word(CU_POINTER_ATTRIBUTE_RANGE_SIZE, in) == MIB, "range size");
    unsigned long long id = word(CU_POINTER_ATTRIBUTE_BUFFER_ID, in);
    ASSERT(id != 0 && id != word(CU_POINTER_ATTRIBUTE_BUFFER_ID, d2), "buffer ids %llu", id);
    void *hp = NULL;
    EXPECT(cuPointerGetAttribute(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, in),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuPointerGetAttribute(NULL, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, in),
           CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &size, in));
    ASSERT(base == d && size == MIB, "address range %#llx+%zu", base, size);
    CHECK(cuMemGetAddressRange_v2(NULL, &size, d + MIB - 1));
    ASSERT(size == MIB, "address range's size alone: %zu", size);

    /* Several at once, as cudart's cudaPointerGetAttributes asks: what does not apply is 0. */
    int attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                   CU_POINTER_ATTRIBUTE_HOST_POINTER, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                   CU_POINTER_ATTRIBUTE_IS_MANAGED};
    unsigned int type = 0;
    CUdeviceptr dp = 0;
    void *host = (void *)1;
    int ordinal = -1, managed = 0;
    void *data[] = {&type, &dp, &host, &ordinal, &managed};
    CHECK(cuPointerGetAttributes(5, attrs, data, in));
    ASSERT(type == CU_MEMORYTYPE_DEVICE && dp == in && host == NULL && ordinal == 0 &&
               managed == 0,
           "several: type %u device %#llx host %p ordinal %d managed %d", type, dp, host,
           ordinal, managed);

    /* Page-locked host memory. */
    char *h = NULL;
    CHECK(cuMemHostAlloc((void **)&h, MIB, 0));
    CUdeviceptr hin = (CUdeviceptr)(uintptr_t)(h + 8);
    ASSERT(small(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hin) == CU_MEMORYTYPE_HOST, "host type");
    ASSERT(word(CU_POINTER_ATTRIBUTE_HOST_POINTER, hin) == hin, "host pointer");
    ASSERT(word(CU_POINTER_ATTRIBUTE_CONTEXT, hin) == (unsigned long long)(uintptr_t)ctx,
           "host context");
    ASSERT(small(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, hin) == 0, "host device ordinal");
    /* Its device address is cuMemHostGetDevicePointer's (through mps, the server's mapping of
     * it, not its address here). */
    CUdeviceptr hdev = 0;
    CHECK(cuMemHostGetDevicePointer_v2(&hdev, h + 8, 0));
    ASSERT(hdev != 0 && word(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, hin) == hdev,
           "host buffer's device pointer %#llx", hdev);
    /* Asked by that device address (through mps, what a kernel is given), it is the same
     * memory. */
    ASSERT(small(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hdev) == CU_MEMORYTYPE_HOST,
           "device address's type");
    ASSERT(word(CU_POINTER_ATTRIBUTE_HOST_POINTER, hdev) == hin, "device address's host pointer");
    ASSERT(word(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, hdev) == hdev, "device address's device");
    if (mps_only()) {
        ASSERT(word(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, hin) == (uintptr_t)h, "host range");
        ASSERT(word(CU_POINTER_ATTRIBUTE_RANGE_SIZE, hin) == MIB, "host range size");
    }

    /* Pageable memory is not CUDA's. */
    char *pageable = malloc(4096);
    ASSERT(pageable != NULL, "no memory");
    CUdeviceptr pin = (CUdeviceptr)(uintptr_t)pageable;
    EXPECT(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, pin),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, pin),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemGetAddressRange_v2(&base, &size, pin), CUDA_ERROR_NOT_FOUND);
    type = 77;
    dp = 1;
    CHECK(cuPointerGetAttributes(2, attrs, data, pin));
    if (mps_only()) ASSERT(type == 0 && dp == 0, "pageable: type %u device %#llx", type, dp);

    /* A reservation with one chunk mapped in it. */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle chunk = 0;
    CHECK(cuMemAddressReserve(&va, 4 * g, 0, 0, 0));
    CHECK(cuMemCreate(&chunk, g, &prop, 0));
    CHECK(cuMemMap(va + g, g, 0, chunk, 0));
    CUmemAccessDesc rw = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(va + g, g, &rw, 1));
    CUdeviceptr vin = va + g + 4;
    ASSERT(small(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, vin) == CU_MEMORYTYPE_DEVICE, "mapped type");
    ASSERT(word(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, vin) == vin, "mapped device pointer");
    ASSERT(small(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, vin) == 0, "mapped device ordinal");
    ASSERT(small(CU_POINTER_ATTRIBUTE_MAPPED, vin) == 1, "mapped");
    /* The range is the reservation's; the mapping's is its own attribute. */
    ASSERT(word(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, vin) == va, "mapped range start");
    ASSERT(word(CU_POINTER_ATTRIBUTE_RANGE_SIZE, vin) == 4 * g, "mapped range size");
    ASSERT(word(CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, vin) == va + g, "mapping base");
    ASSERT(word(CU_POINTER_ATTRIBUTE_MAPPING_SIZE, vin) == g, "mapping size");
    ASSERT(word(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, vin) ==
               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
           "allowed handle types");
    ASSERT(small(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, vin) == CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
           "access flags");
    if (mps_only()) {
        CHECK(cuMemGetAddressRange_v2(&base, &size, vin));
        ASSERT(base == va + g && size == g, "mapped address range %#llx+%zu", base, size);
        /* Reserved, not mapped. */
        ASSERT(small(CU_POINTER_ATTRIBUTE_MAPPED, va + 3 * g) == 0, "unmapped part");
        EXPECT(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, va + 3 * g),
               CUDA_ERROR_INVALID_VALUE);
    }
    CHECK(cuMemUnmap(va + g, g));
    CHECK(cuMemRelease(chunk));
    CHECK(cuMemAddressFree(va, 4 * g));

    /* Freed, a pointer is nobody's. */
    CHECK(cuMemFree_v2(d));
    EXPECT(cuPointerGetAttribute(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, in),
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree_v2(d2));
    CHECK(cuMemFreeHost(h));
    free(pageable);
    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    /* Registered last, so that it runs first, with the library still loaded. */
    atexit(at_exit);
    return finish("pointer_queries");
}
