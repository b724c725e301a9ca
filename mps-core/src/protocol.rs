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
//! Every command is declared once, in the table below (the crate's `command_table` module says
//! what it derives); how a field kind travels is its `Arg` implementation beside its type. The
//! tests are at the end.

use bytemuck::{Pod, Zeroable};

use crate::command_table::{Arg, Source};
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

crate::command_table::commands! {
    /// What a command asks for.
    pub enum Opcode;

    /// A decoded, statically valid command. Handles and ranges are not yet checked against the
    /// client's tables: that is the server's job.
    #[derive(Clone, Debug, PartialEq)]
    #[allow(missing_docs)]
    pub enum Request<'a> {
        /// Allocate device memory.
        MemAlloc = 1 => "mem_alloc" [] { size: u64 = 0 },
        /// Free device memory.
        MemFree = 2 => "mem_free" [waits] { ptr: u64 = 0 },
        /// Free and total device memory, as the client's limit shows them.
        MemGetInfo = 3 => "mem_get_info" [],
        /// Create a host buffer shared with the server: replies `[handle, length, its device
        /// address (where kernels and copies reach it), 0]`, and sends its descriptor.
        HostAlloc = 4 => "host_alloc" [waits] { size: u64 = 0 },
        /// Free a host buffer.
        HostFree = 5 => "host_free" [waits] { handle: u64 = 0 },
        /// Copy host to device.
        CopyHtoD = 6 => "copy_htod" [ordered runs] { dst: u64 = 0, src: HostRef = 1, len: u64 = 3 },
        /// Copy device to host.
        CopyDtoH = 7 => "copy_dtoh" [ordered runs] { dst: HostRef = 0, src: u64 = 2, len: u64 = 3 },
        /// Copy device to device.
        CopyDtoD = 8 => "copy_dtod" [ordered runs] { copy: DeviceCopy = 0 },
        /// Fill device memory.
        Memset = 9 => "memset" [ordered runs] { fill: Fill = 0 },
        /// A chunk of a module image: `len` bytes in the staging area at `staging_offset`;
        /// `last` loads the image gathered so far and replies with the module handle.
        ModuleData = 10 => "module_data" [waits] {
            staging_offset: u64 = 0,
            len: u64 = 1,
            last: bool = 2,
        },
        /// Unload a module.
        ModuleUnload = 11 => "module_unload" [waits] { module: u64 = 0 },
        /// Look up a kernel by name.
        GetFunction = 12 => "get_function" [payload] { module: u64 = 0, name: &'a [u8] = 1 },
        /// A kernel's parameter layout, starting at parameter `first`.
        ParamInfo = 13 => "param_info" [] { function: u64 = 0, first: u32 = 1 },
        /// Launch a kernel (in clusters of blocks, where the launch says so, as
        /// `LaunchCluster`: the session checks the clusters against the grid and the device).
        Launch = 14 => "launch" [ordered payload runs] { spec: LaunchSpec<u64, &'a [u8]> = 0 }
            | /// Launch a kernel in clusters of blocks.
            LaunchCluster = 39 => "launch_cluster",
        /// Create a stream.
        StreamCreate = 15 => "stream_create" [] { priority: i32 = 0 },
        /// Destroy a stream.
        StreamDestroy = 16 => "stream_destroy" [waits] { stream: u64 = 0 },
        /// Publish stream progress (nothing else; used to synchronise a stream).
        Mark = 17 => "mark" [ordered],
        /// Create an event.
        EventCreate = 18 => "event_create" [],
        /// Destroy an event.
        EventDestroy = 19 => "event_destroy" [] { event: u64 = 0 },
        /// Record an event in the command's stream. The client knows the record completed once
        /// the stream's progress reaches the command's sequence number.
        EventRecord = 20 => "event_record" [ordered] { event: u64 = 0 },
        /// Make a stream wait for an event.
        StreamWaitEvent = 21 => "stream_wait_event" [ordered] { event: u64 = 0 },
        /// Time between two recorded events.
        EventElapsed = 22 => "event_elapsed" [] { start: u64 = 0, end: u64 = 1 },
        /// Lower the client's device-memory limit to `bytes` (it can never rise above what the
        /// server set).
        SetMemLimit = 23 => "set_mem_limit" [] { bytes: u64 = 0 },
        /// Lower the client's priority to `level` ([`PRIORITY_NORMAL`] or
        /// [`PRIORITY_BELOW_NORMAL`]; it can never rise above what the server set).
        SetPriority = 24 => "set_priority" [] { level: u32 = 0 if priority_level },
        /// Lower the client's share of the device's SMs to `percent` (1..=100; it can never
        /// rise above what the server set). Replies like [`Request::SmInfo`].
        SetSmShare = 25 => "set_sm_share" [] { percent: u32 = 0 if sm_percent },
        /// Reserve `percent` (1..=100) of the device's SMs for this client alone, within the
        /// ceiling the operator set. Replies like [`Request::SmInfo`].
        ReserveSms = 26 => "reserve_sms" [] { percent: u32 = 0 if sm_percent },
        /// The SMs this client's work runs on now: replies `[sms, device sms, share percent,
        /// reserved percent]`.
        SmInfo = 27 => "sm_info" [],
        /// Start recording a stream's work into a graph instead of running it.
        StreamBeginCapture = 28 => "stream_begin_capture" [] { stream: u64 = 0 },
        /// Stop recording a stream's work; replies `[graph handle]`.
        StreamEndCapture = 29 => "stream_end_capture" [] { stream: u64 = 0 },
        /// Make an executable graph of a captured one; replies `[executable graph handle]`.
        GraphInstantiate = 30 => "graph_instantiate" [] { graph: u64 = 0 },
        /// Destroy a captured graph.
        GraphDestroy = 31 => "graph_destroy" [] { graph: u64 = 0 },
        /// Destroy an executable graph.
        GraphExecDestroy = 32 => "graph_exec_destroy" [] { exec: u64 = 0 },
        /// Run an executable graph in the command's stream.
        GraphLaunch = 33 => "graph_launch" [ordered] { exec: u64 = 0 },
        /// A page of the device's attributes (`cuDeviceGetAttribute`'s), from the `first`th of
        /// those the server reports: a reply's data holds up to [`ATTRIBUTES_PER_REPLY`]
        /// [`DeviceAttribute`]s and its values are `[in this page, reported in all, 1 if the
        /// UUID is known else 0, 0]`; the UUID (`cuDeviceGetUuid`'s 16 bytes) follows the page
        /// in the data when known.
        DeviceAttributes = 34 => "device_attributes" [] { first: u32 = 0 },
        /// The context's stream priority range and limits (`cuCtxGetLimit`'s): replies `[least
        /// priority, greatest priority (each as the i32 bits in a u64), a mask of the limits
        /// reported (bit n: `CUlimit` n), 0]` and, in its data, [`CONTEXT_LIMITS`]
        /// little-endian u64 values (0 where not reported).
        ContextLimits = 35 => "context_limits" [],
        /// A kernel's attributes (`cuFuncGetAttribute`'s): replies `[FUNC_ATTRIBUTES, a mask of
        /// those reported (bit n: attribute n), 0, 0]` and, in its data, [`FUNC_ATTRIBUTES`]
        /// little-endian i32 values.
        FuncAttributes = 36 => "func_attributes" [] { function: u64 = 0 },
        /// An occupancy figure of a kernel (`cuOccupancy*`'s): replies `[the figure, 0, 0, 0]`.
        Occupancy = 37 => "occupancy" [] { function: u64 = 0, query: OccupancyQuery = 1 },
        /// The device address and size of a module's global variable `name`: replies
        /// `[address, size, 0, 0]`.
        ModuleGlobal = 38 => "module_global" [payload] { module: u64 = 0, name: &'a [u8] = 1 },
        /// The allocation of this client that holds the device address `ptr`
        /// (`cuMemGetAddressRange`'s): replies `[base, size, 0, 0]`.
        MemGetAddressRange = 40 => "mem_get_address_range" [] { ptr: u64 = 0 },
        /// The granularity of reservations and physical allocations on the server's device
        /// (`cuMemGetAllocationGranularity`'s minimum): replies `[granularity, 0, 0, 0]`.
        VmGranularity = 41 => "vm_granularity" [],
        /// Reserve `size` bytes of device address space aligned to `align` (0: the
        /// granularity), never overlapping another client's (`cuMemAddressReserve`): replies
        /// `[address, 0, 0, 0]`.
        VmReserve = 42 => "vm_reserve" [] { size: u64 = 0, align: u64 = 1 },
        /// Free a reservation that no mapping uses any more (`cuMemAddressFree`).
        VmFree = 43 => "vm_free" [] { va: u64 = 0 },
        /// Create `size` bytes of physical device memory (`cuMemCreate`): replies
        /// `[handle, 0, 0, 0]`.
        VmCreate = 44 => "vm_create" [] { size: u64 = 0 },
        /// Release a physical allocation (`cuMemRelease`): its memory goes back once no mapping
        /// uses it.
        VmRelease = 45 => "vm_release" [] { handle: u64 = 0 },
        /// Map `size` bytes of a physical allocation, from `offset`, at `va` inside one of the
        /// client's reservations (`cuMemMap`).
        VmMap = 46 => "vm_map" [] { va: u64 = 0, size: u64 = 1, handle: u64 = 2, offset: u64 = 3 },
        /// Unmap the mapping at `va` of `size` bytes (`cuMemUnmap`), once the client's work is
        /// done with it.
        VmUnmap = 47 => "vm_unmap" [waits] { va: u64 = 0, size: u64 = 1 },
        /// Make the mappings covering `[va, va + size)` readable and writable by the device
        /// (`cuMemSetAccess`).
        VmSetAccess = 48 => "vm_set_access" [] { va: u64 = 0, size: u64 = 1 },
        /// The physical allocation mapped at `va` (`cuMemRetainAllocationHandle`'s): replies
        /// `[handle, size of the allocation, 0, 0]`.
        VmHandleAt = 49 => "vm_handle_at" [] { va: u64 = 0 },
        /// The names of a module's kernels (`cuModuleEnumerateFunctions`'), each followed by a
        /// NUL, from byte `offset` of their concatenation: replies `[its length, the kernel
        /// count, 0, 0]` and, in its data, up to [`COMPLETION_DATA_BYTES`] of it.
        ModuleFunctionNames = 50 => "module_function_names" [] { module: u64 = 0, offset: u64 = 1 },
        /// A host function's place in its stream (`cuLaunchHostFunc`): once the work before it
        /// is done the server publishes the command's progress (it must carry `MARK`), and the
        /// stream then waits until the 8-byte word at `gate`, in a host buffer, is at least
        /// `value`, which the client writes once the function has returned. A stream names one
        /// gate word for all its host functions; the server opens every gate (writes all ones)
        /// when the client goes away.
        HostWait = 51 => "host_wait" [ordered] { gate: HostRef = 0, value: u64 = 2 },
        /// Encode a tiled TMA descriptor (`cuTensorMapEncodeTiled`) of a tensor in the client's
        /// device memory: replies `[TENSOR_MAP_BYTES, 0, 0, 0]` and, in its data, the
        /// [`TENSOR_MAP_BYTES`]-byte `CUtensorMap`, which names the server context's address.
        TensorMapEncodeTiled = 52 => "tensor_map_encode_tiled" [payload] { map: TensorMapTiled = 0 },
        /// A TMA descriptor, `map` (its [`TENSOR_MAP_BYTES`]), made to name `address` in the
        /// client's memory instead (`cuTensorMapReplaceAddress`): replies like
        /// [`Request::TensorMapEncodeTiled`].
        TensorMapReplaceAddress = 53 => "tensor_map_replace_address" [payload] { address: u64 = 0, map: &'a [u8] = 1 },
    }
}

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

/// The bytes of a TMA descriptor (`CUtensorMap`), as CUDA lays it out: opaque, 64-byte aligned.
pub const TENSOR_MAP_BYTES: usize = 128;
/// The most dimensions a TMA descriptor describes.
pub const TENSOR_MAP_MAX_RANK: usize = 5;

const _: () = assert!(TENSOR_MAP_BYTES <= COMPLETION_DATA_BYTES);

/// A tiled TMA descriptor's tensor (`cuTensorMapEncodeTiled`'s parameters). The enumerations
/// keep CUDA's values (`CUtensorMapDataType`, `CUtensorMapInterleave`, `CUtensorMapSwizzle`,
/// `CUtensorMapL2promotion`, `CUtensorMapFloatOOBfill`), each of which fits in a byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapTiled {
    /// The element type.
    pub data_type: u8,
    /// The dimensions described, 1..=[`TENSOR_MAP_MAX_RANK`] (the server refuses others).
    pub rank: u8,
    /// The interleave layout.
    pub interleave: u8,
    /// The shared-memory swizzle.
    pub swizzle: u8,
    /// The L2 promotion.
    pub l2_promotion: u8,
    /// The fill of out-of-bounds elements.
    pub oob_fill: u8,
    /// The tensor's device address, in the client's memory.
    pub address: u64,
    /// Its dimensions, strides and box; entries past the rank are 0.
    pub shape: TensorShape,
}

/// The arrays of a [`TensorMapTiled`], as they travel in its command's payload (little-endian,
/// in this order); only the first `rank` entries (`rank - 1` strides) mean anything.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Pod, Zeroable)]
pub struct TensorShape {
    /// Elements along each dimension, the innermost first (`globalDim`).
    pub dims: [u64; TENSOR_MAP_MAX_RANK],
    /// Bytes between consecutive indices of dimensions 1.. (`globalStrides`).
    pub strides: [u64; TENSOR_MAP_MAX_RANK - 1],
    /// The box a copy moves, in elements along each dimension (`boxDim`).
    pub box_dims: [u32; TENSOR_MAP_MAX_RANK],
    /// The step between elements a copy moves, along each dimension (`elementStrides`).
    pub element_strides: [u32; TENSOR_MAP_MAX_RANK],
}

/// A tiled tensor map travels as three words, its address, its six small fields (a byte each,
/// the data type lowest) and the length of its [`TensorShape`], which fills the payload.
impl<'p> Arg<'p> for TensorMapTiled {
    #[inline]
    fn put<'s>(&'s self, args: &mut [u64], payload: &mut &'s [u8]) {
        args[0] = self.address;
        args[1] = u64::from_le_bytes([
            self.data_type,
            self.rank,
            self.interleave,
            self.swizzle,
            self.l2_promotion,
            self.oob_fill,
            0,
            0,
        ]);
        args[2] = size_of::<TensorShape>() as u64;
        *payload = bytemuck::bytes_of(&self.shape);
    }

    #[inline]
    fn take(args: &[u64], from: &Source<'p>, field: &'static str) -> Result<TensorMapTiled> {
        let small = args[1].to_le_bytes();
        if small[6..] != [0, 0] {
            return Err(from.error(field, format_args!("has unknown bits in {:#x}", args[1])));
        }
        let n = size_of::<TensorShape>();
        if args[2] != n as u64 {
            return Err(from.error(field, format_args!("shape of {} bytes, not {n}", args[2])));
        }
        let shape = bytemuck::pod_read_unaligned(from.payload(field, args[2], n)?);
        Ok(TensorMapTiled {
            data_type: small[0],
            rank: small[1],
            interleave: small[2],
            swizzle: small[3],
            l2_promotion: small[4],
            oob_fill: small[5],
            address: args[0],
            shape,
        })
    }
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

/// A host reference travels as two words: the buffer's handle (0: the staging area) and the
/// offset.
impl Arg<'_> for HostRef {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        (args[0], args[1]) = match *self {
            HostRef::Staging { offset } => (0, offset),
            HostRef::Buffer { handle, offset } => (handle, offset),
        };
    }

    #[inline]
    fn take(args: &[u64], _: &Source<'_>, _: &'static str) -> Result<HostRef> {
        Ok(match (args[0], args[1]) {
            (0, offset) => HostRef::Staging { offset },
            (handle, offset) => HostRef::Buffer { handle, offset },
        })
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

/// Client priority: served as the operator set it.
pub const PRIORITY_NORMAL: u32 = 0;
/// Client priority: served after normal clients (its streams get the device's least urgent
/// priority, its session thread a lower CPU priority).
pub const PRIORITY_BELOW_NORMAL: u32 = 1;

/// One kernel launch, as every layer sees it: the protocol's request (`F` the function's
/// handle, `P` the parameter bytes in the command's payload), the client's posting (the
/// parameters gathered as the slots are written), the backend's work (the backend's own
/// function, the parameters borrowed or owned) and a batched run's shape. Each layer changes
/// what `F` and `P` are with [`LaunchSpec::map`]; the geometry is moved, never copied field by
/// field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchSpec<F, P> {
    /// The kernel.
    pub function: F,
    /// Grid, in blocks.
    pub grid: Dim3,
    /// Block, in threads.
    pub block: Dim3,
    /// Dynamic shared memory bytes per block.
    pub shared_mem: u32,
    /// The clusters the blocks are grouped in, if any (checked against the grid).
    pub cluster: Option<Cluster>,
    /// The packed parameter buffer, laid out by the function's parameter info.
    pub params: P,
}

