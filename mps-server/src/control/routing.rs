//! Which server serves a client: the daemon reads each client's hello, finds the server of its
//! (user, group, device), starts it (again) if there is none or it died, and hands the connection over
//! on the server's inherited socket; requests to a server travel the same way.
//!
//! A thread per server reads what the server says: answers to requests, and, unasked, that its
//! device context failed ([`wire::FAILED`]). The daemon then routes that user and group to a
//! fresh server at once, and lists the failed one as `FAULT` until it has drained its clients
//! and exited; clients handed to it in the meantime come back ([`wire::RETURN`]) and go to the
//! fresh one.
//!
//! Just past 600 lines: routing, starting servers and the recovery hand-back are one state (the
//! table of servers) and are kept together.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::{Duration, Instant};

use mps_core::handshake::DeviceList;
use mps_core::protocol::Hello;
use mps_core::{Error, Result, Status};
use mps_ipc::socket;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use super::groups::GroupLimits;
use super::wire::{self, ServerAnswer, ServerRequest};
use super::{Daemon, is_root};
use crate::intake::{Gate, Outcome, Throttle, accept_loop};
use crate::registry::{ClientStats, Defaults};

/// How often refused clients are logged at most.
const REFUSALS_LOGGED: Duration = Duration::from_secs(10);

/// How long the daemon waits for a server's answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A server the daemon started, and the socket it hands clients and requests over.
pub(super) struct ServerProc {
    uid: u32,
    group: String,
    device: u32,
    /// What its clients start from, as the daemon's defaults were when it was started.
    pub(super) defaults: Defaults,
    /// Its group's limits, as they were when it was started.
    pub(super) limits: GroupLimits,
    pub(super) child: Child,
    link: Arc<Link>,
    started: Instant,
    clients: u64,
}

/// The socket to a server, and the answers that come back on it.
struct Link {
    socket: UnixStream,
    /// One message at a time: handoffs and requests come from several threads.
    sending: Arc<Mutex<()>>,
    /// Answers, from the thread that reads the socket; one request at a time waits here.
    replies: Mutex<mpsc::Receiver<Vec<u8>>>,
    /// Clients waiting to be handed to the server, sent by a thread of the server's own
    /// ([`send_handoffs`]): a server that does not read its socket (stopped, or still making
    /// its context) holds up its own clients only, never the daemon's one intake thread.
    handoffs: mpsc::SyncSender<Handoff>,
}

/// A client whose hello the daemon read, on its way to its server.
struct Handoff {
    hello: Hello,
    client: UnixStream,
}

/// Clients that may wait for one server to take them; more are refused at once.
const HANDOFF_QUEUE: usize = 256;
/// How long one message to a server may take to go out before it is given up (the server's
/// socket buffer stays full only while it does not read).
const SEND_WITHIN: Duration = Duration::from_secs(5);

/// Sends server `pid` the clients queued for it, in order, until the daemon forgets the server;
/// a client the server cannot be given (it has exited, or has not read its socket for
/// [`SEND_WITHIN`]) is refused with the reason.
fn send_handoffs(
    pid: u32,
    socket: UnixStream,
    sending: Arc<Mutex<()>>,
    queued: mpsc::Receiver<Handoff>,
) {
    for h in queued {
        let sent = {
            let _turn = sending.lock().unwrap_or_else(|p| p.into_inner());
            wire::send(
                &socket,
                wire::HANDOFF,
                bytemuck::bytes_of(&h.hello),
                Some(h.client.as_fd()),
            )
        };
        if let Err(e) = sent {
            tracing::warn!(pid, "cannot hand a client to the server: {e}");
            let e = Error::new(
                Status::Connection,
                format!("the mps server (pid {pid}) did not take this client: {e}; try again"),
            );
            crate::server::refuse(&h.client, &e);
        }
    }
}

