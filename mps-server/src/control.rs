//! The control daemon behind `mps-control`: it owns the client socket of the pipe directory,
//! starts one server per (user, group) on first use and hands each client's connection to its
//! server, and answers operators' commands on a control socket.
//!
//! A client's uid comes from SO_PEERCRED and its group from its hello (`MPS_GROUP`, default
//! `default`), so a client cannot reach another user's server, and a critical service and
//! experimental jobs never share a server, a context, or a fault. Run as root, the daemon starts
//! each user's server as that user.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mps_core::protocol::Hello;
use mps_core::{Error, Result, Status};
use mps_ipc::socket::{self, SOCKET_NAME};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use crate::registry::ClientStats;
use crate::server::{listen, read_hello, wait_readable};
use wire::{ServerAnswer, ServerRequest};

/// Messages between the daemon and a server, on the socket the server inherits: a header, its
/// payload, and at most one file descriptor. Requests and answers are typed values, encoded
/// here and nowhere else (JSON, so that a mismatch between daemon and server reads as an error,
/// not as wrong numbers).
pub(crate) mod wire {
    use std::io;
    use std::os::fd::{BorrowedFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    use bytemuck::{Pod, Zeroable};
    use mps_core::protocol::MAGIC;
    use mps_core::{Error, Result, Status};
    use mps_ipc::socket;
    use serde::{Deserialize, Serialize};

    use crate::registry::{ClientStats, Registry};

    /// A client's hello, with its connection attached (daemon to server).
    pub(crate) const HANDOFF: u32 = 1;
    /// A [`ServerRequest`] (daemon to server).
    pub(crate) const REQUEST: u32 = 2;
    /// The answer to a request (server to daemon).
    pub(crate) const REPLY: u32 = 3;
    const MAX_PAYLOAD: usize = 1 << 20;

    /// What the daemon asks of a server.
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub(crate) enum ServerRequest {
        /// Every live client's [`ClientStats`].
        Clients,
        /// Disconnect every connection of this client process.
        Terminate {
            client_pid: i32,
        },
        /// Priority of new clients.
        SetPriority(u32),
        /// SM share of every client, percent.
        SetShare(u32),
        GetShare,
        /// Ceiling on the SMs clients may reserve in all, percent.
        SetMaxReserve(u32),
        GetMaxReserve,
        /// Device memory per new client, bytes (0: no limit).
        SetMemLimit(u64),
    }

    /// A server's answer to a [`ServerRequest`].
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub(crate) enum ServerAnswer {
        Clients(Vec<ClientStats>),
        Terminated { connections: u32 },
        Percent(u32),
        Done,
    }

    /// An answer as it crosses: the error keeps its status.
    type Reply = std::result::Result<ServerAnswer, (u32, String)>;

    #[repr(C)]
    #[derive(Clone, Copy, Pod, Zeroable)]
    struct Header {
        magic: u32,
        kind: u32,
        len: u32,
        reserved: u32,
    }

    pub(crate) fn send(
        s: &UnixStream,
        kind: u32,
        payload: &[u8],
        fd: Option<BorrowedFd<'_>>,
    ) -> io::Result<()> {
        let h = Header {
            magic: MAGIC,
            kind,
            len: payload.len() as u32,
            reserved: 0,
        };
        let mut msg = bytemuck::bytes_of(&h).to_vec();
        msg.extend_from_slice(payload);
        socket::send(s, &msg, fd.as_slice())
    }

    pub(crate) fn recv(s: &UnixStream) -> io::Result<(u32, Vec<u8>, Option<OwnedFd>)> {
        let mut h = Header::zeroed();
        let fd = socket::recv(s, bytemuck::bytes_of_mut(&mut h), 1)?
            .into_iter()
            .next();
        if h.magic != MAGIC || h.len as usize > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "malformed control message",
            ));
        }
        let mut payload = vec![0u8; h.len as usize];
        socket::recv(s, &mut payload, 0)?;
        Ok((h.kind, payload, fd))
    }

    fn encode<T: Serialize>(value: &T) -> Vec<u8> {
        // These types hold only numbers, strings and lists: serializing them cannot fail.
        serde_json::to_vec(value).expect("a wire message serializes")
    }

    /// Sends `request` on `s` and waits for its answer.
    pub(crate) fn ask(s: &UnixStream, request: &ServerRequest) -> Result<ServerAnswer> {
        let lost = |e: io::Error| Error::new(Status::Connection, format!("no answer: {e}"));
        send(s, REQUEST, &encode(request), None).map_err(lost)?;
        let (kind, payload, _) = recv(s).map_err(lost)?;
        if kind != REPLY {
            return Err(Error::internal(format!(
                "answered with message kind {kind}, not a reply"
            )));
        }
        match serde_json::from_slice::<Reply>(&payload) {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err((status, message))) => Err(Error::new(
                Status::from_u32(status).unwrap_or(Status::Internal),
                message,
            )),
            Err(e) => Err(Error::internal(format!(
                "an answer that does not decode ({e}); are the daemon and the server of one \
                 version?"
            ))),
        }
    }

    /// The server's side: decodes a request's payload, has `registry` answer it, and encodes
    /// the reply.
    pub(crate) fn answer(registry: &Registry, payload: &[u8]) -> Vec<u8> {
        let reply: Reply = serde_json::from_slice::<ServerRequest>(payload)
            .map_err(|e| {
                Error::invalid_value(format!(
                    "a request that does not decode ({e}); are the daemon and the server of one \
                     version?"
                ))
            })
            .and_then(|request| registry.answer(request))
            .map_err(|e| (e.status as u32, e.message));
        encode(&reply)
    }
}

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
    /// Arguments for every server (backend, simulator settings, ...).
    pub server_args: Vec<String>,
    /// What new servers' clients start from, until an operator command changes it.
    pub defaults: crate::registry::Defaults,
}

