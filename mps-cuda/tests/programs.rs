//! Driver-API programs in C, built with `-Wall -Wextra -Werror` against nothing but this
//! library (`-lcuda`, or `dlopen("libcuda.so.1")`), run through `mps-run` against a real server
//! (the simulator; `MPS_TEST_BACKEND=cuda` for a GPU). Each prints "all checks passed" when
//! every CUDA result and every value it checks is what CUDA documents.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The workspace root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `target/<profile>`, from this test executable's path (`target/<profile>/deps/..`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// Builds the library, the launcher and the server (cargo builds neither a package's cdylib
/// for its integration tests nor another package's binaries), once per test run.
fn built() -> &'static Path {
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

fn temp_dir(tag: &str) -> PathBuf {
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
struct Server {
    dir: PathBuf,
    child: Child,
}

impl Server {
    fn start() -> Server {
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

    fn log(&self) -> String {
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

/// A directory holding `libcuda.so`, a link to this build's library, for the linker's `-lcuda`
/// (the program records the library's soname, `libcuda.so.1`, as NVIDIA's does).
fn link_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("link");
        std::os::unix::fs::symlink(built().join("libmpscuda.so"), dir.join("libcuda.so")).unwrap();
        dir
    })
}

/// Compiles `tests/c/<name>.c`, linked with `-lcuda` against this build's library.
fn build(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let exe = temp_dir(name).join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread"])
        .arg("-I")
        .arg(&src)
        .arg(src.join(format!("{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(link_dir())
        .args(["-lcuda", "-ldl"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(status.success(), "compiling {name}.c failed");
    exe
}

/// Runs `exe` through mps-run against `server`, with `env` added.
fn run(exe: &Path, server: &Server, env: &[(&str, &str)]) -> Output {
    Command::new(built().join("mps-run"))
        .arg(exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &server.dir)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Runs program `name`; it must pass every check. Returns its stdout and stderr.
fn passes(name: &str, env: &[(&str, &str)]) -> (String, String) {
    let exe = build(name);
    let server = Server::start();
    let out = run(&exe, &server, env);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{name} failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log()
    );
    (stdout, stderr)
}

#[test]
fn vector_add_with_modules_libraries_and_both_ways_of_passing_parameters() {
    passes("vector_add", &[]);
}

#[test]
fn mps_run_makes_the_program_load_this_library() {
    // Only this library knows of mps servers: with none in the pipe directory, the program's
    // cuInit fails with this library's message, whatever other libcuda.so.1 the machine has.
    let exe = build("vector_add");
    let empty = temp_dir("no-server");
    let out = Command::new(built().join("mps-run"))
        .arg(&exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("mps-cuda: no device: cannot reach an mps server"),
        "{stderr}"
    );
    assert!(stderr.contains("cuInit(0) returned 100"), "{stderr}");
}

#[test]
fn streams_events_and_the_legacy_default_stream() {
    passes("streams_events", &[]);
}

#[test]
fn pinned_host_memory_with_async_copies_and_memsets() {
    passes("pinned_memset", &[]);
}

#[test]
fn mem_get_info_reports_the_client_memory_limit() {
    passes("mem_limit", &[("MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M")]);
}

#[test]
fn threads_have_their_own_current_context_and_streams() {
    passes("threads", &[]);
}

#[test]
fn proc_addresses_by_version_and_unsupported_functions_refused_once() {
    let (_, stderr) = passes("proc_unsupported", &[]);
    let said = stderr
        .lines()
        .filter(|l| l.contains("cuGraphCreate is not supported through mps"))
        .count();
    assert_eq!(said, 1, "{stderr}");
    assert!(
        stderr.contains("cuGetExportTable(1734dc26800d47458726c0f1e7dd8bca) is not supported"),
        "{stderr}"
    );
}

#[test]
fn a_kernel_fault_surfaces_at_the_next_synchronising_call() {
    passes("async_error", &[]);
}
