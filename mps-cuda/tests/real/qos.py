"""A latency client beside training: ResNet-18 at batch 1 (fp16), one request every 2 ms, alone
and beside two ResNet-50 trainers (batch 64, AMP), natively, under NVIDIA's MPS (trainers capped
at 75% and at below-normal priority) and through mps (the trainers at below-normal priority,
capped at 75%, or the latency client holding a reservation of 25% or 10%).

    qos.py BIN_DIR OUT_DIR [--seconds 10] [--rounds 2] [--scenarios 0,2,5]

--scenarios runs only the scenarios of those indexes (in SCENARIOS' order, from 0).

Into OUT_DIR: qos.json (every result) and qos.md: the latency client's p50 and p99 in ms and the
trainers' iterations per second, median over rounds, per scenario.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from services import MpsDaemon, NvidiaMps, command_env, json_result

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = "/tmp/mps-real-qos"

# (name, mode, the latency client's environment, the trainers' environment or None for none).
NV_CAPPED = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75", "CUDA_MPS_CLIENT_PRIORITY": "1"}
SCENARIOS = [
    ("native alone", "native", {}, None),
    ("native beside trainers", "native", {}, {}),
    ("NVIDIA MPS alone", "nvidia-mps", {}, None),
    ("NVIDIA MPS beside trainers", "nvidia-mps", {}, {}),
    ("NVIDIA MPS beside trainers at 75%, below normal", "nvidia-mps", {}, NV_CAPPED),
    ("mps alone", "mps", {}, None),
    ("mps beside trainers", "mps", {}, {}),
    ("mps beside trainers below normal", "mps", {}, {"MPS_CLIENT_PRIORITY": "1"}),
    ("mps beside trainers at 75%, below normal", "mps", {},
     {"MPS_ACTIVE_THREAD_PERCENTAGE": "75", "MPS_CLIENT_PRIORITY": "1"}),
    ("mps reserving 25%, trainers below normal", "mps", {"MPS_SM_RESERVE": "25"},
     {"MPS_CLIENT_PRIORITY": "1"}),
    ("mps reserving 10%, trainers below normal", "mps", {"MPS_SM_RESERVE": "10"},
     {"MPS_CLIENT_PRIORITY": "1"}),
]


def start(mode, bin_dir, args, env, err):
    cmd, e = command_env(mode, bin_dir, [sys.executable, os.path.join(HERE, "serve.py"), *args],
                         env)
    return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=open(err, "wb"))


def wait_ready(names, procs, limit=240):
    deadline = time.time() + limit
    while time.time() < deadline:
        if all(os.path.exists(os.path.join(WORK, f"ready.{n}")) or p.poll() is not None
               for n, p in zip(names, procs)):
            return
        time.sleep(0.1)


def scenario(mode, lat_env, train_env, seconds, bin_dir, err):
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    lat_args = ["infer", "resnet18", WORK, "0", str(seconds), "2"]
    trainers = []
    # A reservation is made when its client connects, before the others (mps keeps the SMs a
    # client was told of).
    lat = start(mode, bin_dir, lat_args, lat_env, f"{err}.latency.err")
    wait_ready([0], [lat])
    if train_env is not None:
        trainers = [start(mode, bin_dir, ["train", WORK, str(i)], train_env,
                          f"{err}.trainer{i}.err") for i in (1, 2)]
        wait_ready([1, 2], trainers)
    open(os.path.join(WORK, "go"), "w").close()
    lat_result = json_result(lat, seconds + 120)
    open(os.path.join(WORK, "stop"), "w").close()
    train_results = [json_result(t, 120) for t in trainers]
    its = [r["iterations"] / r["seconds"] for r in train_results if r]
    return {
        "latency": lat_result,
        "trainers_it_s": sum(its) if train_results and len(its) == len(train_results) else None,
        "trainers_failed": sum(r is None for r in train_results),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--scenarios", default=",".join(str(i) for i in range(len(SCENARIOS))))
    a = ap.parse_args()
    chosen = {int(i) for i in a.scenarios.split(",")}
    bin_dir, out = os.path.abspath(a.bin_dir), os.path.abspath(a.out_dir)
    os.makedirs(os.path.join(out, "err"), exist_ok=True)
    results = {name: [] for i, (name, *_) in enumerate(SCENARIOS) if i in chosen}
    for rnd in range(a.rounds):
        for mode in ("native", "nvidia-mps", "mps"):
            if not any(SCENARIOS[i][1] == mode for i in chosen):
                continue
            service = (MpsDaemon(bin_dir, os.path.join(out, "mps-logs")) if mode == "mps" else
                       NvidiaMps(os.path.join(out, "nvidia-logs")) if mode == "nvidia-mps" else None)
            try:
                for i, (name, m, lat_env, train_env) in enumerate(SCENARIOS):
                    if m != mode or i not in chosen:
                        continue
                    r = scenario(mode, lat_env, train_env, a.seconds, bin_dir,
                                 os.path.join(out, "err", f"r{rnd}.s{i}"))
                    results[name].append(r)
                    print(f"round {rnd}: {name}: {json.dumps(r)}", file=sys.stderr, flush=True)
            finally:
                if service:
                    service.stop()
        json.dump(results, open(os.path.join(out, "qos.json"), "w"), indent=1)
    lines = ["| scenario | latency p50 ms | latency p99 ms | trainers it/s |", "|---|---|---|---|"]

    def med(rs, f):
        v = [f(r) for r in rs if f(r) is not None]
        return f"{statistics.median(v):.2f}" if v else "failed"

    for name, rs in results.items():
        alone = next(t is None for n, _, _, t in SCENARIOS if n == name)
        trainers = "–" if alone else med(rs, lambda r: r["trainers_it_s"])
        lines.append(f"| {name} | {med(rs, lambda r: (r['latency'] or {}).get('p50_ms'))} | "
                     f"{med(rs, lambda r: (r['latency'] or {}).get('p99_ms'))} | {trainers} |")
    md = "\n".join(lines) + "\n"
    open(os.path.join(out, "qos.md"), "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
