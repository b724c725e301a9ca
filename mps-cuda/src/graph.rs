//! Stream capture and graphs, as exported functions: work given to a capturing stream is
//! recorded by the server instead of run, made into an executable graph, and launched again and
//! again (each launch one command for the server), as `cuStreamBeginCapture`,
//! `cuStreamEndCapture` and `cuGraphLaunch` document. CUDA's rules of capture, which the rest of
//! the library asks too, are `capture`'s.
//!
//! Every ABI of each function (its versions, its per-thread-default-stream variant) is an
//! exported function of its own.

use std::ffi::c_void;
use std::sync::{Arc, LazyLock};

use crate::abi::{CUresult, CUstream};
use crate::capture::{self, MODE_GLOBAL, MODE_RELAXED, STATUS_ACTIVE, refuse_in_capture};
use crate::connection::{Connection, Graph, GraphExec, Res};
use crate::ffi::{check, exports, put};
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

/// priority of the stream it was captured in.
#[derive(Debug)]
struct GraphObj {
    conn: &'static Connection,
    graph: Graph,
    nodes: u64,
    priority: i32,
}

/// An executable graph; with `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`, the priority its
/// kernel nodes ask for.
#[derive(Debug)]
struct ExecObj {
    conn: &'static Connection,
    exec: GraphExec,
    node_priority: Option<i32>,
}

static GRAPHS: LazyLock<Registry<GraphObj>> = LazyLock::new(Registry::default);
/// Memoised: a launch finds its executable graph in the thread's memo (see [`crate::memo`]).
static EXECS: LazyLock<Registry<ExecObj>> = LazyLock::new(Registry::memoised);

// ----- capture -----

fn begin(h: CUstream, mode: u32, per_thread: bool) -> Res<()> {
    check(mode <= MODE_RELAXED)?;
    let t = resolve(h, per_thread)?;
    let blocking = match t.kind {
        Kind::Legacy => return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        Kind::Blocking(_) => true,
        Kind::Independent => false,
    };
    capture::refuse_second(&t)?;
    let (_, priority) = properties(h, per_thread)?;
    capture::begin(&t, blocking, mode, priority)
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
    let (handle, _) = GRAPHS.insert_with(|_| GraphObj {
        conn: t.conn,
        graph,
        nodes,
        priority,
    });
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
             exist outside the mps server (graphs are built only by capture); returning \
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
    let graph = GRAPHS.get(g).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
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
    // Allocation nodes, which AUTO_FREE_ON_LAUNCH is about, are never captured here.
    let exec = graph.conn.graph_instantiate(graph.graph)?;
    let node_priority = (flags & INSTANTIATE_USE_NODE_PRIORITY != 0).then_some(graph.priority);
    let (handle, _) = EXECS.insert_with(|_| ExecObj {
        conn: graph.conn,
        exec,
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

/// An upload has nothing to do: the server's executable graph is ready once instantiated.
fn upload(e: usize, h: CUstream, per_thread: bool) -> Res<()> {
    exec(e)?;
    resolve(h, per_thread).map(drop)
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
            conn.graph_launch(exec.exec, stream)
        },
    )
}

// ----- the exports -----

exports! {
    /// The CUDA 10.0 form, without a mode: global, CUDA's default.
    pub fn cuStreamBeginCapture(h: CUstream) ["cuStreamBeginCapture" 10000]
        per_thread cuStreamBeginCapture_ptsz = |per_thread| begin(h, MODE_GLOBAL, per_thread);

    pub fn cuStreamBeginCapture_v2(h: CUstream, mode: u32) ["cuStreamBeginCapture" 10010]
        per_thread cuStreamBeginCapture_v2_ptsz = |per_thread| begin(h, mode, per_thread);

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

    /// The number of nodes of a graph (`nodes` NULL): what programs ask to see that a capture
    /// recorded something (PyTorch's `CUDAGraph` does). The nodes themselves exist only on the
    /// server: asking for them is `CUDA_ERROR_NOT_SUPPORTED`.
    ///
    /// # Safety
    /// `count` must be NULL or writable.
    pub unsafe fn cuGraphGetNodes(
        g: usize,
        nodes: *mut usize,
        count: *mut usize,
    ) ["cuGraphGetNodes" 10000] = {
        check(!count.is_null())?;
        let graph = GRAPHS.get(g).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if !nodes.is_null() {
            log::once("cuGraphGetNodes nodes", || {
                "cuGraphGetNodes: a graph's node handles exist only on the mps server (graphs are \
                 built only by capture); returning CUDA_ERROR_NOT_SUPPORTED (ask for the count \
                 only, with nodes NULL)"
                    .to_string()
            });
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(count, graph.nodes as usize) }
    };

    /// Executable graphs made from it live on.
    pub fn cuGraphDestroy(g: usize) ["cuGraphDestroy" 10000] = {
        let graph = GRAPHS.remove(g).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        graph.conn.graph_destroy(graph.graph)
    };

    /// Launches already posted still run.
    pub fn cuGraphExecDestroy(e: usize) ["cuGraphExecDestroy" 10000] = {
        let exec = EXECS.remove(e).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        exec.conn.graph_exec_destroy(exec.exec)
    };
}
