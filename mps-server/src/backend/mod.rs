//! What the server needs from a device, and the two devices it knows: the CPU simulator
//! ([`sim`]) and, where a GPU exists, CUDA.
//!
//! The server validates every command against the client's own tables before it reaches a
//! backend, so backends may trust handles and ranges; they still bounds-check device addresses
//! wherever a mistake could touch the server's own memory.

pub mod cuda;
pub mod sim;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use mps_core::alloc::AllocTable;
use mps_core::limits::DeviceLimits;
use mps_core::protocol::{
    BackendKind, CONTEXT_LIMITS, DeviceAttribute, DeviceCopy, FUNC_ATTRIBUTES, Fill, LaunchSpec,
    OccupancyQuery, ParamInfo, TENSOR_MAP_BYTES, TensorMapTiled,
};
use mps_core::{Error, Result};
use mps_ipc::channel::Channel;
use mps_ipc::segment::Segment;

use crate::sm::{Assignment, Placement};

/// A description of the device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Marketing name.
    pub name: String,
    /// Device memory in bytes.
    pub total_mem: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// The device's smallest SM partitions, in SMs (see [`crate::sm`]); they sum to
    /// `sm_count`.
    pub sm_units: Vec<u32>,
    /// Compute capability.
    pub cc: (u32, u32),
    /// What launch geometry the device accepts; the server checks every launch against it.
    pub limits: DeviceLimits,
    /// Which backend.
    pub kind: BackendKind,
    /// Every device attribute the device reports (`cuDeviceGetAttribute`'s), sorted by
    /// attribute; clients answer `cuDeviceGetAttribute` from these.
    pub attributes: Vec<DeviceAttribute>,
    /// The device's UUID (`cuDeviceGetUuid`'s), where the device reports one.
    pub uuid: Option<[u8; 16]>,
}

/// Host memory a copy reads or writes: shared pages (a host buffer, the staging area) or, for a
/// pageable host-to-device copy, the bytes the server took from the staging area.
#[derive(Debug)]
pub enum HostBytes {
    /// `len` bytes at `offset` in a shared segment.
    Shared {
        /// The segment, kept mapped while the copy is pending.
        segment: Arc<Segment>,
        /// Byte offset (checked against the segment by the server).
        offset: usize,
        /// Byte count.
        len: usize,
    },
    /// A private copy of the source bytes.
    Owned(Box<[u8]>),
}

impl HostBytes {
    /// The 8-byte word these bytes are, read with acquire ordering; `None` if they are not
    /// 8 aligned bytes.
    pub fn load_word(&self) -> Option<u64> {
        let (p, len) = self.as_raw();
        if len != 8 || (p as usize) % 8 != 0 {
            return None;
        }
        // SAFETY: 8 aligned bytes of a live mapping (kept alive by `self`); another process
        // writes them only atomically.
        Some(unsafe { &*(p as *const AtomicU64) }.load(Ordering::Acquire))
    }

    /// Base address and length.
    pub fn as_raw(&self) -> (*mut u8, usize) {
        match self {
            HostBytes::Shared {
                segment,
                offset,
                len,
            } => {
                debug_assert!(offset + len <= segment.len());
                // SAFETY: the server checked offset + len against the segment's length.
                (unsafe { segment.as_ptr().add(*offset) }, *len)
            }
            HostBytes::Owned(b) => (b.as_ptr() as *mut u8, b.len()),
        }
    }
}

/// Where a completed command's progress is published: its stream's slot in the client's server
/// segment.
#[derive(Debug, Clone)]
pub struct Publish {
    /// The client's channel.
    pub channel: Channel,
    /// The stream's slot.
    pub slot: u32,
    /// The sequence number to publish.
    pub seq: u64,
}

impl Publish {
    /// Publishes from the host: raise the slot to `seq` (a maximum, so that progress never moves
    /// backwards) and wake sleeping client threads.
    pub fn publish(&self) {
        self.channel
            .stream_done(self.slot)
            .fetch_max(self.seq, Ordering::Release);
        self.channel.progress_bell().ring();
    }
}

