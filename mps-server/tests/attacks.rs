//! What a hostile local user did to the daemon and its servers before each defence here existed
//! (issue 24: descriptors reaching other users' servers, a root daemon that served root alone,
//! servers without bound, host memory and device memory beyond the machine's or the operator's
//! limits). Each test reproduces its attack and fails without the defence it names.

mod common;

use std::os::unix::process::CommandExt;

use common::daemon::TestDaemon;
use common::{server_bin, temp_dir};

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
