/* The stream-ordered allocator: cuMemAllocAsync and cuMemFreeAsync in a loop with kernels
 * between them, in one stream and across two (a block freed in one stream while a kernel there
 * still writes it must not be handed to the other before that kernel is done), the device's
 * default and current pools, a pool of its own (cuMemAllocFromPoolAsync, the pointer's pool),
 * the attributes (reuse flags, release threshold, used and reserved figures and their
 * high-water marks), trimming, access, and running out of memory. What CUDA documents only;
 * with MPS_ONLY=1 also mps's refusal inside a stream capture, and, where EXPECT_LIMIT_MB is set
 * (the client's memory limit), allocations past that limit.
 * Usage: mem_pool <test_kernels.ptx> */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define MIB (1024ull * 1024ull)
#define WORDS (256 * 1024) /* a 1 MiB buffer of 32-bit words */

static CUfunction fill, spin;

static void launch_fill(CUdeviceptr p, uint32_t value, CUstream s) {
    uint64_t n = WORDS;
    void *params[] = {&p, &value, &n};
    CHECK(cuLaunchKernel(fill, 64, 1, 1, 256, 1, 1, 0, s, params, NULL));
}

static void launch_spin(uint64_t ns, CUdeviceptr counter, CUstream s) {
    void *params[] = {&ns, &counter};
    CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

static uint64_t attr(CUmemoryPool pool, int a) {
    uint64_t v = 0;
    CHECK(cuMemPoolGetAttribute(pool, a, &v));
    return v;
}

static int flag(CUmemoryPool pool, int a) {
    int v = -1;
    CHECK(cuMemPoolGetAttribute(pool, a, &v));
    return v;
}

/* The index of the first word of `p` that is not `want`, or -1. */
static long not_all(const uint32_t *p, uint32_t want) {
    for (long i = 0; i < WORDS; i++)
        if (p[i] != want) return i;
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuCtxCreate_v2(&ctx, 0, dev));
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
    CHECK(cuModuleGetFunction(&spin, mod, "spin_ns"));
    int supported = 0;
    CHECK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
    ASSERT(supported == 1, "memory pools supported: %d", supported);
    CUstream s1, s2;
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUdeviceptr counter;
    CHECK(cuMemAlloc_v2(&counter, 4096));

    /* The default pool is the current one, with CUDA's defaults. */
    CUmemoryPool def = NULL, cur = NULL;
    CHECK(cuDeviceGetDefaultMemPool(&def, dev));
    CHECK(cuDeviceGetMemPool(&cur, dev));
    ASSERT(def != NULL && def == cur, "default pool %p, current %p", (void *)def, (void *)cur);
    ASSERT(flag(def, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES) == 1, "follow events");
    ASSERT(flag(def, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) == 1, "opportunistic");
    ASSERT(flag(def, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) == 1, "internal deps");
    ASSERT(attr(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0, "release threshold");

    /* A loop in one stream: allocate, fill, copy out, free; each round's results checked. */
    enum { ROUNDS = 16 };
    uint32_t *out = NULL;
    CHECK(cuMemAllocHost_v2((void **)&out, ROUNDS * WORDS * 4));
    for (uint32_t r = 0; r < ROUNDS; r++) {
        CUdeviceptr p = 0;
        CHECK(cuMemAllocAsync(&p, WORDS * 4, s1));
        ASSERT(p != 0, "round %u: no pointer", r);
        launch_fill(p, 0x100 + r, s1);
        CHECK(cuMemcpyDtoHAsync_v2(out + (size_t)r * WORDS, p, WORDS * 4, s1));
        CHECK(cuMemFreeAsync(p, s1));
    }
    CHECK(cuStreamSynchronize(s1));
    for (uint32_t r = 0; r < ROUNDS; r++) {
        long at = not_all(out + (size_t)r * WORDS, 0x100 + r);
        ASSERT(at < 0, "one stream, round %u: word %ld is %#x", r, at, out[r * WORDS + at]);
    }
    if (mps_only()) {
        /* Above the release threshold (0), what the pool holds goes back at a context
         * synchronisation (CUDA's pools "try to"). */
        CHECK(cuCtxSynchronize());
        ASSERT(attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0,
               "the default pool holds %llu bytes after a context synchronisation",
               (unsigned long long)attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    }

    /* Across two streams: s1 spins, then writes its block and frees it; s2 allocates (maybe the
     * same block) and writes its own value. Neither may see the other's. */
    for (uint32_t r = 0; r < 4; r++) {
        CUdeviceptr a = 0, b = 0;
        CHECK(cuMemAllocAsync(&a, WORDS * 4, s1));
        launch_spin(2000000, counter, s1);
        launch_fill(a, 0xA000 + r, s1);
        CHECK(cuMemcpyDtoHAsync_v2(out, a, WORDS * 4, s1));
        CHECK(cuMemFreeAsync(a, s1));
        CHECK(cuMemAllocAsync(&b, WORDS * 4, s2));
        launch_fill(b, 0xB000 + r, s2);
        CHECK(cuMemcpyDtoHAsync_v2(out + WORDS, b, WORDS * 4, s2));
        CHECK(cuMemFreeAsync(b, s2));
        CHECK(cuStreamSynchronize(s1));
        CHECK(cuStreamSynchronize(s2));
        long at = not_all(out, 0xA000 + r);
        ASSERT(at < 0, "two streams, round %u: the first stream's word %ld is %#x", r, at,
               out[at]);
        at = not_all(out + WORDS, 0xB000 + r);
        ASSERT(at < 0, "two streams, round %u: the second stream's word %ld is %#x", r, at,
               out[WORDS + at]);
    }

    /* A pool of its own: allocations come from it and say so, and its figures are true. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    CUmemoryPool pool = NULL;
    CHECK(cuMemPoolCreate(&pool, &props));
    ASSERT(pool != NULL && pool != def, "a new pool %p", (void *)pool);
    ASSERT(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0, "a new pool uses memory");
    CUdeviceptr p = 0, q = 0;
    CHECK(cuMemAllocFromPoolAsync(&p, 4 * MIB, pool, s1));
    CHECK(cuMemAllocFromPoolAsync(&q, 2 * MIB, pool, s1));
    CUmemoryPool of = NULL;
    CHECK(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
    ASSERT(of == pool, "the pointer's pool is %p, not %p", (void *)of, (void *)pool);
    uint64_t used = attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    uint64_t reserved = attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    ASSERT(used >= 6 * MIB, "used %llu after 6 MiB", (unsigned long long)used);
    ASSERT(reserved >= used, "reserved %llu below used %llu", (unsigned long long)reserved,
           (unsigned long long)used);
    ASSERT(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= used, "used high-water mark");
    ASSERT(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) >= reserved, "reserved high-water mark");
    CHECK(cuMemFreeAsync(q, s1));
    CHECK(cuMemFreeAsync(p, s1));
    CHECK(cuStreamSynchronize(s1));
    ASSERT(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0, "used after every free");
    uint64_t zero = 0, big = 64 * MIB;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
    ASSERT(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 0, "a reset used high-water mark");
    EXPECT(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &big),
           CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero),
           CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &big));
    ASSERT(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == big, "release threshold kept");
    int off = 0;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off));
    ASSERT(flag(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) == 0, "opportunistic off");
    /* Trimmed to nothing once every free is done. */
    CHECK(cuMemPoolTrimTo(pool, 0));
    ASSERT(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0, "reserved after a trim: %llu",
           (unsigned long long)attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));

    /* Access: the pool's device reads and writes it (setting so is mps's answer: CUDA's docs
     * speak of access from other devices). */
    if (mps_only()) {
        CUmemAccessDesc desc = {{CU_MEM_LOCATION_TYPE_DEVICE, dev},
                                CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        CHECK(cuMemPoolSetAccess(pool, &desc, 1));
    }
    int access = -1;
    CUmemLocation here = {CU_MEM_LOCATION_TYPE_DEVICE, dev};
    CHECK(cuMemPoolGetAccess(&access, pool, &here));
    ASSERT(access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access %d", access);

    /* The device's current pool, set and set back. */
    CHECK(cuDeviceSetMemPool(dev, pool));
    CHECK(cuDeviceGetMemPool(&cur, dev));
    ASSERT(cur == pool, "current pool %p, not %p", (void *)cur, (void *)pool);
    CHECK(cuMemAllocAsync(&p, MIB, s1));
    CHECK(cuPointerGetAttribute(&of, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
    ASSERT(of == pool, "cuMemAllocAsync took from %p, not the current pool %p", (void *)of,
           (void *)pool);
    CHECK(cuMemFreeAsync(p, s1));
    CHECK(cuStreamSynchronize(s1));
    CHECK(cuDeviceSetMemPool(dev, def));
    /* cuMemFree takes stream-ordered allocations too, as CUDA documents. */
    CHECK(cuMemAllocFromPoolAsync(&p, MIB, pool, s1));
    CHECK(cuStreamSynchronize(s1));
    CHECK(cuMemFree_v2(p));
    if (mps_only())
        ASSERT(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0, "used after cuMemFree: %llu",
               (unsigned long long)attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    CHECK(cuMemPoolDestroy(pool));

    /* More than any device has is CUDA_ERROR_OUT_OF_MEMORY from the call. */
    EXPECT(cuMemAllocAsync(&p, 1ull << 44, s1), CUDA_ERROR_OUT_OF_MEMORY);

    const char *limit = getenv("EXPECT_LIMIT_MB");
    if (mps_only() && limit) {
        /* Under the client's limit: what fits, then what does not, then again once freed. */
        size_t mb = (size_t)atoi(limit);
        CUdeviceptr big1 = 0, big2 = 0;
        CHECK(cuMemAllocAsync(&big1, mb / 2 * MIB, s1));
        EXPECT(cuMemAllocAsync(&big2, mb / 2 * MIB + MIB, s1), CUDA_ERROR_OUT_OF_MEMORY);
        CHECK(cuMemFreeAsync(big1, s1));
        CHECK(cuStreamSynchronize(s1));
        CHECK(cuMemAllocAsync(&big2, mb / 2 * MIB + MIB, s1));
        CHECK(cuMemFreeAsync(big2, s1));
        CHECK(cuStreamSynchronize(s1));
    }
    if (mps_only()) {
        /* Inside a capture, refused, and the capture invalidated. */
        CUgraph g = NULL;
        CHECK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
        EXPECT(cuMemAllocAsync(&p, MIB, s1), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        EXPECT(cuStreamEndCapture(s1, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }

    CHECK(cuMemFreeHost(out));
    CHECK(cuMemFree_v2(counter));
    CHECK(cuStreamDestroy_v2(s1));
    CHECK(cuStreamDestroy_v2(s2));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy_v2(ctx));
    free(ptx);
    return finish("mem_pool");
}
