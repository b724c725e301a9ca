//! Stream capture and executable graphs, as exported functions: work given to a capturing
//! stream is recorded by the server instead of run, made into an executable graph, and launched
//! again and again (each launch one command for the server), as `cuStreamBeginCapture`,
//! `cuStreamEndCapture` and `cuGraphLaunch` document. CUDA's rules of capture, which the rest of
//! the library asks too, are `capture`'s; graphs built node by node, and the registry of both
//! kinds, `graph_build`'s; what an instantiation of a built graph runs, `graph_plan`'s.
//!
//! An executable graph made from a built graph keeps the plan it was made from: an update of
//! its nodes (`cuGraphExecKernelNodeSetParams`, ..., `cuGraphExecUpdate`) edits that plan, and
//! the next launch (or upload) makes the server's executable graph anew from it, once however
//! many nodes were updated (XLA updates its command buffers node by node before a launch); a
//! launch already posted runs what it was posted with. What the update asks is checked at once;
//! what only the server checks fails the launch that makes it. Updating the nodes of one made
//! from a captured graph is refused (its nodes exist only on the server); `cuGraphExecUpdate`
//! with another captured graph makes it anew from that graph. A capture into a built graph
//! (`cuStreamBeginCaptureToGraph`) is a capture as any other until it ends, when its work is
//! added to that graph.
//!
//! Every ABI of each function (its versions, its per-thread-default-stream variant) is an
//! exported function of its own.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use crate::abi::graph::{
    EdgeData, ExecUpdateResultInfo, KernelNodeParams, Memcpy3D, MemsetNodeParams, NodeParams,
    UPDATE_NOT_SUPPORTED, UPDATE_SUCCESS,
};
use crate::abi::{CUresult, CUstream};
use crate::capture::{self, MODE_GLOBAL, MODE_RELAXED, STATUS_ACTIVE, refuse_in_capture};
use crate::connection::{Connection, GraphExec, Res, Stream};
use crate::ffi::{check, exports, lock, put};
use crate::graph_build::{self, GraphKind};
use crate::graph_node::{self, Parsed, Work};
use crate::graph_plan::{self, Plan};
use crate::handles::Registry;
use crate::log;
use crate::memo::{Memo, through};
use crate::objects::Kind;
use crate::stream::{for_work, properties, resolve, with_target};

/// `CUgraphInstantiate_flags`.
const INSTANTIATE_AUTO_FREE_ON_LAUNCH: u64 = 0x1;
const INSTANTIATE_UPLOAD: u64 = 0x2;
const INSTANTIATE_DEVICE_LAUNCH: u64 = 0x4;
const INSTANTIATE_USE_NODE_PRIORITY: u64 = 0x8;

/// `CUgraphInstantiateResult`: `CUDA_GRAPH_INSTANTIATE_SUCCESS` and `_ERROR`.
const INSTANTIATE_SUCCESS: u32 = 0;
const INSTANTIATE_ERROR: u32 = 1;

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
#[derive(Debug)]
pub struct InstantiateParams {
    flags: u64,
    upload_stream: CUstream,
    err_node_out: *mut c_void,
    result_out: u32,
}

thread_local! {
    /// Executable graphs this thread launched, by handle.
    static LAUNCHED: Memo<usize, Arc<ExecObj>> = Memo::default();
}

/// An executable graph: the server's executable graphs, launched one after another (one for a
/// captured graph; replaced by an update), the flags it was instantiated with, the plan of the
/// built graph it was made from (`None` for a captured one) and, with
/// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`, the priority its kernel nodes ask for.
#[derive(Debug)]
struct ExecObj {
    conn: &'static Connection,
    execs: RwLock<Vec<GraphExec>>,
    flags: u64,
    plan: Option<Mutex<Plan>>,
    /// The plan was edited since the server's graphs were made from it.
    stale: AtomicBool,
    node_priority: Option<i32>,
}

