// Several devices through the runtime: cudaGetDeviceCount, cudaSetDevice, cudaGetDeviceProperties
// of each device, a kernel on each whose result is that device's own, a return to each device
// to find its results there, and cudaMemcpyPeer between the first two.
#include "check.h"

#define MAX_DEVICES 8

int main() {
    const uint64_t n = 1 << 16;
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count >= 1 && count <= MAX_DEVICES);
    printf("devices %d\n", count);
    float *host = (float *)malloc(n * 4);
    for (uint64_t i = 0; i < n; i++) host[i] = (float)i;
    float *x[MAX_DEVICES], *y[MAX_DEVICES];
    for (int d = 0; d < count; d++) {
        CHECK(cudaSetDevice(d));
        int cur = -1;
        CHECK(cudaGetDevice(&cur));
        EXPECT(cur == d);
        cudaDeviceProp p;
        CHECK(cudaGetDeviceProperties(&p, d));
        printf("device %d: %s, cc %d.%d\n", d, p.name, p.major, p.minor);
        // y = (d + 1) * x: each device's result is its own.
        CHECK(cudaMalloc(&x[d], n * 4));
        CHECK(cudaMalloc(&y[d], n * 4));
        CHECK(cudaMemcpy(x[d], host, n * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemset(y[d], 0, n * 4));
        saxpy_f32<<<64, 256>>>((float)(d + 1), x[d], y[d], n);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    float *back = (float *)malloc(n * 4);
    for (int d = count - 1; d >= 0; d--) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaMemcpy(back, y[d], n * 4, cudaMemcpyDeviceToHost));
        for (uint64_t i = 0; i < n; i++) EXPECT(back[i] == (float)(d + 1) * (float)i);
        printf("device %d: y[1000] = %.1f\n", d, back[1000]);
    }
    if (count >= 2) {
        // Device 1's y (2i) into device 0's x.
        CHECK(cudaMemcpyPeer(x[0], 0, y[1], 1, n * 4));
        CHECK(cudaSetDevice(0));
        CHECK(cudaMemcpy(back, x[0], n * 4, cudaMemcpyDeviceToHost));
        for (uint64_t i = 0; i < n; i++) EXPECT(back[i] == 2.0f * (float)i);
        printf("peer copy: x[1000] = %.1f\n", back[1000]);
    }
    for (int d = 0; d < count; d++) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaFree(x[d]));
        CHECK(cudaFree(y[d]));
    }
    printf("multi_device: done\n");
    return 0;
}
