//! The control daemon behind `mps-control`: it owns the client socket of the pipe directory,
//! starts one server per (user, group) on first use and hands each client's connection to its
//! server, and answers operators' commands on a control socket.
//!
//! A client's uid comes from SO_PEERCRED and its group from its hello (`MPS_GROUP`, default
//! `default`) or, where the configuration routes the client's cgroup to a group, from that
//! (`groups`), so a client cannot reach another user's server, and a critical service and
//! experimental jobs never share a server, a context, or a fault. Run as root, the daemon starts
//! each user's server as that user.
//!
//! A server whose device context fails (on a GPU, any kernel fault of any of its clients) says
//! so at once; its user and group then go to a fresh server while the old one drains its
//! clients, listed as `FAULT` meanwhile (see [`crate::recovery`] for the server's side).
//!
//! `routing` finds or starts the server of a (user, group) and hands clients to it; `groups`
//! places each client in a group and gives a configured group's servers its limits; `config` is
//! the configuration file; `command` is the operators' command language ([`Command`]);
//! `metrics` serves Prometheus; `logs` bounds the servers' logs a user leaves behind; `wire` is
//! what the daemon and its servers say to each other.

mod command;
pub mod config;
mod groups;
mod logs;
mod metrics;
mod routing;
mod standby;
pub(crate) mod wire;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mps_core::{Error, Result, Status};
use mps_ipc::socket::SOCKET_NAME;

pub use command::{Command, Target};
pub use logs::DEFAULT_MAX_SERVER_LOGS;
use routing::ServerProc;

use crate::server::wait_readable;
use mps_ipc::trust::TrustedDir;

/// The operators' socket in the pipe directory.
pub const CONTROL_SOCKET: &str = "control.sock";
/// The daemon's pid file in the pipe directory.
pub const PID_FILE: &str = "mps-control.pid";

/// Share of the SMs a server's clients may reserve in all, unless the operator says otherwise.
pub const DEFAULT_MAX_SM_RESERVATION: u32 = 50;

/// How a daemon is set up.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// The pipe directory (client and control sockets, servers' directories).
    pub pipe_dir: PathBuf,
    /// The log directory (control.log, one log per server).
    pub log_dir: PathBuf,
    /// The mps-server binary.
    pub server_bin: PathBuf,
    /// The device ordinals served: one server per (user, group, device).
    pub devices: Vec<u32>,
    /// Arguments for every server (backend, simulator settings, ...).
    pub server_args: Vec<String>,
    /// What new servers' clients start from, until an operator command changes it.
    pub defaults: crate::registry::Defaults,
    /// Whether a standby server, its context made, waits beside each server to take its
    /// clients at once if its context fails (`mps-control --standby`).
    pub standby: bool,
    /// Connections that may wait for their hello at once, and how long each may take; the
    /// daemon reads every hello on one thread, as a server does ([`crate::intake`]).
    pub hellos: HelloLimits,
    /// Servers one user may have running at once (one per group and device); a client that
    /// would need one more is refused with the reason, and other users are served as before.
    pub max_servers_per_user: usize,
    /// Server logs kept in each user's log directory: before a server with a log of a new name
    /// starts, the logs of servers no longer running are removed, the oldest first, down to
    /// this many with the new one (the module `logs`).
    pub max_server_logs: usize,
    /// The configuration in force at start: the file's under the options given (what
    /// `save_config` writes, with the defaults operators changed since); its
    /// `device_pinned_mem_limit`, if any, sets the default memory limit of each device.
    pub config: config::FileConfig,
    /// Where `save_config` writes the configuration.
    pub config_path: PathBuf,
    /// Where the clients' processes are read (their cgroup and groups): `/proc`, or a
    /// directory of the tests' own.
    pub proc_root: PathBuf,
}

/// Reads the configuration anew, under the options given at start (SIGHUP), or says why not.
pub type Reloader = Box<dyn Fn() -> std::result::Result<config::FileConfig, String> + Send + Sync>;

/// Servers per user unless the operator says otherwise: each costs a process, a device
/// context, a few threads and descriptors of the daemon's and about 5 MB of memory.
pub const DEFAULT_MAX_SERVERS_PER_USER: usize = 16;

/// How many connections may wait for their hello at the daemon, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloLimits {
    /// Connections waiting at once; beyond it the one that waited longest is dropped.
    pub max_pending: usize,
    /// Time from accept to a complete hello.
    pub timeout: std::time::Duration,
}

impl Default for HelloLimits {
    fn default() -> HelloLimits {
        HelloLimits {
            max_pending: crate::intake::DEFAULT_LIMITS.max_pending,
            timeout: crate::intake::DEFAULT_LIMITS.hello_timeout,
        }
    }
}