/// What a backend knows of the client a stream belongs to.
#[derive(Debug, Clone)]
pub struct ClientContext {
    /// Server-assigned client id (for logs).
    pub id: u32,
    /// The client's allocations; the simulator checks every access of a kernel against them.
    pub allocations: Arc<RwLock<AllocTable>>,
    /// Set when the client is going away: pending work is dropped, blocking work gives up.
    pub closing: Arc<AtomicBool>,
    /// Where a failure of accepted work is reported.
    pub faults: Arc<dyn FaultSink>,
    /// The SMs the client's kernels may use.
    pub sm: Arc<SmSlot>,
    /// Nanoseconds the device spent on the client's work (see each backend for how it is
    /// measured).
    pub busy_ns: Arc<AtomicU64>,
    /// The words its streams wait on for host functions ([`Op::HostWait`]).
    pub gates: Arc<HostGates>,
    /// The client's priority level (`PRIORITY_NORMAL` or `PRIORITY_BELOW_NORMAL`), which the
    /// device priority of its streams follows (see each backend).
    pub priority: Arc<AtomicU32>,
}

/// The gate words of a client's streams ([`Op::HostWait`]): one word of a host buffer per
/// stream, which the client raises as its host functions return. When the client goes away
/// every gate is opened, so that no stream, on the device or in the simulator, waits for a
/// client that is gone.
#[derive(Debug, Default)]
pub struct HostGates {
    inner: std::sync::Mutex<GatesInner>,
}

#[derive(Debug, Default)]
struct GatesInner {
    /// Set once the client is going away: gates named after that open at once.
    opened: bool,
    /// Each stream's gate, by stream handle: the host buffer (handle, offset) it names and the
    /// word.
    by_stream: std::collections::HashMap<u64, ((u64, u64), HostBytes)>,
}

impl HostGates {
    /// What an opened gate holds: every wait of a well-behaved client (whose values count its
    /// host functions) is met by it, as the device compares (`(int64_t)(word - value) >= 0`)
    /// and as the simulator does.
    pub const OPEN: u64 = i64::MAX as u64;

    fn lock(&self) -> std::sync::MutexGuard<'_, GatesInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `word` (host buffer `handle`, byte `offset`) the gate of `stream`, or checks that
    /// it is the one the stream already waits on.
    pub fn fix(&self, stream: u64, handle: u64, offset: u64, word: &HostBytes) -> Result<()> {
        let mut g = self.lock();
        if let Some(((h, o), _)) = g.by_stream.get(&stream) {
            if (*h, *o) != (handle, offset) {
                return Err(Error::invalid_value(format!(
                    "stream {stream:#x} waits for host functions on byte {o} of host buffer \
                     {h:#x}; a host wait naming byte {offset} of host buffer {handle:#x} is \
                     refused (a stream has one gate word)"
                )));
            }
            return Ok(());
        }
        let HostBytes::Shared {
            segment,
            offset: at,
            len,
        } = word
        else {
            return Err(Error::internal(
                "a host function's gate is not shared memory",
            ));
        };
        let word = HostBytes::Shared {
            segment: segment.clone(),
            offset: *at,
            len: *len,
        };
        if g.opened {
            open(&word);
        }
        g.by_stream.insert(stream, ((handle, offset), word));
        Ok(())
    }

    /// Forgets the gate of `stream`, which is destroyed and waits no more.
    pub fn forget(&self, stream: u64) {
        self.lock().by_stream.remove(&stream);
    }

    /// Opens every gate, now and from now on: the client is going away.
    pub fn open_all(&self) {
        let mut g = self.lock();
        g.opened = true;
        g.by_stream.values().for_each(|(_, w)| open(w));
    }
}

/// Sets a gate word to [`HostGates::OPEN`].
fn open(word: &HostBytes) {
    let (p, len) = word.as_raw();
    if len == 8 && (p as usize) % 8 == 0 {
        // SAFETY: 8 aligned bytes of a live mapping (kept alive by `word`), written only
        // atomically by either process.
        unsafe { &*(p as *const AtomicU64) }.store(HostGates::OPEN, Ordering::Release);
    }
}

/// A client's current SM placement, as the server last decided it.
#[derive(Debug, Default)]
pub struct SmSlot {
    /// Raised after every change of placement, so that streams notice with one load.
    pub generation: AtomicU64,
    /// SMs the client may use (0: the whole device).
    pub sms: AtomicU32,
    placement: std::sync::Mutex<Option<Placement>>,
}

