//! Stream capture and graphs: work given to a capturing stream is recorded by the server instead
//! of run, made into an executable graph, and launched again and again (each launch one command
//! for the server), as `cuStreamBeginCapture`, `cuStreamEndCapture` and `cuGraphLaunch` document.
//!
//! The server records one stream's copies through page-locked memory, memsets and kernel
//! launches (mps-server's `session/core/graphs.rs`). CUDA's rules of capture are kept here, so
//! that a program gets CUDA's results:
//! - capture on the legacy default stream is refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`);
//!   while a blocking stream captures, the legacy stream of its context cannot be used
//!   (`CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`, which invalidates the capture);
//! - synchronising or querying a capturing stream, or synchronising its context, is refused
//!   (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and invalidates the capture;
//! - a potentially unsafe call (allocating or freeing memory) is refused where the calling
//!   thread's capture mode (`cuThreadExchangeStreamCaptureMode`) prohibits it, and invalidates
//!   the captures that prohibit it;
//! - an invalidated capture refuses further work (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`) and
//!   ends without a graph; ending a capture that is not there is `CUDA_ERROR_ILLEGAL_STATE`, and
//!   ending a capture not begun in relaxed mode from another thread
//!   `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (the capture ends all the same, without a graph);
//! - synchronising the legacy stream while a stream of its context captures, a non-blocking one
//!   too, is refused (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and invalidates the captures.
//!
//! What mps cannot capture is refused with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, said once on
//! stderr, and invalidates the capture, so that no graph ever lacks work the program gave it:
//! events recorded in or waited for by a capturing stream (CUDA's cross-stream fork and join),
//! a graph launched into a capturing stream (a child graph), copies through pageable memory and
//! synchronous copies. The graph being built and its dependency nodes
//! (`cuStreamGetCaptureInfo`'s `graph_out`, ...) do not exist in the library: asking for them
//! during a capture is `CUDA_ERROR_NOT_SUPPORTED`.
//!
//! Past 600 lines: every ABI of each function (its versions, its per-thread-default-stream
//! variant) is an exported function of its own, over the rules above, which come first.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::thread::ThreadId;

use crate::abi::{CUresult, CUstream};
use crate::connection::{Connection, Graph, GraphExec, Res, Stream};
use crate::driver::{check, entry, lock, put};
use crate::handles::Registry;
use crate::log;
use crate::memo::{Memo, through};
use crate::stream::{Kind, Target, properties, resolve, with_target};

/// A stream of one device's server: stream handles are the server's, so two devices' streams
/// may share one.
type On = (i32, Stream);

/// The key of `stream` on `conn`'s device.
fn on(conn: &Connection, stream: Stream) -> On {
    (conn.ordinal(), stream)
}

/// `CUstreamCaptureMode`.
const MODE_GLOBAL: u32 = 0;
const MODE_THREAD_LOCAL: u32 = 1;
const MODE_RELAXED: u32 = 2;

/// `CUstreamCaptureStatus`.
const STATUS_NONE: u32 = 0;
const STATUS_ACTIVE: u32 = 1;
const STATUS_INVALIDATED: u32 = 2;

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

/// A stream that is capturing.
#[derive(Debug)]
struct Capture {
    /// The connection of its device.
    conn: &'static Connection,
    /// Its context, and whether it is a blocking stream (whose capture makes the context's
    /// legacy stream unusable).
    ctx: usize,
    blocking: bool,
    mode: u32,
    thread: ThreadId,
    /// CUDA's capture sequence ID, unique in the process.
    id: u64,
    invalidated: bool,
    /// The stream's priority, which CUDA copies into the kernel nodes it captures.
    priority: i32,
}

/// Capturing streams, by mps stream.
static CAPTURES: LazyLock<Mutex<HashMap<On, Capture>>> = LazyLock::new(Mutex::default);
/// How many streams capture: 0 keeps every check off the path of work.
static CAPTURING: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The calling thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static MODE: Cell<u32> = const { Cell::new(MODE_GLOBAL) };
    /// Executable graphs this thread launched, by handle.
    static LAUNCHED: Memo<usize, Arc<ExecObj>> = Memo::default();
}

