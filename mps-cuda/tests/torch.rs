//! PyTorch, unmodified, through mps on the simulator: `tests/py/torch_sim.py` run through
//! `mps-run` against a control daemon. The simulator runs none of PyTorch's kernels, so the
//! checks are what launches none: devices and their properties, allocations and copies with
//! values checked, `mem_get_info` and `OutOfMemoryError` under a client memory limit, streams
//! with priorities and timed events, `CUDAGraph` (whose capture needs a PyTorch kernel: the
//! error must name it), and a PyTorch process killed while it holds device memory, whose memory
//! the server takes back.
//!
//! Python with torch is `$MPS_TEST_TORCH_PYTHON` (`.ci/run` installs it with `scripts/torch-env`),
//! else `python3` if it can import torch; without one each test says it skipped (`SKIPPED: ...`,
//! and in `$MPS_TEST_SKIP_LOG`), which fails under CI.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use common::{DEADLINE, Daemon, built, crate_dir, skip};

/// PyTorch's stream pools: 32 streams for each of its priority levels, more than the server's
/// default of 64 per client.
const SERVER_ARGS: &[&str] = &["--max-streams", "255"];

/// The Python that can import torch, or `None` after saying why the test skips.
fn torch_python(test: &str) -> Option<String> {
    let given = std::env::var("MPS_TEST_TORCH_PYTHON").ok();
    let python = given.clone().unwrap_or_else(|| "python3".into());
    let imports = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    match (imports, given) {
        (true, _) => Some(python),
        (false, Some(p)) => panic!("MPS_TEST_TORCH_PYTHON={p} cannot import torch"),
        (false, None) => {
            skip(
                test,
                "no Python with torch (python3 cannot import it; scripts/torch-env installs \
                 one, and MPS_TEST_TORCH_PYTHON names it)",
            );
            None
        }
    }
}

fn script() -> PathBuf {
    crate_dir().join("tests/py/torch_sim.py")
}

fn mps_run(python: &str, dir: &Path, mode: &str) -> Command {
    let mut c = Command::new(built().join("mps-run"));
    c.arg(python)
        .arg(script())
        .arg(mode)
        .env("MPS_PIPE_DIRECTORY", dir)
        .env("MPS_CUDA_LOG", "1")
        .env("CUDA_VISIBLE_DEVICES", "0");
    c
}

#[test]
fn pytorch_copies_memory_limits_streams_events_and_graphs_on_the_simulator() {
    let test = "pytorch_copies_memory_limits_streams_events_and_graphs_on_the_simulator";
    let Some(python) = torch_python(test) else {
        return;
    };
    let daemon = Daemon::start_with(SERVER_ARGS);
    let out: Output = mps_run(&python, &daemon.dir, "checks")
        .env("MPS_PINNED_DEVICE_MEM_LIMIT", "0=256M")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "torch_sim.py failed ({}):\n{stdout}\n{stderr}\ndaemon log:\n{}",
        out.status,
        daemon.log()
    );
    for line in [
        "devices: 1, mps simulator 0",
        "memory: total 268435456, OutOfMemoryError beyond it",
        "streams and events: priorities 0 and -1",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    if stdout.contains("graph: capture needs a PyTorch kernel") {
        // The image of the kernel the capture needed (PyTorch's fill) holds no PTX.
        assert!(
            stderr.contains("the fatbin holds no PTX, and the simulator runs no cubin"),
            "the capture's failure does not say why:\n{stderr}"
        );
    } else {
        assert!(stdout.contains("graph: captured and replayed"), "{stdout}");
    }
}

/// mps-control `status`'s client rows of process `pid`.
fn clients_of(daemon: &Daemon, pid: u32) -> usize {
    let (_, clients) = daemon.status();
    clients
        .iter()
        .filter(|c| c.get("CLIENT-PID").and_then(|p| p.parse().ok()) == Some(pid))
        .count()
}

/// Device 0's free memory, as a client without a limit sees it (the device's).
fn device_free(daemon: &Daemon) -> u64 {
    let c = mps_client::Client::connect_device(Some(&daemon.dir), 0).expect("connect");
    c.mem_get_info().expect("mem_get_info").0
}

#[test]
fn a_killed_pytorch_process_gives_its_memory_back() {
    let test = "a_killed_pytorch_process_gives_its_memory_back";
    let Some(python) = torch_python(test) else {
        return;
    };
    let daemon = Daemon::start_with(SERVER_ARGS);
    let before = device_free(&daemon);
    let mut child = mps_run(&python, &daemon.dir, "hold")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "holding", "the PyTorch process never held");
    let holding = device_free(&daemon);
    assert!(
        before - holding >= 64 << 20,
        "free {holding} while PyTorch holds 64 MiB, {before} before"
    );
    assert_eq!(clients_of(&daemon, pid), 1, "status does not list {pid}");
    // Child::kill is SIGKILL; mps-run executed PyTorch in its own process.
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (gone, free) = (clients_of(&daemon, pid) == 0, device_free(&daemon));
        if gone && free == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after SIGKILL: listed {}, free {free} of {before}\n{}",
            !gone,
            daemon.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
