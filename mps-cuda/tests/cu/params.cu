// Kernel parameters as cudart packs them: a struct passed by value, and a long list of
// parameters of every size and alignment.
#include "check.h"

int main() {
    const uint64_t n = 1000;
    float *x, *y, *h = (float *)malloc(n * 4);
    for (uint64_t i = 0; i < n; i++) h[i] = (float)i;
    CHECK(cudaMalloc(&x, n * 4));
    CHECK(cudaMalloc(&y, n * 4));
    CHECK(cudaMemcpy(x, h, n * 4, cudaMemcpyHostToDevice));
    Affine a = {0.5f, 3.0f, n};
    affine_f32<<<4, 128>>>(a, x, y);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h, y, n * 4, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < n; i++) EXPECT(h[i] == 0.5f * i + 3.0f);
    printf("struct: y[999] = %.1f\n", h[999]);

    uint64_t *out, sum = 0;
    CHECK(cudaMalloc(&out, 8));
    sum_params<<<1, 1>>>(out, 1, 20, 300, 4000000000ull, 5.5f, 60.25, 7, 800, 9000, 1ull << 40, 11,
                         12.75f);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(&sum, out, 8, cudaMemcpyDeviceToHost));
    uint64_t want = 1 + 20 + 300 + 4000000000ull + 5 + 60 + 7 + 800 + 9000 + (1ull << 40) + 11 + 12;
    EXPECT(sum == want);
    printf("many parameters: sum %llu\n", (unsigned long long)sum);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(out));
    printf("params: done\n");
    return 0;
}
