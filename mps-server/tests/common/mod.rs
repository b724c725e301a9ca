//! Shared by the integration tests: a real server process in a temporary pipe directory, a raw
//! protocol client that can misbehave on purpose, and child client processes.
#![allow(dead_code, unreachable_pub)]

pub mod daemon;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use mps_core::handshake::{Hello, Welcome};
use mps_core::protocol::{self, Command as Slot, Completion, Request};
use mps_core::slots::Slots;
use mps_ipc::channel::{Channel, Layout, ShmRing};
use mps_ipc::ring::{Consumer, Producer};
use mps_ipc::segment::Segment;
use mps_ipc::socket;

/// The workspace root (`MPS_ROOT` overrides it, for test binaries run on another machine).
pub fn root() -> PathBuf {
    std::env::var_os("MPS_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// The server binary (`MPS_SERVER_BIN` overrides it, for test binaries run on another machine).
pub fn server_bin() -> PathBuf {
    std::env::var_os("MPS_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mps-server")))
}

/// The control daemon's binary (`MPS_CONTROL_BIN` overrides it, as `MPS_SERVER_BIN` does).
pub fn control_bin() -> PathBuf {
    std::env::var_os("MPS_CONTROL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_mps-control")))
}

/// The test kernels' PTX.
pub fn ptx() -> Vec<u8> {
    std::fs::read(root().join("kernels/test_kernels.ptx")).expect("kernels/test_kernels.ptx")
}

/// `target/<profile>`, found from this test executable's path (`target/<profile>/deps/..`).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// A fresh empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "mps-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The backend the tests run against: `MPS_TEST_BACKEND` (sim or cuda), default sim.
pub fn backend() -> String {
    std::env::var("MPS_TEST_BACKEND").unwrap_or_else(|_| "sim".into())
}

/// Whether the tests run against a GPU.
pub fn on_gpu() -> bool {
    backend() == "cuda"
}

/// A server process in a temporary pipe directory, killed on drop.
pub struct TestServer {
    pub dir: PathBuf,
    child: Child,
}

impl TestServer {
    pub fn start() -> TestServer {
        Self::start_with(&[])
    }