impl<F, P> LaunchSpec<F, P> {
    /// The same launch of `function(self.function)` with parameters `params(self.params)`.
    pub fn map<G, Q>(
        self,
        function: impl FnOnce(F) -> G,
        params: impl FnOnce(P) -> Q,
    ) -> LaunchSpec<G, Q> {
        LaunchSpec {
            function: function(self.function),
            grid: self.grid,
            block: self.block,
            shared_mem: self.shared_mem,
            cluster: self.cluster,
            params: params(self.params),
        }
    }

    /// The same launch with parameters `params`, and the parameters it had.
    pub fn with_params<Q>(self, params: Q) -> (LaunchSpec<F, Q>, P) {
        let LaunchSpec {
            function,
            grid,
            block,
            shared_mem,
            cluster,
            params: had,
        } = self;
        let launch = LaunchSpec {
            function,
            grid,
            block,
            shared_mem,
            cluster,
            params,
        };
        (launch, had)
    }

    /// The opcode it travels under: a launch in clusters has its own.
    pub fn opcode(&self) -> Opcode {
        match self.cluster {
            None => Opcode::Launch,
            Some(_) => Opcode::LaunchCluster,
        }
    }

    /// The same launch borrowing its function and parameters.
    pub fn as_ref(&self) -> LaunchSpec<&F, &P> {
        LaunchSpec {
            function: &self.function,
            grid: self.grid,
            block: self.block,
            shared_mem: self.shared_mem,
            cluster: self.cluster,
            params: &self.params,
        }
    }
}

