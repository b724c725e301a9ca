"""The driver calls of one request of a real model, natively: serve.py's model (MODEL), warmed up,
then N requests (a forward pass and a synchronisation each) between two marks of trace_driver.c.

    LD_PRELOAD=libtr.so TRACE_OUT=FILE python3 trace_model.py MODEL N
"""

import ctypes
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../mps-cuda/tests/real"))
from serve import build  # noqa: E402

mark = getattr(ctypes.CDLL(None), "trace_mark", None)


def mk(label):
    if mark:
        mark(label.encode())


name, n = sys.argv[1], int(sys.argv[2])
model, x = build(name)
model = model.half().cuda().eval()
x = x.cuda() if name == "bert" else x.half().cuda()
with torch.no_grad():
    for _ in range(20):
        model(x)
    torch.cuda.synchronize()
    mk("warmup")
    t = time.perf_counter()
    for _ in range(n):
        model(x)
        torch.cuda.synchronize()
    d = time.perf_counter() - t
    mk(f"steady{n}")
print(f"{name}: {n / d:.0f} requests/s")
