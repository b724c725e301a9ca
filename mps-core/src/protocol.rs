//! The wire protocol between a client and its server.
//!
//! A client talks to the server through two shared-memory rings: a submission ring of 64-byte
//! [`Command`] slots that the client writes, and a completion ring of [`Completion`] slots that
//! the server writes. A command whose payload (kernel parameters, a kernel name) does not fit in
//! its slot continues in the following `extra_slots` slots. Bulk data (pageable copies, module
//! images) travels through the client's staging area; host buffers from `mps_host_alloc` are
//! shared pages that both sides map.
//!
//! The server answers a command with a completion only when the command asks for one
//! ([`flags::REPLY`]) or when it fails; stream progress is published separately, in the server's
//! status page, for commands that carry [`flags::MARK`].
//!
//! Every structure here is `#[repr(C)]` and [`bytemuck::Pod`], so that it can be copied out of
//! shared memory byte for byte and then validated: [`Request::decode`] turns an untrusted command
//! into a typed request or an error, never a panic.
//!
//! Past 600 lines: the request enum, its encoder and its decoder must agree field by field and are
//! kept side by side; the tests are at the end.

use bytemuck::{Pod, Zeroable};

use crate::status::{Error, Result, Status};

// The handshake's types lived here; they keep these paths.
pub use crate::handshake::{
    BackendKind, DEFAULT_GROUP, DeviceInfoWire, GROUP_BYTES, HELLO_PREFIX, Hello, HostBufferFd,
    MAGIC, Welcome, check_group, get_str, put_str,
};

/// Bumped on every incompatible change of anything in this module or of the shared layout.
pub const PROTOCOL_VERSION: u32 = 9;

/// Size of one submission slot: one cache line.
pub const SLOT_BYTES: usize = 64;
/// The most kernel-parameter bytes one launch may carry (CUDA's classic limit).
pub const MAX_PARAM_BYTES: usize = 4096;
/// The most bytes of a kernel name.
pub const MAX_NAME_BYTES: usize = 1024;
/// The most slots one command may take, header included.
pub const MAX_COMMAND_SLOTS: usize = 1 + MAX_PARAM_BYTES / SLOT_BYTES;
/// Streams per client, the default stream (slot 0) included.
pub const MAX_STREAMS: usize = 256;
/// Events one client may hold.
pub const MAX_EVENTS: usize = 4096;
/// The largest module image the server accepts.
pub const MAX_MODULE_BYTES: u64 = 256 << 20;
/// Bytes of message or reply data a completion carries.
pub const COMPLETION_DATA_BYTES: usize = 200;
/// (offset, size) pairs of parameter info one completion carries.
pub const PARAMS_PER_REPLY: usize = COMPLETION_DATA_BYTES / 8;
/// [`DeviceAttribute`] pairs one completion carries (with room for a 16-byte UUID after them).
pub const ATTRIBUTES_PER_REPLY: usize = (COMPLETION_DATA_BYTES - 16) / 8;

/// Bits of [`Command::flags`].
pub mod flags {
    /// Post a completion even when the command succeeds.
    pub const REPLY: u16 = 1;
    /// Publish this command's sequence number in its stream's progress slot once it completes.
    pub const MARK: u16 = 2;
    /// Every flag this version defines.
    pub const ALL: u16 = REPLY | MARK;
}

/// One submission slot as it sits in shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct Command {
    /// An [`Opcode`] value.
    pub opcode: u16,
    /// [`flags`] bits.
    pub flags: u16,
    /// Slots of payload that follow this one.
    pub extra_slots: u16,
    /// Zero.
    pub reserved: u16,
    /// The client's sequence number for this command, echoed in its completion; strictly
    /// increasing per client.
    pub seq: u64,
    /// The stream a stream-ordered command belongs to (0: the client's default stream).
    pub stream: u64,
    /// Opcode-specific arguments.
    pub args: [u64; 5],
}

const _: () = assert!(size_of::<Command>() == SLOT_BYTES);

crate::wire_enum! {
    /// What a command asks for.
    pub enum Opcode: u16, from_u16 {
        /// Allocate device memory.
        MemAlloc = 1 => "mem_alloc",
        /// Free device memory.
        MemFree = 2 => "mem_free",
        /// Free and total device memory, as the client's limit shows them.
        MemGetInfo = 3 => "mem_get_info",
        /// Create a host buffer shared with the server.
        HostAlloc = 4 => "host_alloc",
        /// Free a host buffer.
        HostFree = 5 => "host_free",
        /// Copy host to device.
        CopyHtoD = 6 => "copy_htod",
        /// Copy device to host.
        CopyDtoH = 7 => "copy_dtoh",
        /// Copy device to device.
        CopyDtoD = 8 => "copy_dtod",
        /// Fill device memory.
        Memset = 9 => "memset",
        /// A chunk of a module image.
        ModuleData = 10 => "module_data",
        /// Unload a module.
        ModuleUnload = 11 => "module_unload",
        /// Look up a kernel by name.
        GetFunction = 12 => "get_function",
        /// A kernel's parameter layout.
        ParamInfo = 13 => "param_info",
        /// Launch a kernel.
        Launch = 14 => "launch",
        /// Create a stream.
        StreamCreate = 15 => "stream_create",
        /// Destroy a stream.
        StreamDestroy = 16 => "stream_destroy",
        /// Publish stream progress (nothing else).
        Mark = 17 => "mark",
        /// Create an event.
        EventCreate = 18 => "event_create",
        /// Destroy an event.
        EventDestroy = 19 => "event_destroy",
        /// Record an event in a stream.
        EventRecord = 20 => "event_record",
        /// Make a stream wait for an event.
        StreamWaitEvent = 21 => "stream_wait_event",
        /// Time between two recorded events.
        EventElapsed = 22 => "event_elapsed",
        /// Lower the client's device-memory limit.
        SetMemLimit = 23 => "set_mem_limit",
        /// Lower the client's priority.
        SetPriority = 24 => "set_priority",
        /// Lower the client's SM share.
        SetSmShare = 25 => "set_sm_share",
        /// Reserve SMs for the client.
        ReserveSms = 26 => "reserve_sms",
        /// The client's SMs.
        SmInfo = 27 => "sm_info",
        /// Start recording a stream's work into a graph instead of running it.
        StreamBeginCapture = 28 => "stream_begin_capture",
        /// Stop recording a stream's work; replies with the graph.
        StreamEndCapture = 29 => "stream_end_capture",
        /// Make an executable graph of a captured one.
        GraphInstantiate = 30 => "graph_instantiate",
        /// Destroy a captured graph.
        GraphDestroy = 31 => "graph_destroy",
        /// Destroy an executable graph.
        GraphExecDestroy = 32 => "graph_exec_destroy",
        /// Run an executable graph in a stream.
        GraphLaunch = 33 => "graph_launch",
        /// A page of the device's attributes, and its UUID.
        DeviceAttributes = 34 => "device_attributes",
        /// The context's stream priority range and limits (`cuCtxGetLimit`'s).
        ContextLimits = 35 => "context_limits",
        /// A kernel's attributes (`cuFuncGetAttribute`'s).
        FuncAttributes = 36 => "func_attributes",
        /// An occupancy figure of a kernel (`cuOccupancy*`'s).
        Occupancy = 37 => "occupancy",
        /// The address and size of a module's global variable.
        ModuleGlobal = 38 => "module_global",
        /// Launch a kernel in clusters of blocks.
        LaunchCluster = 39 => "launch_cluster",
    }
}

