//! What the test programs share: the build of the library, the launcher, the server and the
//! control daemon, and a server (or a daemon of two devices) to run programs against.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The workspace root (`MPS_ROOT` overrides it, for test executables run on another machine).
pub(crate) fn root() -> PathBuf {
    std::env::var_os("MPS_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// This crate's directory in the workspace (under `root()`).
pub(crate) fn crate_dir() -> PathBuf {
    root().join("mps-cuda")
}

/// Records that `test` checked nothing, and why: `SKIPPED: <test>: <reason>` on stderr (past
/// the harness's capture), appended to `$MPS_TEST_SKIP_LOG` if set. Under CI (`CI` set, as
/// `.ci/run` does), what a test needs must be there: the test fails instead.
#[allow(dead_code)] // each suite compiles this module; programs.rs skips nothing
pub(crate) fn skip(test: &str, reason: &str) {
    let in_ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false");
    assert!(!in_ci, "{test}: {reason}; CI must provide it (.ci/run)");
    let line = format!("SKIPPED: {test}: {reason}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    if let Some(path) = std::env::var_os("MPS_TEST_SKIP_LOG") {
        use std::io::Write;
        // One append of one short line: lines of tests running at once do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!(
                "cannot record the skip in {}: {e}",
                Path::new(&path).display()
            );
        }
    }
}

/// `target/<profile>`, from this test executable's path (`target/<profile>/deps/..`).
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The directory holding the library (`libmpscuda.so`), the launcher (`mps-run`), the server
/// (`mps-server`) and the control daemon (`mps-control`): `$MPS_PREBUILT_DIR` when set (as `scripts/test-gpu run` sets it on a
/// machine without cargo), else this build's, built once per test run (cargo builds neither a
/// package's cdylib for its integration tests nor another package's binaries).
pub(crate) fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("MPS_PREBUILT_DIR") {
            let dir = PathBuf::from(dir);
            for f in ["libmpscuda.so", "mps-run", "mps-server", "mps-control"] {
                assert!(
                    dir.join(f).exists(),
                    "MPS_PREBUILT_DIR {} has no {f}: run scripts/test-gpu build, or unset it \
                     to build with cargo",
                    dir.display()
                );
            }
            return dir;
        }
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "-p",
            "mps-cuda",
            "-p",
            "mps-server",
            "--bin",
            "mps-run",
        ]);
        cmd.args(["--bin", "mps-server", "--bin", "mps-control", "--lib"]);
        if target_dir().ends_with("release") {
            cmd.arg("--release");
        }
        let status = cmd.current_dir(root()).status().expect("run cargo");
        assert!(status.success(), "building mps-cuda and mps-server failed");
        target_dir()
    })
}

pub(crate) fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "mps-cuda-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An mps server in a temporary pipe directory, killed on drop.
#[allow(dead_code)] // used by the program suites
pub(crate) struct Server {
    pub(crate) dir: PathBuf,
    child: Child,
}

#[allow(dead_code)] // used by the program suites
impl Server {
    pub(crate) fn start() -> Server {
        Server::start_with(&[])
    }

    /// As [`Server::start`], the server given `args` too.
    pub(crate) fn start_with(args: &[&str]) -> Server {
        let dir = temp_dir("server");
        let backend = backend();
        let child = Command::new(built().join("mps-server"))
            .arg("--pipe-dir")
            .arg(&dir)
            .arg("--log-dir")
            .arg(&dir)
            .args(["--backend", &backend])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mps-server");
        let mut s = Server { dir, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(s.dir.join("mps.sock")).is_err() {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("mps-server exited at start ({status}); log:\n{}", s.log());
            }
            assert!(
                Instant::now() < deadline,
                "server did not start:\n{}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// The first line of the server's log that contains `needle`, once it has one (within
    /// 20 s).
    pub(crate) fn wait_for_log_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| l.contains(needle)) {
                return line.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "log never said {needle:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The backend the servers run: the simulator, or `$MPS_TEST_BACKEND` (`cuda` on a GPU).
pub(crate) fn backend() -> String {
    std::env::var("MPS_TEST_BACKEND").unwrap_or_else(|_| "sim".into())
}

/// How long a state may take to appear before a test fails.
#[allow(dead_code)] // used by the suites that start a daemon
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);

/// The control daemon in a temporary pipe directory, serving two devices (the simulator's two,
/// or the GPUs the driver sees with `MPS_TEST_BACKEND=cuda`), stopped on drop. It starts a
/// server per (user, group, device) as clients arrive.
#[allow(dead_code)] // used by the suites that start a daemon
pub(crate) struct Daemon {
    pub(crate) dir: PathBuf,
    child: Child,
}

/// One row of a table that `mps-control status` prints, by column name.
#[allow(dead_code)]
pub(crate) type Row = std::collections::HashMap<String, String>;

#[allow(dead_code)] // used by the suites that start a daemon
impl Daemon {
    pub(crate) fn start() -> Daemon {
        Daemon::start_with(&[])
    }

    /// As [`Daemon::start`], each server it starts given `server_args` too.
    pub(crate) fn start_with(server_args: &[&str]) -> Daemon {
        let dir = temp_dir("daemon");
        let child = Command::new(built().join("mps-control"))
            .arg("-f")
            .args(["--backend", &backend(), "--sim-devices", "2"])
            .args(server_args.iter().map(|a| format!("--server-arg={a}")))
            .arg("--server")
            .arg(built().join("mps-server"))
            .arg("--pipe-dir")
            .arg(&dir)
            .arg("--log-dir")
            .arg(&dir)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mps-control");
        let mut d = Daemon { dir, child };
        let deadline = Instant::now() + DEADLINE;
        while std::os::unix::net::UnixStream::connect(d.dir.join("control.sock")).is_err() {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("mps-control exited at start ({status}); log:\n{}", d.log());
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not start:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// How many devices a client of this daemon sees (without `CUDA_VISIBLE_DEVICES`).
    pub(crate) fn device_count(&self) -> u32 {
        mps_client::Client::device_count(Some(&self.dir)).expect("count the daemon's devices")
    }

    /// Runs the control command `line` and returns what it printed.
    pub(crate) fn ctl(&self, line: &str) -> String {
        let out = Command::new(built().join("mps-control"))
            .arg("--pipe-dir")
            .arg(&self.dir)
            .args(line.split_whitespace())
            .output()
            .expect("run mps-control");
        assert!(
            out.status.success(),
            "mps-control {line}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `status`: its servers' table and its clients' table, each row by column name.
    pub(crate) fn status(&self) -> (Vec<Row>, Vec<Row>) {
        let status = self.ctl("status");
        let mut tables = status.split("\n\n").map(|t| {
            let mut lines = t.lines().filter(|l| !l.trim().is_empty());
            let header: Vec<String> = lines
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .map(String::from)
                .collect();
            lines
                .map(|l| {
                    header
                        .iter()
                        .cloned()
                        .zip(l.split_whitespace().map(String::from))
                        .collect()
                })
                .collect::<Vec<Row>>()
        });
        let servers = tables.next().unwrap_or_default();
        let clients = tables.next().unwrap_or_default();
        (servers, clients)
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("control.log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new(built().join("mps-control"))
            .arg("--pipe-dir")
            .arg(&self.dir)
            .arg("quit")
            .output();
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if self.child.try_wait().ok().flatten().is_some() {
                let _ = std::fs::remove_dir_all(&self.dir);
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
