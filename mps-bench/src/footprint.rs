//! GPU memory held by a group's processes, from `nvidia-smi`: per process where the driver lists
//! them (`--query-compute-apps`), and the device-wide figure beside it, clearly named as such.
//! Each is polled until two readings in a row agree (contexts are still being built when the
//! clients say ready), with a deadline, rather than read once after a fixed sleep.

use std::process::Command;
use std::time::{Duration, Instant};

/// How long a reading may take to settle.
const DEADLINE: Duration = Duration::from_secs(15);
const EVERY: Duration = Duration::from_millis(200);

/// What a group's processes hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Footprint {
    /// The memory the driver attributes to the group's processes (clients and service), and
    /// how many of them it lists; None where it lists none of them (no per-process accounting
    /// here, e.g. in a container that does not see the host's pids).
    pub(crate) per_process: Option<(f64, usize)>,
    /// Memory in use on the whole device (every process, this run's or not), in MiB.
    pub(crate) device_wide_mib: Option<f64>,
    /// Whether both readings settled before the deadline.
    pub(crate) stable: bool,
}

fn nvidia_smi(query: &str) -> Option<String> {
    let out = Command::new("nvidia-smi")
        .args([query, "--format=csv,noheader,nounits"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Memory in use on device 0, in MiB.
pub(crate) fn device_used_mib() -> Option<f64> {
    nvidia_smi("--query-gpu=memory.used")?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The memory (MiB) and count of the compute processes among `pids` the driver lists.
fn of_processes(pids: &[u32]) -> Option<(f64, usize)> {
    let listed = nvidia_smi("--query-compute-apps=pid,used_memory")?;
    let ours: Vec<f64> = listed
        .lines()
        .filter_map(|l| {
            let (pid, mib) = l.split_once(',')?;
            let pid: u32 = pid.trim().parse().ok()?;
            pids.contains(&pid).then(|| mib.trim().parse().ok())?
        })
        .collect();
    (!ours.is_empty()).then(|| (ours.iter().sum(), ours.len()))
}

/// Polls `read` until two readings in a row agree or the deadline passes; returns the last
/// reading and whether it settled.
pub(crate) fn settled<T: PartialEq>(read: impl Fn() -> T) -> (T, bool) {
    let t = Instant::now();
    let mut last = read();
    loop {
        std::thread::sleep(EVERY);
        let now = read();
        if now == last {
            return (now, true);
        }
        if t.elapsed() > DEADLINE {
            return (now, false);
        }
        last = now;
    }
}

/// Samples what the processes `pids` hold, and the device-wide figure.
pub(crate) fn sample(pids: &[u32]) -> Footprint {
    let (per_process, a) = settled(|| of_processes(pids));
    let (device_wide_mib, b) = settled(device_used_mib);
    Footprint {
        per_process,
        device_wide_mib,
        stable: a && b,
    }
}
