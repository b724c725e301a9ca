"""Hugging Face BERT-base (random weights, eval), 128 tokens, fp32 and fp16 (cuBLAS, cuBLASLt,
scaled-dot-product attention)."""

import torch
from transformers import BertConfig, BertModel

from common import emit, run


def body():
    torch.manual_seed(0)
    model = BertModel(BertConfig()).cuda().eval()
    ids = torch.randint(0, 30000, (2, 128), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        h32 = model(input_ids=ids).last_hidden_state
        h16 = model.half()(input_ids=ids).last_hidden_state.float()
        # Drawn on the host: PyTorch's device generator lays its numbers out by a grid sized
        # from the SM count, so a share of the device would draw other numbers.
        q = torch.randn(2, 12, 128, 64, generator=torch.Generator().manual_seed(2)).half().cuda()
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, q, q).float()
    torch.cuda.synchronize()
    emit("torch_transformer",
         {"fp32": h32[:, 0, :16].cpu(), "fp16": h16[:, 0, :16].cpu(), "sdpa": sdpa.sum().item()},
         {"fp32": 1e-3, "fp16": 3e-2, "sdpa": 1e-2})


run("torch_transformer", body)
