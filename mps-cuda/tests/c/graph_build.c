/* Graphs built node by node, as XLA builds its command buffers: a copy in and a memset as
 * roots, two kernels after them (one added through cuGraphAddNode_v2 with an `extra` buffer),
 * an empty node joining them (a diamond), a child graph (a kernel and a copy within the device)
 * and a copy out; beside them a 2D memset of 16-bit elements and its copy out, joined by
 * cuGraphAddDependencies. The graph is checked node by node (types, roots, edges, a kernel
 * node's parameters, copied when it was added), instantiated, launched twice with new input,
 * then updated in the executable graph (a kernel node's parameters, a memset's) and through
 * cuGraphExecUpdate from a clone, each result checked; then captured work in built graphs (a
 * captured graph as a child node, a capture into a built graph). With MPS_ONLY=1, what mps
 * refuses: a conditional handle, a host node, editing a captured graph node by node.
 * Usage: graph_build <test_kernels.ptx> */
#include <string.h>

#include "cuda_api.h"

#define N 4096
#define BYTES (N * sizeof(float))
#define ROWS 8
#define PITCH 256
/* 16-bit elements a row, from byte 2 of the row: one before the first whole 32-bit word, 16
 * words, and one after them. */
#define ROW_OFFSET 2
#define ROW_ELEMS 34

static CUfunction saxpy, add;
static CUdeviceptr dx, dy, dz, dw, dv, dp;
static float *hin, *hout;
static unsigned char *hpad;

static CUDA_MEMCPY3D copy_1d(int src_type, const void *src_host, CUdeviceptr src_dev,
                             int dst_type, void *dst_host, CUdeviceptr dst_dev, size_t bytes) {
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = src_type;
    c.srcHost = src_host;
    c.srcDevice = src_dev;
    c.dstMemoryType = dst_type;
    c.dstHost = dst_host;
    c.dstDevice = dst_dev;
    c.WidthInBytes = bytes;
    c.Height = 1;
    c.Depth = 1;
    return c;
}

static CUDA_KERNEL_NODE_PARAMS kernel_params(CUfunction f, void **params) {
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.func = f;
    p.gridDimX = 16;
    p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 256;
    p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = params;
    return p;
}

/* Launches `exec` with input x[i] = i + 1000 * round and checks y = factor * x; counts wrong
 * results, and checks the 16-bit rows too. */
static int run(CUgraphExec exec, CUstream s, int round, float factor) {
    for (int i = 0; i < N; i++) {
        hin[i] = (float)(i + 1000 * round);
        hout[i] = -1.0f;
    }
    memset(hpad, 0, ROWS * PITCH);
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    int wrong = 0;
    for (int i = 0; i < N; i++) wrong += hout[i] != factor * hin[i];
    int pad_wrong = 0;
    for (int r = 0; r < ROWS; r++) {
        for (int b = 0; b < PITCH; b++) {
            int set = b >= ROW_OFFSET && b < ROW_OFFSET + 2 * ROW_ELEMS;
            unsigned char want = set ? (b % 2 ? 0x12 : 0x34) : 0xee;
            pad_wrong += hpad[r * PITCH + b] != want;
        }
    }
    ASSERT(pad_wrong == 0, "round %d: %d bytes of the 16-bit memset's rows wrong", round,
           pad_wrong);
    ASSERT(wrong == 0, "round %d: %d of %d results wrong (y[1] = %f, want %f)", round, wrong, N,
           hout[1], factor * hin[1]);
    return wrong;
}

