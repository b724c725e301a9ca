"""PyTorch workloads for scripts/torch-gpu (on a GPU machine): run natively, under NVIDIA MPS or
through mps-run, each mode in a process of its own.

    torch_gpu.py outputs FILE       the fp16 MLP and the conv net on fixed inputs, saved to FILE
    torch_gpu.py graph FILE         the MLP captured as a torch.cuda.CUDAGraph and replayed
    torch_gpu.py compare A B        A's outputs against B's, within fp16 tolerance (exit 1 if not)
    torch_gpu.py memory LIMIT_MIB   mem_get_info and OutOfMemoryError under a client limit
    torch_gpu.py bench DIR I SECS   MLP requests for SECS seconds once DIR/go exists (after
                                    writing DIR/ready.I), then one JSON line: requests, seconds
    torch_gpu.py hold               MLP requests until killed, "inferring" printed once started
    torch_gpu.py matmul SECS        fp16 8192x8192 matrix products (cuBLAS, compute-bound) for
                                    SECS seconds: TFLOP/s, which an SM share bounds

Every mode prints one JSON line last (or an "error" in it).
"""

import json
import os
import sys
import time

import torch
from torch import nn

WIDTH, LAYERS = 1024, 12


def mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers).half().cuda().eval()


def convnet():
    torch.manual_seed(1)

    def block(cin, cout, stride):
        return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    layers = block(3, 32, 1) + block(32, 64, 1) + block(64, 64, 2) + block(64, 128, 2)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)]
    net = nn.Sequential(*layers)
    # Statistics of its own, so that batch norm is not the identity.
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return net.half().cuda().eval()


def inputs():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, WIDTH, generator=g).half().cuda()
    img = torch.randn(4, 3, 64, 64, generator=g).half().cuda()
    return x, img


def done(**fields):
    print(json.dumps(fields), flush=True)


def outputs(path):
    torch.backends.cudnn.enabled = True
    x, img = inputs()
    with torch.inference_mode():
        y = mlp()(x)
        z = convnet()(img)
    torch.cuda.synchronize()
    torch.save({"mlp": y.cpu(), "conv": z.cpu()}, path)
    done(saved=path, cudnn=torch.backends.cudnn.version())


def graph(path):
    model = mlp()
    x, _ = inputs()
    static_x = x.clone()
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = model(static_x)
        g.replay()
        torch.cuda.synchronize()
        first = static_y.clone()
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < 2.0:
            g.replay()
            torch.cuda.synchronize()
            n += 1
        rps = n / (time.perf_counter() - t)
    torch.save({"mlp": first.cpu()}, path)
    done(saved=path, replays_per_s=round(rps, 1))


def compare(a, b):
    x, y = torch.load(a), torch.load(b)
    worst = {}
    ok = x.keys() == y.keys()
    for k in x:
        if k not in y or x[k].shape != y[k].shape:
            ok = False
            continue
        d = (x[k].float() - y[k].float()).abs()
        worst[k] = d.max().item()
        ok &= torch.allclose(x[k].float(), y[k].float(), rtol=1e-2, atol=1e-2)
    done(same=bool(ok), max_abs_diff=worst)
    sys.exit(0 if ok else 1)


def memory(limit_mib):
    limit = limit_mib << 20
    free, total = torch.cuda.mem_get_info()
    result = {"free": free, "total": total, "total_is_limit": total == limit}
    x = torch.empty(limit // 2, dtype=torch.uint8, device="cuda")
    result["free_after_half"] = torch.cuda.mem_get_info()[0]
    try:
        torch.empty(limit, dtype=torch.uint8, device="cuda")
        result["oom"] = False
    except torch.OutOfMemoryError:
        result["oom"] = True
    del x
    done(**result)
    sys.exit(0 if result["total_is_limit"] and result["oom"] else 1)


def bench(directory, index, seconds):
    model = mlp()
    x, _ = inputs()
    with torch.inference_mode():
        for _ in range(50):
            model(x)
        torch.cuda.synchronize()
        open(os.path.join(directory, f"ready.{index}"), "w").close()
        go = os.path.join(directory, "go")
        deadline = time.monotonic() + 300
        while not os.path.exists(go):
            if time.monotonic() > deadline:
                done(error="no go within 300 s")
                sys.exit(1)
            time.sleep(0.001)
        n, t = 0, time.perf_counter()
        while time.perf_counter() - t < seconds:
            model(x)
            torch.cuda.synchronize()
            n += 1
        elapsed = time.perf_counter() - t
    done(requests=n, seconds=round(elapsed, 4))


def matmul(seconds):
    n = 8192
    a = torch.randn(n, n, dtype=torch.float16, device="cuda")
    b = torch.randn(n, n, dtype=torch.float16, device="cuda")
    c = a @ b
    torch.cuda.synchronize()
    products, t = 0, time.perf_counter()
    while time.perf_counter() - t < seconds:
        for _ in range(10):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        products += 10
    elapsed = time.perf_counter() - t
    done(products=products, seconds=round(elapsed, 4), tflops=round(2 * n**3 * products / elapsed / 1e12, 1))


def hold():
    model = mlp()
    x, _ = inputs()
    with torch.inference_mode():
        model(x)
        torch.cuda.synchronize()
        print("inferring", flush=True)
        while True:
            model(x)
            torch.cuda.synchronize()


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    try:
        if mode == "outputs":
            outputs(args[0])
        elif mode == "graph":
            graph(args[0])
        elif mode == "compare":
            compare(args[0], args[1])
        elif mode == "memory":
            memory(int(args[0]))
        elif mode == "bench":
            bench(args[0], int(args[1]), float(args[2]))
        elif mode == "matmul":
            matmul(float(args[0]))
        elif mode == "hold":
            hold()
        else:
            sys.exit(f"torch_gpu.py: unknown mode {mode}")
    except Exception as e:  # the one JSON line says what failed
        done(error=f"{type(e).__name__}: {e}"[:2000])
        sys.exit(1)


main()