impl SmSlot {
    /// Publishes the client's placement, of `sms` SMs; call after [`Backend::place`] took it.
    pub fn set(&self, placement: &Placement, sms: u32) {
        let mut current = self.placement.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref() != Some(placement) {
            let whole = *placement == Placement::Whole;
            self.sms
                .store(if whole { 0 } else { sms }, Ordering::Relaxed);
            *current = Some(placement.clone());
            self.generation.fetch_add(1, Ordering::Release);
        }
    }
}

/// Receives failures of work that was accepted earlier (a kernel fault).
pub trait FaultSink: Send + Sync + std::fmt::Debug {
    /// Command `seq` failed with `err`.
    fn fault(&self, seq: u64, err: Error);
    /// Whether the client already faulted (its later work is skipped).
    fn has_faulted(&self) -> bool;
}

/// A launch as a backend runs it: the backend's kernel, the parameters borrowed from the
/// session's copy of the command or owned.
pub type Launch<'a, B> = LaunchSpec<Arc<<B as Backend>::Function>, Cow<'a, [u8]>>;

/// One unit of stream-ordered work. A launch's parameters are borrowed from the session's private
/// copy of the command (a backend that submits synchronously hands them to the driver from
/// there); a backend that runs work after `submit` returns keeps it with [`Op::into_owned`].
#[derive(Debug)]
pub enum Op<'a, B: Backend> {
    /// A kernel launch with its packed parameters.
    Launch(Launch<'a, B>),
    /// Host to device.
    CopyHtoD {
        /// Device address.
        dst: u64,
        /// Source bytes.
        src: HostBytes,
    },
    /// Device to host.
    CopyDtoH {
        /// Destination bytes (shared pages).
        dst: HostBytes,
        /// Device address.
        src: u64,
    },
    /// Device to device.
    CopyDtoD(DeviceCopy),
    /// Fill device memory.
    Memset(Fill),
    /// Record an event.
    Record(Arc<B::Event>),
    /// Wait for the latest record of an event made before this wait.
    Wait(Arc<B::Event>),
    /// Run an executable graph (never submitted to a capturing stream).
    GraphLaunch(Arc<B::GraphExec>),
    /// Wait until the 8-byte word `word` of a host buffer (at device address `device`) is at
    /// least `value`: a host function's gate (never submitted to a capturing stream). The word
    /// is opened (set to all ones) when the client goes away, so the wait always ends.
    HostWait {
        /// The word's bytes, kept mapped while the wait is pending.
        word: HostBytes,
        /// Its device address.
        device: u64,
        /// The value to reach.
        value: u64,
    },
    /// Nothing; exists to carry a publish.
    Nop,
}

impl<B: Backend> Op<'_, B> {
    /// The same work owning everything it refers to (copies a launch's borrowed parameters).
    pub fn into_owned(self) -> Op<'static, B> {
        match self {
            Op::Launch(l) => Op::Launch(l.map(|f| f, |p| Cow::Owned(p.into_owned()))),
            Op::CopyHtoD { dst, src } => Op::CopyHtoD { dst, src },
            Op::CopyDtoH { dst, src } => Op::CopyDtoH { dst, src },
            Op::CopyDtoD(c) => Op::CopyDtoD(c),
            Op::Memset(f) => Op::Memset(f),
            Op::Record(e) => Op::Record(e),
            Op::Wait(e) => Op::Wait(e),
            Op::GraphLaunch(g) => Op::GraphLaunch(g),
            Op::HostWait {
                word,
                device,
                value,
            } => Op::HostWait {
                word,
                device,
                value,
            },
            Op::Nop => Op::Nop,
        }
    }
}