/// A launch fills all five words. A cluster rides in the high halves of the words holding
/// block.y, block.z and the parameters' length, which CUDA's limits keep below 2^16 (block.y
/// and block.z) and the protocol below 2^13 (the length); such a launch is a `LaunchCluster`.
impl<'p> Arg<'p> for LaunchSpec<u64, &'p [u8]> {
    #[inline]
    fn put<'s>(&'s self, args: &mut [u64], payload: &mut &'s [u8]) {
        let LaunchSpec {
            function,
            grid,
            block,
            shared_mem,
            cluster,
            params,
        } = *self;
        let plen = params.len() as u64;
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
        args[..5].copy_from_slice(&[
            function,
            pack(grid.x, grid.y),
            pack(grid.z, block.x),
            blocks_yz,
            smem_len,
        ]);
        *payload = params;
    }

    #[inline]
    fn take(a: &[u64], from: &Source<'p>, _: &'static str) -> Result<Self> {
        let (gx, gy) = unpack(a[1]);
        let (gz, bx) = unpack(a[2]);
        let field = |word: u64, shift: u32, bits: u32| (word >> shift & ((1 << bits) - 1)) as u32;
        let (by, bz, shared_mem, plen, cluster) = if from.opcode == Opcode::Launch {
            let (by, bz) = unpack(a[3]);
            let (shared_mem, plen) = unpack(a[4]);
            (by, bz, shared_mem, plen, None)
        } else {
            if a[3] >> 41 != 0 {
                return Err(Error::invalid_value(format!(
                    "command {}: a cluster launch with unknown bits set",
                    from.seq
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
        Ok(LaunchSpec {
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
            params: from.payload("kernel parameters", plen as u64, MAX_PARAM_BYTES)?,
        })
    }

    #[inline]
    fn opcode(&self, _: Opcode) -> Opcode {
        LaunchSpec::opcode(self)
    }
}

/// An occupancy query fills the four words after the function: its kind (0: active blocks, 1:
/// dynamic shared memory, 2 or 3: active clusters, 3 past the portable size) with, for
/// clusters, the dynamic shared memory in its high half, then the geometry packed in pairs.
impl Arg<'_> for OccupancyQuery {
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        let words = match *self {
            OccupancyQuery::ActiveBlocks {
                block_size,
                dynamic_smem,
                flags,
            } => [0, pack(block_size, dynamic_smem), flags as u64, 0],
            OccupancyQuery::DynamicSmem { blocks, block_size } => {
                [1, pack(blocks, block_size), 0, 0]
            }
            OccupancyQuery::ActiveClusters {
                block,
                cluster,
                dynamic_smem,
                non_portable,
            } => [
                pack(if non_portable { 3 } else { 2 }, dynamic_smem),
                pack(block.x, block.y),
                pack(block.z, cluster.x),
                pack(cluster.y, cluster.z),
            ],
        };
        args[..4].copy_from_slice(&words);
    }

    fn take(a: &[u64], from: &Source<'_>, _: &'static str) -> Result<OccupancyQuery> {
        let (kind, smem) = unpack(a[0]);
        let unused = |used: usize| a[used..4].iter().any(|v| *v != 0);
        let q = match kind {
            0 if smem == 0 && !unused(3) && a[2] <= u32::MAX as u64 => {
                let (block_size, dynamic_smem) = unpack(a[1]);
                OccupancyQuery::ActiveBlocks {
                    block_size,
                    dynamic_smem,
                    flags: a[2] as u32,
                }
            }
            1 if smem == 0 && !unused(2) => {
                let (blocks, block_size) = unpack(a[1]);
                OccupancyQuery::DynamicSmem { blocks, block_size }
            }
            2 | 3 => {
                let (bx, by) = unpack(a[1]);
                let (bz, cx) = unpack(a[2]);
                let (cy, cz) = unpack(a[3]);
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
                    "command {}: occupancy query {kind} is not one of 0 (active blocks), 1 \
                     (dynamic shared memory), 2 or 3 (active clusters, 3 past the portable \
                     size), or has stray arguments",
                    from.seq
                )));
            }
        };
        Ok(q)
    }
}

