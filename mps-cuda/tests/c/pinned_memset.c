/* Page-locked host memory (cuMemAllocHost, cuMemHostAlloc) with asynchronous copies in a
 * stream, memsets of bytes and words, synchronous and asynchronous, and mapped page-locked
 * memory that a kernel and a copy reach through its device address.
 * Usage: pinned_memset <test_kernels.ptx> */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define N (1 << 18)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CUmodule mod;
    CUfunction add, fill;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&add, mod, "add_f32"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));

    float *ha = NULL, *hc = NULL;
    CHECK(cuMemAllocHost_v2((void **)&ha, N * sizeof(float)));
    CHECK(cuMemHostAlloc((void **)&hc, N * sizeof(float), CU_MEMHOSTALLOC_PORTABLE));
    ASSERT(ha != NULL && hc != NULL, "no host memory");
    /* A refused allocation leaves NULL behind, as NVIDIA's driver does. */
    void *refused = ha;
    EXPECT(cuMemHostAlloc(&refused, 16, 0x80), CUDA_ERROR_INVALID_VALUE);
    ASSERT(refused == NULL, "a refused allocation left %p", refused);
    for (int i = 0; i < N; i++) ha[i] = (float)i;

    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr da, dc;
    CHECK(cuMemAlloc_v2(&da, N * sizeof(float)));
    CHECK(cuMemAlloc_v2(&dc, N * sizeof(float)));
    uint64_t n = N;
    void *params[] = {&da, &da, &dc, &n};
    CHECK(cuMemcpyHtoDAsync_v2(da, ha, N * sizeof(float), s));
    CHECK(cuLaunchKernel(add, 128, 1, 1, 256, 1, 1, 0, s, params, NULL));
    CHECK(cuMemcpyDtoHAsync_v2(hc, dc, N * sizeof(float), s));
    CHECK(cuStreamSynchronize(s));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += hc[i] != 2.0f * (float)i;
    ASSERT(wrong == 0, "%d of %d doubled values wrong after async copies", wrong, N);

    /* Mapped page-locked memory: a kernel and a copy write it through its device address. */
    uint32_t *hm = NULL;
    CHECK(cuMemHostAlloc((void **)&hm, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    ASSERT(hm != NULL, "no mapped host memory");
    CUdeviceptr dm = 0, dm_at = 0;
    CHECK(cuMemHostGetDevicePointer_v2(&dm, hm, 0));
    CHECK(cuMemHostGetDevicePointer_v2(&dm_at, hm + 16, 0));
    ASSERT(dm != 0 && dm_at == dm + 64, "device addresses %#llx, %#llx", dm, dm_at);
    /* Under unified addressing the device address of such memory is its host address. */
    ASSERT(dm == (CUdeviceptr)(uintptr_t)hm, "device address %#llx of host memory at %p", dm,
           (void *)hm);
    EXPECT(cuMemHostGetDevicePointer_v2(&dm_at, hm, 1), CUDA_ERROR_INVALID_VALUE);
    uint32_t pageable_word = 0;
    EXPECT(cuMemHostGetDevicePointer_v2(&dm_at, &pageable_word, 0), CUDA_ERROR_INVALID_VALUE);
    memset(hm, 0, 4096);
    uint32_t mark = 0xabcdef01u;
    uint64_t count = 64;
    void *fill_params[] = {&dm, &mark, &count};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, s, fill_params, NULL));
    CHECK(cuMemcpyDtoDAsync_v2(dm + 256, da, 256, s));
    CHECK(cuStreamSynchronize(s));
    ASSERT(hm[0] == mark && hm[63] == mark && hm[64 + 63] != mark, "the kernel wrote %#x %#x",
           hm[0], hm[63]);
    float f;
    memcpy(&f, &hm[64 + 63], 4);
    ASSERT(f == 63.0f, "the copy to mapped memory wrote %f", (double)f);
    CHECK(cuMemFreeHost(hm));

    /* Synchronous copies with page-locked memory return when they are done. */
    memset(hc, 0, N * sizeof(float));
    CHECK(cuMemcpyDtoH_v2(hc, dc, N * sizeof(float)));
    ASSERT(hc[N - 1] == 2.0f * (float)(N - 1), "synchronous copy to pinned memory: %f", hc[N - 1]);

    /* Memsets: bytes, then words over part of them, asynchronously in a stream. */
    unsigned char bytes[64];
    CHECK(cuMemsetD8_v2(dc, 0x5a, 64));
    CHECK(cuMemcpyDtoH_v2(bytes, dc, 64));
    ASSERT(bytes[0] == 0x5a && bytes[63] == 0x5a, "cuMemsetD8 wrote %#x", bytes[0]);
    CHECK(cuMemsetD32Async(dc, 0x01020304u, 8, s));
    CHECK(cuMemsetD8Async(dc + 32, 0x77, 4, s));
    CHECK(cuMemcpyDtoHAsync_v2(hc, dc, 64, s));
    CHECK(cuStreamSynchronize(s));
    uint32_t words[16];
    memcpy(words, hc, 64);
    ASSERT(words[0] == 0x01020304u && words[7] == 0x01020304u, "cuMemsetD32Async: %#x",
           words[7]);
    ASSERT(words[8] == 0x77777777u, "cuMemsetD8Async: %#x", words[8]);
    ASSERT(words[9] == 0x5a5a5a5au, "memset past its end: %#x", words[9]);
    EXPECT(cuMemsetD32_v2(dc + 2, 0, 4), CUDA_ERROR_INVALID_VALUE); /* misaligned */
    CHECK(cuMemsetD8_v2(dc, 0, 0));                                 /* nothing to do */

    /* Under unified addressing a page-locked host pointer is also its device address, as XLA
     * uses its pinned buffers: the destination of memsets and copies, and the source of copies
     * to the host and to the device. */
    uint32_t *hx = NULL;
    CHECK(cuMemHostAlloc((void **)&hx, 4096, CU_MEMHOSTALLOC_PORTABLE));
    ASSERT(hx != NULL, "no host memory for unified addressing");
    CUdeviceptr ux = (CUdeviceptr)(uintptr_t)hx;
    memset(hx, 0, 4096);
    uint32_t src_words[64], back[64];
    for (int i = 0; i < 64; i++) src_words[i] = 0x1000u + (uint32_t)i;
    CHECK(cuMemsetD32Async(ux, 0x11223344u, 64, s));                 /* words 0..63 */
    CHECK(cuMemsetD8Async(ux + 256, 0x99, 256, s));                    /* words 64..127 */
    CHECK(cuMemcpyHtoDAsync_v2(ux + 512, src_words, sizeof src_words, s)); /* 128..191 */
    CHECK(cuMemcpyDtoDAsync_v2(ux + 1024, da, 256, s));                /* 256..319: 0..63.0f */
    CHECK(cuMemcpyDtoDAsync_v2(dc, ux + 512, 256, s));
    CHECK(cuMemcpyDtoHAsync_v2(back, ux, 64, s));
    CHECK(cuStreamSynchronize(s));
    ASSERT(hx[0] == 0x11223344u && hx[63] == 0x11223344u, "memset through the host pointer: %#x",
           hx[63]);
    ASSERT(hx[64] == 0x99999999u && hx[127] == 0x99999999u && hx[128] == 0x1000u,
           "byte memset through the host pointer: %#x %#x", hx[64], hx[128]);
    ASSERT(hx[191] == 0x103fu, "copy to the host pointer as a device address: %#x", hx[191]);
    memcpy(&f, &hx[256 + 63], 4);
    ASSERT(f == 63.0f, "device copy to the host pointer: %f", (double)f);
    ASSERT(back[0] == 0x11223344u && back[15] == 0x11223344u, "copy from the host pointer: %#x",
           back[15]);
    memset(back, 0, sizeof back);
    CHECK(cuMemcpyDtoH_v2(back, dc, sizeof back));
    ASSERT(back[0] == 0x1000u && back[63] == 0x103fu, "device copy from the host pointer: %#x",
           back[63]);
    CHECK(cuMemsetD8_v2(ux + 4095, 0x42, 1));
    ASSERT(((unsigned char *)hx)[4095] == 0x42, "synchronous memset of the host pointer");
    /* A kernel given the host pointer itself writes the buffer (as XLA's delay kernel reads
     * its semaphore): the bytes the program sees are the bytes the kernel wrote. */
    memset(hx, 0, 4096);
    void *fill_host[] = {&ux, &mark, &count};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 64, 1, 1, 0, s, fill_host, NULL));
    CHECK(cuStreamSynchronize(s));
    ASSERT(hx[0] == mark && hx[63] == mark && hx[64] == 0,
           "a kernel given the host pointer wrote %#x %#x %#x", hx[0], hx[63], hx[64]);
    CHECK(cuMemFreeHost(hx));

    if (mps_only()) {
        /* A memset the server refuses fails the next call, but a free is made all the same, and
         * the failure is left for the call after it: a program told that its free failed
         * would keep, and so leak, the buffer. */
        /* The refusal comes back as the server takes the memset: let it arrive before the
         * free (without it the free could only be earlier, and pass without saying anything). */
        struct timespec arrive = {0, 50 * 1000 * 1000};
        CHECK(cuMemHostAlloc((void **)&hx, 4096, 0));
        CHECK(cuMemsetD32Async(0x10, 0, 4, s));
        nanosleep(&arrive, NULL);
        CHECK(cuMemFreeHost(hx));
        EXPECT(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
        EXPECT(cuMemFreeHost(hx), CUDA_ERROR_INVALID_VALUE); /* it was freed */
        CUdeviceptr gone = 0;
        CHECK(cuMemAlloc_v2(&gone, 4096));
        CHECK(cuMemsetD32Async(0x10, 0, 4, s));
        nanosleep(&arrive, NULL);
        CHECK(cuMemFree_v2(gone));
        EXPECT(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    }

    CHECK(cuMemFreeHost(ha));
    CHECK(cuMemFreeHost(hc));
    /* Freed twice: undefined in CUDA, refused by mps. */
    if (mps_only()) EXPECT(cuMemFreeHost(ha), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("pinned_memset");
}
