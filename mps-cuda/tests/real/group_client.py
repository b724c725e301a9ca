"""One process of group_limits.py: an unmodified PyTorch program that knows nothing of mps.

    group_client.py DIR NAME MIB

It initialises CUDA, checks a matrix product against the CPU's and writes DIR/ready.NAME (JSON:
the SM count the device reports to it); waits for DIR/go.NAME, then allocates MIB MiB of device
memory in one tensor and fills it, and writes DIR/alloc.NAME (JSON: whether it got the memory,
or the out-of-memory error PyTorch raised); waits for DIR/finish, then checks a second product
and that its tensor still holds what it wrote, and prints one JSON line of all it saw.
It exits 0 whether or not it got the memory (being refused is what the caller may expect), and
non-zero on any other failure.
"""

import json
import os
import sys
import time
import traceback

import torch

DIR, NAME, MIB = sys.argv[1], sys.argv[2], int(sys.argv[3])
FILL = 7
# Plain float32 products, so that the CPU's are a reference to a tight tolerance.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def write(name, value):
    tmp = os.path.join(DIR, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.rename(tmp, os.path.join(DIR, name))


def wait_for(name, limit=600):
    deadline = time.time() + limit
    while not os.path.exists(os.path.join(DIR, name)):
        if time.time() > deadline:
            raise TimeoutError(f"{NAME}: no {name} within {limit} s")
        time.sleep(0.05)


def product_error(n, seed):
    """The largest difference, relative to the largest entry, between a product of two n x n
    matrices on the device and on the CPU."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    on_device = (a.cuda() @ b.cuda()).cpu()
    reference = a @ b
    return float((on_device - reference).abs().max() / reference.abs().max())


def is_oom(e):
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or "out of memory" in str(e).lower()


def main():
    out = {"name": NAME, "pid": os.getpid()}
    torch.cuda.init()
    out["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    out["error_before"] = product_error(1024, 1)
    torch.cuda.synchronize()
    write(f"ready.{NAME}", {"sms": out["sms"]})
    wait_for(f"go.{NAME}")
    held = None
    try:
        held = torch.empty(MIB << 20, dtype=torch.uint8, device="cuda")
        held.fill_(FILL)
        torch.cuda.synchronize()
        out["allocated"], out["oom"] = True, False
    except Exception as e:  # noqa: BLE001 - only out-of-memory is an expected outcome
        if not is_oom(e):
            raise
        out["allocated"], out["oom"] = False, True
        out["oom_type"] = type(e).__name__
        out["oom_message"] = str(e)[:300]
    write(f"alloc.{NAME}", {"allocated": out["allocated"], "oom": out["oom"],
                            "oom_type": out.get("oom_type")})
    wait_for("finish")
    # Of the first product's size: its blocks, cached by PyTorch, take no more device memory
    # from a group that may be at its limit now.
    out["error_after"] = product_error(1024, 2)
    if held is not None:
        # Its smallest and largest bytes: reductions that take no tensor of its size (a sum of
        # uint8 would make an int64 copy, 8 times the group's room).
        out["data_ok"] = int(held.min().item()) == FILL == int(held.max().item())
        del held
    torch.cuda.synchronize()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException as e:  # noqa: BLE001 - the caller reads the reason
        traceback.print_exc()
        print(json.dumps({"name": NAME, "error": f"{type(e).__name__}: {e}"[-600:]}), flush=True)
        sys.exit(1)
