"""torch.compile (Inductor: Triton kernels loaded from files) of a small MLP with pointwise work."""

import torch
from torch import nn

from common import emit, run


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(512, 512)
        self.b = nn.Linear(512, 256)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.a(x)) * torch.sigmoid(x) + 0.5
        return torch.tanh(self.b(h)).softmax(dim=-1)


def body():
    torch.manual_seed(0)
    net = Net().cuda().eval()
    fast = torch.compile(net)
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        eager = net(x)
        y = fast(x)
        y = fast(x)
    torch.cuda.synchronize()
    diff = (y - eager).abs().max().item()
    emit("torch_compile", {"out": y[:4, :8].cpu(), "sum": y.sum().item(), "eager_ok": diff < 1e-3},
         {"out": 1e-3, "sum": 1e-4})


run("torch_compile", body)
