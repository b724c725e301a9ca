//! What a hostile local user did to the daemon and its servers before each defence here existed
//! (issue 24: descriptors reaching other users' servers, a root daemon that served root alone,
//! servers without bound, host memory and device memory beyond the machine's or the operator's
//! limits). Each test reproduces its attack and fails without the defence it names.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use common::daemon::TestDaemon;
use common::{role, server_bin, skip_unless_ci, temp_dir};

/// The descriptor numbers of process `pid` that point at `target`.
fn fds_pointing_at(pid: u32, target: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let link = std::fs::read_link(e.path()).ok()?;
            (link == target).then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

#[test]
fn a_descriptor_the_daemon_inherits_does_not_reach_its_servers() {
    // The daemon is started holding a descriptor without close-on-exec (as a careless parent,
    // or a service manager, might leave it one): a file only its own user should read.
    let dir = temp_dir("planted");
    let secret = dir.join("secret");
    std::fs::write(&secret, b"root only").unwrap();
    let planted = std::fs::File::open(&secret).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&planted);
    let d = TestDaemon::launch("attacks", &server_bin(), &[], |cmd| {
        // SAFETY: fcntl, async-signal-safe, on a descriptor this process keeps open until the
        // daemon has started.
        unsafe {
            cmd.pre_exec(move || {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    let in_daemon = fds_pointing_at(d.pid(), &secret);
    assert!(
        !in_daemon.is_empty(),
        "the daemon did not inherit the planted descriptor"
    );
    let c = d.client();
    c.mem_alloc(4096).unwrap();
    let servers = d.server_pids();
    assert_eq!(servers.len(), 1, "{servers:?}");
    let leaked = fds_pointing_at(servers[0], &secret);
    assert!(
        leaked.is_empty(),
        "server {} holds the daemon's descriptor(s) {leaked:?} of {}",
        servers[0],
        secret.display()
    );
    drop(c);
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Allocates, fills and reads back a little memory: proof that the connection is served.
fn touch(c: &mpsclient::Client) {
    let p = c.mem_alloc(4096).unwrap();
    c.memset_d32(p, 0xfeed, 1024, mpsclient::Stream::DEFAULT)
        .unwrap();
    let mut b = [0u8; 8];
    c.memcpy_dtoh(&mut b, p, mpsclient::Stream::DEFAULT)
        .unwrap();
    assert_eq!(b, [0xed, 0xfe, 0, 0, 0xed, 0xfe, 0, 0]);
    c.mem_free(p).unwrap();
}

/// Whether every directory above `path` lets others through and `path` lets them read and run it.
fn reachable_by_others(path: &Path) -> bool {
    let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode());
    mode(path).is_ok_and(|m| m & 0o005 == 0o005)
        && path
            .ancestors()
            .skip(1)
            .all(|dir| mode(dir).is_ok_and(|m| m & 0o001 != 0))
}

/// Copies of this test binary and the server binary in a directory anyone may enter (a
/// checkout under /root is not one), for other users to run; and that directory.
fn binaries_for_others() -> (PathBuf, PathBuf, PathBuf) {
    let bin = temp_dir("bin");
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = |from: PathBuf| {
        let to = bin.join(from.file_name().unwrap());
        std::fs::copy(&from, &to).unwrap();
        assert!(
            reachable_by_others(&to),
            "{} is not reachable by others",
            to.display()
        );
        to
    };
    let (exe, server) = (copy(std::env::current_exe().unwrap()), copy(server_bin()));
    (exe, server, bin)
}

/// The users other than root that the per-user tests run clients as: `mpstest` (`.ci/run`
/// creates it) and `nobody` where it exists.
fn other_users(test: &str) -> Option<Vec<nix::unistd::User>> {
    if !nix::unistd::geteuid().is_root() {
        skip_unless_ci(test, "needs root, to start servers as other users");
        return None;
    }
    let Some(mpstest) = nix::unistd::User::from_name("mpstest").ok().flatten() else {
        skip_unless_ci(test, "needs a user named mpstest");
        return None;
    };
    let nobody = nix::unistd::User::from_name("nobody").ok().flatten();
    Some(std::iter::once(mpstest).chain(nobody).collect())
}

#[test]
fn a_root_daemon_laid_out_as_packaged_serves_other_users() {
    const TEST: &str = "a_root_daemon_laid_out_as_packaged_serves_other_users";
    if let Some(role) = role() {
        assert_eq!(role, "served");
        touch(&mpsclient::Client::connect(None).unwrap());
        return;
    }
    let Some(users) = other_users(TEST) else {
        return;
    };
    let (exe, server, bin) = binaries_for_others();
    let d = TestDaemon::start_apart("attacks", &server, "64MiB", &[]);
    touch(&d.client());
    for user in &users {
        let out = d
            .role_of(&exe, TEST, "served", &[])
            .uid(user.uid.as_raw())
            .gid(user.gid.as_raw())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "a client as {}: {}{}\ncontrol.log:\n{}",
            user.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            d.log("control.log")
        );
        // Its server logs where only that user reaches.
        let uid = user.uid.as_raw();
        let dir = d.logs.join(uid.to_string());
        let log = dir.join(format!("server-{uid}-default.log"));
        for (path, mode) in [(&dir, 0o700), (&log, 0o600)] {
            let meta = std::fs::symlink_metadata(path).unwrap();
            assert_eq!(
                (meta.uid(), meta.mode() & 0o7777),
                (uid, mode),
                "{}",
                path.display()
            );
        }
    }
    assert_eq!(
        d.server_pids().len(),
        1 + users.len(),
        "one server per user"
    );
    // The log directory itself is as the package made it: nobody lists it.
    let meta = std::fs::metadata(&d.logs).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o711));
    drop(d);
    let _ = std::fs::remove_dir_all(&bin);
}

#[test]
fn a_client_whose_server_cannot_start_is_told_why() {
    // More simulated memory than an address space holds: every server fails as it starts.
    let d = TestDaemon::start_apart("attacks", &server_bin(), "200TiB", &[]);
    let e = mpsclient::Client::connect(Some(&d.dir)).expect_err("no server can start");
    assert!(
        e.message.contains("could not start") && e.message.contains("simulated device memory"),
        "{e}"
    );
    // And the daemon's log says so too.
    d.wait_for_log("control.log", "the server could not start");
}