/// The daemon's state.
pub struct Daemon {
    cfg: DaemonConfig,
    /// The pipe directory, checked and held open: the daemon's files are made through it.
    pipe: TrustedDir,
    /// `servers/` in it: one directory per server.
    servers_dir: TrustedDir,
    /// The log directory, checked and held open.
    logs: TrustedDir,
    /// Device memory per client for new servers, in bytes (0: no limit), unless the device has
    /// its own in `device_mem_limits`.
    default_mem_limit: AtomicU64,
    /// Device memory per client for new servers of a device, set by the operator per device.
    device_mem_limits: Mutex<BTreeMap<u32, u64>>,
    /// Priority of new servers' clients.
    default_priority: AtomicU32,
    /// SM share of new servers' clients, percent.
    default_share: AtomicU32,
    /// Reservation ceiling of new servers, percent.
    default_max_reserve: AtomicU32,
    servers: Mutex<BTreeMap<(u32, String, u32), ServerProc>>,
    /// Servers whose device context failed, draining their clients.
    failed: Mutex<Vec<ServerProc>>,
    /// With `standby`, a server per (user, group, device) waiting to take over.
    standbys: Mutex<BTreeMap<(u32, String, u32), standby::Standby>>,
    stop: AtomicBool,
    /// The configuration in force, less the defaults kept above.
    running: Mutex<config::FileConfig>,
    /// How SIGHUP reads the configuration anew.
    reloader: std::sync::OnceLock<Reloader>,
    /// Where clients' cgroups and groups are read.
    proc: groups::Proc,
    client_listener: UnixListener,
    control_listener: UnixListener,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("cfg", &self.cfg).finish()
    }
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

impl Daemon {
    /// Opens (creating them if needed) the pipe and log directories, refusing ones another
    /// user owns or can write, binds both sockets and writes the pid file, never through a link.
    pub fn bind(cfg: DaemonConfig) -> Result<Daemon> {
        // Checked here as the device list's answer checks it, so that no client finds out.
        mps_core::handshake::DeviceList::new(&cfg.devices)?;
        if cfg.devices.is_empty() {
            return Err(Error::invalid_value(
                "the daemon must serve at least one device",
            ));
        }
        // Every user traverses the pipe directory to reach the client socket.
        let pipe = TrustedDir::open(&cfg.pipe_dir, 0o755)?;
        pipe.set_mode(0o755)?;
        // Users' servers reach their own directory and log, without listing the others'.
        let servers_dir = pipe.subdir("servers", 0o711, None)?;
        let logs = TrustedDir::open(&cfg.log_dir, if is_root() { 0o711 } else { 0o700 })?;
        // As root, every user may reach the client socket (the daemon routes each to its own
        // server); otherwise only this user may.
        let client_mode = if is_root() { 0o666 } else { 0o600 };
        let client_listener = pipe.listen(SOCKET_NAME, client_mode)?;
        // The accept loop also reads hellos: it must never block in accept.
        client_listener.set_nonblocking(true).map_err(|e| {
            Error::internal(format!("cannot make the client socket non-blocking: {e}"))
        })?;
        let control_listener = pipe.listen(CONTROL_SOCKET, 0o600)?;
        pipe.create_file(PID_FILE, 0o644).and_then(|mut f| {
            writeln!(f, "{}", std::process::id()).map_err(|e| {
                Error::new(
                    Status::PermissionDenied,
                    format!(
                        "cannot write the pid file in {}: {e}",
                        cfg.pipe_dir.display()
                    ),
                )
            })
        })?;
        let d = cfg.defaults;
        let device_mem_limits = cfg
            .config
            .device_pinned_mem_limit
            .as_ref()
            .map(|spec| config::device_limits(spec, &cfg.devices))
            .unwrap_or_default();
        let running = Mutex::new(cfg.config.clone());
        let proc = groups::Proc::new(&cfg.proc_root);
        Ok(Daemon {
            cfg,
            pipe,
            servers_dir,
            logs,
            default_mem_limit: AtomicU64::new(d.mem_limit),
            device_mem_limits: Mutex::new(device_mem_limits),
            default_priority: AtomicU32::new(d.priority),
            default_share: AtomicU32::new(d.sm_share),
            default_max_reserve: AtomicU32::new(d.max_sm_reserve),
            servers: Mutex::new(BTreeMap::new()),
            failed: Mutex::new(Vec::new()),
            standbys: Mutex::new(BTreeMap::new()),
            stop: AtomicBool::new(false),
            running,
            reloader: std::sync::OnceLock::new(),
            proc,
            client_listener,
            control_listener,
        })
    }

