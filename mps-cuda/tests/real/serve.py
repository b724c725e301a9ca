"""One process of the real-model benchmark (bench.py, qos.py): a model served at batch 1, or a
trainer, started from a barrier.

    serve.py infer MODEL DIR I SECONDS [INTERVAL_MS]
        MODEL (mlp, resnet18, bert) in fp16 at batch 1, warmed up; writes DIR/ready.I, waits
        for DIR/go, then serves requests (one forward pass and a synchronisation each) for
        SECONDS, back to back or one every INTERVAL_MS; prints one JSON line: requests, seconds,
        p50_ms, p99_ms, max_ms, max_at_s and max_issue_ms (the slowest request, when it began, in
        seconds from the start, and how long its forward pass took), issue_ms and wait_ms (the
        mean time a request spends in the forward pass, which queues the work, and in the
        synchronisation after it), cpu_ms (the process's CPU time, all its threads, per
        request), a checksum of the last output and the process id.
    serve.py train DIR I
        ResNet-50, batch 64, AMP, SGD; writes DIR/ready.I after warming up, trains from DIR/go
        until DIR/stop exists; prints one JSON line: iterations, seconds.
"""

import json
import os
import sys
import time

import torch
from torch import nn


def build(name):
    torch.manual_seed(0)
    if name == "mlp":
        layers = []
        for _ in range(12):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        return nn.Sequential(*layers), torch.randn(1, 1024)
    if name == "resnet18":
        import torchvision

        return torchvision.models.resnet18(weights=None), torch.randn(1, 3, 224, 224)
    if name == "bert":
        from transformers import BertConfig, BertModel

        model = BertModel(BertConfig())
        ids = torch.randint(0, 30000, (1, 128), generator=torch.Generator().manual_seed(1))
        return model, ids
    raise SystemExit(f"serve.py: unknown model {name}")


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.0005)


def warmed(model_name):
    """MODEL in fp16 on the GPU with its input, after 20 forward passes and a synchronisation."""
    model, x = build(model_name)
    model = model.half().cuda().eval()
    # BERT's input is token ids; the others' is an fp16 tensor.
    x = x.cuda() if model_name == "bert" else x.half().cuda()
    with torch.no_grad():
        for _ in range(20):
            model(x)
    torch.cuda.synchronize()
    return model, x


def infer(model_name, d, i, seconds, interval_ms=None):
    model, x = warmed(model_name)
    open(os.path.join(d, f"ready.{i}"), "w").close()
    wait_for(os.path.join(d, "go"))
    lat = []
    issue = wait = 0.0
    cpu_began = time.process_time()
    began = time.perf_counter()
    end = began + seconds
    next_at = began
    slowest = (0.0, 0.0, 0.0)
    with torch.no_grad():
        while True:
            if interval_ms:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                next_at += interval_ms / 1000
            s = time.perf_counter()
            y = model(x)
            issued = time.perf_counter()
            torch.cuda.synchronize()
            e = time.perf_counter()
            lat.append(e - s)
            if e - s > slowest[0]:
                slowest = (e - s, s - began, issued - s)
            issue += issued - s
            wait += e - issued
            if e >= end:
                break
    cpu = time.process_time() - cpu_began
    out = y.last_hidden_state if hasattr(y, "last_hidden_state") else y
    n = len(lat)
    lat.sort()
    print(json.dumps({
        "requests": n, "seconds": e - began,
        "p50_ms": 1000 * lat[n // 2], "p99_ms": 1000 * lat[min(n - 1, int(n * 0.99))],
        "max_ms": 1000 * slowest[0], "max_at_s": slowest[1], "max_issue_ms": 1000 * slowest[2],
        "issue_ms": 1000 * issue / n, "wait_ms": 1000 * wait / n, "cpu_ms": 1000 * cpu / n,
        "checksum": float(out.float().sum().item()), "pid": os.getpid(),
    }), flush=True)


def train(d, i):
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet50(weights=None).cuda().train()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(net(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    open(os.path.join(d, f"ready.{i}"), "w").close()
    wait_for(os.path.join(d, "go"))
    began, n = time.perf_counter(), 0
    stop = os.path.join(d, "stop")
    while not os.path.exists(stop):
        step()
        n += 1
        if n % 5 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(json.dumps({"iterations": n, "seconds": time.perf_counter() - began}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "infer":
        interval = float(sys.argv[6]) if len(sys.argv) > 6 else None
        infer(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), interval)
    elif sys.argv[1] == "train":
        train(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
