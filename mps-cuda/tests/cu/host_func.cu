// cudaLaunchHostFunc and cudaStreamAddCallback: each runs after the work queued before it
// (it sees a kernel's result copied to pinned memory), work queued after it waits for it (a copy
// reads what it wrote), they run in order, and cudaStreamSynchronize waits for them.
#include <atomic>

#include "check.h"

static const uint64_t n = 1 << 16;
static uint32_t *seen, *next, *back;
static std::atomic<int> calls{0}, first_ok{0}, second_ok{0};

static void first(void *) {
    bool ok = true;
    for (uint64_t i = 0; i < n; i++) ok = ok && seen[i] == 5u;
    first_ok = ok && calls.fetch_add(1) == 0;
    for (uint64_t i = 0; i < n; i++) next[i] = 6u;
}

static void CUDART_CB second(cudaStream_t, cudaError_t status, void *) {
    bool ok = status == cudaSuccess;
    for (uint64_t i = 0; i < n; i++) ok = ok && back[i] == 6u;
    second_ok = ok && calls.fetch_add(1) == 1;
}

int main() {
    CHECK(cudaMallocHost(&seen, n * 4));
    CHECK(cudaMallocHost(&next, n * 4));
    CHECK(cudaMallocHost(&back, n * 4));
    uint32_t *d;
    CHECK(cudaMalloc(&d, n * 4));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    fill_u32<<<64, 256, 0, s>>>(d, 5u, n);
    CHECK(cudaMemcpyAsync(seen, d, n * 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaLaunchHostFunc(s, first, nullptr));
    CHECK(cudaMemcpyAsync(d, next, n * 4, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(back, d, n * 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamAddCallback(s, second, nullptr, 0));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(calls == 2);
    EXPECT(first_ok);
    EXPECT(second_ok);
    printf("host functions: %d, in order\n", calls.load());
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(seen));
    CHECK(cudaFreeHost(next));
    CHECK(cudaFreeHost(back));
    printf("host_func: done\n");
    return 0;
}
