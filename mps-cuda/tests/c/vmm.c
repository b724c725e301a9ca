/* Virtual memory management as XLA's and PyTorch's (expandable segments) allocators use it:
 * reserve a large range, create physical chunks at the granularity, map them one after another
 * and set their access, write them with a kernel and memsets, copy back across the chunks,
 * grow the mapping, alias a chunk, retain its handle from an address, then unmap, release and
 * free; and the errors CUDA documents. With EXPECT_LIMIT_MB (mps only, under
 * MPS_PINNED_DEVICE_MEM_LIMIT), physical memory counts against the limit.
 * Usage: vmm <test_kernels.ptx> */
#include <string.h>

#include "cuda_api.h"

static CUmemAllocationProp pinned(int handle_types) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = handle_types;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

static CUresult allow(CUdeviceptr va, size_t size) {
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 0;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return cuMemSetAccess(va, size, &d, 1);
}

static int all_are(const uint32_t *w, size_t n, uint32_t v) {
    for (size_t i = 0; i < n; i++)
        if (w[i] != v) {
            fprintf(stderr, "word %zu is %#x, not %#x\n", i, w[i], v);
            return 0;
        }
    return 1;
}

/* Under a memory limit of `limit_mb`: physical chunks are created until the limit refuses one
 * with CUDA's out-of-memory, and each counts in cuMemGetInfo. */
