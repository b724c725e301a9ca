//! Back in service after the device context fails.
//!
//! On a GPU a kernel fault ends the context of the whole server process, so every client of the
//! server is done (the simulator models this with `--sim-fault-scope context`). The server
//! learns of it as a client would: it holds a stream of its own on which it never runs work, and
//! both backends tell every stream's owner when the context dies, so a failure reported to that
//! stream can only be the context's. From that moment the server
//!
//! - takes no new client: its accept loop stops, and clients the daemon hands over are given
//!   back to it;
//! - has a fresh server take new clients at once: under `mps-control` it tells the daemon over
//!   their socket (a `FAILED` message), and the daemon starts a fresh server for the user and
//!   group; a standalone server hands the listening socket to a fresh `mps-server` process, so
//!   connections waiting on it, and those still to come, go to the fresh context. With
//!   `--standby` that process was started with the server and has made its context already
//!   ([`Standby`]): it only needs to be told to go, instead of a new process creating a context
//!   (on a GPU most of a second) after the fault;
//! - keeps answering its own clients with the fault's status and message (the backend told each
//!   of them), and exits once they are gone and its successor has the socket's path (a server
//!   that stopped before could remove the path from under the fresh server), or after a bound
//!   ([`Recovery::drain`]).

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use mps_core::{Error, Result, Status};

use crate::backend::{Backend, ClientContext, FaultSink};
use crate::control::wire;
use crate::registry::Registry;

/// Who serves new clients once this server's context failed.
#[derive(Debug)]
pub enum Successor {
    /// The control daemon, told over this socket (the one the server inherited from it).
    Daemon(UnixStream),
    /// A fresh process of this program, started with these arguments and the listening socket.
    Process {
        /// The program.
        program: PathBuf,
        /// Its arguments, without the sockets' (`--listen-fd` and `--standby-fd` are added).
        args: Vec<OsString>,
        /// Whether the process is started with the server, to stand by ([`Standby`]), rather
        /// than after the fault.
        standby: bool,
    },
}

impl Successor {
    /// This very process started again: `/proc/self/exe` with this process's arguments, less
    /// the descriptors it was given (`--listen-fd`, `--standby-fd`); started at once to stand by
    /// if `standby`.
    pub fn this_process(standby: bool) -> Result<Successor> {
        let program = std::env::current_exe().map_err(|e| {
            Error::internal(format!(
                "cannot find this program to start a fresh server after a fault: {e}"
            ))
        })?;
        Ok(Successor::Process {
            program,
            args: without_descriptors(std::env::args_os().skip(1)),
            standby,
        })
    }
}

/// `args` less the options that pass descriptors (`--listen-fd N`, `--standby-fd=N`, ...):
/// those are this process's own.
fn without_descriptors(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut kept = Vec::new();
    let mut given = args.into_iter();
    while let Some(a) = given.next() {
        let text = a.to_string_lossy();
        if a == LISTEN_FD || a == STANDBY_FD {
            given.next();
        } else if !(text.starts_with(&format!("{LISTEN_FD}="))
            || text.starts_with(&format!("{STANDBY_FD}=")))
        {
            kept.push(a);
        }
    }
    kept
}

/// The option that tells a standby server where its go comes from (set by the server it stands
/// by for).
pub const STANDBY_FD: &str = "--standby-fd";

/// A server process started beside this one with its listening socket: it makes its own device
/// context at once, then waits ([`wait_for_go`]) to be told to serve the socket, which this
/// server does when its context fails. It exits when this server does without a fault (the
/// pipe it waits on closes), so it never outlives the server it stands by for.
#[derive(Debug)]
pub struct Standby {
    pid: u32,
    /// This server's end of the pipe the standby waits on.
    go: std::fs::File,
    child: std::process::Child,
}

impl Standby {
    /// Tells the standby to serve; fails if it is gone (its context could not be made, say).
    fn go(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(std::io::Error::other(format!("it exited ({status})")));
        }
        self.go.write_all(b"g")
    }

    /// Whether the standby, told to go, failed within `within` (it reads its go only once its
    /// context is made: one that could not make it exits without serving).
    fn failed_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            match self.child.try_wait() {
                Ok(Some(status)) if !status.success() => return Some(status),
                Ok(Some(_)) | Err(_) => return None,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        None
    }
}

