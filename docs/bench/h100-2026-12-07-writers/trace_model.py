"""The driver calls of one request of a real model, natively: serve.py's model (MODEL), warmed up,
then N requests (a forward pass and a synchronisation each) between two marks of trace_driver.c.

    LD_PRELOAD=libtr.so TRACE_OUT=FILE python3 trace_model.py MODEL N
"""

import ctypes
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../../../mps-cuda/tests/real"))
from serve import warmed  # noqa: E402

mark = getattr(ctypes.CDLL(None), "trace_mark", None)


def mk(label):
    if mark:
        mark(label.encode())


name, n = sys.argv[1], int(sys.argv[2])
model, x = warmed(name)
mk("warmup")
with torch.no_grad():
    t = time.perf_counter()
    for _ in range(n):
        model(x)
        torch.cuda.synchronize()
    d = time.perf_counter() - t
    mk(f"steady{n}")
print(f"{name}: {n / d:.0f} requests/s")