impl Opcode {
    /// Whether commands of this kind run in stream order (and so may carry [`flags::MARK`]).
    pub fn is_stream_ordered(self) -> bool {
        matches!(
            self,
            Opcode::CopyHtoD
                | Opcode::CopyDtoH
                | Opcode::CopyDtoD
                | Opcode::Memset
                | Opcode::Launch
                | Opcode::LaunchCluster
                | Opcode::Mark
                | Opcode::EventRecord
                | Opcode::StreamWaitEvent
                | Opcode::GraphLaunch
        )
    }
}

/// Context limits reported by [`Request::ContextLimits`]: `CUlimit` 0 (stack size) to 9 (CIG
/// shared-memory fallback), CUDA 13's.
pub const CONTEXT_LIMITS: usize = 10;

/// Function attributes reported by [`Request::FuncAttributes`]: `CUfunction_attribute` 0
/// (max threads per block) to 15 (cluster scheduling policy preference).
pub const FUNC_ATTRIBUTES: usize = 16;

const _: () = assert!(CONTEXT_LIMITS * 8 <= COMPLETION_DATA_BYTES);
const _: () = assert!(FUNC_ATTRIBUTES * 4 <= COMPLETION_DATA_BYTES);

/// Which occupancy figure a [`Request::Occupancy`] asks for (the `cuOccupancy*` functions').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OccupancyQuery {
    /// Blocks of `block_size` threads with `dynamic_smem` bytes of dynamic shared memory that
    /// fit on one SM (`cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`).
    ActiveBlocks {
        /// Threads per block.
        block_size: u32,
        /// Dynamic shared memory per block.
        dynamic_smem: u32,
        /// `CU_OCCUPANCY_*` flags.
        flags: u32,
    },
    /// Dynamic shared memory a block may use for `blocks` blocks of `block_size` threads to fit
    /// on one SM (`cuOccupancyAvailableDynamicSMemPerBlock`).
    DynamicSmem {
        /// Blocks per SM.
        blocks: u32,
        /// Threads per block.
        block_size: u32,
    },
    /// Clusters of `cluster` blocks of `block` threads that can run at once
    /// (`cuOccupancyMaxActiveClusters`); a zero `cluster` means the kernel's own cluster size.
    ActiveClusters {
        /// Block geometry.
        block: Dim3,
        /// Cluster geometry, in blocks (0: the kernel's compile-time one).
        cluster: Dim3,
        /// Dynamic shared memory per block.
        dynamic_smem: u32,
        /// Whether the kernel allows clusters past the portable 8 blocks (the program set
        /// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`).
        non_portable: bool,
    },
}

/// Host memory named by a copy: the client's staging area, or a buffer from `mps_host_alloc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRef {
    /// `offset` bytes into the staging area.
    Staging {
        /// Byte offset.
        offset: u64,
    },
    /// `offset` bytes into a host buffer.
    Buffer {
        /// The host buffer's handle.
        handle: u64,
        /// Byte offset.
        offset: u64,
    },
}

impl HostRef {
    fn encode(self) -> (u64, u64) {
        match self {
            HostRef::Staging { offset } => (0, offset),
            HostRef::Buffer { handle, offset } => (handle, offset),
        }
    }

    fn decode(handle: u64, offset: u64) -> HostRef {
        if handle == 0 {
            HostRef::Staging { offset }
        } else {
            HostRef::Buffer { handle, offset }
        }
    }
}

/// The clusters a launch groups its blocks into (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cluster {
    /// Blocks per cluster along each axis; each divides the grid's.
    pub dims: Dim3,
    /// Whether the kernel may use a cluster larger than the portable 8 blocks
    /// (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`).
    pub non_portable: bool,
}

/// The most blocks a cluster holds: 8 (portable), or 16 where the kernel allows non-portable
/// sizes (Hopper's limit).
pub const MAX_CLUSTER_BLOCKS: u32 = 8;
/// As [`MAX_CLUSTER_BLOCKS`], for a kernel that allows non-portable cluster sizes.
pub const MAX_NON_PORTABLE_CLUSTER_BLOCKS: u32 = 16;

/// A launch geometry (as `dim3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Dim3 {
    /// x extent.
    pub x: u32,
    /// y extent.
    pub y: u32,
    /// z extent.
    pub z: u32,
}

impl Dim3 {
    /// Product of the extents, or `None` on overflow.
    pub fn volume(self) -> Option<u64> {
        (self.x as u64)
            .checked_mul(self.y as u64)?
            .checked_mul(self.z as u64)
    }
}

