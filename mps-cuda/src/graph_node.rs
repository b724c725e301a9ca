//! The work of one node of a graph built node by node: CUDA's parameter structures read into it
//! as CUDA reads them (a kernel node's parameter values copied at the add, from `kernelParams`
//! or an `extra` buffer laid out as the kernel's parameters are; a memset's and a copy's
//! description checked, what mps cannot serve refused, naming it once), and given to a stream
//! when a plan of the graph is captured (`graph_plan`).
//!
//! Served: kernels (with the launch attributes `cuLaunchKernelEx` takes), memsets (1-, 2- and
//! 4-byte elements, 1D or 2D), copies (device to device, and between the host and the device
//! through page-locked memory, which each launch reads or writes again, as a capture allows),
//! empty nodes and child graphs (`graph_build`'s). Every other node type (host functions,
//! events, conditional nodes, memory nodes, ...) is refused with `CUDA_ERROR_NOT_SUPPORTED`.

use std::sync::Arc;

use mps_core::protocol::{Cluster, Dim3};

use crate::abi::graph::{
    ChildGraphNodeParams, KERNEL_V1_BYTES, KernelNodeParams, MEMORY_DEVICE, MEMORY_HOST,
    MEMORY_UNIFIED, MEMSET_V1_BYTES, Memcpy3D, MemsetNodeParams, NODE_BATCH_MEM_OP,
    NODE_CONDITIONAL, NODE_EMPTY, NODE_EVENT_RECORD, NODE_EXT_SEMAS_SIGNAL, NODE_EXT_SEMAS_WAIT,
    NODE_GRAPH, NODE_HOST, NODE_KERNEL, NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_MEMCPY, NODE_MEMSET,
    NODE_WAIT_EVENT, NodeParams,
};
use crate::abi::{CUdevice, CUresult, launch_attribute};
use crate::connection::{Connection, Res, Stream};
use crate::context::{given_or_current, to_cucontext};
use crate::ffi::check;
use crate::kernel_queries::allows_non_portable_clusters;
use crate::launch::{AttributeAsks, asks, extra_buffer};
use crate::log;
use crate::module::function_obj;
use crate::objects::FunctionObj;
use crate::pointer::pinned_device_address;

/// What a node does.
#[derive(Clone, Debug)]
pub(crate) enum Work {
    Kernel(Kernel),
    Memset(Memset),
    /// Boxed: a copy's description is most of a node's size.
    Copy(Box<Copy>),
    Empty,
    /// A graph that the node holds, built or captured.
    Child(usize),
}

impl Work {
    /// Its `CUgraphNodeType`.
    pub(crate) fn node_type(&self) -> u32 {
        match self {
            Work::Kernel(_) => NODE_KERNEL,
            Work::Memset(_) => NODE_MEMSET,
            Work::Copy(_) => NODE_MEMCPY,
            Work::Empty => NODE_EMPTY,
            Work::Child(_) => NODE_GRAPH,
        }
    }

    /// The device it runs on, if any.
    pub(crate) fn device(&self) -> Option<CUdevice> {
        match self {
            Work::Kernel(k) => Some(k.device),
            Work::Memset(m) => Some(m.device),
            Work::Copy(c) => Some(c.device),
            Work::Empty | Work::Child(_) => None,
        }
    }
}

/// A kernel launch, with its parameter values copied.
#[derive(Debug)]
pub(crate) struct Kernel {
    /// The function handle, and the kernel handle if it was given as a `CUkernel`.
    func: usize,
    kern: usize,
    obj: Arc<FunctionObj>,
    device: CUdevice,
    ctx: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    /// The parameter values, laid out as the kernel's parameters are, in aligned words.
    args: Vec<u64>,
    /// The address of each parameter in `args`: the `kernelParams` that
    /// `cuGraphKernelNodeGetParams` hands out.
    ptrs: Vec<usize>,
    /// The node's attributes (`cuGraphKernelNodeSetAttribute`), by id, each its 64-byte value,
    /// and the cluster dimension among them; kept across new parameters, as CUDA keeps them.
    attrs: Vec<(u32, [u8; ATTRIBUTE_BYTES])>,
    cluster: Option<Dim3>,
}

