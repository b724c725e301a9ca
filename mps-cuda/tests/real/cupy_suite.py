"""CuPy: RawKernel and ElementwiseKernel (NVRTC), cuBLAS products (fp32, fp16), cuRAND, cuFFT
and its memory pool."""

import cupy as cp

from common import emit, run

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


def body():
    n = 1 << 20
    x = cp.arange(n, dtype=cp.float32) / n
    y = cp.ones(n, dtype=cp.float32)
    out = cp.empty_like(x)
    cp.RawKernel(SAXPY, "saxpy")((n // 256,), (256,), (cp.float32(2.0), x, y, out, cp.int32(n)))
    ew = cp.ElementwiseKernel("float32 a, float32 b", "float32 c", "c = a * a + b", "sq")(x, y)
    a = cp.arange(512 * 512, dtype=cp.float32).reshape(512, 512) % 17 / 17
    mm32 = a @ a.T
    mm16 = (a.astype(cp.float16) @ a.T.astype(cp.float16)).astype(cp.float32)
    rng = cp.random.RandomState(seed=42)
    r = rng.standard_normal(1000, dtype=cp.float32)
    f = cp.fft.fft(cp.sin(cp.arange(1024, dtype=cp.float32) / 10))
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    emit("cupy_suite", {
        "saxpy": float(out.sum()), "elementwise": float(ew.sum()),
        "mm32": mm32.diagonal()[:8].get(), "mm16": float(mm16.sum()),
        "rand": r[:8].get(), "fft": cp.abs(f[:8]).get(), "pool_used": pool.used_bytes() > 0,
    }, {"saxpy": 1e-6, "elementwise": 1e-6, "mm32": 1e-5, "mm16": 1e-2, "fft": 1e-4})


run("cupy_suite", body)