struct ServerProc {
    uid: u32,
    group: String,
    child: Child,
    handoff: UnixStream,
    started: Instant,
    clients: u64,
}

/// The daemon's state.
pub struct Daemon {
    cfg: DaemonConfig,
    /// Device memory per client for new servers, in bytes (0: no limit).
    default_mem_limit: std::sync::atomic::AtomicU64,
    /// Priority of new servers' clients.
    default_priority: std::sync::atomic::AtomicU32,
    /// SM share of new servers' clients, percent.
    default_share: std::sync::atomic::AtomicU32,
    /// Reservation ceiling of new servers, percent.
    default_max_reserve: std::sync::atomic::AtomicU32,
    servers: Mutex<BTreeMap<(u32, String), ServerProc>>,
    stop: AtomicBool,
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
    /// Creates the pipe directory and binds both sockets.
    pub fn bind(cfg: DaemonConfig) -> Result<Daemon> {
        let perm = |what: &str, e: std::io::Error| {
            Error::new(Status::PermissionDenied, format!("{what}: {e}"))
        };
        std::fs::create_dir_all(cfg.pipe_dir.join("servers"))
            .map_err(|e| perm("cannot create the pipe directory", e))?;
        // As root, every user may reach the client socket (the daemon routes each to its own
        // server); otherwise only this user may.
        let client_mode = if is_root() { 0o666 } else { 0o600 };
        std::fs::set_permissions(&cfg.pipe_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| perm("cannot set the pipe directory's mode", e))?;
        let client_listener = listen(&cfg.pipe_dir.join(SOCKET_NAME), client_mode)?;
        let control_listener = listen(&cfg.pipe_dir.join(CONTROL_SOCKET), 0o600)?;
        std::fs::write(
            cfg.pipe_dir.join(PID_FILE),
            format!("{}\n", std::process::id()),
        )
        .map_err(|e| perm("cannot write the pid file", e))?;
        let d = cfg.defaults;
        Ok(Daemon {
            cfg,
            default_mem_limit: std::sync::atomic::AtomicU64::new(d.mem_limit),
            default_priority: std::sync::atomic::AtomicU32::new(d.priority),
            default_share: std::sync::atomic::AtomicU32::new(d.sm_share),
            default_max_reserve: std::sync::atomic::AtomicU32::new(d.max_sm_reserve),
            servers: Mutex::new(BTreeMap::new()),
            stop: AtomicBool::new(false),
            client_listener,
            control_listener,
        })
    }

