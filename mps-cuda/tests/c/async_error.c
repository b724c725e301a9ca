/* A kernel fault, as CUDA reports one: the launch itself succeeds (launches are posted without
 * waiting), the next synchronising call returns CUDA_ERROR_ILLEGAL_ADDRESS, and so does every
 * call after it (the context is lost). Usage: async_error <test_kernels.ptx> */
#include "cuda_api.h"

#define CUDA_ERROR_ILLEGAL_ADDRESS 700

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    char *ptx = read_file(argv[1]);
    CUcontext ctx;
    CUmodule mod;
    CUfunction fault;
    CHECK(cuInit(0));
    CHECK(cuCtxCreate_v2(&ctx, 0, 0));
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fault, mod, "fault_write"));
    uint64_t addr = 0x10; /* not device memory */
    void *params[] = {&addr};
    CHECK(cuLaunchKernel(fault, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    EXPECT(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUdeviceptr p;
    EXPECT(cuMemAlloc_v2(&p, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
    return finish("async_error");
}