/// The size of a `CUlaunchAttributeValue` (`CUkernelNodeAttrValue`).
const ATTRIBUTE_BYTES: usize = 64;

impl Kernel {
    fn with_args(mut self, args: Vec<u64>) -> Kernel {
        let base = args.as_ptr() as usize;
        self.ptrs = self
            .obj
            .params
            .iter()
            .map(|p| base + p.offset as usize)
            .collect();
        self.args = args;
        self
    }
}

impl Kernel {
    /// The handle it was given by: its function, or its kernel.
    fn handle(&self) -> usize {
        if self.func != 0 { self.func } else { self.kern }
    }

    /// Keeps `old`'s attributes: new parameters leave a node's attributes as they were.
    fn keeping_attributes_of(mut self, old: &Kernel) -> Kernel {
        self.attrs = old.attrs.clone();
        self.cluster = old.cluster;
        self
    }
}

impl Clone for Kernel {
    fn clone(&self) -> Kernel {
        Kernel {
            obj: self.obj.clone(),
            args: Vec::new(),
            ptrs: Vec::new(),
            attrs: self.attrs.clone(),
            ..*self
        }
        .with_args(self.args.clone())
    }
}

/// A memset of `width` elements of `element_size` bytes in each of `height` rows, `pitch`
/// bytes apart.
#[derive(Clone, Debug)]
pub(crate) struct Memset {
    device: CUdevice,
    ctx: usize,
    dst: u64,
    pitch: usize,
    value: u32,
    element_size: u32,
    width: usize,
    height: usize,
}

/// A copy, as the program described it (`CUDA_MEMCPY3D`), checked.
#[derive(Clone, Debug)]
pub(crate) struct Copy {
    device: CUdevice,
    ctx: usize,
    params: Raw3D,
    src: Side,
    dst: Side,
}

/// A `CUDA_MEMCPY3D` kept for `cuGraphMemcpyNodeGetParams`.
#[derive(Clone, Copy, Debug)]
struct Raw3D(Memcpy3D);

// SAFETY: its pointers are addresses that this library only hands back or gives to a copy,
// never dereferences on its own; any thread may hold them.
unsafe impl Send for Raw3D {}
// SAFETY: as above.
unsafe impl Sync for Raw3D {}

/// One side of a copy: a page-locked host address or a device address, the first byte the copy
/// touches on that side, and its pitch and rows per slice.
#[derive(Clone, Copy, Debug)]
struct Side {
    host: bool,
    start: u64,
    pitch: u64,
    height: u64,
}

/// `new` in the place of `old`, of the same kind: a kernel keeps `old`'s attributes.
pub(crate) fn kept(old: &Work, new: Work) -> Work {
    match (old, new) {
        (Work::Kernel(o), Work::Kernel(n)) => Work::Kernel(n.keeping_attributes_of(o)),
        (_, new) => new,
    }
}

pub(crate) fn same_kind(a: &Work, b: &Work) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// The name of node type `t`, for refusals.
fn type_name(t: u32) -> String {
    match t {
        NODE_KERNEL => "kernel".into(),
        NODE_MEMCPY => "memcpy".into(),
        NODE_MEMSET => "memset".into(),
        NODE_HOST => "host (CU_GRAPH_NODE_TYPE_HOST)".into(),
        NODE_GRAPH => "child graph".into(),
        NODE_EMPTY => "empty".into(),
        NODE_WAIT_EVENT => "event wait (CU_GRAPH_NODE_TYPE_WAIT_EVENT)".into(),
        NODE_EVENT_RECORD => "event record (CU_GRAPH_NODE_TYPE_EVENT_RECORD)".into(),
        NODE_EXT_SEMAS_SIGNAL => "external semaphore signal".into(),
        NODE_EXT_SEMAS_WAIT => "external semaphore wait".into(),
        NODE_MEM_ALLOC => "memory allocation (CU_GRAPH_NODE_TYPE_MEM_ALLOC)".into(),
        NODE_MEM_FREE => "memory free (CU_GRAPH_NODE_TYPE_MEM_FREE)".into(),
        NODE_BATCH_MEM_OP => "batch memory operation".into(),
        NODE_CONDITIONAL => "conditional (CU_GRAPH_NODE_TYPE_CONDITIONAL)".into(),
        other => format!("of type {other}"),
    }
}

