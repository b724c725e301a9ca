// Test kernels of mps. The PTX next to this file is generated from it, on a machine with the
// CUDA toolkit, by:
//
//   nvcc --ptx -arch=compute_75 -o kernels/test_kernels.ptx kernels/test_kernels.cu
//
// The simulator binds each .entry of that PTX, by name, to a CPU implementation with the same
// semantics (mps-server/src/backend/sim/kernels.rs). Every kernel is a grid-stride loop, so its
// result does not depend on the launch geometry.

#include <stdint.h>

extern "C" __global__ void fill_u32(uint32_t *p, uint32_t value, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        p[i] = value;
    }
}

// c = a + b
extern "C" __global__ void add_f32(const float *a, const float *b, float *c, uint64_t n) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        c[i] = a[i] + b[i];
    }
}

// y = alpha * x + y
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

// Each block busy-waits `ns` nanoseconds, then its thread 0 adds 1 to *counter.
extern "C" __global__ void spin_ns(uint64_t ns, uint32_t *counter) {
    uint64_t start = globaltimer_ns();
    while (globaltimer_ns() - start < ns) {
    }
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        atomicAdd(counter, 1u);
    }
}

// Stores to `addr`, to provoke an illegal-address fault when it is not a valid device address.
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

// y = a.scale * x + a.shift: the parameters in a struct passed by value.
extern "C" __global__ void affine_f32(struct Affine a, const float *x, float *y) {
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < a.n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        y[i] = a.scale * x[i] + a.shift;
    }
}

// *out = the sum of the other twelve parameters, of every size and alignment, so that the
// packing of a long parameter list is checked.
extern "C" __global__ void sum_params(uint64_t *out, uint8_t a, uint16_t b, uint32_t c, uint64_t d,
                                      float e, double f, uint8_t g, uint16_t h, uint32_t i,
                                      uint64_t j, uint8_t k, float l) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *out = a + b + c + d + (uint64_t)e + (uint64_t)f + g + h + i + j + k + (uint64_t)l;
    }
}