/// A decoded, statically valid command. Handles and ranges are not yet checked against the
/// client's tables: that is the server's job.
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs)]
pub enum Request<'a> {
    MemAlloc {
        size: u64,
    },
    MemFree {
        ptr: u64,
    },
    MemGetInfo,
    HostAlloc {
        size: u64,
    },
    HostFree {
        handle: u64,
    },
    CopyHtoD {
        dst: u64,
        src: HostRef,
        len: u64,
    },
    CopyDtoH {
        dst: HostRef,
        src: u64,
        len: u64,
    },
    CopyDtoD {
        dst: u64,
        src: u64,
        len: u64,
    },
    /// `count` elements of `elem_size` (1 or 4) bytes set to `value`.
    Memset {
        dst: u64,
        value: u32,
        elem_size: u8,
        count: u64,
    },
    /// `len` bytes of module image in the staging area at `staging_offset`; `last` loads the
    /// image gathered so far and replies with the module handle.
    ModuleData {
        staging_offset: u64,
        len: u64,
        last: bool,
    },
    ModuleUnload {
        module: u64,
    },
    GetFunction {
        module: u64,
        name: &'a [u8],
    },
    /// The device address and size of the global variable `name` of `module`: replies
    /// `[address, size, 0, 0]`.
    ModuleGlobal {
        module: u64,
        name: &'a [u8],
    },
    /// Parameter layout of `function`, starting at parameter `first`.
    ParamInfo {
        function: u64,
        first: u32,
    },
    /// The device's attributes (`cuDeviceGetAttribute`'s), from the `first`th of those the
    /// server reports: a reply's data holds up to [`ATTRIBUTES_PER_REPLY`] [`DeviceAttribute`]s
    /// and its values are `[in this page, reported in all, 1 if the UUID is known else 0,
    /// 0]`; the UUID (`cuDeviceGetUuid`'s 16 bytes) follows the page in the data when known.
    DeviceAttributes {
        first: u32,
    },
    /// The context's stream priority range and limits: replies `[least priority, greatest
    /// priority (each as the i32 bits in a u64), a mask of the limits reported (bit n: `CUlimit`
    /// n), 0]` and, in its data, [`CONTEXT_LIMITS`] little-endian u64 values (0 where not
    /// reported).
    ContextLimits,
    /// The attributes of `function`: replies `[FUNC_ATTRIBUTES, a mask of those reported (bit
    /// n: attribute n), 0, 0]` and, in its data, [`FUNC_ATTRIBUTES`] little-endian i32 values.
    FuncAttributes {
        function: u64,
    },
    /// An occupancy figure of `function`: replies `[the figure, 0, 0, 0]`.
    Occupancy {
        function: u64,
        query: OccupancyQuery,
    },
    /// Launch `function`, its blocks grouped in clusters where `cluster` says so (opcode
    /// `LaunchCluster`; the session checks the clusters against the grid and the device).
    Launch {
        function: u64,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        cluster: Option<Cluster>,
        params: &'a [u8],
    },
    StreamCreate {
        priority: i32,
    },
    StreamDestroy {
        stream: u64,
    },
    /// Nothing to do but publish progress (used to synchronise a stream).
    Mark,
    EventCreate,
    EventDestroy {
        event: u64,
    },
    /// Record `event` in the command's stream. The client knows the record completed once the
    /// stream's progress reaches the command's sequence number.
    EventRecord {
        event: u64,
    },
    StreamWaitEvent {
        event: u64,
    },
    EventElapsed {
        start: u64,
        end: u64,
    },
    /// Lowers this client's device-memory limit to `bytes` (it can never rise above what the
    /// server set).
    SetMemLimit {
        bytes: u64,
    },
    /// Lowers this client's priority to `level` ([`PRIORITY_NORMAL`] or
    /// [`PRIORITY_BELOW_NORMAL`]; it can never rise above what the server set).
    SetPriority {
        level: u32,
    },
    /// Lowers this client's share of the device's SMs to `percent` (1..=100; it can never rise
    /// above what the server set). Replies like [`Request::SmInfo`].
    SetSmShare {
        percent: u32,
    },
    /// Reserves `percent` (1..=100) of the device's SMs for this client alone, within the
    /// ceiling the operator set. Replies like [`Request::SmInfo`].
    ReserveSms {
        percent: u32,
    },
    /// The SMs this client's work runs on now: replies `[sms, device sms, share percent,
    /// reserved percent]`.
    SmInfo,
    /// From now on, record the work submitted to `stream` into a graph instead of running it.
    StreamBeginCapture {
        stream: u64,
    },
    /// Stop recording `stream`; replies `[graph handle]`.
    StreamEndCapture {
        stream: u64,
    },
    /// Replies `[executable graph handle]`.
    GraphInstantiate {
        graph: u64,
    },
    GraphDestroy {
        graph: u64,
    },
    GraphExecDestroy {
        exec: u64,
    },
    /// Run the executable graph `exec` in the command's stream.
    GraphLaunch {
        exec: u64,
    },
}

/// Client priority: served as the operator set it.
pub const PRIORITY_NORMAL: u32 = 0;
/// Client priority: served after normal clients (its streams get the device's least urgent
/// priority, its session thread a lower CPU priority).
pub const PRIORITY_BELOW_NORMAL: u32 = 1;

