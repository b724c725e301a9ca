//! What a hostile local user may try against the server before and around the handshake:
//! descriptors smuggled with the hello, slow and half-open connections, huge host buffers, and
//! a pipe or log directory prepared by someone else. Each test fails on a server without the
//! defence it names.

mod common;

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::TestServer;
use common::daemon::TestDaemon;
use mps_core::protocol::{self, Hello};
use mps_ipc::socket;

fn hello() -> Hello {
    Hello::new("default").unwrap()
}

/// The server's pid, from the credentials of a connection to it (the connection is then
/// refused and closed).
fn server_pid(server: &TestServer) -> i32 {
    let s = UnixStream::connect(server.socket()).unwrap();
    let pid = socket::peer(&s).unwrap().pid;
    let bad = [0u8; size_of::<Hello>()];
    socket::send(&s, &bad, &[]).unwrap();
    wait_closed(&s);
    pid
}

/// Descriptors the process `pid` holds open.
fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Reads until the server closes `s` (whatever it sends first); panics after 20 s.
fn wait_closed(s: &UnixStream) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

#[test]
fn descriptors_sent_with_a_hello_are_closed() {
    let server = TestServer::start();
    let pid = server_pid(&server);
    let baseline = open_fds(pid);
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    for n in [1usize, 3, 8, 64] {
        for _ in 0..5 {
            let s = UnixStream::connect(server.socket()).unwrap();
            let fds = vec![w.as_fd(); n];
            socket::send(&s, bytemuck::bytes_of(&hello()), &fds).unwrap();
            wait_closed(&s);
        }
    }
    assert_eq!(
        open_fds(pid),
        baseline,
        "the server kept descriptors that came with refused hellos; log:\n{}",
        server.log()
    );
    // And it still serves a client that behaves.
    let c = server.client();
    c.mem_alloc(4096).unwrap();
}

/// The process's virtual memory size in bytes (VmSize).
fn address_space(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn a_host_buffer_costs_its_size_not_a_terabyte_of_address_space() {
    let server = TestServer::start();
    let pid = server_pid(&server);
    let c = server.client();
    let before = address_space(pid);
    for _ in 0..4 {
        // Refused by the per-client limit on host-buffer bytes, or, where that limit is above
        // what the machine has, by the check of the memory available: never by mapping it.
        let e = c.host_alloc(1 << 40).unwrap_err();
        match e.status {
            mps_core::Status::QuotaExceeded => {
                assert!(e.message.contains("max_host_bytes"), "{}", e.message)
            }
            mps_core::Status::OutOfMemory => assert!(
                e.message.contains("bytes of memory are available"),
                "{}",
                e.message
            ),
            other => panic!("a 1 TiB host buffer got {other}: {}", e.message),
        }
    }
    let grown = address_space(pid).saturating_sub(before);
    assert!(
        grown < 1 << 40,
        "the server's address space grew by {grown} bytes for refused host buffers"
    );
    // A buffer the machine can give is still served, and its memory is real.
    let p = c.host_alloc(1 << 20).unwrap();
    // SAFETY: the buffer is 1 MiB long and mapped writable in this process.
    unsafe { p.add((1 << 20) - 1).write(7) };
}

/// Whether the server has closed `s` or answered on it (without waiting, and leaving what it
/// sent to be read).
fn closed_by_server(s: &UnixStream) -> bool {
    use nix::sys::socket::{MsgFlags, recv};
    use std::os::fd::AsRawFd;
    let mut b = [0u8; 1];
    let peek = MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT;
    !matches!(
        recv(s.as_raw_fd(), &mut b, peek),
        Err(nix::errno::Errno::EAGAIN)
    )
}

/// The message of the refusal the server sent on `s` before closing it.
fn refusal(s: &UnixStream) -> String {
    let mut w: protocol::Welcome = bytemuck::Zeroable::zeroed();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (&*s)
        .read_exact(bytemuck::bytes_of_mut(&mut w))
        .expect("a refusal before the server closed the connection");
    assert_ne!(w.status, 0, "not a refusal");
    protocol::get_str(&w.message).to_string()
}

/// Polls `cond` every 20 ms until it holds; panics with `what` after 20 s.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_hello_sent_a_byte_a_second_is_dropped_at_the_deadline() {
    let server = TestServer::start();
    let s = UnixStream::connect(server.socket()).unwrap();
    let h = hello();
    let bytes = bytemuck::bytes_of(&h);
    let mut sent = 0;
    // The attack's own pace (a byte a second), not a wait for the server.
    while sent < bytes.len() && !closed_by_server(&s) {
        if socket::send(&s, &bytes[sent..sent + 1], &[]).is_err() {
            break;
        }
        sent += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        sent < bytes.len(),
        "the server waited for the whole {sent}-byte hello, a byte a second"
    );
    let why = refusal(&s);
    assert!(why.contains("hello was not complete 5000 ms"), "{why}");
}

