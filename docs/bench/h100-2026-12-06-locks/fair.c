/* Whether one CUDA context serves many busy streams fairly: THREADS threads, each with a
 * non-blocking stream of its own in the one primary context, repeat a "request" (LAUNCHES
 * kernels of 20 to 200 us that fill every SM, then cuStreamSynchronize) for SECONDS. Prints
 * each thread's requests and its longest request, fewest first: a thread held for seconds
 * while the others are served shows as a count of 0 or 1 and a longest request of seconds.
 *
 * With CLUSTER=k (k > 1), one launch of each request (the ninth; LAUNCHES must be 9 or more)
 * is a cluster launch (cuLaunchKernelEx, clusters of k blocks, SHMEM bytes of
 * dynamic shared memory a block, 0 by default): whether cluster launches among many busy
 * streams of one context stop returning. CLUSTER needs an sm_90 device or later.
 *
 *   cc -O2 -I/usr/local/cuda/include fair.c -o fair -lcuda -lpthread
 *   CUDA_DEVICE_MAX_CONNECTIONS=32 [CLUSTER=2 SHMEM=0] ./fair [THREADS=64] [SECONDS=4] [LAUNCHES=20]
 */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static const char *PTX =
    ".version 7.8\n.target sm_75\n.address_size 64\n"
    ".visible .entry spin(.param .u64 ns)\n{\n"
    "  .reg .b64 %rd<5>;\n  .reg .pred %p;\n"
    "  ld.param.u64 %rd1, [ns];\n  mov.u64 %rd2, %globaltimer;\n"
    "L:\n  mov.u64 %rd3, %globaltimer;\n  sub.u64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p, %rd4, %rd1;\n  @%p bra L;\n  ret;\n}\n";

#define CHECK(x)                                                                        \
    do {                                                                                \
        CUresult r_ = (x);                                                              \
        if (r_ != CUDA_SUCCESS) {                                                       \
            const char *s_ = "?";                                                       \
            cuGetErrorName(r_, &s_);                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, s_);      \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static CUcontext ctx;
static CUfunction fn;
static int sms, launches, cluster, shmem;
static double seconds;

struct result { long requests; double longest; double slowest_launch; };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *client(void *arg) {
    struct result *res = arg;
    CUstream s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned seed = (unsigned)(size_t)arg;
    double end = now() + seconds;
    while (now() < end) {
        double t0 = now();
        for (int i = 0; i < launches; i++) {
            unsigned long long ns = 20000 + rand_r(&seed) % 180000;
            void *params[] = {&ns};
            if (cluster > 1 && i == 8) {
                CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION};
                attr.value.clusterDim.x = cluster;
                attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
                CUlaunchConfig cfg = {.gridDimX = sms / cluster * cluster, .gridDimY = 1,
                                      .gridDimZ = 1, .blockDimX = 128, .blockDimY = 1,
                                      .blockDimZ = 1, .sharedMemBytes = shmem, .hStream = s,
                                      .attrs = &attr, .numAttrs = 1};
                double l0 = now();
                CHECK(cuLaunchKernelEx(&cfg, fn, params, NULL));
                double call = now() - l0;
                if (call > res->slowest_launch) res->slowest_launch = call;
            } else {
                CHECK(cuLaunchKernel(fn, sms, 1, 1, 128, 1, 1, 0, s, params, NULL));
            }
        }
        CHECK(cuStreamSynchronize(s));
        double took = now() - t0;
        if (took > res->longest) res->longest = took;
        res->requests++;
    }
    CHECK(cuStreamDestroy(s));
    return NULL;
}

static int by_requests(const void *a, const void *b) {
    long x = ((const struct result *)a)->requests, y = ((const struct result *)b)->requests;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 64;
    seconds = argc > 2 ? atof(argv[2]) : 4;
    launches = argc > 3 ? atoi(argv[3]) : 20;
    cluster = getenv("CLUSTER") ? atoi(getenv("CLUSTER")) : 0;
    shmem = getenv("SHMEM") ? atoi(getenv("SHMEM")) : 0;
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "spin"));
    if (shmem > 48 * 1024)
        CHECK(cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shmem));
    pthread_t *t = calloc(threads, sizeof *t);
    struct result *r = calloc(threads, sizeof *r);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, client, &r[i]);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    qsort(r, threads, sizeof *r, by_requests);
    printf("threads %d, %d launches a request, %d SMs, CUDA_DEVICE_MAX_CONNECTIONS=%s, "
           "cluster %d, shared memory %d\n", threads, launches, sms,
           getenv("CUDA_DEVICE_MAX_CONNECTIONS") ?: "(unset)", cluster, shmem);
    for (int i = 0; i < threads; i++)
        printf("%ld requests, longest %.3f s, slowest cluster launch call %.3f s\n",
               r[i].requests, r[i].longest, r[i].slowest_launch);
    return 0;
}
