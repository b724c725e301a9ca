//! The safe Rust client.
//!
//! A [`Client`] is one connection to a server. It may be shared between threads: submissions are
//! serialised by one lock around the submission ring, replies are collected under another, and a
//! thread waiting for anything spins briefly and then sleeps on the server's progress doorbell.
//!
//! Work in a stream is asynchronous, as in CUDA: [`Client::launch`] returns once the launch is in
//! the ring. Errors the server finds in such work are reported by the next call, and a kernel
//! fault poisons the client: every later call fails with the fault's status.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use mps_core::limits::{DeviceLimits, check_geometry};
use mps_core::ordering::{EventClock, StreamClock};
use mps_core::protocol::{
    self, BackendKind, Command, Completion, CompletionKind, Dim3, HostBufferFd, HostRef, MAGIC,
    MAX_COMMAND_SLOTS, PROTOCOL_VERSION, ParamInfo, Request, SLOT_BYTES, Welcome, flags, get_str,
};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, Layout, ShmRing};
use mps_ipc::doorbell::Wake;
use mps_ipc::ring::{Consumer, Producer};
use mps_ipc::segment::Segment;
use mps_ipc::socket;

/// How long a waiting thread spins before anything else (`MPS_CLIENT_SPIN_US` overrides it).
const DEFAULT_SPIN: Duration = Duration::from_micros(20);
/// After spinning, how long it keeps looking while yielding the processor between looks (as
/// CUDA's own synchronisation does): a busy machine runs other threads meanwhile, an idle one
/// answers at once. Only then does it nap. (`MPS_CLIENT_YIELD_US` overrides it.)
const DEFAULT_YIELD: Duration = Duration::from_millis(2);

/// The spin and yield phases of a wait, read once from the environment.
fn wait_phases() -> (Duration, Duration) {
    static PHASES: std::sync::OnceLock<(Duration, Duration)> = std::sync::OnceLock::new();
    *PHASES.get_or_init(|| {
        let micros = |var: &str, default: Duration| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(default, Duration::from_micros)
        };
        (
            micros("MPS_CLIENT_SPIN_US", DEFAULT_SPIN),
            micros("MPS_CLIENT_YIELD_US", DEFAULT_YIELD),
        )
    })
}

fn spin() -> Duration {
    wait_phases().0
}

/// Its first nap; naps double up to `MAX_NAP`, and to a sixteenth of the wait so far, so that
/// oversleeping costs a long wait at most about 6%. A GPU writes stream progress without ringing
/// the doorbell (no host thread is on that path), so a sleeping waiter must look again by
/// itself.
const FIRST_NAP: Duration = Duration::from_micros(20);
const MAX_NAP: Duration = Duration::from_millis(2);
/// How often a waiter checks that the server is still there.
const LIVENESS: Duration = Duration::from_millis(100);

/// A device pointer.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The pointer `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

/// A stream; [`Stream::DEFAULT`] is the client's own default stream, which does not synchronise
/// with its other streams.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(pub u64);

impl Stream {
    /// The client's default stream.
    pub const DEFAULT: Stream = Stream(0);
}

/// An event.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

/// A loaded module.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Module(pub u64);

/// A kernel of a loaded module.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Function(pub u64);

/// The device behind the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Device memory in bytes.
    pub total_mem: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
    /// The server's backend.
    pub backend: BackendKind,
}

struct HostMapping {
    handle: u64,
    segment: Segment,
}

struct Submitter {
    producer: Producer<Command, ShmRing<Command>>,
    next_seq: u64,
    streams: HashMap<u64, (u32, StreamClock)>,
    events: HashMap<u64, EventClock>,
    slots: Vec<Command>,
}

struct Receiver {
    consumer: Consumer<Completion, ShmRing<Completion>>,
    awaited: HashSet<u64>,
    replies: HashMap<u64, Completion>,
    fault: Option<Error>,
    deferred: Option<Error>,
}

