//! What the test programs share: the build of the library, the launcher and the server, and
//! a server to run programs against.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The workspace root.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `target/<profile>`, from this test executable's path (`target/<profile>/deps/..`).
pub(crate) fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Builds the library, the launcher and the server (cargo builds neither a package's cdylib
/// for its integration tests nor another package's binaries), once per test run.
pub(crate) fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
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
