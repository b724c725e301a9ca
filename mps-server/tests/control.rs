//! The control daemon against real processes: routing clients to one server per (user, group),
//! and every operator command, on the simulator.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::io::Write;

use common::daemon::TestDaemon;
use common::*;
use mpsclient::{Client, Status, Stream};

/// Starts `cmd` with standard input and output piped, and returns it with the first line it
/// printed that `said` accepts; the rest of its output is read on a thread of its own, so the
/// client's test harness reports on a live pipe.
fn spawn_until(mut cmd: Command, said: impl Fn(&str) -> bool) -> (Child, String) {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let line = lines
        .find_map(|l| l.ok().filter(|l| said(l)))
        .expect("the client ended without saying what was expected");
    std::thread::spawn(move || lines.for_each(drop));
    (child, line)
}

/// Lets a client started by [`spawn_until`] go on (it waits for a line); it must succeed.
fn release(mut child: Child) {
    let _ = child.stdin.take().unwrap().write_all(b"go\n");
    assert!(child.wait().unwrap().success(), "a client failed");
}

/// The log of this user's server of group `default`.
fn server_log() -> String {
    format!("server-{}-default.log", nix::unistd::geteuid().as_raw())
}

/// Allocates, fills and reads back a little memory: proof that the connection is served.
fn touch(c: &Client) {
    let p = c.mem_alloc(4096).unwrap();
    c.memset_d32(p, 0xfeed, 1024, Stream::DEFAULT).unwrap();
    let mut b = [0u8; 8];
    c.memcpy_dtoh(&mut b, p, Stream::DEFAULT).unwrap();
    assert_eq!(b, [0xed, 0xfe, 0, 0, 0xed, 0xfe, 0, 0]);
    c.mem_free(p).unwrap();
}

#[test]
fn the_daemon_routes_clients_to_one_server_per_group() {
    if let Some(role) = role() {
        // A client of another group, in a process of its own (the group comes from its
        // environment).
        assert_eq!(role, "critical");
        touch(&Client::connect(None).unwrap());
        return;
    }
    let d = TestDaemon::start("control", &[]);
    let a = d.client();
    touch(&a);
    let b = d.client();
    touch(&b);
    assert_eq!(
        d.server_pids().len(),
        1,
        "two clients of one group share a server"
    );
    d.run_role(
        "the_daemon_routes_clients_to_one_server_per_group",
        "critical",
        &[("MPS_GROUP", "critical")],
    );
    assert_eq!(
        d.server_pids().len(),
        2,
        "a second group gets a server of its own"
    );
    let status = d.ctl_ok(&["status"]);
    assert!(
        status.contains("default") && status.contains("critical"),
        "{status}"
    );
    for log in [
        "control.log",
        "server-0-default.log",
        "server-0-critical.log",
    ] {
        let uid = nix::unistd::geteuid().as_raw();
        let log = log.replace("-0-", &format!("-{uid}-"));
        assert!(d.dir.join(&log).exists(), "{log} missing");
    }
}

#[test]
fn a_bad_group_name_is_refused_with_the_reason() {
    if role().is_some() {
        let e = Client::connect(None).unwrap_err();
        assert_eq!(e.status, Status::InvalidValue, "{e}");
        assert!(e.message.contains("MPS_GROUP"), "{e}");
        return;
    }
    let d = TestDaemon::start("control", &[]);
    d.run_role(
        "a_bad_group_name_is_refused_with_the_reason",
        "bad",
        &[("MPS_GROUP", "../escape")],
    );
    assert!(d.server_pids().is_empty());
}

#[test]
fn operator_commands_work_and_bad_ones_get_one_line_errors() {
    let d = TestDaemon::start("control", &[]);
    let c = d.client();
    touch(&c);
    let pids = d.server_pids();
    assert_eq!(pids.len(), 1);
    let pid = pids[0].to_string();
    assert_eq!(d.ctl_ok(&["get_server_status", &pid]), "ACTIVE\n");

    for bad in [
        vec!["frobnicate"],
        vec!["get_server_status", "abc"],
        vec!["shutdown_server"],
        vec!["shutdown_server", &pid, "-x"],
        vec!["quit", "-t", "soon"],
        vec!["get_server_status", "999999"],
    ] {
        let out = d.ctl(&bad);
        assert!(!out.status.success(), "{bad:?} succeeded");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("error: ") && text.lines().count() == 1,
            "{bad:?}: {text}"
        );
    }
    // Commands from standard input, as operators pipe them.
    let mut child = Command::new(control_bin())
        .arg("--pipe-dir")
        .arg(&d.dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        format!("get_server_list\nget_server_status {pid}\n").as_bytes(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("{pid}\nACTIVE\n")
    );

    // Shutting a server down ends its clients' connections; the next client gets a new one.
    // Without -f the server is asked to stop (SIGTERM) and given time to: it stops by itself.
    assert!(d.ctl_ok(&["shutdown_server", &pid]).contains("stopped"));
    assert!(d.server_pids().is_empty());
    d.wait_for_log("control.log", &format!("server stopped pid={pid}"));
    d.wait_for_log(&server_log(), "stopping");
    let e = c.mem_alloc(16).unwrap_err();
    assert_eq!(e.status, Status::Connection, "{e}");
    let fresh = d.client();
    touch(&fresh);
    let again = d.server_pids();
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].to_string(), pid);
    // -f gives it no time: it is killed (SIGKILL) right after it is asked.
    let second = again[0].to_string();
    assert!(
        d.ctl_ok(&["shutdown_server", &second, "-f"])
            .contains("stopped")
    );
    assert!(d.server_pids().is_empty());
    d.wait_for_log("control.log", &format!("server killed pid={second}"));
    assert!(
        !d.log("control.log")
            .contains(&format!("server stopped pid={second}")),
        "{}",
        d.log("control.log")
    );
    let e = fresh.mem_alloc(16).unwrap_err();
    assert_eq!(e.status, Status::Connection, "{e}");

    // The daemon outlived every bad command; quit stops it and its servers.
    let mut d = d;
    assert_eq!(d.ctl_ok(&["quit", "-t", "2"]), "quitting\n");
    wait_until("the daemon to exit after quit", || d.exited(), |e| *e);
    assert!(!d.dir.join("mps.sock").exists());
    let server = nix::unistd::Pid::from_raw(again[0] as i32);
    assert!(
        nix::sys::signal::kill(server, None).is_err(),
        "server {server} outlived quit"
    );
}

