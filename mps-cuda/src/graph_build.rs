//! Graphs as a program holds them: built node by node (CUDA's explicit graph API: XLA builds its
//! command buffers so), or captured from a stream (`graph`'s), in one registry, so that one
//! handle space names both and no handle is taken for the other kind.
//!
//! A built graph is a DAG kept in this library. Adding a node copies what CUDA copies: a kernel
//! node's parameter values (from `kernelParams` or an `extra` buffer, laid out as the kernel's
//! parameters are), a memset's or copy's description. Served nodes: kernels, memsets (1-, 2- and
//! 4-byte elements, 1D or 2D), copies (device to device, and between the host and the device
//! through page-locked memory, which each launch reads or writes again, as a capture allows),
//! empty nodes and child graphs, built or captured (cloned into the node, or moved there; a
//! capture into a built graph, `cuStreamBeginCaptureToGraph`, is one such node). Every other node
//! type (host functions, events, conditional nodes, memory nodes, ...) is refused with
//! `CUDA_ERROR_NOT_SUPPORTED`, naming it once, never made into a graph that lacks it; so is
//! editing a captured graph node by node, whose nodes exist only on the server.
//!
//! An instantiation takes a [`Plan`] of the graph: its nodes in a topological order (the order
//! they were added where the edges allow), built child graphs inlined. Each run of the plan's
//! work between captured child graphs is captured, one node after another, in an internal
//! stream of its device, through the launches, memsets and copies other work takes, and the
//! server's graph of that capture is instantiated; each captured child graph is instantiated as
//! it is; a launch runs them one after another in its stream. Each node so runs after every
//! node before it in the order, its dependencies among them, and a launch is ordered in its
//! stream as a whole: CUDA's ordering holds, but independent branches of a graph are serialised
//! instead of running side by side. Edge data (programmatic dependencies) is taken as a full
//! dependency, which satisfies it. While an instantiation's capture is open (two round trips to
//! the server), another thread's synchronisation of the whole device or free of memory is
//! refused as during any capture.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use crate::abi::graph::{
    ChildGraphNodeParams, EdgeData, KERNEL_V1_BYTES, KernelNodeParams, MEMORY_DEVICE, MEMORY_HOST,
    MEMORY_UNIFIED, MEMSET_V1_BYTES, Memcpy3D, MemsetNodeParams, NODE_BATCH_MEM_OP,
    NODE_CONDITIONAL, NODE_EMPTY, NODE_EVENT_RECORD, NODE_EXT_SEMAS_SIGNAL, NODE_EXT_SEMAS_WAIT,
    NODE_GRAPH, NODE_HOST, NODE_KERNEL, NODE_MEM_ALLOC, NODE_MEM_FREE, NODE_MEMCPY, NODE_MEMSET,
    NODE_WAIT_EVENT, NodeParams, OWNERSHIP_CLONE, OWNERSHIP_MOVE,
};
use crate::abi::{CUdevice, CUresult, launch_attribute};
use crate::connection::{Connection, Graph, GraphExec, Res, Stream};
use crate::context::{current, given_or_current, to_cucontext};
use crate::driver::connection;
use crate::ffi::{check, exports, lock, put};
use crate::handles::Registry;
use crate::kernel_queries::allows_non_portable_clusters;
use crate::launch::{AttributeAsks, asks, extra_buffer};
use crate::log;
use crate::module::function_obj;
use crate::objects::FunctionObj;
use crate::pointer::pinned_device_address;
use mps_core::protocol::{Cluster, Dim3};

/// A graph the program holds, and the child-graph node that holds it, if one does (0: none;
/// the graph then goes with that node).
#[derive(Debug)]
pub(crate) struct GraphObj {
    pub(crate) kind: GraphKind,
    owner: AtomicUsize,
}

#[derive(Debug)]
pub(crate) enum GraphKind {
    /// Captured from a stream: the server's graph.
    Captured(Captured),
    /// Built node by node, here.
    Built(Mutex<Dag>),
}

/// A captured graph: the server's, and the priority of the stream it was captured in.
#[derive(Debug)]
pub(crate) struct Captured {
    pub(crate) server: Arc<ServerGraph>,
    pub(crate) priority: i32,
}

/// A graph the server holds, captured from a stream, with the number of nodes (commands) the
/// server reported. It goes from the server when its last holder lets it go: its graph handles
/// (a captured graph's copy is the same graph), and the plans of executable graphs made from
/// graphs that hold it as a child.
#[derive(Debug)]
pub(crate) struct ServerGraph {
    pub(crate) conn: &'static Connection,
    pub(crate) graph: Graph,
    pub(crate) nodes: u64,
}

impl Drop for ServerGraph {
    fn drop(&mut self) {
        // A failure is logged by the connection; nothing holds the graph any longer.
        let _ = self.conn.graph_destroy(self.graph);
    }
}

impl GraphObj {
    fn new(kind: GraphKind) -> GraphObj {
        GraphObj {
            kind,
            owner: AtomicUsize::new(0),
        }
    }
}

static GRAPHS: LazyLock<Registry<GraphObj>> = LazyLock::new(Registry::default);
/// The graph each node belongs to, by node handle.
static NODES: LazyLock<Registry<usize>> = LazyLock::new(Registry::default);
/// Each device's internal stream, where plans are captured (one at a time).
static STAGES: LazyLock<Mutex<HashMap<CUdevice, Stream>>> = LazyLock::new(Mutex::default);

/// Registers the server's graph `graph`, of `nodes` nodes, captured on `conn` at `priority`;
/// its handle.
pub(crate) fn insert_captured(
    conn: &'static Connection,
    graph: Graph,
    nodes: u64,
    priority: i32,
) -> usize {
    let server = Arc::new(ServerGraph { conn, graph, nodes });
    let c = Captured { server, priority };
    GRAPHS
        .insert_with(|_| GraphObj::new(GraphKind::Captured(c)))
        .0
}