/// A device.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A stream.
    type Stream: Send;
    /// An event.
    type Event: Send + Sync + std::fmt::Debug;
    /// A loaded module.
    type Module: Send + Sync;
    /// A kernel.
    type Function: Send + Sync + std::fmt::Debug;
    /// A graph captured from a stream.
    type Graph: Send;
    /// An executable graph, made from a captured one.
    type GraphExec: Send + Sync + std::fmt::Debug;

    /// The device.
    fn info(&self) -> &DeviceInfo;
    /// Allocates device memory (size > 0, already checked).
    fn mem_alloc(&self, size: u64) -> Result<u64>;
    /// Frees what `mem_alloc` returned; `size` is what was asked for.
    fn mem_free(&self, ptr: u64, size: u64);
    /// Free and total device memory.
    fn mem_get_info(&self) -> (u64, u64);
    /// The granularity of reservations, physical allocations and mappings (a power of two;
    /// the session checks every size, alignment and offset against it).
    fn vm_granularity(&self) -> u64;
    /// Reserves `size` bytes of device address space on an `align` boundary (a power of two).
    fn vm_reserve(&self, size: u64, align: u64) -> Result<u64>;
    /// Frees a reservation of `size` bytes at `va` in which nothing is mapped.
    fn vm_free(&self, va: u64, size: u64);
    /// Creates `size` bytes of physical device memory and returns the backend's handle of it.
    fn vm_create(&self, size: u64) -> Result<u64>;
    /// Releases a physical allocation of `size` bytes that no mapping uses.
    fn vm_release(&self, phys: u64, size: u64);
    /// Maps `size` bytes of the physical allocation `phys`, from `offset`, at `va`: inside a
    /// reservation, where nothing is mapped (the session checked both).
    fn vm_map(&self, va: u64, size: u64, phys: u64, offset: u64) -> Result<()>;
    /// Unmaps `[va, va + size)`, one mapping made by `vm_map`, which no work uses.
    fn vm_unmap(&self, va: u64, size: u64);
    /// Makes the mapped `[va, va + size)` readable and writable by the device.
    fn vm_set_access(&self, va: u64, size: u64) -> Result<()>;
    /// Makes a host buffer usable for direct copies (page-locks it on a GPU).
    fn host_register(&self, segment: &Segment) -> Result<()>;
    /// Undoes `host_register`; called once no pending copy uses the buffer.
    fn host_unregister(&self, segment: &Segment);
    /// The device address of a client's host buffer that `host_register` registered, at which
    /// kernels and copies reach its bytes (`cuMemHostGetDevicePointer`'s): the GPU's mapping
    /// of it, or the simulator's own.
    fn host_map(&self, segment: &Segment) -> Result<u64>;
    /// Undoes `host_map` of the `len`-byte buffer at device address `addr`; called once no
    /// pending work uses it, before `host_unregister`.
    fn host_unmap(&self, addr: u64, len: u64);
    /// Loads a module image.
    fn module_load(&self, image: &[u8]) -> Result<Self::Module>;
    /// A kernel of a module and the layout of its parameters.
    fn module_function(
        &self,
        module: &Self::Module,
        name: &str,
    ) -> Result<(Self::Function, Vec<ParamInfo>)>;
    /// The device address and size of the global variable `name` of a module.
    fn module_global(&self, module: &Self::Module, name: &str) -> Result<(u64, u64)>;
    /// The names of a module's kernels, in the order the device's driver lists them.
    fn module_function_names(&self, module: &Self::Module) -> Result<Vec<String>>;
    /// A tiled TMA descriptor (`cuTensorMapEncodeTiled`'s) of a tensor in a client's memory,
    /// whose rank, enumerations and span the session has checked.
    fn tensor_map_encode_tiled(&self, map: &TensorMapTiled) -> Result<[u8; TENSOR_MAP_BYTES]>;
    /// A client's TMA descriptor naming `address` instead (`cuTensorMapReplaceAddress`'s),
    /// which the session found inside the client's memory.
    fn tensor_map_replace_address(
        &self,
        map: &[u8; TENSOR_MAP_BYTES],
        address: u64,
    ) -> Result<[u8; TENSOR_MAP_BYTES]>;
    /// The context's stream priority range (least, greatest) and its limits
    /// (`cuCtxGetLimit`'s, by `CUlimit`; `None` where the device has no such limit).
    fn context_limits(&self) -> ((i32, i32), [Option<u64>; CONTEXT_LIMITS]);
    /// A kernel's attributes (`cuFuncGetAttribute`'s, by `CUfunction_attribute`; `None` where
    /// the device reports none).
    fn function_attributes(
        &self,
        function: &Self::Function,
    ) -> Result<[Option<i32>; FUNC_ATTRIBUTES]>;
    /// An occupancy figure of a kernel, per SM of the whole device (a client's SM share
    /// changes how many SMs it has, not what fits on one).
    fn occupancy(&self, function: &Self::Function, query: OccupancyQuery) -> Result<u64>;
    /// Makes `assignments` the SM placement of their clients: work submitted after the call runs
    /// where it says (streams created before follow at their next submission). On failure the
    /// previous placement stays.
    fn place(&self, assignments: &[Assignment]) -> Result<()>;
    /// Creates a stream for a client, of CUDA priority `priority` (lower is more urgent) as
    /// the client asked for it: the device priority also follows the client's level,
    /// [`ClientContext::priority`], which its streams follow at their next submission after it
    /// changes.
    fn stream_create(&self, priority: i32, client: &ClientContext) -> Result<Self::Stream>;
    /// Queues `op` on `stream`, to be followed by `publish` once it completes. Failures while
    /// running go to the client's [`FaultSink`]; an error here means nothing was queued.
    fn submit(
        &self,
        stream: &Self::Stream,
        seq: u64,
        op: Op<'_, Self>,
        publish: Option<Publish>,
    ) -> Result<()>;
    /// Waits until everything queued on `stream` has run (or, while waiting, `closing` is set).
    fn stream_synchronize(&self, stream: &Self::Stream, closing: &AtomicBool) -> Result<()>;
    /// Destroys a stream: work already queued still runs, unless the client is closing. Returns
    /// once no work of the stream is pending or running, so that its progress slot can be given
    /// to a new stream (clients take a slot's progress past an event's record as proof that the
    /// record completed).
    fn stream_destroy(&self, stream: Self::Stream);
    /// Creates an event.
    fn event_create(&self) -> Result<Self::Event>;
    /// Milliseconds between the completions of the latest records of two events.
    fn event_elapsed_ms(&self, start: &Self::Event, end: &Self::Event) -> Result<f32>;
    /// From now on, work submitted to `stream` is recorded into a graph, not run. The session
    /// submits no event record or wait, no graph launch and nothing that publishes progress to
    /// a capturing stream, and neither synchronises nor destroys it.
    fn capture_begin(&self, stream: &Self::Stream) -> Result<()>;
    /// Ends the capture of `stream` and returns what it recorded; the stream runs its work
    /// again.
    fn capture_end(&self, stream: &Self::Stream) -> Result<Self::Graph>;
    /// An executable graph of `graph`, which it no longer needs: it keeps alive what its work
    /// refers to.
    fn graph_instantiate(&self, graph: &Self::Graph) -> Result<Self::GraphExec>;
    /// Gives operation `index` of the work `exec` was made from (its `index`-th captured
    /// operation) the work of `op`, which the session found the same but for what a node of an
    /// executable graph may change: a kernel launch of the same kernel, clusters and parameter
    /// layout with another geometry, shared memory or parameters; a memset of the same size
    /// elsewhere or with another value. Only launches of `exec` submitted after this call see
    /// it, as CUDA documents for `cuGraphExecKernelNodeSetParams` and
    /// `cuGraphExecMemsetNodeSetParams`; launches already submitted keep what they had. An
    /// update the backend cannot make is an error, and leaves the graph unfit for the work.
    fn graph_exec_update(
        &self,
        exec: &Self::GraphExec,
        index: usize,
        op: &Op<'_, Self>,
    ) -> Result<()>;
}