impl Request<'_> {
    /// The opcode of this request.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::MemAlloc { .. } => Opcode::MemAlloc,
            Request::MemFree { .. } => Opcode::MemFree,
            Request::MemGetInfo => Opcode::MemGetInfo,
            Request::HostAlloc { .. } => Opcode::HostAlloc,
            Request::HostFree { .. } => Opcode::HostFree,
            Request::CopyHtoD { .. } => Opcode::CopyHtoD,
            Request::CopyDtoH { .. } => Opcode::CopyDtoH,
            Request::CopyDtoD { .. } => Opcode::CopyDtoD,
            Request::Memset { .. } => Opcode::Memset,
            Request::ModuleData { .. } => Opcode::ModuleData,
            Request::ModuleUnload { .. } => Opcode::ModuleUnload,
            Request::GetFunction { .. } => Opcode::GetFunction,
            Request::ParamInfo { .. } => Opcode::ParamInfo,
            Request::DeviceAttributes { .. } => Opcode::DeviceAttributes,
            Request::ContextLimits => Opcode::ContextLimits,
            Request::ModuleGlobal { .. } => Opcode::ModuleGlobal,
            Request::FuncAttributes { .. } => Opcode::FuncAttributes,
            Request::Occupancy { .. } => Opcode::Occupancy,
            Request::Launch { cluster: None, .. } => Opcode::Launch,
            Request::Launch {
                cluster: Some(_), ..
            } => Opcode::LaunchCluster,
            Request::StreamCreate { .. } => Opcode::StreamCreate,
            Request::StreamDestroy { .. } => Opcode::StreamDestroy,
            Request::Mark => Opcode::Mark,
            Request::EventCreate => Opcode::EventCreate,
            Request::EventDestroy { .. } => Opcode::EventDestroy,
            Request::EventRecord { .. } => Opcode::EventRecord,
            Request::StreamWaitEvent { .. } => Opcode::StreamWaitEvent,
            Request::EventElapsed { .. } => Opcode::EventElapsed,
            Request::SetMemLimit { .. } => Opcode::SetMemLimit,
            Request::SetPriority { .. } => Opcode::SetPriority,
            Request::SetSmShare { .. } => Opcode::SetSmShare,
            Request::ReserveSms { .. } => Opcode::ReserveSms,
            Request::SmInfo => Opcode::SmInfo,
            Request::StreamBeginCapture { .. } => Opcode::StreamBeginCapture,
            Request::StreamEndCapture { .. } => Opcode::StreamEndCapture,
            Request::GraphInstantiate { .. } => Opcode::GraphInstantiate,
            Request::GraphDestroy { .. } => Opcode::GraphDestroy,
            Request::GraphExecDestroy { .. } => Opcode::GraphExecDestroy,
            Request::GraphLaunch { .. } => Opcode::GraphLaunch,
        }
    }

    /// The header slot and the payload bytes (to be written into the following slots) of this
    /// request.
    pub fn encode(&self, seq: u64, stream: u64, flags: u16) -> (Command, &[u8]) {
        let mut args = [0u64; 5];
        let mut payload: &[u8] = &[];
        match *self {
            Request::MemAlloc { size } | Request::HostAlloc { size } => args[0] = size,
            Request::MemFree { ptr } => args[0] = ptr,
            Request::HostFree { handle } => args[0] = handle,
            Request::MemGetInfo
            | Request::Mark
            | Request::EventCreate
            | Request::SmInfo
            | Request::ContextLimits => {}
            Request::FuncAttributes { function } => args[0] = function,
            Request::Occupancy { function, query } => {
                args = match query {
                    OccupancyQuery::ActiveBlocks {
                        block_size,
                        dynamic_smem,
                        flags,
                    } => [function, 0, pack(block_size, dynamic_smem), flags as u64, 0],
                    OccupancyQuery::DynamicSmem { blocks, block_size } => {
                        [function, 1, pack(blocks, block_size), 0, 0]
                    }
                    OccupancyQuery::ActiveClusters {
                        block,
                        cluster,
                        dynamic_smem,
                        non_portable,
                    } => [
                        function,
                        pack(if non_portable { 3 } else { 2 }, dynamic_smem),
                        pack(block.x, block.y),
                        pack(block.z, cluster.x),
                        pack(cluster.y, cluster.z),
                    ],
                }
            }
            Request::CopyHtoD { dst, src, len } => {
                let (h, o) = src.encode();
                args = [dst, h, o, len, 0];
            }
            Request::CopyDtoH { dst, src, len } => {
                let (h, o) = dst.encode();
                args = [h, o, src, len, 0];
            }
            Request::CopyDtoD { dst, src, len } => args = [dst, src, len, 0, 0],
            Request::Memset {
                dst,
                value,
                elem_size,
                count,
            } => args = [dst, value as u64, elem_size as u64, count, 0],
            Request::ModuleData {
                staging_offset,
                len,
                last,
            } => args = [staging_offset, len, last as u64, 0, 0],
            Request::ModuleUnload { module } => args[0] = module,
            Request::GetFunction { module, name } | Request::ModuleGlobal { module, name } => {
                args = [module, name.len() as u64, 0, 0, 0];
                payload = name;
            }
            Request::ParamInfo { function, first } => args = [function, first as u64, 0, 0, 0],
            Request::DeviceAttributes { first } => args[0] = first as u64,
            Request::Launch {
                function,
                grid,
                block,
                shared_mem,
                cluster,
                params,
            } => {
                let plen = params.len() as u64;
                // A cluster rides in the high halves of the words holding block.y, block.z
                // and the parameters' length, which CUDA's limits keep below 2^16 (block.y and
                // block.z) and the protocol below 2^13 (the length).
                let (blocks_yz, smem_len) = match cluster {
                    None => (pack(block.y, block.z), pack(shared_mem, plen as u32)),
                    Some(c) => (
                        (block.y as u64 & 0xffff)
                            | (block.z as u64 & 0xffff) << 16
                            | (c.dims.z as u64 & 0xff) << 32
                            | (c.non_portable as u64) << 40,
                        shared_mem as u64
                            | plen << 32
                            | (c.dims.x as u64 & 0xff) << 48
                            | (c.dims.y as u64 & 0xff) << 56,
                    ),
                };
                args = [
                    function,
                    pack(grid.x, grid.y),
                    pack(grid.z, block.x),
                    blocks_yz,
                    smem_len,
                ];
                payload = params;
            }
            Request::StreamCreate { priority } => args[0] = priority as u32 as u64,
            Request::StreamDestroy { stream }
            | Request::StreamBeginCapture { stream }
            | Request::StreamEndCapture { stream } => args[0] = stream,
            Request::GraphInstantiate { graph } | Request::GraphDestroy { graph } => {
                args[0] = graph
            }
            Request::GraphExecDestroy { exec } | Request::GraphLaunch { exec } => args[0] = exec,
            Request::EventDestroy { event }
            | Request::StreamWaitEvent { event }
            | Request::EventRecord { event } => args[0] = event,
            Request::EventElapsed { start, end } => args = [start, end, 0, 0, 0],
            Request::SetMemLimit { bytes } => args[0] = bytes,
            Request::SetPriority { level } => args[0] = level as u64,
            Request::SetSmShare { percent } | Request::ReserveSms { percent } => {
                args[0] = percent as u64
            }
        }
        let cmd = Command {
            opcode: self.opcode() as u16,
            flags,
            extra_slots: payload.len().div_ceil(SLOT_BYTES) as u16,
            reserved: 0,
            seq,
            stream,
            args,
        };
        (cmd, payload)
    }

    /// Decodes a command copied out of shared memory. `payload` holds the bytes of its
    /// `extra_slots` continuation slots. Anything a well-behaved client never sends is an error.
    pub fn decode<'a>(cmd: &Command, payload: &'a [u8]) -> Result<Request<'a>> {
        let op = Opcode::from_u16(cmd.opcode).ok_or_else(|| {
            Error::invalid_value(format!(
                "command {} has unknown opcode {}",
                cmd.seq, cmd.opcode
            ))
        })?;
        if cmd.flags & !flags::ALL != 0 || cmd.reserved != 0 {
            return Err(Error::invalid_value(format!(
                "command {} ({op:?}) has undefined flag or reserved bits set",
                cmd.seq
            )));
        }
        if cmd.flags & flags::MARK != 0 && !op.is_stream_ordered() {
            return Err(Error::invalid_value(format!(
                "command {} ({op:?}) is not stream-ordered and cannot carry MARK",
                cmd.seq
            )));
        }
        if payload.len() != cmd.extra_slots as usize * SLOT_BYTES {
            return Err(Error::internal("payload length does not match extra_slots"));
        }
        let a = cmd.args;
        let expect_payload = |len: u64, max: usize, what: &str| -> Result<&'a [u8]> {
            if len as usize > max || len as usize > payload.len() {
                return Err(Error::invalid_value(format!(
                    "command {}: {what} of {len} bytes is longer than {max} bytes or than its payload",
                    cmd.seq
                )));
            }
            if payload.len() != (len as usize).div_ceil(SLOT_BYTES) * SLOT_BYTES {
                return Err(Error::invalid_value(format!(
                    "command {}: {} payload slots for {len} bytes of {what}",
                    cmd.seq, cmd.extra_slots
                )));
            }
            Ok(&payload[..len as usize])
        };
        if !matches!(
            op,
            Opcode::GetFunction | Opcode::ModuleGlobal | Opcode::Launch | Opcode::LaunchCluster
        ) && cmd.extra_slots != 0
        {
            return Err(Error::invalid_value(format!(
                "command {} ({op:?}) takes no payload but has {} extra slots",
                cmd.seq, cmd.extra_slots
            )));
        }
        let req = match op {
            Opcode::MemAlloc => Request::MemAlloc { size: a[0] },
            Opcode::MemFree => Request::MemFree { ptr: a[0] },
            Opcode::MemGetInfo => Request::MemGetInfo,
            Opcode::HostAlloc => Request::HostAlloc { size: a[0] },
            Opcode::HostFree => Request::HostFree { handle: a[0] },
            Opcode::CopyHtoD => Request::CopyHtoD {
                dst: a[0],
                src: HostRef::decode(a[1], a[2]),
                len: a[3],
            },
            Opcode::CopyDtoH => Request::CopyDtoH {
                dst: HostRef::decode(a[0], a[1]),
                src: a[2],
                len: a[3],
            },
            Opcode::CopyDtoD => Request::CopyDtoD {
                dst: a[0],
                src: a[1],
                len: a[2],
            },
            Opcode::Memset => {
                let elem_size = match a[2] {
                    1 => 1,
                    4 => 4,
                    n => {
                        return Err(Error::invalid_value(format!(
                            "memset element size {n} is neither 1 nor 4"
                        )));
                    }
                };
                if a[1] > u32::MAX as u64 || (elem_size == 1 && a[1] > 0xff) {
                    return Err(Error::invalid_value(format!(
                        "memset value {:#x} does not fit its {elem_size}-byte element",
                        a[1]
                    )));
                }
                Request::Memset {
                    dst: a[0],
                    value: a[1] as u32,
                    elem_size,
                    count: a[3],
                }
            }
            Opcode::ModuleData => Request::ModuleData {
                staging_offset: a[0],
                len: a[1],
                last: match a[2] {
                    0 => false,
                    1 => true,
                    _ => return Err(Error::invalid_value("module data 'last' is not 0 or 1")),
                },
            },
            Opcode::ModuleUnload => Request::ModuleUnload { module: a[0] },
            Opcode::GetFunction => Request::GetFunction {
                module: a[0],
                name: expect_payload(a[1], MAX_NAME_BYTES, "kernel name")?,
            },
            Opcode::ParamInfo => Request::ParamInfo {
                function: a[0],
                first: u32::try_from(a[1])
                    .map_err(|_| Error::invalid_value("parameter index out of range"))?,
            },
            Opcode::DeviceAttributes => Request::DeviceAttributes {
                first: u32::try_from(a[0])
                    .map_err(|_| Error::invalid_value("attribute index out of range"))?,
            },
            Opcode::ContextLimits => Request::ContextLimits,
            Opcode::ModuleGlobal => Request::ModuleGlobal {
                module: a[0],
                name: expect_payload(a[1], MAX_NAME_BYTES, "global name")?,
            },
            Opcode::FuncAttributes => Request::FuncAttributes { function: a[0] },
            Opcode::Occupancy => Request::Occupancy {
                function: a[0],
                query: occupancy_query(cmd.seq, a)?,
            },
            Opcode::Launch | Opcode::LaunchCluster => {
                let (gx, gy) = unpack(a[1]);
                let (gz, bx) = unpack(a[2]);
                let field =
                    |word: u64, shift: u32, bits: u32| (word >> shift & ((1 << bits) - 1)) as u32;
                // The words `Request::encode` lays out: a cluster launch packs block.y, block.z
                // and the parameters' length tighter, and its cluster beside them.
                let (by, bz, shared_mem, plen, cluster) = if op == Opcode::Launch {
                    let (by, bz) = unpack(a[3]);
                    let (shared_mem, plen) = unpack(a[4]);
                    (by, bz, shared_mem, plen, None)
                } else {
                    if a[3] >> 41 != 0 {
                        return Err(Error::invalid_value(format!(
                            "command {}: a cluster launch with unknown bits set",
                            cmd.seq
                        )));
                    }
                    let cluster = Cluster {
                        dims: Dim3 {
                            x: field(a[4], 48, 8),
                            y: field(a[4], 56, 8),
                            z: field(a[3], 32, 8),
                        },
                        non_portable: a[3] >> 40 & 1 == 1,
                    };
                    let (by, bz) = (field(a[3], 0, 16), field(a[3], 16, 16));
                    (by, bz, a[4] as u32, field(a[4], 32, 16), Some(cluster))
                };
                Request::Launch {
                    function: a[0],
                    grid: Dim3 {
                        x: gx,
                        y: gy,
                        z: gz,
                    },
                    block: Dim3 {
                        x: bx,
                        y: by,
                        z: bz,
                    },
                    shared_mem,
                    cluster,
                    params: expect_payload(plen as u64, MAX_PARAM_BYTES, "kernel parameters")?,
                }
            }
            Opcode::StreamCreate => Request::StreamCreate {
                priority: u32::try_from(a[0])
                    .map_err(|_| Error::invalid_value("stream priority out of range"))?
                    as i32,
            },
            Opcode::StreamDestroy => Request::StreamDestroy { stream: a[0] },
            Opcode::Mark => Request::Mark,
            Opcode::EventCreate => Request::EventCreate,
            Opcode::EventDestroy => Request::EventDestroy { event: a[0] },
            Opcode::EventRecord => Request::EventRecord { event: a[0] },
            Opcode::StreamWaitEvent => Request::StreamWaitEvent { event: a[0] },
            Opcode::EventElapsed => Request::EventElapsed {
                start: a[0],
                end: a[1],
            },
            Opcode::SetMemLimit => Request::SetMemLimit { bytes: a[0] },
            Opcode::SetPriority => Request::SetPriority {
                level: match a[0] {
                    0 => PRIORITY_NORMAL,
                    1 => PRIORITY_BELOW_NORMAL,
                    n => {
                        return Err(Error::invalid_value(format!(
                            "client priority {n} is neither 0 (normal) nor 1 (below normal)"
                        )));
                    }
                },
            },
            Opcode::SetSmShare => Request::SetSmShare {
                percent: percent(a[0], "an SM share")?,
            },
            Opcode::ReserveSms => Request::ReserveSms {
                percent: percent(a[0], "an SM reservation")?,
            },
            Opcode::SmInfo => Request::SmInfo,
            Opcode::StreamBeginCapture => Request::StreamBeginCapture { stream: a[0] },
            Opcode::StreamEndCapture => Request::StreamEndCapture { stream: a[0] },
            Opcode::GraphInstantiate => Request::GraphInstantiate { graph: a[0] },
            Opcode::GraphDestroy => Request::GraphDestroy { graph: a[0] },
            Opcode::GraphExecDestroy => Request::GraphExecDestroy { exec: a[0] },
            Opcode::GraphLaunch => Request::GraphLaunch { exec: a[0] },
        };
        Ok(req)
    }
}

