//! A connection to a server: the handshake over the Unix socket, the shared-memory channel it
//! yields, and the settings a client takes from its environment.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;

use mps_core::handshake::{DEFAULT_GROUP, Hello, Welcome};
use mps_core::protocol::{self, Request};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, Layout};
use mps_ipc::env::setting;
use mps_ipc::segment::Segment;
use mps_ipc::socket;

use crate::handles::DeviceInfo;
use crate::host::HostMemory;
use crate::kernels::Kernels;
use crate::report::Report;
use crate::transport::Transport;

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
    id: u32,
    /// The rings, the socket and the waiting: every call to the server goes through it.
    pub(crate) transport: Transport,
    /// The device, and what the server reported of it.
    pub(crate) report: Report,
    /// The kernels looked up, with their parameter layouts.
    pub(crate) kernels: Kernels,
    /// Host buffers and the staging area.
    pub(crate) host: HostMemory,
    /// Streams that capture a graph (see `graphs`).
    pub(crate) capturing: Mutex<std::collections::HashSet<u64>>,
    /// Host functions and the thread that runs them.
    pub(crate) host_funcs: crate::hostfn::HostFuncs,
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop_host_funcs();
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .field("device", &self.report.info.name)
            .finish()
    }
}

impl Client {
    /// Connects to device 0 of those this process sees through the daemon or server whose
    /// socket is in `pipe_dir` (`None`: `$MPS_PIPE_DIRECTORY`, else `/tmp/mps`); see
    /// [`Client::connect_device`].
    pub fn connect(pipe_dir: Option<&Path>) -> Result<Client> {
        Client::connect_device(pipe_dir, 0)
    }

    /// How many devices this process sees through the daemon or server whose socket is in
    /// `pipe_dir`: those it serves (every device of the host for `mps-control`, one for a
    /// standalone `mps-server`), filtered and ordered by `CUDA_VISIBLE_DEVICES` as CUDA does.
    pub fn device_count(pipe_dir: Option<&Path>) -> Result<u32> {
        let dir = pipe_dir
            .map(Path::to_path_buf)
            .unwrap_or_else(socket::default_pipe_dir);
        Ok(crate::devices::visible_devices(&dir, &group()?)?.len() as u32)
    }

    /// Connects to device `device` (0 to [`Client::device_count`] - 1) of those this process
    /// sees, in the server group `$MPS_GROUP` (else `default`), and lowers what the server
    /// granted as the environment asks: `MPS_PINNED_DEVICE_MEM_LIMIT` (device memory, one size
    /// for every device or `device=size` entries, "0=1G,1=2G"), `MPS_CLIENT_PRIORITY` (0
    /// normal, 1 below normal), `MPS_ACTIVE_THREAD_PERCENTAGE` (a share of the SMs, one or per
    /// device as the memory limit) and `MPS_SM_RESERVE` (SMs of the client's own); and it
    /// checks `MPS_CLIENT_SPIN_US` and `MPS_CLIENT_YIELD_US` (microseconds; how a waiting thread
    /// spins, then yields). A bad value of any is refused, naming the variable. A program that
    /// uses two devices holds a client of each.
    pub fn connect_device(pipe_dir: Option<&Path>, device: u32) -> Result<Client> {
        let dir = pipe_dir
            .map(Path::to_path_buf)
            .unwrap_or_else(socket::default_pipe_dir);
        let group = group()?;
        let visible = crate::devices::visible_devices(&dir, &group)?;
        let Some(&host_device) = visible.get(device as usize) else {
            return Err(Error::invalid_value(format!(
                "device {device} does not exist: this process sees {} device(s) through {} \
                 (host devices {visible:?} after CUDA_VISIBLE_DEVICES)",
                visible.len(),
                dir.display()
            )));
        };
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
        // Nothing goes to a socket that neither this user nor root serves: another user could
        // have put a listener of their own in a shared pipe directory.
        socket::check_server(&sock, &path)?;
        let hello = Hello::for_device(&group, host_device)
            .map_err(|e| Error::invalid_value(format!("MPS_GROUP: {}", e.message)))?;
        let io = |e: std::io::Error| {
            Error::new(
                Status::Connection,
                format!("handshake with {}: {e}", path.display()),
            )
        };
        // A server that refuses this connection at once (a limit on connections) may close it
        // before the hello is sent: its refusal is still there to read, and says more than the
        // broken pipe.
        let sent = socket::send(&sock, bytemuck::bytes_of(&hello), &[]);
        let mut welcome: Welcome = bytemuck::Zeroable::zeroed();
        let fds = socket::recv(&sock, bytemuck::bytes_of_mut(&mut welcome), 2)
            .map_err(|e| io(sent.err().unwrap_or(e)))?;
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
        let mut client = Client::over(
            welcome.client_id,
            sock,
            channel,
            DeviceInfo::from_wire(&welcome.device, welcome.backend()),
        );
        client.report.ordinal = device;
        client.apply_environment()?;
        Ok(client)
    }

