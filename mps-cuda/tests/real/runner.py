"""Runs the real-programs suite natively and through mps, and tables the comparison.

    runner.py BIN_DIR OUT_DIR [--modes native,mps,share50,reserve25,memlimit] [--programs a,b]

BIN_DIR holds mps-control, mps-server, mps-run and libmpscuda.so of one build. Each mode runs
every program at once (in parallel: they are clients of one server), each within a time limit.
Modes: `native` (NVIDIA's driver alone); `mps` (through mps-run, whole device); `shareN`
(MPS_ACTIVE_THREAD_PERCENTAGE=N, e.g. share50); `reserveN` (beside a client holding
MPS_SM_RESERVE=N, started first, e.g. reserve25);
`memlimit` (MPS_PINNED_DEVICE_MEM_LIMIT=0=64M: the program must fail as CUDA fails when out of
memory, or run within it). Each result is compared with native's: exactly, or within the
program's stated relative tolerance. Into OUT_DIR: results.json, table.md, each run's output
(PROGRAM.MODE.out/.err) and the daemon's logs.
"""

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time

from services import MPS_PIPE, MpsDaemon, command_env

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAMS = ["torch_cnn", "torch_transformer", "torch_graphs", "torch_compile",
            "torch_expandable", "torch_train", "cupy_suite", "jax_suite", "numba_suite"]
MODES = ["native", "mps", "share50", "reserve25", "memlimit"]
MEMLIMIT = {"MPS_PINNED_DEVICE_MEM_LIMIT": "0=64M"}


def mode_env(mode):
    """The environment a mode adds to its programs."""
    if mode.startswith("share"):
        return {"MPS_ACTIVE_THREAD_PERCENTAGE": mode[len("share"):]}
    return MEMLIMIT if mode == "memlimit" else {}


def launch(program, mode, bin_dir, out_dir):
    # Every mode but native runs through mps, with what the mode adds to the environment.
    cmd, env = command_env("native" if mode == "native" else "mps", bin_dir,
                           [sys.executable, os.path.join(HERE, f"{program}.py")], mode_env(mode))
    base = os.path.join(out_dir, f"{program}.{mode}")
    return subprocess.Popen(cmd, env=env, stdout=open(base + ".out", "wb"),
                            stderr=open(base + ".err", "wb"), start_new_session=True)


def last_json(path):
    try:
        lines = [l for l in open(path, errors="replace").read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def tail(path, n=400):
    try:
        return open(path, errors="replace").read()[-n:].strip().replace("\n", " | ")
    except OSError:
        return ""


def run_mode(mode, programs, bin_dir, pipe, out_dir, limit):
    holder = None
    flag = os.path.join(out_dir, "hold.flag")
    if mode.startswith("reserve"):
        open(flag, "w").close()
        env = dict(os.environ, MPS_PIPE_DIRECTORY=pipe, MPS_SM_RESERVE=mode[len("reserve"):],
                   MPS_CUDA_LOG="1")
        holder = subprocess.Popen([f"{bin_dir}/mps-run", sys.executable,
                                   os.path.join(HERE, "hold_reservation.py"), flag], env=env,
                                  stdout=subprocess.PIPE, stderr=open(
                                      os.path.join(out_dir, "holder.err"), "wb"))
        line = holder.stdout.readline().decode().strip()
        if line != "holding":
            print(f"runner: the reservation holder did not start: {line!r}", file=sys.stderr)
    began = time.time()
    procs = {p: launch(p, mode, bin_dir, out_dir) for p in programs}
    results = {}
    for p, proc in procs.items():
        left = max(1.0, limit - (time.time() - began))
        try:
            rc = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
        base = os.path.join(out_dir, f"{p}.{mode}")
        results[p] = {"rc": rc, "json": last_json(base + ".out"), "err": tail(base + ".err")}
    if holder:
        os.unlink(flag)
        holder.wait(timeout=30)
    print(f"runner: {mode} took {time.time() - began:.1f} s", file=sys.stderr, flush=True)
    return results


def close(a, b, rtol):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if math.isnan(x) and math.isnan(y):
            continue
        if rtol is None:
            if x != y:
                return False
        elif abs(x - y) > rtol * max(abs(x), abs(y), 1e-6) + 1e-6:
            return False
    return True


def verdict(native, run, mode):
    """`same`, `differs: ...`, `fails cleanly (oom)`, or `fails: ...` against native's result."""
    j = run["json"]
    if run["rc"] == "timeout":
        return f"fails: timed out; {run['err'][-200:]}"
    if j is None:
        return f"fails: exit {run['rc']}, no result; {run['err'][-300:]}"
    if "error" in j:
        if j["error"] == "oom":
            return f"fails cleanly (oom): {j['message'][-160:]}"
        return f"fails: {j['message'][-300:]}"
    nj = native["json"] if native else None
    if not nj or "results" not in nj:
        return "ran (native has no result to compare)"
    bad = [k for k, v in nj["results"].items()
           if k not in j["results"] or not close(v, j["results"][k], nj["tolerance"].get(k))]
    if bad:
        k = bad[0]
        return f"differs in {','.join(bad)}: native {nj['results'][k][:4]} mps {j['results'].get(k, [])[:4]}"
    return "same"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--limit", type=float, default=240)
    a = ap.parse_args()
    bin_dir, out_dir = os.path.abspath(a.bin_dir), os.path.abspath(a.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    modes, programs = a.modes.split(","), a.programs.split(",")
    pipe, logs = MPS_PIPE, os.path.join(out_dir, "mps-logs")
    # One compile cache for every mode: torch.compile's Triton kernels are built once, natively.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", "/tmp/mps-real-inductor")
    os.environ.setdefault("TRITON_CACHE_DIR", "/tmp/mps-real-triton")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    all_results = {}
    daemon = None
    try:
        for mode in modes:
            if mode != "native" and daemon is None:
                daemon = MpsDaemon(bin_dir, logs)
            all_results[mode] = run_mode(mode, programs, bin_dir, pipe, out_dir, a.limit)
    finally:
        if daemon is not None:
            daemon.stop()
    table = ["| program | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
    verdicts = {}
    for p in programs:
        native = all_results.get("native", {}).get(p)
        row = []
        for m in modes:
            r = all_results[m][p]
            v = ("ran" if r["json"] and "results" in r["json"] else verdict(None, r, m)) \
                if m == "native" else verdict(native, r, m)
            verdicts.setdefault(p, {})[m] = v
            row.append(v.replace("|", "/"))
        table.append(f"| {p} | " + " | ".join(row) + " |")
    open(os.path.join(out_dir, "table.md"), "w").write("\n".join(table) + "\n")
    json.dump({"results": all_results, "verdicts": verdicts},
              open(os.path.join(out_dir, "results.json"), "w"), indent=1)
    print("\n".join(table))


if __name__ == "__main__":
    main()