static void counts_against_the_limit(size_t g, long limit_mb) {
    size_t free0, total;
    CHECK(cuMemGetInfo_v2(&free0, &total));
    ASSERT(total == (size_t)limit_mb << 20, "total %zu under a %ld MiB limit", total, limit_mb);
    CUmemAllocationProp p = pinned(CU_MEM_HANDLE_TYPE_NONE);
    enum { MAX = 4096 };
    static CUmemGenericAllocationHandle h[MAX];
    size_t n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < MAX && (r = cuMemCreate(&h[n], g, &p, 0)) == CUDA_SUCCESS) {
        n++;
        size_t f;
        CHECK(cuMemGetInfo_v2(&f, &total));
        ASSERT(f == free0 - n * g, "free %zu after %zu chunks of %zu (from %zu)", f, n, g, free0);
    }
    ASSERT(r == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate past the limit returned %d", r);
    ASSERT(n == free0 / g, "%zu chunks of %zu fit in %zu free bytes", n, g, free0);
    for (size_t i = 0; i < n; i++) CHECK(cuMemRelease(h[i]));
    size_t f;
    CHECK(cuMemGetInfo_v2(&f, &total));
    ASSERT(f == free0, "free %zu after releasing everything, was %zu", f, free0);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CUmodule mod;
    CUfunction fill;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));

    int vmm = 0;
    CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0));
    ASSERT(vmm == 1, "VMM supported: %d", vmm);

    /* The granularity, and what it refuses. */
    CUmemAllocationProp prop = pinned(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    size_t g = 0, rec = 0;
    CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    ASSERT(g > 0 && (g & (g - 1)) == 0, "granularity %zu", g);
    ASSERT(rec >= g && rec % g == 0, "recommended granularity %zu, minimum %zu", rec, g);
    EXPECT(cuMemGetAllocationGranularity(&g, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp bad = prop;
    bad.location.id = 9999;
    if (mps_only()) EXPECT(cuMemGetAllocationGranularity(&g, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
    /* The allocation type is not looked at (NVIDIA's driver answers for type 0 too). */
    bad = prop;
    bad.type = 0;
    CHECK(cuMemGetAllocationGranularity(&g, &bad, 0));
    if (!g) return finish("vmm");

    /* A large reservation, as the allocators make one up front. */
    const size_t span = 512 * g;
    CUdeviceptr va = 0;
    CHECK(cuMemAddressReserve(&va, span, 0, 0, 0));
    ASSERT(va != 0 && va % g == 0, "reservation at %#llx", va);
    EXPECT(cuMemAddressReserve(&va, g, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);

    /* The first chunk, as PyTorch makes it (with a POSIX file descriptor handle type). */
    CUmemGenericAllocationHandle h0 = 0, h1 = 0;
    CHECK(cuMemCreate(&h0, g, &prop, 0));
    EXPECT(cuMemCreate(&h1, g + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemCreate(&h1, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemCreate(&h1, g, &prop, 1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemCreate(&h1, g, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    CHECK(cuMemGetAllocationPropertiesFromHandle(&got, h0));
    ASSERT(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
               got.location.id == 0 &&
               got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
           "properties: type %d location %d/%d handle types %d", got.type, got.location.type,
           got.location.id, got.requestedHandleTypes);

    CHECK(cuMemMap(va, g, 0, h0, 0));
    CHECK(allow(va, g));
    unsigned long long flags = 99;
    CUmemLocation here = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
    CHECK(cuMemGetAccess(&flags, &here, va + 64));
    ASSERT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access flags %llu", flags);
    if (mps_only()) EXPECT(cuMemGetAccess(&flags, &here, va + g), CUDA_ERROR_INVALID_VALUE);

    /* A kernel writes the chunk; a copy reads it back. */
    const size_t words = g / 4;
    uint32_t *host = malloc(3 * g);
    ASSERT(host != NULL, "no host memory");
    CUdeviceptr p = va;
    uint32_t value = 0x11111111u;
    uint64_t n = words;
    void *params[] = {&p, &value, &n};
    CHECK(cuLaunchKernel(fill, 64, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuMemcpyDtoH_v2(host, va, g));
    ASSERT(all_are(host, words, 0x11111111u), "the kernel's writes in the first chunk");

    /* Grow: a second chunk of twice the size mapped right after the first, as the expandable
     * segments grow. */
    CHECK(cuMemCreate(&h1, 2 * g, &prop, 0));
    CHECK(cuMemMap(va + g, 2 * g, 0, h1, 0));
    CHECK(allow(va + g, 2 * g));
    CHECK(cuMemsetD32_v2(va + g, 0x22222222u, 2 * words));
    /* One kernel over both chunks' last and first halves. */
    p = va + g / 2;
    value = 0x33333333u;
    n = words;
    CHECK(cuLaunchKernel(fill, 64, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CHECK(cuMemcpyDtoH_v2(host, va, 3 * g));
    ASSERT(all_are(host, words / 2, 0x11111111u), "the first chunk's first half");
    ASSERT(all_are(host + words / 2, words, 0x33333333u), "the kernel across the chunks");
    ASSERT(all_are(host + words + words / 2, words + words / 2, 0x22222222u),
           "the second chunk's rest");
    /* A copy from the host across the boundary, and back. */
    for (size_t i = 0; i < 2 * words; i++) host[i] = (uint32_t)i;
    CHECK(cuMemcpyHtoD_v2(va + g / 2, host, g));
    memset(host, 0, g);
    CHECK(cuMemcpyDtoH_v2(host, va + g / 2, g));
    int wrong = 0;
    for (size_t i = 0; i < words; i++) wrong += host[i] != (uint32_t)i;
    ASSERT(wrong == 0, "%d of %zu words wrong after a copy across two chunks", wrong, words);

    /* A second mapping of the first chunk sees its bytes. */
    CUdeviceptr alias = va + 8 * g;
    CHECK(cuMemMap(alias, g, 0, h0, 0));
    CHECK(allow(alias, g));
    uint32_t w = 0;
    CHECK(cuMemcpyDtoH_v2(&w, alias + g - 4, 4));
    ASSERT(w == (uint32_t)(words / 2 - 1), "the alias reads %#x", w);

    /* The handle mapped at an address is the one that was mapped there, retained. */
    CUmemGenericAllocationHandle r = 0;
    CHECK(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(va + g + 4096)));
    ASSERT(r == h1, "retained %#llx, mapped %#llx", r, h1);
    CHECK(cuMemRelease(r));
    if (mps_only())
        EXPECT(cuMemRetainAllocationHandle(&r, (void *)(uintptr_t)(va + 4 * g)),
               CUDA_ERROR_INVALID_VALUE);

    /* Misuse. */
    /* An offset (CUDA: "must currently be zero") and an address off the granularity are not
     * supported, as NVIDIA's driver answers them. */
    EXPECT(cuMemMap(va + 4 * g, g, 1, h1, 0), CUDA_ERROR_NOT_SUPPORTED);     /* offset */
    EXPECT(cuMemMap(va + 4 * g + 1, g, 0, h1, 0), CUDA_ERROR_NOT_SUPPORTED); /* address */
    EXPECT(cuMemMap(va + 4 * g, g, 2 * g, h1, 0), CUDA_ERROR_NOT_SUPPORTED); /* past its end */
    EXPECT(cuMemMap(va + 4 * g, g, 0, h1, 1), CUDA_ERROR_INVALID_VALUE);     /* flags */
    EXPECT(allow(va + 4 * g, g), CUDA_ERROR_INVALID_VALUE);                  /* not mapped */
    if (mps_only()) {
        /* Left undefined or unspecified by CUDA's documentation; refused by mps. */
        EXPECT(cuMemMap(va, g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE); /* over a mapping */
        EXPECT(cuMemMap(va + span, g, 0, h1, 0), CUDA_ERROR_INVALID_VALUE); /* outside */
        EXPECT(cuMemAddressFree(va, g), CUDA_ERROR_INVALID_VALUE); /* not its size */
        EXPECT(cuMemRelease(0x5eedULL), CUDA_ERROR_INVALID_VALUE);
    }

    /* Released while mapped, a chunk lives on until unmapped. */
    CHECK(cuMemRelease(h1));
    CHECK(cuMemcpyDtoH_v2(&w, va + 3 * g - 4, 4));
    ASSERT(w == 0x22222222u, "the released but mapped chunk reads %#x", w);
    CHECK(cuMemUnmap(alias, g));
    CHECK(cuMemUnmap(va, 3 * g));
    if (mps_only()) {
        /* Unmapped, nothing there is the program's. */
        EXPECT(cuMemGetAccess(&flags, &here, va), CUDA_ERROR_INVALID_VALUE);
        ASSERT(cuMemcpyDtoH_v2(&w, va, 4) != CUDA_SUCCESS, "a copy from unmapped memory");
        EXPECT(cuMemGetAllocationPropertiesFromHandle(&got, h1), CUDA_ERROR_INVALID_VALUE);
    }
    CHECK(cuMemRelease(h0));
    CHECK(cuMemAddressFree(va, span));

    const char *limit = getenv("EXPECT_LIMIT_MB");
    if (limit && mps_only()) counts_against_the_limit(g, atol(limit));

    free(host);
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    return finish("vmm");
}