/// `quit -t <seconds>` is how long each server is given to stop by itself once asked (SIGTERM)
/// before it is killed (SIGKILL): with time, it stops; with 0, it is killed at once.
#[test]
fn quit_gives_servers_its_timeout_to_stop() {
    for (secs, fate) in [("5", "stopped"), ("0", "killed")] {
        let mut d = TestDaemon::start("control", &[]);
        touch(&d.client());
        let pid = d.server_pids()[0];
        assert_eq!(d.ctl_ok(&["quit", "-t", secs]), "quitting\n");
        let log = d.wait_for_log("control.log", &format!("server {fate} pid={pid}"));
        let other = if fate == "killed" {
            "stopped"
        } else {
            "killed"
        };
        assert!(
            !log.contains(&format!("server {other} pid={pid}")),
            "quit -t {secs}:\n{log}"
        );
        wait_until("the daemon to exit after quit", || d.exited(), |e| *e);
    }
}

/// Without --pipe-dir and --log-dir, the daemon and its servers use $MPS_PIPE_DIRECTORY and
/// $MPS_LOG_DIRECTORY, and the command client finds the daemon through $MPS_PIPE_DIRECTORY.
#[test]
fn the_directories_come_from_the_environment() {
    let (pipe, logs) = (temp_dir("env-pipe"), temp_dir("env-log"));
    let mut daemon = Command::new(control_bin())
        .arg("-f")
        .args(["--backend", "sim", "--sim-memory", "64MiB", "--server"])
        .arg(server_bin())
        .env("MPS_PIPE_DIRECTORY", &pipe)
        .env("MPS_LOG_DIRECTORY", &logs)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(
        "the daemon's control socket in $MPS_PIPE_DIRECTORY",
        || std::os::unix::net::UnixStream::connect(pipe.join("control.sock")).is_ok(),
        |up| *up,
    );
    touch(&Client::connect(Some(&pipe)).unwrap());
    let ctl = |word: &str| {
        Command::new(control_bin())
            .arg(word)
            .env("MPS_PIPE_DIRECTORY", &pipe)
            .output()
            .unwrap()
    };
    let servers = ctl("get_server_list");
    assert!(servers.status.success());
    assert_eq!(String::from_utf8_lossy(&servers.stdout).lines().count(), 1);
    let names = |dir: &std::path::Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&logs), ["control.log".to_string(), server_log()]);
    assert!(names(&pipe).is_empty(), "logs in the pipe directory");
    let log = std::fs::read_to_string(logs.join("control.log")).unwrap();
    assert!(log.contains("started a server"), "{log}");
    assert!(ctl("quit").status.success());
    let status = daemon.wait().unwrap();
    assert!(status.success(), "{status}");
    for d in [pipe, logs] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A kernel fault ends at most its own group's server: a client of another group, with its
/// own server, keeps its memory, its data and its server and goes on working. (On a GPU the
/// fault ends the faulting server's context; on the simulator only the faulting client.)
#[test]
fn a_fault_in_one_group_leaves_another_group_untouched() {
    const TEST: &str = "a_fault_in_one_group_leaves_another_group_untouched";
    if role().is_some() {
        let c = Client::connect(None).unwrap();
        let m = c.module_load(&ptx()).unwrap();
        let fault = c.module_get_function(m, "fault_write").unwrap();
        let dim = mpsclient::Dim3 { x: 1, y: 1, z: 1 };
        c.launch(
            fault,
            dim,
            dim,
            0,
            Stream::DEFAULT,
            &[&0x10u64.to_le_bytes()],
        )
        .unwrap();
        let e = c.synchronize().unwrap_err();
        assert_eq!(e.status, Status::IllegalAddress, "{e}");
        println!("faulted: {e}");
        return;
    }
    let d = TestDaemon::start("control", &[]);
    let c = d.client();
    let n = 4096u64;
    let p = c.mem_alloc(n * 4).unwrap();
    c.memset_d32(p, 0x5eed, n, Stream::DEFAULT).unwrap();
    c.synchronize().unwrap();
    let mine = d.server_pids();
    d.run_role(TEST, "faulter", &[("MPS_GROUP", "faulty")]);
    // The other group's server stays, its client's data is as it was, and new work runs.
    assert!(
        d.server_pids().contains(&mine[0]),
        "this group's server {} is gone: {:?}",
        mine[0],
        d.server_pids()
    );
    let mut words = vec![0u8; (n * 4) as usize];
    c.memcpy_dtoh(&mut words, p, Stream::DEFAULT).unwrap();
    assert!(words.chunks(4).all(|w| w == 0x5eedu32.to_le_bytes()));
    touch(&c);
    touch(&d.client());
    c.mem_free(p).unwrap();
    let log = d.log(&server_log());
    assert!(
        !log.contains("fault_write"),
        "this group's server saw the fault:\n{log}"
    );
}

