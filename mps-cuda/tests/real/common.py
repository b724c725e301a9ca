"""What every program of the real-programs suite shares: one JSON line of results, printed last.

A program prints `{"program": NAME, "results": {KEY: [numbers...]}, "tolerance": {KEY: RTOL}}`
(a key without a tolerance is compared exactly), or `{"program": NAME, "error": KIND, "message":
TEXT}` when it stops on an error it recognises (KIND "oom" for out-of-memory, as CUDA reports
it), so that the runner tells a clean failure from a crash.
"""

import json
import os
import sys
import traceback


def emit(program, results, tolerance=None):
    out = {"program": program, "results": {}, "tolerance": tolerance or {}}
    for key, value in results.items():
        if hasattr(value, "tolist"):
            value = value.tolist()
        if not isinstance(value, list):
            value = [value]
        out["results"][key] = [float(v) for v in _flatten(value)]
    print(json.dumps(out), flush=True)


def _flatten(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flatten(v)
        else:
            yield v


OOM_WORDS = ("out of memory", "outofmemory", "resource_exhausted", "cuda_error_out_of_memory",
             "cudaerrormemoryallocation", "failed to allocate", "cublas_status_alloc_failed")


def run(program, body):
    """Runs `body()` (which calls `emit`), turning an out-of-memory error into a JSON line."""
    try:
        body()
    except BaseException as e:  # noqa: BLE001 - the runner classifies every failure
        text = f"{type(e).__name__}: {e}"
        kind = "oom" if any(w in text.lower() for w in OOM_WORDS) else "exception"
        traceback.print_exc()
        print(json.dumps({"program": program, "error": kind, "message": text[-600:]}), flush=True)
        sys.exit(3 if kind == "oom" else 1)


def seed_everything(seed=0):
    import random

    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
