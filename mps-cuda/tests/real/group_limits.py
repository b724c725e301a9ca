"""A group's limits held by several unmodified PyTorch processes through mps-run.

    group_limits.py BIN_DIR OUT_DIR [--clients 4] [--mib 700] [--limit-mib 2048]
                    [--sm reserve:25|share:50]

Starts mps-control with a configuration file of one group, `team`: a device-memory limit
(--limit-mib, summed over its clients) and an SM reservation or share (--sm), admitting this
user only. Runs --clients PyTorch processes (group_client.py) through mps-run in that group
(MPS_GROUP=team) and one more in the default group, each from a barrier. One after another, each
team process allocates --mib MiB; the daemon's `get_server_list` is read before and after each.

Checks: every team process is told the SM count of the group's part
(torch.cuda.get_device_properties(0).multi_processor_count), as `get_server_list` gives it, and
less than the device has; a process is served exactly when its allocation fits the group's
limit beside what the group holds, and is refused with torch.cuda.OutOfMemoryError otherwise
(at least one is, since the processes together ask for more than the limit); the group never
holds more than its limit; the default group's process gets its memory while the team is full;
every process finishes with correct matrix products and its tensor intact; `status` shows the
group's row. Prints a table, writes OUT_DIR/group_limits.json, .md and the daemon's status, and
exits 1 if any check failed (2 if the run itself could not be made).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from services import MPS_PIPE, MpsDaemon, command_env

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = "/tmp/mps-real-groups"
MIB = 1 << 20
GROUP = "team"
# Within this of the limit, either outcome of an allocation is accepted: what else the process
# allocates at that moment (a reduction's few bytes) is not known to the byte.
SLACK = 4 * MIB


def native_sms():
    """The device's SM count, as PyTorch sees it natively (no mps)."""
    out = subprocess.run(
        [sys.executable, "-c",
         "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)"],
        capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"group_limits: PyTorch cannot see a GPU natively: {out.stderr[-600:]}")
    return int(out.stdout.strip().splitlines()[-1])


def write_config(limit, sm):
    """The daemon's configuration file, in a directory only this user can write (the daemon
    refuses a file that others could change)."""
    kind, _, percent = sm.partition(":")
    key = {"reserve": "sm_reservation", "share": "active_thread_percentage"}.get(kind)
    if key is None or not percent.isdigit() or not 1 <= int(percent) <= 99:
        raise SystemExit(f"group_limits: --sm {sm}: give reserve:P or share:P, P from 1 to 99")
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    conf_dir = os.path.join(WORK, "etc")
    os.makedirs(conf_dir)
    os.chmod(WORK, 0o755)
    os.chmod(conf_dir, 0o755)
    path = os.path.join(conf_dir, "mps.toml")
    with open(path, "w") as f:
        f.write(f"# group_limits.py: one group of this user, its memory summed over its clients\n"
                f"[groups.{GROUP}]\n"
                f"device_mem_limit = {limit}\n"
                f"{key} = {int(percent)}\n"
                f"uids = [{os.getuid()}]\n")
    os.chmod(path, 0o644)
    return path, kind, int(percent)


def ctl(bin_dir, *words):
    out = subprocess.run([f"{bin_dir}/mps-control", "--pipe-dir", MPS_PIPE, *words],
                         capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"mps-control {' '.join(words)}: {out.stderr.strip()}")
    return out.stdout


def group_use(bin_dir):
    """The team server's words in get_server_list: clients, mem (held and limit), sms."""
    listing = ctl(bin_dir, "get_server_list")
    for line in listing.splitlines():
        words = line.split()
        if f"group={GROUP}" in words:
            use = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            held, limit = use["mem"].split("/")
            return {"pid": int(words[0]), "held": int(held),
                    "limit": None if limit == "none" else int(limit), "sms": int(use["sms"]),
                    "clients": use["clients"], "sm_range": use.get("sm_range"), "line": line}
    raise RuntimeError(f"no server of group {GROUP} in get_server_list:\n{listing}")


