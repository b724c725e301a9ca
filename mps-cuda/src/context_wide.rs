//! What CUDA 12 asks of a context as a whole: its ID (`cuCtxGetId`), an event that captures the
//! work of all its streams (`cuCtxRecordEvent`), a wait of all its streams for an event
//! (`cuCtxWaitEvent`), and its SMs as a device resource (`cuCtxGetDevResource`); and the
//! green-context forms of these, which no client can have a handle for.
//!
//! The results of the edge cases are NVIDIA's driver's (580.159.04 on the H200, measured with a
//! probe): a NULL context is `CUDA_ERROR_INVALID_CONTEXT` for the event functions and the
//! current context for `cuCtxGetId`; a NULL event, or one of another context,
//! `CUDA_ERROR_INVALID_HANDLE`; a resource type other than SM `CUDA_ERROR_INVALID_RESOURCE_TYPE`;
//! an event function while a stream of the context captures `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`,
//! the capture invalidated.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, Once};

use crate::abi::{CUcontext, CUevent, CUresult};
use crate::capture;
use crate::connection::{Connection, Res, Stream};
use crate::context::{context, given_or_current, handle_of};
use crate::driver::{self, Stage, driver};
use crate::ffi::{check, exports, lock, put};
use crate::log;
use crate::objects::{Context, EventObj};

/// `CU_DEV_RESOURCE_TYPE_SM`, the one resource type a context has.
const DEV_RESOURCE_TYPE_SM: u32 = 1;

/// `CUdevResource` as CUDA 12.4 to 13 lay it out: the type, 92 bytes the driver keeps for
/// itself, then a union of 48 bytes whose SM member is `smCount`, `minSmPartitionSize`,
/// `smCoscheduledAlignment` (13.0) and `flags` (13.1). CUDA 13.1 appends a pointer after it,
/// which this library leaves to the caller (every header since 12.4 has these 144 bytes).
#[derive(Debug)]
#[repr(C)]
pub struct DevResource {
    kind: u32,
    internal: [u8; 92],
    sm: [u32; 12],
}

/// The context that `ctx` names for an event function: NULL is refused, not the current one.
fn named(ctx: CUcontext) -> Res<Arc<Context>> {
    if ctx.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }
    context(handle_of(ctx))
}

