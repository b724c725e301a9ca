//! The control daemon's files against a hostile filesystem: links planted where it writes, and
//! directories another user owns or can write (issue: a root daemon in a shared /tmp).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{control_bin, server_bin, temp_dir};

/// A daemon started on `pipe` and `log`, and what became of it.
struct Started {
    child: Child,
    pipe: PathBuf,
}

enum Outcome {
    /// It answers on its control socket.
    Serving(Started),
    /// It exited at start; its standard error.
    Refused(String),
}

/// Whether the daemon answers a command (it is listening from before it is set up, but answers
/// only once it is).
fn answers(pipe: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(pipe.join("control.sock")) else {
        return false;
    };
    let mut reply = String::new();
    s.write_all(b"get_server_list\n")
        .and_then(|()| s.shutdown(std::net::Shutdown::Write))
        .and_then(|()| s.read_to_string(&mut reply))
        .is_ok_and(|_| !reply.starts_with("error"))
}

fn start(pipe: &Path, log: &Path) -> Outcome {
    let mut child = Command::new(control_bin())
        .args([
            "-f",
            "--backend",
            "sim",
            "--sim-memory",
            "64MiB",
            "--server",
        ])
        .arg(server_bin())
        .arg("--pipe-dir")
        .arg(pipe)
        .arg("--log-dir")
        .arg(log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                !status.success(),
                "the daemon exited at start with {status}"
            );
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return Outcome::Refused(err);
        }
        if answers(pipe) {
            return Outcome::Serving(Started {
                child,
                pipe: pipe.to_path_buf(),
            });
        }
        assert!(
            Instant::now() < deadline,
            "the daemon neither served nor exited"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = Command::new(control_bin())
            .arg("--pipe-dir")
            .arg(&self.pipe)
            .args(["quit", "-t", "1"])
            .output();
        let _ = self.child.wait();
    }
}

/// A fresh directory of mode `mode`.
fn dir(tag: &str, mode: u32) -> PathBuf {
    let d = temp_dir(tag);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// A file outside the daemon's directories that a link points at, and its content.
fn precious() -> (PathBuf, &'static str) {
    let path = dir("fs-precious", 0o700).join("precious");
    let text = "not for the daemon to write\n";
    std::fs::write(&path, text).unwrap();
    (path, text)
}

fn refused(outcome: Outcome, what: &str) -> String {
    match outcome {
        Outcome::Refused(err) => err,
        Outcome::Serving(s) => {
            drop(s);
            panic!("the daemon started with {what}");
        }
    }
}

#[test]
fn a_symlinked_pid_file_is_not_followed() {
    let pipe = dir("fs-pid", 0o700);
    let (target, text) = precious();
    std::os::unix::fs::symlink(&target, pipe.join("mps-control.pid")).unwrap();
    let Outcome::Serving(d) = start(&pipe, &pipe) else {
        panic!("the daemon did not start over a stale pid-file link");
    };
    assert_eq!(std::fs::read_to_string(&target).unwrap(), text);
    let pid_file = pipe.join("mps-control.pid");
    assert!(
        std::fs::symlink_metadata(&pid_file)
            .unwrap()
            .file_type()
            .is_file(),
        "the pid file is still a link"
    );
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap().trim(),
        d.child.id().to_string()
    );
    assert_eq!(mode_of(&pid_file), 0o644);
}

#[test]
fn a_symlinked_control_log_is_refused_not_followed() {
    let pipe = dir("fs-log-link", 0o700);
    let (target, text) = precious();
    std::os::unix::fs::symlink(&target, pipe.join("control.log")).unwrap();
    let err = refused(start(&pipe, &pipe), "control.log a link");
    assert!(err.contains("control.log is a symbolic link"), "{err}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), text);
}

#[test]
fn a_pipe_directory_others_can_write_is_refused() {
    let pipe = dir("fs-open-pipe", 0o777);
    let log = dir("fs-log", 0o700);
    let err = refused(start(&pipe, &log), "a world-writable pipe directory");
    assert!(
        err.contains(&pipe.display().to_string()) && err.contains("chmod go-w"),
        "{err}"
    );
    assert!(!pipe.join("mps.sock").exists());
    assert_eq!(
        mode_of(&pipe),
        0o777,
        "the daemon changed a directory it refused"
    );
}

#[test]
fn a_log_directory_others_can_write_is_refused() {
    let pipe = dir("fs-pipe", 0o700);
    let log = dir("fs-open-log", 0o777);
    let err = refused(start(&pipe, &log), "a world-writable log directory");
    assert!(
        err.contains(&log.display().to_string()) && err.contains("chmod go-w"),
        "{err}"
    );
    assert!(!log.join("control.log").exists());
}

#[test]
fn a_symlinked_pipe_directory_is_refused() {
    let real = dir("fs-real", 0o700);
    let pipe = temp_dir("fs-pipe-link").join("mps");
    std::os::unix::fs::symlink(&real, &pipe).unwrap();
    let log = dir("fs-log", 0o700);
    let err = refused(start(&pipe, &log), "a pipe directory that is a link");
    assert!(err.contains("is a symbolic link"), "{err}");
    assert!(!real.join("mps.sock").exists());
}

#[test]
fn a_pipe_directory_owned_by_another_user_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        println!("skipped: needs root to give a directory to another user");
        return;
    }
    let Some(nobody) = nix::unistd::User::from_name("nobody").ok().flatten() else {
        println!("skipped: no user named nobody");
        return;
    };
    let pipe = dir("fs-foreign", 0o755);
    nix::unistd::chown(&pipe, Some(nobody.uid), Some(nobody.gid)).unwrap();
    let log = dir("fs-log", 0o700);
    let err = refused(start(&pipe, &log), "a pipe directory owned by nobody");
    assert!(
        err.contains(&format!("is owned by uid {}", nobody.uid)),
        "{err}"
    );
    assert!(!pipe.join("mps.sock").exists());
}

#[test]
fn directories_files_and_sockets_get_their_modes() {
    let base = dir("fs-modes", 0o755);
    let (pipe, log) = (base.join("pipe"), base.join("log"));
    let Outcome::Serving(d) = start(&pipe, &log) else {
        panic!("the daemon did not start in fresh directories");
    };
    let root = nix::unistd::geteuid().is_root();
    let expect = [
        (pipe.clone(), 0o755),
        (pipe.join("servers"), 0o711),
        (pipe.join("mps.sock"), if root { 0o666 } else { 0o600 }),
        (pipe.join("control.sock"), 0o600),
        (pipe.join("mps-control.pid"), 0o644),
        // Logs say which users ran what: their owner's alone (root's log directory lets each
        // user's server reach its own log).
        (log.clone(), if root { 0o711 } else { 0o700 }),
        (log.join("control.log"), 0o600),
    ];
    for (path, mode) in expect {
        assert_eq!(
            mode_of(&path),
            mode,
            "{} has mode {:o}, not {mode:o}",
            path.display(),
            mode_of(&path)
        );
    }
    drop(d);
}
