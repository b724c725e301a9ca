"""PyTorch through mps on the simulator: everything that launches none of PyTorch's kernels
(the simulator runs only the project's own). Run through mps-run by tests/torch.rs.

    torch_sim.py checks   the checks below; prints "all checks passed"
    torch_sim.py hold     allocates 64 MiB, prints "holding", and waits for stdin to close

Expects MPS_PINNED_DEVICE_MEM_LIMIT to give device 0 a limit of 256 MiB for `checks`.
"""

import sys

import torch

MIB = 1 << 20
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def devices():
    check(torch.cuda.is_available(), "torch.cuda.is_available()")
    n = torch.cuda.device_count()
    check(n >= 1, f"device_count() is {n}")
    p = torch.cuda.get_device_properties(0)
    check(p.name.startswith("mps simulator"), f"device name {p.name!r}")
    check((p.major, p.minor) == (9, 0), f"compute capability {p.major}.{p.minor}")
    check(p.multi_processor_count >= 1, f"{p.multi_processor_count} SMs")
    check(p.total_memory > 0, f"total memory {p.total_memory}")
    print(f"devices: {n}, {p.name}, {p.multi_processor_count} SMs")


def copies():
    a = torch.arange(1 << 16, dtype=torch.float32)
    d = a.cuda()
    check(d.device.type == "cuda", f"a.cuda() is on {d.device}")
    check(torch.equal(d.cpu(), a), ".cuda() then .cpu() gives the values back")
    e = torch.empty(1 << 16, dtype=torch.float32, device="cuda")
    e.copy_(d)
    check(torch.equal(e.cpu(), a), "copy_ between CUDA tensors")
    half = torch.empty(1 << 15, dtype=torch.float32, device="cuda")
    half.copy_(d[1 << 15 :])
    check(torch.equal(half.cpu(), a[1 << 15 :]), "copy_ from a slice (an offset pointer)")
    # Page-locked memory from PyTorch's host allocator (cuMemHostAlloc), copied both ways
    # without blocking. (Tensor.pin_memory() and is_pinned() ask cuPointerGetAttributes,
    # which mps does not offer.)
    pinned = torch.empty(4096, dtype=torch.int32, pin_memory=True)
    pinned.copy_(torch.arange(4096, dtype=torch.int32))
    p = pinned.to("cuda", non_blocking=True)
    back = torch.zeros(4096, dtype=torch.int32, pin_memory=True)
    back.copy_(p, non_blocking=True)
    torch.cuda.synchronize()
    check(torch.equal(back, pinned), "non_blocking copies to and from pinned memory")
    print("copies: values checked")


def memory():
    free, total = torch.cuda.mem_get_info()
    check(total == 256 * MIB, f"mem_get_info total {total}, the limit is {256 * MIB}")
    x = torch.empty(100 * MIB, dtype=torch.uint8, device="cuda")
    free2, _ = torch.cuda.mem_get_info()
    check(free - free2 >= 100 * MIB, f"free went from {free} to {free2}")
    try:
        torch.empty(300 * MIB, dtype=torch.uint8, device="cuda")
        check(False, "an allocation beyond the limit succeeded")
    except torch.OutOfMemoryError as e:
        check("256.00 MiB" in str(e), f"the OOM message names the limit: {e}")
    del x
    torch.cuda.empty_cache()
    free3, _ = torch.cuda.mem_get_info()
    # empty_cache also returns the blocks cached for the tensors freed earlier.
    check(free3 >= free, f"free {free3} after empty_cache, {free} before")
    print(f"memory: total {total}, OutOfMemoryError beyond it")


def streams_and_events():
    lo, hi = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
    check(lo.priority == 0 and hi.priority == -1, f"priorities {lo.priority}, {hi.priority}")
    src = torch.arange(1 << 20, dtype=torch.float32).cuda()
    dst = torch.empty_like(src)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    hi.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(hi):
        start.record()
        dst.copy_(src)
        end.record()
    end.synchronize()
    check(end.query(), "the end event is complete after synchronize")
    ms = start.elapsed_time(end)
    check(ms >= 0.0, f"elapsed_time {ms}")
    torch.cuda.current_stream().wait_stream(hi)
    check(torch.equal(dst.cpu(), src.cpu()), "a copy on a high-priority stream")
    hi.synchronize()
    torch.cuda.synchronize()
    print(f"streams and events: priorities 0 and -1, elapsed_time {ms:.3f} ms")


def graph():
    src = torch.arange(256, dtype=torch.float32).cuda()
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            dst.copy_(src)
    except torch.AcceleratorError as e:
        # The capture's prologue fills the RNG's seed tensor with one of PyTorch's kernels,
        # whose image holds cubins alone, which the simulator does not run: the driver's own
        # error for an image with no code for the device (the test reads the library's log).
        check(
            "no kernel image is available" in str(e),
            f"the capture fails for want of code for the device: {e}",
        )
        print("graph: capture needs a PyTorch kernel: no kernel image for the device")
        return
    g.replay()
    torch.cuda.synchronize()
    check(torch.equal(dst.cpu(), src.cpu()), "a replayed copy")
    print("graph: captured and replayed")


def hold():
    x = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("holding", flush=True)
    sys.stdin.read()
    del x


def main():
    if sys.argv[1:] == ["hold"]:
        hold()
        return
    devices()
    copies()
    memory()
    streams_and_events()
    graph()
    if failures:
        sys.exit(f"{len(failures)} checks failed")
    print("all checks passed")


main()
