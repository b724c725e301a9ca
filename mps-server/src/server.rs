//! The listening socket in the pipe directory, the handshake, and one session thread per client.

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use mps_core::handshake::DeviceList;
use mps_core::protocol::{
    DeviceInfoWire, HELLO_PREFIX, Hello, MAGIC, PROTOCOL_VERSION, Welcome, put_str,
};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, Layout};
use mps_ipc::socket::{self, Peer, SOCKET_NAME};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::backend::Backend;
use crate::control::wire;
use crate::recovery::Recovery;
use crate::registry::{Defaults, Registry};
use crate::session::{HandleIssuer, Limits, ServerEnv, Session, check_hello, hello_group};

/// How a server is set up.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Directory holding the socket.
    pub pipe_dir: PathBuf,
    /// Ring and staging sizes of each client's channel.
    pub layout: Layout,
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
    /// The device ordinal served: clients asking for another are refused.
    pub device: u32,
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
}

impl<B: Backend> Server<B> {
    /// Binds the socket `mps.sock` in the pipe directory (creating the directory). Fails if
    /// another server answers on it; a stale socket file from a server that died is replaced.
    pub fn bind(backend: Arc<B>, cfg: ServerConfig) -> Result<Server<B>> {
        let dir = &cfg.pipe_dir;
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::new(
                Status::PermissionDenied,
                format!("cannot create pipe directory {}: {e}", dir.display()),
            )
        })?;
        let path = dir.join(SOCKET_NAME);
        // Only this user (and root) may connect; the handshake checks the uid again.
        let listener = listen(&path, 0o600)?;
        Self::adopt(backend, cfg, listener)
    }

    /// Serves on `listener`, already listening at the pipe directory's socket path (handed
    /// over by a server whose context failed, see [`crate::recovery`]).
    pub fn adopt(backend: Arc<B>, cfg: ServerConfig, listener: UnixListener) -> Result<Server<B>> {
        let path = cfg.pipe_dir.join(SOCKET_NAME);
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
        let registry = Arc::new(Registry::new(
            defaults,
            backend.info().sm_units.clone(),
            placer,
        ));
        let recovery = Recovery::watch(&*backend, &listener, path.clone(), registry.clone())?;
        Ok(Server {
            backend,
            registry,
            recovery,
            cfg,
            listener,
            socket_path: path,
            handles: Arc::default(),
            next_client: AtomicU32::new(1),
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

    /// Accepts clients until `stop` is set or the device context failed, each served by a
    /// thread of its own.
    pub fn run(&self, stop: &AtomicBool) -> Result<()> {
        while !stop.load(Ordering::Relaxed) && !self.recovery.failed() {
            match wait_readable(&self.listener) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => return Err(Error::internal(format!("poll on the listener: {e}"))),
            }
            // A failed context takes no client: waiting connections are the fresh server's.
            if self.recovery.failed() {
                break;
            }
            match self.listener.accept() {
                Ok((stream, _)) => self.spawn_client(stream, None),
                Err(e) => tracing::warn!("accept failed: {e}"),
            }
        }
        Ok(())
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
                    self.spawn_client(UnixStream::from(fd), Some(hello));
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

    fn spawn_client(&self, stream: UnixStream, hello: Option<Hello>) {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        let backend = self.backend.clone();
        let handles = self.handles.clone();
        let layout = self.cfg.layout;
        let waits = (self.cfg.spin, self.cfg.yield_for);
        let registry = self.registry.clone();
        let device = self.cfg.device;
        let spawned = std::thread::Builder::new()
            .name(format!("client-{id}"))
            .spawn(
                move || match handshake(&*backend, stream, hello, id, layout, device) {
                    Ok(None) => {}
                    Ok(Some((peer, channel, socket))) => {
                        let env = ServerEnv {
                            backend,
                            handles,
                            registry,
                            limits: Limits::default(),
                            waits,
                        };
                        match Session::new(env, id, peer, channel, socket) {
                            Ok(session) => session.run(),
                            Err(e) => tracing::error!(client = id, "cannot start a session: {e}"),
                        }
                    }
                    Err(e) => tracing::warn!(client = id, "handshake failed: {e}"),
                },
            );
        if let Err(e) = spawned {
            tracing::error!("cannot start a client thread: {e}");
        }
    }
}

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
    DeviceInfoWire {
        name: put_str(&info.name),
        total_mem: info.total_mem,
        sm_count: info.sm_count,
        cc_major: info.cc.0,
        cc_minor: info.cc.1,
        backend: info.kind as u32,
    }
}

/// Listens on `path` with permissions `mode`. Fails if something already answers there (another
/// server or daemon); a stale socket file left by one that died is replaced.
pub(crate) fn listen(path: &Path, mode: u32) -> Result<UnixListener> {
    let denied = |what: String| Error::new(Status::PermissionDenied, what);
    if UnixStream::connect(path).is_ok() {
        return Err(denied(format!(
            "{} is already served (another mps-server or mps-control listens there); stop it \
             or choose another pipe directory",
            path.display()
        )));
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .map_err(|e| denied(format!("cannot listen on {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| denied(format!("cannot set the mode of {}: {e}", path.display())))?;
    Ok(listener)
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
    let w = Welcome {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        status: err.status as u32,
        message: put_str(&err.message),
        ..bytemuck::Zeroable::zeroed()
    };
    let _ = socket::send(stream, bytemuck::bytes_of(&w), &[]);
}

/// Reads a client's hello (waiting at most 10 s for it): first the part every protocol version
/// shares, so that a client of another version is refused with a clear answer rather than left
/// waiting, then the rest.
pub fn read_hello(stream: &UnixStream) -> Result<Hello> {
    let io = |what: &str, e: std::io::Error| Error::new(Status::Connection, format!("{what}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| io("set_read_timeout", e))?;
    let mut hello: Hello = bytemuck::Zeroable::zeroed();
    socket::recv(
        stream,
        &mut bytemuck::bytes_of_mut(&mut hello)[..HELLO_PREFIX],
        0,
    )
    .map_err(|e| io("reading the hello", e))?;
    if let Err(e) = check_hello(&hello) {
        refuse(stream, &e);
        return Err(e);
    }
    socket::recv(
        stream,
        &mut bytemuck::bytes_of_mut(&mut hello)[HELLO_PREFIX..],
        0,
    )
    .map_err(|e| io("reading the hello", e))?;
    stream
        .set_read_timeout(None)
        .map_err(|e| io("set_read_timeout", e))?;
    Ok(hello)
}

/// Reads the hello (unless the daemon already did), checks who is calling, creates the channel and sends the welcome with the
/// two segment descriptors. A hello that asks which devices are served gets `device` alone, and
/// no session (`None`).
fn handshake<B: Backend>(
    backend: &B,
    stream: UnixStream,
    hello: Option<Hello>,
    id: u32,
    layout: Layout,
    device: u32,
) -> Result<Option<(Peer, Channel, Arc<UnixStream>)>> {
    let io = |what: &str, e: std::io::Error| Error::new(Status::Connection, format!("{what}: {e}"));
    let peer = socket::peer(&stream).map_err(|e| io("SO_PEERCRED", e))?;
    let hello = match hello {
        Some(h) => h,
        None => read_hello(&stream)?,
    };
    if hello.asks_device_list() {
        let list = DeviceList::new(&[device])?;
        socket::send(&stream, bytemuck::bytes_of(&list), &[])
            .map_err(|e| io("sending the device list", e))?;
        return Ok(None);
    }
    let checked = check_hello(&hello)
        .and_then(|()| hello_group(&hello))
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
    let w = Welcome {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        status: Status::Success as u32,
        client_id: id,
        submit_slots: layout.submit_slots,
        complete_slots: layout.complete_slots,
        staging_bytes: layout.staging_bytes as u64,
        client_segment_bytes: layout.client_bytes() as u64,
        server_segment_bytes: layout.server_bytes() as u64,
        device: device_wire(backend),
        message: [0; 192],
    };
    socket::send(
        &stream,
        bytemuck::bytes_of(&w),
        &[channel.client_segment().fd(), channel.server_segment().fd()],
    )
    .map_err(|e| io("sending the welcome", e))?;
    stream
        .set_read_timeout(None)
        .map_err(|e| io("set_read_timeout", e))?;
    tracing::info!(
        client = id,
        pid = peer.pid,
        uid = peer.uid,
        "client connected"
    );
    Ok(Some((peer, channel, Arc::new(stream))))
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