/// A green-context function: mps makes no green contexts for its clients (`cuGreenCtxCreate`
/// is refused), so no handle a program holds is one, and NVIDIA's driver answers an ordinary
/// context so: `CUDA_ERROR_INVALID_CONTEXT` (measured for each of the four).
fn no_green_context(name: &str) -> Res<()> {
    log::once(name, || {
        format!(
            "{name}: mps makes no green contexts for its clients, so no handle is one; \
             returning CUDA_ERROR_INVALID_CONTEXT"
        )
    });
    Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

/// Event `ev`, which must belong to `ctx`.
fn event_of(ctx: &Context, ev: CUevent) -> Res<Arc<EventObj>> {
    driver()?
        .events
        .get(ev as usize)
        .filter(|e| e.ctx == ctx.handle)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// Every stream of `ctx` now: its legacy default stream, the streams made in it and each
/// thread's per-thread default stream there.
fn streams_of(ctx: &Context) -> Res<Vec<Stream>> {
    let mut all = vec![ctx.legacy_stream()];
    let d = driver()?;
    all.extend(
        d.streams
            .select(|s| s.ctx == ctx.handle)
            .iter()
            .map(|s| s.stream),
    );
    Ok(all)
}

/// Each context's stream of its own that joins the others for `cuCtxRecordEvent`, made on first
/// use and destroyed with the context.
static JOINS: Mutex<Option<HashMap<usize, Stream>>> = Mutex::new(None);

fn join_stream(ctx: &Context, conn: &Connection) -> Res<Stream> {
    static HOOKED: Once = Once::new();
    HOOKED.call_once(|| driver::on_release(Stage::Late, drop_join_stream));
    let mut joins = lock(&JOINS);
    let joins = joins.get_or_insert_with(HashMap::new);
    if let Some(s) = joins.get(&ctx.handle) {
        return Ok(*s);
    }
    let s = conn.stream_create(0)?;
    joins.insert(ctx.handle, s);
    Ok(s)
}

/// The context is released, its work done: its join stream goes too.
fn drop_join_stream(ctx: &Context) -> Res<()> {
    let gone = lock(&JOINS).as_mut().and_then(|j| j.remove(&ctx.handle));
    match gone {
        Some(s) => ctx.conn()?.stream_destroy(s),
        None => Ok(()),
    }
}

/// `cuCtxRecordEvent`: `ev` completes once all work queued so far on every stream of the
/// context has. A context with one stream records there; otherwise each stream's work is
/// marked by an event of the library's, the context's join stream waits for every mark, and
/// `ev` is recorded on the join stream, so that no stream of the program waits for anything.
fn record(ctx: CUcontext, ev: CUevent) -> Res<()> {
    let ctx = named(ctx)?;
    let e = event_of(&ctx, ev)?;
    let conn = ctx.conn()?;
    capture::refuse_context_wait(ctx.handle, conn)?;
    let streams = streams_of(&ctx)?;
    if let [only] = streams[..] {
        return conn.event_record(e.event, only);
    }
    let join = join_stream(&ctx, conn)?;
    for s in streams {
        let mark = conn.event_create()?;
        let joined = conn
            .event_record(mark, s)
            .and_then(|()| conn.stream_wait_event(join, mark));
        // The wait holds what it waits for; the mark is not needed past it.
        let destroyed = conn.event_destroy(mark);
        joined.and(destroyed)?;
    }
    conn.event_record(e.event, join)
}

/// `cuCtxWaitEvent`: every stream of the context waits for `ev` before its later work. A
/// blocking stream created later orders after the legacy stream's wait, as blocking streams
/// do; a non-blocking stream created later does not wait (NVIDIA's driver makes it wait too).
fn wait(ctx: CUcontext, ev: CUevent) -> Res<()> {
    let ctx = named(ctx)?;
    let e = event_of(&ctx, ev)?;
    let conn = ctx.conn()?;
    capture::refuse_context_wait(ctx.handle, conn)?;
    streams_of(&ctx)?
        .into_iter()
        .try_for_each(|s| conn.stream_wait_event(s, e.event))
}

/// The SMs of context `ctx` (NULL: the current one): the client's, as the library reports them
/// for `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`. mps splits no client's SMs further (green
/// contexts are not offered), so the smallest partition is all of them and the co-scheduled
/// alignment is 1, which every count is a multiple of.
fn sm_resource(resource: *mut DevResource, ctx: CUcontext, kind: u32) -> Res<()> {
    check(!resource.is_null())?;
    let ctx = given_or_current(ctx)?;
    if kind != DEV_RESOURCE_TYPE_SM {
        return Err(CUresult::CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    let sms = ctx.conn()?.device().client_sms;
    let mut sm = [0; 12];
    sm[..3].copy_from_slice(&[sms, sms, 1]);
    let r = DevResource {
        kind,
        internal: [0; 92],
        sm,
    };
    // SAFETY: checked non-null; the caller passes a `CUdevResource`, at least these 144 bytes.
    unsafe { put(resource, r) }
}

// ----- the exports -----

exports! {
    /// The context's ID, unique for the life of the process: its handle, which is never handed
    /// out again. NULL is the current context.
    ///
    /// # Safety
    /// `id` must be NULL or writable.
    pub unsafe fn cuCtxGetId(ctx: CUcontext, id: *mut u64) ["cuCtxGetId" 12000] = {
        check(!id.is_null())?;
        let c = given_or_current(ctx)?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(id, c.handle as u64) }
    };

    pub fn cuCtxRecordEvent(ctx: CUcontext, ev: CUevent) ["cuCtxRecordEvent" 12050] =
        record(ctx, ev);

    pub fn cuCtxWaitEvent(ctx: CUcontext, ev: CUevent) ["cuCtxWaitEvent" 12050] = wait(ctx, ev);

    /// # Safety
    /// `resource` must be NULL or a writable `CUdevResource`.
    pub unsafe fn cuCtxGetDevResource(
        ctx: CUcontext,
        resource: *mut DevResource,
        kind: u32,
    ) ["cuCtxGetDevResource" 12040] = sm_resource(resource, ctx, kind);

    pub fn cuGreenCtxGetDevResource(
        _ctx: *mut c_void,
        _resource: *mut DevResource,
        _kind: u32,
    ) ["cuGreenCtxGetDevResource" 12040] = no_green_context("cuGreenCtxGetDevResource");

    pub fn cuGreenCtxGetId(_ctx: *mut c_void, _id: *mut u64) ["cuGreenCtxGetId" 12090] =
        no_green_context("cuGreenCtxGetId");

    pub fn cuGreenCtxRecordEvent(_ctx: *mut c_void, _ev: CUevent) ["cuGreenCtxRecordEvent" 12040] =
        no_green_context("cuGreenCtxRecordEvent");

    pub fn cuGreenCtxWaitEvent(_ctx: *mut c_void, _ev: CUevent) ["cuGreenCtxWaitEvent" 12040] =
        no_green_context("cuGreenCtxWaitEvent");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sm_member_sits_where_cuda_h_puts_it() {
        assert_eq!(std::mem::size_of::<DevResource>(), 144);
        assert_eq!(std::mem::offset_of!(DevResource, sm), 96);
    }
}
