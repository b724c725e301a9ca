/* How launches from many threads of one process scale when each thread's stream is in the
 * primary context, or in a green context of its own over every SM (which shares the primary
 * context's memory and modules, as mps's SM partitions do).
 *
 *   ctxscale PTX primary|green|shared graph|plain THREADS SECONDS
 *
 * shared: every thread's stream in one green context over every SM.
 * Each thread serves requests as mps-bench's infer and infer-graph do: 4 KiB in from pinned
 * memory, 12 saxpy_f32 kernels of 1024 floats, 4 KiB out, a synchronise; "graph" captures the
 * request once and launches it. Prints the requests per second of all threads together, and
 * the device memory free before the threads set up and after.
 * Build: cc -O2 ctxscale.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -lpthread
 */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x)                                                                          \
    do {                                                                               \
        CUresult r_ = (x);                                                             \
        if (r_ != CUDA_SUCCESS) {                                                      \
            const char *s_ = "?";                                                      \
            cuGetErrorName(r_, &s_);                                                   \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_);             \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

#define N 1024
#define CHAIN 12

static CUcontext primary;
static CUdevice dev;
static CUfunction saxpy;
static int green, shared, graph;
static CUgreenCtx one_green;
static size_t free_after;
static void *first;
static double seconds;
static pthread_barrier_t barrier;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void issue(CUstream s, CUdeviceptr x, CUdeviceptr y, float *in, float *out) {
    float a = 1.0f;
    unsigned long long n = N;
    void *args[] = {&a, &x, &y, &n};
    CK(cuMemcpyHtoDAsync(x, in, N * 4, s));
    for (int k = 0; k < CHAIN; k++)
        CK(cuLaunchKernel(saxpy, 4, 1, 1, 256, 1, 1, 0, s, args, NULL));
    CK(cuMemcpyDtoHAsync(out, y, N * 4, s));
}

/* A green context over every SM of the device. */
static CUgreenCtx whole_green(void) {
    CUdevResource all;
    CUdevResourceDesc desc;
    CUgreenCtx g;
    CK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    CK(cuDevResourceGenerateDesc(&desc, &all, 1));
    CK(cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    return g;
}

static void *serve(void *arg) {
    long *done = arg;
    CK(cuCtxSetCurrent(primary));
    CUstream s;
    if (green) {
        CK(cuGreenCtxStreamCreate(&s, shared ? one_green : whole_green(), CU_STREAM_NON_BLOCKING,
                                  0));
    } else {
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    }
    CUdeviceptr x, y;
    float *in, *out;
    CK(cuMemAlloc(&x, N * 4));
    CK(cuMemAlloc(&y, N * 4));
    CK(cuMemsetD32(y, 0, N));
    CK(cuMemHostAlloc((void **)&in, N * 4, 0));
    CK(cuMemHostAlloc((void **)&out, N * 4, 0));
    for (int i = 0; i < N; i++) in[i] = (float)(i % 7);
    CUgraphExec exec = NULL;
    if (graph) {
        CUstream cap;
        CUgraph g;
        CK(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
        CK(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_RELAXED));
        issue(cap, x, y, in, out);
        CK(cuStreamEndCapture(cap, &g));
        CK(cuGraphInstantiate(&exec, g, 0));
    }
    issue(s, x, y, in, out);
    CK(cuStreamSynchronize(s));
    pthread_barrier_wait(&barrier);
    if (arg == first) {
        size_t total;
        CK(cuMemGetInfo(&free_after, &total));
    }
    pthread_barrier_wait(&barrier);
    double end = now() + seconds;
    long n = 0;
    while (now() < end) {
        if (graph)
            CK(cuGraphLaunch(exec, s));
        else
            issue(s, x, y, in, out);
        CK(cuStreamSynchronize(s));
        n++;
    }
    /* Every request adds 12 x to y: an element with x != 0 must have moved. */
    if (out[5] == 0.0f) {
        fprintf(stderr, "no output\n");
        exit(1);
    }
    *done = n;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: ctxscale PTX primary|green graph|plain THREADS SECONDS\n");
        return 2;
    }
    shared = strcmp(argv[2], "shared") == 0;
    green = shared || strcmp(argv[2], "green") == 0;
    graph = strcmp(argv[3], "graph") == 0;
    int threads = atoi(argv[4]);
    seconds = atof(argv[5]);
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&primary, dev));
    CK(cuCtxSetCurrent(primary));
    CUmodule m;
    CK(cuModuleLoad(&m, argv[1]));
    CK(cuModuleGetFunction(&saxpy, m, "saxpy_f32"));
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "THREADS: 1 to 256\n");
        return 2;
    }
    if (shared) one_green = whole_green();
    size_t free_before, device_bytes;
    CK(cuMemGetInfo(&free_before, &device_bytes));
    pthread_barrier_init(&barrier, NULL, threads);
    pthread_t t[256];
    long done[256];
    first = &done[0];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, serve, &done[i]);
    long total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        total += done[i];
    }
    printf("%s %s threads=%d requests/s=%.0f free MiB before=%zu after=%zu\n", argv[2], argv[3],
           threads, total / seconds, free_before >> 20, free_after >> 20);
    return 0;
}
