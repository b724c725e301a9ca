/* Threads: the current context is per thread; two threads share one context, each with a
 * stream of its own, and a third uses its per-thread default stream, all at once.
 * Usage: threads <test_kernels.ptx> */
#include <pthread.h>

#include "cuda_api.h"

#define N (1 << 16)
#define ROUNDS 20

static CUcontext ctx;
static CUfunction saxpy;

struct job {
    int per_thread_stream;
    float result;
    int thread_failures;
};

static void *work(void *arg) {
    struct job *job = arg;
    CUcontext cur = (CUcontext)1;
    CHECK(cuCtxGetCurrent(&cur));
    ASSERT(cur == NULL, "a new thread has a current context");
    CHECK(cuCtxSetCurrent(ctx));
    CUstream s = CU_STREAM_PER_THREAD;
    if (!job->per_thread_stream) CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    static __thread float host[N];
    for (int i = 0; i < N; i++) host[i] = 1.0f;
    CUdeviceptr x, y;
    CHECK(cuMemAlloc_v2(&x, sizeof host));
    CHECK(cuMemAlloc_v2(&y, sizeof host));
    CHECK(cuMemcpyHtoDAsync_v2(x, host, sizeof host, s));
    CHECK(cuMemsetD32Async(y, 0, N, s));
    float alpha = 1.0f;
    uint64_t n = N;
    void *params[] = {&alpha, &x, &y, &n};
    for (int r = 0; r < ROUNDS; r++) {
        CHECK(cuLaunchKernel(saxpy, 64, 1, 1, 128, 1, 1, 0, s, params, NULL));
    }
    CHECK(cuMemcpyDtoHAsync_v2(host, y, sizeof host, s));
    CHECK(cuStreamSynchronize(s));
    job->result = host[N - 1];
    CHECK(cuMemFree_v2(x));
    CHECK(cuMemFree_v2(y));
    if (!job->per_thread_stream) CHECK(cuStreamDestroy_v2(s));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy_f32"));
    struct job jobs[3] = {{0, 0, 0}, {0, 0, 0}, {1, 0, 0}};
    pthread_t t[3];
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, work, &jobs[i]);
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++) {
        ASSERT(jobs[i].result == (float)ROUNDS, "thread %d: y = %f, expected %d", i,
               jobs[i].result, ROUNDS);
    }
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("threads");
}