/// Refuses a node type this library cannot run, naming it once.
fn refuse_type(t: u32) -> CUresult {
    let name = type_name(t);
    log::once(&format!("graph node type {t}"), || {
        format!(
            "a graph node {name} is not supported through mps (graphs built node by node hold \
             kernels, memsets, copies, empty nodes and child graphs); returning \
             CUDA_ERROR_NOT_SUPPORTED"
        )
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

// ----- reading the program's parameters -----

/// What a node's parameters ask for: work, or a child graph to clone or move into the node.
pub(crate) enum Parsed {
    Work(Work),
    Child { graph: usize, ownership: u32 },
}

/// The device and context handle of `ctx` (NULL: the current context).
fn device_of(ctx: usize) -> Res<(CUdevice, usize)> {
    let c = given_or_current(to_cucontext(ctx))?;
    Ok((c.device, c.handle))
}

/// A kernel node's parameters; `v2` for `CUDA_KERNEL_NODE_PARAMS_v2` (with `kern` and `ctx`).
///
/// # Safety
/// `p` must be NULL or readable as the structure `v2` names; its `kernelParams` or `extra` as
/// for `cuLaunchKernel`.
pub(crate) unsafe fn kernel(p: *const KernelNodeParams, v2: bool) -> Res<Work> {
    check(!p.is_null())?;
    let mut q = KernelNodeParams {
        func: 0,
        grid: [0; 3],
        block: [0; 3],
        shared_mem_bytes: 0,
        kernel_params: std::ptr::null_mut(),
        extra: std::ptr::null_mut(),
        kern: 0,
        ctx: 0,
    };
    let n = if v2 {
        size_of::<KernelNodeParams>()
    } else {
        KERNEL_V1_BYTES
    };
    // SAFETY: the caller guarantees `n` readable bytes; `q` has room for them.
    unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&raw mut q).cast::<u8>(), n) };
    let handle = if q.func != 0 { q.func } else { q.kern };
    check(handle != 0)?;
    check(q.grid.iter().chain(&q.block).all(|d| *d > 0))?;
    let obj = function_obj(handle)?;
    let (device, ctx) = device_of(q.ctx)?;
    let total = obj
        .params
        .last()
        .map_or(0, |p| (p.offset + p.size) as usize);
    let mut args = vec![0u64; total.div_ceil(8)];
    let bytes = args.as_mut_ptr().cast::<u8>();
    if !q.extra.is_null() {
        check(q.kernel_params.is_null())?;
        // SAFETY: the caller guarantees `extra` is a valid CU_LAUNCH_PARAM array.
        let (buf, len) = unsafe { extra_buffer(q.extra.cast()) }?;
        check(len >= total)?;
        // SAFETY: `total` <= `len` readable bytes at `buf`; `args` holds at least `total`.
        unsafe { std::ptr::copy_nonoverlapping(buf, bytes, total) };
    } else {
        check(obj.params.is_empty() || !q.kernel_params.is_null())?;
        for (i, param) in obj.params.iter().enumerate() {
            // SAFETY: the caller guarantees one pointer per parameter.
            let src = unsafe { *q.kernel_params.add(i) };
            check(!src.is_null())?;
            // SAFETY: the parameter is readable for its size; it lies inside `args`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.cast::<u8>(),
                    bytes.add(param.offset as usize),
                    param.size as usize,
                )
            };
        }
    }
    let k = Kernel {
        func: q.func,
        kern: if q.func == 0 { q.kern } else { 0 },
        obj,
        device,
        ctx,
        grid: q.grid,
        block: q.block,
        shared: q.shared_mem_bytes,
        args: Vec::new(),
        ptrs: Vec::new(),
        attrs: Vec::new(),
        cluster: None,
    };
    Ok(Work::Kernel(k.with_args(args)))
}