/// A captured graph, how many nodes it holds (each copy, memset and launch one), and the
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

fn captures() -> MutexGuard<'static, HashMap<On, Capture>> {
    lock(&CAPTURES)
}

/// Whether any stream captures: the hooks below check this inline, and only where one does call
/// their own bodies, which lock the captures (each hook is on the path of every launch, copy or
/// synchronisation).
#[inline]
fn any_capturing() -> bool {
    CAPTURING.load(Ordering::Acquire) != 0
}

fn counted(caps: &HashMap<On, Capture>) {
    CAPTURING.store(caps.len(), Ordering::Release);
}

/// Invalidates every capture `doomed` picks; whether there was one.
fn invalidate(caps: &mut HashMap<On, Capture>, doomed: impl Fn(&Capture) -> bool) -> bool {
    let mut any = false;
    for c in caps.values_mut().filter(|c| doomed(c)) {
        c.invalidated = true;
        any = true;
    }
    any
}

/// Refuses what mps cannot capture: says so once, invalidates the capture of `stream`.
fn unsupported(caps: &mut HashMap<On, Capture>, stream: On, what: &str) -> CUresult {
    if let Some(c) = caps.get_mut(&stream) {
        c.invalidated = true;
    }
    log::once(&format!("capture: {what}"), || {
        format!(
            "{what} in a capturing stream is not supported through mps (a capture records one \
             stream's copies through page-locked memory, memsets and kernel launches); \
             returning CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture is invalidated"
        )
    });
    CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
}

/// The legacy stream of `ctx` is unusable while a blocking stream of it captures.
fn implicit(caps: &HashMap<On, Capture>, ctx: usize) -> bool {
    caps.values().any(|c| c.blocking && c.ctx == ctx)
}

// ----- hooks for the rest of the library -----

/// Work is about to go into `t`: whether its stream captures (its work is then recorded and
/// orders with nothing outside the capture), or why the work is refused.
#[inline]
pub(crate) fn admit_work(t: &Target) -> Res<bool> {
    if !any_capturing() {
        return Ok(false);
    }
    admit_work_while_capturing(t)
}

#[inline(never)]
fn admit_work_while_capturing(t: &Target) -> Res<bool> {
    let mut caps = captures();
    if let Some(c) = caps.get(&on(t.conn, t.stream)) {
        return match c.invalidated {
            true => Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
            false => Ok(true),
        };
    }
    if matches!(t.kind, Kind::Legacy) && implicit(&caps, t.ctx.handle) {
        let ctx = t.ctx.handle;
        invalidate(&mut caps, |c| c.blocking && c.ctx == ctx);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    }
    Ok(false)
}

/// `t` is about to be synchronised with or queried: refused (and the capture invalidated) if
/// it captures, or if it is the legacy stream of a context where a blocking stream captures.
#[inline]
pub(crate) fn refuse_wait(t: &Target) -> Res<()> {
    if !any_capturing() {
        return Ok(());
    }
    refuse_wait_while_capturing(t)
}