#[test]
fn dash_d_starts_the_daemon_in_the_background() {
    let dir = temp_dir("control-bg");
    let out = Command::new(control_bin())
        .arg("-d")
        .args(["--backend", "sim", "--sim-memory", "64MiB", "--server"])
        .arg(server_bin())
        .arg("--pipe-dir")
        .arg(&dir)
        .arg("--log-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid: i32 = std::fs::read_to_string(dir.join("mps-control.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    touch(&Client::connect(Some(&dir)).unwrap());
    let out = Command::new(control_bin())
        .arg("--pipe-dir")
        .arg(&dir)
        .arg("quit")
        .output()
        .unwrap();
    assert!(out.status.success());
    // The daemon is not our child (the -d process that started it has exited), so watch for
    // what it does last: it removes its pid file and sockets, or it is gone (or a zombie).
    let deadline = Instant::now() + Duration::from_secs(20);
    let gone = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
    };
    while dir.join("mps-control.pid").exists() || !gone() {
        assert!(Instant::now() < deadline, "daemon {pid} did not quit");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!dir.join("control.sock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_memory_limits_hold() {
    if let Some(role) = role() {
        // A client that lowers its own limit, or tries to raise it.
        let c = Client::connect(None).unwrap();
        let (_, total) = c.mem_get_info().unwrap();
        let want: u64 = role.parse().unwrap();
        assert_eq!(
            total, want,
            "limit seen by a client with MPS_PINNED_DEVICE_MEM_LIMIT"
        );
        return;
    }
    let d = TestDaemon::start("control", &[]);
    for bad in [
        // A device the daemon does not serve (it serves what the machine has).
        vec!["set_default_device_pinned_mem_limit", "99", "1G"],
        vec!["set_default_device_pinned_mem_limit", "0", "lots"],
        vec!["set_default_device_pinned_mem_limit", "0"],
    ] {
        assert!(!d.ctl(&bad).status.success(), "{bad:?}");
    }
    d.ctl_ok(&["set_default_device_pinned_mem_limit", "0", "1MiB"]);
    assert_eq!(
        d.ctl_ok(&["get_default_device_pinned_mem_limit", "0"]),
        "1048576\n"
    );
    let c = d.client();
    let (free, total) = c.mem_get_info().unwrap();
    assert_eq!((free, total), (1 << 20, 1 << 20));
    let p = c.mem_alloc(512 << 10).unwrap();
    let e = c.mem_alloc(600 << 10).unwrap_err();
    assert_eq!(e.status, Status::QuotaExceeded, "{e}");
    assert!(e.message.contains("limit of 1048576"), "{e}");
    assert_eq!(c.mem_get_info().unwrap(), (512 << 10, 1 << 20));
    c.mem_free(p).unwrap();
    c.mem_alloc(1 << 20).unwrap();

    let child = |env: &str, expect: u64| {
        d.run_role(
            "device_memory_limits_hold",
            &expect.to_string(),
            &[("MPS_PINNED_DEVICE_MEM_LIMIT", env)],
        );
    };
    child("0=256K", 256 << 10);
    child("0=4M", 1 << 20);
    child("1=64K,0=128K", 128 << 10);

    // A live change for one server applies to its new clients.
    let pid = d.server_pids()[0].to_string();
    d.ctl_ok(&["set_device_pinned_mem_limit", &pid, "0", "2MiB"]);
    assert_eq!(d.client().mem_get_info().unwrap().1, 2 << 20);
    assert_eq!(
        c.mem_get_info().unwrap().1,
        1 << 20,
        "existing clients keep theirs"
    );
}

#[test]
fn clients_are_listed_counted_and_terminated() {
    let d = TestDaemon::start("control", &[]);
    let a = d.client();
    let b = d.client();
    touch(&a);
    touch(&b);
    let pid = d.server_pids()[0].to_string();
    let me = std::process::id().to_string();
    assert_eq!(d.ctl_ok(&["get_client_list", &pid]), format!("{me}\n"));
    // With -v, one line per connection with its counters.
    let verbose = d.ctl_ok(&["get_client_list", &pid, "-v"]);
    assert_eq!(verbose.lines().count(), 2, "{verbose}");
    for line in verbose.lines() {
        assert!(line.starts_with(&format!("{me} ")), "{line}");
        for key in ["mem=", "launches=", "bytes_copied=8", "gpu_ms=", "sms="] {
            assert!(line.contains(key), "{key} missing in {line}");
        }
    }
    assert!(!d.ctl(&["get_client_list", &pid, "-x"]).status.success());
    // touch() copies 8 bytes out once per client.
    assert_eq!(
        d.status_field(std::process::id(), "BYTES-COPIED")
            .as_deref(),
        Some("8"),
        "{}",
        d.ctl_ok(&["status"])
    );
    assert!(!d.ctl(&["terminate_client", &pid, "1"]).status.success());
    assert!(!d.ctl(&["terminate_client", &pid]).status.success());
    assert!(
        d.ctl_ok(&["terminate_client", &pid, &me])
            .contains("2 connection(s)")
    );
    for c in [&a, &b] {
        let e = c.mem_alloc(16).unwrap_err();
        assert_eq!(e.status, Status::Connection, "{e}");
    }
    // The server forgets them once their sessions have released what they held.
    wait_for_value(
        "the client list after terminate_client",
        || d.ctl_ok(&["get_client_list", &pid]),
        String::new(),
    );
}

/// The user every uid-routing test runs its second client as (`.ci/run` creates it).
const TEST_USER: &str = "mpstest";

#[test]
fn each_user_gets_a_server_of_their_own_running_as_them() {
    if let Some(role) = role() {
        assert_eq!(role, "other-user");
        touch(&Client::connect(None).unwrap());
        return;
    }
    const TEST: &str = "each_user_gets_a_server_of_their_own_running_as_them";
    if !nix::unistd::geteuid().is_root() {
        skip_unless_ci(TEST, "needs root, to start a server as another user");
        return;
    }
    let Some(user) = nix::unistd::User::from_name(TEST_USER).ok().flatten() else {
        skip_unless_ci(TEST, &format!("needs a user named {TEST_USER}"));
        return;
    };
    // The other user runs this test binary and the server binary: copies of both in a directory
    // anyone may enter (a checkout under /root is not one).
    let bin = temp_dir("bin");
    let copy = |from: std::path::PathBuf| {
        let to = bin.join(from.file_name().unwrap());
        std::fs::copy(&from, &to).unwrap();
        to
    };
    let (exe, server) = (copy(std::env::current_exe().unwrap()), copy(server_bin()));
    for binary in [&exe, &server] {
        assert!(
            reachable_by_others(binary),
            "{} is not reachable by other users",
            binary.display()
        );
    }
    let d = TestDaemon::start_serving("control", &server, &[]);
    touch(&d.client());
    let out = d
        .role_of(&exe, TEST, "other-user", &[])
        .uid(user.uid.as_raw())
        .gid(user.gid.as_raw())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client as {TEST_USER}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let servers = d.server_pids();
    assert_eq!(servers.len(), 2, "one server per user");
    let uids: Vec<u32> = servers
        .iter()
        .map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
            line.split_whitespace().nth(2).unwrap().parse().unwrap()
        })
        .collect();
    assert!(
        uids.contains(&0) && uids.contains(&user.uid.as_raw()),
        "{uids:?}"
    );
    // The other user's server directory is theirs alone.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(d.dir.join(format!("servers/{}-default", user.uid))).unwrap();
    assert_eq!(meta.uid(), user.uid.as_raw());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    drop(d);
    let _ = std::fs::remove_dir_all(&bin);
}

