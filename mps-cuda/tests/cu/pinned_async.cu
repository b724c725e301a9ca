// cudaMallocHost memory with asynchronous copies both ways around a kernel, in a stream.
#include "check.h"

int main() {
    const uint64_t n = 1 << 14;
    float *x, *y;
    CHECK(cudaMallocHost(&x, n * 4));
    CHECK(cudaMallocHost(&y, n * 4));
    for (uint64_t i = 0; i < n; i++) {
        x[i] = (float)i;
        y[i] = 1.0f;
    }
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    float *dx, *dy;
    CHECK(cudaMalloc(&dx, n * 4));
    CHECK(cudaMalloc(&dy, n * 4));
    CHECK(cudaMemcpyAsync(dx, x, n * 4, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(dy, y, n * 4, cudaMemcpyHostToDevice, s));
    saxpy_f32<<<32, 256, 0, s>>>(2.0f, dx, dy, n);
    CHECK(cudaMemcpyAsync(y, dy, n * 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (uint64_t i = 0; i < n; i++) EXPECT(y[i] == 2.0f * i + 1.0f);
    printf("y[100] = %.1f, y[%llu] = %.1f\n", y[100], (unsigned long long)n - 1, y[n - 1]);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFreeHost(x));
    CHECK(cudaFreeHost(y));
    printf("pinned_async: done\n");
    return 0;
}
