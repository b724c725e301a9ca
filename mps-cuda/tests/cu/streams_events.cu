// Streams, events and cudaStreamWaitEvent: work in one stream waits for an event of another;
// the event's elapsed time covers a kernel that spins for 2 ms.
#include "check.h"

int main() {
    const uint64_t n = 4096;
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t start, done;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&done));
    uint32_t *p, *counter;
    CHECK(cudaMalloc(&p, n * 4));
    CHECK(cudaMalloc(&counter, 4));
    CHECK(cudaMemset(counter, 0, 4));
    CHECK(cudaDeviceSynchronize());

    // s1: spin, then fill with 7; s2 waits for that, then fills the first half with 9.
    CHECK(cudaEventRecord(start, s1));
    spin_ns<<<1, 32, 0, s1>>>(2000000, counter);
    fill_u32<<<16, 256, 0, s1>>>(p, 7, n);
    CHECK(cudaEventRecord(done, s1));
    CHECK(cudaStreamWaitEvent(s2, done, 0));
    fill_u32<<<16, 256, 0, s2>>>(p, 9, n / 2);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s2));
    EXPECT(cudaEventQuery(done) == cudaSuccess);

    uint32_t *h = (uint32_t *)malloc(n * 4), c = 0;
    CHECK(cudaMemcpy(h, p, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&c, counter, 4, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < n; i++) EXPECT(h[i] == (i < n / 2 ? 9u : 7u));
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, start, done));
    printf("first half %u, second half %u, spins %u\n", h[0], h[n - 1], c);
    printf("elapsed at least the 2 ms spin: %s\n", ms >= 2.0f ? "yes" : "no");

    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFree(p));
    CHECK(cudaFree(counter));
    printf("streams_events: done\n");
    return 0;
}