#[test]
fn metrics_are_served_in_prometheus_text_format() {
    let d = TestDaemon::start(
        "control",
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--device-pinned-mem-limit",
            "64MiB",
            "--active-thread-percentage",
            "50",
        ],
    );
    let c = d.client();
    touch(&c);
    let held = c.mem_alloc(1 << 20).unwrap();
    let addr = std::fs::read_to_string(d.dir.join("metrics.addr")).unwrap();
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(addr.trim()).unwrap();
        std::io::Write::write_all(
            &mut s,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut s, &mut text).unwrap();
        text
    };
    let text = get("/metrics");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains("mps_servers 1"), "{text}");
    let me = std::process::id();
    let copied = text
        .lines()
        .find(|l| {
            l.starts_with("mps_client_copied_bytes_total{")
                && l.contains(&format!("client_pid=\"{me}\""))
        })
        .unwrap_or_else(|| panic!("no copied-bytes sample for this client:\n{text}"));
    assert!(copied.ends_with(" 8"), "{copied}");
    // This client's limit, what it holds, and the SMs its share gives it.
    let sample = |name: &str| -> String {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{")) && l.contains(&format!("client_pid=\"{me}\""))
            })
            .unwrap_or_else(|| panic!("no {name} sample for this client:\n{text}"));
        line.rsplit(' ').next().unwrap().to_string()
    };
    assert_eq!(
        sample("mps_client_device_memory_limit_bytes"),
        (64u64 << 20).to_string()
    );
    assert_eq!(
        sample("mps_client_device_memory_bytes"),
        (1u64 << 20).to_string()
    );
    let sms = c.sm_info().unwrap();
    assert_eq!(sms.share_percent, 50);
    assert!(sms.sms < sms.device_sms, "{sms:?}");
    assert_eq!(sample("mps_client_sms"), sms.sms.to_string());
    assert_eq!(sample("mps_client_sm_reserved_percent"), "0");
    c.mem_free(held).unwrap();
    assert!(
        text.contains("# TYPE mps_client_launches_total counter"),
        "{text}"
    );
    assert!(get("/other").starts_with("HTTP/1.1 404"));
}

/// Whether every directory above `path` lets others through and `path` lets them read and run it.
fn reachable_by_others(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.permissions().mode());
    mode(path).is_ok_and(|m| m & 0o005 == 0o005)
        && path
            .ancestors()
            .skip(1)
            .all(|dir| mode(dir).is_ok_and(|m| m & 0o001 != 0))
}

/// Nice values of a server's session threads (named client-N).
fn session_nice_values(server_pid: u32) -> Vec<i64> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{server_pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("client-") {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        // Fields after the command name: state is field 3, nice field 19.
        if let Some(nice) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(16))
        {
            out.push(nice.parse().unwrap());
        }
    }
    out.sort();
    out
}

#[test]
fn client_priorities_hold() {
    if let Some(role) = role() {
        match Client::connect(None) {
            Ok(c) => {
                touch(&c);
                println!("ready");
                let mut line = String::new();
                std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line).unwrap();
            }
            Err(e) => {
                assert_eq!(role, "bad");
                assert_eq!(e.status, Status::InvalidValue, "{e}");
                assert!(e.message.contains("MPS_CLIENT_PRIORITY"), "{e}");
            }
        }
        return;
    }
    let d = TestDaemon::start("control", &[]);
    let normal = d.client();
    touch(&normal);
    let spawn = |role: &str, level: &str| {
        let cmd = d.role(
            "client_priorities_hold",
            role,
            &[("MPS_CLIENT_PRIORITY", level)],
        );
        spawn_until(cmd, |l| l.ends_with("ready")).0
    };
    d.run_role(
        "client_priorities_hold",
        "bad",
        &[("MPS_CLIENT_PRIORITY", "7")],
    );

    let low = spawn("low", "1");
    let server = d.server_pids()[0];
    // (The refused client's session thread, if it had one, may still be ending.)
    wait_for_value(
        "nice values of the normal and below-normal session threads",
        || session_nice_values(server),
        vec![0, 10],
    );
    let priority_of = |pid: u32| d.status_field(pid, "PRIORITY");
    assert_eq!(priority_of(low.id()).as_deref(), Some("1"));
    assert_eq!(priority_of(std::process::id()).as_deref(), Some("0"));
    release(low);

    // The operator lowers everyone's default; a client cannot raise itself above it.
    assert!(
        !d.ctl(&["set_default_client_priority", "2"])
            .status
            .success()
    );
    d.ctl_ok(&["set_default_client_priority", "1"]);
    assert_eq!(d.ctl_ok(&["get_default_client_priority"]), "1\n");
    let raise = spawn("raise", "0");
    assert_eq!(priority_of(raise.id()).as_deref(), Some("1"));
    release(raise);
}

