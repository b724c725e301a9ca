/* What the driver calls a runtime-API launch makes cost, one by one: nanoseconds per call, over
 * many calls, of the queries cudart and cuBLAS make around every launch, and of a launch of an
 * empty-bodied kernel into a stream (a synchronise every 1000 launches); then what a graph of 8
 * such kernels costs to launch, and to update one kernel node's parameters in its executable
 * graph (what serving a run whose arguments moved from a cached graph would add per node).
 * Usage: callcost <test_kernels.ptx> [calls] */
#include <string.h>
#include <time.h>

#include "../../../mps-cuda/tests/c/cuda_api.h"

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#define TIME(label, n, body)                                                  \
    do {                                                                      \
        double t0_ = now_ns();                                                \
        for (long i_ = 0; i_ < (n); i_++) { body; }                           \
        printf("%-34s %8.1f ns\n", label, (now_ns() - t0_) / (double)(n));    \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    char *ptx = read_file(argv[1]);
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CUfunction spin;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&spin, mod, "spin_ns"));
    CUstream s;
    CHECK(cuStreamCreate(&s, 1));
    CUdeviceptr counter;
    CHECK(cuMemAlloc_v2(&counter, 4));
    CUdevice d;
    CUcontext c;
    unsigned flags;
    int active, v;
    int only_launch = argc > 3;
    if (!only_launch) {
    TIME("cuCtxGetDevice", n, cuCtxGetDevice(&d));
    TIME("cuCtxGetCurrent", n, cuCtxGetCurrent(&c));
    TIME("cuDevicePrimaryCtxGetState", n, cuDevicePrimaryCtxGetState(dev, &flags, &active));
    TIME("cuFuncGetAttribute", n, cuFuncGetAttribute(&v, 0, spin));
    TIME("cuDeviceGetAttribute", n, cuDeviceGetAttribute(&v, 16, dev));
    }
    uint64_t ns = 0;
    void *params[] = {&ns, &counter};
    long launches = n / 10;
    TIME("cuLaunchKernel (1 block)", launches, {
        cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
        if (i_ % 1000 == 999) cuStreamSynchronize(s);
    });
    CHECK(cuStreamSynchronize(s));
    TIME("cuLaunchKernel + 12 cuCtxGetDevice", launches, {
        for (int k = 0; k < 12; k++) cuCtxGetDevice(&d);
        cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
        if (i_ % 1000 == 999) cuStreamSynchronize(s);
    });
    CHECK(cuStreamSynchronize(s));
    TIME("cuStreamQuery (idle stream)", n / 100, cuStreamQuery(s));
    enum { NODES = 8 };
    CUgraph g;
    CUgraphNode nodes[NODES];
    CUgraphExec exec;
    CUDA_KERNEL_NODE_PARAMS kp = {0};
    kp.func = spin;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = 32;
    kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = params;
    CHECK(cuGraphCreate(&g, 0));
    for (int k = 0; k < NODES; k++)
        CHECK(cuGraphAddKernelNode_v2(&nodes[k], g, k ? &nodes[k - 1] : NULL, k ? 1 : 0, &kp));
    CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
    TIME("cuGraphLaunch (8 kernel nodes)", launches / NODES, {
        cuGraphLaunch(exec, s);
        if (i_ % 200 == 199) cuStreamSynchronize(s);
    });
    CHECK(cuStreamSynchronize(s));
    uint64_t other = 1;
    void *moved[] = {&other, &counter};
    CUDA_KERNEL_NODE_PARAMS kq = kp;
    TIME("cuGraphExecKernelNodeSetParams", launches, {
        kq.kernelParams = (i_ & 1) ? params : moved;
        cuGraphExecKernelNodeSetParams_v2(exec, nodes[i_ % NODES], &kq);
    });
    TIME("8 x SetParams + cuGraphLaunch", launches / NODES, {
        kq.kernelParams = (i_ & 1) ? params : moved;
        for (int k = 0; k < NODES; k++) cuGraphExecKernelNodeSetParams_v2(exec, nodes[k], &kq);
        cuGraphLaunch(exec, s);
        if (i_ % 200 == 199) cuStreamSynchronize(s);
    });
    CHECK(cuStreamSynchronize(s));
    return finish("callcost");
}