/// A copy between two ranges of device memory, as the request, the backend's work and a batched
/// run's shape all see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCopy {
    /// Destination address.
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Bytes.
    pub len: u64,
}

/// Three words: destination, source, length.
impl Arg<'_> for DeviceCopy {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        args[..3].copy_from_slice(&[self.dst, self.src, self.len]);
    }

    #[inline]
    fn take(a: &[u64], _: &Source<'_>, _: &'static str) -> Result<DeviceCopy> {
        Ok(DeviceCopy {
            dst: a[0],
            src: a[1],
            len: a[2],
        })
    }
}

/// A fill of device memory: `count` elements of `elem_size` (1 or 4) bytes set to `value`, as
/// the request, the backend's work and a batched run's shape all see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    /// Destination address.
    pub dst: u64,
    /// Value (the low byte for 1-byte elements).
    pub value: u32,
    /// 1 or 4.
    pub elem_size: u8,
    /// Elements.
    pub count: u64,
}

impl Fill {
    /// Bytes it fills, or `None` on overflow.
    pub fn bytes(&self) -> Option<u64> {
        self.count.checked_mul(self.elem_size as u64)
    }
}

/// Four words: destination, value, element size, count. The element is 1 or 4 bytes, and the
/// value fits it.
impl Arg<'_> for Fill {
    #[inline]
    fn put(&self, args: &mut [u64], _: &mut &[u8]) {
        args[..4].copy_from_slice(&[
            self.dst,
            self.value as u64,
            self.elem_size as u64,
            self.count,
        ]);
    }

    fn take(a: &[u64], from: &Source<'_>, _: &'static str) -> Result<Fill> {
        let elem_size = match a[2] {
            1 => 1,
            4 => 4,
            n => return Err(from.error("element size", format_args!("{n} is neither 1 nor 4"))),
        };
        if a[1] > u32::MAX as u64 || (elem_size == 1 && a[1] > 0xff) {
            return Err(from.error(
                "value",
                format_args!("{:#x} does not fit its {elem_size}-byte element", a[1]),
            ));
        }
        Ok(Fill {
            dst: a[0],
            value: a[1] as u32,
            elem_size,
            count: a[3],
        })
    }
}

