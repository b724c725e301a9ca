// A vector add: cudaMalloc, cudaMemcpy both ways, a launch, cudaFree.
#include "check.h"

int main() {
    const uint64_t n = 1 << 16;
    float *a = (float *)malloc(n * 4), *b = (float *)malloc(n * 4), *c = (float *)malloc(n * 4);
    for (uint64_t i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = 2.0f * i;
    }
    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, n * 4));
    CHECK(cudaMalloc(&db, n * 4));
    CHECK(cudaMalloc(&dc, n * 4));
    CHECK(cudaMemcpy(da, a, n * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b, n * 4, cudaMemcpyHostToDevice));
    add_f32<<<64, 256>>>(da, db, dc, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(c, dc, n * 4, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < n; i++) EXPECT(c[i] == 3.0f * i);
    printf("c[12345] = %.1f\n", c[12345]);
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    printf("%llu elements added\n", (unsigned long long)n);
    printf("vector_add: done\n");
    return 0;
}
