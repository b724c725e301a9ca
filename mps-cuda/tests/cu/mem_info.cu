// cudaMemGetInfo: free and total memory (a client's limit under MPS), and an allocation larger
// than what is free refused with cudaErrorMemoryAllocation.
#include "check.h"

int main() {
    size_t free0 = 0, total = 0, free1 = 0;
    CHECK(cudaMemGetInfo(&free0, &total));
    EXPECT(free0 <= total && total > 0);
    void *p;
    CHECK(cudaMalloc(&p, 16 << 20));
    CHECK(cudaMemGetInfo(&free1, &total));
    EXPECT(free1 <= free0 - (16 << 20));
    void *q = NULL;
    cudaError_t e = cudaMalloc(&q, free1 + (64 << 20));
    printf("allocating more than is free: %s\n", cudaGetErrorName(e));
    EXPECT(e == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaFree(p));
    printf("total %zu MiB\n", total >> 20);
    printf("mem_info: done\n");
    return 0;
}
