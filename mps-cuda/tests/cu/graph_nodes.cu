// Graphs built node by node with the runtime API, as XLA builds its command buffers: a copy in
// and a memset as roots, two kernels after them (the first's parameter values copied when it is
// added), an empty node joining them, a child graph with a kernel, and a copy out; instantiated
// and launched twice with new input, then a kernel node's parameters updated in the executable
// graph and launched again, every output checked.
#include "check.h"

static void launch_and_check(cudaGraphExec_t exec, cudaStream_t s, float *hin, float *hout,
                             uint64_t n, int round, float factor) {
    for (uint64_t i = 0; i < n; i++) {
        hin[i] = (float)(i + 1000 * round);
        hout[i] = -1.0f;
    }
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    for (uint64_t i = 0; i < n; i++) EXPECT(hout[i] == factor * hin[i]);
}

int main() {
    const uint64_t n = 1 << 12;
    const size_t bytes = n * sizeof(float);
    float *hin, *hout, *dx, *dy, *dz;
    CHECK(cudaMallocHost(&hin, bytes));
    CHECK(cudaMallocHost(&hout, bytes));
    CHECK(cudaMalloc(&dx, bytes));
    CHECK(cudaMalloc(&dy, bytes));
    CHECK(cudaMalloc(&dz, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint64_t count = n;

    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphNode_t in, zero, k1, k2, join, sub, out;
    CHECK(cudaGraphAddMemcpyNode1D(&in, graph, nullptr, 0, dx, hin, bytes,
                                   cudaMemcpyHostToDevice));
    cudaMemsetParams ms = {};
    ms.dst = dy;
    ms.value = 0;
    ms.elementSize = 4;
    ms.width = n;
    ms.height = 1;
    CHECK(cudaGraphAddMemsetNode(&zero, graph, nullptr, 0, &ms));
    // y = alpha * x + y, alpha copied at the add.
    float alpha = 2.0f;
    void *saxpy_args[] = {&alpha, &dx, &dy, &count};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)saxpy_f32;
    kp.gridDim = dim3(16);
    kp.blockDim = dim3(256);
    kp.kernelParams = saxpy_args;
    cudaGraphNode_t roots[] = {in, zero};
    CHECK(cudaGraphAddKernelNode(&k1, graph, roots, 2, &kp));
    alpha = 100.0f;
    // z = x + x
    void *add_args[] = {&dx, &dx, &dz, &count};
    cudaKernelNodeParams kp2 = kp;
    kp2.func = (void *)add_f32;
    kp2.kernelParams = add_args;
    CHECK(cudaGraphAddKernelNode(&k2, graph, &in, 1, &kp2));
    cudaGraphNode_t branches[] = {k1, k2};
    CHECK(cudaGraphAddEmptyNode(&join, graph, branches, 2));
    // The child graph: y = y + z.
    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    void *sum_args[] = {&dy, &dz, &dy, &count};
    cudaKernelNodeParams kp3 = kp;
    kp3.func = (void *)add_f32;
    kp3.kernelParams = sum_args;
    cudaGraphNode_t c_add;
    CHECK(cudaGraphAddKernelNode(&c_add, child, nullptr, 0, &kp3));
    CHECK(cudaGraphAddChildGraphNode(&sub, graph, &join, 1, child));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaGraphAddMemcpyNode1D(&out, graph, &sub, 1, hout, dy, bytes,
                                   cudaMemcpyDeviceToHost));
    size_t nodes = 0;
    CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    printf("built nodes: %zu\n", nodes);

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    launch_and_check(exec, s, hin, hout, n, 0, 4.0f);
    launch_and_check(exec, s, hin, hout, n, 1, 4.0f);
    printf("2 launches: y[%llu] = %.1f\n", (unsigned long long)n - 1, hout[n - 1]);
    alpha = 3.0f;
    CHECK(cudaGraphExecKernelNodeSetParams(exec, k1, &kp));
    launch_and_check(exec, s, hin, hout, n, 2, 5.0f);
    printf("after the update: y[%llu] = %.1f\n", (unsigned long long)n - 1, hout[n - 1]);

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dz));
    CHECK(cudaFreeHost(hin));
    CHECK(cudaFreeHost(hout));
    printf("graph_nodes: done\n");
    return 0;
}
