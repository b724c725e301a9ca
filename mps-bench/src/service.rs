//! The service a mode's clients need: NVIDIA's MPS daemon, an mps server, or mps-control; started
//! here and stopped on drop, so that no run leaves a daemon behind.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NV_PIPE: &str = "/tmp/mps-bench-nvidia-pipe";
const NV_LOG: &str = "/tmp/mps-bench-nvidia-log";
/// The environment of NVIDIA MPS's daemon and of its clients.
const NV_ENV: [(&str, &str); 2] = [
    ("CUDA_MPS_PIPE_DIRECTORY", NV_PIPE),
    ("CUDA_MPS_LOG_DIRECTORY", NV_LOG),
];
/// NVIDIA's daemon and the server it starts (`argv[0]` of each).
const NV_PROCESSES: [&str; 2] = ["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"];

/// The pipe and log directories of this run's mps servers: one pair per benchmark process, so
/// that two runs on one machine never share (or remove) each other's server.
fn mps_dirs() -> &'static (String, String) {
    static DIRS: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let pid = std::process::id();
        (
            format!("/tmp/mps-bench-pipe-{pid}"),
            format!("/tmp/mps-bench-log-{pid}"),
        )
    })
}

/// A running mode's service, stopped on drop.
#[derive(Debug)]
pub(crate) enum Service {
    None,
    Nvidia,
    Mps(Child),
    /// mps-control, starting one server per group.
    MpsDaemon(Child),
}

/// Every process of the machine.
fn processes() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    processes()
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // After "pid (comm) state ": the parent's pid (comm may hold spaces and parentheses).
            let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
            after.split(' ').nth(1) == Some(parent.to_string().as_str())
        })
        .collect()
}

/// The processes whose `argv[0]` ends with one of `names`.
fn processes_named(names: &[&str]) -> Vec<u32> {
    processes()
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
            let argv0 = String::from_utf8_lossy(argv0);
            names.iter().any(|n| argv0.ends_with(n))
        })
        .collect()
}

impl Service {
    /// Starts the service of `mode` (`mps-daemon`: mps-control in the foreground) and waits
    /// until clients can connect.
    pub(crate) fn start(mode: &str, server: &Path, backend: &str, extra: &str) -> Service {
        match mode {
            "nvidia-mps" => {
                let running = processes_named(&NV_PROCESSES[..1]);
                assert!(
                    running.is_empty(),
                    "NVIDIA MPS is already running (pids {running:?}): stop it (echo quit | \
                     nvidia-cuda-mps-control) so the benchmark measures a daemon of its own"
                );
                for d in [NV_PIPE, NV_LOG] {
                    std::fs::create_dir_all(d)
                        .unwrap_or_else(|e| panic!("cannot create {d} for NVIDIA MPS: {e}"));
                }
                // Not through `Service::Nvidia.client_env()`: that temporary's drop would quit
                // the daemon the moment it started.
                let ok = Command::new("nvidia-cuda-mps-control")
                    .arg("-d")
                    .envs(NV_ENV)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "nvidia-cuda-mps-control -d failed (is it installed?)");
                Service::Nvidia
            }
            "mps" | "mps-daemon" => {
                let (pipe, log) = mps_dirs();
                let _ = std::fs::remove_dir_all(pipe);
                let mut cmd = if mode == "mps" {
                    Command::new(server)
                } else {
                    let mut c = Command::new(server.with_file_name("mps-control"));
                    c.arg("-f").arg("--server").arg(server);
                    c
                };
                let child = cmd
                    .args(["--backend", backend, "--pipe-dir", pipe, "--log-dir", log])
                    .args(extra.split_whitespace())
                    // Warnings, and the line each client's session logs when it ends (what it
                    // released and, with launch batching, its runs served from graphs).
                    .env("MPS_LOG", "warn,mps_server::session=info")
                    .spawn()
                    .unwrap_or_else(|e| panic!("cannot start {}: {e}", server.display()));
                let sock = Path::new(pipe).join("mps.sock");
                let t = Instant::now();
                while std::os::unix::net::UnixStream::connect(&sock).is_err() {
                    assert!(
                        t.elapsed() < Duration::from_secs(30),
                        "{} did not accept connections on {} within 30 s (its log is in {log})",
                        server.display(),
                        sock.display()
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                if mode == "mps" {
                    Service::Mps(child)
                } else {
                    Service::MpsDaemon(child)
                }
            }
            _ => Service::None,
        }
    }

    /// The environment that makes a worker a client of this service.
    pub(crate) fn client_env(&self) -> Vec<(&'static str, &'static str)> {
        match self {
            Service::Nvidia => NV_ENV.to_vec(),
            Service::Mps(_) | Service::MpsDaemon(_) => {
                vec![("MPS_PIPE_DIRECTORY", mps_dirs().0.as_str())]
            }
            Service::None => Vec::new(),
        }
    }

    /// The service's own processes that may hold GPU memory.
    pub(crate) fn pids(&self) -> Vec<u32> {
        match self {
            Service::Nvidia => processes_named(&NV_PROCESSES[1..]),
            Service::Mps(c) => vec![c.id()],
            Service::MpsDaemon(c) => {
                let mut pids = children_of(c.id());
                pids.push(c.id());
                pids
            }
            Service::None => Vec::new(),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        match self {
            Service::None => {}
            Service::Nvidia => {
                let child = Command::new("nvidia-cuda-mps-control")
                    .envs(self.client_env())
                    .stdin(Stdio::piped())
                    .spawn();
                if let Ok(mut c) = child {
                    let _ = c.stdin.take().unwrap().write_all(b"quit\n");
                    let _ = c.wait();
                }
                // The daemon exits after its server: wait for both (their memory and the
                // device's MPS state are released then), rather than for a fixed time.
                let t = Instant::now();
                while !processes_named(&NV_PROCESSES).is_empty() {
                    if t.elapsed() > Duration::from_secs(20) {
                        eprintln!(
                            "NVIDIA MPS still runs 20 s after quit (pids {:?})",
                            processes_named(&NV_PROCESSES)
                        );
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Service::Mps(c) | Service::MpsDaemon(c) => {
                // SIGTERM first: mps-control then stops the servers it started, which SIGKILL
                // would leave running.
                let pid = nix::unistd::Pid::from_raw(c.id() as i32);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                let t = Instant::now();
                while matches!(c.try_wait(), Ok(None)) && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if matches!(c.try_wait(), Ok(None)) {
                    eprintln!("{} did not stop within 10 s of SIGTERM: killing it", c.id());
                    let _ = c.kill();
                }
                let _ = c.wait();
                let _ = std::fs::remove_dir_all(&mps_dirs().0);
            }
        }
    }
}
