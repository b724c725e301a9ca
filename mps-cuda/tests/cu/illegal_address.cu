// A kernel that writes to an address that is not the program's: the launch itself succeeds, and
// the next synchronising call reports cudaErrorIllegalAddress, as CUDA does.
#include "check.h"

int main() {
    uint32_t *p;
    CHECK(cudaMalloc(&p, 4));
    fault_write<<<1, 1>>>(16);
    printf("launch: %s\n", cudaGetErrorName(cudaGetLastError()));
    cudaError_t e = cudaDeviceSynchronize();
    printf("synchronize: %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
    EXPECT(e == cudaErrorIllegalAddress);
    printf("illegal_address: done\n");
    return 0;
}
