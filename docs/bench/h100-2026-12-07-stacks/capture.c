/* Whether stream capture and graph instantiation wait behind many threads' launches in one
 * CUDA context: LAUNCHERS threads, each with a non-blocking stream of its own in the primary
 * context, repeat 20 launches of a short kernel and a cuStreamSynchronize for SECONDS, while
 * CAPTURERS threads each repeat: capture 10 launches on a stream of their own (relaxed mode),
 * instantiate the graph, launch and synchronise it, destroy both. Prints, for the capturers,
 * how many graphs they made and their slowest cuStreamBeginCapture and cuGraphInstantiate
 * calls, and for the launchers their requests. With GATE=1 the launchers hold back while a
 * capturer is in one of those two calls (an atomic count they read before each launch).
 *
 *   cc -O2 -I/usr/local/cuda/include capture.c -o capture -lcuda -lpthread
 *   [GATE=1] ./capture [LAUNCHERS=63] [CAPTURERS=1] [SECONDS=4]
 */
#include <cuda.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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
static double seconds;
static int gate;
static atomic_int writers;

struct result { long count; double slowest_begin, slowest_instantiate, longest; };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void launch(CUstream s, unsigned long long ns) {
    void *params[] = {&ns};
    CHECK(cuLaunchKernel(fn, 4, 1, 1, 64, 1, 1, 0, s, params, NULL));
}

static void *launcher(void *arg) {
    struct result *res = arg;
    CUstream s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    double end = now() + seconds;
    while (now() < end) {
        double t0 = now();
        for (int i = 0; i < 20; i++) {
            while (gate && atomic_load_explicit(&writers, memory_order_relaxed)) sched_yield();
            launch(s, 2000);
        }
        CHECK(cuStreamSynchronize(s));
        if (now() - t0 > res->longest) res->longest = now() - t0;
        res->count++;
    }
    CHECK(cuStreamDestroy(s));
    return NULL;
}

static void *capturer(void *arg) {
    struct result *res = arg;
    CUstream s;
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    double end = now() + seconds;
    while (now() < end) {
        CUgraph g;
        CUgraphExec e;
        atomic_fetch_add(&writers, 1);
        double t0 = now();
        CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
        double t1 = now();
        atomic_fetch_sub(&writers, 1);
        for (int i = 0; i < 10; i++) launch(s, 2000);
        CHECK(cuStreamEndCapture(s, &g));
        atomic_fetch_add(&writers, 1);
        double t2 = now();
        CHECK(cuGraphInstantiate(&e, g, 0));
        double t3 = now();
        atomic_fetch_sub(&writers, 1);
        if (t1 - t0 > res->slowest_begin) res->slowest_begin = t1 - t0;
        if (t3 - t2 > res->slowest_instantiate) res->slowest_instantiate = t3 - t2;
        CHECK(cuGraphLaunch(e, s));
        CHECK(cuStreamSynchronize(s));
        CHECK(cuGraphExecDestroy(e));
        CHECK(cuGraphDestroy(g));
        res->count++;
    }
    CHECK(cuStreamDestroy(s));
    return NULL;
}

int main(int argc, char **argv) {
    int launchers = argc > 1 ? atoi(argv[1]) : 63;
    int capturers = argc > 2 ? atoi(argv[2]) : 1;
    seconds = argc > 3 ? atof(argv[3]) : 4;
    gate = getenv("GATE") && atoi(getenv("GATE"));
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "spin"));
    int n = launchers + capturers;
    pthread_t *t = calloc(n, sizeof *t);
    struct result *r = calloc(n, sizeof *r);
    for (int i = 0; i < n; i++)
        pthread_create(&t[i], NULL, i < capturers ? capturer : launcher, &r[i]);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    printf("launchers %d, capturers %d, gate %d, %.0f s\n", launchers, capturers, gate, seconds);
    double fewest = 1e18, longest = 0;
    long total = 0;
    for (int i = 0; i < capturers; i++)
        printf("capturer %d: %ld graphs, slowest begin-capture %.4f s, slowest instantiate %.4f s\n",
               i, r[i].count, r[i].slowest_begin, r[i].slowest_instantiate);
    for (int i = capturers; i < n; i++) {
        total += r[i].count;
        if (r[i].count < fewest) fewest = r[i].count;
        if (r[i].longest > longest) longest = r[i].longest;
    }
    printf("launchers: %ld requests in all, fewest %.0f, longest request %.4f s\n", total, fewest,
           longest);
    return 0;
}