/// How long a standby told to go is watched for a failure to start serving (its context may
/// still be in the making when the fault comes).
const STANDBY_WATCH: Duration = Duration::from_secs(30);

/// What a standby server is told.
#[derive(Debug, PartialEq, Eq)]
pub enum Go {
    /// Serve the listening socket: the server it stood by for failed.
    Serve,
    /// Exit: the server it stood by for stopped (or the process is asked to stop).
    Exit,
}

/// Waits, as a standby server, on the pipe at `fd` (its `--standby-fd`) until it is told to
/// serve, the pipe closes, or `stop` is raised.
pub fn wait_for_go(fd: i32, stop: &AtomicBool) -> Result<Go> {
    use std::io::Read;
    let pipe = inherited(fd, STANDBY_FD)?;
    let mut pipe = std::fs::File::from(pipe);
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [nix::poll::PollFd::new(
            pipe.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(200u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(Error::internal(format!("waiting on {STANDBY_FD}: {e}"))),
        }
        let mut byte = [0u8; 1];
        return match pipe.read(&mut byte) {
            Ok(1) => Ok(Go::Serve),
            Ok(_) => Ok(Go::Exit),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => Err(Error::internal(format!("reading {STANDBY_FD}: {e}"))),
        };
    }
    Ok(Go::Exit)
}

/// The option that gives a fresh server the socket to serve.
pub const LISTEN_FD: &str = "--listen-fd";

/// What the context's failure is, once known: written by the backend's report, read by the
/// accept loops and by the thread that acts on it.
#[derive(Debug, Default)]
struct Failure {
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    known: Condvar,
}

/// The fault sink of the server's own stream: any report to it is the context's death.
#[derive(Debug)]
struct Watch(Arc<Failure>);

impl FaultSink for Watch {
    fn fault(&self, _seq: u64, err: Error) {
        let mut e = self.0.error.lock().unwrap_or_else(|p| p.into_inner());
        if e.is_none() {
            *e = Some(err);
            self.0.failed.store(true, Ordering::Release);
            self.0.known.notify_all();
        }
    }

    fn has_faulted(&self) -> bool {
        self.0.failed.load(Ordering::Acquire)
    }
}

/// One server's watch over its device context, and what it does when the context fails.
pub struct Recovery {
    failure: Arc<Failure>,
    registry: Arc<Registry>,
    socket_path: PathBuf,
    /// The listening socket, to hand to a fresh server process.
    listener: OwnedFd,
    /// Set once the socket's path belongs to the fresh server (or to no one): this server must
    /// not remove it when it stops.
    path_given_up: AtomicBool,
    /// Set once the hand-over settled who serves the path (the daemon told, the standby told to
    /// go, or a fresh process started or not): the server must not stop before, or it could
    /// remove the path that the fresh server is about to be given.
    settled: AtomicBool,
    /// Whether the daemon was told of the failure (once, before any client is given back).
    told_daemon: Mutex<bool>,
    /// The stream the backend reports the context's death on; never used otherwise (in a
    /// mutex only so that a stream that is not `Sync` may be kept here).
    _stream: Mutex<Box<dyn Send>>,
    /// Where the backend reports the context's death (see [`Recovery::watch`]).
    _sink: Arc<dyn FaultSink>,
}

impl std::fmt::Debug for Recovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recovery")
            .field("failed", &self.failed())
            .field("socket_path", &self.socket_path)
            .finish()
    }
}