def wait_files(names, procs, limit):
    """Waits until WORK/NAME exists for each name; the JSON of each, or None where its process
    exited first or the time ran out."""
    deadline = time.time() + limit
    found = {}
    while time.time() < deadline and len(found) < len(names):
        for name, proc in zip(names, procs):
            path = os.path.join(WORK, name)
            if name not in found and os.path.exists(path):
                with open(path) as f:
                    found[name] = json.load(f)
            elif name not in found and proc.poll() is not None:
                found[name] = None
        time.sleep(0.05)
    return [found.get(n) for n in names]


def last_json(proc, timeout):
    """The JSON line `proc` printed last once it exits within `timeout` seconds (killed if it
    overruns), with its exit status; None if it printed none."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    lines = [line for line in out.decode(errors="replace").splitlines() if line.startswith("{")]
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    if result is not None:
        result["exit"] = proc.returncode
        if proc.returncode != 0 and "error" not in result:
            result["error"] = f"exit status {proc.returncode}"
    return result


def mib(n):
    return "-" if n is None else f"{n / MIB:.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bin_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--mib", type=int, default=700)
    ap.add_argument("--limit-mib", type=int, default=2048)
    ap.add_argument("--sm", default="reserve:25")
    a = ap.parse_args()
    bin_dir, out_dir = os.path.abspath(a.bin_dir), os.path.abspath(a.out_dir)
    for f in ("mps-control", "mps-server", "mps-run", "libmpscuda.so"):
        if not os.path.exists(os.path.join(bin_dir, f)):
            raise SystemExit(f"group_limits: {bin_dir} has no {f} (scripts/test-gpu build)")
    limit, ask = a.limit_mib * MIB, a.mib * MIB
    if a.clients * ask <= limit:
        raise SystemExit("group_limits: the clients together must ask for more than the limit")
    os.makedirs(out_dir, exist_ok=True)
    device_sms = native_sms()
    config, sm_kind, sm_percent = write_config(limit, a.sm)
    names = [f"team{i}" for i in range(a.clients)] + ["outsider"]
    daemon = MpsDaemon(bin_dir, os.path.join(out_dir, "logs"), daemon_args=["--config", config])
    procs, results, readings, failures, fatal = [], {}, [], [], None
    try:
        for name in names:
            extra = {"MPS_GROUP": GROUP} if name != "outsider" else {}
            cmd, env = command_env("mps", bin_dir, [sys.executable,
                                   os.path.join(HERE, "group_client.py"), WORK, name,
                                   str(a.mib)], extra)
            if name == "outsider":
                env.pop("MPS_GROUP", None)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=open(os.path.join(out_dir, f"{name}.err"),
                                                      "wb")))
        ready = wait_files([f"ready.{n}" for n in names], procs, 300)
        if None in ready:
            late = [n for n, r in zip(names, ready) if r is None]
            raise RuntimeError(f"{late} did not start (see their .err files in {out_dir})")
        sms = dict(zip(names, (r["sms"] for r in ready)))
        first = group_use(bin_dir)
        allocs = {}
        # One after another, so that which one goes over is known.
        for name, proc in zip(names, procs):
            before = group_use(bin_dir)
            open(os.path.join(WORK, f"go.{name}"), "w").close()
            [allocs[name]] = wait_files([f"alloc.{name}"], [proc], 120)
            after = group_use(bin_dir)
            readings.append({"name": name, "before": before["held"], "after": after["held"],
                             "limit": after["limit"], "line": after["line"]})
            if allocs[name] is None:
                raise RuntimeError(f"{name} ended before it said what its allocation got")
        status = ctl(bin_dir, "status")
        with open(os.path.join(out_dir, "status.txt"), "w") as f:
            f.write(status)
        open(os.path.join(WORK, "finish"), "w").close()
        for name, proc in zip(names, procs):
            results[name] = last_json(proc, 300)
    except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        fatal = f"{type(e).__name__}: {e}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        daemon.stop()
    if fatal:
        print(f"group_limits: the run could not be made: {fatal}", file=sys.stderr)
        sys.exit(2)

    def check(ok, what):
        if not ok:
            failures.append(what)

    team = [n for n in names if n != "outsider"]
    # SMs: each team process is told its group's part, less than the device.
    check(first["limit"] == limit, f"get_server_list gives the limit {first['limit']}, "
                                   f"not {limit}")
    low = device_sms * sm_percent // 100
    for n in team:
        check(sms[n] == first["sms"], f"{n} was told {sms[n]} SMs, the group has "
                                      f"{first['sms']}")
    check(low <= first["sms"] < device_sms and first["sms"] <= low + 16,
          f"{sm_kind} {sm_percent}% of {device_sms} SMs gave the group {first['sms']}")
    if sm_kind == "reserve":
        check(sms["outsider"] <= device_sms - first["sms"],
              f"the default group was told {sms['outsider']} SMs, more than the "
              f"{device_sms - first['sms']} the reservation leaves")
    # Memory: served exactly when the allocation fits beside what the group holds.
    refused = 0
    for r in readings:
        n, got = r["name"], allocs[r["name"]]
        check(r["after"] <= limit, f"after {n}, the group holds {r['after']} bytes, past its "
                                   f"limit {limit}")
        if n == "outsider":
            check(got["allocated"], f"the default group's process was refused {a.mib} MiB "
                                    f"while the team was at its limit")
            continue
        fits = r["before"] + ask <= limit
        if got["oom"]:
            refused += 1
            check(got.get("oom_type") == "OutOfMemoryError",
                  f"{n} was refused with {got.get('oom_type')}, not torch.cuda.OutOfMemoryError")
        if abs(r["before"] + ask - limit) > SLACK:
            check(got["allocated"] == fits,
                  f"{n}: the group held {mib(r['before'])} MiB of {mib(limit)}, {a.mib} MiB more "
                  f"{'fits' if fits else 'does not fit'}, yet it was "
                  f"{'served' if got['allocated'] else 'refused'}")
    check(refused >= 1, f"no team process was refused, though together they asked "
                        f"{a.clients * a.mib} MiB of a {a.limit_mib} MiB limit")
    # Every process unharmed: right products, its memory intact.
    for n in names:
        res = results.get(n)
        if res is None or "error" in res:
            check(False, f"{n} failed: {res and res.get('error')} (see {n}.err)")
            continue
        for key in ("error_before", "error_after"):
            check(res[key] < 1e-4, f"{n}: a product differs from the CPU's by {res[key]:.2e}")
        if res.get("allocated"):
            check(res.get("data_ok"), f"{n}: its tensor no longer holds what it wrote")
    check(f"\n{GROUP} " in status or status.startswith(f"{GROUP} "),
          "status has no row for the group")

    rows = ["| process | group | SMs told | allocation | group held before / after (MiB) "
            "| products | exit |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in readings:
        n, got, res = r["name"], allocs[r["name"]], results.get(r["name"]) or {}
        outcome = f"{a.mib} MiB" if got["allocated"] else f"refused ({got.get('oom_type')})"
        held = (f"{mib(r['before'])} / {mib(r['after'])}" if n != "outsider" else "-")
        worst = max(res.get("error_before", 1), res.get("error_after", 1))
        rows.append(f"| {n} | {'default' if n == 'outsider' else GROUP} | {sms[n]} | {outcome} "
                    f"| {held} | {'ok' if worst < 1e-4 else 'WRONG'} ({worst:.1e}) "
                    f"| {'ok' if res and 'error' not in res else 'failed'} |")
    summary = (f"device {device_sms} SMs; group {GROUP}: {sm_kind} {sm_percent}% -> "
               f"{first['sms']} SMs, limit {a.limit_mib} MiB; {a.clients} processes of "
               f"{a.mib} MiB each; {refused} refused")
    table = "\n".join(rows)
    verdict = "all checks passed" if not failures else "FAILED:\n- " + "\n- ".join(failures)
    print(f"{summary}\n\n{table}\n\n{verdict}")
    with open(os.path.join(out_dir, "group_limits.md"), "w") as f:
        f.write(f"{summary}\n\n{table}\n\n{verdict}\n\n```\n{status}```\n")
    with open(os.path.join(out_dir, "group_limits.json"), "w") as f:
        json.dump({"device_sms": device_sms, "group": first, "sms": sms, "allocs": allocs,
                   "readings": readings, "results": results, "failures": failures}, f, indent=1)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