/// Adds to built graph `g`, after `deps`, the work the server captured from a stream into
/// `graph` (`cuStreamBeginCaptureToGraph`), as a child-graph node holding it; its node.
pub(crate) fn add_captured(
    g: usize,
    deps: Vec<usize>,
    (conn, graph, nodes, priority): (&'static Connection, Graph, u64, i32),
) -> Res<usize> {
    let child = insert_captured(conn, graph, nodes, priority);
    hold(g, deps, child, true)
}

/// Checks that `deps` are nodes of built graph `g`.
pub(crate) fn check_nodes(g: usize, deps: &[usize]) -> Res<()> {
    with_dag(g, "capturing into", |dag| {
        deps.iter().try_for_each(|d| dag.index(*d).map(drop))
    })
}

/// The graph `g` names.
pub(crate) fn graph(g: usize) -> Res<Arc<GraphObj>> {
    GRAPHS.get(g).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

// ----- the DAG -----

/// A built graph's nodes and edges.
#[derive(Debug, Default)]
pub(crate) struct Dag {
    /// In the order they were added.
    nodes: Vec<Node>,
    /// A clone's nodes by the handles of the original's (`cuGraphNodeFindInClone`).
    cloned_from: HashMap<usize, usize>,
}

#[derive(Debug)]
struct Node {
    handle: usize,
    work: Work,
    /// The nodes of the same graph it depends on.
    deps: Vec<usize>,
}

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
    fn node_type(&self) -> u32 {
        match self {
            Work::Kernel(_) => NODE_KERNEL,
            Work::Memset(_) => NODE_MEMSET,
            Work::Copy(_) => NODE_MEMCPY,
            Work::Empty => NODE_EMPTY,
            Work::Child(_) => NODE_GRAPH,
        }
    }

    /// The device it runs on, if any.
    fn device(&self) -> Option<CUdevice> {
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
fn kept(old: &Work, new: Work) -> Work {
    match (old, new) {
        (Work::Kernel(o), Work::Kernel(n)) => Work::Kernel(n.keeping_attributes_of(o)),
        (_, new) => new,
    }
}

fn same_kind(a: &Work, b: &Work) -> bool {
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

/// Refuses to use a captured graph where a built one is needed (`what`), saying so once.
fn refuse_captured(what: &str) -> CUresult {
    log::once(&format!("captured graph: {what}"), || {
        format!(
            "{what}: not supported through mps for a graph captured from a stream, whose nodes \
             exist only on the server (build the graph node by node instead); returning \
             CUDA_ERROR_NOT_SUPPORTED"
        )
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

impl Dag {
    fn index(&self, node: usize) -> Res<usize> {
        self.nodes
            .iter()
            .position(|n| n.handle == node)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    /// The nodes in a topological order: each after its dependencies, otherwise in the order
    /// they were added. `CUDA_ERROR_INVALID_VALUE` for a cycle.
    fn topological(&self) -> Res<Vec<usize>> {
        let at: HashMap<usize, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.handle, i))
            .collect();
        let mut waiting: Vec<usize> = self.nodes.iter().map(|n| n.deps.len()).collect();
        let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for d in &n.deps {
                dependents[at[d]].push(i);
            }
        }
        // The ready node added first goes first.
        let mut ready: std::collections::BTreeSet<usize> =
            (0..self.nodes.len()).filter(|i| waiting[*i] == 0).collect();
        let mut order = Vec::with_capacity(self.nodes.len());
        while let Some(i) = ready.pop_first() {
            order.push(i);
            for &j in &dependents[i] {
                waiting[j] -= 1;
                if waiting[j] == 0 {
                    ready.insert(j);
                }
            }
        }
        if order.len() != self.nodes.len() {
            log::once("graph cycle", || {
                "a graph's dependencies form a cycle; its instantiation returns \
                 CUDA_ERROR_INVALID_VALUE"
                    .into()
            });
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(order)
    }

    /// The edges, as (from, to), in the order of their nodes.
    fn edges(&self) -> Vec<(usize, usize)> {
        self.nodes
            .iter()
            .flat_map(|n| n.deps.iter().map(|d| (*d, n.handle)))
            .collect()
    }
}

/// Runs `f` on built graph `g`'s DAG; `what` names the use, for a captured graph's refusal.
fn with_dag<R>(g: usize, what: &str, f: impl FnOnce(&mut Dag) -> Res<R>) -> Res<R> {
    match &graph(g)?.kind {
        GraphKind::Built(d) => f(&mut lock(d)),
        GraphKind::Captured(_) => Err(refuse_captured(what)),
    }
}

/// Runs `f` on the DAG that holds `node`, with the node's index there.
fn with_node<R>(node: usize, f: impl FnOnce(&mut Dag, usize) -> Res<R>) -> Res<R> {
    let g = *NODES.get(node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    with_dag(g, "a node", |dag| {
        let i = dag.index(node)?;
        f(dag, i)
    })
}

/// The `n` node handles at `deps`, checked to be distinct.
///
/// # Safety
/// `deps` must be NULL or readable for `n` handles; `edges` NULL or readable for `n` edges.
pub(crate) unsafe fn read_deps(
    deps: *const usize,
    edges: *const EdgeData,
    n: usize,
) -> Res<Vec<usize>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    check(!deps.is_null())?;
    // SAFETY: the caller guarantees `n` readable handles.
    let v = unsafe { std::slice::from_raw_parts(deps, n) }.to_vec();
    if !edges.is_null() {
        // Any edge (a programmatic one too) is taken as a full dependency, which satisfies it.
        // SAFETY: the caller guarantees `n` readable edges.
        let e = unsafe { std::slice::from_raw_parts(edges, n) };
        check(e.iter().all(|e| e.reserved == [0; 5]))?;
    }
    let mut sorted = v.clone();
    sorted.sort_unstable();
    sorted.dedup();
    check(sorted.len() == v.len())?;
    Ok(v)
}

/// Adds a node doing `work` to graph `g` after `deps`; its handle.
fn add(g: usize, deps: Vec<usize>, work: Work) -> Res<usize> {
    with_dag(g, "adding a node", |dag| {
        for d in &deps {
            dag.index(*d)?;
        }
        let (handle, _) = NODES.insert_with(|_| g);
        dag.nodes.push(Node { handle, work, deps });
        Ok(handle)
    })
}

/// Adds node `work` (a child graph given as `Child`, taken as `ownership`) to `g`.
fn add_work(g: usize, deps: Vec<usize>, work: Parsed) -> Res<usize> {
    match work {
        Parsed::Work(w) => add(g, deps, w),
        Parsed::Child {
            graph: child,
            ownership,
        } => {
            let held = match ownership {
                OWNERSHIP_CLONE => clone_child(child)?,
                OWNERSHIP_MOVE => {
                    let obj = graph(child)?;
                    // Not held already, nor holding `g` (a graph cannot contain itself).
                    check(obj.owner.load(Ordering::Acquire) == 0 && !within(g, child))?;
                    child
                }
                _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            };
            hold(g, deps, held, ownership == OWNERSHIP_CLONE)
        }
    }
}

/// Adds to `g` a child-graph node holding graph `child`; where that fails, `child` goes too if
/// it was made for the node (`made`).
fn hold(g: usize, deps: Vec<usize>, child: usize, made: bool) -> Res<usize> {
    match add(g, deps, Work::Child(child)) {
        Ok(node) => {
            graph(child)?.owner.store(node, Ordering::Release);
            Ok(node)
        }
        Err(e) => {
            if made {
                destroy_owned(child);
            }
            Err(e)
        }
    }
}

/// Whether graph `g` is `target` or lies within it (held by a node of it, however deep).
fn within(g: usize, target: usize) -> bool {
    let mut at = g;
    loop {
        if at == target {
            return true;
        }
        let Some(owner) = GRAPHS.get(at).map(|o| o.owner.load(Ordering::Acquire)) else {
            return false;
        };
        match NODES.get(owner) {
            Some(home) if owner != 0 => at = *home,
            _ => return false,
        }
    }
}

/// A copy of graph `g` for a child-graph node to hold: a built graph's deep copy; a captured
/// graph, which never changes, shared.
fn clone_child(g: usize) -> Res<usize> {
    match &graph(g)?.kind {
        GraphKind::Captured(c) => {
            let copy = Captured {
                server: c.server.clone(),
                priority: c.priority,
            };
            Ok(GRAPHS
                .insert_with(|_| GraphObj::new(GraphKind::Captured(copy)))
                .0)
        }
        GraphKind::Built(_) => clone(g),
    }
}

/// A deep copy of built graph `g`, its child graphs copied too; its handle.
fn clone(g: usize) -> Res<usize> {
    // The copy's node handles are made while the original is locked: a child graph's copy locks
    // only the child.
    let (copy, _) =
        GRAPHS.insert_with(|_| GraphObj::new(GraphKind::Built(Mutex::new(Dag::default()))));
    let filled = with_dag(g, "cloning", |orig| {
        let mut renamed = HashMap::new();
        let mut nodes = Vec::with_capacity(orig.nodes.len());
        for n in &orig.nodes {
            let (handle, _) = NODES.insert_with(|_| copy);
            renamed.insert(n.handle, handle);
            nodes.push((handle, n.work.clone(), n.deps.clone()));
        }
        Ok((nodes, renamed))
    });
    let result = filled.and_then(|(nodes, renamed)| {
        let mut built = Vec::with_capacity(nodes.len());
        for (handle, work, deps) in nodes {
            let work = match work {
                Work::Child(c) => {
                    let c = clone_child(c)?;
                    graph(c)?.owner.store(handle, Ordering::Release);
                    Work::Child(c)
                }
                w => w,
            };
            let deps = deps.iter().map(|d| renamed[d]).collect();
            built.push(Node { handle, work, deps });
        }
        with_dag(copy, "cloning", |d| {
            d.nodes = built;
            d.cloned_from = renamed;
            Ok(())
        })
    });
    match result {
        Ok(()) => Ok(copy),
        Err(e) => {
            destroy_owned(copy);
            NODES.remove_where(|home| *home == copy);
            Err(e)
        }
    }
}

/// Forgets graph `g`: a built one with its nodes and the child graphs they hold; a captured one
/// goes from its server once nothing else holds it.
fn destroy_owned(g: usize) {
    let Some(obj) = GRAPHS.remove(g) else { return };
    let GraphKind::Built(dag) = &obj.kind else {
        return;
    };
    let nodes = std::mem::take(&mut lock(dag).nodes);
    for n in nodes {
        NODES.remove(n.handle);
        if let Work::Child(c) = n.work {
            destroy_owned(c);
        }
    }
}

/// `cuGraphDestroy`: executable graphs made from it live on. A child graph that a node holds
/// goes with that node, not by itself.
fn destroy(g: usize) -> Res<()> {
    check(graph(g)?.owner.load(Ordering::Acquire) == 0)?;
    destroy_owned(g);
    Ok(())
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

// ----- plans: what an instantiation runs -----

/// A graph's nodes in the order they are run, child graphs inlined: what an executable graph
/// is made from, and what its updates edit.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    steps: Vec<Step>,
}

#[derive(Clone, Debug)]
struct Step {
    /// The node it is, of the graph the plan was made from (or of a child graph of it).
    node: usize,
    what: Planned,
}

#[derive(Clone, Debug)]
enum Planned {
    Work(Work),
    /// A built child graph, inlined.
    Child(Vec<Step>),
    /// A captured child graph: the server's, run as it is.
    Server(Arc<ServerGraph>),
}

/// One thing a plan runs, in order: work of this library's, or a graph of the server's.
enum Item<'a> {
    Work(&'a Work),
    Server(&'a Arc<ServerGraph>),
}

/// The plan of built graph `g` (a captured one is refused with `what`).
pub(crate) fn plan(g: usize, what: &str) -> Res<Plan> {
    Ok(Plan {
        steps: steps_of(g, what)?,
    })
}

fn steps_of(g: usize, what: &str) -> Res<Vec<Step>> {
    let planned: Vec<(usize, Work)> = with_dag(g, what, |dag| {
        let order = dag.topological()?;
        Ok(order
            .into_iter()
            .map(|i| (dag.nodes[i].handle, dag.nodes[i].work.clone()))
            .collect())
    })?;
    planned
        .into_iter()
        .map(|(node, work)| {
            let what = match work {
                Work::Child(c) => match &graph(c)?.kind {
                    GraphKind::Captured(cap) => Planned::Server(cap.server.clone()),
                    GraphKind::Built(_) => Planned::Child(steps_of(c, what)?),
                },
                w => Planned::Work(w),
            };
            Ok(Step { node, what })
        })
        .collect()
}

/// Every step's work and server graphs, child graphs' inlined, in order.
fn each_item<'a>(steps: &'a [Step], f: &mut impl FnMut(Item<'a>) -> Res<()>) -> Res<()> {
    for s in steps {
        match &s.what {
            Planned::Work(w) => f(Item::Work(w))?,
            Planned::Child(c) => each_item(c, f)?,
            Planned::Server(g) => f(Item::Server(g))?,
        }
    }
    Ok(())
}

/// The step of `node`, child graphs' searched too.
fn find(steps: &mut [Step], node: usize) -> Option<&mut Step> {
    for s in steps {
        if s.node == node {
            return Some(s);
        }
        if let Planned::Child(c) = &mut s.what
            && let Some(found) = find(c, node)
        {
            return Some(found);
        }
    }
    None
}

/// Where two plans' steps differ in shape (a node of another type, or another number of
/// nodes): the `CUgraphExecUpdateResult` and the node of `old` it is about (0: none). A captured
/// child graph's shape is the server's, and not compared.
fn shape_differs(old: &[Step], new: &[Step]) -> Option<(u32, usize)> {
    use crate::abi::graph::{UPDATE_NODE_TYPE_CHANGED, UPDATE_TOPOLOGY_CHANGED};
    if old.len() != new.len() {
        return Some((UPDATE_TOPOLOGY_CHANGED, 0));
    }
    for (o, n) in old.iter().zip(new) {
        match (&o.what, &n.what) {
            (Planned::Work(a), Planned::Work(b)) if same_kind(a, b) => {}
            (Planned::Server(_), Planned::Server(_)) => {}
            (Planned::Child(a), Planned::Child(b)) => {
                if let Some(d) = shape_differs(a, b) {
                    return Some(d);
                }
            }
            _ => return Some((UPDATE_NODE_TYPE_CHANGED, o.node)),
        }
    }
    None
}

/// `new`'s work in `old`'s steps, which keep their node handles.
fn take_work(old: &mut [Step], new: Vec<Step>) {
    for (o, n) in old.iter_mut().zip(new) {
        match (&mut o.what, n.what) {
            (Planned::Child(a), Planned::Child(b)) => take_work(a, b),
            (what, w) => *what = w,
        }
    }
}

impl Plan {
    /// The device its work runs on; `CUDA_ERROR_NOT_SUPPORTED` for work on several.
    fn device(&self) -> Res<Option<CUdevice>> {
        let mut device = None;
        each_item(&self.steps, &mut |item| {
            let here = match item {
                Item::Work(w) => w.device(),
                Item::Server(g) => Some(g.conn.ordinal()),
            };
            match (device, here) {
                (_, None) => {}
                (None, d) => device = d,
                (Some(a), Some(b)) if a != b => {
                    log::once("graph on several devices", || {
                        "a graph whose nodes run on several devices is not supported through \
                         mps; returning CUDA_ERROR_NOT_SUPPORTED"
                            .into()
                    });
                    return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(device)
    }

    /// Replaces the work of node `node` with `work`, of the same kind and device.
    pub(crate) fn set(&mut self, node: usize, work: Work) -> Res<()> {
        let step = find(&mut self.steps, node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        match &mut step.what {
            Planned::Work(old) if same_kind(old, &work) && old.device() == work.device() => {
                *old = kept(old, work);
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Replaces the work of child-graph node `node` with that of graph `child`, which must be
    /// of the same kind and, built, of the same shape.
    pub(crate) fn set_child(&mut self, node: usize, child: usize) -> Res<()> {
        let step = find(&mut self.steps, node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        match (&mut step.what, &graph(child)?.kind) {
            (Planned::Server(old), GraphKind::Captured(c)) => {
                *old = c.server.clone();
                Ok(())
            }
            (Planned::Child(steps), GraphKind::Built(_)) => {
                let new = steps_of(child, "a child graph's update")?;
                if shape_differs(steps, &new).is_some() {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                take_work(steps, new);
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Takes the work of `new`, a plan of the same shape, keeping this plan's node handles;
    /// where the shapes differ, the `CUgraphExecUpdateResult` and the node it is about.
    pub(crate) fn update_from(&mut self, new: Plan) -> Result<(), (u32, usize)> {
        if let Some(d) = shape_differs(&self.steps, &new.steps) {
            return Err(d);
        }
        take_work(&mut self.steps, new.steps);
        Ok(())
    }

    /// The server's executable graphs of this plan, on its device (the current context's where
    /// it has no work), which a launch runs one after another in its stream: each run of this
    /// library's work captured in order in the device's internal stream, and each captured child
    /// graph instantiated as it is.
    pub(crate) fn instantiate(&self) -> Res<(&'static Connection, Vec<GraphExec>)> {
        let device = match self.device()? {
            Some(d) => d,
            None => current()?.device,
        };
        let conn = connection(device)?;
        let mut execs = Vec::new();
        let mut run: Vec<&Work> = Vec::new();
        let mut made = each_item(&self.steps, &mut |item| match item {
            Item::Work(w) => {
                run.push(w);
                Ok(())
            }
            Item::Server(g) => {
                if !run.is_empty() {
                    execs.push(instantiate_run(conn, &std::mem::take(&mut run))?);
                }
                execs.push(conn.graph_instantiate(g.graph)?);
                Ok(())
            }
        });
        // The last run; an empty graph is one empty capture, so that a launch is one.
        if made.is_ok() && (!run.is_empty() || execs.is_empty()) {
            made = instantiate_run(conn, &run).map(|x| execs.push(x));
        }
        if let Err(e) = made {
            for x in execs {
                conn.graph_exec_destroy(x)?;
            }
            return Err(e);
        }
        Ok((conn, execs))
    }
}

/// The server's executable graph of `run`, captured in order in the internal stream of `conn`'s
/// device.
fn instantiate_run(conn: &'static Connection, run: &[&Work]) -> Res<GraphExec> {
    let graph = {
        let mut stages = lock(&STAGES);
        let device = conn.ordinal();
        let stream = match stages.get(&device) {
            Some(s) => *s,
            None => *stages.entry(device).or_insert(conn.stream_create(0)?),
        };
        conn.stream_begin_capture(stream)?;
        let submitted = run.iter().try_for_each(|w| submit(w, conn, stream));
        let ended = conn.stream_end_capture(stream);
        match (submitted, ended) {
            (Ok(()), Ok((g, _))) => g,
            (Err(e), Ok((g, _))) => {
                conn.graph_destroy(g)?;
                return Err(e);
            }
            // The server refused a node's command (its message is logged), or failed.
            (Err(e), Err(_)) | (Ok(()), Err(e)) => return Err(e),
        }
    };
    let exec = conn.graph_instantiate(graph);
    let destroyed = conn.graph_destroy(graph);
    let exec = exec?;
    if let Err(e) = destroyed {
        conn.graph_exec_destroy(exec)?;
        return Err(e);
    }
    Ok(exec)
}

/// Gives `work` to `stream` of `conn` (capturing).
fn submit(work: &Work, conn: &Connection, stream: Stream) -> Res<()> {
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

/// A memset of `count` elements of `size` bytes at `dst`. The server sets bytes and 32-bit
/// words: 16-bit elements are set as words, with an element at either end that is not in a
/// whole aligned word set as its two bytes.
fn fill(conn: &Connection, stream: Stream, dst: u64, value: u32, size: u32, count: u64) -> Res<()> {
    match size {
        1 => conn.memset_d8(dst, value as u8, count, stream),
        4 => conn.memset_d32(dst, value, count, stream),
        _ => {
            let [lo, hi] = (value as u16).to_le_bytes();
            if lo == hi {
                return conn.memset_d8(dst, lo, count * 2, stream);
            }
            let one = |at: u64| {
                conn.memset_d8(at, lo, 1, stream)?;
                conn.memset_d8(at + 1, hi, 1, stream)
            };
            let (mut at, mut left) = (dst, count);
            if at % 4 != 0 {
                one(at)?;
                at += 2;
                left -= 1;
            }
            if left >= 2 {
                let word = value & 0xffff;
                conn.memset_d32(at, word | word << 16, left / 2, stream)?;
            }
            if left % 2 == 1 {
                one(at + (left - 1) * 2)?;
            }
            Ok(())
        }
    }
}

// ----- answers about nodes -----

/// Writes up to `*count` of `items` to `out` (NULL: only the count), NULL in the rest of its
/// room, and how many there are, or were written, to `*count`, as CUDA's getters do.
///
/// # Safety
/// `count` must be NULL or readable and writable; `out` NULL or writable for `*count` items.
unsafe fn hand_out(items: &[usize], out: *mut usize, count: *mut usize) -> Res<()> {
    check(!count.is_null())?;
    if out.is_null() {
        // SAFETY: checked non-null; the caller guarantees it is writable.
        return unsafe { put(count, items.len()) };
    }
    // SAFETY: as above, and readable.
    let room = unsafe { count.read() };
    for i in 0..room {
        // SAFETY: the caller guarantees `room` writable entries.
        unsafe { out.add(i).write(items.get(i).copied().unwrap_or(0)) };
    }
    // SAFETY: as above.
    unsafe { put(count, items.len().min(room)) }
}

/// As [`hand_out`], with zeroed edge data beside each item where `edges` is not NULL.
///
/// # Safety
/// As [`hand_out`]; `edges` NULL or writable for `*count` edges.
unsafe fn hand_out_edges(
    items: &[usize],
    out: *mut usize,
    edges: *mut EdgeData,
    count: *mut usize,
) -> Res<()> {
    check(edges.is_null() || !out.is_null())?;
    // SAFETY: the caller's guarantees are hand_out's.
    unsafe { hand_out(items, out, count) }?;
    if !edges.is_null() {
        // SAFETY: as above: the count is now what was written, at most the room.
        let n = unsafe { count.read() };
        for i in 0..n {
            // SAFETY: the caller guarantees room for `n` edges.
            unsafe { edges.add(i).write(EdgeData::default()) };
        }
    }
    Ok(())
}

/// The nodes of graph `g`, for `cuGraphGetNodes`; a captured graph's count only.
///
/// # Safety
/// As [`hand_out`].
unsafe fn get_nodes(g: usize, out: *mut usize, count: *mut usize, roots: bool) -> Res<()> {
    check(!count.is_null())?;
    let nodes = match &graph(g)?.kind {
        GraphKind::Captured(c) if out.is_null() && !roots => {
            // SAFETY: checked non-null; the caller guarantees it is writable.
            return unsafe { put(count, c.server.nodes as usize) };
        }
        GraphKind::Captured(_) => {
            return Err(refuse_captured(if roots {
                "cuGraphGetRootNodes"
            } else {
                "asking for the node handles (not only their count)"
            }));
        }
        GraphKind::Built(d) => {
            let dag = lock(d);
            dag.nodes
                .iter()
                .filter(|n| !roots || n.deps.is_empty())
                .map(|n| n.handle)
                .collect::<Vec<_>>()
        }
    };
    // SAFETY: the caller's guarantees are hand_out's.
    unsafe { hand_out(&nodes, out, count) }
}

/// Edits the dependencies of graph `g`: `n` edges `from[i]` → `to[i]`, added or removed.
///
/// # Safety
/// `from` and `to` must be NULL or readable for `n` handles; `edges` NULL or readable for `n`.
unsafe fn dependencies(
    g: usize,
    from: *const usize,
    to: *const usize,
    edges: *const EdgeData,
    n: usize,
    add: bool,
) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    check(!from.is_null() && !to.is_null())?;
    // SAFETY: the caller guarantees `n` readable handles each, and edges.
    let (from, to) = unsafe {
        if !edges.is_null() {
            let e = std::slice::from_raw_parts(edges, n);
            check(e.iter().all(|e| e.reserved == [0; 5]))?;
        }
        (
            std::slice::from_raw_parts(from, n),
            std::slice::from_raw_parts(to, n),
        )
    };
    with_dag(g, "editing the dependencies", |dag| {
        // All or nothing: every edge is checked first.
        for (f, t) in from.iter().zip(to) {
            dag.index(*f)?;
            let has = dag.nodes[dag.index(*t)?].deps.contains(f);
            check(f != t && has != add)?;
        }
        for (f, t) in from.iter().zip(to) {
            let i = dag.index(*t)?;
            let deps = &mut dag.nodes[i].deps;
            if add {
                deps.push(*f);
            } else {
                deps.retain(|d| d != f);
            }
        }
        Ok(())
    })
}

/// `cuGraphDestroyNode`: the node, its edges and the child graph it holds.
fn destroy_node(node: usize) -> Res<()> {
    let work = with_node(node, |dag, i| {
        let n = dag.nodes.remove(i);
        for other in &mut dag.nodes {
            other.deps.retain(|d| *d != node);
        }
        Ok(n.work)
    })?;
    NODES.remove(node);
    if let Work::Child(c) = work {
        destroy_owned(c);
    }
    Ok(())
}

/// Replaces the work of node `node` with `work`, of the same kind.
fn set_work(node: usize, work: Work) -> Res<()> {
    with_node(node, |dag, i| {
        let old = &mut dag.nodes[i].work;
        check(same_kind(old, &work) && !matches!(work, Work::Child(_)))?;
        *old = kept(old, work);
        Ok(())
    })
}

/// Runs `f` on the work of node `node`.
fn with_work<R>(node: usize, f: impl FnOnce(&Work) -> Res<R>) -> Res<R> {
    with_node(node, |dag, i| f(&dag.nodes[i].work))
}

/// Writes kernel node `node`'s parameters to `out`, `v2` as `CUDA_KERNEL_NODE_PARAMS_v2`.
///
/// # Safety
/// `out` must be NULL or writable for the structure `v2` names.
unsafe fn kernel_params(node: usize, out: *mut KernelNodeParams, v2: bool) -> Res<()> {
    check(!out.is_null())?;
    let p = with_work(node, |w| match w {
        // The pointers into the node's copy of the values stay valid while it keeps them.
        Work::Kernel(k) => Ok(KernelNodeParams {
            func: if k.func != 0 { k.func } else { k.kern },
            grid: k.grid,
            block: k.block,
            shared_mem_bytes: k.shared,
            kernel_params: k.ptrs.as_ptr().cast_mut().cast(),
            extra: std::ptr::null_mut(),
            kern: k.kern,
            ctx: k.ctx,
        }),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })?;
    let n = if v2 {
        size_of::<KernelNodeParams>()
    } else {
        KERNEL_V1_BYTES
    };
    // SAFETY: the caller guarantees `n` writable bytes.
    unsafe { std::ptr::copy_nonoverlapping((&raw const p).cast::<u8>(), out.cast::<u8>(), n) };
    Ok(())
}

/// Sets attribute `id` of kernel node `node` to the 64 bytes at `value`: what a plain launch
/// does (no cluster, cooperation off), a hint or permission (priority, access-policy window,
/// ...: kept and read back, as `cuLaunchKernelEx` drops them), or a cluster dimension, with which
/// the node's kernel is launched; any other is refused, named once.
///
/// # Safety
/// `value` must be NULL or readable for a `CUlaunchAttributeValue`.
unsafe fn set_attribute(node: usize, id: u32, value: *const u8) -> Res<()> {
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
    with_node(node, |dag, i| {
        let Work::Kernel(k) = &mut dag.nodes[i].work else {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        };
        if id == launch_attribute::CLUSTER_DIMENSION {
            k.cluster = cluster;
        }
        k.attrs.retain(|(a, _)| *a != id);
        k.attrs.push((id, bytes));
        Ok(())
    })
}

/// Runs `f` on kernel node `node`.
fn with_kernel<R>(node: usize, f: impl FnOnce(&Kernel) -> Res<R>) -> Res<R> {
    with_work(node, |w| match w {
        Work::Kernel(k) => f(k),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

// ----- the exports -----

exports! {
    /// # Safety
    /// `ph` must be NULL or writable.
    pub unsafe fn cuGraphCreate(ph: *mut usize, flags: u32) ["cuGraphCreate" 10000] = {
        check(!ph.is_null() && flags == 0)?;
        let (g, _) =
            GRAPHS.insert_with(|_| GraphObj::new(GraphKind::Built(Mutex::new(Dag::default()))));
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(ph, g) }
    };

    /// Executable graphs made from it live on. A child graph that a node holds goes with it.
    pub fn cuGraphDestroy(g: usize) ["cuGraphDestroy" 10000] = destroy(g);

    /// The CUDA 10.0 form, with `CUDA_KERNEL_NODE_PARAMS_v1`.
    ///
    /// # Safety
    /// `ph` must be NULL or writable, `deps` readable for `n` nodes, `p` as for `kernel`.
    pub unsafe fn cuGraphAddKernelNode(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        n: usize,
        p: *const KernelNodeParams,
    ) ["cuGraphAddKernelNode" 10000] = {
        check(!ph.is_null())?;
        // SAFETY: the caller's guarantees are read_deps's and kernel's.
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, kernel(p, false)?) };
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(ph, add(g, deps, work)?) }
    };

    /// # Safety
    /// As `cuGraphAddKernelNode`, with `CUDA_KERNEL_NODE_PARAMS_v2`.
    pub unsafe fn cuGraphAddKernelNode_v2(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        n: usize,
        p: *const KernelNodeParams,
    ) ["cuGraphAddKernelNode" 12000] = {
        check(!ph.is_null())?;
        // SAFETY: as above.
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, kernel(p, true)?) };
        // SAFETY: as above.
        unsafe { put(ph, add(g, deps, work)?) }
    };

    /// # Safety
    /// `ph` must be NULL or writable, `deps` readable for `n` nodes, `p` for a
    /// `CUDA_MEMSET_NODE_PARAMS`.
    pub unsafe fn cuGraphAddMemsetNode(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        n: usize,
        p: *const MemsetNodeParams,
        ctx: usize,
    ) ["cuGraphAddMemsetNode" 10000] = {
        check(!ph.is_null())?;
        // SAFETY: the caller's guarantees are read_deps's and memset's.
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, memset(p, ctx)?) };
        // SAFETY: as above.
        unsafe { put(ph, add(g, deps, work)?) }
    };

    /// # Safety
    /// `ph` must be NULL or writable, `deps` readable for `n` nodes, `p` for a `CUDA_MEMCPY3D`.
    pub unsafe fn cuGraphAddMemcpyNode(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        n: usize,
        p: *const Memcpy3D,
        ctx: usize,
    ) ["cuGraphAddMemcpyNode" 10000] = {
        check(!ph.is_null())?;
        // SAFETY: the caller's guarantees are read_deps's and memcpy's.
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, memcpy(p, ctx)?) };
        // SAFETY: as above.
        unsafe { put(ph, add(g, deps, work)?) }
    };

    /// # Safety
    /// `ph` must be NULL or writable, `deps` readable for `n` nodes.
    pub unsafe fn cuGraphAddEmptyNode(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        n: usize,
    ) ["cuGraphAddEmptyNode" 10000] = {
        check(!ph.is_null())?;
        // SAFETY: the caller's guarantee is read_deps's.
        let deps = unsafe { read_deps(deps, std::ptr::null(), n) }?;
        // SAFETY: as above.
        unsafe { put(ph, add(g, deps, Work::Empty)?) }
    };

    /// The child graph is cloned into the node.
    ///
    /// # Safety
    /// `ph` must be NULL or writable, `deps` readable for `n` nodes.
    pub unsafe fn cuGraphAddChildGraphNode(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        n: usize,
        child: usize,
    ) ["cuGraphAddChildGraphNode" 10000] = {
        check(!ph.is_null())?;
        // SAFETY: the caller's guarantee is read_deps's.
        let deps = unsafe { read_deps(deps, std::ptr::null(), n) }?;
        let parsed = Parsed::Child { graph: child, ownership: OWNERSHIP_CLONE };
        // SAFETY: as above.
        unsafe { put(ph, add_work(g, deps, parsed)?) }
    };

    /// The CUDA 12.2 form, without edge data.
    ///
    /// # Safety
    /// `ph` must be NULL or writable, `deps` readable for `n` nodes, `p` as for `node_params`.
    pub unsafe fn cuGraphAddNode(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        n: usize,
        p: *const NodeParams,
    ) ["cuGraphAddNode" 12020] = {
        check(!ph.is_null())?;
        // SAFETY: the caller's guarantees are read_deps's and node_params's.
        let (deps, parsed) = unsafe { (read_deps(deps, std::ptr::null(), n)?, node_params(p)?) };
        // SAFETY: as above.
        unsafe { put(ph, add_work(g, deps, parsed)?) }
    };

    /// The CUDA 12.3 form (CUDA 13's `cuGraphAddNode`), with edge data.
    ///
    /// # Safety
    /// As `cuGraphAddNode`; `edges` NULL or readable for `n` edges.
    pub unsafe fn cuGraphAddNode_v2(
        ph: *mut usize,
        g: usize,
        deps: *const usize,
        edges: *const EdgeData,
        n: usize,
        p: *const NodeParams,
    ) ["cuGraphAddNode" 12030] = {
        check(!ph.is_null())?;
        // SAFETY: the caller's guarantees are read_deps's and node_params's.
        let (deps, parsed) = unsafe { (read_deps(deps, edges, n)?, node_params(p)?) };
        // SAFETY: as above.
        unsafe { put(ph, add_work(g, deps, parsed)?) }
    };

    /// Kernel, memset and memcpy nodes take new parameters of their kind (and device); other
    /// nodes none.
    ///
    /// # Safety
    /// `p` as for `node_params`.
    pub unsafe fn cuGraphNodeSetParams(
        node: usize,
        p: *const NodeParams,
    ) ["cuGraphNodeSetParams" 12020] = {
        // SAFETY: the caller's guarantee is node_params's.
        match unsafe { node_params(p) }? {
            Parsed::Work(w) => set_work(node, w),
            Parsed::Child { .. } => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    };

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuGraphNodeGetType(node: usize, out: *mut u32) ["cuGraphNodeGetType" 10000] = {
        check(!out.is_null())?;
        let t = with_work(node, |w| Ok(w.node_type()))?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, t) }
    };

    /// A captured graph answers the count only (`nodes` NULL): what PyTorch's `CUDAGraph` asks
    /// to see that a capture recorded something.
    ///
    /// # Safety
    /// `count` must be NULL or readable and writable; `nodes` NULL or writable for `*count`.
    pub unsafe fn cuGraphGetNodes(
        g: usize,
        nodes: *mut usize,
        count: *mut usize,
    ) ["cuGraphGetNodes" 10000] =
        // SAFETY: the caller's guarantees are get_nodes's.
        unsafe { get_nodes(g, nodes, count, false) };

    /// # Safety
    /// As `cuGraphGetNodes`.
    pub unsafe fn cuGraphGetRootNodes(
        g: usize,
        roots: *mut usize,
        count: *mut usize,
    ) ["cuGraphGetRootNodes" 10000] =
        // SAFETY: the caller's guarantees are get_nodes's.
        unsafe { get_nodes(g, roots, count, true) };

    /// # Safety
    /// `count` must be NULL or readable and writable; `from` and `to` NULL (both) or writable
    /// for `*count` nodes.
    pub unsafe fn cuGraphGetEdges(
        g: usize,
        from: *mut usize,
        to: *mut usize,
        count: *mut usize,
    ) ["cuGraphGetEdges" 10000] =
        // SAFETY: the caller's guarantees are get_edges's.
        unsafe { get_edges(g, from, to, std::ptr::null_mut(), count) };

    /// # Safety
    /// As `cuGraphGetEdges`; `edges` NULL or writable for `*count` edges.
    pub unsafe fn cuGraphGetEdges_v2(
        g: usize,
        from: *mut usize,
        to: *mut usize,
        edges: *mut EdgeData,
        count: *mut usize,
    ) ["cuGraphGetEdges" 12030] =
        // SAFETY: the caller's guarantees are get_edges's.
        unsafe { get_edges(g, from, to, edges, count) };

    /// # Safety
    /// `count` must be NULL or readable and writable; `deps` NULL or writable for `*count`.
    pub unsafe fn cuGraphNodeGetDependencies(
        node: usize,
        deps: *mut usize,
        count: *mut usize,
    ) ["cuGraphNodeGetDependencies" 10000] =
        // SAFETY: the caller's guarantees are neighbours's.
        unsafe { neighbours(node, deps, std::ptr::null_mut(), count, false) };

    /// # Safety
    /// As `cuGraphNodeGetDependencies`; `edges` NULL or writable for `*count` edges.
    pub unsafe fn cuGraphNodeGetDependencies_v2(
        node: usize,
        deps: *mut usize,
        edges: *mut EdgeData,
        count: *mut usize,
    ) ["cuGraphNodeGetDependencies" 12030] =
        // SAFETY: the caller's guarantees are neighbours's.
        unsafe { neighbours(node, deps, edges, count, false) };

    /// # Safety
    /// As `cuGraphNodeGetDependencies`.
    pub unsafe fn cuGraphNodeGetDependentNodes(
        node: usize,
        dependents: *mut usize,
        count: *mut usize,
    ) ["cuGraphNodeGetDependentNodes" 10000] =
        // SAFETY: the caller's guarantees are neighbours's.
        unsafe { neighbours(node, dependents, std::ptr::null_mut(), count, true) };

    /// # Safety
    /// As `cuGraphNodeGetDependencies_v2`.
    pub unsafe fn cuGraphNodeGetDependentNodes_v2(
        node: usize,
        dependents: *mut usize,
        edges: *mut EdgeData,
        count: *mut usize,
    ) ["cuGraphNodeGetDependentNodes" 12030] =
        // SAFETY: the caller's guarantees are neighbours's.
        unsafe { neighbours(node, dependents, edges, count, true) };

    /// # Safety
    /// `from` and `to` must be NULL or readable for `n` nodes.
    pub unsafe fn cuGraphAddDependencies(
        g: usize,
        from: *const usize,
        to: *const usize,
        n: usize,
    ) ["cuGraphAddDependencies" 10000] =
        // SAFETY: the caller's guarantees are dependencies's.
        unsafe { dependencies(g, from, to, std::ptr::null(), n, true) };

    /// # Safety
    /// As `cuGraphAddDependencies`; `edges` NULL or readable for `n` edges.
    pub unsafe fn cuGraphAddDependencies_v2(
        g: usize,
        from: *const usize,
        to: *const usize,
        edges: *const EdgeData,
        n: usize,
    ) ["cuGraphAddDependencies" 12030] =
        // SAFETY: the caller's guarantees are dependencies's.
        unsafe { dependencies(g, from, to, edges, n, true) };

    /// # Safety
    /// As `cuGraphAddDependencies`.
    pub unsafe fn cuGraphRemoveDependencies(
        g: usize,
        from: *const usize,
        to: *const usize,
        n: usize,
    ) ["cuGraphRemoveDependencies" 10000] =
        // SAFETY: the caller's guarantees are dependencies's.
        unsafe { dependencies(g, from, to, std::ptr::null(), n, false) };

    /// # Safety
    /// As `cuGraphAddDependencies_v2`.
    pub unsafe fn cuGraphRemoveDependencies_v2(
        g: usize,
        from: *const usize,
        to: *const usize,
        edges: *const EdgeData,
        n: usize,
    ) ["cuGraphRemoveDependencies" 12030] =
        // SAFETY: the caller's guarantees are dependencies's.
        unsafe { dependencies(g, from, to, edges, n, false) };

    pub fn cuGraphDestroyNode(node: usize) ["cuGraphDestroyNode" 10000] = destroy_node(node);

    /// The `kernelParams` handed out point into the node's copy of the values, valid until its
    /// parameters change.
    ///
    /// # Safety
    /// `out` must be NULL or writable for a `CUDA_KERNEL_NODE_PARAMS_v1`.
    pub unsafe fn cuGraphKernelNodeGetParams(
        node: usize,
        out: *mut KernelNodeParams,
    ) ["cuGraphKernelNodeGetParams" 10000] =
        // SAFETY: the caller's guarantee is kernel_params's.
        unsafe { kernel_params(node, out, false) };

    /// # Safety
    /// `out` must be NULL or writable for a `CUDA_KERNEL_NODE_PARAMS_v2`.
    pub unsafe fn cuGraphKernelNodeGetParams_v2(
        node: usize,
        out: *mut KernelNodeParams,
    ) ["cuGraphKernelNodeGetParams" 12000] =
        // SAFETY: the caller's guarantee is kernel_params's.
        unsafe { kernel_params(node, out, true) };

    /// # Safety
    /// As `kernel` (the v1 structure).
    pub unsafe fn cuGraphKernelNodeSetParams(
        node: usize,
        p: *const KernelNodeParams,
    ) ["cuGraphKernelNodeSetParams" 10000] =
        // SAFETY: the caller's guarantee is kernel's.
        set_work(node, unsafe { kernel(p, false) }?);

    /// # Safety
    /// As `kernel` (the v2 structure).
    pub unsafe fn cuGraphKernelNodeSetParams_v2(
        node: usize,
        p: *const KernelNodeParams,
    ) ["cuGraphKernelNodeSetParams" 12000] =
        // SAFETY: the caller's guarantee is kernel's.
        set_work(node, unsafe { kernel(p, true) }?);

    /// # Safety
    /// `out` must be NULL or writable for a `CUDA_MEMSET_NODE_PARAMS`.
    pub unsafe fn cuGraphMemsetNodeGetParams(
        node: usize,
        out: *mut MemsetNodeParams,
    ) ["cuGraphMemsetNodeGetParams" 10000] = {
        check(!out.is_null())?;
        let p = with_work(node, |w| match w {
            Work::Memset(m) => Ok(MemsetNodeParams {
                dst: m.dst,
                pitch: m.pitch,
                value: m.value,
                element_size: m.element_size,
                width: m.width,
                height: m.height,
                ctx: m.ctx,
            }),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        // SAFETY: the caller guarantees room for the v1 structure.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&raw const p).cast::<u8>(),
                out.cast::<u8>(),
                MEMSET_V1_BYTES,
            )
        };
        Ok(())
    };

    /// # Safety
    /// As `memset`.
    pub unsafe fn cuGraphMemsetNodeSetParams(
        node: usize,
        p: *const MemsetNodeParams,
    ) ["cuGraphMemsetNodeSetParams" 10000] = {
        let ctx = with_work(node, |w| match w {
            Work::Memset(m) => Ok(m.ctx),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        // SAFETY: the caller's guarantee is memset's.
        set_work(node, unsafe { memset(p, ctx) }?)
    };

    /// # Safety
    /// `out` must be NULL or writable for a `CUDA_MEMCPY3D`.
    pub unsafe fn cuGraphMemcpyNodeGetParams(
        node: usize,
        out: *mut Memcpy3D,
    ) ["cuGraphMemcpyNodeGetParams" 10000] = {
        check(!out.is_null())?;
        let p = with_work(node, |w| match w {
            Work::Copy(c) => Ok(c.params.0),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, p) }
    };

    /// # Safety
    /// As `memcpy`.
    pub unsafe fn cuGraphMemcpyNodeSetParams(
        node: usize,
        p: *const Memcpy3D,
    ) ["cuGraphMemcpyNodeSetParams" 10000] = {
        let ctx = with_work(node, |w| match w {
            Work::Copy(c) => Ok(c.ctx),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        // SAFETY: the caller's guarantee is memcpy's.
        set_work(node, unsafe { memcpy(p, ctx) }?)
    };

    /// The graph the node holds (not a copy: editing it edits the node).
    ///
    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuGraphChildGraphNodeGetGraph(
        node: usize,
        out: *mut usize,
    ) ["cuGraphChildGraphNodeGetGraph" 10000] = {
        check(!out.is_null())?;
        let g = with_work(node, |w| match w {
            Work::Child(g) => Ok(*g),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, g) }
    };

    /// A copy of a built graph, child graphs too; of a captured graph, the same server graph.
    ///
    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuGraphClone(out: *mut usize, g: usize) ["cuGraphClone" 10000] = {
        check(!out.is_null())?;
        let copy = clone_child(g)?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, copy) }
    };

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuGraphNodeFindInClone(
        out: *mut usize,
        node: usize,
        clone: usize,
    ) ["cuGraphNodeFindInClone" 10000] = {
        check(!out.is_null())?;
        let found = with_dag(clone, "cuGraphNodeFindInClone", |d| {
            d.cloned_from
                .get(&node)
                .copied()
                .filter(|n| d.index(*n).is_ok())
                .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
        })?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, found) }
    };

    /// # Safety
    /// `value` must be NULL or readable for a `CUkernelNodeAttrValue`.
    pub unsafe fn cuGraphKernelNodeSetAttribute(
        node: usize,
        id: u32,
        value: *const u8,
    ) ["cuGraphKernelNodeSetAttribute" 11000] =
        // SAFETY: the caller's guarantee is set_attribute's.
        unsafe { set_attribute(node, id, value) };

    /// The value set, or zeros where none was.
    ///
    /// # Safety
    /// `out` must be NULL or writable for a `CUkernelNodeAttrValue`.
    pub unsafe fn cuGraphKernelNodeGetAttribute(
        node: usize,
        id: u32,
        out: *mut u8,
    ) ["cuGraphKernelNodeGetAttribute" 11000] = {
        check(!out.is_null())?;
        let v = with_kernel(node, |k| {
            Ok(k.attrs
                .iter()
                .find(|(a, _)| *a == id)
                .map_or([0; ATTRIBUTE_BYTES], |(_, v)| *v))
        })?;
        // SAFETY: the caller guarantees 64 writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, ATTRIBUTE_BYTES) };
        Ok(())
    };

    pub fn cuGraphKernelNodeCopyAttributes(
        dst: usize,
        src: usize,
    ) ["cuGraphKernelNodeCopyAttributes" 11000] = {
        let (attrs, cluster) = with_kernel(src, |k| Ok((k.attrs.clone(), k.cluster)))?;
        with_node(dst, |dag, i| match &mut dag.nodes[i].work {
            Work::Kernel(k) => {
                k.attrs = attrs;
                k.cluster = cluster;
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })
    };
}

/// The edges of graph `g`, for `cuGraphGetEdges`.
///
/// # Safety
/// `count` must be NULL or readable and writable; `from`, `to` and `edges` NULL or writable for
/// `*count` entries.
unsafe fn get_edges(
    g: usize,
    from: *mut usize,
    to: *mut usize,
    edges: *mut EdgeData,
    count: *mut usize,
) -> Res<()> {
    check(from.is_null() == to.is_null())?;
    let all = with_dag(g, "cuGraphGetEdges", |d| Ok(d.edges()))?;
    let (f, t): (Vec<usize>, Vec<usize>) = all.into_iter().unzip();
    // SAFETY: the caller's guarantees; `count` is read before either write changes it.
    unsafe {
        check(!count.is_null())?;
        let room = count.read();
        hand_out_edges(&f, from, edges, count)?;
        if !to.is_null() {
            count.write(room);
            hand_out(&t, to, count)?;
        }
    }
    Ok(())
}

/// A node's dependencies (`dependents` false) or the nodes that depend on it.
///
/// # Safety
/// As [`hand_out_edges`].
unsafe fn neighbours(
    node: usize,
    out: *mut usize,
    edges: *mut EdgeData,
    count: *mut usize,
    dependents: bool,
) -> Res<()> {
    let found = with_node(node, |dag, i| {
        Ok(if dependents {
            dag.nodes
                .iter()
                .filter(|n| n.deps.contains(&node))
                .map(|n| n.handle)
                .collect()
        } else {
            dag.nodes[i].deps.clone()
        })
    })?;
    // SAFETY: the caller's guarantees are hand_out_edges's.
    unsafe { hand_out_edges(&found, out, edges, count) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(handle: usize, deps: &[usize]) -> Node {
        Node {
            handle,
            work: Work::Empty,
            deps: deps.to_vec(),
        }
    }

    #[test]
    fn nodes_run_after_their_dependencies_and_otherwise_in_the_order_they_were_added() {
        // A diamond added out of order: 40 → {10, 30} → 20, and 50 alone.
        let dag = Dag {
            nodes: vec![
                node(10, &[40]),
                node(20, &[10, 30]),
                node(30, &[40]),
                node(40, &[]),
                node(50, &[]),
            ],
            ..Dag::default()
        };
        let order: Vec<usize> = dag
            .topological()
            .unwrap()
            .into_iter()
            .map(|i| dag.nodes[i].handle)
            .collect();
        assert_eq!(order, [40, 10, 30, 20, 50]);
        assert_eq!(dag.edges(), [(40, 10), (10, 20), (30, 20), (40, 30)]);
    }

    #[test]
    fn a_cycle_is_refused() {
        let dag = Dag {
            nodes: vec![node(1, &[3]), node(2, &[1]), node(3, &[2]), node(4, &[])],
            ..Dag::default()
        };
        assert_eq!(dag.topological(), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
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

    #[test]
    fn plans_of_another_shape_are_not_taken_by_an_update() {
        let step = |node, what| Step { node, what };
        let empty = || Planned::Work(Work::Empty);
        let old = vec![
            step(1, empty()),
            step(2, Planned::Child(vec![step(3, empty())])),
        ];
        let same = vec![
            step(7, empty()),
            step(8, Planned::Child(vec![step(9, empty())])),
        ];
        assert_eq!(shape_differs(&old, &same), None);
        let mut plan = Plan { steps: old.clone() };
        assert_eq!(plan.update_from(Plan { steps: same }), Ok(()));
        // The updated plan keeps its own node handles.
        assert_eq!(plan.steps[1].node, 2);
        let typed = vec![step(7, Planned::Child(vec![])), step(8, empty())];
        assert_eq!(
            shape_differs(&old, &typed),
            Some((crate::abi::graph::UPDATE_NODE_TYPE_CHANGED, 1))
        );
        assert_eq!(
            shape_differs(&old, &old[..1]),
            Some((crate::abi::graph::UPDATE_TOPOLOGY_CHANGED, 0))
        );
    }
}
