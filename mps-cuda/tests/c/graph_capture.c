/* Stream capture and graphs: a copy in, a memset, two kernels and a copy out captured once
 * from a stream, instantiated (cuGraphInstantiateWithFlags and cuGraphInstantiateWithParams)
 * and launched several times with new host data, each result checked; then CUDA's rules of
 * capture: no capture on the legacy stream, no synchronising or querying a capturing stream
 * (which invalidates the capture), the legacy stream unusable while a blocking stream captures,
 * allocation refused by the capture modes (of this thread and of others) and allowed in
 * relaxed mode, ending a capture from another thread or where none is; with MPS_ONLY=1, what
 * mps cannot capture and a capture the server spoils.
 * Usage: graph_capture <test_kernels.ptx> */
#include <pthread.h>
#include <string.h>

#include "cuda_api.h"

#define N 4096
#define BYTES (N * sizeof(float))
#define ROUNDS 4

static CUcontext ctx;
static CUfunction saxpy, add;
static CUdeviceptr dx, dy;
static float *hin, *hout;

/* Captures y = 0; y = 2 * x + y; y = y + x (so y = 3x) around a copy in and a copy out. */
static void issue(CUstream s) {
    uint64_t n = N;
    float two = 2.0f;
    void *saxpy_params[] = {&two, &dx, &dy, &n};
    void *add_params[] = {&dy, &dx, &dy, &n};
    CHECK(cuMemcpyHtoDAsync_v2(dx, hin, BYTES, s));
    CHECK(cuMemsetD32Async(dy, 0, N, s));
    CHECK(cuLaunchKernel(saxpy, 16, 1, 1, 256, 1, 1, 0, s, saxpy_params, NULL));
    CHECK(cuLaunchKernel(add, 16, 1, 1, 256, 1, 1, 0, s, add_params, NULL));
    CHECK(cuMemcpyDtoHAsync_v2(hout, dy, BYTES, s));
}

static CUstreamCaptureStatus status_of(CUstream s) {
    CUstreamCaptureStatus st = (CUstreamCaptureStatus)-1;
    CHECK(cuStreamIsCapturing(s, &st));
    return st;
}

