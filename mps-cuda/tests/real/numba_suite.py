"""Numba-cuda: a `@cuda.jit` kernel over a device array."""

import numpy as np

# numba-cuda 0.x registers an overload of np.row_stack, which NumPy 2.5 removed (an alias of
# vstack since NumPy 2.0): without the alias numba-cuda fails at import, natively too.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from numba import cuda  # noqa: E402

from common import emit, run


def body():
    @cuda.jit
    def axpb(a, x, b, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i] + b

    x = np.arange(1 << 16, dtype=np.float32)
    d_x = cuda.to_device(x)
    d_out = cuda.device_array_like(d_x)
    axpb[(x.size + 255) // 256, 256](np.float32(3.0), d_x, np.float32(1.0), d_out)
    out = d_out.copy_to_host()
    emit("numba_suite", {"sum": float(out.sum()), "head": out[:8]}, {"sum": 1e-6})


run("numba_suite", body)