/// The query of an occupancy command's arguments.
fn occupancy_query(seq: u64, a: [u64; 5]) -> Result<OccupancyQuery> {
    let (kind, smem) = unpack(a[1]);
    let unused = |used: usize| a[used..].iter().any(|v| *v != 0);
    let q = match kind {
        0 if smem == 0 && !unused(4) && a[3] <= u32::MAX as u64 => {
            let (block_size, dynamic_smem) = unpack(a[2]);
            OccupancyQuery::ActiveBlocks {
                block_size,
                dynamic_smem,
                flags: a[3] as u32,
            }
        }
        1 if smem == 0 && !unused(3) => {
            let (blocks, block_size) = unpack(a[2]);
            OccupancyQuery::DynamicSmem { blocks, block_size }
        }
        2 | 3 => {
            let (bx, by) = unpack(a[2]);
            let (bz, cx) = unpack(a[3]);
            let (cy, cz) = unpack(a[4]);
            OccupancyQuery::ActiveClusters {
                block: Dim3 {
                    x: bx,
                    y: by,
                    z: bz,
                },
                cluster: Dim3 {
                    x: cx,
                    y: cy,
                    z: cz,
                },
                dynamic_smem: smem,
                non_portable: kind == 3,
            }
        }
        _ => {
            return Err(Error::invalid_value(format!(
                "command {seq}: occupancy query {kind} is not one of 0 (active blocks), 1 \
                 (dynamic shared memory), 2 or 3 (active clusters, 3 past the portable size), or \
                 has stray arguments"
            )));
        }
    };
    Ok(q)
}