    fn servers(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u32, String), ServerProc>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves clients and operators until `quit` (or `stop` is set from outside, by a signal).
    pub fn run(self: &Arc<Self>, stop_signal: &AtomicBool) {
        let d = self.clone();
        let clients = std::thread::Builder::new()
            .name("clients".into())
            .spawn(move || d.accept_clients())
            .expect("start the client thread");
        while !self.stop.load(Ordering::Relaxed) && !stop_signal.load(Ordering::Relaxed) {
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
            let _ = std::fs::remove_file(self.cfg.pipe_dir.join(name));
        }
        tracing::info!("stopped");
    }

    fn accept_clients(self: &Arc<Self>) {
        while !self.stop.load(Ordering::Relaxed) {
            if !wait_readable(&self.client_listener).unwrap_or(false) {
                continue;
            }
            let Ok((stream, _)) = self.client_listener.accept() else {
                continue;
            };
            // The hello may be slow to come; one thread per connection keeps others moving.
            let d = self.clone();
            let _ = std::thread::Builder::new()
                .name("route".into())
                .spawn(move || d.route(stream));
        }
    }

    fn route(&self, stream: UnixStream) {
        let peer = match socket::peer(&stream) {
            Ok(p) => p,
            Err(e) => return tracing::warn!("SO_PEERCRED failed: {e}"),
        };
        let hello = match read_hello(&stream) {
            Ok(h) => h,
            Err(e) => return tracing::warn!(pid = peer.pid, "client refused: {e}"),
        };
        let group = match crate::session::hello_group(&hello) {
            Ok(g) => g,
            Err(e) => return crate::server::refuse(&stream, &e),
        };
        let me = nix::unistd::geteuid().as_raw();
        if !is_root() && peer.uid != me {
            let e = Error::new(
                Status::PermissionDenied,
                format!(
                    "this mps-control serves uid {me} only; run it as root to serve every user"
                ),
            );
            return crate::server::refuse(&stream, &e);
        }
        if let Err(e) = self.hand_over(peer.uid, &group, &hello, &stream) {
            tracing::error!(uid = peer.uid, group, "cannot serve client: {e}");
            crate::server::refuse(&stream, &e);
        }
    }