/// A connection to an mps server.
pub struct Client {
    id: u32,
    socket: UnixStream,
    channel: Channel,
    device: DeviceInfo,
    submitter: Mutex<Submitter>,
    receiver: Mutex<Receiver>,
    functions: RwLock<HashMap<u64, Arc<[ParamInfo]>>>,
    host: RwLock<BTreeMap<usize, HostMapping>>,
    staging: Mutex<()>,
    host_alloc_lock: Mutex<()>,
    lost: AtomicBool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .field("device", &self.device.name)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lost(what: impl std::fmt::Display) -> Error {
    Error::new(
        Status::Connection,
        format!("connection to the mps server lost: {what}"),
    )
}

impl Client {
    /// Connects to the server whose socket is in `pipe_dir` (`None`: `$MPS_PIPE_DIRECTORY`, else
    /// `/tmp/mps`).
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
            .unwrap_or_else(|| protocol::DEFAULT_GROUP.to_string());
        protocol::check_group(&group)
            .map_err(|e| Error::invalid_value(format!("MPS_GROUP: {}", e.message)))?;
        let hello = protocol::Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            reserved: [0; 2],
            group: protocol::put_str(&group),
        };
        let io = |e: std::io::Error| Error::new(Status::Connection, format!("handshake: {e}"));
        socket::send(&sock, bytemuck::bytes_of(&hello), &[]).map_err(io)?;
        let mut welcome: Welcome = bytemuck::Zeroable::zeroed();
        let fds = socket::recv(&sock, bytemuck::bytes_of_mut(&mut welcome), 2).map_err(io)?;
        if welcome.magic != MAGIC {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!("{} is not an mps server socket", path.display()),
            ));
        }
        match Status::from_u32(welcome.status) {
            Some(Status::Success) => {}
            Some(status) => return Err(Error::new(status, get_str(&welcome.message))),
            None => {
                return Err(Error::new(
                    Status::ProtocolMismatch,
                    format!("server refused with unknown status {}", welcome.status),
                ));
            }
        }
        if welcome.version != PROTOCOL_VERSION {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!(
                    "server speaks protocol version {}, this library {}",
                    welcome.version, PROTOCOL_VERSION
                ),
            ));
        }
        let layout = Layout::from_welcome(&welcome)?;
        let [client_fd, server_fd]: [_; 2] = fds.try_into().map_err(|_| {
            Error::new(
                Status::ProtocolMismatch,
                "the server's welcome did not carry two segments",
            )
        })?;
        let client_seg = Segment::open(client_fd, layout.client_bytes(), true)?;
        let server_seg = Segment::open(server_fd, layout.server_bytes(), false)?;
        let channel = Channel::open(client_seg, server_seg, layout)?;
        let d = welcome.device;
        let device = DeviceInfo {
            name: get_str(&d.name),
            total_mem: d.total_mem,
            sm_count: d.sm_count,
            cc: (d.cc_major, d.cc_minor),
            backend: if d.backend == BackendKind::Cuda as u32 {
                BackendKind::Cuda
            } else {
                BackendKind::Sim
            },
        };
        let mut streams = HashMap::new();
        streams.insert(0, (0, StreamClock::default()));
        let client = Client {
            id: welcome.client_id,
            submitter: Mutex::new(Submitter {
                producer: channel.submit_producer(),
                next_seq: 1,
                streams,
                events: HashMap::new(),
                slots: Vec::with_capacity(MAX_COMMAND_SLOTS),
            }),
            receiver: Mutex::new(Receiver {
                consumer: channel.complete_consumer(),
                awaited: HashSet::new(),
                replies: HashMap::new(),
                fault: None,
                deferred: None,
            }),
            socket: sock,
            channel,
            device,
            functions: RwLock::new(HashMap::new()),
            host: RwLock::new(BTreeMap::new()),
            staging: Mutex::new(()),
            host_alloc_lock: Mutex::new(()),
            lost: AtomicBool::new(false),
        };
        // A client may lower (never raise) its device-memory limit.
        if let Some(spec) = std::env::var("MPS_PINNED_DEVICE_MEM_LIMIT")
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            let limit = mps_core::units::parse_device_limit(&spec, 0).map_err(|e| {
                Error::invalid_value(format!("MPS_PINNED_DEVICE_MEM_LIMIT: {}", e.message))
            })?;
            if let Some(bytes) = limit {
                client.call(&Request::SetMemLimit { bytes })?;
            }
        }
        // ... and its priority (0 normal, 1 below normal).
        if let Some(level) = std::env::var("MPS_CLIENT_PRIORITY")
            .ok()
            .filter(|s| !s.trim().is_empty())
        {
            let level = match level.trim() {
                "0" => protocol::PRIORITY_NORMAL,
                "1" => protocol::PRIORITY_BELOW_NORMAL,
                other => {
                    return Err(Error::invalid_value(format!(
                        "MPS_CLIENT_PRIORITY is {other:?}; it must be 0 (normal) or 1 (below normal)"
                    )));
                }
            };
            client.call(&Request::SetPriority { level })?;
        }
        // ... its share of the SMs, and SMs of its own.
        if let Some(percent) = percent_var("MPS_ACTIVE_THREAD_PERCENTAGE")? {
            client.call(&Request::SetSmShare { percent })?;
        }
        if let Some(percent) = percent_var("MPS_SM_RESERVE")? {
            client.call(&Request::ReserveSms { percent })?;
        }
        Ok(client)
    }

    /// The server-assigned id of this client.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The device.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.device
    }

    // ----- plumbing -----

    /// Fails with the client's fault, a deferred error of earlier asynchronous work, or a lost
    /// connection.
    fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(lost("an earlier call saw the server go away"));
        }
        let mut r = lock(&self.receiver);
        self.drain(&mut r)?;
        if let Some(f) = &r.fault {
            return Err(f.clone());
        }
        if let Some(d) = r.deferred.take() {
            return Err(d);
        }
        Ok(())
    }

    fn drain(&self, r: &mut Receiver) -> Result<()> {
        loop {
            let c = match r.consumer.pop() {
                Ok(Some(c)) => c,
                Ok(None) => return Ok(()),
                Err(e) => {
                    self.lost.store(true, Ordering::Relaxed);
                    return Err(lost(e));
                }
            };
            if c.kind == CompletionKind::AsyncError as u32 {
                if r.fault.is_none() {
                    let e = c.result().err().unwrap_or_else(|| {
                        Error::internal("server reported an asynchronous error without a status")
                    });
                    r.fault = Some(Error::new(
                        e.status,
                        format!("command #{} failed while running: {}", c.seq, e.message),
                    ));
                }
            } else if r.awaited.remove(&c.seq) {
                r.replies.insert(c.seq, c);
            } else if let Err(e) = c.result()
                && r.deferred.is_none()
            {
                r.deferred = Some(e);
            }
        }
    }

    fn server_gone(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLHUP)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            Ok(_) => fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
            Err(_) => true,
        }
    }

    /// Waits until `ready` returns something, draining completions between looks; fails on a
    /// fault or a lost connection. `poll` is a cheap lock-free look (a progress word) that ends
    /// the spinning or napping early.
    fn wait_for<T>(
        &self,
        poll: impl Fn() -> bool,
        mut ready: impl FnMut(&mut Receiver) -> Option<Result<T>>,
    ) -> Result<T> {
        let bell = self.channel.progress_bell();
        // Spin until `spin()` has passed since the wait began, whatever wakes us meanwhile (the
        // server rings the bell for every command it consumes); then yield between looks for a
        // while; then nap, doubling.
        let started = Instant::now();
        let spin_until = started + spin();
        let yield_until = spin_until + wait_phases().1;
        let mut nap = FIRST_NAP;
        let mut checked = Instant::now();
        loop {
            let seen = bell.value();
            {
                let mut r = lock(&self.receiver);
                self.drain(&mut r)?;
                if let Some(x) = ready(&mut r) {
                    return x;
                }
                if let Some(f) = &r.fault {
                    return Err(f.clone());
                }
            }
            let now = Instant::now();
            if now >= spin_until && now < yield_until {
                // Look again after a yield, without sleeping.
                let until = now + Duration::from_micros(50);
                while bell.value() == seen && !poll() && Instant::now() < until {
                    std::thread::yield_now();
                }
                continue;
            }
            let cond = || bell.value() != seen || poll();
            if now < spin_until {
                let spin = spin_until - now;
                bell.wait(spin, spin, cond);
                continue;
            }
            let woke = bell.wait(Duration::ZERO, nap, cond);
            if woke == Wake::TimedOut {
                nap = (nap * 2)
                    .min(MAX_NAP)
                    .min(started.elapsed() / 16)
                    .max(FIRST_NAP);
                if checked.elapsed() >= LIVENESS {
                    checked = Instant::now();
                    if self.server_gone() {
                        self.lost.store(true, Ordering::Relaxed);
                        return Err(lost("the server closed the connection"));
                    }
                }
            }
        }
    }

    /// Puts a command in the ring; returns its sequence number.
    fn submit(&self, req: &Request<'_>, stream: u64, fl: u16) -> Result<u64> {
        let mut s = lock(&self.submitter);
        if self.lost.load(Ordering::Relaxed) {
            return Err(lost("an earlier call saw the server go away"));
        }
        let seq = s.next_seq;
        let (cmd, payload) = req.encode(seq, stream, fl);
        s.slots.clear();
        s.slots.push(cmd);
        for chunk in payload.chunks(SLOT_BYTES) {
            let mut slot = [0u8; SLOT_BYTES];
            slot[..chunk.len()].copy_from_slice(chunk);
            s.slots.push(bytemuck::cast(slot));
        }
        if fl & flags::REPLY != 0 {
            lock(&self.receiver).awaited.insert(seq);
        }
        loop {
            let Submitter {
                producer, slots, ..
            } = &mut *s;
            match producer.push(slots) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    self.lost.store(true, Ordering::Relaxed);
                    return Err(lost(e));
                }
            }
            // The ring is full: drain completions (the server may be waiting for room there)
            // and wait for the server to consume.
            let need = slots.len() as u32;
            let bell = self.channel.progress_bell();
            let seen = bell.value();
            self.drain(&mut lock(&self.receiver))?;
            if producer.free().is_ok_and(|f| f >= need) {
                continue;
            }
            if bell.wait(spin(), LIVENESS, || bell.value() != seen) == Wake::TimedOut
                && self.server_gone()
            {
                self.lost.store(true, Ordering::Relaxed);
                return Err(lost("the server closed the connection"));
            }
        }
        s.next_seq += 1;
        if req.opcode().is_stream_ordered()
            && let Some((_, clock)) = s.streams.get_mut(&stream)
        {
            clock.submitted(seq, fl & flags::MARK != 0);
        }
        drop(s);
        self.channel.submit_bell().ring();
        Ok(seq)
    }

    fn wait_reply(&self, seq: u64) -> Result<Completion> {
        self.wait_for(
            || false,
            |r| {
                r.replies.remove(&seq).map(|c| match c.result() {
                    Ok(_) => Ok(c),
                    Err(e) => Err(e),
                })
            },
        )
    }

    /// Submits a command that expects a reply and waits for it.
    fn call(&self, req: &Request<'_>) -> Result<Completion> {
        self.check()?;
        let seq = self.submit(req, 0, flags::REPLY)?;
        self.wait_reply(seq)
    }

    fn stream_slot(&self, stream: Stream) -> Result<u32> {
        lock(&self.submitter)
            .streams
            .get(&stream.0)
            .map(|(slot, _)| *slot)
            .ok_or_else(|| unknown("stream", stream.0))
    }

    /// Submits stream-ordered work. It carries no `MARK`: publishing progress costs the server
    /// a device operation per command, so a stream is marked only when someone waits for it (see
    /// `stream_target`).
    fn enqueue(&self, req: &Request<'_>, stream: Stream) -> Result<u64> {
        self.check()?;
        self.stream_slot(stream)?;
        self.submit(req, stream.0, 0)
    }

    /// The published progress of stream slot `slot`.
    fn progress(&self, slot: u32) -> u64 {
        self.channel.stream_done(slot).load(Ordering::Acquire)
    }

    fn wait_stream_seq(&self, slot: u32, seq: u64) -> Result<()> {
        let done = self.channel.stream_done(slot);
        let reached = || done.load(Ordering::Acquire) >= seq;
        self.wait_for(reached, |_| reached().then_some(Ok(())))
    }

    // ----- memory -----

    /// Allocates `size` bytes of device memory.
    pub fn mem_alloc(&self, size: u64) -> Result<DevicePtr> {
        if size == 0 {
            return Err(Error::invalid_value("cannot allocate 0 bytes"));
        }
        Ok(DevicePtr(self.call(&Request::MemAlloc { size })?.values[0]))
    }

    /// Frees device memory (after this client's pending work, as cuMemFree does).
    pub fn mem_free(&self, ptr: DevicePtr) -> Result<()> {
        self.call(&Request::MemFree { ptr: ptr.0 }).map(drop)
    }

    /// (free, total) device memory in bytes.
    pub fn mem_get_info(&self) -> Result<(u64, u64)> {
        let v = self.call(&Request::MemGetInfo)?.values;
        Ok((v[0], v[1]))
    }

    /// The SMs this client's kernels run on now (the server may change them as other clients
    /// come and go, or as the operator changes the share).
    pub fn sm_info(&self) -> Result<SmInfo> {
        let v = self.call(&Request::SmInfo)?.values;
        Ok(SmInfo {
            sms: v[0] as u32,
            device_sms: v[1] as u32,
            share_percent: v[2] as u32,
            reserved_percent: v[3] as u32,
        })
    }

    /// Allocates a host buffer shared with the server: copies from and to it are fully
    /// asynchronous and need no staging. Returns its address in this process.
    pub fn host_alloc(&self, size: usize) -> Result<*mut u8> {
        if size == 0 {
            return Err(Error::invalid_value("cannot allocate a 0-byte host buffer"));
        }
        let _g = lock(&self.host_alloc_lock);
        let reply = self.call(&Request::HostAlloc { size: size as u64 })?;
        let [handle, len, ..] = reply.values;
        let mut msg: HostBufferFd = bytemuck::Zeroable::zeroed();
        let fds = socket::recv(&self.socket, bytemuck::bytes_of_mut(&mut msg), 1)
            .map_err(|e| lost(format!("receiving a host buffer: {e}")))?;
        let fd = fds.into_iter().next();
        match fd {
            Some(fd) if msg.magic == MAGIC && msg.handle == handle && msg.size == len => {
                let segment = Segment::open(fd, len as usize, true)?;
                let addr = segment.as_ptr();
                self.host
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(addr as usize, HostMapping { handle, segment });
                Ok(addr)
            }
            _ => {
                self.lost.store(true, Ordering::Relaxed);
                Err(lost(
                    "the server's host buffer message does not match its reply",
                ))
            }
        }
    }

    /// Frees a host buffer from [`Client::host_alloc`] (after this client's pending work).
    pub fn host_free(&self, ptr: *mut u8) -> Result<()> {
        let handle = {
            let host = self.host.read().unwrap_or_else(|p| p.into_inner());
            host.get(&(ptr as usize)).map(|m| m.handle).ok_or_else(|| {
                Error::invalid_value(format!(
                    "{ptr:p} is not the start of a host buffer from mps_host_alloc"
                ))
            })?
        };
        self.call(&Request::HostFree { handle })?;
        self.host
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ptr as usize));
        Ok(())
    }

    /// The host buffer holding `[ptr, ptr + len)`, as (handle, offset), if `ptr` is in one.
    fn host_ref(&self, ptr: *const u8, len: usize) -> Result<Option<HostRef>> {
        let host = self.host.read().unwrap_or_else(|p| p.into_inner());
        let addr = ptr as usize;
        let Some((base, m)) = host.range(..=addr).next_back() else {
            return Ok(None);
        };
        let off = addr - base;
        if off >= m.segment.len() {
            return Ok(None);
        }
        if len > m.segment.len() - off {
            return Err(Error::invalid_value(format!(
                "host range {ptr:p}+{len} runs past the end of its {}-byte host buffer",
                m.segment.len()
            )));
        }
        Ok(Some(HostRef::Buffer {
            handle: m.handle,
            offset: off as u64,
        }))
    }

    // ----- copies -----

    /// Copies host memory to the device. From a host buffer the copy is asynchronous (ordered in
    /// `stream`); from other memory the call returns once the source has been taken.
    ///
    /// # Safety
    /// `src` must be valid for reading `len` bytes.
    pub unsafe fn memcpy_htod_raw(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid_value("copy of 0 bytes"));
        }
        if let Some(h) = self.host_ref(src, len)? {
            return self
                .enqueue(
                    &Request::CopyHtoD {
                        dst: dst.0,
                        src: h,
                        len: len as u64,
                    },
                    stream,
                )
                .map(drop);
        }
        self.check()?;
        self.stream_slot(stream)?;
        self.through_staging(
            len,
            stream,
            |offset, start, n| Request::CopyHtoD {
                dst: dst.0 + start as u64,
                src: HostRef::Staging { offset },
                len: n as u64,
            },
            |half, start, n| {
                // SAFETY: the caller guarantees src..src+len is readable; the staging half is
                // ours (staging lock held) and the previous copy from it has been taken.
                unsafe { std::ptr::copy_nonoverlapping(src.add(start), half, n) }
            },
            |seq, _, _, _| self.wait_reply(seq).map(drop),
        )
    }

    /// Copies device memory to the host. Into a host buffer the copy is asynchronous (ordered in
    /// `stream`); into other memory the call returns once the data has arrived.
    ///
    /// # Safety
    /// `dst` must be valid for writing `len` bytes.
    pub unsafe fn memcpy_dtoh_raw(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: Stream,
    ) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid_value("copy of 0 bytes"));
        }
        if let Some(h) = self.host_ref(dst, len)? {
            return self
                .enqueue(
                    &Request::CopyDtoH {
                        dst: h,
                        src: src.0,
                        len: len as u64,
                    },
                    stream,
                )
                .map(drop);
        }
        self.check()?;
        let slot = self.stream_slot(stream)?;
        self.through_staging(
            len,
            stream,
            |offset, start, n| Request::CopyDtoH {
                dst: HostRef::Staging { offset },
                src: src.0 + start as u64,
                len: n as u64,
            },
            |_, _, _| {},
            |seq, half, start, n| {
                self.wait_reply(seq)?;
                self.wait_stream_seq(slot, seq)?;
                self.check()?;
                // SAFETY: the caller guarantees dst..dst+len is writable; the server wrote this
                // half and published its completion (Acquire in wait_stream_seq) before we read
                // it.
                unsafe { std::ptr::copy_nonoverlapping(half, dst.add(start), n) };
                Ok(())
            },
        )
    }

    /// Moves `len` bytes through the two halves of the staging area, one chunk in flight per
    /// half, so that one half is filled or drained while the other's copy runs. For the chunk of
    /// `n` bytes at `start`: `fill(half, start, n)` readies its half before the command is
    /// submitted, `request(offset, start, n)` is the command (the half at staging `offset`), and
    /// `finish(seq, half, start, n)` completes it before its half is used again, or at the end,
    /// in submission order. The first failure is returned, after every submitted chunk is
    /// finished.
    fn through_staging(
        &self,
        len: usize,
        stream: Stream,
        request: impl Fn(u64, usize, usize) -> Request<'static>,
        fill: impl Fn(*mut u8, usize, usize),
        finish: impl Fn(u64, *mut u8, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let _g = lock(&self.staging);
        let (staging, staging_len) = self.channel.staging();
        let half = staging_len / 2;
        // SAFETY: h is 0 or 1, so the half lies within the staging area.
        let half_at = |h: usize| unsafe { staging.add(h * half) };
        // (seq, start, n) of the chunk in flight in each half.
        let mut pending: [Option<(u64, usize, usize)>; 2] = [None, None];
        let mut result = Ok(());
        for (k, start) in (0..len).step_by(half).enumerate() {
            let n = half.min(len - start);
            let h = k % 2;
            if let Some((seq, s, m)) = pending[h].take() {
                result = finish(seq, half_at(h), s, m);
                if result.is_err() {
                    break;
                }
            }
            fill(half_at(h), start, n);
            let req = request((h * half) as u64, start, n);
            match self.submit(&req, stream.0, flags::REPLY | flags::MARK) {
                Ok(seq) => pending[h] = Some((seq, start, n)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut rest: Vec<_> = (0..2).filter_map(|h| pending[h].map(|p| (p, h))).collect();
        rest.sort_by_key(|((seq, ..), _)| *seq);
        for ((seq, start, n), h) in rest {
            let r = finish(seq, half_at(h), start, n);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Copies `src` to the device (see [`Client::memcpy_htod_raw`]).
    pub fn memcpy_htod(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()> {
        // SAFETY: a slice is valid for reading its length.
        unsafe { self.memcpy_htod_raw(dst, src.as_ptr(), src.len(), stream) }
    }

    /// Copies device memory into `dst` (see [`Client::memcpy_dtoh_raw`]).
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()> {
        // SAFETY: a mutable slice is valid for writing its length.
        unsafe { self.memcpy_dtoh_raw(dst.as_mut_ptr(), src, dst.len(), stream) }
    }

    /// Copies between device ranges, asynchronously.
    pub fn memcpy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: Stream,
    ) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid_value("copy of 0 bytes"));
        }
        let req = Request::CopyDtoD {
            dst: dst.0,
            src: src.0,
            len,
        };
        self.enqueue(&req, stream).map(drop)
    }

    /// Sets `count` bytes to `value`, asynchronously.
    pub fn memset_d8(&self, dst: DevicePtr, value: u8, count: u64, stream: Stream) -> Result<()> {
        self.memset(dst, value as u32, 1, count, stream)
    }

    /// Sets `count` 32-bit words to `value`, asynchronously.
    pub fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64, stream: Stream) -> Result<()> {
        self.memset(dst, value, 4, count, stream)
    }

    fn memset(
        &self,
        dst: DevicePtr,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: Stream,
    ) -> Result<()> {
        if count == 0 {
            return Err(Error::invalid_value("memset of 0 elements"));
        }
        let req = Request::Memset {
            dst: dst.0,
            value,
            elem_size,
            count,
        };
        self.enqueue(&req, stream).map(drop)
    }

    // ----- modules and launches -----

    /// Loads a module image (PTX text, cubin or fatbin; the simulator takes PTX).
    pub fn module_load(&self, image: &[u8]) -> Result<Module> {
        if image.is_empty() {
            return Err(Error::invalid_value("module image is empty"));
        }
        self.check()?;
        let _g = lock(&self.staging);
        let (staging, staging_len) = self.channel.staging();
        let mut module = 0;
        let chunks = image.len().div_ceil(staging_len);
        for (i, chunk) in image.chunks(staging_len).enumerate() {
            // SAFETY: chunk.len() <= staging_len, and we hold the staging lock.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), staging, chunk.len()) };
            let req = Request::ModuleData {
                staging_offset: 0,
                len: chunk.len() as u64,
                last: i + 1 == chunks,
            };
            module = self.call(&req)?.values[0];
        }
        Ok(Module(module))
    }

    /// Unloads a module; its functions become invalid.
    pub fn module_unload(&self, module: Module) -> Result<()> {
        self.call(&Request::ModuleUnload { module: module.0 })?;
        // The server dropped the module's functions; forget their layouts lazily (a stale
        // handle fails on the server with INVALID_HANDLE).
        Ok(())
    }

    /// The kernel `name` of `module`.
    pub fn module_get_function(&self, module: Module, name: &str) -> Result<Function> {
        if name.is_empty() || name.len() > protocol::MAX_NAME_BYTES {
            return Err(Error::invalid_value(format!(
                "kernel name must be 1 to {} bytes",
                protocol::MAX_NAME_BYTES
            )));
        }
        let reply = self.call(&Request::GetFunction {
            module: module.0,
            name: name.as_bytes(),
        })?;
        let [handle, count, ..] = reply.values;
        let mut params = Vec::with_capacity(count as usize);
        while (params.len() as u64) < count {
            let c = self.call(&Request::ParamInfo {
                function: handle,
                first: params.len() as u32,
            })?;
            let page: &[ParamInfo] = bytemuck::try_cast_slice(c.data())
                .map_err(|_| Error::internal("malformed parameter info reply"))?;
            if page.is_empty() {
                return Err(Error::internal("server returned no parameter info"));
            }
            params.extend_from_slice(page);
        }
        self.functions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, params.into());
        Ok(Function(handle))
    }

    /// Offset and size of parameter `index` of `function`.
    pub fn function_param_info(&self, function: Function, index: u32) -> Result<ParamInfo> {
        let params = self.params(function)?;
        params.get(index as usize).copied().ok_or_else(|| {
            Error::invalid_value(format!(
                "kernel has {} parameters; there is no parameter {index}",
                params.len()
            ))
        })
    }

    fn params(&self, function: Function) -> Result<Arc<[ParamInfo]>> {
        self.functions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&function.0)
            .cloned()
            .ok_or_else(|| unknown("function", function.0))
    }

    /// Launches `function` with one byte slice per parameter (each exactly the parameter's
    /// size), asynchronously in `stream`.
    pub fn launch(
        &self,
        function: Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Stream,
        args: &[&[u8]],
    ) -> Result<()> {
        let params = self.params(function)?;
        if args.len() != params.len() {
            return Err(Error::invalid_value(format!(
                "kernel takes {} parameters, {} given",
                params.len(),
                args.len()
            )));
        }
        for (i, (a, p)) in args.iter().zip(params.iter()).enumerate() {
            if a.len() != p.size as usize {
                return Err(Error::invalid_value(format!(
                    "parameter {i} is {} bytes, {} given",
                    p.size,
                    a.len()
                )));
            }
        }
        let ptrs: Vec<*const u8> = args.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: each pointer comes from a slice of exactly the parameter's size.
        unsafe { self.launch_raw(function, grid, block, shared_mem, stream, ptrs.as_ptr()) }
    }

    /// Launches with parameters as cuLaunchKernel takes them: `params[i]` points at the value of
    /// parameter `i`.
    ///
    /// # Safety
    /// `params` must point at one pointer per kernel parameter, each valid for reading that
    /// parameter's size (it may be null for a kernel without parameters).
    pub unsafe fn launch_raw(
        &self,
        function: Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Stream,
        params: *const *const u8,
    ) -> Result<()> {
        check_geometry(grid, block, shared_mem, &DeviceLimits::SM_90)?;
        let layout = self.params(function)?;
        if !layout.is_empty() && params.is_null() {
            return Err(Error::invalid_value(format!(
                "kernel takes {} parameters but params is NULL",
                layout.len()
            )));
        }
        let mut packed = [0u8; protocol::MAX_PARAM_BYTES];
        let total = layout.last().map_or(0, |p| (p.offset + p.size) as usize);
        if total > packed.len() {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "kernel takes {total} bytes of parameters; mps passes at most {}",
                    protocol::MAX_PARAM_BYTES
                ),
            ));
        }
        for (i, p) in layout.iter().enumerate() {
            // SAFETY: the caller guarantees params holds one pointer per parameter.
            let src = unsafe { *params.add(i) };
            if src.is_null() {
                return Err(Error::invalid_value(format!("params[{i}] is NULL")));
            }
            let (o, n) = (p.offset as usize, p.size as usize);
            // SAFETY: the caller guarantees src is readable for the parameter's size; the
            // destination range lies inside `packed` (o + n <= total <= its length).
            unsafe { std::ptr::copy_nonoverlapping(src, packed[o..o + n].as_mut_ptr(), n) };
        }
        let req = Request::Launch {
            function: function.0,
            grid,
            block,
            shared_mem,
            params: &packed[..total],
        };
        self.enqueue(&req, stream).map(drop)
    }

    // ----- streams and events -----

    /// Creates a stream (lower `priority` numbers are more urgent, as in CUDA).
    pub fn stream_create(&self, priority: i32) -> Result<Stream> {
        let v = self.call(&Request::StreamCreate { priority })?.values;
        lock(&self.submitter)
            .streams
            .insert(v[0], (v[1] as u32, StreamClock::default()));
        Ok(Stream(v[0]))
    }

    /// Destroys a stream; work already in it still completes.
    pub fn stream_destroy(&self, stream: Stream) -> Result<()> {
        if stream == Stream::DEFAULT {
            return Err(Error::invalid_value(
                "the default stream cannot be destroyed",
            ));
        }
        self.stream_slot(stream)?;
        self.call(&Request::StreamDestroy { stream: stream.0 })?;
        lock(&self.submitter).streams.remove(&stream.0);
        Ok(())
    }

    /// The sequence number the stream's progress must reach for its work so far to be done,
    /// submitting a mark first if its latest command carries none.
    fn stream_target(&self, stream: Stream) -> Result<(u32, u64)> {
        self.stream_target_marked(stream)
            .map(|(slot, seq, _)| (slot, seq))
    }

    /// As `stream_target`, also saying whether a mark was submitted just now.
    fn stream_target_marked(&self, stream: Stream) -> Result<(u32, u64, bool)> {
        let (slot, clock) = *lock(&self.submitter)
            .streams
            .get(&stream.0)
            .ok_or_else(|| unknown("stream", stream.0))?;
        if clock.needs_mark() {
            let seq = self.submit(&Request::Mark, stream.0, flags::MARK)?;
            return Ok((slot, seq, true));
        }
        Ok((slot, clock.target(), false))
    }

    /// Waits for all work submitted to `stream`.
    pub fn stream_synchronize(&self, stream: Stream) -> Result<()> {
        self.check()?;
        let (slot, target) = self.stream_target(stream)?;
        self.wait_stream_seq(slot, target)?;
        self.check()
    }

    /// `Ok(true)` when all work submitted to `stream` is done, `Ok(false)` while some is pending.
    ///
    /// When the stream's latest work carries no mark, the query submits one; the answer is then
    /// `true` only if the mark comes back within the spin phase of a wait (about 20 us), so a
    /// stream that has just gone idle may be reported busy once.
    pub fn stream_query(&self, stream: Stream) -> Result<bool> {
        self.check()?;
        let (slot, target, marked_now) = self.stream_target_marked(stream)?;
        let done = || self.progress(slot) >= target;
        let deadline = Instant::now() + spin();
        while marked_now && !done() && Instant::now() < deadline {
            std::hint::spin_loop();
        }
        Ok(done())
    }

    /// Makes future work in `stream` wait for the latest record of `event`.
    pub fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        self.event_clock(event)?;
        self.enqueue(&Request::StreamWaitEvent { event: event.0 }, stream)
            .map(drop)
    }

    /// Waits for all of this client's streams.
    pub fn synchronize(&self) -> Result<()> {
        self.check()?;
        let streams: Vec<u64> = lock(&self.submitter).streams.keys().copied().collect();
        for s in streams {
            let (slot, target) = self.stream_target(Stream(s))?;
            self.wait_stream_seq(slot, target)?;
        }
        self.check()
    }

    /// Creates an event.
    pub fn event_create(&self) -> Result<Event> {
        let v = self.call(&Request::EventCreate)?.values;
        lock(&self.submitter)
            .events
            .insert(v[0], EventClock::default());
        Ok(Event(v[0]))
    }

    /// Destroys an event.
    pub fn event_destroy(&self, event: Event) -> Result<()> {
        self.event_clock(event)?;
        self.call(&Request::EventDestroy { event: event.0 })?;
        lock(&self.submitter).events.remove(&event.0);
        Ok(())
    }

    fn event_clock(&self, event: Event) -> Result<EventClock> {
        lock(&self.submitter)
            .events
            .get(&event.0)
            .copied()
            .ok_or_else(|| unknown("event", event.0))
    }

    /// Records `event` in `stream`.
    pub fn event_record(&self, event: Event, stream: Stream) -> Result<()> {
        self.check()?;
        self.event_clock(event)?;
        let slot = self.stream_slot(stream)?;
        let seq = self.submit(
            &Request::EventRecord { event: event.0 },
            stream.0,
            flags::MARK,
        )?;
        if let Some(clock) = lock(&self.submitter).events.get_mut(&event.0) {
            clock.recorded(slot, seq);
        }
        Ok(())
    }

    /// Waits for the latest record of `event`.
    pub fn event_synchronize(&self, event: Event) -> Result<()> {
        self.check()?;
        let clock = self.event_clock(event)?;
        let complete = || clock.is_complete(|s| self.progress(s));
        self.wait_for(complete, |_| complete().then_some(Ok(())))?;
        self.check()
    }

    /// `Ok(true)` once the latest record of `event` has completed.
    pub fn event_query(&self, event: Event) -> Result<bool> {
        self.check()?;
        let clock = self.event_clock(event)?;
        Ok(clock.is_complete(|s| self.progress(s)))
    }

    /// Milliseconds between the completions of the latest records of `start` and `end`.
    pub fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        self.event_clock(start)?;
        self.event_clock(end)?;
        let v = self.call(&Request::EventElapsed {
            start: start.0,
            end: end.0,
        })?;
        Ok(f32::from_bits(v.values[0] as u32))
    }
}

fn unknown(what: &str, h: u64) -> Error {
    Error::invalid_handle(format!("{what} {h:#x} is not a {what} of this client"))
}

/// Where a client's kernels run: see [`Client::sm_info`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmInfo {
    /// SMs the client's kernels may use (its share or reservation, rounded up to the device's
    /// partition size).
    pub sms: u32,
    /// SMs of the device.
    pub device_sms: u32,
    /// The share in force, percent.
    pub share_percent: u32,
    /// SMs reserved for the client alone, percent (0: none).
    pub reserved_percent: u32,
}

/// Reads a percentage (1 to 100) from environment variable `name`; unset or empty is None.
fn percent_var(name: &str) -> Result<Option<u32>> {
    let Some(v) = std::env::var(name).ok().filter(|s| !s.trim().is_empty()) else {
        return Ok(None);
    };
    match mps_core::units::parse_percent(v.trim().trim_end_matches('%'), 1) {
        Some(p) => Ok(Some(p)),
        None => Err(Error::invalid_value(format!(
            "{name} is {v:?}; it must be a percentage from 1 to 100"
        ))),
    }
}
