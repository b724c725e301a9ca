//! What the test programs share: the build of the library, the launcher and the server, and
//! a server to run programs against.

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

/// The directory holding the library (`libmpscuda.so`), the launcher (`mps-run`) and the
/// server (`mps-server`): `$MPS_PREBUILT_DIR` when set (as `scripts/test-gpu run` sets it on a
/// machine without cargo), else this build's, built once per test run (cargo builds neither a
/// package's cdylib for its integration tests nor another package's binaries).
pub(crate) fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("MPS_PREBUILT_DIR") {
            let dir = PathBuf::from(dir);
            for f in ["libmpscuda.so", "mps-run", "mps-server"] {
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
        cmd.args(["--bin", "mps-server", "--lib"]);
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
pub(crate) struct Server {
    pub(crate) dir: PathBuf,
    child: Child,
}

impl Server {
    pub(crate) fn start() -> Server {
        let dir = temp_dir("server");
        let backend = std::env::var("MPS_TEST_BACKEND").unwrap_or_else(|_| "sim".into());
        let child = Command::new(built().join("mps-server"))
            .arg("--pipe-dir")
            .arg(&dir)
            .arg("--log-dir")
            .arg(&dir)
            .args(["--backend", &backend])
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
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