/// Starts this test binary as a client of `d`'s with `env`, in the role that reports its SMs
/// and then holds them; returns it with the line it printed.
/// Waits until this process has no client on server `pid` (a dropped client's session ends a
/// moment after its process let it go).
fn wait_until_gone(d: &TestDaemon, pid: &str) {
    let me = std::process::id().to_string();
    wait_for_value(
        "this process's client gone from the server",
        || d.ctl_ok(&["get_client_list", pid]).lines().any(|l| l == me),
        false,
    );
}

fn sm_client(d: &TestDaemon, test: &str, env: &[(&str, &str)]) -> (Child, String) {
    spawn_until(d.role(test, "client", env), |l| {
        l.starts_with("sms=") || l.starts_with("refused=")
    })
}

/// Queues work on `c`'s default stream, has the operator change the share of `c`'s server to
/// `share` (so the stream moves to another partition at its next submission), queues more, and
/// checks that the stream's order held across the move: a fill queued after the move must not
/// overtake the additions queued before it.
fn order_holds_across_a_move(d: &TestDaemon, c: &Client, pid: &str, share: &str) {
    let dim = |x| mpsclient::Dim3 { x, y: 1, z: 1 };
    let m = c.module_load(&ptx()).unwrap();
    let saxpy = c.module_get_function(m, "saxpy_f32").unwrap();
    // Large on a GPU, so that overlapping kernels would race; small on the simulator, whose
    // kernels are slow.
    let n: u64 = if on_gpu() { 1 << 20 } else { 1 << 12 };
    let (x, y) = (c.mem_alloc(n * 4).unwrap(), c.mem_alloc(n * 4).unwrap());
    c.memset_d32(x, 1.0f32.to_bits(), n, Stream::DEFAULT)
        .unwrap();
    c.memset_d32(y, 0, n, Stream::DEFAULT).unwrap();
    let add = |times| {
        for _ in 0..times {
            let args: [&[u8]; 4] = [
                &1.0f32.to_le_bytes(),
                &x.0.to_le_bytes(),
                &y.0.to_le_bytes(),
                &n.to_le_bytes(),
            ];
            c.launch(saxpy, dim(64), dim(256), 0, Stream::DEFAULT, &args)
                .unwrap();
        }
    };
    add(100);
    let before = c.sm_info().unwrap().sms;
    d.ctl_ok(&["set_active_thread_percentage", pid, share]);
    assert_ne!(
        c.sm_info().unwrap().sms,
        before,
        "the share did not move the client"
    );
    c.memset_d32(y, 1000.0f32.to_bits(), n, Stream::DEFAULT)
        .unwrap();
    add(100);
    let mut out = vec![0u8; (n * 4) as usize];
    c.memcpy_dtoh(&mut out, y, Stream::DEFAULT).unwrap();
    let wrong = out
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .filter(|v| *v != 1100.0)
        .count();
    assert_eq!(
        wrong, 0,
        "{wrong} of {n} elements are not 1100 after the move"
    );
    c.mem_free(x).unwrap();
    c.mem_free(y).unwrap();
    c.module_unload(m).unwrap();
}

/// A client's SMs as `sm_info` reports them: "sms/device".
fn sms_of(c: &Client) -> String {
    let i = c.sm_info().unwrap();
    format!("{}/{}", i.sms, i.device_sms)
}

/// Milliseconds, between events recorded around it, of a kernel of `blocks` blocks of `threads`
/// threads that each spin for `ms` milliseconds (the simulator runs one block per SM at a time;
/// an H200 two blocks of 1024).
fn spin_ms(c: &Client, blocks: u32, threads: u32, ms: u64) -> f64 {
    let m = c.module_load(&ptx()).unwrap();
    let spin = c.module_get_function(m, "spin_ns").unwrap();
    let ctr = c.mem_alloc(4).unwrap();
    let (start, end) = (c.event_create().unwrap(), c.event_create().unwrap());
    c.event_record(start, Stream::DEFAULT).unwrap();
    c.launch(
        spin,
        mpsclient::Dim3 {
            x: blocks,
            y: 1,
            z: 1,
        },
        mpsclient::Dim3 {
            x: threads,
            y: 1,
            z: 1,
        },
        0,
        Stream::DEFAULT,
        &[&(ms * 1_000_000).to_le_bytes(), &ctr.0.to_le_bytes()],
    )
    .unwrap();
    c.event_record(end, Stream::DEFAULT).unwrap();
    c.event_synchronize(end).unwrap();
    let elapsed = c.event_elapsed_ms(start, end).unwrap();
    for e in [start, end] {
        c.event_destroy(e).unwrap();
    }
    c.mem_free(ctr).unwrap();
    c.module_unload(m).unwrap();
    f64::from(elapsed)
}