impl Recovery {
    /// Watches `backend`'s context for the server listening on `listener` at `socket_path`,
    /// whose clients `registry` holds. Nothing is done on a failure until [`Recovery::start`].
    pub(crate) fn watch<B: Backend>(
        backend: &B,
        listener: &UnixListener,
        socket_path: PathBuf,
        registry: Arc<Registry>,
    ) -> Result<Arc<Recovery>> {
        let failure = Arc::new(Failure::default());
        let sink: Arc<dyn FaultSink> = Arc::new(Watch(failure.clone()));
        let ctx = ClientContext {
            // Clients are numbered from 1.
            id: 0,
            allocations: Arc::default(),
            closing: Arc::new(AtomicBool::new(false)),
            faults: sink,
            sm: Arc::default(),
            busy_ns: Arc::default(),
            gates: Arc::default(),
            priority: Arc::default(),
        };
        let stream = backend.stream_create(0, &ctx)?;
        // The CUDA backend keeps only a weak reference to a stream owner's fault sink: the
        // watch must live as long as the server, or the context's death is told to no one.
        let sink = ctx.faults;
        let listener = listener.as_fd().try_clone_to_owned().map_err(|e| {
            Error::internal(format!(
                "cannot keep the listening socket {} for a fresh server: {e}",
                socket_path.display()
            ))
        })?;
        Ok(Arc::new(Recovery {
            failure,
            registry,
            socket_path,
            listener,
            path_given_up: AtomicBool::new(false),
            settled: AtomicBool::new(false),
            told_daemon: Mutex::new(false),
            _stream: Mutex::new(Box::new(stream)),
            _sink: sink,
        }))
    }

    /// Whether the context failed: the server then takes no new client.
    pub fn failed(&self) -> bool {
        self.failure.failed.load(Ordering::Acquire)
    }

    /// Why the context failed, once it did.
    pub fn failure(&self) -> Option<Error> {
        self.failure
            .error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the socket's path now belongs to a fresh server (or to no one).
    pub fn path_given_up(&self) -> bool {
        self.path_given_up.load(Ordering::Acquire)
    }

    /// Starts the thread that, once the context fails, has `successor` take new clients; a
    /// successor process that stands by is started now.
    pub fn start(self: &Arc<Self>, successor: Successor) -> Result<()> {
        let standby = match &successor {
            Successor::Process {
                program,
                args,
                standby: true,
            } => match self.spawn_standby(program, args.clone()) {
                Ok(s) => {
                    tracing::info!(
                        "a standby server (pid {}) makes its context, to serve {} at once if \
                         this server's context fails",
                        s.pid,
                        self.socket_path.display()
                    );
                    Some(s)
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot start a standby server ({}); after a fault a fresh one is \
                         started instead",
                        e.message
                    );
                    None
                }
            },
            _ => None,
        };
        let me = self.clone();
        std::thread::Builder::new()
            .name("recovery".into())
            .spawn(move || {
                let mut e = me.failure.error.lock().unwrap_or_else(|p| p.into_inner());
                while e.is_none() {
                    e = me.failure.known.wait(e).unwrap_or_else(|p| p.into_inner());
                }
                let why = e.clone().expect("set before the wait ended");
                drop(e);
                me.hand_over(&why, successor, standby);
            })
            .map(drop)
            .map_err(|e| Error::internal(format!("cannot start the recovery thread: {e}")))
    }

    fn hand_over(&self, why: &Error, successor: Successor, standby: Option<Standby>) {
        let clients = self.registry.connected();
        tracing::error!(
            pid = std::process::id(),
            "the device context failed; this server takes no new clients, its {clients} \
             client(s) get the fault's status on their next call, and it exits once they are \
             gone: {}",
            why.message
        );
        match successor {
            Successor::Daemon(daemon) => {
                self.tell_daemon(&daemon, why);
                self.settle();
            }
            Successor::Process { program, args, .. } => {
                if let Some(mut standby) = standby {
                    match standby.go() {
                        Ok(()) => {
                            // The socket's path now leads to the standby.
                            self.path_given_up.store(true, Ordering::Release);
                            tracing::info!(
                                "the standby server (pid {}) serves {} from now on",
                                standby.pid,
                                self.socket_path.display()
                            );
                            self.settle();
                            // This thread has nothing else to do: it watches that the standby
                            // does start serving, and starts a fresh server if it cannot.
                            let Some(status) = standby.failed_within(STANDBY_WATCH) else {
                                return;
                            };
                            tracing::warn!(
                                "the standby server (pid {}) exited before serving ({status}); \
                                 starting a fresh server instead",
                                standby.pid
                            );
                        }
                        Err(e) => tracing::warn!(
                            "the standby server is gone ({e}); starting a fresh server instead"
                        ),
                    }
                }
                self.spawn_fresh(&program, args);
                self.settle();
            }
        }
    }

    /// Records that the hand-over settled who serves the socket's path.
    fn settle(&self) {
        self.settled.store(true, Ordering::Release);
    }

