// cudaMemset and cudaMemsetAsync: whole buffers, an unaligned middle part, then read back.
#include "check.h"

int main() {
    const size_t n = 10000;
    unsigned char *d, *h = (unsigned char *)malloc(n);
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMemset(d, 0xab, n));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemsetAsync(d + 3, 0x11, 1001, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) EXPECT(h[i] == (i >= 3 && i < 1004 ? 0x11 : 0xab));
    printf("bytes: %02x %02x %02x %02x\n", h[0], h[3], h[1003], h[1004]);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    printf("memset: done\n");
    return 0;
}
