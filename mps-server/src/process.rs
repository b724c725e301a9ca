//! What both binaries (`mps-server`, `mps-control`) set up the same way: logging to stderr and a
//! file, the stop flag that SIGINT and SIGTERM raise (and the daemon's reload flag, SIGHUP's), directories from the environment, and the
//! descriptors a server they start inherits.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::prelude::*;

/// Raised by SIGINT and SIGTERM once [`install_signal_handlers`] ran.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Raised by SIGHUP once [`install_reload_handler`] ran: the daemon reads its configuration
/// again.
pub static RELOAD: AtomicBool = AtomicBool::new(false);

extern "C" fn on_hangup(_: nix::libc::c_int) {
    RELOAD.store(true, Ordering::SeqCst);
}

/// SIGHUP raises [`RELOAD`] (the daemon's; a server keeps SIGHUP's default).
pub fn install_reload_handler() -> Result<(), String> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_hangup),
        SaFlags::empty(),
        SigSet::empty(),
    );
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { sigaction(Signal::SIGHUP, &action) }.map_err(|e| format!("sigaction(SIGHUP): {e}"))?;
    Ok(())
}

/// SIGINT and SIGTERM raise [`STOP`]; SIGPIPE is ignored (a peer that vanishes mid-send must not
/// kill the process).
pub fn install_signal_handlers() -> Result<(), String> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    let ignore = SigAction::new(SigHandler::SigIgn, SaFlags::empty(), SigSet::empty());
    for sig in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(sig, &action) }.map_err(|e| format!("sigaction({sig}): {e}"))?;
    }
    // SAFETY: ignoring a signal installs no handler code.
    unsafe { sigaction(Signal::SIGPIPE, &ignore) }.map_err(|e| format!("sigaction: {e}"))?;
    Ok(())
}

/// Logs to stderr and appends to `log`, at the level `MPS_LOG` names (default info). Where
/// stderr is the journal (run by systemd, which says so in `JOURNAL_STREAM`), its lines go
/// without the time and colours the journal keeps itself.
pub fn init_logging_to(log: RotatingLog) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MPS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let stderr = if stderr_is_journal() {
        stderr.with_ansi(false).without_time().boxed()
    } else {
        stderr.boxed()
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(stderr)
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(log)),
        )
        .init();
}

/// Whether stderr is the systemd journal: `JOURNAL_STREAM` names its device and inode.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Bytes a log file grows to before it is rotated, unless the operator says otherwise.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 16 << 20;

/// A log file of bounded size: once a write takes it past its bound it is renamed `NAME.1`
/// (replacing the one before) and a fresh `NAME` is started, so that the log and its one older
/// generation hold at most twice the bound however much is logged.
#[derive(Debug)]
pub struct RotatingLog {
    dir: mps_ipc::trust::TrustedDir,
    name: String,
    file: std::fs::File,
    size: u64,
    max: u64,
}

impl RotatingLog {
    /// Appends to `name` in `dir` (created with mode 0600 if missing, as
    /// [`mps_ipc::trust::TrustedDir::append_file`] opens it), rotating past `max` bytes.
    pub fn open(
        dir: mps_ipc::trust::TrustedDir,
        name: &str,
        max: u64,
    ) -> mps_core::Result<RotatingLog> {
        let file = dir.append_file(name, 0o600, None)?;
        let size = file.metadata().map_or(0, |m| m.len());
        Ok(RotatingLog {
            dir,
            name: name.to_string(),
            file,
            size,
            max: max.max(4096),
        })
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        let old = format!("{}.1", self.name);
        let fresh = self
            .dir
            .rename(&self.name, &old)
            .and_then(|()| self.dir.append_file(&self.name, 0o600, None))
            .map_err(|e| std::io::Error::other(e.message))?;
        self.file = fresh;
        self.size = 0;
        Ok(())
    }
}

impl std::io::Write for RotatingLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.size >= self.max && self.rotate().is_err() {
            // A log that cannot be rotated is not written past its bound: the line is dropped
            // rather than the disk filled.
            return Ok(buf.len());
        }
        let n = self.file.write(buf)?;
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Lets `fds` (opened close-on-exec, so that no other process started meanwhile inherits one)
/// through to the program `cmd` starts, and to it alone: between its fork and exec, every other
/// descriptor above stderr is made close-on-exec (whatever this process inherited or opened
/// without it: a server started for another user could take any of them with `pidfd_getfd`), and
/// `fds` are made inheritable.
pub(crate) fn inherit(cmd: &mut std::process::Command, fds: Vec<i32>) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec the child only makes system calls (close_range, getrlimit,
    // fcntl), which are async-signal-safe, on descriptors of its own; `fds` are the caller's,
    // kept open until the child has started.
    unsafe {
        cmd.pre_exec(move || {
            cloexec_from(3)?;
            for &fd in &fds {
                if nix::libc::fcntl(fd, nix::libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Marks every descriptor from `first` up close-on-exec: one `close_range` (Linux 5.11), or,
/// where the kernel lacks it, `fcntl` on each descriptor below the limit of open files.
///
/// # Safety
///
/// Only for a child between fork and exec, where no other thread can be using the descriptors.
unsafe fn cloexec_from(first: u32) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC changes flags only, on this process's own
    // descriptors.
    let done = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if done == 0 {
        return Ok(());
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    let last = limit.rlim_cur.min(1 << 20) as i32;
    for fd in first as i32..last {
        // SAFETY: fcntl on a descriptor that may not be open fails with EBADF, changing nothing.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(())
}
