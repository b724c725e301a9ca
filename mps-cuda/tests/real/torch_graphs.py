"""An fp16 MLP captured once as a torch.cuda.CUDAGraph on a side stream and replayed 100 times."""

import torch
from torch import nn

from common import emit, run


def body():
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    net = nn.Sequential(*layers).half().cuda().eval()
    static_x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(1)).half().cuda()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            net(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        static_y = net(static_x)
    acc = torch.zeros(8, 1024, device="cuda")
    for i in range(100):
        static_x.copy_(torch.full((8, 1024), (i % 7) / 7.0, device="cuda").half())
        g.replay()
        acc += static_y.float()
    torch.cuda.synchronize()
    emit("torch_graphs", {"acc": acc[:, :8].cpu(), "sum": acc.sum().item()},
         {"acc": 1e-3, "sum": 1e-3})


run("torch_graphs", body)