    /// Starts `mps-server` with extra arguments and waits until it accepts connections.
    pub fn start_with(extra: &[&str]) -> TestServer {
        let dir = temp_dir("server");
        let mut cmd = Command::new(server_bin());
        cmd.arg("--pipe-dir").arg(&dir).arg("--log-dir").arg(&dir);
        if !extra.contains(&"--backend") {
            cmd.arg("--backend").arg(backend());
        }
        let child = cmd
            .args(extra)
            .env("MPS_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mps-server");
        let mut s = TestServer { dir, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(s.socket()).is_err() {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("mps-server exited at start ({status}); log:\n{}", s.log());
            }
            assert!(
                Instant::now() < deadline,
                "server did not start; log:\n{}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        s
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join(socket::SOCKET_NAME)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Waits (up to 20 s) until the log contains `needle`; returns the log.
    pub fn wait_for_log(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log();
            if log.contains(needle) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "log never said {needle:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the server process is still running.
    pub fn is_alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn client(&self) -> mpsclient::Client {
        mpsclient::Client::connect(Some(&self.dir)).expect("connect")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The servers it started to serve after a fault, or to stand by, outlive it; they are
        // stopped too, whatever the test's outcome (each found by its pid in the log and by
        // this server's directory on its command line, never another process).
        let log = self.log();
        let dir = self.dir.to_string_lossy().into_owned();
        for marker in ["a fresh server (pid ", "a standby server (pid "] {
            for pid in pids_after(&log, marker) {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains(&dir) {
                    let pid = nix::unistd::Pid::from_raw(pid);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pids the log names after `marker` (`"a standby server (pid "`, say), in order.
pub fn pids_after(log: &str, marker: &str) -> Vec<i32> {
    log.split(marker)
        .skip(1)
        .filter_map(|rest| rest.split(')').next()?.parse().ok())
        .collect()
}

/// Runs the test function `test` of this test binary in a child process as client `role`:
/// the child's copy of that test sees `MPS_TEST_ROLE` and plays the role instead of its usual
/// body.
pub fn spawn_role(test: &str, role: &str, server: &TestServer) -> Child {
    spawn_role_with(test, role, server, &[])
}

/// [`spawn_role`] with `env` added to the child's environment (what a client reads when it
/// connects, such as `MPS_CLIENT_PRIORITY`).
pub fn spawn_role_with(test: &str, role: &str, server: &TestServer, env: &[(&str, &str)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env("MPS_TEST_ROLE", role)
        .env("MPS_PIPE_DIRECTORY", &server.dir)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn child client")
}

/// The role this process plays, if it is a child client.
pub fn role() -> Option<String> {
    std::env::var("MPS_TEST_ROLE").ok()
}

/// A client speaking the wire protocol directly, so tests can send what the library never
/// would.
pub struct RawClient {
    pub sock: UnixStream,
    pub channel: Channel,
    pub producer: Producer<Slot, ShmRing<Slot>>,
    pub consumer: Consumer<Completion, ShmRing<Completion>>,
    pub seq: u64,
}

impl RawClient {
    pub fn connect(server: &TestServer) -> RawClient {
        let sock = UnixStream::connect(server.socket()).unwrap();
        let hello = Hello::new("default").unwrap();
        socket::send(&sock, bytemuck::bytes_of(&hello), &[]).unwrap();
        let mut w: Welcome = bytemuck::Zeroable::zeroed();
        let fds = socket::recv(&sock, bytemuck::bytes_of_mut(&mut w), 2).unwrap();
        w.check(&server.socket().display()).unwrap();
        let layout = Layout::from_welcome(&w).unwrap();
        let mut fds = fds.into_iter();
        let c = Segment::open(fds.next().unwrap(), layout.client_bytes(), true).unwrap();
        let s = Segment::open(fds.next().unwrap(), layout.server_bytes(), false).unwrap();
        let channel = Channel::open(c, s, layout).unwrap();
        RawClient {
            producer: channel.submit_producer(),
            consumer: channel.complete_consumer(),
            channel,
            sock,
            seq: 0,
        }
    }

    /// Submits `req` (with REPLY) and returns its sequence number.
    pub fn send(&mut self, req: &Request<'_>, stream: u64, flags: u16) -> u64 {
        self.seq += 1;
        let slots = Slots::of(req, self.seq, stream, flags | protocol::flags::REPLY);
        self.push(&slots);
        self.seq
    }

    /// Puts a header and payload in the ring as they are.
    pub fn send_raw(&mut self, cmd: Slot, payload: &[u8]) {
        self.push(&Slots::new(cmd, payload));
    }

    /// Lays `slots` into the ring, as the client library does, and rings the server.
    fn push(&mut self, slots: &Slots<&[u8]>) {
        let pushed = self.producer.push_with(slots.len(), |i| slots.slot(i));
        assert!(pushed.unwrap(), "ring full");
        self.channel.submit_bell().ring();
    }

    /// The next completion (panics after 20 s).
    pub fn recv(&mut self) -> Completion {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(c) = self.consumer.pop().unwrap() {
                return c;
            }
            assert!(Instant::now() < deadline, "no completion from the server");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Sends `req` and returns the server's answer.
    pub fn call(&mut self, req: &Request<'_>, stream: u64) -> Completion {
        let seq = self.send(req, stream, 0);
        let c = self.recv();
        assert_eq!(c.seq, seq);
        c
    }

    /// Puts `cmd` in the ring with sequence number `seq` and REPLY set, as it is otherwise.
    pub fn send_with_seq(&mut self, req: &Request<'_>, seq: u64) {
        self.push(&Slots::of(req, seq, 0, protocol::flags::REPLY));
    }

    /// Whether the server has closed this connection, without waiting.
    pub fn is_closed(&self) -> bool {
        use nix::sys::socket::{MsgFlags, recv};
        use std::os::fd::AsRawFd;
        let mut b = [0u8; 1];
        match recv(
            self.sock.as_raw_fd(),
            &mut b,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e != nix::errno::Errno::EAGAIN,
        }
    }

    /// Whether the server closed this connection (waits up to 20 s for it).
    pub fn wait_closed(&self) -> bool {
        use std::io::Read;
        self.sock
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut b = [0u8; 1];
        matches!((&self.sock).read(&mut b), Ok(0) | Err(_))
    }
}

/// How long a test waits for a state it expects before it fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// Looks at `observe` until `done` accepts what it returns, for up to [`WAIT`], and returns that
/// value; past the deadline it fails with `what` and the last value it saw. State that changes
/// asynchronously (a client's resources coming back, a server's partitions being re-planned) is
/// asserted this way, never right after the action that changes it.
pub fn wait_until<T: std::fmt::Debug>(
    what: &str,
    mut observe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let seen = observe();
        if done(&seen) {
            return seen;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still {seen:?} after {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Probes until `probe` gives a value, for up to [`WAIT`]; past the deadline it fails with
/// `what` and `context()` (a log, say).
pub fn wait_for<T>(
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within {WAIT:?}:\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`wait_until`] `observe` returns `want`.
pub fn wait_for_value<T: std::fmt::Debug + PartialEq>(
    what: &str,
    observe: impl FnMut() -> T,
    want: T,
) -> T {
    wait_until(&format!("{what} (want {want:?})"), observe, |v| *v == want)
}

/// Says that `test` did not run its checks, and why: on standard error, and as the line
/// `SKIPPED: <test>: <reason>` appended to the file `$MPS_TEST_SKIP_LOG` names (the test
/// harness captures a passing test's output, so the file is what `scripts/test` and
/// `scripts/test-gpu` summarise). The caller returns right after.
pub fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
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

/// Whether this is a CI run (`CI` set, as `.ci/run` does), where what a test needs must be
/// there: a missing tool fails the test instead of skipping it.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// Skips `test` for `reason` outside CI; in CI, fails with it.
pub fn skip_unless_ci(test: &str, reason: &str) {
    assert!(!in_ci(), "{test}: {reason}; CI must provide it (.ci/run)");
    skip(test, reason);
}

/// Bytes of a slice of f32.
pub fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// The directory of prebuilt libraries and programs (`MPS_PREBUILT_DIR`, as `scripts/test-gpu
/// build` leaves them), if the tests are to use those instead of cargo.
pub fn prebuilt() -> Option<std::path::PathBuf> {
    std::env::var_os("MPS_PREBUILT_DIR").map(std::path::PathBuf::from)
}

/// Builds libmpsclient.so (cargo builds a dependency's cdylib only when the package itself is
/// being built, so `cargo test -p mps-server` alone would otherwise link a stale one), or takes
/// the prebuilt one, and lays it out as an installation does: `libmpsclient.so.0` (its soname)
/// and the `libmpsclient.so` link the linker looks for. Returns that directory.
pub fn library_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let built = prebuilt().map_or_else(build_library, |d| d.join("libmpsclient.so"));
        assert!(built.exists(), "{} not found", built.display());
        let dir = temp_dir("lib");
        std::fs::copy(&built, dir.join("libmpsclient.so.0")).unwrap();
        std::os::unix::fs::symlink("libmpsclient.so.0", dir.join("libmpsclient.so")).unwrap();
        dir
    })
}

/// Builds libmpsclient.so with cargo; returns its path.
fn build_library() -> std::path::PathBuf {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "mps-client-c", "--lib"]);
    if target_dir().ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.current_dir(root()).status().expect("run cargo");
    assert!(status.success(), "building libmpsclient failed");
    target_dir().join("libmpsclient.so")
}

/// Compiles `source` into `out` with `compiler` and `std` (C or C++), linking libmpsclient from
/// this build.
pub fn build_with(compiler: &str, std: &str, source: &Path, out: &Path) {
    let lib_dir = library_dir();
    let cc = compiler;
    let status = Command::new(cc)
        .args([std, "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(source)
        .arg("-o")
        .arg(out)
        .arg("-L")
        .arg(lib_dir)
        .arg("-lmpsclient")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
}

/// The SMs a kernel of `blocks` blocks ran on, from a kernel (tests/kernels/sm_ids.ptx) whose
/// blocks each stay resident for `resident_ns` and then write down `%smid`: which SMs a
/// partition lets a client's kernels use, counted rather than timed. GPU only (the simulator
/// has no such kernel).
pub fn sms_used(
    c: &mpsclient::Client,
    blocks: u32,
    resident_ns: u64,
) -> std::collections::BTreeSet<u32> {
    use mpsclient::Stream;
    let image = std::fs::read(root().join("mps-server/tests/kernels/sm_ids.ptx")).unwrap();
    let m = c.module_load(&image).unwrap();
    let f = c.module_get_function(m, "sm_ids").unwrap();
    let out = c.mem_alloc(u64::from(blocks) * 4).unwrap();
    c.memset_d32(out, u32::MAX, u64::from(blocks), Stream::DEFAULT)
        .unwrap();
    let dim = |x| mpsclient::Dim3 { x, y: 1, z: 1 };
    c.launch(
        f,
        dim(blocks),
        dim(256),
        0,
        Stream::DEFAULT,
        &[&out.0.to_le_bytes(), &resident_ns.to_le_bytes()],
    )
    .unwrap();
    let mut ids = vec![0u8; blocks as usize * 4];
    c.memcpy_dtoh(&mut ids, out, Stream::DEFAULT).unwrap();
    c.mem_free(out).unwrap();
    c.module_unload(m).unwrap();
    let ids: Vec<u32> = ids
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert!(
        !ids.contains(&u32::MAX),
        "a block of sm_ids wrote nothing: {ids:?}"
    );
    ids.into_iter().collect()
}
