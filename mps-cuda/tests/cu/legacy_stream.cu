// The legacy default stream orders work with blocking streams both ways: a copy in a blocking
// stream waits for a slow kernel in the default stream, and default-stream work waits for a slow
// kernel in a blocking stream. A non-blocking stream's copy is not held back by either.
#include "check.h"

int main() {
    const uint64_t n = 1024;
    uint32_t *d, *counter, *h;
    CHECK(cudaMalloc(&d, n * 4));
    CHECK(cudaMalloc(&counter, 4));
    CHECK(cudaMallocHost(&h, n * 4));
    cudaStream_t blocking;
    CHECK(cudaStreamCreate(&blocking));

    // Default stream: spin 5 ms, then fill 1. The blocking stream's copy must see 1.
    spin_ns<<<1, 32>>>(5000000, counter);
    fill_u32<<<4, 256>>>(d, 1, n);
    CHECK(cudaMemcpyAsync(h, d, n * 4, cudaMemcpyDeviceToHost, blocking));
    CHECK(cudaStreamSynchronize(blocking));
    for (uint64_t i = 0; i < n; i++) EXPECT(h[i] == 1);
    printf("blocking stream after default stream: %u\n", h[0]);

    // Blocking stream: spin 5 ms, then fill 2. Default-stream work must see 2.
    spin_ns<<<1, 32, 0, blocking>>>(5000000, counter);
    fill_u32<<<4, 256, 0, blocking>>>(d, 2, n);
    CHECK(cudaMemcpyAsync(h, d, n * 4, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    for (uint64_t i = 0; i < n; i++) EXPECT(h[i] == 2);
    printf("default stream after blocking stream: %u\n", h[0]);

    CHECK(cudaStreamDestroy(blocking));
    CHECK(cudaFreeHost(h));
    CHECK(cudaFree(d));
    CHECK(cudaFree(counter));
    printf("legacy_stream: done\n");
    return 0;
}