/// A percentage of the device's SMs: 1 to 100.
fn percent(v: u64, what: &str) -> Result<u32> {
    match v {
        1..=100 => Ok(v as u32),
        _ => Err(Error::invalid_value(format!(
            "{what} of {v}% (it must be 1 to 100)"
        ))),
    }
}

fn pack(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

fn unpack(v: u64) -> (u32, u32) {
    (v as u32, (v >> 32) as u32)
}

/// What a completion reports.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionKind {
    /// The answer to the command with this sequence number.
    Reply = 0,
    /// Work that was accepted earlier failed while running (a kernel fault); `seq` names the
    /// command, and every later command of this client fails the same way.
    AsyncError = 1,
}

/// One completion slot as it sits in shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct Completion {
    /// The sequence number of the command this answers.
    pub seq: u64,
    /// A [`Status`] value.
    pub status: u32,
    /// A [`CompletionKind`] value.
    pub kind: u32,
    /// Reply values (meaning per opcode). In an error, `values[0]` is the CUDA driver's result
    /// behind it ([`Error::cuda_result`]), 0 if none.
    pub values: [u64; 4],
    /// Bytes of `data` in use.
    pub data_len: u32,
    /// Zero.
    pub reserved: u32,
    /// The error message (UTF-8), or reply data.
    pub data: [u8; COMPLETION_DATA_BYTES],
}

const _: () = assert!(size_of::<Completion>() == 256);

