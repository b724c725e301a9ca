//! One start for every client of a group, and one clock for all of them.
//!
//! The parent makes a pipe before it starts the group's workers; each inherits the read end
//! (its number comes as `--start-fd`), gets ready, says so, and blocks reading it. Once every
//! worker is ready the parent closes the write end, once: every blocked read returns end-of-file
//! at the same moment, so no client starts ahead of another by the time it took to tell the
//! others. Each client then reports when its clock started and stopped on CLOCK_MONOTONIC,
//! which on Linux is one clock for every process of the machine.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};

/// The parent's side: the pipe whose closing starts the group.
#[derive(Debug)]
pub(crate) struct StartLine {
    read: Option<OwnedFd>,
    write: Option<OwnedFd>,
}

impl StartLine {
    pub(crate) fn new() -> std::io::Result<StartLine> {
        // Both ends close on exec, then the read end alone is made inheritable: a worker that
        // held the write end would keep every other worker from ever starting.
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
        fcntl(&read, FcntlArg::F_SETFD(FdFlag::empty()))?;
        Ok(StartLine {
            read: Some(read),
            write: Some(write),
        })
    }

    /// The descriptor number the workers inherit.
    pub(crate) fn fd(&self) -> RawFd {
        self.read.as_ref().map_or(-1, |r| r.as_raw_fd())
    }

    /// Stops handing the read end to processes started from now on (call once every worker is
    /// spawned).
    pub(crate) fn spawned(&mut self) {
        self.read = None;
    }

    /// Starts every worker at once.
    pub(crate) fn release(&mut self) {
        self.read = None;
        self.write = None;
    }
}

/// A worker's side: the inherited read end.
#[derive(Debug)]
pub(crate) struct Start {
    file: File,
}

impl Start {
    /// Takes the descriptor `fd` this process inherited from the parent's [`StartLine`].
    pub(crate) fn inherited(fd: RawFd) -> Start {
        use std::os::unix::fs::FileTypeExt;
        let open_pipe =
            std::fs::metadata(format!("/proc/self/fd/{fd}")).is_ok_and(|m| m.file_type().is_fifo());
        assert!(
            fd >= 0 && open_pipe,
            "--start-fd {fd} is not an open pipe of this process: workers are started by \
             `mps-bench run` or `mps-bench quotas`, which pass it"
        );
        // SAFETY: the descriptor is an open pipe (checked above) handed to this process for this
        // use alone; nothing else in the process owns or closes it.
        let file = unsafe { File::from_raw_fd(fd) };
        Start { file }
    }

    /// Blocks until the parent starts the group (any thread of the worker may wait).
    pub(crate) fn wait(&self) {
        let mut byte = [0u8; 1];
        // The parent never writes: the read returns 0 bytes (end of file) when it closes the
        // pipe (or when it died, and then the result goes nowhere).
        loop {
            match (&self.file).read(&mut byte) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => panic!("cannot wait for the start on the inherited pipe: {e}"),
            }
        }
    }
}

/// Seconds on CLOCK_MONOTONIC: the same clock in every process of the machine.
pub(crate) fn now_s() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable on Linux");
    t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9
}
