// Launch rate of one thread on one non-blocking stream: kernelParams against a packed `extra`
// buffer, and with a stream priority, each alternated over rounds.
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>

__global__ void spin(unsigned long long ns, unsigned long long *counter) {
    if (ns == 1) atomicAdd(counter, 1ull);
}

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("%s failed %d\n", #x, r_); exit(1); } } while (0)

int main(int argc, char **argv) {
    int n = 200000;
    cudaFree(0);
    CUfunction f;
    cudaGetFuncBySymbol((cudaFunction_t *)&f, (const void *)spin);
    unsigned long long *counter;
    cudaMalloc(&counter, 8);
    CUstream plain, prio;
    CK(cuStreamCreate(&plain, CU_STREAM_NON_BLOCKING));
    int lo, hi;
    cuCtxGetStreamPriorityRange(&lo, &hi);
    CK(cuStreamCreateWithPriority(&prio, CU_STREAM_NON_BLOCKING, hi));
    unsigned long long ns = 0;
    void *params[] = {&ns, &counter};
    struct { unsigned long long ns; unsigned long long *c; } packed = {0, counter};
    size_t size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    const char *names[] = {"kernelParams", "extra", "kernelParams+priority", "extra+priority"};
    double best[4] = {0}, sum[4] = {0};
    for (int round = 0; round < 5; round++) {
        for (int m = 0; m < 4; m++) {
            CUstream s = m >= 2 ? prio : plain;
            bool ex = m % 2 == 1;
            for (int i = 0; i < 1000; i++) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, ex ? nullptr : params, ex ? extra : nullptr));
            CK(cuStreamSynchronize(s));
            auto t = std::chrono::steady_clock::now();
            for (int i = 0; i < n; i++) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, ex ? nullptr : params, ex ? extra : nullptr));
            double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
            CK(cuStreamSynchronize(s));
            double rate = n / dt;
            sum[m] += rate;
            if (rate > best[m]) best[m] = rate;
        }
    }
    const char *conn = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    for (int m = 0; m < 4; m++)
        printf("connections=%s %-22s mean %.1fk/s best %.1fk/s\n", conn ? conn : "default", names[m], sum[m] / 5 / 1e3, best[m] / 1e3);
    return 0;
}
