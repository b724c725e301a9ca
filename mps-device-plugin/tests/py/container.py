"""An unmodified PyTorch program, run with exactly the environment the device plugin gave a
container: it knows nothing of mps. It checks that its GPU shows the memory limit its pod asked
for, that it may allocate within it and is refused past it, and with --compute that kernels run.
It prints "ready" and waits for a line on standard input before it exits, so that a test can
look at the daemon's status while it is connected.

usage: container.py LIMIT_GIB [--compute]
"""

import sys

import torch

limit = int(sys.argv[1]) << 30
compute = "--compute" in sys.argv[2:]

free, total = torch.cuda.mem_get_info()
assert total == limit, f"total {total}, the pod asked for {limit}"
held = torch.empty(limit // 2, dtype=torch.uint8, device="cuda")
try:
    torch.empty(limit, dtype=torch.uint8, device="cuda")
    raise SystemExit(f"an allocation of {limit} bytes past the limit succeeded")
except torch.OutOfMemoryError:
    pass
if compute:
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    for _ in range(20):
        a = torch.nn.functional.relu(a @ a) / 2048
    torch.cuda.synchronize()
    assert torch.isfinite(a).all().item()
print(f"torch container: device {torch.cuda.get_device_name(0)}, total {total} bytes, "
      "refused past it" + (", kernels ran" if compute else ""), flush=True)
print("ready", flush=True)
sys.stdin.readline()
del held