    /// Starts a fresh server after the fault, and says so.
    fn spawn_fresh(&self, program: &PathBuf, args: Vec<OsString>) {
        match self.spawn(program, args, None) {
            Ok(child) => {
                // The socket's path now leads to the fresh server.
                self.path_given_up.store(true, Ordering::Release);
                tracing::info!(
                    "a fresh server (pid {}) serves {} from now on",
                    child.id(),
                    self.socket_path.display()
                )
            }
            Err(e) => tracing::error!(
                "cannot start a fresh server after the fault: {}; start mps-server again once \
                 this one has exited",
                e.message
            ),
        }
    }

    /// Tells the daemon on `daemon` that the context failed with `why`, once: the daemon then
    /// starts a fresh server for this user and group.
    fn tell_daemon(&self, daemon: &UnixStream, why: &Error) {
        let mut told = self.told_daemon.lock().unwrap_or_else(|p| p.into_inner());
        if *told {
            return;
        }
        *told = true;
        // The path is free for the fresh server before the daemon can start it.
        let _ = std::fs::remove_file(&self.socket_path);
        self.path_given_up.store(true, Ordering::Release);
        match wire::send_to_daemon(daemon, wire::FAILED, why.message.as_bytes(), None) {
            Ok(()) => {
                tracing::info!(
                    "told the control daemon, which starts a fresh server for new clients"
                )
            }
            Err(e) => tracing::error!(
                "cannot tell the control daemon that the context failed ({e}); it starts a fresh \
                 server once this one has exited"
            ),
        }
    }

    /// Gives a client the daemon handed over after the context failed back to the daemon on
    /// `daemon`, to be routed to the fresh server. The daemon hears of the failure first, so
    /// that it does not hand the client here again.
    pub(crate) fn give_back(&self, daemon: &UnixStream, hello: &[u8], client: OwnedFd) {
        if let Some(why) = self.failure() {
            self.tell_daemon(daemon, &why);
        }
        if let Err(e) = wire::send_to_daemon(daemon, wire::RETURN, hello, Some(client.as_fd())) {
            tracing::warn!(
                "cannot give a client back to the daemon ({e}); it sees its connection close"
            );
        }
    }

    /// Starts `program` with `args`, the listening socket and, for a standby, the read end of
    /// its pipe (`--standby-fd`).
    fn spawn(
        &self,
        program: &PathBuf,
        args: Vec<OsString>,
        standby: Option<&OwnedFd>,
    ) -> Result<std::process::Child> {
        let fds: Vec<i32> = std::iter::once(self.listener.as_raw_fd())
            .chain(standby.map(AsRawFd::as_raw_fd))
            .collect();
        let mut cmd = std::process::Command::new(program);
        cmd.args(args).arg(LISTEN_FD).arg(fds[0].to_string());
        if let Some(&fd) = fds.get(1) {
            cmd.arg(STANDBY_FD).arg(fd.to_string());
        }
        crate::process::inherit(&mut cmd, fds);
        cmd.spawn()
            .map_err(|e| Error::internal(format!("cannot start {}: {e}", program.display())))
    }