/// Opens 20 connections that never send a hello to the process `pid` listening at `socket`,
/// whose --max-pending-hellos is 8 (and whose hello timeout is far away): the 12 that waited
/// longest are dropped with the limit named, the 8 newest still wait, and none of them cost a
/// thread (`pid`'s threads are counted before the first is opened).
fn only_the_newest_half_open_connections_wait(pid: u32, socket: &std::path::Path) {
    let threads = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    };
    let idle = threads();
    let silent: Vec<UnixStream> = (0..20)
        .map(|_| UnixStream::connect(socket).unwrap())
        .collect();
    let closed = || silent.iter().filter(|s| closed_by_server(s)).count();
    wait_until("the connections beyond the cap were not dropped", || {
        closed() >= 12
    });
    for (i, s) in silent.iter().enumerate() {
        assert_eq!(closed_by_server(s), i < 12, "connection {i}");
    }
    assert_eq!(
        threads(),
        idle,
        "connections waiting for their hello cost threads"
    );
    let why = refusal(&silent[0]);
    assert!(why.contains("--max-pending-hellos"), "{why}");
}

#[test]
fn half_open_connections_beyond_the_cap_are_dropped_and_a_good_client_gets_in() {
    let server =
        TestServer::start_with(&["--max-pending-hellos", "8", "--hello-timeout-ms", "600000"]);
    only_the_newest_half_open_connections_wait(server_pid(&server) as u32, &server.socket());
    // A client that sends its hello at once is served although the list is full.
    server.client().mem_alloc(4096).unwrap();
}

/// The daemon reads hellos as a server does: connections waiting for theirs cost it no thread,
/// those beyond its --max-pending-hellos are dropped oldest first with the limit named, and a
/// client that sends its hello at once is served.
#[test]
fn the_daemon_drops_half_open_connections_beyond_its_cap_without_a_thread_each() {
    let d = TestDaemon::start(
        "security-daemon",
        &["--max-pending-hellos", "8", "--hello-timeout-ms", "600000"],
    );
    // A first client starts its server, so that the daemon's thread count is its steady one.
    d.client().mem_alloc(4096).unwrap();
    only_the_newest_half_open_connections_wait(d.pid(), &d.dir.join(socket::SOCKET_NAME));
    d.client().mem_alloc(4096).unwrap();
}

#[test]
fn connections_beyond_the_per_user_limit_are_refused_with_the_limit_named() {
    let server = TestServer::start_with(&["--max-clients-per-user", "3"]);
    // The connection TestServer made to see the server up keeps its place until the server has
    // seen it close: each of the three is admitted once that place is free.
    let mut clients: Vec<_> = (0..3)
        .map(|_| {
            let mut admitted = None;
            wait_until("the start-up probe's place was never freed", || {
                admitted = mpsclient::Client::connect(Some(&server.dir)).ok();
                admitted.is_some()
            });
            admitted.unwrap()
        })
        .collect();
    let e = match mpsclient::Client::connect(Some(&server.dir)) {
        Ok(_) => panic!("a fourth client of one user was admitted"),
        Err(e) => e,
    };
    assert_eq!(
        e.status,
        mps_core::Status::PermissionDenied,
        "{}",
        e.message
    );
    assert!(
        e.message.contains("--max-clients-per-user"),
        "{}",
        e.message
    );
    // A place given back is a place for the next client.
    drop(clients.pop());
    wait_until("no place was freed by a client leaving", || {
        mpsclient::Client::connect(Some(&server.dir)).is_ok()
    });
}