#[test]
fn sm_shares_and_reservations_hold() {
    if role().is_some() {
        // A client started with MPS_SM_RESERVE or MPS_ACTIVE_THREAD_PERCENTAGE: it reports its
        // SMs, then holds them until told to go.
        match Client::connect(None) {
            Ok(c) => {
                // Its kernels run where it was placed.
                spin_ms(&c, 1, 32, 1);
                println!("sms={}", sms_of(&c));
                let mut line = String::new();
                std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line).unwrap();
            }
            Err(e) => println!("refused={:?}: {}", e.status, e.message),
        }
        return;
    }
    if on_gpu() {
        skip(
            "sm_shares_and_reservations_hold",
            "checks the simulator's SM model; sm_partitions_hold_on_the_gpu covers the GPU",
        );
        return;
    }
    let d = TestDaemon::start("control", &[]);
    let spawn = |env: &[(&str, &str)]| sm_client(&d, "sm_shares_and_reservations_hold", env);
    for bad in [
        vec!["set_default_active_thread_percentage", "0"],
        vec!["set_default_active_thread_percentage", "101"],
        vec!["set_default_active_thread_percentage"],
        vec!["set_active_thread_percentage", "1", "50"],
        vec!["set_max_sm_reservation", "default", "101"],
        vec!["get_max_sm_reservation"],
    ] {
        let out = d.ctl(&bad);
        assert!(!out.status.success(), "{bad:?} was accepted");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("error: ") && text.lines().count() == 1,
            "{bad:?}: {text}"
        );
    }
    assert_eq!(d.ctl_ok(&["get_default_active_thread_percentage"]), "100\n");
    assert_eq!(d.ctl_ok(&["get_max_sm_reservation", "default"]), "50\n");

    // The simulator has 16 SMs. A first client has them all, and is told so.
    let c = d.client();
    assert_eq!(sms_of(&c), "16/16");
    let pid = d.server_pids()[0].to_string();

    // What a client was told is kept: a reservation that would leave it fewer SMs is refused,
    // naming it (libraries size kernels by the SMs the program was told of).
    let (refused, said) = spawn(&[("MPS_SM_RESERVE", "25")]);
    assert!(
        said.starts_with("refused=QuotaExceeded") && said.contains("it was told"),
        "{said}"
    );
    release(refused);
    assert_eq!(sms_of(&c), "16/16");
    drop(c);
    wait_until_gone(&d, &pid);

    // A reservation takes SMs from everyone else; a share caps a client within the rest.
    let (reserver, said) = spawn(&[("MPS_SM_RESERVE", "25")]);
    assert_eq!(said, "sms=4/16");
    let c = d.client();
    assert_eq!(sms_of(&c), "12/16", "the others share what is left");
    let (sharer, said) = spawn(&[("MPS_ACTIVE_THREAD_PERCENTAGE", "25")]);
    assert_eq!(said, "sms=4/16");

    // Past the ceiling a reservation is refused, with the reason; the operator can raise it.
    let (refused, said) = spawn(&[("MPS_SM_RESERVE", "30")]);
    assert!(
        said.starts_with("refused=QuotaExceeded") && said.contains("set_max_sm_reservation"),
        "{said}"
    );
    release(refused);
    let (bad, said) = spawn(&[("MPS_SM_RESERVE", "0")]);
    assert!(said.contains("MPS_SM_RESERVE"), "{said}");
    release(bad);
    d.ctl_ok(&["set_max_sm_reservation", &pid, "60"]);
    assert_eq!(d.ctl_ok(&["get_max_sm_reservation", &pid]), "60\n");
    // 30% more would leave this client 7 of the 12 SMs it was told of; the sharer keeps its 4.
    let (refused, said) = spawn(&[("MPS_SM_RESERVE", "30")]);
    assert!(said.contains("it was told"), "{said}");
    release(refused);
    drop(c);
    wait_until_gone(&d, &pid);
    let (second, said) = spawn(&[("MPS_SM_RESERVE", "30")]);
    assert_eq!(said, "sms=5/16", "30% of 16 SMs rounds up");
    let c = d.client();
    assert_eq!(sms_of(&c), "7/16");
    let status = d.ctl_ok(&["status"]);
    assert!(
        status.contains("RESERVED%") && status.contains("GPU-MS"),
        "{status}"
    );

    // Reserved SMs come back when their client leaves (its session gives them back as it ends,
    // after the process has exited).
    release(second);
    release(reserver);
    release(sharer);
    wait_for_value("this client's SMs", || sms_of(&c), "16/16".into());

    // The operator's live share applies to running clients at once, in stream order.
    order_holds_across_a_move(&d, &c, &pid, "50");
    d.ctl_ok(&["set_active_thread_percentage", &pid, "100"]);

    // Kernels feel the share: the simulator runs a kernel's blocks in waves of one block per SM
    // the client has, so 16 blocks of 20 ms on 4 SMs are 4 waves, at least 80 ms between the
    // kernel's events (a lower bound, which a loaded machine cannot break; on all 16 SMs they
    // would be one wave of 20 ms).
    let full = spin_ms(&c, 16, 32, 20);
    assert!(
        full >= 20.0,
        "16 blocks on 16 SMs: one wave of 20 ms, not {full} ms"
    );
    d.ctl_ok(&["set_active_thread_percentage", &pid, "25"]);
    assert_eq!(d.ctl_ok(&["get_active_thread_percentage", &pid]), "25\n");
    assert_eq!(sms_of(&c), "4/16");
    let quarter = spin_ms(&c, 16, 32, 20);
    assert!(
        quarter >= 80.0,
        "16 blocks on 4 SMs took {quarter:.1} ms: fewer than 4 waves of 20 ms"
    );
    // GPU busy time counts what the client ran: at least the 20 + 80 ms of kernels (and not,
    // say, nanoseconds read as milliseconds).
    let gpu_ms: u64 = d
        .status_field(std::process::id(), "GPU-MS")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no GPU-MS for this client in {}", d.ctl_ok(&["status"])));
    assert!(
        (100..10_000).contains(&gpu_ms),
        "ran 20 + 80 ms of kernels, GPU-MS says {gpu_ms}"
    );

    // A new default applies to new servers (here: a new group's).
    d.ctl_ok(&["set_default_active_thread_percentage", "50"]);
    let (other, said) = spawn(&[("MPS_GROUP", "other")]);
    assert_eq!(said, "sms=8/16");
    release(other);
    assert_eq!(sms_of(&c), "4/16", "running servers keep their own share");
}

