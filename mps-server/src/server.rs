//! The listening socket in the pipe directory, the accept loop (which is also the intake of
//! hellos, [`crate::intake`]), the handshake, and the hand-over of each client to the session
//! workers.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mps_core::handshake::{DeviceInfoWire, DeviceList, Hello, Welcome};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, Layout};
use mps_ipc::socket::{self, Peer, SOCKET_NAME};
use mps_ipc::trust::TrustedDir;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::backend::Backend;
use crate::control::wire;
use crate::intake::{
    DEFAULT_LIMITS, Gate, Limits as ConnectionLimits, Outcome, Throttle, Ticket, accept_loop,
};
use crate::recovery::Recovery;
use crate::registry::{Defaults, Registry};
use crate::session::{HandleIssuer, Limits, ServerEnv, Session, Workers};

/// How a server is set up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Directory holding the socket.
    pub pipe_dir: PathBuf,
    /// Ring and staging sizes of each client's channel.
    pub layout: Layout,
    /// Session workers per client priority (0: a thread per client); see
    /// [`ServerConfig::default_session_workers`].
    pub session_workers: usize,
    /// How long a session thread spins for new commands before it yields.
    pub spin: Duration,
    /// How long it then keeps looking between yields of the processor before it sleeps.
    pub yield_for: Duration,
    /// Device memory each new client may hold, in bytes (0: no limit).
    pub mem_limit: u64,
    /// Priority of new clients (`PRIORITY_NORMAL` or `PRIORITY_BELOW_NORMAL`).
    pub client_priority: u32,
    /// Share of the device's SMs each client may use, percent.
    pub sm_share: u32,
    /// Ceiling on the SMs the clients may reserve in all, percent.
    pub max_sm_reserve: u32,
    /// Connections admitted and how long a hello may take.
    pub limits: ConnectionLimits,
    /// What each client may hold (streams, events, modules, host buffers, ...).
    pub client_limits: Limits,
    /// The device ordinal served: clients asking for another are refused.
    pub device: u32,
    /// Device memory all the clients may hold together, in bytes (0: no limit): the group's
    /// limit under mps-control.
    pub max_device_bytes: u64,
    /// The part of the device's SMs, from and to percent, that every client runs within (its
    /// group's share or reservation under mps-control); `(0, 100)`: the whole device.
    pub sm_range: (u32, u32),
}

/// A server bound to its socket.
#[derive(Debug)]
pub struct Server<B: Backend> {
    backend: Arc<B>,
    cfg: ServerConfig,
    listener: UnixListener,
    socket_path: PathBuf,
    handles: Arc<HandleIssuer>,
    next_client: AtomicU32,
    registry: Arc<Registry>,
    recovery: Arc<Recovery>,
    workers: Workers<B>,
    gate: Arc<Gate>,
    refusals: Mutex<Throttle>,
}

impl ServerConfig {
    /// The default number of session workers per client priority: four per CPU the server may
    /// run on.
    pub fn default_session_workers() -> usize {
        Workers::<crate::backend::sim::SimBackend>::default_count()
    }
}

impl<B: Backend> Server<B> {
    /// Binds the socket `mps.sock` in the pipe directory, creating the directory (mode 0700)
    /// or refusing one that another user owns or can write ([`mps_ipc::trust`]). Fails if
    /// another server answers on it; a stale socket file from a server that died is replaced.
    pub fn bind(backend: Arc<B>, cfg: ServerConfig) -> Result<Server<B>> {
        let dir = TrustedDir::open(&cfg.pipe_dir, 0o700)
            .map_err(|e| Error::new(e.status, format!("the pipe directory: {}", e.message)))?;
        // Only this user (and root) may connect; the handshake checks the uid again.
        let listener = dir.listen(SOCKET_NAME, 0o600)?;
        Self::adopt(backend, cfg, listener)
    }

    /// Serves on `listener`, already listening at the pipe directory's socket path (handed
    /// over by a server whose context failed, see [`crate::recovery`]).
    pub fn adopt(backend: Arc<B>, cfg: ServerConfig, listener: UnixListener) -> Result<Server<B>> {
        let path = cfg.pipe_dir.join(SOCKET_NAME);
        cfg.client_limits.check()?;
        // The accept loop also reads hellos: it must never block in accept.
        listener.set_nonblocking(true).map_err(|e| {
            Error::internal(format!("cannot make {} non-blocking: {e}", path.display()))
        })?;
        let defaults = Defaults {
            mem_limit: cfg.mem_limit,
            priority: cfg.client_priority,
            sm_share: cfg.sm_share,
            max_sm_reserve: cfg.max_sm_reserve,
        };
        let placer = {
            let backend = backend.clone();
            Box::new(move |a: &[crate::sm::Assignment]| backend.place(a))
        };
        let registry = Registry::new(defaults, backend.info().sm_units.clone(), placer)
            .confined(cfg.sm_range.0, cfg.sm_range.1)?;
        registry.ledger().set_max_device_bytes(cfg.max_device_bytes);
        let registry = Arc::new(registry);
        let recovery = Recovery::watch(&*backend, &listener, path.clone(), registry.clone())?;
        // The CPU gauge's thread starts with the server, not with the first client that asks,
        // so that the threads a server holds do not grow once it serves.
        if cfg.client_limits.batch_pacing == crate::session::BatchPacing::CpuLoad {
            crate::cpu_pressure::contended();
        }
        let workers = Workers::new(cfg.session_workers, (cfg.spin, cfg.yield_for))
            .map_err(|e| Error::internal(format!("cannot start the session workers: {e}")))?;
        let cfg_limits = cfg.limits;
        Ok(Server {
            workers,
            backend,
            registry,
            recovery,
            cfg,
            listener,
            socket_path: path,
            handles: Arc::default(),
            next_client: AtomicU32::new(1),
            gate: Gate::new(cfg_limits),
            refusals: Mutex::new(Throttle::new(LOG_PERIOD)),
        })
    }