/// Sets the soft descriptor limit of process `pid` (the hard limit stays, so that it can be
/// raised again without privilege).
fn set_fd_limit(pid: i32, n: u64) {
    let mut lim = nix::libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit only writes the old limit into `lim`.
    let r =
        unsafe { nix::libc::prlimit(pid, nix::libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    lim.rlim_cur = n.min(lim.rlim_max);
    // SAFETY: prlimit only reads `lim`.
    let r =
        unsafe { nix::libc::prlimit(pid, nix::libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
}

#[test]
fn failing_accepts_back_off_and_are_logged_at_a_bounded_rate() {
    let server = TestServer::start_with(&[
        "--max-pending-hellos",
        "1000",
        "--hello-timeout-ms",
        "600000",
    ]);
    let pid = server_pid(&server);
    set_fd_limit(pid, open_fds(pid) as u64 + 10);
    let mut silent: Vec<UnixStream> = (0..40)
        .map(|_| UnixStream::connect(server.socket()).unwrap())
        .collect();
    server.wait_for_log("accept failed");
    // Out of descriptors, with connections still queued: a server that retried at once would
    // log a line per try, hundreds of thousands a second. Give it two seconds to show it.
    std::thread::sleep(Duration::from_secs(2));
    let lines = server.log().matches("accept failed").count();
    assert_eq!(lines, 1, "failed accepts logged {lines} times in 2 s");
    silent.clear();
    set_fd_limit(pid, 4096);
    wait_until(
        "the server did not serve again after descriptors were freed",
        || mpsclient::Client::connect(Some(&server.dir)).is_ok(),
    );
}

/// Runs `mps-server` with `args` (and `umask` 000 when `open_umask`), expecting it to refuse to
/// start: returns what it printed. Panics if it is still running after 20 s.
fn refused_start(args: &[&std::ffi::OsStr]) -> String {
    let mut child = std::process::Command::new(common::server_bin())
        .args(["--backend", "sim"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success(), "mps-server exited with success");
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mps-server started where it should have refused ({args:?})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mode_of(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

#[test]
fn a_pipe_directory_another_user_made_first_is_refused_and_its_socket_left_alone() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root, to play another user (nobody)");
        return;
    }
    let base = common::temp_dir("squat");
    let pipe = base.join("pipe");
    std::fs::create_dir(&pipe).unwrap();
    // The attacker's listener in the attacker's directory.
    let attacker = std::os::unix::net::UnixListener::bind(pipe.join(socket::SOCKET_NAME)).unwrap();
    std::os::unix::fs::chown(&pipe, Some(65534), Some(65534)).unwrap();
    let log = base.join("log");
    let err = refused_start(&[
        "--pipe-dir".as_ref(),
        pipe.as_os_str(),
        "--log-dir".as_ref(),
        log.as_os_str(),
    ]);
    assert!(err.contains("is owned by uid 65534"), "{err}");
    assert!(!err.contains("already served"), "{err}");
    // Nothing was removed or replaced in the attacker's directory.
    assert!(pipe.join(socket::SOCKET_NAME).exists());
    drop(attacker);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn links_at_the_pipe_directory_and_the_log_are_not_followed() {
    let base = common::temp_dir("links");
    let real = base.join("real");
    std::fs::create_dir(&real).unwrap();
    let link = base.join("pipe");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let log = base.join("log");
    let err = refused_start(&[
        "--pipe-dir".as_ref(),
        link.as_os_str(),
        "--log-dir".as_ref(),
        log.as_os_str(),
    ]);
    assert!(err.contains("is a symbolic link"), "{err}");
    assert!(!real.join(socket::SOCKET_NAME).exists());

    // server.log pointing at a file the server's user can write: left untouched.
    let precious = base.join("precious");
    std::fs::write(&precious, "keep\n").unwrap();
    std::fs::set_permissions(
        &precious,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let log = base.join("log2");
    std::fs::create_dir(&log).unwrap();
    std::os::unix::fs::symlink(&precious, log.join("server.log")).unwrap();
    let pipe = base.join("pipe2");
    let err = refused_start(&[
        "--pipe-dir".as_ref(),
        pipe.as_os_str(),
        "--log-dir".as_ref(),
        log.as_os_str(),
    ]);
    assert!(err.contains("server.log is a symbolic link"), "{err}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep\n");
    assert_eq!(mode_of(&precious), 0o644);
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn a_log_directory_others_can_write_is_refused() {
    let base = common::temp_dir("open-log");
    let log = base.join("log");
    std::fs::create_dir(&log).unwrap();
    std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let pipe = base.join("pipe");
    let err = refused_start(&[
        "--pipe-dir".as_ref(),
        pipe.as_os_str(),
        "--log-dir".as_ref(),
        log.as_os_str(),
    ]);
    assert!(
        err.contains("can be written by its group or by others (mode 0777)"),
        "{err}"
    );
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn directories_log_and_socket_are_private_whatever_the_umask() {
    use std::os::unix::process::CommandExt;
    let base = common::temp_dir("umask");
    let (pipe, log) = (base.join("pipe"), base.join("log"));
    let mut cmd = std::process::Command::new(common::server_bin());
    cmd.args(["--backend", "sim", "--pipe-dir"])
        .arg(&pipe)
        .arg("--log-dir")
        .arg(&log)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: umask is async-signal-safe and touches nothing of the parent.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::stat::umask(nix::sys::stat::Mode::empty());
            Ok(())
        })
    };
    let mut child = cmd.spawn().unwrap();
    let sock = pipe.join(socket::SOCKET_NAME);
    wait_until("the server did not start", || {
        UnixStream::connect(&sock).is_ok()
    });
    let modes = [
        (mode_of(&pipe), 0o700, "pipe directory"),
        (mode_of(&log), 0o700, "log directory"),
        (mode_of(&log.join("server.log")), 0o600, "server.log"),
        (mode_of(&sock), 0o600, "mps.sock"),
    ];
    let _ = child.kill();
    let _ = child.wait();
    for (got, want, what) in modes {
        assert_eq!(got, want, "{what}: mode {got:04o}, want {want:04o}");
    }
    std::fs::remove_dir_all(&base).unwrap();
}

/// A cgroup of the pids controller holding process `pid` (every thread of it), removed on drop
/// with the process moved back.
struct ThreadCap {
    dir: std::path::PathBuf,
    root: std::path::PathBuf,
    pid: i32,
}

impl ThreadCap {
    /// Moves `pid` into a pids cgroup of its own that allows no thread beyond those it has;
    /// `Err` says why where the controller cannot be used here (cgroup v1's `pids` hierarchy,
    /// or v2 with `pids` enabled, written as root).
    fn new(pid: i32) -> Result<ThreadCap, String> {
        let v1 = std::path::Path::new("/sys/fs/cgroup/pids");
        let v2 = std::path::Path::new("/sys/fs/cgroup");
        let root = if v1.join("cgroup.procs").exists() {
            v1
        } else if std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "pids"))
        {
            v2
        } else {
            return Err("no writable pids cgroup controller".into());
        };
        let dir = root.join(format!("mps-test-{}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let cap = ThreadCap {
            dir,
            root: root.to_path_buf(),
            pid,
        };
        let write = |file: &str, value: &str| {
            std::fs::write(cap.dir.join(file), value)
                .map_err(|e| format!("cannot write {value} to {file}: {e}"))
        };
        write("cgroup.procs", &pid.to_string())?;
        let current = std::fs::read_to_string(cap.dir.join("pids.current"))
            .map_err(|e| format!("cannot read pids.current: {e}"))?;
        write("pids.max", current.trim())?;
        Ok(cap)
    }
}

impl Drop for ThreadCap {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("pids.max"), "max");
        let _ = std::fs::write(self.root.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A server that cannot start a thread for a new client refuses it, naming why, and serves on.
/// The server is put in a pids cgroup that allows no more threads than it has: memory stays
/// as it was (a cap on the address space, tried first, let the server's heap fail to grow
/// too, and Rust aborts then: 1 run in 40 under load).
#[test]
fn a_thread_that_cannot_start_is_a_refusal_not_an_abort() {
    const TEST: &str = "a_thread_that_cannot_start_is_a_refusal_not_an_abort";
    let mut server = TestServer::start();
    let pid = server_pid(&server);
    let cap = match ThreadCap::new(pid) {
        Ok(cap) => cap,
        Err(why) => return common::skip_unless_ci(TEST, &why),
    };
    let e = match mpsclient::Client::connect(Some(&server.dir)) {
        Ok(_) => panic!("a client was served without a thread"),
        Err(e) => e,
    };
    assert!(e.message.contains("cannot start a thread"), "{}", e.message);
    assert!(server.is_alive(), "the server died; log:\n{}", server.log());
    drop(cap);
    server.client().mem_alloc(4096).unwrap();
}

/// The third stream of a client of a server started with `--max-streams 2` is refused, with the
/// limit and its flag named; the limits are the operator's, not the defaults.
#[test]
fn a_stream_past_the_operators_max_streams_is_refused_with_the_limit_named() {
    let server = TestServer::start_with(&["--max-streams", "2"]);
    let c = server.client();
    let streams = [c.stream_create(0).unwrap(), c.stream_create(0).unwrap()];
    let e = c.stream_create(0).unwrap_err();
    assert_eq!(e.status, mps_core::Status::QuotaExceeded, "{}", e.message);
    assert!(e.message.contains("max_streams"), "{}", e.message);
    assert!(e.message.contains("--max-streams"), "{}", e.message);
    // A stream given back is room for the next.
    c.stream_destroy(streams[0]).unwrap();
    c.stream_create(0).unwrap();
}

#[test]
fn a_host_buffer_past_the_operators_max_host_bytes_is_refused_with_the_limit_named() {
    let server = TestServer::start_with(&["--max-host-bytes", "1MiB"]);
    let c = server.client();
    let b = c.host_alloc(768 << 10).unwrap();
    let e = c.host_alloc(512 << 10).unwrap_err();
    assert_eq!(e.status, mps_core::Status::QuotaExceeded, "{}", e.message);
    assert!(e.message.contains("--max-host-bytes"), "{}", e.message);
    c.host_free(b).unwrap();
    c.host_alloc(512 << 10).unwrap();
}

/// Limits past what the protocol allows are refused at start, naming the flag.
#[test]
fn limits_past_the_protocols_ceilings_are_refused_at_start() {
    let err = refused_start(&["--max-streams".as_ref(), "256".as_ref()]);
    assert!(err.contains("--max-streams"), "{err}");
    let err = refused_start(&["--max-module-bytes".as_ref(), "1GiB".as_ref()]);
    assert!(err.contains("--max-module-bytes"), "{err}");
}

/// A server that stops reading its socket (a user can SIGSTOP their own server) holds up only
/// its own clients: the daemon hands clients over from a queue of each server's own, so other
/// groups are routed at once, and past the queue's bound the stopped server's clients are
/// refused with the reason, never left to block the daemon.
#[test]
fn a_stopped_server_holds_up_its_own_clients_only() {
    if std::env::var("MPS_TEST_ROLE").as_deref() == Ok("other-group") {
        let c = mpsclient::Client::connect(None).expect("group b is routed");
        c.mem_alloc(4096).unwrap();
        return;
    }
    let d = TestDaemon::start("security-stopped", &[]);
    // Group a's server, started by a first client, then stopped.
    d.client().mem_alloc(4096).unwrap();
    let stopped = nix::unistd::Pid::from_raw(d.server_pids()[0] as i32);
    nix::sys::signal::kill(stopped, nix::sys::signal::Signal::SIGSTOP).unwrap();
    struct Resume(nix::unistd::Pid);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }
    let _resume = Resume(stopped);
    // More clients for it than its queue and socket hold, each a hello sent at once.
    let waiting: Vec<UnixStream> = (0..600)
        .map(|_| {
            let s = UnixStream::connect(d.dir.join(socket::SOCKET_NAME)).unwrap();
            socket::send(&s, bytemuck::bytes_of(&hello()), &[]).unwrap();
            s
        })
        .collect();
    // Another group is routed (and served) while group a's server is stopped.
    let other = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["a_stopped_server_holds_up_its_own_clients_only", "--exact"])
        .env("MPS_TEST_ROLE", "other-group")
        .env("MPS_PIPE_DIRECTORY", &d.dir)
        .env("MPS_GROUP", "b")
        .output()
        .unwrap();
    assert!(
        other.status.success(),
        "{}",
        String::from_utf8_lossy(&other.stderr)
    );
    // Beyond what the stopped server can be given, its clients are refused with the reason.
    wait_until("no client of the stopped server was refused", || {
        waiting.iter().any(closed_by_server)
    });
    let refused = waiting.iter().find(|s| closed_by_server(s)).unwrap();
    let why = refusal(refused);
    assert!(why.contains("clients waiting to be taken"), "{why}");
}