impl Link {
    fn ask(&self, request: &ServerRequest) -> Result<ServerAnswer> {
        let replies = self.replies.lock().unwrap_or_else(|p| p.into_inner());
        // An answer that came after its request gave up is not this request's.
        while replies.try_recv().is_ok() {}
        {
            let _turn = self.sending.lock().unwrap_or_else(|p| p.into_inner());
            wire::send_request(&self.socket, request)?;
        }
        let payload = replies.recv_timeout(ANSWER_WITHIN).map_err(|e| {
            let why = match e {
                mpsc::RecvTimeoutError::Timeout => {
                    format!("no answer within {} s", ANSWER_WITHIN.as_secs())
                }
                mpsc::RecvTimeoutError::Disconnected => "it has exited".to_string(),
            };
            Error::new(Status::Connection, why)
        })?;
        wire::decode_reply(&payload)
    }
}

/// Whether a server takes clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ServerState {
    /// It serves its user and group.
    Active,
    /// Its device context failed: a fresh server took its user and group; it tells its clients
    /// what happened and exits once they are gone.
    Fault,
    /// It has made its context and waits to take its user and group's clients should the
    /// active server's context fail (`mps-control --standby`).
    Standby,
}

impl std::fmt::Display for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ServerState::Active => "ACTIVE",
            ServerState::Fault => "FAULT",
            ServerState::Standby => "STANDBY",
        })
    }
}

/// A running server, as operators see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ServerInfo {
    pub(super) pid: u32,
    pub(super) uid: u32,
    pub(super) group: String,
    /// The device ordinal it serves.
    pub(super) device: u32,
    /// Clients routed to it.
    pub(super) routed: u64,
    pub(super) uptime: Duration,
    pub(super) state: ServerState,
    /// Its group's limits.
    pub(super) limits: GroupLimits,
    /// Its clients' priority when it was started.
    pub(super) priority: u32,
}

impl ServerProc {
    pub(super) fn info(&self, state: ServerState) -> ServerInfo {
        ServerInfo {
            pid: self.child.id(),
            uid: self.uid,
            group: self.group.clone(),
            device: self.device,
            routed: self.clients,
            uptime: self.started.elapsed(),
            state,
            limits: self.limits.clone(),
            priority: self.defaults.priority,
        }
    }
}

impl Daemon {
    fn servers(&self) -> std::sync::MutexGuard<'_, BTreeMap<ServerKey, ServerProc>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Servers whose context failed, until they have exited.
    fn failed(&self) -> std::sync::MutexGuard<'_, Vec<ServerProc>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The servers running now: those serving, then those draining after a fault.
    pub(super) fn server_list(&self) -> Vec<ServerInfo> {
        let mut servers = self.servers();
        prune(&mut servers);
        let mut list: Vec<ServerInfo> = servers
            .values()
            .map(|s| s.info(ServerState::Active))
            .collect();
        drop(servers);
        let mut failed = self.failed();
        prune_failed(&mut failed);
        list.extend(failed.iter().map(|s| s.info(ServerState::Fault)));
        list
    }

    /// Stops the server with this pid: SIGTERM, then SIGKILL after `grace`.
    /// An active server's standby goes with it; a standby's pid stops that standby alone.
    pub(super) fn shutdown_server(&self, pid: u32, grace: Duration) -> Result<()> {
        let mut servers = self.servers();
        let key = servers
            .iter()
            .find(|(_, s)| s.child.id() == pid)
            .map(|(k, _)| k.clone());
        let mut stopped = match key {
            Some(key) => {
                let s = servers.remove(&key).expect("found above");
                // Stopped after the lock is let go: routing goes on meanwhile.
                drop(servers);
                let mut stopped = vec![s];
                stopped.extend(self.take_standby(|k, _| *k == key));
                stopped
            }
            None => {
                drop(servers);
                let mut failed = self.failed();
                match failed.iter().position(|s| s.child.id() == pid) {
                    Some(at) => vec![failed.remove(at)],
                    None => {
                        drop(failed);
                        let standby = self.take_standby(|_, s| s.child.id() == pid);
                        if standby.is_empty() {
                            return Err(no_server(pid));
                        }
                        standby
                    }
                }
            }
        };
        for s in &mut stopped {
            stop_server(s, grace);
        }
        Ok(())
    }