impl Default for Completion {
    fn default() -> Self {
        Zeroable::zeroed()
    }
}

impl Completion {
    /// A successful reply to `seq` carrying `values`.
    pub fn reply(seq: u64, values: [u64; 4]) -> Completion {
        Completion {
            seq,
            values,
            ..Default::default()
        }
    }

    /// A failed reply (or an asynchronous error) for `seq`; the message is cut to fit.
    pub fn error(seq: u64, kind: CompletionKind, err: &Error) -> Completion {
        let mut c = Completion {
            seq,
            status: err.status as u32,
            kind: kind as u32,
            values: [u64::from(err.cuda_result.unwrap_or(0)), 0, 0, 0],
            ..Default::default()
        };
        let mut len = err.message.len().min(COMPLETION_DATA_BYTES);
        while !err.message.is_char_boundary(len) {
            len -= 1;
        }
        c.data[..len].copy_from_slice(&err.message.as_bytes()[..len]);
        c.data_len = len as u32;
        c
    }

    /// `Ok(values)` for a successful reply, the error it carries otherwise.
    pub fn result(&self) -> Result<[u64; 4]> {
        match Status::from_u32(self.status) {
            Some(Status::Success) => Ok(self.values),
            Some(status) => {
                Err(Error::new(status, self.message()).with_cuda_result(self.values[0] as u32))
            }
            None => Err(Error::internal(format!(
                "completion of command {} has unknown status {}",
                self.seq, self.status
            ))),
        }
    }

    /// The data area as reply bytes.
    pub fn data(&self) -> &[u8] {
        &self.data[..(self.data_len as usize).min(COMPLETION_DATA_BYTES)]
    }

    /// The data area as a message.
    pub fn message(&self) -> String {
        String::from_utf8_lossy(self.data()).into_owned()
    }
}

/// The layout of one kernel parameter, as `cuFuncGetParamInfo` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Pod, Zeroable)]
#[repr(C)]
pub struct ParamInfo {
    /// Byte offset in the packed parameter buffer.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
}

/// One device attribute: a `CUdevice_attribute` value and what the device answers for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Pod, Zeroable)]
#[repr(C)]
pub struct DeviceAttribute {
    /// The attribute (`CUdevice_attribute`).
    pub attribute: i32,
    /// Its value.
    pub value: i32,
}

