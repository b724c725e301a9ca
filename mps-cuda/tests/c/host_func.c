/* Host functions in stream order (cuLaunchHostFunc, cuStreamAddCallback): a function sees the
 * work queued before it done, and work queued after it waits for it (the function writes
 * page-locked memory that a later copy reads); the functions of a stream run in order; a
 * callback is handed its stream and CUDA_SUCCESS; a stream synchronisation waits for the
 * function too, on a stream of the program's and on the legacy default stream. With
 * PENDING_EXIT=1 it then exits with a function still pending (after a long kernel), which must
 * neither hang the program nor the server.
 * Usage: host_func <test_kernels.ptx> */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define N (1 << 20)
#define MANY 200

struct shared {
    uint32_t *seen;  /* page-locked: the device's words before the first function */
    uint32_t *next;  /* page-locked: what the first function writes for a later copy */
    uint32_t *back;  /* page-locked: the device's words after that copy */
    atomic_int order[4 + MANY];
    atomic_int calls;
    atomic_int saw_done;   /* the first function found the earlier work done */
    atomic_int saw_later;  /* the callback found the first function's words on the device */
    atomic_int status;     /* the callback's status */
    atomic_int stream_ok;  /* the callback was handed its stream */
    atomic_int slept;      /* the slow function returned */
    CUstream stream;
};

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void note(struct shared *sh, int what) {
    int i = atomic_fetch_add(&sh->calls, 1);
    if (i < 4 + MANY) atomic_store(&sh->order[i], what);
}

static void first(void *user) {
    struct shared *sh = user;
    int done = 1;
    for (int i = 0; i < N; i++) done &= sh->seen[i] == 7u;
    atomic_store(&sh->saw_done, done);
    for (int i = 0; i < N; i++) sh->next[i] = 11u;
    note(sh, 1);
}

static void callback(CUstream s, CUresult status, void *user) {
    struct shared *sh = user;
    atomic_store(&sh->status, status);
    atomic_store(&sh->stream_ok, s == sh->stream);
    int later = 1;
    for (int i = 0; i < N; i++) later &= sh->back[i] == 11u;
    atomic_store(&sh->saw_later, later);
    note(sh, 2);
}

static void slow(void *user) {
    struct shared *sh = user;
    sleep_ms(50);
    atomic_store(&sh->slept, 1);
    note(sh, 3);
}

static void numbered(void *user) {
    struct shared *sh = user;
    note(sh, 100 + atomic_load(&sh->calls));
}