    /// Gives the connection to the (uid, group) server, starting it (again) if needed.
    fn hand_over(&self, uid: u32, group: &str, hello: &Hello, stream: &UnixStream) -> Result<()> {
        let mut servers = self.servers();
        let key = (uid, group.to_string());
        for attempt in 0..2 {
            let alive = servers
                .get_mut(&key)
                .is_some_and(|s| s.child.try_wait().ok().flatten().is_none());
            if !alive {
                if let Some(mut old) = servers.remove(&key) {
                    tracing::warn!(uid, group, pid = old.child.id(), "server had exited");
                    let _ = old.child.wait();
                }
                let s = self.start_server(uid, group)?;
                servers.insert(key.clone(), s);
            }
            let s = servers.get_mut(&key).expect("inserted above");
            match wire::send(
                &s.handoff,
                wire::HANDOFF,
                bytemuck::bytes_of(hello),
                Some(stream.as_fd()),
            ) {
                Ok(()) => {
                    s.clients += 1;
                    return Ok(());
                }
                Err(e) if attempt == 0 => {
                    tracing::warn!(uid, group, "handoff to server failed ({e}); restarting it");
                    let _ = s.child.kill();
                }
                Err(e) => {
                    return Err(Error::new(
                        Status::Connection,
                        format!(
                            "the server for uid {uid}, group {group} does not take clients: {e}"
                        ),
                    ));
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    fn start_server(&self, uid: u32, group: &str) -> Result<ServerProc> {
        let name = format!("{uid}-{group}");
        let dir = self.cfg.pipe_dir.join("servers").join(&name);
        let fail = |what: String| Error::new(Status::Internal, what);
        std::fs::create_dir_all(&dir)
            .map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| fail(format!("chmod {}: {e}", dir.display())))?;
        // The daemon keeps one end (close-on-exec); the server inherits the other.
        let (ours, theirs): (OwnedFd, OwnedFd) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::empty(),
        )
        .map_err(|e| fail(format!("socketpair: {e}")))?;
        nix::fcntl::fcntl(
            &ours,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|e| fail(format!("fcntl: {e}")))?;
        let mut cmd = Command::new(&self.cfg.server_bin);
        cmd.arg("--pipe-dir")
            .arg(&dir)
            .arg("--log-dir")
            .arg(&self.cfg.log_dir)
            .arg("--log-name")
            .arg(format!("server-{name}.log"))
            .arg("--handoff-fd")
            .arg(theirs.as_raw_fd().to_string())
            .arg("--mem-limit")
            .arg(self.default_mem_limit.load(Ordering::Relaxed).to_string())
            .arg("--client-priority")
            .arg(self.default_priority.load(Ordering::Relaxed).to_string())
            .arg("--active-thread-percentage")
            .arg(self.default_share.load(Ordering::Relaxed).to_string())
            .arg("--max-sm-reservation")
            .arg(self.default_max_reserve.load(Ordering::Relaxed).to_string())
            .args(&self.cfg.server_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if is_root() && uid != 0 {
            let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .ok_or_else(|| fail(format!("uid {uid} has no passwd entry")))?;
            // The server, running as the user, must own its directory and its log.
            let log = self.cfg.log_dir.join(format!("server-{name}.log"));
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| fail(format!("creating {}: {e}", log.display())))?;
            for path in [&dir, &log] {
                nix::unistd::chown(path, Some(user.uid), Some(user.gid))
                    .map_err(|e| fail(format!("chown {}: {e}", path.display())))?;
            }
            cmd.uid(uid).gid(user.gid.as_raw());
        }
        let child = cmd.spawn().map_err(|e| {
            fail(format!(
                "cannot start {}: {e}",
                self.cfg.server_bin.display()
            ))
        })?;
        drop(theirs);
        tracing::info!(uid, group, pid = child.id(), "started a server");
        Ok(ServerProc {
            uid,
            group: group.to_string(),
            child,
            handoff: UnixStream::from(ours),
            started: Instant::now(),
            clients: 0,
        })
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

    /// Runs one operator command and returns its answer (lines ending in `\n`).
    pub fn command(&self, line: &str) -> Result<String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let bad = |usage: &str| Error::invalid_value(format!("usage: {usage}"));
        let pid_arg = |w: Option<&&str>, usage: &str| -> Result<u32> {
            w.and_then(|p| p.parse().ok()).ok_or_else(|| bad(usage))
        };
        match words.as_slice() {
            [] => Err(Error::invalid_value("empty command")),
            ["get_server_list"] => {
                let mut servers = self.servers();
                prune(&mut servers);
                Ok(servers
                    .values()
                    .map(|s| format!("{}\n", s.child.id()))
                    .collect())
            }
            ["get_server_status", rest @ ..] => {
                let pid = pid_arg(rest.first(), "get_server_status <server-pid>")?;
                let mut servers = self.servers();
                prune(&mut servers);
                servers
                    .values()
                    .find(|s| s.child.id() == pid)
                    .map(|_| "ACTIVE\n".to_string())
                    .ok_or_else(|| no_server(pid))
            }
            ["shutdown_server", rest @ ..] => {
                let usage = "shutdown_server <server-pid> [-f]";
                let pid = pid_arg(rest.first(), usage)?;
                let force = match rest.get(1..) {
                    Some([]) | None => false,
                    Some(["-f"]) => true,
                    _ => return Err(bad(usage)),
                };
                let mut servers = self.servers();
                let key = servers
                    .iter()
                    .find(|(_, s)| s.child.id() == pid)
                    .map(|(k, _)| k.clone())
                    .ok_or_else(|| no_server(pid))?;
                let mut s = servers.remove(&key).expect("found above");
                drop(servers);
                stop_server(
                    &mut s,
                    if force {
                        Duration::ZERO
                    } else {
                        Duration::from_secs(5)
                    },
                );
                Ok(format!("server {pid} stopped\n"))
            }
            ["quit", rest @ ..] => {
                let grace = match rest {
                    [] => Duration::from_secs(5),
                    ["-t", secs] => {
                        Duration::from_secs(secs.parse().map_err(|_| bad("quit [-t <seconds>]"))?)
                    }
                    _ => return Err(bad("quit [-t <seconds>]")),
                };
                self.stop.store(true, Ordering::SeqCst);
                self.shutdown_all(grace);
                Ok("quitting\n".into())
            }
            ["status"] => self.status(),
            ["get_client_list", server, "-v"] => {
                // One line per connection: the client's pid and its counters.
                let pid = pid_arg(Some(server), "get_client_list <server-pid> [-v]")?;
                Ok(self
                    .clients_of(pid)?
                    .iter()
                    .map(|c| {
                        format!(
                            "{} uid={} mem={} mem_limit={} priority={} sms={} sm_share={} \
                             sm_reserve={} launches={} copies={} bytes_copied={} gpu_ms={}\n",
                            c.pid,
                            c.uid,
                            c.mem,
                            c.mem_limit,
                            c.priority,
                            c.sms,
                            c.sm_share,
                            c.sm_reserve,
                            c.launches,
                            c.copies,
                            c.bytes_copied,
                            c.gpu_ms
                        )
                    })
                    .collect())
            }
            ["get_client_list", rest @ ..] if rest.len() <= 1 => {
                let pid = pid_arg(rest.first(), "get_client_list <server-pid> [-v]")?;
                // One line per client process, however many connections it has.
                let pids: std::collections::BTreeSet<i32> =
                    self.clients_of(pid)?.iter().map(|c| c.pid).collect();
                Ok(pids.into_iter().map(|p| format!("{p}\n")).collect())
            }
            ["get_client_list", ..] => Err(bad("get_client_list <server-pid> [-v]")),
            ["terminate_client", server, client] => {
                let usage = "terminate_client <server-pid> <client-pid>";
                let pid = pid_arg(Some(server), usage)?;
                let client_pid: i32 = client.parse().map_err(|_| bad(usage))?;
                match self.ask(pid, &ServerRequest::Terminate { client_pid })? {
                    ServerAnswer::Terminated { connections } => Ok(format!(
                        "{connections} connection(s) of client {client_pid} terminated\n"
                    )),
                    other => Err(unexpected(pid, &other)),
                }
            }
            ["terminate_client", ..] => Err(bad("terminate_client <server-pid> <client-pid>")),
            ["set_default_client_priority", level] => {
                let level = match *level {
                    "0" => 0,
                    "1" => 1,
                    _ => return Err(bad("set_default_client_priority <0|1>")),
                };
                self.default_priority.store(level, Ordering::Relaxed);
                // Running servers take it for their new clients too.
                let pids: Vec<u32> = self.servers().values().map(|s| s.child.id()).collect();
                for pid in pids {
                    self.ask(pid, &ServerRequest::SetPriority(level))?;
                }
                Ok(format!("new clients: priority {level}\n"))
            }
            ["set_default_client_priority", ..] => Err(bad("set_default_client_priority <0|1>")),
            ["get_default_client_priority"] => Ok(format!(
                "{}\n",
                self.default_priority.load(Ordering::Relaxed)
            )),
            ["set_default_active_thread_percentage", p] => {
                let p = percent(p, 1, "set_default_active_thread_percentage <1-100>")?;
                self.default_share.store(p, Ordering::Relaxed);
                Ok(format!("new servers: {p}% of the SMs per client\n"))
            }
            ["set_default_active_thread_percentage", ..] => {
                Err(bad("set_default_active_thread_percentage <1-100>"))
            }
            ["get_default_active_thread_percentage"] => {
                Ok(format!("{}\n", self.default_share.load(Ordering::Relaxed)))
            }
            ["set_active_thread_percentage", server, p] => {
                let usage = "set_active_thread_percentage <server-pid> <1-100>";
                let pid = pid_arg(Some(server), usage)?;
                let p = percent(p, 1, usage)?;
                self.ask(pid, &ServerRequest::SetShare(p))?;
                Ok(format!("server {pid}: {p}% of the SMs per client\n"))
            }
            ["set_active_thread_percentage", ..] => {
                Err(bad("set_active_thread_percentage <server-pid> <1-100>"))
            }
            ["get_active_thread_percentage", server] => {
                let pid = pid_arg(Some(server), "get_active_thread_percentage <server-pid>")?;
                self.percent_of(pid, ServerRequest::GetShare)
            }
            ["get_active_thread_percentage", ..] => {
                Err(bad("get_active_thread_percentage <server-pid>"))
            }
            ["set_max_sm_reservation", target, p] => {
                let usage = "set_max_sm_reservation <server-pid|default> <0-100>";
                let p = percent(p, 0, usage)?;
                if *target == "default" {
                    self.default_max_reserve.store(p, Ordering::Relaxed);
                    return Ok(format!(
                        "new servers: clients may reserve {p}% of the SMs in all\n"
                    ));
                }
                let pid = pid_arg(Some(target), usage)?;
                self.ask(pid, &ServerRequest::SetMaxReserve(p))?;
                Ok(format!(
                    "server {pid}: clients may reserve {p}% of the SMs in all\n"
                ))
            }
            ["set_max_sm_reservation", ..] => {
                Err(bad("set_max_sm_reservation <server-pid|default> <0-100>"))
            }
            ["get_max_sm_reservation", target] => {
                if *target == "default" {
                    return Ok(format!(
                        "{}\n",
                        self.default_max_reserve.load(Ordering::Relaxed)
                    ));
                }
                let usage = "get_max_sm_reservation <server-pid|default>";
                let pid = pid_arg(Some(target), usage)?;
                self.percent_of(pid, ServerRequest::GetMaxReserve)
            }
            ["get_max_sm_reservation", ..] => {
                Err(bad("get_max_sm_reservation <server-pid|default>"))
            }
            ["set_default_device_pinned_mem_limit", dev, value] => {
                let bytes = device_limit(dev, value)?;
                self.default_mem_limit.store(bytes, Ordering::Relaxed);
                Ok(format!(
                    "new servers: {bytes} bytes of device memory per client\n"
                ))
            }
            ["set_default_device_pinned_mem_limit", ..] => {
                Err(bad("set_default_device_pinned_mem_limit <device> <size>"))
            }
            ["get_default_device_pinned_mem_limit", dev] => {
                device_limit(dev, "0")?;
                Ok(format!(
                    "{}\n",
                    self.default_mem_limit.load(Ordering::Relaxed)
                ))
            }
            ["set_device_pinned_mem_limit", server, dev, value] => {
                let usage = "set_device_pinned_mem_limit <server-pid> <device> <size>";
                let pid = pid_arg(Some(server), usage)?;
                let bytes = device_limit(dev, value)?;
                self.ask(pid, &ServerRequest::SetMemLimit(bytes))?;
                Ok(format!(
                    "server {pid}: {bytes} bytes of device memory per new client\n"
                ))
            }
            ["set_device_pinned_mem_limit", ..] => Err(bad(
                "set_device_pinned_mem_limit <server-pid> <device> <size>",
            )),
            [cmd, ..] => Err(Error::invalid_value(format!(
                "unknown command {cmd:?}; commands: get_server_list, get_server_status <pid>, \
                 get_client_list <pid> [-v], terminate_client <pid> <client-pid>, \
                 set_default_device_pinned_mem_limit <dev> <size>, \
                 get_default_device_pinned_mem_limit <dev>, \
                 set_device_pinned_mem_limit <pid> <dev> <size>, \
                 set_default_client_priority <0|1>, get_default_client_priority, \
                 set_default_active_thread_percentage <p>, \
                 get_default_active_thread_percentage, \
                 set_active_thread_percentage <pid> <p>, get_active_thread_percentage <pid>, \
                 set_max_sm_reservation <pid|default> <p>, \
                 get_max_sm_reservation <pid|default>, shutdown_server <pid> [-f], \
                 status, quit [-t <seconds>]"
            ))),
        }
    }

    /// Sends a request to the server with this pid and returns its answer.
    fn ask(&self, pid: u32, request: &ServerRequest) -> Result<ServerAnswer> {
        let mut servers = self.servers();
        prune(&mut servers);
        let s = servers
            .values_mut()
            .find(|s| s.child.id() == pid)
            .ok_or_else(|| no_server(pid))?;
        let _ = s.handoff.set_read_timeout(Some(Duration::from_secs(5)));
        let answer = wire::ask(&s.handoff, request).map_err(|e| {
            let message = format!("server {pid}: {}", e.message);
            Error::new(e.status, message)
        });
        let _ = s.handoff.set_read_timeout(None);
        answer
    }

    /// The clients of the server with this pid.
    fn clients_of(&self, pid: u32) -> Result<Vec<ClientStats>> {
        match self.ask(pid, &ServerRequest::Clients)? {
            ServerAnswer::Clients(clients) => Ok(clients),
            other => Err(unexpected(pid, &other)),
        }
    }

    /// A percentage the server with this pid answers `request` with, as a line.
    fn percent_of(&self, pid: u32, request: ServerRequest) -> Result<String> {
        match self.ask(pid, &request)? {
            ServerAnswer::Percent(p) => Ok(format!("{p}\n")),
            other => Err(unexpected(pid, &other)),
        }
    }

    /// Servers and their clients, with what each client holds and did.
    fn status(&self) -> Result<String> {
        let pids: Vec<(u32, u32, String, u64, u64)> = {
            let mut servers = self.servers();
            prune(&mut servers);
            servers
                .values()
                .map(|s| {
                    (
                        s.child.id(),
                        s.uid,
                        s.group.clone(),
                        s.clients,
                        s.started.elapsed().as_secs(),
                    )
                })
                .collect()
        };
        let mut out = String::from("SERVER-PID  UID     GROUP             ROUTED  UPTIME-S\n");
        let mut clients = String::from(
            "SERVER-PID  CLIENT-PID  MEM-BYTES     MEM-LIMIT     PRIORITY  SMS  SHARE%  \
             RESERVED%  LAUNCHES    COPIES      BYTES-COPIED  GPU-MS\n",
        );
        for (pid, uid, group, routed, up) in pids {
            out += &format!("{pid:<11} {uid:<7} {group:<17} {routed:<7} {up}\n");
            for c in self.clients_of(pid).unwrap_or_default() {
                clients += &format!(
                    "{pid:<11} {:<11} {:<13} {:<13} {:<9} {:<4} {:<7} {:<10} {:<11} {:<11} \
                     {:<13} {}\n",
                    c.pid,
                    c.mem,
                    c.mem_limit,
                    c.priority,
                    c.sms,
                    c.sm_share,
                    c.sm_reserve,
                    c.launches,
                    c.copies,
                    c.bytes_copied,
                    c.gpu_ms
                );
            }
        }
        Ok(format!("{out}\n{clients}"))
    }

    /// The Prometheus text exposition of every server's clients.
    pub fn metrics(&self) -> String {
        let servers: Vec<(u32, u32, String)> = {
            let mut servers = self.servers();
            prune(&mut servers);
            servers
                .values()
                .map(|s| (s.child.id(), s.uid, s.group.clone()))
                .collect()
        };
        // (value, name, type, help) of each family.
        type Family = (
            fn(&ClientStats) -> u64,
            &'static str,
            &'static str,
            &'static str,
        );
        let families: [Family; 9] = [
            (
                |c| c.mem,
                "mps_client_device_memory_bytes",
                "gauge",
                "Device memory a client holds.",
            ),
            (
                |c| c.mem_limit,
                "mps_client_device_memory_limit_bytes",
                "gauge",
                "A client's device-memory limit (0: none).",
            ),
            (
                |c| c.priority as u64,
                "mps_client_priority",
                "gauge",
                "A client's priority (0 normal, 1 below normal).",
            ),
            (
                |c| c.sms as u64,
                "mps_client_sms",
                "gauge",
                "SMs a client's kernels may use.",
            ),
            (
                |c| c.sm_reserve as u64,
                "mps_client_sm_reserved_percent",
                "gauge",
                "Percent of the SMs reserved for a client alone.",
            ),
            (
                |c| c.gpu_ms,
                "mps_client_gpu_busy_milliseconds_total",
                "counter",
                "Time the device had work of a client pending or running.",
            ),
            (
                |c| c.launches,
                "mps_client_launches_total",
                "counter",
                "Kernels a client launched.",
            ),
            (
                |c| c.copies,
                "mps_client_copies_total",
                "counter",
                "Copies a client made.",
            ),
            (
                |c| c.bytes_copied,
                "mps_client_copied_bytes_total",
                "counter",
                "Bytes a client copied.",
            ),
        ];
        let mut rows = Vec::new();
        for (pid, uid, group) in &servers {
            for c in self.clients_of(*pid).unwrap_or_default() {
                let labels = format!(
                    "server_pid=\"{pid}\",uid=\"{uid}\",group=\"{group}\",client_pid=\"{}\",client_id=\"{}\"",
                    c.pid, c.id,
                );
                rows.push((labels, c));
            }
        }
        let mut out = format!(
            "# HELP mps_servers Running servers.\n# TYPE mps_servers gauge\nmps_servers {}\n",
            servers.len()
        );
        for (value, name, kind, help) in families {
            out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
            for (labels, c) in &rows {
                out += &format!("{name}{{{labels}}} {}\n", value(c));
            }
        }
        out
    }

    /// Serves `GET /metrics` on `listener` until the daemon stops.
    pub fn serve_metrics(self: &Arc<Self>, listener: std::net::TcpListener) {
        let _ = listener.set_nonblocking(true);
        while !self.stop.load(Ordering::Relaxed) {
            let (mut conn, _) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(e) => {
                    tracing::warn!("metrics accept failed: {e}");
                    continue;
                }
            };
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut request = String::new();
            let _ = BufReader::new(&conn).read_line(&mut request);
            let (status, body) = match request.split_whitespace().collect::<Vec<_>>()[..] {
                ["GET", "/metrics", ..] => ("200 OK", self.metrics()),
                _ => (
                    "404 Not Found",
                    "only GET /metrics is served here\n".to_string(),
                ),
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    }

    fn shutdown_all(&self, grace: Duration) {
        let servers = std::mem::take(&mut *self.servers());
        for (_, mut s) in servers {
            stop_server(&mut s, grace);
        }
    }
}

/// An answer that does not fit the request: daemon and server disagree about the protocol.
fn unexpected(pid: u32, answer: &ServerAnswer) -> Error {
    Error::internal(format!(
        "server {pid} answered {answer:?}, which does not fit the request; are the daemon and the \
         server of one version?"
    ))
}

/// A device-memory limit for device `dev` (this daemon's servers use device 0).
fn device_limit(dev: &str, value: &str) -> Result<u64> {
    match dev.parse::<u32>() {
        Ok(0) => mps_core::units::parse_size(value),
        _ => Err(Error::invalid_value(format!(
            "device {dev:?}: this daemon's servers use device 0"
        ))),
    }
}

fn no_server(pid: u32) -> Error {
    Error::new(
        Status::NotFound,
        format!("no server with pid {pid}; see get_server_list"),
    )
}

/// Forgets servers that have exited (and reaps them).
fn prune(servers: &mut BTreeMap<(u32, String), ServerProc>) {
    servers.retain(|_, s| s.child.try_wait().ok().flatten().is_none());
}

/// SIGTERM, then SIGKILL after `grace`.
fn stop_server(s: &mut ServerProc, grace: Duration) {
    let pid = nix::unistd::Pid::from_raw(s.child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if s.child.try_wait().ok().flatten().is_some() {
            tracing::info!(pid = pid.as_raw(), "server stopped");
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = s.child.kill();
    let _ = s.child.wait();
    tracing::info!(pid = pid.as_raw(), "server killed");
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

/// Reads a percentage from `min` to 100.
fn percent(word: &str, min: u32, usage: &str) -> Result<u32> {
    mps_core::units::parse_percent(word.trim_end_matches('%'), min)
        .ok_or_else(|| Error::invalid_value(format!("usage: {usage}")))
}
