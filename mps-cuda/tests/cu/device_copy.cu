// Device-to-device copies, synchronous and in a stream.
#include "check.h"

int main() {
    const uint64_t n = 5000;
    uint32_t *a, *b, *c, *h = (uint32_t *)malloc(n * 4);
    CHECK(cudaMalloc(&a, n * 4));
    CHECK(cudaMalloc(&b, n * 4));
    CHECK(cudaMalloc(&c, n * 4));
    fill_u32<<<8, 128>>>(a, 0x5eed, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(b, a, n * 4, cudaMemcpyDeviceToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyAsync(c, b + 1000, 2000 * 4, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemcpy(h, c, 2000 * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 2000; i++) EXPECT(h[i] == 0x5eed);
    printf("copied %x twice\n", h[1999]);
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    printf("device_copy: done\n");
    return 0;
}