static void pending(void *user) {
    (void)user;
    sleep_ms(200);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CUmodule mod;
    CUfunction fill;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fill, mod, "fill_u32"));
    static struct shared sh;
    CHECK(cuMemAllocHost_v2((void **)&sh.seen, N * sizeof(uint32_t)));
    CHECK(cuMemAllocHost_v2((void **)&sh.next, N * sizeof(uint32_t)));
    CHECK(cuMemAllocHost_v2((void **)&sh.back, N * sizeof(uint32_t)));
    memset(sh.seen, 0, N * sizeof(uint32_t));
    memset(sh.back, 0, N * sizeof(uint32_t));
    CUdeviceptr d;
    CHECK(cuMemAlloc_v2(&d, N * sizeof(uint32_t)));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    sh.stream = s;

    /* fill -> copy out -> first() -> copy in what it wrote -> copy out -> callback -> slow */
    uint32_t seven = 7;
    uint64_t n = N;
    void *params[] = {&d, &seven, &n};
    CHECK(cuLaunchKernel(fill, N / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
    CHECK(cuMemcpyDtoHAsync_v2(sh.seen, d, N * sizeof(uint32_t), s));
    CHECK(cuLaunchHostFunc(s, first, &sh));
    CHECK(cuMemcpyHtoDAsync_v2(d, sh.next, N * sizeof(uint32_t), s));
    CHECK(cuMemcpyDtoHAsync_v2(sh.back, d, N * sizeof(uint32_t), s));
    CHECK(cuStreamAddCallback(s, callback, &sh, 0));
    CHECK(cuLaunchHostFunc(s, slow, &sh));
    CHECK(cuStreamSynchronize(s));
    ASSERT(atomic_load(&sh.slept), "cuStreamSynchronize returned before the host function did");
    ASSERT(atomic_load(&sh.saw_done), "a host function ran before the work queued before it");
    ASSERT(atomic_load(&sh.saw_later),
           "a copy queued after a host function did not see what the function wrote");
    ASSERT(atomic_load(&sh.status) == CUDA_SUCCESS, "the callback's status is %d",
           atomic_load(&sh.status));
    ASSERT(atomic_load(&sh.stream_ok), "the callback was not handed its stream");
    ASSERT(atomic_load(&sh.calls) == 3, "%d host functions ran, not 3", atomic_load(&sh.calls));
    for (int i = 0; i < 3; i++)
        ASSERT(atomic_load(&sh.order[i]) == i + 1, "host function %d ran as number %d",
               atomic_load(&sh.order[i]), i + 1);
    for (int i = 0; i < N; i++) {
        ASSERT(sh.back[i] == 11u, "back[%d] = %u, want 11", i, sh.back[i]);
        if (sh.back[i] != 11u) break;
    }

    /* Many functions of one stream, between small kernels: in order, all before the sync. */
    atomic_store(&sh.calls, 0);
    for (int i = 0; i < MANY; i++) {
        uint32_t v = (uint32_t)i;
        uint64_t one = 1;
        void *p[] = {&d, &v, &one};
        CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, p, NULL));
        CHECK(cuLaunchHostFunc(s, numbered, &sh));
    }
    CHECK(cuStreamSynchronize(s));
    ASSERT(atomic_load(&sh.calls) == MANY, "%d of %d host functions ran before the sync",
           atomic_load(&sh.calls), MANY);
    for (int i = 0; i < MANY; i++) {
        int got = atomic_load(&sh.order[i]);
        ASSERT(got == 100 + i, "host function %d ran as number %d", got - 100, i);
        if (got != 100 + i) break;
    }

    /* The legacy default stream, and a context synchronisation. */
    atomic_store(&sh.slept, 0);
    CHECK(cuLaunchKernel(fill, N / 256, 1, 1, 256, 1, 1, 0, 0, params, NULL));
    CHECK(cuLaunchHostFunc(0, slow, &sh));
    CHECK(cuCtxSynchronize());
    ASSERT(atomic_load(&sh.slept), "cuCtxSynchronize returned before the host function did");

    if (mps_only()) {
        EXPECT(cuLaunchHostFunc(s, NULL, &sh), CUDA_ERROR_INVALID_VALUE);
        EXPECT(cuStreamAddCallback(s, callback, &sh, 1), CUDA_ERROR_INVALID_VALUE);
        /* mps does not capture host nodes: refused, and the capture invalidated. */
        CUstream c;
        CHECK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamBeginCapture_v2(c, CU_STREAM_CAPTURE_MODE_RELAXED));
        EXPECT(cuLaunchHostFunc(c, slow, &sh), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CUgraph g = NULL;
        EXPECT(cuStreamEndCapture(c, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        CHECK(cuStreamDestroy_v2(c));
    }

    const char *pend = getenv("PENDING_EXIT");
    if (pend && *pend == '1') {
        /* Leave with a function pending behind a long kernel: no synchronisation, no
         * teardown. */
        for (int i = 0; i < 8; i++)
            CHECK(cuLaunchKernel(fill, N / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
        CHECK(cuLaunchHostFunc(s, pending, &sh));
        CHECK(cuLaunchKernel(fill, N / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
        return finish("host_func");
    }
    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuMemFree_v2(d));
    CHECK(cuMemFreeHost(sh.seen));
    CHECK(cuMemFreeHost(sh.next));
    CHECK(cuMemFreeHost(sh.back));
    CHECK(cuCtxDestroy_v2(ctx));
    return finish("host_func");
}
