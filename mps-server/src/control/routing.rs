//! Which server serves a client: the daemon reads each client's hello, finds the server of its
//! (user, group), starts it (again) if there is none or it died, and hands the connection over
//! on the server's inherited socket; requests to a server travel the same way.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mps_core::protocol::Hello;
use mps_core::{Error, Result, Status};
use mps_ipc::socket;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

use super::wire::{self, ServerAnswer, ServerRequest};
use super::{Daemon, is_root};
use crate::registry::ClientStats;
use crate::server::{read_hello, wait_readable};

/// A server the daemon started, and the socket it hands clients and requests over.
pub(super) struct ServerProc {
    uid: u32,
    group: String,
    child: Child,
    handoff: UnixStream,
    started: Instant,
    clients: u64,
}

/// A running server, as operators see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct ServerInfo {
    pub(super) pid: u32,
    pub(super) uid: u32,
    pub(super) group: String,
    /// Clients routed to it.
    pub(super) routed: u64,
    pub(super) uptime: Duration,
}

impl Daemon {
    fn servers(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u32, String), ServerProc>> {
        self.servers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The servers running now.
    pub(super) fn server_list(&self) -> Vec<ServerInfo> {
        let mut servers = self.servers();
        prune(&mut servers);
        servers
            .values()
            .map(|s| ServerInfo {
                pid: s.child.id(),
                uid: s.uid,
                group: s.group.clone(),
                routed: s.clients,
                uptime: s.started.elapsed(),
            })
            .collect()
    }

    /// Stops the server with this pid: SIGTERM, then SIGKILL after `grace`.
    pub(super) fn shutdown_server(&self, pid: u32, grace: Duration) -> Result<()> {
        let mut servers = self.servers();
        let key = servers
            .iter()
            .find(|(_, s)| s.child.id() == pid)
            .map(|(k, _)| k.clone())
            .ok_or_else(|| no_server(pid))?;
        let mut s = servers.remove(&key).expect("found above");
        drop(servers);
        stop_server(&mut s, grace);
        Ok(())
    }
    /// Accepts clients until the daemon stops, each routed by a thread of its own.
    pub(super) fn accept_clients(self: &Arc<Self>) {
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
        let fail = |what: String| Error::new(Status::Internal, what);
        // Run as root, the daemon starts another user's server as that user, who must own its
        // directory and its log.
        let owner = if is_root() && uid != 0 {
            let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .ok_or_else(|| fail(format!("uid {uid} has no passwd entry")))?;
            Some((uid, user.gid.as_raw()))
        } else {
            None
        };
        let dir = self.servers_dir.subdir(&name, 0o700, owner)?;
        let log_name = format!("server-{name}.log");
        // Made here, private and not through a link, before the server appends to it by name.
        self.logs.append_file(&log_name, 0o600, owner)?;
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
            .arg(dir.path())
            .arg("--log-dir")
            .arg(self.logs.path())
            .arg("--log-name")
            .arg(&log_name)
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
        if let Some((uid, gid)) = owner {
            cmd.uid(uid).gid(gid);
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

    /// Sends a request to the server with this pid and returns its answer.
    pub(super) fn ask(&self, pid: u32, request: &ServerRequest) -> Result<ServerAnswer> {
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

    /// Stops every server, each given `grace` to finish.
    pub(super) fn shutdown_all(&self, grace: Duration) {
        let servers = std::mem::take(&mut *self.servers());
        for (_, mut s) in servers {
            stop_server(&mut s, grace);
        }
    }
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