    /// The server with this pid said its device context failed: its user, group and device go to a
    /// fresh server from now on, started at once so that the next client need not wait for it.
    fn server_failed(self: &Arc<Self>, pid: u32, why: &str) {
        let mut servers = self.servers();
        let Some(key) = servers
            .iter()
            .find(|(_, s)| s.child.id() == pid)
            .map(|(k, _)| k.clone())
        else {
            return;
        };
        let old = servers.remove(&key).expect("found above");
        let (uid, group, device) = (key.0, key.1.as_str(), key.2);
        tracing::error!(
            uid,
            group,
            device,
            pid,
            "the server's device context failed; it takes no new clients and exits once its \
             clients are gone; new clients go to a fresh server: {why}"
        );
        self.failed().push(old);
        if let Some(standby) = self.promote_standby(&key) {
            tracing::info!(
                uid,
                group,
                device,
                pid = standby.child.id(),
                "the standby server takes the new clients"
            );
            servers.insert(key.clone(), standby);
        } else {
            match self.start_server(uid, group, device, None) {
                Ok(fresh) => {
                    servers.insert(key.clone(), fresh);
                }
                Err(e) => tracing::error!(
                    uid,
                    group,
                    device,
                    "cannot start a fresh server ({e}); the next client tries again"
                ),
            }
        }
        drop(servers);
        self.keep_standby(&key);
    }
    /// Accepts clients until the daemon stops. One thread reads every hello (none gets a
    /// thread of its own, whatever a local user opens), and routes each client whose hello is
    /// complete; only the connections waiting for their hello are counted, and only that many
    /// (`--max-pending-hellos`, the oldest dropped beyond it) for `--hello-timeout-ms` each.
    pub(super) fn accept_clients(self: &Arc<Self>) {
        let limits = crate::intake::Limits {
            // A connection leaves the daemon's count when it is handed to its server, which
            // counts it against its own limits from then on.
            max_clients: usize::MAX,
            max_clients_per_user: usize::MAX,
            max_pending: self.cfg.hellos.max_pending,
            hello_timeout: self.cfg.hellos.timeout,
        };
        let gate = Gate::new(limits);
        let mut refusals = Throttle::new(REFUSALS_LOGGED);
        let open = || !self.stop.load(Ordering::Relaxed);
        let served = accept_loop(&self.client_listener, &gate, open, |outcomes| {
            for o in outcomes.drain(..) {
                match o {
                    Outcome::Ready(p, hello) => self.route_hello(p.stream, p.peer, &hello),
                    Outcome::Refused(peer, e) => {
                        if let Some(left_out) = refusals.admit(Instant::now()) {
                            tracing::warn!(
                                pid = peer.pid,
                                uid = peer.uid,
                                "client refused: {} ({left_out} more refusals since the last \
                                 report)",
                                e.message
                            );
                        }
                    }
                    Outcome::Left(peer) => {
                        tracing::debug!(pid = peer.pid, "a connection closed before its hello")
                    }
                }
            }
        });
        if let Err(e) = served {
            tracing::error!("the daemon takes no more clients: {e}");
        }
    }

    /// Routes a client whose hello has been read.
    fn route_hello(self: &Arc<Self>, stream: UnixStream, peer: socket::Peer, hello: &Hello) {
        let asked = match hello.group() {
            Ok(g) => g,
            Err(e) => return crate::server::refuse(&stream, &e),
        };
        if hello.asks_device_list() {
            return self.answer_device_list(&stream);
        }
        if let Err(e) = self.check_served(hello.device) {
            return crate::server::refuse(&stream, &e);
        }
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
        let group = match self.place(&peer, &asked) {
            Ok(g) => g,
            Err(e) => {
                // At debug only: a client may ask again as often as it likes, and it is told.
                tracing::debug!(
                    uid = peer.uid,
                    pid = peer.pid,
                    "client refused: {}",
                    e.message
                );
                return crate::server::refuse(&stream, &e);
            }
        };
        if let Err(e) = self.hand_over(peer.uid, &group, hello, &stream) {
            tracing::error!(uid = peer.uid, group, "cannot serve client: {e}");
            crate::server::refuse(&stream, &e);
        }
    }