    /// The socket's path.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// The watch over the device context, and what happens when it fails.
    pub fn recovery(&self) -> &Arc<Recovery> {
        &self.recovery
    }

    /// Accepts clients until `stop` is set or the device context failed. This one thread also
    /// reads every hello that is not yet complete; a client whose hello is in is handed to the
    /// session workers.
    pub fn run(&self, stop: &AtomicBool) -> Result<()> {
        // A failed context takes no client: waiting connections are the fresh server's.
        let open = || !stop.load(Ordering::Relaxed) && !self.recovery.failed();
        accept_loop(&self.listener, &self.gate, open, |o| self.settle(o))
    }

    /// Serves the connections whose hello is complete and logs (at a bounded rate) those
    /// refused.
    fn settle(&self, outcomes: &mut Vec<Outcome>) {
        for o in outcomes.drain(..) {
            match o {
                Outcome::Ready(p, hello) => self.spawn_client(p.stream, hello, p.peer, p.ticket),
                Outcome::Refused(peer, e) => self.log_refusal(peer, &e),
                Outcome::Left(peer) => {
                    tracing::debug!(pid = peer.pid, "a connection closed before its hello")
                }
            }
        }
    }

    fn log_refusal(&self, peer: Peer, e: &Error) {
        let mut t = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(left_out) = t.admit(Instant::now()) {
            tracing::warn!(
                pid = peer.pid,
                uid = peer.uid,
                "connection refused: {} ({left_out} more refusals since the last report)",
                e.message
            );
        }
    }

    /// Serves the control daemon on `handoff` (a socket inherited from it): clients it hands
    /// over (their hello, with the connection attached) and its commands. Returns when the
    /// daemon goes away.
    pub fn serve_handoffs(&self, handoff: UnixStream, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            match wire::recv(&handoff) {
                Ok((wire::HANDOFF, payload, Some(fd))) if payload.len() == size_of::<Hello>() => {
                    if self.recovery.failed() {
                        self.recovery.give_back(&handoff, &payload, fd);
                        continue;
                    }
                    let hello: Hello = bytemuck::pod_read_unaligned(&payload);
                    self.take_handoff(UnixStream::from(fd), hello);
                }
                Ok((wire::REQUEST, payload, None)) => {
                    let reply = wire::answer(&self.registry, &payload);
                    if let Err(e) = wire::send_to_daemon(&handoff, wire::REPLY, &reply, None) {
                        tracing::warn!("cannot answer the control daemon: {e}");
                    }
                }
                Ok((kind, ..)) => {
                    tracing::warn!("malformed message of kind {kind} from the daemon")
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::info!("the control daemon went away ({e}); stopping");
                    return;
                }
            }
        }
    }

    /// A client the daemon read the hello of: admitted as any other.
    fn take_handoff(&self, stream: UnixStream, hello: Hello) {
        let peer = match socket::peer(&stream) {
            Ok(p) => p,
            Err(e) => return tracing::warn!("SO_PEERCRED of a handed-over client failed: {e}"),
        };
        match self.gate.admit(peer.uid) {
            Ok(ticket) => self.spawn_client(stream, hello, peer, ticket),
            Err(e) => {
                refuse(&stream, &e);
                self.log_refusal(peer, &e);
            }
        }
    }

    /// Starts the thread that answers `hello` and serves the client; if no thread can be
    /// started, the client is refused with the reason.
    fn spawn_client(&self, stream: UnixStream, hello: Hello, peer: Peer, ticket: Ticket) {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let backend = self.backend.clone();
        let handles = self.handles.clone();
        let layout = self.cfg.layout;
        let waits = (self.cfg.spin, self.cfg.yield_for);
        let registry = self.registry.clone();
        let workers = self.workers.clone();
        let device = self.cfg.device;
        let limits = self.cfg.client_limits;
        let stream = Arc::new(stream);
        let sock = stream.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("intake-{id}"))
            .spawn(move || {
                match handshake(&*backend, sock, hello, peer, id, layout, device) {
                    Ok(None) => {}
                    Ok(Some((channel, socket))) => {
                        let env = ServerEnv {
                            backend,
                            handles,
                            registry,
                            limits,
                            waits,
                        };
                        match Session::new(env, id, peer, channel, socket) {
                            Ok(mut session) => {
                                // The connection keeps its place under the limits until its
                                // session ends.
                                session.hold(ticket);
                                workers.adopt(session)
                            }
                            Err(e) => tracing::error!(client = id, "cannot start a session: {e}"),
                        }
                    }
                    Err(e) => tracing::warn!(client = id, "handshake failed: {e}"),
                }
            });
        if let Err(e) = spawned {
            let e = Error::new(
                Status::OutOfMemory,
                format!("the server cannot start a thread for this client: {e}"),
            );
            refuse(&stream, &e);
            tracing::error!(
                pid = peer.pid,
                uid = peer.uid,
                "client refused: {}",
                e.message
            );
        }
    }
}