#[inline(never)]
fn refuse_wait_while_capturing(t: &Target) -> Res<()> {
    let mut caps = captures();
    if let Some(c) = caps.get_mut(&on(t.conn, t.stream)) {
        c.invalidated = true;
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if matches!(t.kind, Kind::Legacy) && implicit(&caps, t.ctx.handle) {
        let ctx = t.ctx.handle;
        invalidate(&mut caps, |c| c.blocking && c.ctx == ctx);
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    }
    Ok(())
}

/// The legacy stream of `t`'s context is about to be synchronised: refused, and the captures of
/// the context invalidated, while any stream of the context captures, a non-blocking one too (as
/// NVIDIA's driver does: measured with driver 580, where using the legacy stream is allowed).
#[inline]
pub(crate) fn refuse_legacy_sync(t: &Target) -> Res<()> {
    if !any_capturing() || !matches!(t.kind, Kind::Legacy) {
        return Ok(());
    }
    invalidate_legacy_sync(t)
}

#[inline(never)]
fn invalidate_legacy_sync(t: &Target) -> Res<()> {
    let ctx = t.ctx.handle;
    if invalidate(&mut captures(), |c| c.ctx == ctx) {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    Ok(())
}

/// `what` is about to go into `stream` of `conn`'s device, which mps cannot capture: refused if
/// it captures.
#[inline]
pub(crate) fn refuse_in_capture(conn: &Connection, stream: Stream, what: &str) -> Res<()> {
    if !any_capturing() {
        return Ok(());
    }
    refuse_if_capturing(conn, stream, what)
}

#[inline(never)]
fn refuse_if_capturing(conn: &Connection, stream: Stream, what: &str) -> Res<()> {
    let mut caps = captures();
    let key = on(conn, stream);
    if caps.contains_key(&key) {
        return Err(unsupported(&mut caps, key, what));
    }
    Ok(())
}

/// A copy between the host and the device is about to go into `stream`; `sync` if the call
/// waits for it, `pinned` whether its host side is page-locked. A capture keeps only
/// asynchronous copies through page-locked memory, which each launch reads (or writes) again.
pub(crate) fn admit_copy(
    (stream, conn): (Stream, &Connection),
    sync: bool,
    pinned: impl FnOnce() -> Res<bool>,
) -> Res<()> {
    if !any_capturing() || !captures().contains_key(&on(conn, stream)) {
        return Ok(());
    }
    if sync {
        refuse_in_capture(conn, stream, "a synchronous copy")
    } else if !pinned()? {
        refuse_in_capture(conn, stream, "a copy through pageable memory")
    } else {
        Ok(())
    }
}

/// A potentially unsafe call (`name`: allocating or freeing memory) is about to be made: refused,
/// as CUDA refuses it, where a capture prohibits it for the calling thread's mode; those
/// captures are invalidated.
pub(crate) fn unsafe_call(name: &str) -> Res<()> {
    if !any_capturing() {
        return Ok(());
    }
    let me = std::thread::current().id();
    let mode = MODE.with(Cell::get);
    let prohibits = |c: &Capture| match mode {
        MODE_GLOBAL => {
            (c.thread == me && c.mode != MODE_RELAXED) || (c.thread != me && c.mode == MODE_GLOBAL)
        }
        MODE_THREAD_LOCAL => c.thread == me && c.mode != MODE_RELAXED,
        _ => false,
    };
    if !invalidate(&mut captures(), prohibits) {
        return Ok(());
    }
    log::detail_once(format_args!("capture: {name}"), || {
        format!(
            "{name} during a stream capture: refused as CUDA refuses a potentially unsafe call \
             (the capture is invalidated); a thread in relaxed mode \
             (cuThreadExchangeStreamCaptureMode) may make it"
        )
    });
    Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
}

/// Memory of `conn`'s device is about to be freed (`name`): as `unsafe_call`, and also refused
/// while a stream of that device captures, since its server cannot free memory then (freeing
/// waits for the device, and a capturing stream cannot be waited for).
pub(crate) fn free_call(conn: &Connection, name: &str) -> Res<()> {
    unsafe_call(name)?;
    let device = conn.ordinal();
    if !any_capturing() || !captures().keys().any(|(d, _)| *d == device) {
        return Ok(());
    }
    log::once(&format!("capture: {name}"), || {
        format!(
            "{name} while a stream captures is not supported through mps, even in relaxed mode \
             (the server frees memory only when no stream captures); returning \
             CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        )
    });
    Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
}

/// Context `ctx` of `conn`'s device is about to be synchronised: refused while a stream of it
/// captures, as CUDA refuses it (those captures are invalidated). The library's synchronisation
/// waits for all of the process's work on the device, so a capture in another context of the
/// same device is refused too.
pub(crate) fn refuse_context_wait(ctx: usize, conn: &Connection) -> Res<()> {
    if !any_capturing() {
        return Ok(());
    }
    let mut caps = captures();
    let device = conn.ordinal();
    if !caps.keys().any(|(d, _)| *d == device) {
        return Ok(());
    }
    if !invalidate(&mut caps, |c| c.ctx == ctx) {
        log::once("capture: context synchronisation", || {
            "a context synchronisation while a stream of another context captures is not \
             supported through mps (it waits for the whole process's work); returning \
             CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
                .to_string()
        });
    }
    Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
}

/// `stream` is about to be destroyed: its capture, if any, ends, and what it captured is
/// dropped.
pub(crate) fn forget_stream(conn: &Connection, stream: Stream) -> Res<()> {
    if !any_capturing() {
        return Ok(());
    }
    let ended = {
        let mut caps = captures();
        let ended = caps.remove(&on(conn, stream)).is_some();
        counted(&caps);
        ended
    };
    if ended {
        // What the stream recorded is not wanted: the graph the server made of it goes.
        if let Ok((g, _)) = conn.stream_end_capture(stream) {
            conn.graph_destroy(g)?;
        }
    }
    Ok(())
}

/// Context `ctx` is about to be destroyed: the captures of its streams end, and what they
/// recorded is dropped (the first failure is returned once every one has been tried).
pub(crate) fn end_captures_of(ctx: usize) -> Res<()> {
    if !any_capturing() {
        return Ok(());
    }
    let streams: Vec<(&Connection, Stream)> = captures()
        .iter()
        .filter(|(_, c)| c.ctx == ctx)
        .map(|((_, s), c)| (c.conn, *s))
        .collect();
    let mut first = Ok(());
    for (conn, s) in streams {
        let r = forget_stream(conn, s);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

// ----- capture -----

fn begin(h: CUstream, mode: u32, per_thread: bool) -> Res<()> {
    check(mode <= MODE_RELAXED)?;
    let t = resolve(h, per_thread)?;
    let blocking = match t.kind {
        Kind::Legacy => return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
        Kind::Blocking(_) => true,
        Kind::Independent => false,
    };
    let key = on(t.conn, t.stream);
    if captures().contains_key(&key) {
        return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    }
    let (_, priority) = properties(h, per_thread)?;
    t.conn.stream_begin_capture(t.stream)?;
    let mut caps = captures();
    caps.insert(
        key,
        Capture {
            conn: t.conn,
            ctx: t.ctx.handle,
            blocking,
            mode,
            thread: std::thread::current().id(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            invalidated: false,
            priority,
        },
    );
    counted(&caps);
    Ok(())
}

/// The CUDA 10.0 form, without a mode: global, CUDA's default.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture(h: CUstream) -> CUresult {
    entry("cuStreamBeginCapture", || begin(h, MODE_GLOBAL, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_ptsz(h: CUstream) -> CUresult {
    entry("cuStreamBeginCapture_ptsz", || begin(h, MODE_GLOBAL, true))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2(h: CUstream, mode: u32) -> CUresult {
    entry("cuStreamBeginCapture_v2", || begin(h, mode, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamBeginCapture_v2_ptsz(h: CUstream, mode: u32) -> CUresult {
    entry("cuStreamBeginCapture_v2_ptsz", || begin(h, mode, true))
}

fn end(h: CUstream, ph: *mut usize, per_thread: bool) -> Res<()> {
    check(!ph.is_null())?;
    let t = resolve(h, per_thread)?;
    // Another thread's end of a capture not begun in relaxed mode still ends it, without a
    // graph (as NVIDIA's driver does: measured with driver 580).
    let (invalidated, wrong_thread, priority) = {
        let mut caps = captures();
        let key = on(t.conn, t.stream);
        let c = caps
            .remove(&key)
            .ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?;
        counted(&caps);
        let wrong_thread = c.mode != MODE_RELAXED && c.thread != std::thread::current().id();
        (c.invalidated, wrong_thread, c.priority)
    };
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

/// # Safety
/// `ph` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture(h: CUstream, ph: *mut usize) -> CUresult {
    entry("cuStreamEndCapture", || end(h, ph, false))
}

/// # Safety
/// `ph` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamEndCapture_ptsz(h: CUstream, ph: *mut usize) -> CUresult {
    entry("cuStreamEndCapture_ptsz", || end(h, ph, true))
}

/// `t`'s capture status and capture ID; the legacy stream of a context where a blocking stream
/// captures is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (which invalidates nothing).
fn status(t: &Target) -> Res<(u32, u64)> {
    if !any_capturing() {
        return Ok((STATUS_NONE, 0));
    }
    let caps = captures();
    if matches!(t.kind, Kind::Legacy) && implicit(&caps, t.ctx.handle) {
        return Err(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    }
    Ok(match caps.get(&on(t.conn, t.stream)) {
        None => (STATUS_NONE, 0),
        Some(c) if c.invalidated => (STATUS_INVALIDATED, c.id),
        Some(c) => (STATUS_ACTIVE, c.id),
    })
}

fn is_capturing(h: CUstream, out: *mut u32, per_thread: bool) -> Res<()> {
    check(!out.is_null())?;
    let (s, _) = with_target(h, per_thread, status)?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, s) }
}

/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing(h: CUstream, out: *mut u32) -> CUresult {
    entry("cuStreamIsCapturing", || is_capturing(h, out, false))
}

/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(h: CUstream, out: *mut u32) -> CUresult {
    entry("cuStreamIsCapturing_ptsz", || is_capturing(h, out, true))
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
    let (s, id) = with_target(h, per_thread, status)?;
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

/// The CUDA 10.1 form: status and ID.
///
/// # Safety
/// `status` must be NULL or writable; `id` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo(
    h: CUstream,
    status: *mut u32,
    id: *mut u64,
) -> CUresult {
    entry("cuStreamGetCaptureInfo", || {
        capture_info(h, status, id, Nodes::NONE, false)
    })
}

/// # Safety
/// As `cuStreamGetCaptureInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_ptsz(
    h: CUstream,
    status: *mut u32,
    id: *mut u64,
) -> CUresult {
    entry("cuStreamGetCaptureInfo_ptsz", || {
        capture_info(h, status, id, Nodes::NONE, true)
    })
}

/// The CUDA 11.3 form: also the graph and dependency nodes.
///
/// # Safety
/// Each output must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    h: CUstream,
    status: *mut u32,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut *const usize,
    count: *mut usize,
) -> CUresult {
    let nodes = Nodes {
        graph,
        deps,
        edges: std::ptr::null_mut(),
        count,
    };
    entry("cuStreamGetCaptureInfo_v2", || {
        capture_info(h, status, id, nodes, false)
    })
}

/// # Safety
/// Each output must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2_ptsz(
    h: CUstream,
    status: *mut u32,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut *const usize,
    count: *mut usize,
) -> CUresult {
    let nodes = Nodes {
        graph,
        deps,
        edges: std::ptr::null_mut(),
        count,
    };
    entry("cuStreamGetCaptureInfo_v2_ptsz", || {
        capture_info(h, status, id, nodes, true)
    })
}

/// The CUDA 12.3 form (CUDA 13's `cuStreamGetCaptureInfo`): also the edge data.
///
/// # Safety
/// Each output must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    h: CUstream,
    status: *mut u32,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut *const usize,
    edges: *mut *const c_void,
    count: *mut usize,
) -> CUresult {
    let nodes = Nodes {
        graph,
        deps,
        edges,
        count,
    };
    entry("cuStreamGetCaptureInfo_v3", || {
        capture_info(h, status, id, nodes, false)
    })
}

/// # Safety
/// Each output must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3_ptsz(
    h: CUstream,
    status: *mut u32,
    id: *mut u64,
    graph: *mut usize,
    deps: *mut *const usize,
    edges: *mut *const c_void,
    count: *mut usize,
) -> CUresult {
    let nodes = Nodes {
        graph,
        deps,
        edges,
        count,
    };
    entry("cuStreamGetCaptureInfo_v3_ptsz", || {
        capture_info(h, status, id, nodes, true)
    })
}

/// Sets the calling thread's capture interaction mode to `*mode` and returns the old one there.
///
/// # Safety
/// `mode` must be NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CUresult {
    entry("cuThreadExchangeStreamCaptureMode", || {
        check(!mode.is_null())?;
        // SAFETY: checked non-null; the caller guarantees it is readable and writable.
        let new = unsafe { mode.read() };
        check(new <= MODE_RELAXED)?;
        let old = MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { put(mode, old) }
    })
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
/// As `instantiate_logged`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    ph: *mut usize,
    g: usize,
    err_node: *mut usize,
    log_buf: *mut u8,
    log_len: usize,
) -> CUresult {
    // SAFETY: the caller's guarantees are instantiate_logged's.
    entry("cuGraphInstantiate", || unsafe {
        instantiate_logged(ph, g, err_node, log_buf, log_len)
    })
}

/// # Safety
/// As `instantiate_logged`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    ph: *mut usize,
    g: usize,
    err_node: *mut usize,
    log_buf: *mut u8,
    log_len: usize,
) -> CUresult {
    // SAFETY: the caller's guarantees are instantiate_logged's.
    entry("cuGraphInstantiate_v2", || unsafe {
        instantiate_logged(ph, g, err_node, log_buf, log_len)
    })
}

/// # Safety
/// `ph` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    ph: *mut usize,
    g: usize,
    flags: u64,
) -> CUresult {
    entry("cuGraphInstantiateWithFlags", || {
        instantiate(ph, g, flags, None)
    })
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

/// # Safety
/// `ph` must be NULL or writable; `params` NULL or readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    ph: *mut usize,
    g: usize,
    params: *mut InstantiateParams,
) -> CUresult {
    // SAFETY: the caller's guarantees are instantiate_with_params's.
    entry("cuGraphInstantiateWithParams", || unsafe {
        instantiate_with_params(ph, g, params, false)
    })
}

/// # Safety
/// As `cuGraphInstantiateWithParams`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    ph: *mut usize,
    g: usize,
    params: *mut InstantiateParams,
) -> CUresult {
    // SAFETY: the caller's guarantees are instantiate_with_params's.
    entry("cuGraphInstantiateWithParams_ptsz", || unsafe {
        instantiate_with_params(ph, g, params, true)
    })
}

fn exec(e: usize) -> Res<Arc<ExecObj>> {
    EXECS.get(e).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// An upload has nothing to do: the server's executable graph is ready once instantiated.
fn upload(e: usize, h: CUstream, per_thread: bool) -> Res<()> {
    exec(e)?;
    resolve(h, per_thread).map(drop)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload(e: usize, h: CUstream) -> CUresult {
    entry("cuGraphUpload", || upload(e, h, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphUpload_ptsz(e: usize, h: CUstream) -> CUresult {
    entry("cuGraphUpload_ptsz", || upload(e, h, true))
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
            let (stream, conn) = crate::stream::for_work(h, per_thread)?;
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

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(e: usize, h: CUstream) -> CUresult {
    entry("cuGraphLaunch", || launch(e, h, false))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(e: usize, h: CUstream) -> CUresult {
    entry("cuGraphLaunch_ptsz", || launch(e, h, true))
}

/// The number of nodes of a graph (`nodes` NULL): what programs ask to see that a capture
/// recorded something (PyTorch's `CUDAGraph` does). The nodes themselves exist only on the
/// server: asking for them is `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// `count` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    g: usize,
    nodes: *mut usize,
    count: *mut usize,
) -> CUresult {
    entry("cuGraphGetNodes", || {
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
    })
}

/// Executable graphs made from it live on.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(g: usize) -> CUresult {
    entry("cuGraphDestroy", || {
        let graph = GRAPHS.remove(g).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        graph.conn.graph_destroy(graph.graph)
    })
}

/// Launches already posted still run.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(e: usize) -> CUresult {
    entry("cuGraphExecDestroy", || {
        let exec = EXECS.remove(e).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        exec.conn.graph_exec_destroy(exec.exec)
    })
}
