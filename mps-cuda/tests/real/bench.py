"""Real models at N processes: batch-1 fp16 inference of PyTorch models (an MLP, ResNet-18,
BERT-base), N processes started from one barrier, natively, under NVIDIA's MPS and through mps,
side by side in rounds (each round runs the modes in a rotated order).

    bench.py BIN_DIR OUT_DIR [--models mlp,resnet18,bert] [--clients 1,8,16,32,64]
        [--modes native,nvidia-mps,mps] [--rounds 3] [--seconds 5] [--devices 1]

A mode `mps:ARG,ARG` is mps with those arguments added to every server's (e.g.
`mps:--yield-us=0`), and those of the form NAME=VALUE set in every client's environment (e.g.
`mps:MPS_CLIENT_YIELD_US=0`), to compare settings side by side; a mode `mps@DIR` (or
`mps@DIR:ARG,...`) is mps from the build in BIN_DIR/DIR, to compare builds side by side.
BIN_DIR holds mps-control, mps-server, mps-run and libmpscuda.so of one build. With --devices D
the processes are spread over D GPUs, process i seeing GPU i mod D alone (CUDA_VISIBLE_DEVICES),
as programs choose theirs; one daemon of each kind serves all of them. For each model,
N and mode: requests/s over all processes, the median of the processes' p50 and the largest
p99 latency, how many processes were served (NVIDIA's MPS serves 48 clients), and whether every
process's output checksum matched the first's. Where the time goes, per model, N and mode:
each request's mean time in the forward pass (which queues its work) and in the
synchronisation after it, the clients' CPU time per request, over the timed window the
CPUs the service's own processes used (mps-server, or NVIDIA's daemons) and how busy the
machine's CPUs were, and the requests of the process served least and the slowest request of
all (with when it began), which show a process left behind. Into OUT_DIR: bench.json (every process's
result), bench.md (the medians over rounds, with mps against NVIDIA MPS and native as ratios,
the range over rounds in brackets), each run's stderr, and the services' logs (mps's under
mps-logs/MODE). Where the mps clients have MPS_CLIENT_WAIT_STATS=1 (set in the environment or
as a mode's NAME=VALUE), bench.md adds where their stream waits went: the median process's
mean wait, and its parts before and after the server had taken the commands posted before it.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

from services import MpsDaemon, NvidiaMps, command_env, json_result

HERE = os.path.dirname(os.path.abspath(__file__))


BASES = ("native", "nvidia-mps", "mps")


def parse_modes(text):
    """The modes of `--modes`: comma-separated, where an item that names no base continues the
    mode before it (`nvidia-mps,mps:--spin-us=0,--yield-us=50` is two modes)."""
    modes = []
    for item in text.split(","):
        if item.partition(":")[0].partition("@")[0] in BASES:
            modes.append(item)
        elif modes and ":" in modes[-1]:
            modes[-1] += "," + item
        else:
            raise SystemExit(f"bench.py: {item!r} is not a mode (native, nvidia-mps, mps or mps:ARG,...)")
    return modes


def split_mode(mode, bin_dir):
    """A mode's base (native, nvidia-mps or mps), the folder of its build (`bin_dir`, or
    `bin_dir/DIR` for `mps@DIR`), the server arguments of `mps:ARG,...` and the client
    environment that its NAME=VALUE items set."""
    head, _, extra = mode.partition(":")
    base, _, build = head.partition("@")
    items = [a for a in extra.split(",") if a]
    env = dict(a.split("=", 1) for a in items if not a.startswith("-"))
    return (base, os.path.join(bin_dir, build) if build else bin_dir,
            [a for a in items if a.startswith("-")], env)


# The service's processes, by the name the kernel keeps (15 characters): mps-server, and
# NVIDIA's control daemon and server (both "nvidia-cuda-mps").
SERVICE_NAMES = ("mps-server", "nvidia-cuda-mps")


def machine_ticks():
    """The CPUs' busy and total clock ticks since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


def service_ticks():
    """User and system clock ticks of every live process named in SERVICE_NAMES."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name in SERVICE_NAMES:
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total


def usage_during(seconds):
    """Sleeps `seconds`; how busy the machine's CPUs were meanwhile (a fraction) and how many
    CPUs the service's processes used."""
    m0, s0, t0 = machine_ticks(), service_ticks(), time.monotonic()
    time.sleep(seconds)
    m1, s1, t1 = machine_ticks(), service_ticks(), time.monotonic()
    busy = (m1[0] - m0[0]) / max(1, m1[1] - m0[1])
    return {"cpu_busy": busy,
            "service_cpus": (s1 - s0) / os.sysconf("SC_CLK_TCK") / (t1 - t0)}