impl ExecObj {
    /// Posts its launch into `stream` of `conn`, made anew first where the plan was edited
    /// since.
    #[inline]
    fn launch(&self, conn: &Connection, stream: Stream) -> Res<()> {
        self.refresh_if_stale()?;
        let execs = self.execs.read().unwrap_or_else(|p| p.into_inner());
        execs.iter().try_for_each(|x| conn.graph_launch(*x, stream))
    }

    #[inline]
    fn refresh_if_stale(&self) -> Res<()> {
        if self.stale.load(Ordering::Acquire) {
            self.refresh()?;
        }
        Ok(())
    }

    #[inline(never)]
    fn refresh(&self) -> Res<()> {
        let Some(plan) = &self.plan else {
            return Ok(());
        };
        let plan = lock(plan);
        if !self.stale.load(Ordering::Acquire) {
            return Ok(());
        }
        let (conn, new) = plan.instantiate()?;
        if conn.ordinal() != self.conn.ordinal() {
            // An executable graph stays on its device (an update keeps each node's).
            new.into_iter()
                .try_for_each(|x| conn.graph_exec_destroy(x))?;
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        self.stale.store(false, Ordering::Release);
        self.replace(new)
    }

    /// Puts `new` in the place of the server's graphs, which go (a launch already posted keeps
    /// them until it has run); the first failure is returned once each has been tried.
    fn replace(&self, new: Vec<GraphExec>) -> Res<()> {
        let old = std::mem::replace(
            &mut *self.execs.write().unwrap_or_else(|p| p.into_inner()),
            new,
        );
        let mut first = Ok(());
        for x in old {
            let r = self.conn.graph_exec_destroy(x);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

static EXECS: LazyLock<Registry<ExecObj>> = LazyLock::new(Registry::memoised);

// ----- capture -----

/// A built graph a capture goes into, and the nodes the captured work follows there.
type CaptureInto = (usize, Vec<usize>);

/// Streams capturing into a built graph (`cuStreamBeginCaptureToGraph`), by (device, stream).
static TO_GRAPH: LazyLock<Mutex<HashMap<(i32, Stream), CaptureInto>>> =
    LazyLock::new(Mutex::default);

/// Begins capturing stream `h`; `to` is the built graph the capture goes into and the nodes it
/// follows there, for `cuStreamBeginCaptureToGraph`.
fn begin(h: CUstream, mode: u32, per_thread: bool, to: Option<CaptureInto>) -> Res<()> {
    check(mode <= MODE_RELAXED)?;
    let t = resolve(h, per_thread)?;
    if let Some((g, deps)) = &to {
        graph_build::check_nodes(*g, deps)?;
    }
    let blocking = match t.kind {
        Kind::Legacy => return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        Kind::Blocking(_) => true,
        Kind::Independent => false,
    };
    capture::refuse_second(&t)?;
    let (_, priority) = properties(h, per_thread)?;
    capture::begin(&t, blocking, mode, priority)?;
    let key = (t.conn.ordinal(), t.stream);
    let mut to_graph = lock(&TO_GRAPH);
    match to {
        Some(to) => to_graph.insert(key, to),
        None => to_graph.remove(&key),
    };
    Ok(())
}

/// `cuStreamBeginCaptureToGraph`: the captured work goes into built graph `g` after the
/// `n` nodes at `deps`, as one child-graph node holding the server's graph of it.
///
/// # Safety
/// `deps` must be NULL or readable for `n` nodes, `edges` NULL or readable for `n` edges.
unsafe fn begin_to_graph(
    h: CUstream,
    g: usize,
    deps: *const usize,
    edges: *const EdgeData,
    n: usize,
    mode: u32,
    per_thread: bool,
) -> Res<()> {
    // SAFETY: the caller's guarantees are read_deps's.
    let deps = unsafe { graph_build::read_deps(deps, edges, n) }?;
    begin(h, mode, per_thread, Some((g, deps)))
}

fn end(h: CUstream, ph: *mut usize, per_thread: bool) -> Res<()> {
    check(!ph.is_null())?;
    let t = resolve(h, per_thread)?;
    let capture::Ended {
        invalidated,
        wrong_thread,
        priority,
    } = capture::end(&t)?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(ph, 0) }?;
    let to = lock(&TO_GRAPH).remove(&(t.conn.ordinal(), t.stream));
    let (graph, nodes) = match t.conn.stream_end_capture(t.stream) {
        Ok(g) => g,
        // The server spoilt the capture: a command in it failed (its message is logged).
        Err(CUresult::CUDA_ERROR_INVALID_VALUE) => {
            return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        }
        Err(e) => return Err(e),
    };
    if wrong_thread || invalidated {
        t.conn.graph_destroy(graph)?;
        return Err(if wrong_thread {
            CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
        } else {
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        });
    }
    let handle = match to {
        // CUDA adds no node for a capture of nothing.
        Some((g, _)) if nodes == 0 => {
            t.conn.graph_destroy(graph)?;
            g
        }
        Some((g, deps)) => {
            graph_build::add_captured(g, deps, (t.conn, graph, nodes, priority))?;
            g
        }
        None => graph_build::insert_captured(t.conn, graph, nodes, priority),
    };
    // SAFETY: as above.
    unsafe { put(ph, handle) }
}

fn is_capturing(h: CUstream, out: *mut u32, per_thread: bool) -> Res<()> {
    check(!out.is_null())?;
    let (s, _) = with_target(h, per_thread, capture::status)?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, s) }
}

/// What `cuStreamGetCaptureInfo` may be asked besides the status and ID: the graph being
/// built, its dependency nodes (with their edge data) and their number.
struct Nodes {
    graph: *mut usize,
    deps: *mut *const usize,
    edges: *mut *const c_void,
    count: *mut usize,
}

impl Nodes {
    const NONE: Nodes = Nodes {
        graph: std::ptr::null_mut(),
        deps: std::ptr::null_mut(),
        edges: std::ptr::null_mut(),
        count: std::ptr::null_mut(),
    };