#[test]
fn sm_partitions_hold_on_the_gpu() {
    const TEST: &str = "sm_partitions_hold_on_the_gpu";
    if role().is_some() {
        // A client with a reservation: it says its SMs and the ones its kernel ran on, then
        // holds them until told to go.
        let c = Client::connect(None).unwrap();
        let device = c.sm_info().unwrap().device_sms;
        let used: Vec<String> = sms_used(&c, 4 * device, 100_000)
            .iter()
            .map(u32::to_string)
            .collect();
        println!("sms={} used={}", sms_of(&c), used.join(","));
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line).unwrap();
        return;
    }
    if !on_gpu() {
        skip(TEST, "needs a GPU (MPS_TEST_BACKEND=cuda)");
        return;
    }
    let d = TestDaemon::start("control", &[]);
    let c = d.client();
    let device = c.sm_info().unwrap().device_sms;
    assert_eq!(sms_of(&c), format!("{device}/{device}"));
    let pid = d.server_pids()[0].to_string();
    // Four blocks per SM, each resident for a while: the device spreads them over every SM a
    // client's partition holds.
    let blocks = 4 * device;
    let whole = sms_used(&c, blocks, 100_000);
    assert!(
        whole.len() as u32 > device / 2,
        "on the whole device {blocks} blocks ran on {} of {device} SMs",
        whole.len()
    );

    // Moving between partitions keeps stream order, both ways.
    order_holds_across_a_move(&d, &c, &pid, "50");
    order_holds_across_a_move(&d, &c, &pid, "100");

    // A live share: the client's stream moves to a green context of a quarter of the SMs, and
    // its kernels run on no other SM.
    d.ctl_ok(&["set_active_thread_percentage", &pid, "25"]);
    let quarter_sms = c.sm_info().unwrap().sms;
    assert!(
        quarter_sms >= device / 4 && quarter_sms < device / 2,
        "25% of {device} SMs gave {quarter_sms}"
    );
    let quarter = sms_used(&c, blocks, 100_000);
    println!(
        "share 25%: {quarter_sms} SMs; {blocks} blocks ran on {} SMs (whole device: {})",
        quarter.len(),
        whole.len()
    );
    assert!(
        quarter.len() as u32 <= quarter_sms && quarter.len() as u32 > quarter_sms / 2,
        "with {quarter_sms} SMs, {blocks} blocks ran on {} SMs: {quarter:?}",
        quarter.len()
    );
    d.ctl_ok(&["set_active_thread_percentage", &pid, "100"]);

    // A reservation: its SMs leave everyone else's partition; the two run on disjoint SMs. It
    // is made before this process's client comes back, since a reservation may not take a
    // client below the SMs it was told of.
    drop(c);
    wait_until_gone(&d, &pid);
    let (reserver, said) = spawn_until(d.role(TEST, "client", &[("MPS_SM_RESERVE", "25")]), |l| {
        l.starts_with("sms=")
    });
    let c = d.client();
    let (sms, used) = said
        .strip_prefix("sms=")
        .and_then(|r| r.split_once(" used="))
        .unwrap_or_else(|| panic!("{said}"));
    let reserved: u32 = sms
        .split('/')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    let reserved_used: std::collections::BTreeSet<u32> =
        used.split(',').map(|n| n.parse().unwrap()).collect();
    assert!(reserved >= device / 4 && reserved < device / 2, "{said}");
    assert!(reserved_used.len() as u32 <= reserved, "{said}");
    assert_eq!(c.sm_info().unwrap().sms, device - reserved);
    let rest = sms_used(&c, blocks, 100_000);
    println!(
        "reserved {reserved} SMs for another client (its kernel ran on {}); this client's \
         {blocks} blocks ran on {} of the other {}",
        reserved_used.len(),
        rest.len(),
        device - reserved
    );
    assert!(rest.len() as u32 <= device - reserved, "{rest:?}");
    assert!(
        rest.is_disjoint(&reserved_used),
        "SMs used by both: {:?}",
        rest.intersection(&reserved_used).collect::<Vec<_>>()
    );
    release(reserver);
    wait_for_value(
        "this client's SMs after the reservation ended",
        || sms_of(&c),
        format!("{device}/{device}"),
    );
    let again = sms_used(&c, blocks, 100_000);
    assert!(
        again.len() as u32 > device - reserved,
        "back on the whole device, {blocks} blocks ran on only {} SMs",
        again.len()
    );

    // Busy time is sampled while kernels run: a kernel of 50 ms counts at least half of it.
    let before: u64 = d
        .status_field(std::process::id(), "GPU-MS")
        .and_then(|v| v.parse().ok())
        .expect("a GPU-MS column");
    let ran = spin_ms(&c, 2 * device, 1024, 50);
    let gpu_ms = wait_until(
        &format!("GPU-MS (from {before}) across a kernel of {ran:.1} ms"),
        || {
            d.status_field(std::process::id(), "GPU-MS")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        },
        |ms| ms.saturating_sub(before) as f64 >= 0.5 * ran,
    );
    println!("GPU-MS {before} -> {gpu_ms} across a kernel of {ran:.1} ms");
}