def run_n(mode, model, n, seconds, bin_dir, work, err_dir, devices=1):
    """N serving processes from one barrier, process i on GPU i mod `devices`; their JSON
    results (None for one that failed), and the CPUs' use while they served."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    procs = []
    for i in range(n):
        base, build, _, client_env = split_mode(mode, bin_dir)
        cmd, env = command_env(base, build, [sys.executable, os.path.join(HERE, "serve.py"),
                                               "infer", model, work, str(i), str(seconds)],
                               {"CUDA_VISIBLE_DEVICES": str(i % devices), **client_env})
        err = open(os.path.join(err_dir, f"{model}.{mode}.n{n}.p{i}.err"), "wb")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err))
    deadline = time.time() + 240
    while time.time() < deadline:
        ready = sum(os.path.exists(os.path.join(work, f"ready.{i}")) for i in range(n))
        alive = sum(p.poll() is None for p in procs)
        if ready == alive:
            break
        time.sleep(0.1)
    open(os.path.join(work, "go"), "w").close()
    # Inside the window every process serves in, clear of its start and its exit.
    time.sleep(0.05 * seconds)
    usage = usage_during(0.85 * seconds)
    results = [json_result(p, seconds + 120) for p in procs]
    for i, r in enumerate(results):
        if r:
            r.update(wait_split(os.path.join(err_dir, f"{model}.{mode}.n{n}.p{i}.err")))
    return results, usage


WAIT_LINE = re.compile(r"mps client \d+: \d+ stream waits, mean ([\d.]+) us; .* until the server "
                       r"had taken them all: mean ([\d.]+) us, after: ([\d.]+) us")


def wait_split(err_path):
    """The last line a client with MPS_CLIENT_WAIT_STATS=1 wrote of its stream waits: their
    mean, and the parts before and after the server had taken the commands posted before
    each (empty where it wrote none)."""
    try:
        lines = open(err_path, errors="replace").read().splitlines()
    except OSError:
        return {}
    found = [m for m in map(WAIT_LINE.search, lines) if m]
    if not found:
        return {}
    wait, untaken, after = (float(x) for x in found[-1].groups())
    return {"stream_wait_us": wait, "untaken_us": untaken, "after_taken_us": after}


def summary(results, usage):
    ok = [r for r in results if r]
    if not ok:
        return {"served": 0, "of": len(results)}
    return {
        **usage,
        **{k: statistics.median(r[k] for r in ok) for k in ("issue_ms", "wait_ms", "cpu_ms")},
        "served": len(ok), "of": len(results),
        "req_s": sum(r["requests"] / r["seconds"] for r in ok),
        "p50_ms": statistics.median(r["p50_ms"] for r in ok),
        "p99_ms": max(r["p99_ms"] for r in ok),
        # The process served least, and the slowest request of all and when it began.
        "fewest_requests": min(r["requests"] for r in ok),
        **max(({"max_ms": r["max_ms"], "max_at_s": r["max_at_s"]} for r in ok if "max_ms" in r),
              key=lambda m: m["max_ms"], default={}),
        "same_output": len({round(r["checksum"], 2) for r in ok}) == 1,
        # Medians over the processes that wrote their stream waits (MPS_CLIENT_WAIT_STATS=1).
        **{k: statistics.median(r[k] for r in ok if k in r)
           for k in ("stream_wait_us", "untaken_us", "after_taken_us")
           if any(k in r for r in ok)},
        # Every process's own line, in the order started (None for one that failed).
        "processes": results,
    }


def ratio(rows, mode, base, key):
    vals = [r[mode][key] / r[base][key] for r in rows
            if r.get(mode, {}).get(key) and r.get(base, {}).get(key)]
    if not vals:
        return "–"
    return f"{statistics.median(vals):.2f}x ({min(vals):.2f}–{max(vals):.2f})"


def table(all_rounds, models, clients, modes):
    lines = ["| model | N | " + " | ".join(f"{m} req/s" for m in modes) +
             " | mps / NVIDIA MPS | mps / native | p99 ms (" + ", ".join(modes) + ") |",
             "|---" * (len(modes) + 5) + "|"]
    for model in models:
        for n in clients:
            rows = [r[model][str(n)] for r in all_rounds if model in r and str(n) in r[model]]
            cells = []
            for m in modes:
                v = [r[m]["req_s"] for r in rows if r.get(m, {}).get("req_s")]
                served = min((r[m]["served"] for r in rows if m in r), default=0)
                cell = f"{statistics.median(v):.0f}" if v else "failed"
                if served < n:
                    cell += f" ({served}/{n} served)"
                cells.append(cell)
            p99 = ", ".join(
                f"{statistics.median([r[m]['p99_ms'] for r in rows if r.get(m, {}).get('p99_ms')]):.2f}"
                if any(r.get(m, {}).get("p99_ms") for r in rows) else "–" for m in modes)
            lines.append(f"| {model} | {n} | " + " | ".join(cells) +
                         f" | {ratio(rows, 'mps', 'nvidia-mps', 'req_s')}"
                         f" | {ratio(rows, 'mps', 'native', 'req_s')} | {p99} |")
    return "\n".join(lines) + "\n"


def time_table(all_rounds, models, clients, modes):
    """Where the time goes: medians over rounds of each mode's per-request figures."""
    keys = ("req_s", "issue_ms", "wait_ms", "cpu_ms", "service_cpus", "cpu_busy",
            "fewest_requests", "max_ms", "max_at_s")
    lines = ["| model | N | mode | req/s | forward ms | synchronise ms | client CPU ms/request "
             "| service CPUs | machine CPUs busy | fewest requests of a process "
             "| slowest request ms (began at s) |", "|---" * 11 + "|"]
    for model in models:
        for n in clients:
            rows = [r[model][str(n)] for r in all_rounds if model in r and str(n) in r[model]]
            for m in modes:
                vals = {k: [r[m][k] for r in rows if r.get(m, {}).get(k) is not None]
                        for k in keys}
                if not vals["req_s"]:
                    continue
                med = {k: statistics.median(v) if v else float("nan") for k, v in vals.items()}
                lines.append(f"| {model} | {n} | {m} | {med['req_s']:.0f} | {med['issue_ms']:.2f} "
                             f"| {med['wait_ms']:.2f} | {med['cpu_ms']:.2f} "
                             f"| {med['service_cpus']:.2f} | {100 * med['cpu_busy']:.0f}% "
                             f"| {med['fewest_requests']:.0f} "
                             f"| {med['max_ms']:.1f} ({med['max_at_s']:.2f}) |")
    return "\n".join(lines) + "\n"