    /// Tells a client which devices this daemon serves.
    fn answer_device_list(&self, stream: &UnixStream) {
        match DeviceList::new(&self.cfg.devices) {
            Ok(list) => {
                let _ = socket::send(stream, bytemuck::bytes_of(&list), &[]);
            }
            Err(e) => crate::server::refuse(stream, &e),
        }
    }

    /// Gives the connection to the (uid, group, device) server, starting it (again) if needed.
    fn hand_over(
        self: &Arc<Self>,
        uid: u32,
        group: &str,
        hello: &Hello,
        stream: &UnixStream,
    ) -> Result<()> {
        let mut servers = self.servers();
        let key = (uid, group.to_string(), hello.device);
        for attempt in 0..2 {
            let alive = servers
                .get_mut(&key)
                .is_some_and(|s| s.child.try_wait().ok().flatten().is_none());
            if !alive {
                if let Some(mut old) = servers.remove(&key) {
                    tracing::warn!(uid, group, pid = old.child.id(), "server had exited");
                    let _ = old.child.wait();
                }
                prune(&mut servers);
                let max = self.cfg.max_servers_per_user;
                let theirs: Vec<&str> = servers
                    .keys()
                    .filter(|k| k.0 == uid)
                    .map(|k| k.1.as_str())
                    .collect();
                if theirs.len() >= max {
                    return Err(Error::new(
                        Status::QuotaExceeded,
                        format!(
                            "uid {uid} already has {} servers running (groups {}), the daemon's \
                             limit (mps-control --max-servers-per-user {max}); use one of those \
                             groups, or let an operator stop one (mps-control shutdown_server)",
                            theirs.len(),
                            theirs.join(", ")
                        ),
                    ));
                }
                self.bound_logs(&key, &servers);
                let s = self.start_server(uid, group, hello.device, None)?;
                servers.insert(key.clone(), s);
                self.keep_standby(&key);
            }
            let s = servers.get_mut(&key).expect("inserted above");
            let client = stream.try_clone().map_err(|e| {
                Error::new(
                    Status::Connection,
                    format!("cannot keep the connection: {e}"),
                )
            })?;
            let handoff = Handoff {
                hello: *hello,
                client,
            };
            match s.link.handoffs.try_send(handoff) {
                Ok(()) => {
                    s.clients += 1;
                    return Ok(());
                }
                Err(mpsc::TrySendError::Full(_)) => {
                    return Err(Error::new(
                        Status::Connection,
                        format!(
                            "the server for uid {uid}, group {group} (pid {}) already has \
                             {HANDOFF_QUEUE} clients waiting to be taken; try again",
                            s.child.id()
                        ),
                    ));
                }
                // Its sending thread is gone: the server cannot be reached.
                Err(mpsc::TrySendError::Disconnected(_)) if attempt == 0 => {
                    tracing::warn!(uid, group, "the server cannot be reached; restarting it");
                    let _ = s.child.kill();
                    let _ = s.child.wait();
                }
                Err(mpsc::TrySendError::Disconnected(_)) => {
                    return Err(Error::new(
                        Status::Connection,
                        format!("the server for uid {uid}, group {group} does not take clients"),
                    ));
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    /// Starts the server of (`uid`, `group`, `device`); with `standby`, the read end of the pipe
    /// it then waits on for its go before it serves ([`super::standby`]).
    pub(super) fn start_server(
        self: &Arc<Self>,
        uid: u32,
        group: &str,
        device: u32,
        standby: Option<&OwnedFd>,
    ) -> Result<ServerProc> {
        // Device 0 keeps the names of a host with one device; `@` cannot occur in a group name.
        let name = match device {
            0 => format!("{uid}-{group}"),
            d => format!("{uid}-{group}@{d}"),
        };
        let fail = |what: String| Error::new(Status::Internal, what);
        let owner = owner_of(uid)?;
        let dir = self.servers_dir.subdir(&name, 0o700, owner)?;
        let log_name = super::logs::log_name(uid, group, device);
        let user_logs = self.user_logs(owner)?;
        let logs = user_logs.as_ref().unwrap_or(&self.logs);
        // Made here, private and not through a link, before the server appends to it by name.
        logs.append_file(&log_name, 0o600, owner)?;
        // The daemon keeps one end (close-on-exec); the server inherits the other.
        // Both ends close-on-exec, so that no other server started meanwhile inherits one; the
        // server's end is let through to it alone, between its fork and exec.
        let (ours, theirs): (OwnedFd, OwnedFd) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| fail(format!("socketpair: {e}")))?;
        let (defaults, limits) = self.group_server(group, device);
        let mut cmd = Command::new(&self.cfg.server_bin);
        cmd.arg("--pipe-dir")
            .arg(dir.path())
            .arg("--log-dir")
            .arg(logs.path())
            .arg("--log-name")
            .arg(&log_name)
            .arg("--handoff-fd")
            .arg(theirs.as_raw_fd().to_string())
            .arg("--mem-limit")
            .arg(defaults.mem_limit.to_string())
            .arg("--client-priority")
            .arg(defaults.priority.to_string())
            .arg("--active-thread-percentage")
            .arg(defaults.sm_share.to_string())
            .arg("--max-sm-reservation")
            .arg(defaults.max_sm_reserve.to_string())
            .arg("--device")
            .arg(device.to_string())
            .args(limits.args())
            .args(&self.cfg.server_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(pipe) = standby {
            cmd.arg("--standby-fd").arg(pipe.as_raw_fd().to_string());
        }
        if let Some((uid, gid)) = owner {
            cmd.uid(uid).gid(gid);
        }
        let inherited = std::iter::once(theirs.as_raw_fd())
            .chain(standby.map(AsRawFd::as_raw_fd))
            .collect();
        crate::process::inherit(&mut cmd, inherited);
        let child = cmd.spawn().map_err(|e| {
            fail(format!(
                "cannot start {}: {e}",
                self.cfg.server_bin.display()
            ))
        })?;
        drop(theirs);
        let pid = child.id();
        tracing::info!(uid, group, device, pid, "started a server");
        let socket = UnixStream::from(ours);
        let reading = socket
            .try_clone()
            .map_err(|e| fail(format!("cannot read server {pid}'s socket: {e}")))?;
        let (replies, answers) = mpsc::channel();
        let daemon = Arc::downgrade(self);
        std::thread::Builder::new()
            .name(format!("server-{pid}"))
            .spawn(move || listen_to(daemon, pid, reading, replies))
            .map_err(|e| fail(format!("cannot start a thread for server {pid}: {e}")))?;
        // A server that stops reading its socket fails a send after a while instead of holding
        // up whoever sends.
        socket
            .set_write_timeout(Some(SEND_WITHIN))
            .map_err(|e| fail(format!("cannot bound sends to server {pid}: {e}")))?;
        let sending = Arc::new(Mutex::new(()));
        let (handoffs, queued) = mpsc::sync_channel(HANDOFF_QUEUE);
        let (sender, turn) = (
            socket
                .try_clone()
                .map_err(|e| fail(format!("cannot write to server {pid}'s socket: {e}")))?,
            sending.clone(),
        );
        std::thread::Builder::new()
            .name(format!("handoff-{pid}"))
            .spawn(move || send_handoffs(pid, sender, turn, queued))
            .map_err(|e| fail(format!("cannot start a thread for server {pid}: {e}")))?;
        Ok(ServerProc {
            uid,
            group: group.to_string(),
            device,
            defaults,
            limits,
            child,
            link: Arc::new(Link {
                socket,
                sending,
                replies: Mutex::new(answers),
                handoffs,
            }),
            started: Instant::now(),
            clients: 0,
        })
    }

    /// The log directory of `owner`'s servers, if not the daemon's own: another user's server
    /// cannot open the log directory itself (0711 as root, as the package makes /var/log/mps,
    /// so that nobody lists it), so it logs in a directory of its own there, which only that
    /// user can read or write.
    fn user_logs(&self, owner: Option<(u32, u32)>) -> Result<Option<mps_ipc::trust::TrustedDir>> {
        owner
            .map(|(uid, _)| self.logs.subdir(&uid.to_string(), 0o700, owner))
            .transpose()
    }

    /// Bounds uid `uid`'s server logs before the server of `key` starts (the logs of servers
    /// no longer running go, the oldest first: [`super::logs`]); `servers` are the servers
    /// serving now. A failure to bound them is logged, and the server starts all the same.
    fn bound_logs(&self, key: &ServerKey, servers: &BTreeMap<ServerKey, ServerProc>) {
        let uid = key.0;
        let name = |k: &ServerKey| super::logs::log_name(k.0, &k.1, k.2);
        let mut live: std::collections::BTreeSet<String> =
            servers.keys().filter(|k| k.0 == uid).map(name).collect();
        live.extend(
            self.failed()
                .iter()
                .filter(|s| s.uid == uid)
                .map(|s| super::logs::log_name(s.uid, &s.group, s.device)),
        );
        live.extend(self.standby_keys().iter().filter(|k| k.0 == uid).map(name));
        let dir = match owner_of(uid).and_then(|owner| self.user_logs(owner)) {
            Ok(dir) => dir,
            Err(e) => return tracing::warn!(uid, "cannot bound the server logs: {e}"),
        };
        let dir = dir.as_ref().unwrap_or(&self.logs);
        super::logs::bound(dir, uid, self.cfg.max_server_logs, &live, &name(key));
    }

    /// Sends a request to the server with this pid (serving, or draining after a fault) and
    /// returns its answer.
    pub(super) fn ask(&self, pid: u32, request: &ServerRequest) -> Result<ServerAnswer> {
        let mut servers = self.servers();
        prune(&mut servers);
        let link = match servers.values().find(|s| s.child.id() == pid) {
            Some(s) => s.link.clone(),
            None => {
                drop(servers);
                let mut failed = self.failed();
                prune_failed(&mut failed);
                failed
                    .iter()
                    .find(|s| s.child.id() == pid)
                    .map(|s| s.link.clone())
                    .ok_or_else(|| no_server(pid))?
            }
        };
        // Routing goes on while a slow server answers.
        link.ask(request).map_err(|e| {
            let message = format!("server {pid}: {}", e.message);
            Error::new(e.status, message)
        })
    }

    /// The clients of the server with this pid.
    pub(super) fn clients_of(&self, pid: u32) -> Result<Vec<ClientStats>> {
        match self.ask(pid, &ServerRequest::Clients)? {
            ServerAnswer::Clients(clients) => Ok(clients),
            other => Err(unexpected(pid, &other)),
        }
    }

    /// A percentage the server with this pid answers `request` with, as a line.
    pub(super) fn percent_of(&self, pid: u32, request: ServerRequest) -> Result<String> {
        match self.ask(pid, &request)? {
            ServerAnswer::Percent(p) => Ok(format!("{p}\n")),
            other => Err(unexpected(pid, &other)),
        }
    }

    /// Stops every server (standbys too), each given `grace` to finish.
    pub(super) fn shutdown_all(&self, grace: Duration) {
        let servers = std::mem::take(&mut *self.servers());
        let failed = std::mem::take(&mut *self.failed());
        let standbys = self.take_standbys();
        for mut s in servers.into_values().chain(failed).chain(standbys) {
            stop_server(&mut s, grace);
        }
    }
}

/// Who owns the server of `uid`, its directory and its log: run as root, the daemon starts
/// another user's server as that user (uid and primary gid); otherwise itself (`None`).
fn owner_of(uid: u32) -> Result<Option<(u32, u32)>> {
    if !is_root() || uid == 0 {
        return Ok(None);
    }
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .ok_or_else(|| Error::new(Status::Internal, format!("uid {uid} has no passwd entry")))?;
    Ok(Some((uid, user.gid.as_raw())))
}

/// An answer that does not fit the request: daemon and server disagree about the protocol.
pub(super) fn unexpected(pid: u32, answer: &ServerAnswer) -> Error {
    Error::internal(format!(
        "server {pid} answered {answer:?}, which does not fit the request; are the daemon and the \
         server of one version?"
    ))
}

pub(super) fn no_server(pid: u32) -> Error {
    Error::new(
        Status::NotFound,
        format!("no server with pid {pid}; see get_server_list"),
    )
}

/// Which server serves a client: its user, group and device ordinal.
pub(super) type ServerKey = (u32, String, u32);

/// Device ordinals as a list for a message ("0, 1").
pub(super) fn device_names(devices: &[u32]) -> String {
    let names: Vec<String> = devices.iter().map(u32::to_string).collect();
    names.join(", ")
}

/// Forgets servers that have exited (and reaps them).
fn prune(servers: &mut BTreeMap<ServerKey, ServerProc>) {
    servers.retain(|_, s| s.child.try_wait().ok().flatten().is_none());
}

/// Forgets failed servers that have exited (and reaps them).
fn prune_failed(failed: &mut Vec<ServerProc>) {
    failed.retain_mut(|s| {
        let running = s.child.try_wait().ok().flatten().is_none();
        if !running {
            tracing::info!(
                uid = s.uid,
                group = s.group,
                device = s.device,
                pid = s.child.id(),
                "the server whose context failed has exited"
            );
        }
        running
    });
}

/// Reads what server `pid` says on `socket` until it goes away: answers go to `replies`, news of
/// a failed context and clients given back to the daemon.
fn listen_to(daemon: Weak<Daemon>, pid: u32, socket: UnixStream, replies: mpsc::Sender<Vec<u8>>) {
    loop {
        match wire::recv(&socket) {
            Ok((wire::REPLY, payload, _)) => {
                let _ = replies.send(payload);
            }
            Ok((wire::UNSTARTED, payload, _)) => {
                // The server refuses the clients it was handed with this reason, and exits.
                tracing::error!(
                    pid,
                    "the server could not start: {}",
                    String::from_utf8_lossy(&payload)
                );
            }
            Ok((wire::FAILED, payload, _)) => {
                let Some(d) = daemon.upgrade() else { return };
                d.server_failed(pid, &String::from_utf8_lossy(&payload));
            }
            Ok((wire::RETURN, payload, Some(fd))) if payload.len() == size_of::<Hello>() => {
                let Some(d) = daemon.upgrade() else { return };
                let hello: Hello = bytemuck::pod_read_unaligned(&payload);
                let stream = UnixStream::from(fd);
                // Routed on a thread of its own: this one must keep reading, or the failed
                // server could block giving back more.
                let _ = std::thread::Builder::new()
                    .name("route".into())
                    .spawn(move || match socket::peer(&stream) {
                        Ok(peer) => d.route_hello(stream, peer, &hello),
                        Err(e) => tracing::warn!("SO_PEERCRED of a client given back failed: {e}"),
                    });
            }
            Ok((kind, ..)) => {
                tracing::warn!(pid, "malformed message of kind {kind} from a server")
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                // The server has exited: forget it now if its context had failed.
                if let Some(d) = daemon.upgrade() {
                    reap_failed(&d, pid);
                }
                return;
            }
        }
    }
}

/// Reaps failed server `pid`, whose socket just closed as it exits, and forgets it.
fn reap_failed(daemon: &Daemon, pid: u32) {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        let mut failed = daemon.failed();
        let Some(at) = failed.iter().position(|s| s.child.id() == pid) else {
            return;
        };
        if failed[at].child.try_wait().ok().flatten().is_some() {
            let s = failed.remove(at);
            tracing::info!(
                uid = s.uid,
                group = s.group,
                pid,
                "the server whose context failed has exited"
            );
            return;
        }
        drop(failed);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// SIGTERM, then SIGKILL after `grace`.
pub(super) fn stop_server(s: &mut ServerProc, grace: Duration) {
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