/// A client priority is [`PRIORITY_NORMAL`] or [`PRIORITY_BELOW_NORMAL`].
fn priority_level(from: &Source<'_>, field: &str, level: &u32) -> Result<()> {
    match *level {
        PRIORITY_NORMAL | PRIORITY_BELOW_NORMAL => Ok(()),
        n => Err(from.error(
            field,
            format_args!("{n} is neither 0 (normal) nor 1 (below normal)"),
        )),
    }
}

/// A percentage of the device's SMs: 1 to 100.
fn sm_percent(from: &Source<'_>, field: &str, percent: &u32) -> Result<()> {
    match percent {
        1..=100 => Ok(()),
        v => Err(from.error(field, format_args!("of {v}% (it must be 1 to 100)"))),
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
        let mut seen = Vec::new();
        for req in [
            Request::MemAlloc { size: 1 << 40 },
            Request::MemFree { ptr: 0x1234 },
            Request::MemGetInfo,
            Request::MemGetAddressRange { ptr: 0x1234 },
            Request::VmGranularity,
            Request::VmReserve {
                size: 1 << 21,
                align: 0,
            },
            Request::VmFree { va: 0x1234 },
            Request::VmCreate { size: 1 << 21 },
            Request::VmRelease { handle: 7 },
            Request::VmMap {
                va: 0x1000,
                size: 1 << 21,
                handle: 7,
                offset: 0,
            },
            Request::VmUnmap {
                va: 0x1000,
                size: 1 << 21,
            },
            Request::VmSetAccess {
                va: 0x1000,
                size: 1 << 21,
            },
            Request::VmHandleAt { va: 0x1000 },
            Request::ModuleFunctionNames {
                module: 3,
                offset: 200,
            },
            Request::HostWait {
                gate: HostRef::Buffer {
                    handle: 9,
                    offset: 16,
                },
                value: 3,
            },
            Request::TensorMapEncodeTiled {
                map: TensorMapTiled {
                    data_type: 7,
                    rank: 2,
                    interleave: 0,
                    swizzle: 3,
                    l2_promotion: 2,
                    oob_fill: 0,
                    address: 0x7f00_0000_1000,
                    shape: TensorShape {
                        dims: [64, 32, 0, 0, 0],
                        strides: [256, 0, 0, 0],
                        box_dims: [32, 16, 0, 0, 0],
                        element_strides: [1, 1, 0, 0, 0],
                    },
                },
            },
            Request::TensorMapReplaceAddress {
                address: 0x7f00_0000_2000,
                map: &[3; TENSOR_MAP_BYTES],
            },
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
                copy: DeviceCopy {
                    dst: 1,
                    src: 2,
                    len: 3,
                },
            },
            Request::Memset {
                fill: Fill {
                    dst: 8,
                    value: 0xdeadbeef,
                    elem_size: 4,
                    count: 10,
                },
            },
            Request::Memset {
                fill: Fill {
                    dst: 8,
                    value: 0xab,
                    elem_size: 1,
                    count: 10,
                },
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
                spec: LaunchSpec {
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
            },
            Request::Launch {
                spec: LaunchSpec {
                    function: 4,
                    grid: Dim3 { x: 1, y: 1, z: 1 },
                    block: Dim3 { x: 1, y: 1, z: 1 },
                    shared_mem: 0,
                    cluster: None,
                    params: &[],
                },
            },
            Request::Launch {
                spec: LaunchSpec {
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
            },
            Request::Launch {
                spec: LaunchSpec {
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
            seen.push(req.opcode());
            roundtrip(req);
        }
        // A command added to the table is added here too.
        for op in Opcode::ALL {
            assert!(seen.contains(&op), "no request of {op:?} round-trips");
        }
    }

    #[test]
    fn an_address_range_query_is_its_pointer_in_the_first_word() {
        let req = Request::MemGetAddressRange { ptr: 0xdead_0000 };
        let (cmd, payload) = req.encode(3, 0, flags::REPLY);
        assert_eq!(
            (cmd.opcode, cmd.args, cmd.extra_slots, payload.len()),
            (40, [0xdead_0000, 0, 0, 0, 0], 0, 0)
        );
        assert_eq!(Request::decode(&cmd, &[]).unwrap(), req);
        let op = Opcode::MemGetAddressRange;
        assert!(!op.is_stream_ordered() && !op.takes_payload() && !op.may_wait());
        let mut marked = cmd;
        marked.flags |= flags::MARK;
        let e = Request::decode(&marked, &[]).unwrap_err();
        assert!(e.message.contains("cannot carry MARK"), "{e}");
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
                // Every opcode the table declares, and one unknown value on each side.
                opcode: (x % (Opcode::ALL.len() as u64 + 2)) as u16,
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
            spec: LaunchSpec {
                function: 1,
                grid: Dim3::default(),
                block: Dim3::default(),
                shared_mem: 0,
                cluster: None,
                params: &params,
            },
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

        let fill = Fill {
            dst: 0,
            value: 0,
            elem_size: 1,
            count: 1,
        };
        let (mut cmd, _) = Request::Memset { fill }.encode(1, 0, 0);
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