    /// A client with id `id` over a channel whose handshake is done: for a server in the same
    /// process (the server's own tests drive it against this client in memory). `socket` is the
    /// client's end of the connection, on which host buffers arrive.
    #[doc(hidden)]
    pub fn over(id: u32, socket: UnixStream, channel: Channel, device: DeviceInfo) -> Client {
        Client {
            id,
            transport: Transport::new(socket, channel),
            report: Report::new(device, 0),
            kernels: Kernels::default(),
            host: HostMemory::default(),
            capturing: Mutex::default(),
            host_funcs: Default::default(),
        }
    }

    /// Lowers (never raises) what the server granted, as the environment asks (see `connect`).
    fn apply_environment(&self) -> Result<()> {
        crate::transport::check_wait_variables()?;
        if let Some((spec, name)) = setting("MPS_PINNED_DEVICE_MEM_LIMIT") {
            let limit = mps_core::units::parse_device_limit(&spec, self.report.ordinal)
                .map_err(|e| Error::invalid_value(format!("{name}: {}", e.message)))?;
            if let Some(bytes) = limit {
                self.transport.call(&Request::SetMemLimit { bytes })?;
            }
        }
        if let Some((level, name)) = setting("MPS_CLIENT_PRIORITY") {
            let level = match level.trim() {
                "0" => protocol::PRIORITY_NORMAL,
                "1" => protocol::PRIORITY_BELOW_NORMAL,
                other => {
                    return Err(Error::invalid_value(format!(
                        "{name} is {other:?}; it must be 0 (normal) or 1 (below normal)"
                    )));
                }
            };
            self.transport.call(&Request::SetPriority { level })?;
        }
        if let Some(percent) = percent_var("MPS_ACTIVE_THREAD_PERCENTAGE", self.report.ordinal)? {
            self.transport.call(&Request::SetSmShare { percent })?;
        }
        if let Some(percent) = percent_var("MPS_SM_RESERVE", self.report.ordinal)? {
            self.transport.call(&Request::ReserveSms { percent })?;
        }
        Ok(())
    }

    /// The server-assigned id of this client.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The device.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.report.info
    }

    /// The device's index among those this process sees (what [`Client::connect_device`] was
    /// given).
    pub fn device(&self) -> u32 {
        self.report.ordinal
    }
}

/// The server group: `$MPS_GROUP`, else `default`.
fn group() -> Result<String> {
    let group = std::env::var("MPS_GROUP")
        .ok()
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| DEFAULT_GROUP.to_string());
    mps_core::handshake::check_group(&group)
        .map_err(|e| Error::invalid_value(format!("MPS_GROUP: {}", e.message)))?;
    Ok(group)
}

/// Reads a percentage (1 to 100) for visible device `device` from environment variable `name`:
/// one for every device ("25") or `device=percent` entries ("0=25,1=50"); unset, empty or
/// without an entry for the device is None.
fn percent_var(name: &'static str, device: u32) -> Result<Option<u32>> {
    let Some((spec, name)) = setting(name) else {
        return Ok(None);
    };
    let bad = |v: &str| {
        Error::invalid_value(format!(
            "{name} is {spec:?}; {v:?} must be a percentage from 1 to 100 (one for every \
             device, or device=percent entries: 0=25,1=50)"
        ))
    };
    // Every entry is checked, so that a typo for another device is found at once.
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let v = entry.split_once('=').map_or(entry, |(_, v)| v).trim();
        if mps_core::units::parse_percent(v.trim_end_matches('%'), 1).is_none() {
            return Err(bad(v));
        }
    }
    let Some(v) = mps_core::units::per_device(&spec, device)
        .map_err(|e| Error::invalid_value(format!("{name}: {}", e.message)))?
    else {
        return Ok(None);
    };
    Ok(mps_core::units::parse_percent(v.trim_end_matches('%'), 1))
}