impl<B: Backend> Op<'_, B> {
    /// The same work, borrowing what it can (a batched run's commands are submitted more than
    /// once when a capture fails; a simulated graph's work is copied when one of its launches
    /// is given new parameters).
    pub(crate) fn duplicate(&self) -> Op<'_, B> {
        let op = self;
        let host = |h: &HostBytes| match h {
            HostBytes::Shared {
                segment,
                offset,
                len,
            } => HostBytes::Shared {
                segment: segment.clone(),
                offset: *offset,
                len: *len,
            },
            HostBytes::Owned(b) => HostBytes::Owned(b.clone()),
        };
        match op {
            Op::Launch(l) => Op::Launch(l.as_ref().map(Arc::clone, |p| Cow::Borrowed(&**p))),
            Op::CopyHtoD { dst, src } => Op::CopyHtoD {
                dst: *dst,
                src: host(src),
            },
            Op::CopyDtoH { dst, src } => Op::CopyDtoH {
                dst: host(dst),
                src: *src,
            },
            Op::CopyDtoD(c) => Op::CopyDtoD(*c),
            Op::Memset(f) => Op::Memset(*f),
            Op::Record(e) => Op::Record(e.clone()),
            Op::Wait(e) => Op::Wait(e.clone()),
            Op::GraphLaunch(g) => Op::GraphLaunch(g.clone()),
            Op::HostWait {
                word,
                device,
                value,
            } => Op::HostWait {
                word: host(word),
                device: *device,
                value: *value,
            },
            Op::Nop => Op::Nop,
        }
    }
}