/* Ends a capture that must have been invalidated: no graph, and the stream works again. */
static void expect_invalidated(CUstream s, const char *why) {
    ASSERT(status_of(s) == CU_STREAM_CAPTURE_STATUS_INVALIDATED, "%s: not invalidated", why);
    CUgraph g = (CUgraph)0x1;
    EXPECT(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    ASSERT(g == NULL, "%s: an invalidated capture gave a graph", why);
    ASSERT(status_of(s) == CU_STREAM_CAPTURE_STATUS_NONE, "%s: still capturing", why);
    CHECK(cuMemsetD32Async(dy, 0, N, s));
    CHECK(cuStreamSynchronize(s));
}

static CUstream capturing;

static void *end_elsewhere(void *arg) {
    (void)arg;
    CHECK(cuCtxSetCurrent(ctx));
    CUgraph g = NULL;
    EXPECT(cuStreamEndCapture(capturing, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    return NULL;
}

static CUdeviceptr allocated;
static CUresult alloc_result;

/* Allocates in a thread of its own (in the default, global, capture mode). */
static void *alloc_elsewhere(void *arg) {
    (void)arg;
    CHECK(cuCtxSetCurrent(ctx));
    alloc_result = cuMemAlloc_v2(&allocated, 256);
    return NULL;
}

static CUresult alloc_in_another_thread(void) {
    pthread_t t;
    pthread_create(&t, NULL, alloc_elsewhere, NULL);
    pthread_join(t, NULL);
    return alloc_result;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy_f32"));
    CHECK(cuModuleGetFunction(&add, mod, "add_f32"));
    CHECK(cuMemAlloc_v2(&dx, BYTES));
    CHECK(cuMemAlloc_v2(&dy, BYTES));
    CHECK(cuMemAllocHost_v2((void **)&hin, BYTES));
    CHECK(cuMemAllocHost_v2((void **)&hout, BYTES));
    CUstream s, nb;
    CHECK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    CHECK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));

    /* Capture: nothing runs, and the legacy stream is unusable meanwhile. */
    for (int i = 0; i < N; i++) hout[i] = -1.0f;
    ASSERT(status_of(s) == CU_STREAM_CAPTURE_STATUS_NONE, "capturing before the capture");
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    ASSERT(status_of(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE, "not capturing after the begin");
    CUstreamCaptureStatus st;
    uint64_t id = 0;
    CHECK(cuStreamGetCaptureInfo_v3(s, &st, &id, NULL, NULL, NULL, NULL));
    ASSERT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0, "capture info: %d, id %llu",
           (int)st, (unsigned long long)id);
    EXPECT(cuStreamIsCapturing(CU_STREAM_LEGACY, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    issue(s);
    CUgraph graph = NULL;
    CHECK(cuStreamEndCapture(s, &graph));
    ASSERT(graph != NULL, "no graph");
    size_t nodes = 0;
    CHECK(cuGraphGetNodes(graph, NULL, &nodes));
    ASSERT(nodes == 5, "%zu nodes, not the 2 copies, memset and 2 kernels captured", nodes);
    ASSERT(status_of(s) == CU_STREAM_CAPTURE_STATUS_NONE, "capturing after the end");
    CHECK(cuStreamSynchronize(s));
    ASSERT(hout[0] == -1.0f && hout[N - 1] == -1.0f, "the capture ran: %f", hout[N - 1]);

    CUgraphExec exec[2];
    /* With the flags PyTorch's CUDAGraph gives. */
    CHECK(cuGraphInstantiateWithFlags(&exec[0], graph,
                                      CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                          CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
    CUDA_GRAPH_INSTANTIATE_PARAMS params = {CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD, s, NULL, -1};
    CHECK(cuGraphInstantiateWithParams(&exec[1], graph, &params));
    ASSERT(params.result_out == CUDA_GRAPH_INSTANTIATE_SUCCESS && params.hErrNode_out == NULL,
           "instantiate result %d", params.result_out);
    CHECK(cuGraphUpload(exec[0], s));
    /* Executable graphs outlive the graph they were made from. */
    CHECK(cuGraphDestroy(graph));

    /* Each launch reads the host input again and writes the host output again. */
    int wrong = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++) hin[i] = (float)(i + 1000 * round);
        CHECK(cuGraphLaunch(exec[round % 2], s));
        CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < N; i++) wrong += hout[i] != 3.0f * hin[i];
    }
    ASSERT(wrong == 0, "%d of %d results wrong over %d launches", wrong, N * ROUNDS, ROUNDS);
    printf("%d graph launches: y[%d] = %.1f\n", ROUNDS, N - 1, hout[N - 1]);
    CHECK(cuGraphExecDestroy(exec[0]));
    CHECK(cuGraphExecDestroy(exec[1]));
    /* A destroyed executable graph that this thread launched: undefined in CUDA, refused by mps. */
    if (mps_only()) EXPECT(cuGraphLaunch(exec[0], s), CUDA_ERROR_INVALID_VALUE);

    /* No capture on the legacy stream; no end where nothing captures. */
    EXPECT(cuStreamBeginCapture_v2(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cuStreamEndCapture(s, &graph), CUDA_ERROR_ILLEGAL_STATE);

    /* Synchronising or querying a capturing stream is refused and invalidates the capture;
     * work given to it then is refused too. */
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    EXPECT(cuMemsetD32Async(dy, 0, N, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    expect_invalidated(s, "synchronise");
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuStreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    expect_invalidated(s, "query");
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    expect_invalidated(s, "context synchronisation");

    /* While a blocking stream captures, the legacy stream cannot be used (that invalidates the
     * capture); while only a non-blocking one does, it can, but not be synchronised (that
     * invalidates the capture too). */
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuMemsetD32Async(dy, 0, N, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    expect_invalidated(s, "legacy stream");
    CHECK(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemsetD32Async(dy, 0, N, NULL));
    CHECK(cuMemsetD32Async(dy, 0, N, nb));
    CHECK(cuStreamEndCapture(nb, &graph));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuStreamSynchronize(NULL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    expect_invalidated(nb, "legacy stream synchronisation");

    /* Allocating is potentially unsafe: refused during a global capture of this thread (which
     * is invalidated), allowed once the thread is in relaxed mode. */
    CUdeviceptr extra = 0;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(cuMemAlloc_v2(&extra, 256), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    expect_invalidated(s, "allocation");
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    ASSERT(mode == CU_STREAM_CAPTURE_MODE_GLOBAL, "the thread's mode was %d", (int)mode);
    CHECK(cuMemAlloc_v2(&extra, 256));
    CHECK(cuThreadExchangeStreamCaptureMode(&mode));
    ASSERT(mode == CU_STREAM_CAPTURE_MODE_RELAXED, "the thread's mode was %d", (int)mode);
    CHECK(cuMemsetD32Async(dy, 0, N, s));
    CHECK(cuStreamEndCapture(s, &graph));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuMemFree_v2(extra));

    /* Another thread may allocate while this one captures in thread-local mode, not while it
     * captures in global mode (that invalidates the capture). */
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CHECK(alloc_in_another_thread());
    CHECK(cuMemsetD32Async(dy, 0, N, s));
    CHECK(cuStreamEndCapture(s, &graph));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuMemFree_v2(allocated));
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    EXPECT(alloc_in_another_thread(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    expect_invalidated(s, "allocation in another thread");

    /* A capture not begun in relaxed mode is not for another thread to end: that thread is
     * refused, and the capture ends without a graph. */
    capturing = s;
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    pthread_t t;
    pthread_create(&t, NULL, end_elsewhere, NULL);
    pthread_join(t, NULL);
    ASSERT(status_of(s) == CU_STREAM_CAPTURE_STATUS_NONE, "still capturing, status %d",
           (int)status_of(s));
    EXPECT(cuStreamEndCapture(s, &graph), CUDA_ERROR_ILLEGAL_STATE);

    /* What mps cannot capture is refused, and invalidates the capture: an event recorded in a
     * capturing stream (CUDA's fork into another stream), a copy through pageable memory. */
    if (mps_only()) {
        CUevent e;
        CHECK(cuEventCreate(&e, CU_EVENT_DEFAULT));
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        EXPECT(cuEventRecord(e, s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        expect_invalidated(s, "event record");
        static float pageable[N];
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        EXPECT(cuMemcpyHtoDAsync_v2(dx, pageable, BYTES, s),
               CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        expect_invalidated(s, "pageable copy");
        CHECK(cuEventDestroy_v2(e));

        /* The graph being built and its nodes exist only on the server: their count is
         * answered once the capture has ended, the nodes never. */
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CUgraph building = NULL;
        EXPECT(cuStreamGetCaptureInfo_v3(s, &st, NULL, &building, NULL, NULL, NULL),
               CUDA_ERROR_NOT_SUPPORTED);
        CHECK(cuMemsetD32Async(dy, 0, N, s));
        CHECK(cuStreamEndCapture(s, &graph));
        CUgraphNode node[1];
        nodes = 1;
        EXPECT(cuGraphGetNodes(graph, node, &nodes), CUDA_ERROR_NOT_SUPPORTED);
        CHECK(cuGraphGetNodes(graph, NULL, &nodes));
        ASSERT(nodes == 1, "%zu nodes, not the one memset captured", nodes);
        CHECK(cuGraphDestroy(graph));

        /* A page-locked buffer a graph copies through is kept by the server while the graph
         * lives: freeing it is refused, and it stays the library's, freed once the graph is
         * gone (at the end). */
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CHECK(cuMemcpyHtoDAsync_v2(dx, hin, N * sizeof(float), s));
        CHECK(cuStreamEndCapture(s, &graph));
        CUgraphExec holds;
        CHECK(cuGraphInstantiateWithFlags(&holds, graph, 0));
        ASSERT(cuMemFreeHost(hin) != CUDA_SUCCESS, "a buffer a graph copies through was freed");
        CHECK(cuGraphExecDestroy(holds));
        CHECK(cuGraphDestroy(graph));

        /* Destroying a context ends its streams' captures: nothing is left capturing, so
         * memory can be freed again. */
        CUcontext other;
        CUstream in_other;
        CHECK(cuCtxCreate_v2(&other, 0, 0));
        CHECK(cuStreamCreate(&in_other, CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamBeginCapture_v2(in_other, CU_STREAM_CAPTURE_MODE_RELAXED));
        CHECK(cuCtxDestroy_v2(other));
        CHECK(cuCtxSetCurrent(ctx));
        CUdeviceptr scratch;
        CHECK(cuMemAlloc_v2(&scratch, 256));
        CHECK(cuMemFree_v2(scratch));

        /* A capture begins once; a command the server refuses (memsets and launches are posted
         * without waiting: here a memset past every allocation) spoils it: it ends without a
         * graph, its error not left for the next synchronisation, and the stream runs again. */
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        EXPECT(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL),
               CUDA_ERROR_ILLEGAL_STATE);
        CHECK(cuMemsetD32Async(dy + ((uint64_t)1 << 40), 0, N, s));
        graph = (CUgraph)0x1;
        EXPECT(cuStreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        ASSERT(graph == NULL, "a spoilt capture gave a graph");
        CHECK(cuMemsetD32Async(dy, 0, N, s));
        CHECK(cuStreamSynchronize(s));
    }

    CHECK(cuStreamDestroy_v2(s));
    CHECK(cuStreamDestroy_v2(nb));
    CHECK(cuMemFreeHost(hin));
    CHECK(cuMemFreeHost(hout));
    CHECK(cuMemFree_v2(dx));
    CHECK(cuMemFree_v2(dy));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease_v2(0));
    return finish("graph_capture");
}