    fn asked(&self) -> bool {
        !self.graph.is_null()
            || !self.deps.is_null()
            || !self.edges.is_null()
            || !self.count.is_null()
    }
}

fn capture_info(
    h: CUstream,
    status_out: *mut u32,
    id_out: *mut u64,
    nodes: Nodes,
    per_thread: bool,
) -> Res<()> {
    check(!status_out.is_null() && (nodes.edges.is_null() || !nodes.deps.is_null()))?;
    let (s, id) = with_target(h, per_thread, capture::status)?;
    if s == STATUS_ACTIVE && nodes.asked() {
        log::once("cuStreamGetCaptureInfo nodes", || {
            "cuStreamGetCaptureInfo: the graph being captured and its dependency nodes do not \
             exist outside the mps server (a capture is recorded there); returning \
             CUDA_ERROR_NOT_SUPPORTED (ask for the status and ID only)"
                .to_string()
        });
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    // SAFETY: checked non-null; the caller guarantees the outputs it passes are writable.
    unsafe {
        put(status_out, s)?;
        if s == STATUS_ACTIVE && !id_out.is_null() {
            put(id_out, id)?;
        }
    }
    Ok(())
}

// ----- graphs -----

/// Instantiates graph `g` with `flags`; `upload` is where `CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD`
/// uploads it, for the form that has one.
fn instantiate(ph: *mut usize, g: usize, flags: u64, upload: Option<(CUstream, bool)>) -> Res<()> {
    check(!ph.is_null())?;
    let graph = graph_build::graph(g)?;
    let known = INSTANTIATE_AUTO_FREE_ON_LAUNCH
        | INSTANTIATE_DEVICE_LAUNCH
        | INSTANTIATE_USE_NODE_PRIORITY
        | upload.map_or(0, |_| INSTANTIATE_UPLOAD);
    check(flags & !known == 0)?;
    if flags & INSTANTIATE_DEVICE_LAUNCH != 0 {
        log::once("CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH", || {
            "graph instantiation with CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH is not supported \
             through mps (graphs are launched by the server); returning CUDA_ERROR_NOT_SUPPORTED"
                .to_string()
        });
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    // An upload has nothing to do (the server's graph is ready once instantiated): the stream
    // is only checked.
    if let Some((h, per_thread)) = upload.filter(|_| flags & INSTANTIATE_UPLOAD != 0) {
        resolve(h, per_thread)?;
    }
    // Allocation nodes, which AUTO_FREE_ON_LAUNCH is about, are never made here.
    let (conn, execs, plan, node_priority) = match &graph.kind {
        GraphKind::Captured(c) => {
            let priority = (flags & INSTANTIATE_USE_NODE_PRIORITY != 0).then_some(c.priority);
            let s = &c.server;
            (
                s.conn,
                vec![s.conn.graph_instantiate(s.graph)?],
                None,
                priority,
            )
        }
        // Kernel nodes ask for no priority of their own here: a launch runs with its stream's.
        GraphKind::Built(_) => {
            let plan = graph_plan::plan(g, "instantiating")?;
            let (conn, execs) = plan.instantiate()?;
            (conn, execs, Some(Mutex::new(plan)), None)
        }
    };
    let (handle, _) = EXECS.insert_with(|_| ExecObj {
        conn,
        execs: RwLock::new(execs),
        flags,
        plan,
        stale: AtomicBool::new(false),
        node_priority,
    });
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(ph, handle) }
}

/// The form before CUDA 11.4, with an error node and a log. A failure leaves no node (mps has
/// none) and says why in the log.
///
/// # Safety
/// `ph` must be NULL or writable; `err_node` NULL or writable; `log_buf` NULL or writable for
/// `log_len` bytes.
unsafe fn instantiate_logged(
    ph: *mut usize,
    g: usize,
    err_node: *mut usize,
    log_buf: *mut u8,
    log_len: usize,
) -> Res<()> {
    let r = instantiate(ph, g, 0, None);
    if let Err(e) = r {
        if !err_node.is_null() {
            // SAFETY: non-null; the caller guarantees it is writable.
            unsafe { err_node.write(0) };
        }
        if !log_buf.is_null() && log_len > 0 {
            let text = format!("mps: instantiation failed with {e:?}\n");
            let n = text.len().min(log_len - 1);
            // SAFETY: n + 1 <= log_len bytes, which the caller guarantees are writable.
            unsafe {
                std::ptr::copy_nonoverlapping(text.as_ptr(), log_buf, n);
                log_buf.add(n).write(0);
            }
        }
    }
    r
}

/// # Safety
/// `ph` must be NULL or writable; `params` NULL or readable and writable.
unsafe fn instantiate_with_params(
    ph: *mut usize,
    g: usize,
    params: *mut InstantiateParams,
    per_thread: bool,
) -> Res<()> {
    check(!params.is_null())?;
    // SAFETY: checked non-null; the caller guarantees it is readable and writable.
    let p = unsafe { &mut *params };
    let r = instantiate(ph, g, p.flags, Some((p.upload_stream, per_thread)));
    p.err_node_out = std::ptr::null_mut();
    p.result_out = match r {
        Ok(()) => INSTANTIATE_SUCCESS,
        Err(_) => INSTANTIATE_ERROR,
    };
    r
}

fn exec(e: usize) -> Res<Arc<ExecObj>> {
    EXECS.get(e).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// The server's executable graph is ready once instantiated: an upload makes it anew where an
/// update left it stale, and otherwise has nothing to do.
fn upload(e: usize, h: CUstream, per_thread: bool) -> Res<()> {
    let exec = exec(e)?;
    resolve(h, per_thread)?;
    exec.refresh_if_stale()
}

/// Posted without waiting, as kernel launches are. The graph's work runs with the priority of
/// the stream it is launched into: where it was instantiated to use its nodes' priority (that
/// of the stream it was captured in) and the two differ, that is said once.
fn launch(e: usize, h: CUstream, per_thread: bool) -> Res<()> {
    through(
        &LAUNCHED,
        e,
        || exec(e),
        |exec| {
            if let Some(wanted) = exec.node_priority
                && properties(h, per_thread)?.1 != wanted
            {
                log::once("graph node priority", || {
                    format!(
                        "a graph instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY \
                     (captured at priority {wanted}) runs through mps with the priority of the \
                     stream it is launched into, which differs"
                    )
                });
            }
            let (stream, conn) = for_work(h, per_thread)?;
            refuse_in_capture(conn, stream, "a graph launch (a child graph)")?;
            if conn.ordinal() != exec.conn.ordinal() {
                // The graph lives on its device's server; CUDA launches a graph on its own device
                // only.
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            exec.launch(conn, stream)
        },
    )
}

// ----- updates -----

/// Refuses to edit the nodes of an executable graph made from a captured graph (`what`).
fn refuse_captured_exec(what: &str) -> CUresult {
    log::once(&format!("captured exec: {what}"), || {
        format!(
            "{what} of an executable graph made from a captured graph is not supported through \
             mps (its nodes exist only on the server; cuGraphExecUpdate with a new capture \
             works); returning CUDA_ERROR_NOT_SUPPORTED"
        )
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// Edits executable graph `e`'s plan with `edit` (`what` names it), for the next launch to make
/// the server's graph anew from. On a failure the plan is as it was.
fn update(e: usize, what: &str, edit: impl FnOnce(&mut Plan) -> Res<()>) -> Res<()> {
    let exec = exec(e)?;
    let plan = exec
        .plan
        .as_ref()
        .ok_or_else(|| refuse_captured_exec(what))?;
    // Each edit checks everything before it changes anything: the plan is edited in place.
    edit(&mut lock(plan))?;
    exec.stale.store(true, Ordering::Release);
    Ok(())
}

/// Node `node` of executable graph `e` takes `work`.
fn update_node(e: usize, node: usize, work: Res<Work>, what: &str) -> Res<()> {
    let work = work?;
    update(e, what, |plan| plan.set(node, work))
}

/// Child-graph node `node` of `e` takes the work of graph `child`, of the same kind and, built,
/// of the same shape.
fn update_child(e: usize, node: usize, child: usize) -> Res<()> {
    update(e, "cuGraphExecChildGraphNodeSetParams", |plan| {
        plan.set_child(node, child)
    })
}

/// `cuGraphExecUpdate`: `e` takes the work of graph `g`, which must have the same shape (for a
/// built graph: its nodes' types in the same order; a captured graph's shape is the server's,
/// and not compared). A failure of that kind is `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`, with its
/// `CUgraphExecUpdateResult` and the node it is about (0: none).
fn exec_update(e: usize, g: usize) -> Result<(), (CUresult, u32, usize)> {
    let plain = |r: CUresult| (r, UPDATE_SUCCESS, 0);
    let exec = exec(e).map_err(plain)?;
    let graph = graph_build::graph(g).map_err(plain)?;
    let failed = |result, node| (CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, result, node);
    match (&exec.plan, &graph.kind) {
        (Some(plan), GraphKind::Built(_)) => {
            let new = graph_plan::plan(g, "cuGraphExecUpdate").map_err(plain)?;
            lock(plan)
                .update_from(new)
                .map_err(|(result, node)| failed(result, node))?;
            exec.stale.store(true, Ordering::Release);
            Ok(())
        }
        (None, GraphKind::Captured(c)) => {
            let s = &c.server;
            if s.conn.ordinal() != exec.conn.ordinal() {
                return Err(plain(CUresult::CUDA_ERROR_INVALID_VALUE));
            }
            let new = s.conn.graph_instantiate(s.graph).map_err(plain)?;
            exec.replace(vec![new]).map_err(plain)
        }
        _ => {
            log::once("cuGraphExecUpdate kinds", || {
                "cuGraphExecUpdate between a captured graph and one built node by node is not \
                 supported through mps; it fails with CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED"
                    .into()
            });
            Err(failed(UPDATE_NOT_SUPPORTED, 0))
        }
    }
}

// ----- the exports -----

exports! {
    /// The CUDA 10.0 form, without a mode: global, CUDA's default.
    pub fn cuStreamBeginCapture(h: CUstream) ["cuStreamBeginCapture" 10000]
        per_thread cuStreamBeginCapture_ptsz = |per_thread|
            begin(h, MODE_GLOBAL, per_thread, None);

    pub fn cuStreamBeginCapture_v2(h: CUstream, mode: u32) ["cuStreamBeginCapture" 10010]
        per_thread cuStreamBeginCapture_v2_ptsz = |per_thread| begin(h, mode, per_thread, None);

    /// The capture goes into built graph `g`, after the nodes `deps` there, as one child-graph
    /// node holding the server's graph of it (none for a capture of nothing); ending it gives
    /// `g`.
    ///
    /// # Safety
    /// `deps` must be NULL or readable for `n` nodes, `edges` NULL or readable for `n` edges.
    pub unsafe fn cuStreamBeginCaptureToGraph(
        h: CUstream,
        g: usize,
        deps: *const usize,
        edges: *const EdgeData,
        n: usize,
        mode: u32,
    ) ["cuStreamBeginCaptureToGraph" 12030]
        per_thread cuStreamBeginCaptureToGraph_ptsz = |per_thread|
            // SAFETY: the caller's guarantees are begin_to_graph's.
            unsafe { begin_to_graph(h, g, deps, edges, n, mode, per_thread) };

    /// # Safety
    /// `ph` must be NULL or writable.
    pub unsafe fn cuStreamEndCapture(h: CUstream, ph: *mut usize) ["cuStreamEndCapture" 10000]
        per_thread cuStreamEndCapture_ptsz = |per_thread| end(h, ph, per_thread);

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuStreamIsCapturing(h: CUstream, out: *mut u32) ["cuStreamIsCapturing" 10000]
        per_thread cuStreamIsCapturing_ptsz = |per_thread| is_capturing(h, out, per_thread);

    /// The CUDA 10.1 form: status and ID.
    ///
    /// # Safety
    /// `status` must be NULL or writable; `id` NULL or writable.
    pub unsafe fn cuStreamGetCaptureInfo(
        h: CUstream,
        status: *mut u32,
        id: *mut u64,
    ) ["cuStreamGetCaptureInfo" 10010]
        per_thread cuStreamGetCaptureInfo_ptsz = |per_thread|
            capture_info(h, status, id, Nodes::NONE, per_thread);

    /// The CUDA 11.3 form: also the graph and dependency nodes.
    ///
    /// # Safety
    /// Each output must be NULL or writable.
    pub unsafe fn cuStreamGetCaptureInfo_v2(
        h: CUstream,
        status: *mut u32,
        id: *mut u64,
        graph: *mut usize,
        deps: *mut *const usize,
        count: *mut usize,
    ) ["cuStreamGetCaptureInfo" 11030]
        per_thread cuStreamGetCaptureInfo_v2_ptsz = |per_thread| {
            let nodes = Nodes {
                graph,
                deps,
                edges: std::ptr::null_mut(),
                count,
            };
            capture_info(h, status, id, nodes, per_thread)
        };

    /// The CUDA 12.3 form (CUDA 13's `cuStreamGetCaptureInfo`): also the edge data.
    ///
    /// # Safety
    /// Each output must be NULL or writable.
    pub unsafe fn cuStreamGetCaptureInfo_v3(
        h: CUstream,
        status: *mut u32,
        id: *mut u64,
        graph: *mut usize,
        deps: *mut *const usize,
        edges: *mut *const c_void,
        count: *mut usize,
    ) ["cuStreamGetCaptureInfo" 12030]
        per_thread cuStreamGetCaptureInfo_v3_ptsz = |per_thread| {
            let nodes = Nodes {
                graph,
                deps,
                edges,
                count,
            };
            capture_info(h, status, id, nodes, per_thread)
        };

    /// Sets the calling thread's capture interaction mode to `*mode` and returns the old one there.
    ///
    /// # Safety
    /// `mode` must be NULL or readable and writable.
    pub unsafe fn cuThreadExchangeStreamCaptureMode(
        mode: *mut u32,
    ) ["cuThreadExchangeStreamCaptureMode" 10010] = {
        check(!mode.is_null())?;
        // SAFETY: checked non-null; the caller guarantees it is readable and writable.
        let new = unsafe { mode.read() };
        check(new <= MODE_RELAXED)?;
        let old = capture::exchange_mode(new);
        // SAFETY: as above.
        unsafe { put(mode, old) }
    };

    /// # Safety
    /// As `instantiate_logged`.
    pub unsafe fn cuGraphInstantiate(
        ph: *mut usize,
        g: usize,
        err_node: *mut usize,
        log_buf: *mut u8,
        log_len: usize,
    ) ["cuGraphInstantiate" 10000]
        alias cuGraphInstantiate_v2 ["cuGraphInstantiate" 11000] =
        // SAFETY: the caller's guarantees are instantiate_logged's.
        unsafe { instantiate_logged(ph, g, err_node, log_buf, log_len) };

    /// # Safety
    /// `ph` must be NULL or writable.
    pub unsafe fn cuGraphInstantiateWithFlags(
        ph: *mut usize,
        g: usize,
        flags: u64,
    ) ["cuGraphInstantiate" 12000, "cuGraphInstantiateWithFlags" 11040] =
        instantiate(ph, g, flags, None);

    /// # Safety
    /// `ph` must be NULL or writable; `params` NULL or readable and writable.
    pub unsafe fn cuGraphInstantiateWithParams(
        ph: *mut usize,
        g: usize,
        params: *mut InstantiateParams,
    ) ["cuGraphInstantiateWithParams" 12000]
        per_thread cuGraphInstantiateWithParams_ptsz = |per_thread|
            // SAFETY: the caller's guarantees are instantiate_with_params's.
            unsafe { instantiate_with_params(ph, g, params, per_thread) };

    pub fn cuGraphUpload(e: usize, h: CUstream) ["cuGraphUpload" 11010]
        per_thread cuGraphUpload_ptsz = |per_thread| upload(e, h, per_thread);

    pub fn cuGraphLaunch(e: usize, h: CUstream) ["cuGraphLaunch" 10000]
        per_thread cuGraphLaunch_ptsz = |per_thread| launch(e, h, per_thread);

    /// Launches already posted still run.
    pub fn cuGraphExecDestroy(e: usize) ["cuGraphExecDestroy" 10000] = {
        let exec = EXECS.remove(e).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        exec.replace(Vec::new())
    };

    /// # Safety
    /// `flags` must be NULL or writable.
    pub unsafe fn cuGraphExecGetFlags(e: usize, flags: *mut u64) ["cuGraphExecGetFlags" 12000] = {
        check(!flags.is_null())?;
        let f = exec(e)?.flags;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(flags, f) }
    };

    /// The CUDA 11.1 form, with `CUDA_KERNEL_NODE_PARAMS_v1`: in the current context.
    ///
    /// # Safety
    /// As `graph_node::kernel`.
    pub unsafe fn cuGraphExecKernelNodeSetParams(
        e: usize,
        node: usize,
        p: *const KernelNodeParams,
    ) ["cuGraphExecKernelNodeSetParams" 10010] =
        // SAFETY: the caller's guarantee is kernel's.
        update_node(e, node, unsafe { graph_node::kernel(p, false) }, "a kernel node's update");

    /// # Safety
    /// As `graph_node::kernel`, with `CUDA_KERNEL_NODE_PARAMS_v2`.
    pub unsafe fn cuGraphExecKernelNodeSetParams_v2(
        e: usize,
        node: usize,
        p: *const KernelNodeParams,
    ) ["cuGraphExecKernelNodeSetParams" 12000] =
        // SAFETY: the caller's guarantee is kernel's.
        update_node(e, node, unsafe { graph_node::kernel(p, true) }, "a kernel node's update");

    /// # Safety
    /// As `graph_node::memset`.
    pub unsafe fn cuGraphExecMemsetNodeSetParams(
        e: usize,
        node: usize,
        p: *const MemsetNodeParams,
        ctx: usize,
    ) ["cuGraphExecMemsetNodeSetParams" 10020] =
        // SAFETY: the caller's guarantee is memset's.
        update_node(e, node, unsafe { graph_node::memset(p, ctx) }, "a memset node's update");

    /// # Safety
    /// As `graph_node::memcpy`.
    pub unsafe fn cuGraphExecMemcpyNodeSetParams(
        e: usize,
        node: usize,
        p: *const Memcpy3D,
        ctx: usize,
    ) ["cuGraphExecMemcpyNodeSetParams" 10020] =
        // SAFETY: the caller's guarantee is memcpy's.
        update_node(e, node, unsafe { graph_node::memcpy(p, ctx) }, "a memcpy node's update");

    pub fn cuGraphExecChildGraphNodeSetParams(
        e: usize,
        node: usize,
        child: usize,
    ) ["cuGraphExecChildGraphNodeSetParams" 11010] = update_child(e, node, child);

    /// Kernel, memset, memcpy and child-graph nodes.
    ///
    /// # Safety
    /// As `graph_node::node_params`.
    pub unsafe fn cuGraphExecNodeSetParams(
        e: usize,
        node: usize,
        p: *const NodeParams,
    ) ["cuGraphExecNodeSetParams" 12020] = {
        // SAFETY: the caller's guarantee is node_params's.
        match unsafe { graph_node::node_params(p) }? {
            Parsed::Work(w) => update_node(e, node, Ok(w), "a node's update"),
            Parsed::Child { graph, .. } => update_child(e, node, graph),
        }
    };

    /// The CUDA 10.2 form, with an error node and a result.
    ///
    /// # Safety
    /// `err_node` and `result` must be NULL or writable.
    pub unsafe fn cuGraphExecUpdate(
        e: usize,
        g: usize,
        err_node: *mut usize,
        result: *mut u32,
    ) ["cuGraphExecUpdate" 10020] = {
        check(!err_node.is_null() && !result.is_null())?;
        let (r, res, node) = match exec_update(e, g) {
            Ok(()) => (Ok(()), UPDATE_SUCCESS, 0),
            Err((r, res, node)) => (Err(r), res, node),
        };
        // SAFETY: checked non-null; the caller guarantees they are writable.
        unsafe {
            put(err_node, node)?;
            put(result, res)?;
        }
        r
    };

    /// # Safety
    /// `info` must be NULL or writable.
    pub unsafe fn cuGraphExecUpdate_v2(
        e: usize,
        g: usize,
        info: *mut ExecUpdateResultInfo,
    ) ["cuGraphExecUpdate" 12000] = {
        check(!info.is_null())?;
        let (r, result, node) = match exec_update(e, g) {
            Ok(()) => (Ok(()), UPDATE_SUCCESS, 0),
            Err((r, res, node)) => (Err(r), res, node),
        };
        let out = ExecUpdateResultInfo {
            result,
            error_node: node,
            error_from_node: 0,
        };
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(info, out) }?;
        r
    };
}
