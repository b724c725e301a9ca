// Stream-ordered allocation and copies whose direction comes from their addresses, as the
// runtime makes them: cudaMallocAsync and cudaFreeAsync in a loop with a kernel between, the
// default pool's figure once the frees are done, cudaMemcpy and cudaMemcpyAsync with
// cudaMemcpyDefault, and cudaMemcpy2D of pitched rows.
#include <cstring>

#include "check.h"

int main() {
    const uint64_t n = 1 << 18;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t *h = (uint32_t *)malloc(n * 4), *pinned;
    CHECK(cudaMallocHost(&pinned, n * 4));
    int rounds_ok = 0;
    for (uint32_t r = 0; r < 8; r++) {
        uint32_t *d;
        CHECK(cudaMallocAsync(&d, n * 4, s));
        fill_u32<<<64, 256, 0, s>>>(d, 0x100 + r, n);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(pinned, d, n * 4, cudaMemcpyDefault, s));
        CHECK(cudaFreeAsync(d, s));
        CHECK(cudaStreamSynchronize(s));
        int ok = 1;
        for (uint64_t i = 0; i < n; i++) ok &= pinned[i] == 0x100 + r;
        rounds_ok += ok;
    }
    printf("async allocation rounds right: %d of 8\n", rounds_ok);
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t used = 1;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    printf("default pool in use after the frees: %llu\n", (unsigned long long)used);

    // cudaMemcpyDefault from pageable memory to the device and back into page-locked memory.
    uint32_t *d;
    CHECK(cudaMalloc(&d, n * 4));
    for (uint64_t i = 0; i < n; i++) h[i] = (uint32_t)(i * 2654435761u);
    CHECK(cudaMemcpy(d, h, n * 4, cudaMemcpyDefault));
    memset(pinned, 0, n * 4);
    CHECK(cudaMemcpy(pinned, d, n * 4, cudaMemcpyDefault));
    printf("cudaMemcpyDefault round trip: %s\n",
           memcmp(pinned, h, n * 4) == 0 ? "same" : "differs");

    // 16 rows of 100 bytes, from host rows 128 apart to device rows 256 apart, and back.
    static unsigned char src[128 * 16], back[128 * 16];
    for (int i = 0; i < 128 * 16; i++) src[i] = (unsigned char)(i * 7);
    unsigned char *d2;
    CHECK(cudaMalloc(&d2, 256 * 16));
    CHECK(cudaMemset(d2, 0xee, 256 * 16));
    CHECK(cudaMemcpy2D(d2, 256, src, 128, 100, 16, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy2D(back, 128, d2, 256, 100, 16, cudaMemcpyDeviceToHost));
    int rows = 0;
    for (int r = 0; r < 16; r++) rows += memcmp(back + r * 128, src + r * 128, 100) == 0;
    unsigned char gap = 0;
    CHECK(cudaMemcpy(&gap, d2 + 100, 1, cudaMemcpyDefault));
    printf("2D rows right: %d of 16, gap byte %x\n", rows, gap);

    CHECK(cudaFree(d2));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(pinned));
    free(h);
    CHECK(cudaStreamDestroy(s));
    printf("async_alloc: done\n");
    return 0;
}