/// How often refused connections are logged at most.
const LOG_PERIOD: Duration = Duration::from_secs(10);

impl<B: Backend> Drop for Server<B> {
    fn drop(&mut self) {
        // After a fault the path leads to the fresh server.
        if !self.recovery.path_given_up() {
            let _ = std::fs::remove_file(&self.socket_path);
        }
    }
}

fn device_wire<B: Backend>(backend: &B) -> DeviceInfoWire {
    let info = backend.info();
    DeviceInfoWire::new(
        &info.name,
        info.total_mem,
        info.sm_count,
        info.cc,
        info.kind,
    )
}

/// Waits up to 200 ms for a connection on `l`, so accept loops can look at their stop flag;
/// `Ok(false)` on a timeout or an interrupted wait.
pub(crate) fn wait_readable(l: &UnixListener) -> nix::Result<bool> {
    let mut fds = [PollFd::new(l.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::from(200u16)) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Answers a hello with a failed welcome carrying `err`.
pub(crate) fn refuse(stream: &UnixStream, err: &Error) {
    let _ = socket::send(stream, bytemuck::bytes_of(&Welcome::refuse(err)), &[]);
}

/// Reads a client's hello, waiting at most [`DEFAULT_LIMITS`]`.hello_timeout` for the whole of
/// it; a hello of another protocol version is answered with a refusal.
pub fn read_hello(stream: &UnixStream) -> Result<Hello> {
    crate::intake::read_hello_within(stream, DEFAULT_LIMITS.hello_timeout)
}

/// Checks the hello and who is calling, creates the channel and sends the welcome with the two
/// segment descriptors. A hello that asks which devices are served gets this server's `device`
/// alone, and no session (`None`).
fn handshake<B: Backend>(
    backend: &B,
    stream: Arc<UnixStream>,
    hello: Hello,
    peer: Peer,
    id: u32,
    layout: Layout,
    device: u32,
) -> Result<Option<(Channel, Arc<UnixStream>)>> {
    let io = |what: &str, e: std::io::Error| Error::new(Status::Connection, format!("{what}: {e}"));
    if hello.asks_device_list() {
        let list = DeviceList::new(&[device])?;
        socket::send(&stream, bytemuck::bytes_of(&list), &[])
            .map_err(|e| io("sending the device list", e))?;
        return Ok(None);
    }
    let checked = hello
        .check()
        .and_then(|_| check_device(&hello, device))
        .and_then(|()| {
            let me = nix::unistd::geteuid().as_raw();
            if peer.uid != me && peer.uid != 0 {
                return Err(Error::new(
                    Status::PermissionDenied,
                    format!(
                        "this server serves uid {me}; uid {} must use its own server",
                        peer.uid
                    ),
                ));
            }
            Ok(())
        });
    if let Err(e) = checked {
        refuse(&stream, &e);
        return Err(e);
    }
    let channel = match Channel::create(layout) {
        Ok(c) => c,
        Err(e) => {
            refuse(&stream, &e);
            return Err(e);
        }
    };
    let w = Welcome::accept(id, layout.rings(), device_wire(backend));
    socket::send(
        &stream,
        bytemuck::bytes_of(&w),
        &[channel.client_segment().fd(), channel.server_segment().fd()],
    )
    .map_err(|e| io("sending the welcome", e))?;
    tracing::info!(
        client = id,
        pid = peer.pid,
        uid = peer.uid,
        "client connected"
    );
    Ok(Some((channel, stream)))
}

/// Refuses a client that asks for another device than this server's.
fn check_device(hello: &Hello, device: u32) -> Result<()> {
    if hello.device == device {
        return Ok(());
    }
    Err(Error::new(
        Status::InvalidValue,
        format!(
            "this mps-server serves device {device} only, not device {}; start one with \
             --device {} in a pipe directory of its own, or run mps-control, which serves \
             every device",
            hello.device, hello.device
        ),
    ))
}
