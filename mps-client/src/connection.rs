//! A connection to a server: the handshake over the Unix socket, the shared-memory channel it
//! yields, and the settings a client takes from its environment.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};

use mps_core::handshake::{DEFAULT_GROUP, Hello, Welcome};
use mps_core::protocol::{self, Request};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, Layout};
use mps_ipc::segment::Segment;
use mps_ipc::socket;

use crate::completions::Completions;
use crate::copies::HostMapping;
use crate::handles::DeviceInfo;
use crate::launch::Kernel;
use crate::submission::Submissions;
use crate::transport::{Receiver, Submitter};

/// A connection to an mps server.
///
/// A client may be shared between threads: a submission takes one lock, around the submission
/// ring; replies are collected under another; a thread waiting for anything spins briefly and
/// then sleeps on the server's progress doorbell.
///
/// Work in a stream is asynchronous, as in CUDA: [`Client::launch`] returns once the launch is
/// in the ring. Errors the server finds in such work are reported by the next call, and a kernel
/// fault poisons the client: every later call fails with the fault's status.
pub struct Client {
    pub(crate) id: u32,
    pub(crate) socket: UnixStream,
    pub(crate) channel: Channel,
    pub(crate) device: DeviceInfo,
    pub(crate) submitter: Mutex<Submitter>,
    pub(crate) receiver: Mutex<Receiver>,
    /// Each kernel's parameter layout, from `module_get_function`.
    pub(crate) functions: RwLock<HashMap<u64, Arc<Kernel>>>,
    /// Host buffers from `host_alloc`, by address.
    pub(crate) host: RwLock<BTreeMap<usize, HostMapping>>,
    /// Held while the staging area is in use (pageable copies, module images).
    pub(crate) staging: Mutex<()>,
    /// Held from a host-buffer request until its descriptor has been read from the socket.
    pub(crate) host_alloc_lock: Mutex<()>,
    /// Set once the server is known to be gone.
    pub(crate) lost: AtomicBool,
    /// Streams that capture a graph (see `graphs`).
    pub(crate) capturing: Mutex<std::collections::HashSet<u64>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .field("device", &self.device.name)
            .finish()
    }
}

impl Client {
    /// Connects to the server whose socket is in `pipe_dir` (`None`: `$MPS_PIPE_DIRECTORY`, else
    /// `/tmp/mps`), in the server group `$MPS_GROUP` (else `default`), and lowers what the
    /// server granted as the environment asks: `MPS_PINNED_DEVICE_MEM_LIMIT` (device memory),
    /// `MPS_CLIENT_PRIORITY` (0 normal, 1 below normal), `MPS_ACTIVE_THREAD_PERCENTAGE` (a share
    /// of the SMs) and `MPS_SM_RESERVE` (SMs of the client's own).
    pub fn connect(pipe_dir: Option<&Path>) -> Result<Client> {
        let dir = pipe_dir
            .map(Path::to_path_buf)
            .unwrap_or_else(socket::default_pipe_dir);
        let path = dir.join(socket::SOCKET_NAME);
        let sock = UnixStream::connect(&path).map_err(|e| {
            Error::new(
                Status::Connection,
                format!(
                    "cannot reach an mps server at {}: {e}; is mps-server running with this pipe directory?",
                    path.display()
                ),
            )
        })?;
        let group = std::env::var("MPS_GROUP")
            .ok()
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| DEFAULT_GROUP.to_string());
        let hello = Hello::new(&group)
            .map_err(|e| Error::invalid_value(format!("MPS_GROUP: {}", e.message)))?;
        let io = |e: std::io::Error| {
            Error::new(
                Status::Connection,
                format!("handshake with {}: {e}", path.display()),
            )
        };
        socket::send(&sock, bytemuck::bytes_of(&hello), &[]).map_err(io)?;
        let mut welcome: Welcome = bytemuck::Zeroable::zeroed();
        let fds = socket::recv(&sock, bytemuck::bytes_of_mut(&mut welcome), 2).map_err(io)?;
        welcome.check(&path.display())?;
        let layout = Layout::from_welcome(&welcome)?;
        let [client_fd, server_fd]: [_; 2] = fds.try_into().map_err(|_| {
            Error::new(
                Status::ProtocolMismatch,
                format!(
                    "the welcome from {} did not carry two segments",
                    path.display()
                ),
            )
        })?;
        let client_seg = Segment::open(client_fd, layout.client_bytes(), true)?;
        let server_seg = Segment::open(server_fd, layout.server_bytes(), false)?;
        let channel = Channel::open(client_seg, server_seg, layout)?;
        let device = DeviceInfo::from_wire(&welcome.device, welcome.backend());
        let client = Client::over(welcome.client_id, sock, channel, device);
        client.apply_environment()?;
        Ok(client)
    }

    /// A client with id `id` over a channel whose handshake is done.
    pub(crate) fn over(
        id: u32,
        socket: UnixStream,
        channel: Channel,
        device: DeviceInfo,
    ) -> Client {
        Client {
            id,
            submitter: Mutex::new(Submitter::new(
                channel.submit_producer(),
                Submissions::new(),
            )),
            receiver: Mutex::new(Receiver::new(
                channel.complete_consumer(),
                Completions::default(),
            )),
            socket,
            channel,
            device,
            functions: RwLock::new(HashMap::new()),
            host: RwLock::new(BTreeMap::new()),
            staging: Mutex::new(()),
            host_alloc_lock: Mutex::new(()),
            lost: AtomicBool::new(false),
            capturing: Mutex::default(),
        }
    }

    /// Lowers (never raises) what the server granted, as the environment asks (see `connect`).
    fn apply_environment(&self) -> Result<()> {
        if let Some(spec) = var("MPS_PINNED_DEVICE_MEM_LIMIT") {
            let limit = mps_core::units::parse_device_limit(&spec, 0).map_err(|e| {
                Error::invalid_value(format!("MPS_PINNED_DEVICE_MEM_LIMIT: {}", e.message))
            })?;
            if let Some(bytes) = limit {
                self.call(&Request::SetMemLimit { bytes })?;
            }
        }
        if let Some(level) = var("MPS_CLIENT_PRIORITY") {
            let level = match level.trim() {
                "0" => protocol::PRIORITY_NORMAL,
                "1" => protocol::PRIORITY_BELOW_NORMAL,
                other => {
                    return Err(Error::invalid_value(format!(
                        "MPS_CLIENT_PRIORITY is {other:?}; it must be 0 (normal) or 1 (below normal)"
                    )));
                }
            };
            self.call(&Request::SetPriority { level })?;
        }
        if let Some(percent) = percent_var("MPS_ACTIVE_THREAD_PERCENTAGE")? {
            self.call(&Request::SetSmShare { percent })?;
        }
        if let Some(percent) = percent_var("MPS_SM_RESERVE")? {
            self.call(&Request::ReserveSms { percent })?;
        }
        Ok(())
    }

    /// The server-assigned id of this client.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The device.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.device
    }
}

/// Environment variable `name`, unless unset or blank.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

/// Reads a percentage (1 to 100) from environment variable `name`; unset or empty is None.
fn percent_var(name: &str) -> Result<Option<u32>> {
    let Some(v) = var(name) else {
        return Ok(None);
    };
    match mps_core::units::parse_percent(v.trim().trim_end_matches('%'), 1) {
        Some(p) => Ok(Some(p)),
        None => Err(Error::invalid_value(format!(
            "{name} is {v:?}; it must be a percentage from 1 to 100"
        ))),
    }
}
