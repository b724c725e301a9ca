/* Copies whose direction comes from their addresses (unified addressing): cuMemcpy between
 * every pair of device memory, page-locked host memory (by its host address and by its device
 * address) and pageable host memory, checked byte for byte; cuMemcpyAsync ordered after a kernel
 * in its stream, and a kernel after it; 2D copies of pitched rows between device and host
 * memory, which leave the bytes between rows alone. What CUDA documents only; with MPS_ONLY=1
 * also mps's refusal of CUDA arrays. Usage: unified_copy <test_kernels.ptx> */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define N (1 << 20) /* bytes of each buffer */

/* Fills `p` with a pattern of `seed`. */
static void pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + seed * 13 + (i >> 9));
}

/* The first byte where `p` differs from the pattern of `seed`, or -1. */
static long differs(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 7 + seed * 13 + (i >> 9))) return (long)i;
    return -1;
}

enum { DEVICE, PINNED, PINNED_BY_DEVICE_ADDRESS, PAGEABLE, KINDS };
static const char *kind_name[KINDS] = {"device", "pinned", "pinned (device address)",
                                       "pageable"};

struct buffer {
    CUdeviceptr addr;    /* what cuMemcpy is given */
    unsigned char *host; /* readable here (host memory), else NULL */
    CUdeviceptr dev;     /* device memory, else 0 */
};

static struct buffer make(int kind) {
    struct buffer b = {0, NULL, 0};
    void *h = NULL;
    switch (kind) {
    case DEVICE:
        CHECK(cuMemAlloc_v2(&b.dev, N));
        b.addr = b.dev;
        break;
    case PINNED:
    case PINNED_BY_DEVICE_ADDRESS:
        CHECK(cuMemHostAlloc(&h, N, CU_MEMHOSTALLOC_DEVICEMAP));
        b.host = h;
        b.addr = (CUdeviceptr)(uintptr_t)h;
        if (kind == PINNED_BY_DEVICE_ADDRESS) CHECK(cuMemHostGetDevicePointer_v2(&b.addr, h, 0));
        break;
    default:
        b.host = malloc(N);
        b.addr = (CUdeviceptr)(uintptr_t)b.host;
    }
    return b;
}

static void drop(struct buffer b, int kind) {
    if (kind == DEVICE) CHECK(cuMemFree_v2(b.dev));
    else if (kind == PAGEABLE) free(b.host);
    else CHECK(cuMemFreeHost(b.host));
}

/* Sets `b` to the pattern of `seed` (through a pageable copy for device memory). */
static void set(struct buffer b, unsigned seed) {
    unsigned char *tmp = malloc(N);
    pattern(b.host ? b.host : tmp, N, seed);
    if (!b.host) CHECK(cuMemcpyHtoD_v2(b.dev, tmp, N));
    free(tmp);
}

