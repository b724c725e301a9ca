"""The training program of the suite in a green context of SMS SMs, natively, in one process (no
mps): whether cuDNN's kernels run on an SM partition under NVIDIA's own driver.

    train_green.py SMS [STEPS]
"""

import json
import sys

import torch

sms = int(sys.argv[1])
steps = sys.argv[2] if len(sys.argv) > 2 else "30"
from torch.cuda import green_contexts  # noqa: E402

torch.cuda.init()
torch.zeros(1, device="cuda")
gc = green_contexts.GreenContext.create(sms, 0)
for name in ("set_context", "make_current"):
    if hasattr(gc, name):
        getattr(gc, name)()
        break
else:
    print(json.dumps({"error": "no way to make the green context current", "api": dir(gc)}))
    sys.exit(1)
print(f"green context of {sms} SMs current", file=sys.stderr, flush=True)
sys.argv = ["torch_train.py", steps]
exec(open(__file__.replace("train_green.py", "torch_train.py")).read())
