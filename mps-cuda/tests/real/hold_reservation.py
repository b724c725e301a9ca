"""A client that holds an SM reservation (MPS_SM_RESERVE in its environment) while the runner's
programs run: it makes a context through the CUDA driver API, then waits until FILE is gone."""

import ctypes
import os
import sys
import time

cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(dev), 0)),
                   ("cuDevicePrimaryCtxRetain", (ctypes.byref(ctx), dev)),
                   ("cuCtxSetCurrent", (ctx,)),
                   ("cuMemAlloc_v2", (ctypes.byref(ptr), ctypes.c_size_t(1 << 20)))):
    rc = getattr(cu, call)(*args)
    if rc != 0:
        print(f"hold_reservation: {call} returned {rc}", flush=True)
        sys.exit(1)
print("holding", flush=True)
while os.path.exists(sys.argv[1]):
    time.sleep(0.1)