    /// Device memory per client that new servers of `device` give, in bytes (0: no limit).
    fn default_mem_limit(&self, device: u32) -> u64 {
        let limits = self
            .device_mem_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        limits
            .get(&device)
            .copied()
            .unwrap_or_else(|| self.default_mem_limit.load(Ordering::Relaxed))
    }

    /// What a server of `device` started now gives its clients.
    fn server_defaults(&self, device: u32) -> crate::registry::Defaults {
        crate::registry::Defaults {
            mem_limit: self.default_mem_limit(device),
            priority: self.default_priority.load(Ordering::Relaxed),
            sm_share: self.default_share.load(Ordering::Relaxed),
            max_sm_reserve: self.default_max_reserve.load(Ordering::Relaxed),
        }
    }

    fn set_default_mem_limit(&self, device: u32, bytes: u64) {
        let mut limits = self
            .device_mem_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        limits.insert(device, bytes);
    }

    /// Refuses a device ordinal this daemon does not serve.
    fn check_served(&self, device: u32) -> Result<()> {
        if self.cfg.devices.contains(&device) {
            return Ok(());
        }
        Err(Error::invalid_value(format!(
            "device {device} is not served here; this mps-control serves devices {}",
            routing::device_names(&self.cfg.devices)
        )))
    }

    /// The pipe directory, to make more files in it the same safe way.
    pub fn pipe_dir(&self) -> &TrustedDir {
        &self.pipe
    }

    /// Serves clients and operators until `quit` (or `stop` is set from outside, by a signal).
    pub fn run(self: &Arc<Self>, stop_signal: &AtomicBool) {
        let d = self.clone();
        let clients = std::thread::Builder::new()
            .name("clients".into())
            .spawn(move || d.accept_clients())
            .expect("start the client thread");
        while !self.stop.load(Ordering::Relaxed) && !stop_signal.load(Ordering::Relaxed) {
            if crate::process::RELOAD.swap(false, Ordering::SeqCst) {
                self.reload();
            }
            if !wait_readable(&self.control_listener).unwrap_or(false) {
                continue;
            }
            match self.control_listener.accept() {
                Ok((s, _)) => self.serve_operator(s),
                Err(e) => tracing::warn!("accept on the control socket failed: {e}"),
            }
        }
        if !self.stop.swap(true, Ordering::SeqCst) {
            self.shutdown_all(Duration::from_secs(5));
        }
        let _ = clients.join();
        for name in [SOCKET_NAME, CONTROL_SOCKET, PID_FILE] {
            let _ = self.pipe.remove(name);
        }
        tracing::info!("stopped");
    }

    fn serve_operator(&self, stream: UnixStream) {
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            return;
        }
        let reply = match self.command(line.trim()) {
            Ok(text) => text,
            Err(e) => format!("error: {}\n", e.message),
        };
        let _ = (&stream).write_all(reply.as_bytes());
    }
}

/// For a server started by the daemon that cannot start: tells the daemon why (for its log) and
/// refuses the clients already handed to it on `handoff` with that reason, rather than leave
/// them to find their connection closed. Those handed while it stops are read for a moment.
pub fn refuse_handoffs(handoff: &UnixStream, why: &str) {
    let _ = wire::send_to_daemon(handoff, wire::UNSTARTED, why.as_bytes(), None);
    let e = Error::new(
        Status::Connection,
        format!("the mps server for your user and group could not start: {why}"),
    );
    // The daemon hands a new server its first client at once; a little more may follow.
    let quiet = Duration::from_millis(200);
    if handoff.set_read_timeout(Some(quiet)).is_err() {
        return;
    }
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        match wire::recv(handoff) {
            Ok((wire::HANDOFF, _, Some(fd))) => crate::server::refuse(&UnixStream::from(fd), &e),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Sends one command to a running daemon and returns its answer.
pub fn send_command(pipe_dir: &Path, line: &str) -> Result<String> {
    let path = pipe_dir.join(CONTROL_SOCKET);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        Error::new(
            Status::Connection,
            format!(
                "cannot reach mps-control at {}: {e}; is the daemon running (mps-control -d)?",
                path.display()
            ),
        )
    })?;
    s.write_all(format!("{line}\n").as_bytes())
        .and_then(|()| s.shutdown(std::net::Shutdown::Write))
        .map_err(|e| Error::new(Status::Connection, format!("sending the command: {e}")))?;
    let mut reply = String::new();
    std::io::Read::read_to_string(&mut s, &mut reply)
        .map_err(|e| Error::new(Status::Connection, format!("reading the answer: {e}")))?;
    Ok(reply)
}