/* The first byte of `b` that is not the pattern of `seed`, or -1. */
static long check(struct buffer b, unsigned seed) {
    unsigned char *tmp = malloc(N);
    if (!b.host) CHECK(cuMemcpyDtoH_v2(tmp, b.dev, N));
    long at = differs(b.host ? b.host : tmp, N, seed);
    free(tmp);
    return at;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CUmodule mod;
    CUfunction fill, spin;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
    CHECK(cuModuleGetFunction(&spin, mod, "spin_ns"));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* Every pair, synchronous and asynchronous (a page-locked buffer to itself excepted). */
    unsigned seed = 1;
    for (int async = 0; async < 2; async++) {
        for (int dk = 0; dk < KINDS; dk++) {
            for (int sk = 0; sk < KINDS; sk++) {
                struct buffer dst = make(dk), src = make(sk);
                set(src, seed);
                set(dst, seed + 100);
                if (async) {
                    CHECK(cuMemcpyAsync(dst.addr, src.addr, N, s));
                    CHECK(cuStreamSynchronize(s));
                } else {
                    CHECK(cuMemcpy(dst.addr, src.addr, N));
                }
                long at = check(dst, seed);
                ASSERT(at < 0, "%s %s to %s: byte %ld differs", async ? "cuMemcpyAsync" : "cuMemcpy",
                       kind_name[sk], kind_name[dk], at);
                at = check(src, seed);
                ASSERT(at < 0, "%s to %s changed the source at byte %ld", kind_name[sk],
                       kind_name[dk], at);
                drop(dst, dk);
                drop(src, sk);
                seed++;
            }
        }
    }

    /* Part of a buffer, at an offset into it, into the middle of another. */
    {
        struct buffer d = make(DEVICE), h = make(PAGEABLE);
        set(d, 7);
        memset(h.host, 0xAB, N);
        CHECK(cuMemcpy(h.addr + 1000, d.addr + 4096, 5000));
        unsigned char *want = malloc(N);
        pattern(want, N, 7);
        ASSERT(memcmp(h.host + 1000, want + 4096, 5000) == 0, "an offset copy differs");
        ASSERT(h.host[999] == 0xAB && h.host[6000] == 0xAB, "an offset copy spilled over");
        free(want);
        drop(d, DEVICE);
        drop(h, PAGEABLE);
    }

    /* cuMemcpyAsync follows a kernel in its stream, and the next kernel follows it. */
    {
        const uint64_t words = N / 4;
        CUdeviceptr a, b;
        CHECK(cuMemAlloc_v2(&a, N));
        CHECK(cuMemAlloc_v2(&b, N));
        uint32_t *pinned = NULL, *pageable = malloc(N);
        CHECK(cuMemAllocHost_v2((void **)&pinned, N));
        for (uint32_t round = 1; round <= 4; round++) {
            uint64_t ns = 2000000;
            void *spin_params[] = {&ns, &a};
            /* spin_ns counts in its second argument; fill overwrites it afterwards. */
            CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, spin_params, NULL));
            uint32_t value = 0x1000 + round;
            void *fill_params[] = {&a, &value, (void *)&words};
            CHECK(cuLaunchKernel(fill, 64, 1, 1, 256, 1, 1, 0, s, fill_params, NULL));
            CHECK(cuMemcpyAsync(b, a, N, s));
            CHECK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)pinned, b, N, s));
            uint32_t after = 0xdead;
            void *after_params[] = {&b, &after, (void *)&words};
            CHECK(cuLaunchKernel(fill, 64, 1, 1, 256, 1, 1, 0, s, after_params, NULL));
            CHECK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)pageable, b, N, s));
            CHECK(cuStreamSynchronize(s));
            int bad = 0;
            for (uint64_t i = 0; i < words && !bad; i++) {
                if (pinned[i] != value || pageable[i] != after) {
                    ASSERT(0, "round %u: word %llu is %#x and %#x, want %#x and %#x", round,
                           (unsigned long long)i, pinned[i], pageable[i], value, after);
                    bad = 1;
                }
            }
        }
        CHECK(cuMemFreeHost(pinned));
        free(pageable);
        CHECK(cuMemFree_v2(a));
        CHECK(cuMemFree_v2(b));
    }

    /* 2D: 10 rows of 40 bytes, from pageable rows 48 apart to device rows 64 apart (from byte
     * 8), back to page-locked rows 64 apart, both ways, the gaps checked. */
    {
        enum { W = 40, H = 10, SP = 48, DP = 64 };
        unsigned char src[SP * H], back[DP * H];
        pattern(src, sizeof src, 3);
        CUdeviceptr d;
        CHECK(cuMemAlloc_v2(&d, DP * H));
        CHECK(cuMemsetD8_v2(d, 0xEE, DP * H));
        CUDA_MEMCPY2D c;
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = src;
        c.srcPitch = SP;
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = d;
        c.dstXInBytes = 8;
        c.dstPitch = DP;
        c.WidthInBytes = W;
        c.Height = H;
        CHECK(cuMemcpy2D_v2(&c));
        CHECK(cuMemcpyDtoH_v2(back, d, DP * H));
        for (int r = 0; r < H; r++) {
            ASSERT(memcmp(back + r * DP + 8, src + r * SP, W) == 0, "2D row %d differs", r);
            for (int x = 0; x < DP; x++)
                if (x < 8 || x >= 8 + W) {
                    ASSERT(back[r * DP + x] == 0xEE, "2D row %d: byte %d between rows written",
                           r, x);
                    if (back[r * DP + x] != 0xEE) break;
                }
        }
        /* Back, asynchronously, with unified addresses, into page-locked memory. */
        unsigned char *pinned = NULL;
        CHECK(cuMemAllocHost_v2((void **)&pinned, SP * H));
        memset(pinned, 0x11, SP * H);
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.srcDevice = d;
        c.srcXInBytes = 8;
        c.srcPitch = DP;
        c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.dstDevice = (CUdeviceptr)(uintptr_t)pinned;
        c.dstPitch = SP;
        c.WidthInBytes = W;
        c.Height = H;
        CHECK(cuMemcpy2DAsync_v2(&c, s));
        CHECK(cuStreamSynchronize(s));
        for (int r = 0; r < H; r++) {
            ASSERT(memcmp(pinned + r * SP, src + r * SP, W) == 0, "2D async row %d differs", r);
            ASSERT(pinned[r * SP + W] == 0x11, "2D async row %d spilled over", r);
        }
        /* Unaligned, device to device, contiguous rows (one copy). */
        CUdeviceptr e;
        CHECK(cuMemAlloc_v2(&e, DP * H));
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        c.srcDevice = d;
        c.srcPitch = DP;
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        c.dstDevice = e;
        c.dstPitch = DP;
        c.WidthInBytes = DP;
        c.Height = H;
        CHECK(cuMemcpy2DUnaligned_v2(&c));
        unsigned char again[DP * H];
        CHECK(cuMemcpyDtoH_v2(again, e, DP * H));
        ASSERT(memcmp(again, back, DP * H) == 0, "2D device to device differs");
        /* A pitch narrower than the row is CUDA_ERROR_INVALID_VALUE. */
        c.dstPitch = DP - 1;
        EXPECT(cuMemcpy2D_v2(&c), CUDA_ERROR_INVALID_VALUE);
        if (mps_only()) {
            /* CUDA arrays do not exist through mps. */
            c.dstPitch = DP;
            c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
            c.dstArray = (CUarray)(uintptr_t)0x1000;
            EXPECT(cuMemcpy2D_v2(&c), CUDA_ERROR_NOT_SUPPORTED);
        }
        CHECK(cuMemFreeHost(pinned));
        CHECK(cuMemFree_v2(d));
        CHECK(cuMemFree_v2(e));
    }

    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuModuleUnload(mod));
    CHECK(cuCtxDestroy_v2(ctx));
    free(ptx);
    return finish("unified_copy");
}
