//! Graphs as a program holds them: built node by node (CUDA's explicit graph API: XLA builds its
//! command buffers so), or captured from a stream (`graph`'s), in one registry, so that one
//! handle space names both and no handle is taken for the other kind.
//!
//! A built graph is a DAG kept in this library: its nodes (`graph_node`'s work: kernels,
//! memsets, copies, empty nodes) and child graphs, built or captured, cloned into the node or
//! moved there (a capture into a built graph, `cuStreamBeginCaptureToGraph`, is one such node),
//! and its edges. The node functions answer from it; an instantiation takes a plan of it
//! (`graph_plan`). A captured graph exists only on the server: editing it node by node is
//! refused with `CUDA_ERROR_NOT_SUPPORTED`, said once; it may be cloned (the copy is the same
//! server graph, which never changes) and be a child graph.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use crate::abi::CUresult;
use crate::abi::graph::{
    EdgeData, KERNEL_V1_BYTES, KernelNodeParams, MEMSET_V1_BYTES, Memcpy3D, MemsetNodeParams,
    NodeParams, OWNERSHIP_CLONE, OWNERSHIP_MOVE,
};
use crate::connection::{Connection, Graph, Res};
use crate::ffi::{check, exports, lock, put};
use crate::graph_node::{self, Kernel, Parsed, Work, kept, same_kind};
use crate::handles::Registry;
use crate::log;

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

/// The nodes of built graph `g` (a captured one is refused with `what`), each with its work, in
/// a topological order: each after its dependencies, otherwise in the order they were added.
pub(crate) fn ordered(g: usize, what: &str) -> Res<Vec<(usize, Work)>> {
    with_dag(g, what, |dag| {
        let order = dag.topological()?;
        Ok(order
            .into_iter()
            .map(|i| (dag.nodes[i].handle, dag.nodes[i].work.clone()))
            .collect())
    })
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
    // The pointers into the node's copy of the values stay valid while it keeps them.
    let p = with_kernel(node, |k| Ok(k.node_params()))?;
    let n = if v2 {
        size_of::<KernelNodeParams>()
    } else {
        KERNEL_V1_BYTES
    };
    // SAFETY: the caller guarantees `n` writable bytes.
    unsafe { std::ptr::copy_nonoverlapping((&raw const p).cast::<u8>(), out.cast::<u8>(), n) };
    Ok(())
}

/// Sets attribute `id` of kernel node `node` to the 64 bytes at `value` (see
/// `graph_node::attribute`).
///
/// # Safety
/// `value` must be NULL or readable for a `CUlaunchAttributeValue`.
unsafe fn set_attribute(node: usize, id: u32, value: *const u8) -> Res<()> {
    // SAFETY: the caller's guarantee is attribute's.
    let a = unsafe { graph_node::attribute(id, value) }?;
    with_node(node, |dag, i| match &mut dag.nodes[i].work {
        Work::Kernel(k) => {
            k.set_attribute(a);
            Ok(())
        }
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
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
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, graph_node::kernel(p, false)?) };
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
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, graph_node::kernel(p, true)?) };
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
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, graph_node::memset(p, ctx)?) };
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
        let (deps, work) = unsafe { (read_deps(deps, std::ptr::null(), n)?, graph_node::memcpy(p, ctx)?) };
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
        let (deps, parsed) = unsafe { (read_deps(deps, std::ptr::null(), n)?, graph_node::node_params(p)?) };
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
        let (deps, parsed) = unsafe { (read_deps(deps, edges, n)?, graph_node::node_params(p)?) };
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
        match unsafe { graph_node::node_params(p) }? {
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
        set_work(node, unsafe { graph_node::kernel(p, false) }?);

    /// # Safety
    /// As `kernel` (the v2 structure).
    pub unsafe fn cuGraphKernelNodeSetParams_v2(
        node: usize,
        p: *const KernelNodeParams,
    ) ["cuGraphKernelNodeSetParams" 12000] =
        // SAFETY: the caller's guarantee is kernel's.
        set_work(node, unsafe { graph_node::kernel(p, true) }?);

    /// # Safety
    /// `out` must be NULL or writable for a `CUDA_MEMSET_NODE_PARAMS`.
    pub unsafe fn cuGraphMemsetNodeGetParams(
        node: usize,
        out: *mut MemsetNodeParams,
    ) ["cuGraphMemsetNodeGetParams" 10000] = {
        check(!out.is_null())?;
        let p = with_work(node, |w| match w {
            Work::Memset(m) => Ok(m.node_params()),
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
            Work::Memset(m) => Ok(m.ctx()),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        // SAFETY: the caller's guarantee is memset's.
        set_work(node, unsafe { graph_node::memset(p, ctx) }?)
    };

    /// # Safety
    /// `out` must be NULL or writable for a `CUDA_MEMCPY3D`.
    pub unsafe fn cuGraphMemcpyNodeGetParams(
        node: usize,
        out: *mut Memcpy3D,
    ) ["cuGraphMemcpyNodeGetParams" 10000] = {
        check(!out.is_null())?;
        let p = with_work(node, |w| match w {
            Work::Copy(c) => Ok(c.params()),
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
            Work::Copy(c) => Ok(c.ctx()),
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })?;
        // SAFETY: the caller's guarantee is memcpy's.
        set_work(node, unsafe { graph_node::memcpy(p, ctx) }?)
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
        let v = with_kernel(node, |k| Ok(k.attribute(id)))?;
        // SAFETY: the caller guarantees 64 writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, v.len()) };
        Ok(())
    };

    pub fn cuGraphKernelNodeCopyAttributes(
        dst: usize,
        src: usize,
    ) ["cuGraphKernelNodeCopyAttributes" 11000] = {
        let from = with_kernel(src, |k| Ok(k.clone()))?;
        with_node(dst, |dag, i| match &mut dag.nodes[i].work {
            Work::Kernel(k) => {
                k.copy_attributes_from(&from);
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
}
