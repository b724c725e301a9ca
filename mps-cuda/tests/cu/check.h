// What every runtime-API test program shares: the simulator's kernels (the same names and bodies
// as kernels/test_kernels.cu, which the simulator runs by PTX entry name) and CHECK, which stops
// the program with CUDA's name for a failed call's error.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                             \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define EXPECT(cond)                                                   \
    do {                                                               \
        if (!(cond)) {                                                 \
            printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
            exit(1);                                                   \
        }                                                              \
    } while (0)

extern "C" __global__ void fill_u32(uint32_t *p, uint32_t value, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        p[i] = value;
    }
}

extern "C" __global__ void add_f32(const float *a, const float *b, float *c, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        c[i] = a[i] + b[i];
    }
}

extern "C" __global__ void saxpy_f32(float alpha, const float *x, float *y, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        y[i] = alpha * x[i] + y[i];
    }
}

static __device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void spin_ns(uint64_t ns, uint32_t *counter) {
    uint64_t start = globaltimer_ns();
    while (globaltimer_ns() - start < ns) {
    }
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        atomicAdd(counter, 1u);
    }
}

extern "C" __global__ void fault_write(uint64_t addr) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *(volatile uint32_t *)addr = 0xdeadbeefu;
    }
}

struct Affine {
    float scale;
    float shift;
    uint64_t n;
};

extern "C" __global__ void affine_f32(struct Affine a, const float *x, float *y) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < a.n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        y[i] = a.scale * x[i] + a.shift;
    }
}

extern "C" __global__ void sum_params(uint64_t *out, uint8_t a, uint16_t b, uint32_t c, uint64_t d,
                                      float e, double f, uint8_t g, uint16_t h, uint32_t i,
                                      uint64_t j, uint8_t k, float l) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *out = a + b + c + d + (uint64_t)e + (uint64_t)f + g + h + i + j + k + (uint64_t)l;
    }
}