static size_t count_nodes(CUgraph g) {
    size_t n = 0;
    CHECK(cuGraphGetNodes(g, NULL, &n));
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&saxpy, mod, "saxpy_f32"));
    CHECK(cuModuleGetFunction(&add, mod, "add_f32"));
    CUdeviceptr *bufs[] = {&dx, &dy, &dz, &dw, &dv};
    for (int i = 0; i < 5; i++) CHECK(cuMemAlloc_v2(bufs[i], BYTES));
    CHECK(cuMemAlloc_v2(&dp, ROWS * PITCH));
    CHECK(cuMemsetD8_v2(dp, 0xee, ROWS * PITCH));
    CHECK(cuMemAllocHost_v2((void **)&hin, BYTES));
    CHECK(cuMemAllocHost_v2((void **)&hout, BYTES));
    CHECK(cuMemAllocHost_v2((void **)&hpad, ROWS * PITCH));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    uint64_t n = N;

    /* The child graph: w = y + z, then v = w (a copy within the device). */
    CUgraph child;
    CHECK(cuGraphCreate(&child, 0));
    CUgraphNode c_add, c_copy;
    void *c_add_params[] = {&dy, &dz, &dw, &n};
    CUDA_KERNEL_NODE_PARAMS kp = kernel_params(add, c_add_params);
    CHECK(cuGraphAddKernelNode_v2(&c_add, child, NULL, 0, &kp));
    CUDA_MEMCPY3D d2d = copy_1d(CU_MEMORYTYPE_DEVICE, NULL, dw, CU_MEMORYTYPE_DEVICE, NULL, dv,
                                BYTES);
    CHECK(cuGraphAddMemcpyNode(&c_copy, child, &c_add, 1, &d2d, ctx));

    /* The graph. */
    CUgraph graph;
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode in, zero, k1, k2, join, sub, out, pad, pad_out;
    CUDA_MEMCPY3D h2d = copy_1d(CU_MEMORYTYPE_HOST, hin, 0, CU_MEMORYTYPE_DEVICE, NULL, dx,
                                BYTES);
    CHECK(cuGraphAddMemcpyNode(&in, graph, NULL, 0, &h2d, ctx));
    CUDA_MEMSET_NODE_PARAMS ms = {dy, 0, 0, 4, N, 1};
    CHECK(cuGraphAddMemsetNode(&zero, graph, NULL, 0, &ms, ctx));
    /* y = alpha * x + y: alpha's value is copied when the node is added. */
    float alpha = 2.0f;
    void *saxpy_params[] = {&alpha, &dx, &dy, &n};
    CUgraphNode roots2[] = {in, zero};
    kp = kernel_params(saxpy, saxpy_params);
    CHECK(cuGraphAddKernelNode_v2(&k1, graph, roots2, 2, &kp));
    alpha = 100.0f;
    /* z = x + x, its parameters packed into one buffer (`extra`), through cuGraphAddNode_v2. */
    struct {
        CUdeviceptr a, b, c;
        uint64_t n;
    } packed = {dx, dx, dz, N};
    size_t packed_size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &packed_size, CU_LAUNCH_PARAM_END};
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_KERNEL;
    np.kernel = kernel_params(add, NULL);
    np.kernel.extra = extra;
    CHECK(cuGraphAddNode_v2(&k2, graph, &in, NULL, 1, &np));
    packed.c = dw; /* copied too */
    CUgraphNode branches[] = {k1, k2};
    CHECK(cuGraphAddEmptyNode(&join, graph, branches, 2));
    CHECK(cuGraphAddChildGraphNode(&sub, graph, &join, 1, child));
    /* The child graph was cloned into the node: destroying it leaves the node whole. */
    CHECK(cuGraphDestroy(child));
    CUDA_MEMCPY3D d2h = copy_1d(CU_MEMORYTYPE_DEVICE, NULL, dv, CU_MEMORYTYPE_HOST, hout, 0,
                                BYTES);
    CHECK(cuGraphAddMemcpyNode(&out, graph, &sub, 1, &d2h, ctx));
    /* 2D: ROW_ELEMS 16-bit elements of 0x1234 in each row, the rest of each row untouched. */
    CUDA_MEMSET_NODE_PARAMS ms2 = {dp + ROW_OFFSET, PITCH, 0x1234, 2, ROW_ELEMS, ROWS};
    CHECK(cuGraphAddMemsetNode(&pad, graph, NULL, 0, &ms2, ctx));
    CUDA_MEMCPY3D pad_copy = copy_1d(CU_MEMORYTYPE_DEVICE, NULL, dp, CU_MEMORYTYPE_HOST, hpad, 0,
                                     ROWS * PITCH);
    CHECK(cuGraphAddMemcpyNode(&pad_out, graph, NULL, 0, &pad_copy, ctx));
    CHECK(cuGraphAddDependencies_v2(graph, &pad, &pad_out, NULL, 1));

    /* What the graph holds. */
    ASSERT(count_nodes(graph) == 9, "%zu nodes, not 9", count_nodes(graph));
    CUgraphNode roots[8];
    size_t nroots = 8;
    CHECK(cuGraphGetRootNodes(graph, roots, &nroots));
    ASSERT(nroots == 3, "%zu roots, not the copy in, the memset and the 2D memset", nroots);
    size_t edges = 0;
    CHECK(cuGraphGetEdges_v2(graph, NULL, NULL, NULL, &edges));
    ASSERT(edges == 8, "%zu edges, not 8", edges);
    CUgraphNode deps[4];
    size_t ndeps = 4;
    CHECK(cuGraphNodeGetDependencies_v2(join, deps, NULL, &ndeps));
    ASSERT(ndeps == 2 && ((deps[0] == k1 && deps[1] == k2) || (deps[0] == k2 && deps[1] == k1)),
           "join depends on %zu nodes, not k1 and k2", ndeps);
    CUgraphNodeType t = (CUgraphNodeType)-1;
    CHECK(cuGraphNodeGetType(join, &t));
    ASSERT(t == CU_GRAPH_NODE_TYPE_EMPTY, "join is of type %d", (int)t);
    CHECK(cuGraphNodeGetType(sub, &t));
    ASSERT(t == CU_GRAPH_NODE_TYPE_GRAPH, "the child node is of type %d", (int)t);
    CHECK(cuGraphNodeGetType(k2, &t));
    ASSERT(t == CU_GRAPH_NODE_TYPE_KERNEL, "k2 is of type %d", (int)t);
    CUgraph embedded = NULL;
    CHECK(cuGraphChildGraphNodeGetGraph(sub, &embedded));
    ASSERT(embedded != NULL && count_nodes(embedded) == 2, "the embedded graph");
    CUDA_KERNEL_NODE_PARAMS got;
    memset(&got, 0, sizeof got);
    CHECK(cuGraphKernelNodeGetParams_v2(k1, &got));
    ASSERT(got.func == saxpy && got.gridDimX == 16 && got.blockDimX == 256 &&
               got.kernelParams && *(float *)got.kernelParams[0] == 2.0f,
           "k1's parameters as handed back");
    /* An attribute that only hints (a priority) is kept and read back. */
    unsigned char attr[64] = {0}, attr_back[64] = {0};
    int priority = -1;
    memcpy(attr, &priority, sizeof priority);
    CHECK(cuGraphKernelNodeSetAttribute(k1, CU_LAUNCH_ATTRIBUTE_PRIORITY, attr));
    CHECK(cuGraphKernelNodeGetAttribute(k1, CU_LAUNCH_ATTRIBUTE_PRIORITY, attr_back));
    memcpy(&priority, attr_back, sizeof priority);
    ASSERT(priority == -1, "k1's priority read back as %d", priority);
    /* A node added and destroyed leaves nothing behind. */
    CUgraphNode extra_node;
    CHECK(cuGraphAddEmptyNode(&extra_node, graph, &out, 1));
    CHECK(cuGraphDestroyNode(extra_node));
    ASSERT(count_nodes(graph) == 9, "%zu nodes after a node's destruction", count_nodes(graph));

    /* Instantiated and launched twice with new input: v = 2x + 2x. */
    CUgraphExec exec;
    CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    int wrong = run(exec, s, 0, 4.0f) + run(exec, s, 1, 4.0f);

    /* A kernel node's parameters changed in the executable graph: a launch posted before keeps
     * the old ones; later ones take the new (v = 3x + 2x). */
    for (int i = 0; i < N; i++) hin[i] = (float)i;
    CHECK(cuGraphLaunch(exec, s));
    alpha = 3.0f;
    kp = kernel_params(saxpy, saxpy_params);
    CHECK(cuGraphExecKernelNodeSetParams_v2(exec, k1, &kp));
    CHECK(cuStreamSynchronize(s));
    ASSERT(hout[N - 1] == 4.0f * (N - 1), "the launch before the update ran %f", hout[N - 1]);
    wrong += run(exec, s, 2, 5.0f);
    /* The memset of y, to 1.0f: v = (3x + 1) + 2x, checked at one point. */
    CUDA_MEMSET_NODE_PARAMS one = {dy, 0, 0x3f800000u, 4, N, 1};
    CHECK(cuGraphExecMemsetNodeSetParams(exec, zero, &one, ctx));
    for (int i = 0; i < N; i++) hin[i] = 1.0f;
    CHECK(cuGraphLaunch(exec, s));
    CHECK(cuStreamSynchronize(s));
    ASSERT(hout[7] == 6.0f, "after the memset's update y + z = %f, not 6", hout[7]);
    CHECK(cuGraphExecMemsetNodeSetParams(exec, zero, &ms, ctx));

    /* The graph itself is unchanged: a new instantiation runs alpha = 2. */
    CUgraphExec fresh;
    CHECK(cuGraphInstantiateWithFlags(&fresh, graph, 0));
    wrong += run(fresh, s, 3, 4.0f);
    CHECK(cuGraphExecDestroy(fresh));

    /* A clone, its k1 at alpha = 5, given to the executable graph: v = 5x + 2x. */
    CUgraph copy;
    CHECK(cuGraphClone(&copy, graph));
    CUgraphNode k1_copy = NULL;
    CHECK(cuGraphNodeFindInClone(&k1_copy, k1, copy));
    alpha = 5.0f;
    kp = kernel_params(saxpy, saxpy_params);
    CHECK(cuGraphKernelNodeSetParams_v2(k1_copy, &kp));
    CUgraphExecUpdateResultInfo info = {-1, NULL, NULL};
    CHECK(cuGraphExecUpdate_v2(exec, copy, &info));
    ASSERT(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS, "update result %d", info.result);
    wrong += run(exec, s, 4, 7.0f);
    /* A graph of another shape is refused, and the executable graph runs on as it was. */
    CUgraphNode added;
    CHECK(cuGraphAddEmptyNode(&added, copy, NULL, 0));
    EXPECT(cuGraphExecUpdate_v2(exec, copy, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    ASSERT(info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED, "update result %d",
           info.result);
    wrong += run(exec, s, 5, 7.0f);
    printf("built graph: %d wrong results over 6 launches, v[%d] = %.1f\n", wrong, N - 1,
           hout[N - 1]);

    /* Captured work in a built graph: a captured graph as a child node, and a capture into a
     * built graph (cuStreamBeginCaptureToGraph), each followed by a copy out. */
    for (int into = 0; into < 2; into++) {
        float value = into ? 2.0f : 3.0f;
        unsigned int bits;
        memcpy(&bits, &value, sizeof bits);
        CUgraph g2, captured;
        CUgraphNode first = NULL, copy_out;
        CHECK(cuGraphCreate(&g2, 0));
        if (into) {
            CHECK(cuStreamBeginCaptureToGraph(s, g2, NULL, NULL, 0,
                                              CU_STREAM_CAPTURE_MODE_GLOBAL));
            CHECK(cuMemsetD32Async(dv, bits, N, s));
            CHECK(cuStreamEndCapture(s, &captured));
            ASSERT(captured == g2, "the capture into a graph ended with another graph");
            size_t n_roots = 1;
            CHECK(cuGraphGetRootNodes(g2, &first, &n_roots));
            ASSERT(n_roots == 1, "%zu roots after the capture into the graph", n_roots);
        } else {
            CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
            CHECK(cuMemsetD32Async(dv, bits, N, s));
            CHECK(cuStreamEndCapture(s, &captured));
            CHECK(cuGraphAddChildGraphNode(&first, g2, NULL, 0, captured));
            CHECK(cuGraphDestroy(captured));
        }
        CHECK(cuGraphAddMemcpyNode(&copy_out, g2, &first, 1, &d2h, ctx));
        CUgraphExec e2;
        CHECK(cuGraphInstantiateWithFlags(&e2, g2, 0));
        for (int i = 0; i < N; i++) hout[i] = -1.0f;
        CHECK(cuGraphLaunch(e2, s));
        CHECK(cuStreamSynchronize(s));
        int bad = 0;
        for (int i = 0; i < N; i++) bad += hout[i] != value;
        ASSERT(bad == 0, "%s: %d of %d values wrong (%f)",
               into ? "captured into the graph" : "a captured child graph", bad, N, hout[0]);
        CHECK(cuGraphExecDestroy(e2));
        CHECK(cuGraphDestroy(g2));
    }
    printf("captured work in built graphs: v[0] = %.1f\n", hout[0]);

    /* An empty graph instantiates and launches, doing nothing. */
    CUgraph none;
    CUgraphExec none_exec;
    CHECK(cuGraphCreate(&none, 0));
    CHECK(cuGraphInstantiateWithFlags(&none_exec, none, 0));
    CHECK(cuGraphLaunch(none_exec, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuGraphExecDestroy(none_exec));
    CHECK(cuGraphDestroy(none));

    if (mps_only()) {
        /* Conditional nodes and host nodes are refused, never made into a graph without them. */
        unsigned long long cond = 0;
        EXPECT(cuGraphConditionalHandleCreate(&cond, copy, ctx, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
        CUgraphNodeParams host;
        memset(&host, 0, sizeof host);
        host.type = CU_GRAPH_NODE_TYPE_HOST;
        CUgraphNode refused;
        EXPECT(cuGraphAddNode_v2(&refused, copy, NULL, NULL, 0, &host), CUDA_ERROR_NOT_SUPPORTED);
        /* A captured graph exists only on the server: it is not edited node by node. */
        CUgraph captured;
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CHECK(cuMemsetD32Async(dy, 0, N, s));
        CHECK(cuStreamEndCapture(s, &captured));
        EXPECT(cuGraphAddEmptyNode(&refused, captured, NULL, 0), CUDA_ERROR_NOT_SUPPORTED);
        EXPECT(cuGraphExecUpdate_v2(exec, captured, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
        CHECK(cuGraphDestroy(captured));
        /* A node of a destroyed graph is no node. */
        CUgraph gone;
        CUgraphNode orphan;
        CHECK(cuGraphCreate(&gone, 0));
        CHECK(cuGraphAddEmptyNode(&orphan, gone, NULL, 0));
        CHECK(cuGraphDestroy(gone));
        EXPECT(cuGraphNodeGetType(orphan, &t), CUDA_ERROR_INVALID_VALUE);
    }

    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(copy));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuMemFreeHost(hin));
    CHECK(cuMemFreeHost(hout));
    CHECK(cuMemFreeHost(hpad));
    return finish("graph_build");
}
