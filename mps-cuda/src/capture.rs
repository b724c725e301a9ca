//! CUDA's rules of stream capture, and the captures in progress: what the rest of the library
//! asks before work, a wait or a potentially unsafe call goes to a stream, so that a program
//! gets CUDA's results (the exported capture and graph functions are `graph`'s).
//!
//! The server records one stream's copies through page-locked memory, memsets and kernel
//! launches (mps-server's `session/core/graphs.rs`). The rules kept here:
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

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::thread::ThreadId;

use crate::abi::CUresult;
use crate::connection::{Connection, Res, Stream};
use crate::ffi::lock;
use crate::log;
use crate::objects::{Kind, Target};

/// A stream of one device's server: stream handles are the server's, so two devices' streams
/// may share one.
type On = (i32, Stream);

/// The key of `stream` on `conn`'s device.
fn on(conn: &Connection, stream: Stream) -> On {
    (conn.ordinal(), stream)
}

/// `CUstreamCaptureMode`.
pub(crate) const MODE_GLOBAL: u32 = 0;
const MODE_THREAD_LOCAL: u32 = 1;
pub(crate) const MODE_RELAXED: u32 = 2;

/// `CUstreamCaptureStatus`.
const STATUS_NONE: u32 = 0;
pub(crate) const STATUS_ACTIVE: u32 = 1;
const STATUS_INVALIDATED: u32 = 2;

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
}

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

// ----- the captures, for the exported capture functions -----

/// Refuses a second capture of `t`'s stream (`CUDA_ERROR_ILLEGAL_STATE`).
pub(crate) fn refuse_second(t: &Target) -> Res<()> {
    if captures().contains_key(&on(t.conn, t.stream)) {
        return Err(CUresult::CUDA_ERROR_ILLEGAL_STATE);
    }
    Ok(())
}

/// Begins capturing `t`'s stream (a `blocking` one or not) in `mode`, by the calling thread;
/// `priority` is the stream's.
pub(crate) fn begin(t: &Target, blocking: bool, mode: u32, priority: i32) -> Res<()> {
    t.conn.stream_begin_capture(t.stream)?;
    let mut caps = captures();
    caps.insert(
        on(t.conn, t.stream),
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

/// How a capture ended (see [`end`]).
pub(crate) struct Ended {
    pub(crate) invalidated: bool,
    /// Ended by another thread than the one that began it, not in relaxed mode.
    pub(crate) wrong_thread: bool,
    /// The priority of the stream it was captured in.
    pub(crate) priority: i32,
}

/// Ends the capture of `t`'s stream, here; `CUDA_ERROR_ILLEGAL_STATE` where there is none.
/// Another thread's end of a capture not begun in relaxed mode still ends it (as NVIDIA's
/// driver does: measured with driver 580); the caller then keeps no graph.
pub(crate) fn end(t: &Target) -> Res<Ended> {
    let mut caps = captures();
    let c = caps
        .remove(&on(t.conn, t.stream))
        .ok_or(CUresult::CUDA_ERROR_ILLEGAL_STATE)?;
    counted(&caps);
    Ok(Ended {
        invalidated: c.invalidated,
        wrong_thread: c.mode != MODE_RELAXED && c.thread != std::thread::current().id(),
        priority: c.priority,
    })
}

/// `t`'s capture status and capture ID; the legacy stream of a context where a blocking stream
/// captures is `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (which invalidates nothing).
pub(crate) fn status(t: &Target) -> Res<(u32, u64)> {
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

/// Sets the calling thread's capture interaction mode to `mode` (at most `MODE_RELAXED`);
/// the mode it had.
pub(crate) fn exchange_mode(mode: u32) -> u32 {
    MODE.with(|m| m.replace(mode))
}