#[test]
fn the_daemons_flags_set_the_defaults_its_commands_report() {
    let d = TestDaemon::start(
        "control",
        &[
            "--active-thread-percentage",
            "50",
            "--max-sm-reservation",
            "20",
            "--client-priority",
            "1",
            "--device-pinned-mem-limit",
            "64MiB",
        ],
    );
    assert_eq!(d.ctl_ok(&["get_default_active_thread_percentage"]), "50\n");
    assert_eq!(d.ctl_ok(&["get_max_sm_reservation", "default"]), "20\n");
    assert_eq!(d.ctl_ok(&["get_default_client_priority"]), "1\n");
    assert_eq!(
        d.ctl_ok(&["get_default_device_pinned_mem_limit", "0"]),
        format!("{}\n", 64u64 << 20)
    );
    let c = d.client();
    assert_eq!(c.mem_get_info().unwrap().1, 64 << 20);
    let sms = c.sm_info().unwrap();
    assert_eq!(sms.share_percent, 50);
    // Half the SMs, rounded up to the device's partition size.
    assert!(
        sms.sms * 2 >= sms.device_sms && sms.sms < sms.device_sms,
        "{sms:?}"
    );
}

/// As NVIDIA's control daemon, the daemon takes its clients' defaults from `CUDA_MPS_*` in its
/// own environment where mps's `MPS_*` names are unset, and a flag wins over both.
#[test]
fn the_daemons_environment_sets_defaults_in_nvidias_names_and_flags_win() {
    let d = TestDaemon::launch("control", &server_bin(), &[], |cmd| {
        cmd.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40")
            .env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=48MiB")
            .env("CUDA_MPS_CLIENT_PRIORITY", "1")
            .env("MPS_CLIENT_PRIORITY", "0");
    });
    assert_eq!(d.ctl_ok(&["get_default_active_thread_percentage"]), "40\n");
    assert_eq!(d.ctl_ok(&["get_default_client_priority"]), "0\n");
    assert_eq!(
        d.ctl_ok(&["get_default_device_pinned_mem_limit", "0"]),
        format!("{}\n", 48u64 << 20)
    );
    assert_eq!(d.client().mem_get_info().unwrap().1, 48 << 20);
    let flagged = TestDaemon::launch(
        "control",
        &server_bin(),
        &["--active-thread-percentage", "70"],
        |cmd| {
            cmd.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40");
        },
    );
    assert_eq!(
        flagged.ctl_ok(&["get_default_active_thread_percentage"]),
        "70\n"
    );
    let bad = Command::new(control_bin())
        .args(["-f", "--backend", "sim", "--pipe-dir"])
        .arg(temp_dir("control-bad-env"))
        .arg("--log-dir")
        .arg(temp_dir("control-bad-env-log"))
        .env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "150")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(
        said.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=150"),
        "{said}"
    );
}

/// `--server-arg` reaches every server the daemon starts: here a limit per client.
#[test]
fn server_args_reach_the_daemons_servers() {
    let d = TestDaemon::start("control", &["--server-arg=--max-streams", "--server-arg=1"]);
    let c = d.client();
    c.stream_create(0).unwrap();
    let e = c.stream_create(0).unwrap_err();
    assert_eq!(e.status, Status::QuotaExceeded, "{}", e.message);
    assert!(e.message.contains("--max-streams"), "{}", e.message);
}

/// A `--server-arg` every server would refuse keeps the daemon from starting, with the server's
/// reason.
#[test]
fn server_args_a_server_would_refuse_stop_the_daemon_at_start() {
    let dir = temp_dir("bad-server-arg");
    let out = Command::new(control_bin())
        .args(["-f", "--backend", "sim", "--server"])
        .arg(server_bin())
        .arg("--pipe-dir")
        .arg(&dir)
        .arg("--log-dir")
        .arg(&dir)
        .args(["--server-arg=--max-streams", "--server-arg=999"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--max-streams"), "{err}");
    assert!(!dir.join("control.sock").exists(), "{err}");
}

/// With launch batching on in the daemon's servers, a client's counters of it reach
/// `get_client_list -v`: runs served from a cached graph, the others, and graphs made.
#[test]
fn launch_batching_counters_reach_get_client_list() {
    let d = TestDaemon::start(
        "control",
        &[
            "--server-arg=--launch-batching",
            "--server-arg=on",
            "--server-arg=--batch-hold-us",
            "--server-arg=10000000",
            "--server-arg=--batch-pacing",
            "--server-arg=off",
        ],
    );
    let c = d.client();
    let m = c.module_load(&ptx()).unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let p = c.mem_alloc(4096).unwrap();
    let s = c.stream_create(0).unwrap();
    let (pb, nb) = (p.0.to_le_bytes(), 1024u64.to_le_bytes());
    let one = mpsclient::Dim3 { x: 1, y: 1, z: 1 };
    let block = mpsclient::Dim3 { x: 256, y: 1, z: 1 };
    // Ten identical runs of three launches, each ended by a synchronise: the first teaches the
    // shape, the second makes its graph, the other eight are launched from it.
    for _ in 0..10 {
        for v in [1u32, 2, 3] {
            c.launch(fill, one, block, 0, s, &[&pb, &v.to_le_bytes(), &nb])
                .unwrap();
        }
        c.stream_synchronize(s).unwrap();
    }
    let pid = d.server_pids()[0].to_string();
    let verbose = d.ctl_ok(&["get_client_list", &pid, "-v"]);
    for key in ["batch_hits=8 ", "batch_misses=1 ", "batch_graphs=1 "] {
        assert!(verbose.contains(key), "{key} missing in {verbose}");
    }
}
