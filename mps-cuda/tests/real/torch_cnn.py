"""torchvision's ResNet-18 (random weights, eval), batch 4 of 224x224, fp32 and fp16 (cuDNN)."""

import torch
import torchvision

from common import emit, run


def body():
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    net = torchvision.models.resnet18(weights=None).cuda().eval()
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        y32 = net(x)
        y16 = net.half()(x.half()).float()
    torch.cuda.synchronize()
    emit("torch_cnn", {"fp32": y32[:, :16].cpu(), "fp16": y16[:, :16].cpu(),
                       "fp32_sum": y32.sum().item()},
         {"fp32": 1e-3, "fp16": 2e-2, "fp32_sum": 1e-3})


run("torch_cnn", body)
