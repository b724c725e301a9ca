"""The services the real-program scripts run beside: an mps control daemon of a given build, and
NVIDIA's MPS, each started and stopped by the script (never left running), and the environment
a program gets in each mode."""

import glob
import json
import os
import shutil
import subprocess
import time

MPS_PIPE = "/tmp/mps-real-pipe"
NVIDIA_PIPE = "/tmp/mps-real-nvidia-pipe"


class MpsDaemon:
    """mps-control of the build in `bin_dir`, logging under `logs`; PyTorch's stream pools hold
    32 streams per priority level, more than a client's default 64, hence --max-streams.
    `daemon_args` are further options of mps-control (a configuration file, say)."""

    def __init__(self, bin_dir, logs, server_args=(), daemon_args=()):
        self.bin_dir, self.logs = bin_dir, logs
        shutil.rmtree(MPS_PIPE, ignore_errors=True)
        os.makedirs(MPS_PIPE, mode=0o700)
        os.makedirs(logs, mode=0o700, exist_ok=True)
        log = open(os.path.join(logs, "daemon.stderr"), "ab")
        args = ["--server-arg=--max-streams", "--server-arg=255"]
        args += [f"--server-arg={a}" for a in server_args]
        args += list(daemon_args)
        self.proc = subprocess.Popen(
            [f"{bin_dir}/mps-control", "-f", "--server", f"{bin_dir}/mps-server", "--pipe-dir",
             MPS_PIPE, "--log-dir", logs, *args], stdout=log, stderr=log)
        for _ in range(300):
            if os.path.exists(os.path.join(MPS_PIPE, "control.sock")):
                return
            time.sleep(0.1)
        raise SystemExit(f"mps-control did not start (see {logs})")

    def released(self):
        """Whether the server's logs tell of as many clients disconnected as connected: a
        departed client's release (and its log lines, launch batching's among them) can wait
        for the streams it left busy, and a server that quits first never writes them."""
        connected = disconnected = 0
        for f in glob.glob(os.path.join(self.logs, "server-*.log")):
            with open(f, errors="replace") as log:
                for line in log:
                    connected += "client connected" in line
                    disconnected += "client disconnected" in line
        return disconnected >= connected

    def stop(self):
        # Every client has exited by now; let the server finish releasing them (10 s at most).
        for _ in range(100):
            if self.released():
                break
            time.sleep(0.1)
        subprocess.run([f"{self.bin_dir}/mps-control", "--pipe-dir", MPS_PIPE, "quit"],
                       capture_output=True, timeout=30)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class NvidiaMps:
    """NVIDIA's MPS control daemon, with its pipe and log directories of its own."""

    def __init__(self, logs):
        os.makedirs(NVIDIA_PIPE, exist_ok=True)
        os.makedirs(logs, exist_ok=True)
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=NVIDIA_PIPE,
                        CUDA_MPS_LOG_DIRECTORY=logs)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True)

    def stop(self):
        subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=self.env,
                       capture_output=True, timeout=30)
        for _ in range(100):
            if subprocess.run(["pgrep", "-f", "nvidia-cuda-mps-(server|control)"],
                              capture_output=True).returncode != 0:
                return
            time.sleep(0.1)


def command_env(mode, bin_dir, cmd, extra=None):
    """The command line and environment of `cmd` (a list) in `mode`: native, nvidia-mps or mps
    (through mps-run). `extra` is the mode-independent environment to add."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(extra or {}))
    if mode == "nvidia-mps":
        env["CUDA_MPS_PIPE_DIRECTORY"] = NVIDIA_PIPE
        return cmd, env
    if mode == "mps":
        env.update(MPS_PIPE_DIRECTORY=MPS_PIPE, MPS_CUDA_LOG="1")
        return [f"{bin_dir}/mps-run", *cmd], env
    return cmd, env


def json_result(proc, timeout):
    """The JSON line `proc` printed last, once it exits within `timeout` seconds; None if it
    failed, printed none or overran (then it is killed)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
        line = out.decode().strip().splitlines()[-1] if out.strip() else ""
        return json.loads(line) if proc.returncode == 0 and line.startswith("{") else None
    except (subprocess.TimeoutExpired, ValueError):
        proc.kill()
        proc.wait()
        return None