/// A memset node's parameters (`CUDA_MEMSET_NODE_PARAMS`) in context `ctx` (NULL: current).
///
/// # Safety
/// `p` must be NULL or readable for a `CUDA_MEMSET_NODE_PARAMS` (`_v1`).
pub(crate) unsafe fn memset(p: *const MemsetNodeParams, ctx: usize) -> Res<Work> {
    check(!p.is_null())?;
    // SAFETY: the caller guarantees the v1 fields are readable; `ctx` (past them) is not read.
    let (dst, pitch, value, element_size, width, height) = unsafe {
        (
            (&raw const (*p).dst).read(),
            (&raw const (*p).pitch).read(),
            (&raw const (*p).value).read(),
            (&raw const (*p).element_size).read(),
            (&raw const (*p).width).read(),
            (&raw const (*p).height).read(),
        )
    };
    const _: () = assert!(std::mem::offset_of!(MemsetNodeParams, height) < MEMSET_V1_BYTES);
    check(matches!(element_size, 1 | 2 | 4) && width > 0 && height > 0)?;
    check(dst % element_size as u64 == 0)?;
    let row = width
        .checked_mul(element_size as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    check(height == 1 || pitch >= row)?;
    // A value wider than its element is taken by its low bytes, as the driver takes it (XLA
    // passes its byte and 16-bit patterns broadcast to 32 bits).
    let (device, ctx) = device_of(ctx)?;
    Ok(Work::Memset(Memset {
        device,
        ctx,
        dst,
        pitch,
        value,
        element_size,
        width,
        height,
    }))
}

/// One side of a copy (`host`, `device`, `memory_type` and its offsets) on device `dev`.
fn side(
    memory_type: u32,
    host: u64,
    device: u64,
    (x, y, z, lod): (usize, usize, usize, usize),
    (pitch, height): (usize, usize),
    dev: CUdevice,
) -> Res<Side> {
    check(lod == 0)?;
    let (is_host, base) = match memory_type {
        MEMORY_HOST => (true, host),
        MEMORY_DEVICE => (false, device),
        // A unified address is page-locked host memory of this library's, or device memory.
        MEMORY_UNIFIED => (pinned_device_address(device, dev).is_some(), device),
        _ => {
            log::once("memcpy node memory type", || {
                format!(
                    "a memcpy graph node with memory type {memory_type} (an array) is not \
                     supported through mps; returning CUDA_ERROR_NOT_SUPPORTED"
                )
            });
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
    };
    check(base != 0)?;
    let (pitch, height) = (pitch as u64, height as u64);
    let start = base + x as u64 + y as u64 * pitch + z as u64 * pitch * height;
    Ok(Side {
        host: is_host,
        start,
        pitch,
        height,
    })
}

impl Copy {
    /// Each row it copies, as (source, destination, bytes).
    fn rows(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let p = &self.params.0;
        let (w, h, d) = (p.width_in_bytes as u64, p.height as u64, p.depth as u64);
        // Both sides contiguous: one range.
        let whole = (h == 1 || (self.src.pitch == w && self.dst.pitch == w))
            && (d == 1 || (self.src.height == h && self.dst.height == h));
        let (rows, len) = if whole { (1, w * h * d) } else { (h * d, w) };
        let at = move |s: &Side, r: u64| s.start + (r % h) * s.pitch + (r / h) * s.pitch * s.height;
        (0..rows).map(move |r| (at(&self.src, r), at(&self.dst, r), len))
    }

    /// The last byte past it on side `s`.
    fn end(&self, s: &Side) -> u64 {
        let p = &self.params.0;
        let (w, h, d) = (p.width_in_bytes as u64, p.height as u64, p.depth as u64);
        s.start + (d - 1) * s.pitch * s.height + (h - 1) * s.pitch + w
    }
}

/// Whether `[start, end)` lies in one page-locked host buffer of device `dev`.
fn page_locked(start: u64, end: u64, dev: CUdevice) -> bool {
    match (
        pinned_device_address(start, dev),
        pinned_device_address(end - 1, dev),
    ) {
        (Some(a), Some(b)) => b - a == end - 1 - start,
        _ => false,
    }
}

/// A memcpy node's parameters (`CUDA_MEMCPY3D`) in context `ctx` (NULL: current).
///
/// # Safety
/// `p` must be NULL or readable for a `CUDA_MEMCPY3D`.
pub(crate) unsafe fn memcpy(p: *const Memcpy3D, ctx: usize) -> Res<Work> {
    check(!p.is_null())?;
    // SAFETY: the caller guarantees it is readable.
    let c = unsafe { p.read() };
    check(c.width_in_bytes > 0 && c.height > 0 && c.depth > 0)?;
    let multi = c.height > 1 || c.depth > 1;
    let pitch = |pitch: usize| {
        if multi {
            pitch
        } else {
            pitch.max(c.width_in_bytes)
        }
    };
    check(!multi || (c.src_pitch >= c.width_in_bytes && c.dst_pitch >= c.width_in_bytes))?;
    check(c.depth == 1 || (c.src_height >= c.height && c.dst_height >= c.height))?;
    let (device, ctx) = device_of(ctx)?;
    let src = side(
        c.src_memory_type,
        c.src_host as u64,
        c.src_device,
        (c.src_x_in_bytes, c.src_y, c.src_z, c.src_lod),
        (pitch(c.src_pitch), c.src_height),
        device,
    )?;
    let dst = side(
        c.dst_memory_type,
        c.dst_host as u64,
        c.dst_device,
        (c.dst_x_in_bytes, c.dst_y, c.dst_z, c.dst_lod),
        (pitch(c.dst_pitch), c.dst_height),
        device,
    )?;
    let copy = Copy {
        device,
        ctx,
        params: Raw3D(c),
        src,
        dst,
    };
    let refuse = |what: &str| {
        log::once(&format!("memcpy node {what}"), || {
            format!(
                "a memcpy graph node {what} is not supported through mps (a graph copies \
                 between the device and page-locked host memory, which each launch reads or \
                 writes again, or within the device); returning CUDA_ERROR_NOT_SUPPORTED"
            )
        });
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    };
    if src.host && dst.host {
        return refuse("from host memory to host memory");
    }
    for s in [&src, &dst].into_iter().filter(|s| s.host) {
        if !page_locked(s.start, copy.end(s), device) {
            return refuse("through pageable host memory");
        }
    }
    Ok(Work::Copy(Box::new(copy)))
}

/// A node's parameters in the generic form (`CUgraphNodeParams`).
///
/// # Safety
/// `p` must be NULL or readable for a `CUgraphNodeParams`, its parameters as each type's are.
pub(crate) unsafe fn node_params(p: *const NodeParams) -> Res<Parsed> {
    check(!p.is_null())?;
    // SAFETY: the caller guarantees it is readable.
    let np = unsafe { &*p };
    check(np.reserved0 == [0; 3] && np.reserved2 == 0)?;
    // SAFETY: each arm reads the member its type names, which the caller guarantees valid.
    unsafe {
        Ok(match np.type_ {
            NODE_KERNEL => Parsed::Work(kernel(&raw const np.params.kernel, true)?),
            NODE_MEMSET => {
                let m = &raw const np.params.memset;
                Parsed::Work(memset(m, (&raw const (*m).ctx).read())?)
            }
            NODE_MEMCPY => {
                let m = np.params.memcpy;
                check(m.flags == 0 && m.reserved == 0)?;
                Parsed::Work(memcpy(&raw const np.params.memcpy.copy, m.copy_ctx)?)
            }
            NODE_EMPTY => Parsed::Work(Work::Empty),
            NODE_GRAPH => {
                let ChildGraphNodeParams { graph, ownership } = np.params.graph;
                Parsed::Child { graph, ownership }
            }
            other => return Err(refuse_type(other)),
        })
    }
}

/// Gives `work` to `stream` of `conn` (capturing).
pub(crate) fn submit(work: &Work, conn: &Connection, stream: Stream) -> Res<()> {
    let dev = conn.ordinal();
    let device_address = |p: u64| pinned_device_address(p, dev).unwrap_or(p);
    match work {
        Work::Kernel(k) => {
            let (_, layout) = k.obj.fetched(conn)?;
            let cluster = match k.cluster {
                Some(dims) => Some(Cluster {
                    dims,
                    non_portable: allows_non_portable_clusters(k.handle(), dev)?,
                }),
                None => None,
            };
            let values: Vec<*const u8> = k.ptrs.iter().map(|p| *p as *const u8).collect();
            // SAFETY: one pointer per parameter, each into `k.args`, alive through the call.
            unsafe {
                conn.launch(
                    layout,
                    k.grid,
                    k.block,
                    k.shared,
                    cluster,
                    stream,
                    values.as_ptr(),
                )
            }
        }
        Work::Memset(m) => {
            let row = (m.width * m.element_size as usize) as u64;
            let (rows, count) = if m.height == 1 || m.pitch as u64 == row {
                (1, (m.width * m.height) as u64)
            } else {
                (m.height as u64, m.width as u64)
            };
            for r in 0..rows {
                let at = device_address(m.dst + r * m.pitch as u64);
                fill(conn, stream, at, m.value, m.element_size, count)?;
            }
            Ok(())
        }
        Work::Copy(c) => {
            for (src, dst, len) in c.rows() {
                match (c.src.host, c.dst.host) {
                    // SAFETY: page-locked host memory of this library's (checked when the node
                    // was made), which a graph reads again at each launch.
                    (true, false) => unsafe {
                        conn.memcpy_htod(
                            device_address(dst),
                            src as *const u8,
                            len as usize,
                            stream,
                        )
                    }?,
                    // SAFETY: as above, written at each launch.
                    (false, true) => unsafe {
                        conn.memcpy_dtoh(dst as *mut u8, device_address(src), len as usize, stream)
                    }?,
                    _ => conn.memcpy_dtod(device_address(dst), device_address(src), len, stream)?,
                }
            }
            Ok(())
        }
        Work::Empty | Work::Child(_) => Ok(()),
    }
}

/// One memset the server does: bytes or 32-bit words, each (address, value, count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    D8(u64, u8, u64),
    D32(u64, u32, u64),
}

/// The memsets that set `count` elements of `size` bytes at `dst` to `value`. The server sets
/// bytes and 32-bit words: 16-bit elements are set as words, with an element at either end that
/// is not in a whole aligned word set as its two bytes.
fn fills(dst: u64, value: u32, size: u32, count: u64) -> Vec<Fill> {
    match size {
        1 => vec![Fill::D8(dst, value as u8, count)],
        4 => vec![Fill::D32(dst, value, count)],
        _ => {
            let [lo, hi] = (value as u16).to_le_bytes();
            if lo == hi {
                return vec![Fill::D8(dst, lo, count * 2)];
            }
            let one = |at: u64| [Fill::D8(at, lo, 1), Fill::D8(at + 1, hi, 1)];
            let mut out = Vec::new();
            let (mut at, mut left) = (dst, count);
            if at % 4 != 0 {
                out.extend(one(at));
                at += 2;
                left -= 1;
            }
            if left >= 2 {
                let word = value & 0xffff;
                out.push(Fill::D32(at, word | word << 16, left / 2));
            }
            if left % 2 == 1 {
                out.extend(one(at + (left - 1) * 2));
            }
            out
        }
    }
}

/// Sets `count` elements of `size` bytes at `dst` to `value` in `stream` (see [`fills`]).
fn fill(conn: &Connection, stream: Stream, dst: u64, value: u32, size: u32, count: u64) -> Res<()> {
    fills(dst, value, size, count)
        .into_iter()
        .try_for_each(|f| match f {
            Fill::D8(at, v, n) => conn.memset_d8(at, v, n, stream),
            Fill::D32(at, v, n) => conn.memset_d32(at, v, n, stream),
        })
}

// ----- what the node functions hand back -----

impl Kernel {
    /// Its parameters as `CUDA_KERNEL_NODE_PARAMS_v2`: `kernelParams` points into its copy of
    /// the values, valid while it keeps them.
    pub(crate) fn node_params(&self) -> KernelNodeParams {
        KernelNodeParams {
            func: self.handle(),
            grid: self.grid,
            block: self.block,
            shared_mem_bytes: self.shared,
            kernel_params: self.ptrs.as_ptr().cast_mut().cast(),
            extra: std::ptr::null_mut(),
            kern: self.kern,
            ctx: self.ctx,
        }
    }

    /// The value of attribute `id`: the one set, or zeros where none was.
    pub(crate) fn attribute(&self, id: u32) -> [u8; ATTRIBUTE_BYTES] {
        self.attrs
            .iter()
            .find(|(a, _)| *a == id)
            .map_or([0; ATTRIBUTE_BYTES], |(_, v)| *v)
    }

    /// Sets attribute `a`.
    pub(crate) fn set_attribute(&mut self, a: Attribute) {
        if a.id == launch_attribute::CLUSTER_DIMENSION {
            self.cluster = a.cluster;
        }
        self.attrs.retain(|(id, _)| *id != a.id);
        self.attrs.push((a.id, a.value));
    }

    /// Takes `other`'s attributes (`cuGraphKernelNodeCopyAttributes`).
    pub(crate) fn copy_attributes_from(&mut self, other: &Kernel) {
        self.attrs = other.attrs.clone();
        self.cluster = other.cluster;
    }
}

/// A kernel node's attribute, as `cuGraphKernelNodeSetAttribute` sets it.
pub(crate) struct Attribute {
    id: u32,
    value: [u8; ATTRIBUTE_BYTES],
    /// The cluster dimension it asks for, if it is one.
    cluster: Option<Dim3>,
}

/// Attribute `id` of the 64 bytes at `value`: what a plain launch does (no cluster, cooperation
/// off), a hint or permission (priority, access-policy window, ...: kept and read back, as
/// `cuLaunchKernelEx` drops them), or a cluster dimension, with which the node's kernel is
/// launched; any other is refused, named once.
///
/// # Safety
/// `value` must be NULL or readable for a `CUlaunchAttributeValue`.
pub(crate) unsafe fn attribute(id: u32, value: *const u8) -> Res<Attribute> {
    check(!value.is_null())?;
    // As a `CUlaunchAttribute`: the id, padding, the value.
    let mut a = [0u32; 2 + ATTRIBUTE_BYTES / 4];
    a[0] = id;
    // SAFETY: the caller guarantees 64 readable bytes; `a` has room for them after two words.
    unsafe { std::ptr::copy_nonoverlapping(value, a.as_mut_ptr().add(2).cast(), ATTRIBUTE_BYTES) };
    // SAFETY: a whole attribute.
    let cluster = match unsafe { asks(a.as_ptr()) } {
        AttributeAsks::Nothing | AttributeAsks::Hint => None,
        AttributeAsks::Clusters(dims) => Some(dims),
        AttributeAsks::Unsupported => {
            log::once(&format!("kernel node attribute {id}"), || {
                format!(
                    "cuGraphKernelNodeSetAttribute: launch attribute {id} is not supported \
                     through mps; returning CUDA_ERROR_NOT_SUPPORTED"
                )
            });
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
    };
    let mut bytes = [0u8; ATTRIBUTE_BYTES];
    // SAFETY: as above.
    unsafe { std::ptr::copy_nonoverlapping(value, bytes.as_mut_ptr(), ATTRIBUTE_BYTES) };
    Ok(Attribute {
        id,
        value: bytes,
        cluster,
    })
}

impl Memset {
    /// Its parameters as `CUDA_MEMSET_NODE_PARAMS_v2`.
    pub(crate) fn node_params(&self) -> MemsetNodeParams {
        MemsetNodeParams {
            dst: self.dst,
            pitch: self.pitch,
            value: self.value,
            element_size: self.element_size,
            width: self.width,
            height: self.height,
            ctx: self.ctx,
        }
    }

    /// The context it was made in.
    pub(crate) fn ctx(&self) -> usize {
        self.ctx
    }
}

impl Copy {
    /// Its parameters, as the program gave them.
    pub(crate) fn params(&self) -> Memcpy3D {
        self.params.0
    }

    /// The context it was made in.
    pub(crate) fn ctx(&self) -> usize {
        self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_bit_memsets_are_words_with_the_odd_ends_set_as_bytes() {
        use Fill::{D8, D32};
        assert_eq!(fills(0x100, 0xab, 1, 7), [D8(0x100, 0xab, 7)]);
        assert_eq!(fills(0x100, 7, 4, 3), [D32(0x100, 7, 3)]);
        // Both bytes alike: bytes.
        assert_eq!(fills(0x102, 0x5555, 2, 3), [D8(0x102, 0x55, 6)]);
        // Aligned, an even count: words only.
        assert_eq!(fills(0x100, 0x1234, 2, 4), [D32(0x100, 0x1234_1234, 2)]);
        // Off a word, then an odd count left: an element at each end.
        assert_eq!(
            fills(0x102, 0x1234, 2, 4),
            [
                D8(0x102, 0x34, 1),
                D8(0x103, 0x12, 1),
                D32(0x104, 0x1234_1234, 1),
                D8(0x108, 0x34, 1),
                D8(0x109, 0x12, 1),
            ]
        );
        // One element off a word; one on it.
        assert_eq!(
            fills(0x102, 0x1234, 2, 1),
            [D8(0x102, 0x34, 1), D8(0x103, 0x12, 1)]
        );
        assert_eq!(
            fills(0x100, 0x1234, 2, 1),
            [D8(0x100, 0x34, 1), D8(0x101, 0x12, 1)]
        );
    }

    fn copy(src: Side, dst: Side, w: usize, h: usize, d: usize) -> Copy {
        // SAFETY: all-zero is a valid CUDA_MEMCPY3D (NULL pointers, zero sizes).
        let mut p: Memcpy3D = unsafe { std::mem::zeroed() };
        (p.width_in_bytes, p.height, p.depth) = (w, h, d);
        Copy {
            device: 0,
            ctx: 0,
            params: Raw3D(p),
            src,
            dst,
        }
    }

    fn side(start: u64, pitch: u64, height: u64) -> Side {
        Side {
            host: false,
            start,
            pitch,
            height,
        }
    }

    #[test]
    fn a_copy_is_one_range_where_both_sides_are_contiguous_and_rows_otherwise() {
        let whole = copy(side(0x1000, 64, 4), side(0x9000, 64, 4), 64, 4, 2);
        assert_eq!(whole.rows().collect::<Vec<_>>(), [(0x1000, 0x9000, 512)]);
        // The source's rows are 100 bytes apart, its slices 3 rows of them.
        let rows = copy(side(0x1000, 100, 3), side(0x9000, 64, 2), 64, 2, 2);
        assert_eq!(
            rows.rows().collect::<Vec<_>>(),
            [
                (0x1000, 0x9000, 64),
                (0x1000 + 100, 0x9000 + 64, 64),
                (0x1000 + 300, 0x9000 + 128, 64),
                (0x1000 + 400, 0x9000 + 192, 64),
            ]
        );
        assert_eq!(rows.end(&rows.src), 0x1000 + 400 + 64);
    }
}