const _: () =
    assert!(ATTRIBUTES_PER_REPLY * size_of::<DeviceAttribute>() + 16 <= COMPLETION_DATA_BYTES);

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(req: Request<'_>) {
        let (cmd, payload) = req.encode(42, 7, flags::REPLY);
        let mut padded = payload.to_vec();
        padded.resize(cmd.extra_slots as usize * SLOT_BYTES, 0);
        let back = Request::decode(&cmd, &padded).unwrap();
        assert_eq!(back, req);
        assert_eq!(cmd.seq, 42);
        assert_eq!(cmd.stream, 7);
    }

    #[test]
    fn every_request_round_trips() {
        let params = [7u8; 100];
        let name = b"saxpy_f32";
        for req in [
            Request::MemAlloc { size: 1 << 40 },
            Request::MemFree { ptr: 0x1234 },
            Request::MemGetInfo,
            Request::ContextLimits,
            Request::ModuleGlobal {
                module: 3,
                name: b"table",
            },
            Request::FuncAttributes { function: 5 },
            Request::Occupancy {
                function: 5,
                query: OccupancyQuery::ActiveBlocks {
                    block_size: 256,
                    dynamic_smem: 1 << 16,
                    flags: 1,
                },
            },
            Request::Occupancy {
                function: 5,
                query: OccupancyQuery::DynamicSmem {
                    blocks: 3,
                    block_size: 128,
                },
            },
            Request::Occupancy {
                function: 5,
                query: OccupancyQuery::ActiveClusters {
                    block: Dim3 { x: 128, y: 2, z: 1 },
                    cluster: Dim3 { x: 2, y: 1, z: 1 },
                    dynamic_smem: 4096,
                    non_portable: false,
                },
            },
            Request::Occupancy {
                function: 6,
                query: OccupancyQuery::ActiveClusters {
                    block: Dim3 { x: 128, y: 1, z: 1 },
                    cluster: Dim3 { x: 16, y: 1, z: 1 },
                    dynamic_smem: 0,
                    non_portable: true,
                },
            },
            Request::HostAlloc { size: 4096 },
            Request::HostFree { handle: 9 },
            Request::CopyHtoD {
                dst: 1,
                src: HostRef::Staging { offset: 64 },
                len: 3,
            },
            Request::CopyHtoD {
                dst: 1,
                src: HostRef::Buffer {
                    handle: 5,
                    offset: 6,
                },
                len: 3,
            },
            Request::CopyDtoH {
                dst: HostRef::Buffer {
                    handle: 5,
                    offset: 0,
                },
                src: 77,
                len: 3,
            },
            Request::CopyDtoD {
                dst: 1,
                src: 2,
                len: 3,
            },
            Request::Memset {
                dst: 8,
                value: 0xdeadbeef,
                elem_size: 4,
                count: 10,
            },
            Request::Memset {
                dst: 8,
                value: 0xab,
                elem_size: 1,
                count: 10,
            },
            Request::ModuleData {
                staging_offset: 0,
                len: 10,
                last: true,
            },
            Request::ModuleUnload { module: 3 },
            Request::GetFunction {
                module: 3,
                name: name.as_slice(),
            },
            Request::ParamInfo {
                function: 4,
                first: 25,
            },
            Request::DeviceAttributes { first: 50 },
            Request::Launch {
                function: 4,
                grid: Dim3 { x: 1, y: 2, z: 3 },
                block: Dim3 {
                    x: 128,
                    y: 1,
                    z: u32::MAX,
                },
                shared_mem: 48 << 10,
                cluster: None,
                params: &params,
            },
            Request::Launch {
                function: 4,
                grid: Dim3 { x: 1, y: 1, z: 1 },
                block: Dim3 { x: 1, y: 1, z: 1 },
                shared_mem: 0,
                cluster: None,
                params: &[],
            },
            Request::Launch {
                function: 4,
                grid: Dim3 { x: 132, y: 4, z: 2 },
                block: Dim3 { x: 384, y: 2, z: 1 },
                shared_mem: 227 << 10,
                cluster: Some(Cluster {
                    dims: Dim3 { x: 4, y: 2, z: 2 },
                    non_portable: true,
                }),
                params: &params,
            },
            Request::Launch {
                function: 4,
                grid: Dim3 { x: 2, y: 1, z: 1 },
                block: Dim3 { x: 1, y: 1, z: 1 },
                shared_mem: 0,
                cluster: Some(Cluster {
                    dims: Dim3 { x: 2, y: 1, z: 1 },
                    non_portable: false,
                }),
                params: &[],
            },
            Request::StreamCreate { priority: -5 },
            Request::StreamDestroy { stream: 11 },
            Request::Mark,
            Request::EventCreate,
            Request::EventDestroy { event: 2 },
            Request::EventRecord { event: 2 },
            Request::StreamWaitEvent { event: 2 },
            Request::EventElapsed { start: 1, end: 2 },
            Request::SetMemLimit { bytes: 1 << 30 },
            Request::SetPriority { level: 1 },
            Request::SetSmShare { percent: 25 },
            Request::ReserveSms { percent: 50 },
            Request::SmInfo,
            Request::StreamBeginCapture { stream: 11 },
            Request::StreamEndCapture { stream: 11 },
            Request::GraphInstantiate { graph: 12 },
            Request::GraphDestroy { graph: 12 },
            Request::GraphExecDestroy { exec: 13 },
            Request::GraphLaunch { exec: 13 },
        ] {
            roundtrip(req);
        }
    }

    #[test]
    fn hostile_commands_are_errors_not_panics() {
        // Flip every bit pattern we can think of through each field: decode must answer.
        let mut x: u64 = 1;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let cmd = Command {
                opcode: (x % 36) as u16,
                flags: ((x >> 8) % 8) as u16,
                extra_slots: if i % 2 == 0 {
                    0
                } else {
                    ((x >> 16) % 80) as u16
                },
                reserved: (i % 97 == 0) as u16,
                seq: i,
                stream: x,
                args: [
                    x,
                    x.rotate_left(7),
                    (x >> 3) % 5,
                    x % 4100,
                    x.rotate_right(9),
                ],
            };
            let payload = vec![0xa5u8; cmd.extra_slots as usize * SLOT_BYTES];
            if let Ok(req) = Request::decode(&cmd, &payload) {
                // Whatever decodes must re-encode to the same header.
                let (again, _) = req.encode(cmd.seq, cmd.stream, cmd.flags);
                assert_eq!(again.opcode, cmd.opcode);
                assert_eq!(again.extra_slots, cmd.extra_slots);
            }
        }
    }

    #[test]
    fn specific_rejections_name_the_problem() {
        let (mut cmd, _) = Request::MemGetInfo.encode(1, 0, 0);
        cmd.opcode = 999;
        let e = Request::decode(&cmd, &[]).unwrap_err();
        assert!(e.message.contains("unknown opcode 999"), "{e}");

        let (mut cmd, _) = Request::FuncAttributes { function: 1 }.encode(1, 0, 0);
        cmd.opcode = Opcode::Occupancy as u16;
        cmd.args[1] = 4;
        let e = Request::decode(&cmd, &[]).unwrap_err();
        assert!(e.message.contains("occupancy query 4"), "{e}");
        cmd.args[1] = 1;
        cmd.args[4] = 9;
        let e = Request::decode(&cmd, &[]).unwrap_err();
        assert!(e.message.contains("stray arguments"), "{e}");

        let (cmd, _) = Request::MemAlloc { size: 1 }.encode(1, 0, flags::MARK);
        assert!(
            Request::decode(&cmd, &[])
                .unwrap_err()
                .message
                .contains("MARK")
        );

        let params = [0u8; 8];
        let launch = Request::Launch {
            function: 1,
            grid: Dim3::default(),
            block: Dim3::default(),
            shared_mem: 0,
            cluster: None,
            params: &params,
        };
        let (mut cmd, _) = launch.encode(1, 0, 0);
        cmd.args[4] = pack(0, 5000);
        let e = Request::decode(&cmd, &[0; 64]).unwrap_err();
        assert!(e.message.contains("kernel parameters of 5000 bytes"), "{e}");
        cmd.args[4] = pack(0, 8);
        cmd.extra_slots = 2;
        assert!(
            Request::decode(&cmd, &[0; 128]).is_err(),
            "too many payload slots"
        );

        let (mut cmd, _) = Request::Memset {
            dst: 0,
            value: 0,
            elem_size: 1,
            count: 1,
        }
        .encode(1, 0, 0);
        cmd.args[1] = 0x100;
        assert!(Request::decode(&cmd, &[]).is_err(), "byte memset of 0x100");
        cmd.args[1] = 0;
        cmd.args[2] = 2;
        assert!(Request::decode(&cmd, &[]).is_err(), "element size 2");
    }

    #[test]
    fn completions_carry_errors_and_cut_long_messages() {
        let long = "é".repeat(300);
        let c = Completion::error(5, CompletionKind::AsyncError, &Error::invalid_value(long));
        let e = c.result().unwrap_err();
        assert_eq!(e.status, Status::InvalidValue);
        assert!(e.message.len() <= COMPLETION_DATA_BYTES);
        assert!(e.message.chars().all(|ch| ch == 'é'));
        assert_eq!(
            e.cuda_result, None,
            "an error of mps's own carries no CUDA result"
        );
        // The driver's own result travels beside the status that folds it with others.
        let no_binary = Error::new(Status::InvalidImage, "no code for sm_90").with_cuda_result(209);
        let e = Completion::error(6, CompletionKind::Reply, &no_binary)
            .result()
            .unwrap_err();
        assert_eq!(e, no_binary);
        assert_eq!(
            Completion::reply(1, [1, 2, 3, 4]).result().unwrap(),
            [1, 2, 3, 4]
        );
        let mut bad = Completion::reply(1, [0; 4]);
        bad.status = 1000;
        assert_eq!(bad.result().unwrap_err().status, Status::Internal);
    }
}
