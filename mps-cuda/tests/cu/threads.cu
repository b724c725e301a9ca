// Two threads, each with a stream of its own, filling and reading back their own buffers.
#include <thread>
#include "check.h"

static void work(uint32_t value, bool *ok) {
    const uint64_t n = 3000;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    uint32_t *d, *h;
    CHECK(cudaMalloc(&d, n * 4));
    CHECK(cudaMallocHost(&h, n * 4));
    for (int round = 0; round < 20; round++) {
        fill_u32<<<4, 128, 0, s>>>(d, value + round, n);
        CHECK(cudaMemcpyAsync(h, d, n * 4, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (uint64_t i = 0; i < n; i++) {
            if (h[i] != value + round) return;
        }
    }
    CHECK(cudaFreeHost(h));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    *ok = true;
}

int main() {
    bool a = false, b = false;
    std::thread t1(work, 1000u, &a), t2(work, 2000u, &b);
    t1.join();
    t2.join();
    printf("thread 1 %s, thread 2 %s\n", a ? "ok" : "wrong", b ? "ok" : "wrong");
    EXPECT(a && b);
    printf("threads: done\n");
    return 0;
}