    /// Starts a standby server: `program` with `args`, the listening socket and a pipe it waits
    /// on for its go.
    fn spawn_standby(&self, program: &PathBuf, args: Vec<OsString>) -> Result<Standby> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| Error::internal(format!("cannot make a pipe for a standby: {e}")))?;
        let child = self.spawn(program, args, Some(&read))?;
        Ok(Standby {
            pid: child.id(),
            go: std::fs::File::from(write),
            child,
        })
    }

    /// Once the context failed and the accept loop stopped: waits until every client is gone
    /// and the hand-over settled who serves the socket's path, `bound` passed, or `stop` is
    /// raised. Returns at once if the context did not fail.
    pub fn drain(&self, stop: &AtomicBool, bound: Duration) {
        if !self.failed() {
            return;
        }
        let until = Instant::now() + bound;
        loop {
            let left = self.registry.connected();
            let settled = self.settled.load(Ordering::Acquire);
            if left == 0 && settled {
                tracing::info!(
                    pid = std::process::id(),
                    "every client of the failed context has gone; stopping"
                );
                return;
            }
            if stop.load(Ordering::Relaxed) {
                tracing::info!("stopping with {left} client(s) of the failed context connected");
                return;
            }
            if Instant::now() >= until {
                if left == 0 {
                    tracing::warn!(
                        "no successor took {} within {} s; stopping",
                        self.socket_path.display(),
                        bound.as_secs()
                    );
                } else {
                    tracing::warn!(
                        "{left} client(s) of the failed context still connected after {} s; \
                         stopping (they see the connection close)",
                        bound.as_secs()
                    );
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The listening socket a server whose context failed handed to this process at `fd` (or, for
/// a standby, the server it stands by for).
pub fn inherited_listener(fd: i32) -> Result<UnixListener> {
    let listener = UnixListener::from(inherited(fd, LISTEN_FD)?);
    match listener.local_addr() {
        Ok(_) => Ok(listener),
        Err(e) => Err(Error::new(
            Status::InvalidValue,
            format!("{LISTEN_FD} {fd} is not a listening Unix socket: {e}"),
        )),
    }
}

/// Descriptor `fd`, given to this process with `option` by the server it succeeds, made
/// close-on-exec and owned.
fn inherited(fd: i32, option: &str) -> Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let bad = |what: String| Error::new(Status::InvalidValue, what);
    // SAFETY: fcntl(F_GETFD) only asks whether `fd` is open; nothing is assumed of it yet.
    if unsafe { nix::libc::fcntl(fd, nix::libc::F_GETFD) } == -1 {
        return Err(bad(format!(
            "{option} {fd}: no such descriptor (it is given by the server this one succeeds; do \
             not pass it by hand)"
        )));
    }
    // SAFETY: `fd` is open (checked above) and was handed to this process alone, by the server
    // it succeeds; nothing else in this process owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::fcntl::fcntl(
        &owned,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| bad(format!("{option} {fd}: {e}")))?;
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::{SimBackend, SimConfig};
    use crate::registry::Defaults;

    /// A recovery watch over a simulated context, with its socket in a directory of its own.
    fn watch() -> (Arc<Recovery>, UnixListener, PathBuf) {
        let backend = SimBackend::new(SimConfig {
            memory_bytes: 1 << 20,
            sm_count: 4,
            fault_scope: Default::default(),
            copy_latency: std::time::Duration::ZERO,
        })
        .unwrap();
        let dir = std::env::temp_dir().join(format!("mps-recovery-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mps.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let defaults = Defaults {
            mem_limit: 0,
            priority: 0,
            sm_share: 100,
            max_sm_reserve: 100,
        };
        let registry = Arc::new(Registry::new(defaults, vec![4], Box::new(|_| Ok(()))));
        let recovery = Recovery::watch(&backend, &listener, path.clone(), registry).unwrap();
        (recovery, listener, dir)
    }

    /// A server whose last client left as its context failed must not stop (and remove the
    /// socket's path) while the path is still being handed to its successor.
    #[test]
    fn draining_waits_until_the_hand_over_settled() {
        let (recovery, _listener, dir) = watch();
        recovery.failure.failed.store(true, Ordering::Release);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let drained = s.spawn(|| recovery.drain(&stop, Duration::from_secs(30)));
            std::thread::sleep(Duration::from_millis(200));
            assert!(
                !drained.is_finished(),
                "drained before the hand-over settled"
            );
            recovery.settle();
            let start = Instant::now();
            while !drained.is_finished() {
                assert!(start.elapsed() < Duration::from_secs(5), "still draining");
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        // A hand-over that never settles holds the server no longer than the bound.
        let (recovery, _listener, _) = watch();
        recovery.failure.failed.store(true, Ordering::Release);
        let start = Instant::now();
        recovery.drain(&stop, Duration::from_millis(100));
        assert!(start.elapsed() < Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_successor_gets_the_arguments_less_the_descriptors_of_this_process() {
        let args = [
            "--standby",
            "--listen-fd",
            "7",
            "--pipe-dir",
            "/p",
            "--standby-fd=9",
            "--listen-fd=3",
            "--standby-fd",
            "4",
            "--device",
            "1",
        ]
        .map(OsString::from);
        assert_eq!(
            without_descriptors(args),
            ["--standby", "--pipe-dir", "/p", "--device", "1"].map(OsString::from)
        );
    }
}