def wait_table(all_rounds, models, clients, modes):
    """Where the stream waits went, for the modes whose clients wrote them: medians over
    rounds of the processes' medians ("" when none did)."""
    keys = ("stream_wait_us", "untaken_us", "after_taken_us")
    lines = []
    for model in models:
        for n in clients:
            rows = [r[model][str(n)] for r in all_rounds if model in r and str(n) in r[model]]
            for m in modes:
                vals = [[r[m][k] for r in rows if k in r.get(m, {})] for k in keys]
                if all(vals):
                    med = [statistics.median(v) for v in vals]
                    lines.append(f"| {model} | {n} | {m} | {med[0]:.1f} | {med[1]:.1f} "
                                 f"| {med[2]:.1f} |")
    if not lines:
        return ""
    return "\n".join(["| model | N | mode | stream wait us | until the server had taken the "
                      "commands before it | after |", "|---" * 6 + "|"] + lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--models", default="mlp,resnet18,bert")
    ap.add_argument("--clients", default="1,8,16,32,64")
    ap.add_argument("--modes", default="native,nvidia-mps,mps")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--devices", type=int, default=1)
    a = ap.parse_args()
    bin_dir, out = os.path.abspath(a.bin_dir), os.path.abspath(a.out_dir)
    os.makedirs(os.path.join(out, "err"), exist_ok=True)
    models, modes = a.models.split(","), parse_modes(a.modes)
    clients = [int(n) for n in a.clients.split(",")]
    all_rounds = []
    for rnd in range(a.rounds):
        order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
        results = {}
        for mode in order:
            base, build, server_args, _ = split_mode(mode, bin_dir)
            # Each mps mode logs apart, so that a build's server logs say what it did.
            logs = os.path.join(out, "mps-logs", re.sub(r"[^A-Za-z0-9_.=-]", "_", mode))
            service = (MpsDaemon(build, logs, server_args)
                       if base == "mps" else
                       NvidiaMps(os.path.join(out, "nvidia-logs")) if mode == "nvidia-mps" else None)
            try:
                for model in models:
                    for n in clients:
                        r, usage = run_n(mode, model, n, a.seconds, bin_dir,
                                         "/tmp/mps-real-bench", os.path.join(out, "err"),
                                         a.devices)
                        s = summary(r, usage)
                        results.setdefault(model, {}).setdefault(str(n), {})[mode] = s
                        brief = {k: v for k, v in s.items() if k != "processes"}
                        print(f"round {rnd} {mode} {model} N={n}: {json.dumps(brief)}",
                              file=sys.stderr, flush=True)
            finally:
                if service:
                    service.stop()
        all_rounds.append(results)
        json.dump({"rounds": all_rounds, "args": vars(a)},
                  open(os.path.join(out, "bench.json"), "w"), indent=1)
    md = table(all_rounds, models, clients, modes) + "\n" + time_table(all_rounds, models,
                                                                         clients, modes)
    waits = wait_table(all_rounds, models, clients, modes)
    if waits:
        md += "\n" + waits
    open(os.path.join(out, "bench.md"), "w").write(md)
    print(md)


if __name__ == "__main__":
    main()
