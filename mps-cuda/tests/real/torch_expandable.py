"""PyTorch's expandable_segments allocator (virtual memory management: cuMemCreate, cuMemMap...):
tensors of many sizes allocated, used and freed, then a matrix product."""

import os

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402

from common import emit, run  # noqa: E402


def body():
    torch.manual_seed(0)
    kept, total = [], 0.0
    for i in range(200):
        n = (i * 7919) % 5_000_000 + 1024
        t = torch.full((n,), float(i % 13), device="cuda")
        total += t.sum().item()
        if i % 3 == 0:
            kept.append(t)
        if len(kept) > 20:
            kept.pop(0)
    a = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(1)).cuda()
    c = a @ a.t()
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    emit("torch_expandable",
         {"total": total, "mm": c.diagonal()[:8].cpu(),
          "segments": stats.get("num_alloc_retries", 0)},
         {"mm": 1e-3})


run("torch_expandable", body)
