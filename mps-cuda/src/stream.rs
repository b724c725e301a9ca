//! Streams and events, with CUDA's default streams.
//!
//! - The **legacy default stream** (`0`, or `CU_STREAM_LEGACY`) of a context synchronises with
//!   the context's blocking streams: its work waits for their earlier work, and their later work
//!   waits for its. mps streams do not do this by themselves, so `order::LegacyOrder` inserts the
//!   waits, through events, and only where work of both kinds meets: a program that uses only
//!   the legacy stream, or only streams of its own, gets no extra commands.
//! - The **per-thread default stream** (`0` in the `_ptsz`/`_ptds` variants, or
//!   `CU_STREAM_PER_THREAD`) is a blocking stream of each thread's own, made on first use.
//! - Streams created with `CU_STREAM_NON_BLOCKING` are left alone.
//!
//! A stream and an event belong to the device of their context, and their work goes to that
//! device's server. A stream may wait for an event of another device, as in CUDA; the servers
//! share no events, so the host waits for that event instead (the wait then holds, more than
//! needed). Recording an event in a stream of another device is refused, as in CUDA.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use crate::abi::{
    CUevent, CUresult, CUstream, EVENT_BLOCKING_SYNC, EVENT_DISABLE_TIMING, EVENT_INTERPROCESS,
    STREAM_LEGACY, STREAM_NON_BLOCKING, STREAM_PER_THREAD,
};
use crate::capture;
use crate::connection::{Connection, Res, Stream};
use crate::context::{context, current, current_handle};
use crate::driver::{connection, driver};
use crate::ffi::{check, exports, lock, put};
use crate::log;
use crate::memo::{Memo, through};
use crate::objects::{Context, EventObj, Kind, StreamObj, Target};

thread_local! {
    /// The calling thread's per-thread default stream in each context: context → stream handle.
    static PER_THREAD: RefCell<HashMap<usize, usize>> = RefCell::new(HashMap::new());
    /// Stream arguments this thread resolved, by [`target_key`].
    static TARGETS: Memo<(usize, usize), Target> = Memo::default();
    /// Events this thread recorded or waited for, by handle.
    static EVENTS: Memo<usize, Arc<EventObj>> = Memo::default();
}

fn register(ctx: &Context, flags: u32, priority: i32) -> Res<usize> {
    let d = driver()?;
    let stream = ctx.conn()?.stream_create(priority)?;
    let (handle, _) = d.streams.insert_with(|_| StreamObj {
        ctx: ctx.handle,
        device: ctx.device,
        stream,
        flags,
        priority,
    });
    if flags & STREAM_NON_BLOCKING == 0 {
        lock(&ctx.state).order.add_blocking(handle, stream);
    }
    Ok(handle)
}

fn per_thread_stream(ctx: &Context) -> Res<usize> {
    let d = driver()?;
    let known = PER_THREAD.with(|p| p.borrow().get(&ctx.handle).copied());
    if let Some(h) = known.filter(|h| d.streams.get(*h).is_some_and(|s| s.ctx == ctx.handle)) {
        return Ok(h);
    }
    let h = register(ctx, 0, 0)?;
    PER_THREAD.with(|p| p.borrow_mut().insert(ctx.handle, h));
    Ok(h)
}

/// Resolves `h` as a function whose NULL stream is the per-thread one (`per_thread`) or the
/// legacy one sees it.
pub(crate) fn resolve(h: CUstream, per_thread: bool) -> Res<Target> {
    let raw = h as usize;
    let d = driver()?;
    let own = if raw == STREAM_LEGACY || (raw == 0 && !per_thread) {
        return legacy_of(current()?);
    } else if raw == STREAM_PER_THREAD || raw == 0 {
        per_thread_stream(&*current()?)?
    } else {
        raw
    };
    let s = d
        .streams
        .get(own)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let ctx = context(s.ctx)?;
    Ok(Target {
        conn: ctx.conn()?,
        ctx,
        stream: s.stream,
        kind: if s.flags & STREAM_NON_BLOCKING == 0 {
            Kind::Blocking(own)
        } else {
            Kind::Independent
        },
    })
}

/// What stream argument `h` names, for [`TARGETS`]: a stream the program made is itself; a
/// default stream is the legacy or the per-thread one of the current context.
fn target_key(h: CUstream, per_thread: bool) -> (usize, usize) {
    match h as usize {
        raw if raw > STREAM_PER_THREAD => (raw, 0),
        raw if raw == STREAM_LEGACY || (raw == 0 && !per_thread) => {
            (STREAM_LEGACY, current_handle().unwrap_or(0))
        }
        _ => (STREAM_PER_THREAD, current_handle().unwrap_or(0)),
    }
}

/// Runs `body` on `h` resolved as [`resolve`] resolves it, where the thread resolved it before
/// without resolving it again ([`crate::memo`]). `body` must not resolve a stream itself.
pub(crate) fn with_target<R>(
    h: CUstream,
    per_thread: bool,
    body: impl FnOnce(&Target) -> Res<R>,
) -> Res<R> {
    through(
        &TARGETS,
        target_key(h, per_thread),
        || resolve(h, per_thread),
        body,
    )
}

/// The legacy default stream of `ctx`.
fn legacy_of(ctx: Arc<Context>) -> Res<Target> {
    Ok(Target {
        conn: ctx.conn()?,
        stream: ctx.legacy_stream(),
        ctx,
        kind: Kind::Legacy,
    })
}

impl Target {
    /// Inserts the waits that work about to go into this stream needs (see the module's
    /// documentation). For a synchronisation (`work` false) the legacy stream takes in the
    /// blocking streams' work as work would, but nothing new is counted as submitted.
    #[inline]
    fn order(&self, work: bool) -> Res<()> {
        // The context's state is locked only where there is something to order; this check is
        // inlined into every launch, copy and synchronisation, the locking part is not.
        match self.kind {
            Kind::Independent => Ok(()),
            Kind::Blocking(_) if !work => Ok(()),
            Kind::Blocking(h) => self.order_locked(Some(h), work),
            Kind::Legacy => self.order_locked(None, work),
        }
    }

    /// [`Target::order`] where there is something to order: `blocking` is the handle of the
    /// blocking stream work goes into, `None` for the legacy stream.
    #[inline(never)]
    fn order_locked(&self, blocking: Option<usize>, work: bool) -> Res<()> {
        let mut st = lock(&self.ctx.state);
        let legacy = st.legacy;
        st.order
            .order(self.conn, legacy, self.stream, blocking, work)
    }
}

/// The mps stream that work for `h` goes into, after the waits CUDA's default-stream semantics
/// call for, and the connection of its device. A capturing stream records its work, which
/// orders with nothing outside the capture.
pub(crate) fn for_work(h: CUstream, per_thread: bool) -> Res<(Stream, &'static Connection)> {
    with_target(h, per_thread, admitted)
}

/// As [`for_work`], for the legacy default stream of context `ctx`.
pub(crate) fn for_legacy_work(ctx: Arc<Context>) -> Res<(Stream, &'static Connection)> {
    admitted(&legacy_of(ctx)?)
}

/// Work for `t`, admitted by the capture rules and ordered as its kind of stream orders.
fn admitted(t: &Target) -> Res<(Stream, &'static Connection)> {
    if !capture::admit_work(t)? {
        t.order(true)?;
    }
    Ok((t.stream, t.conn))
}

// ----- streams -----

fn create(ph: *mut CUstream, flags: u32, priority: i32) -> Res<()> {
    check(!ph.is_null() && flags & !STREAM_NON_BLOCKING == 0)?;
    let h = register(&*current()?, flags, priority)?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(ph, std::ptr::without_provenance_mut(h)) }
}

/// Waits for the stream; the legacy stream's wait covers the blocking streams' work before it,
/// as work put in it then would.
fn synchronize(h: CUstream, per_thread: bool) -> Res<()> {
    let (stream, conn) = with_target(h, per_thread, |t| {
        capture::refuse_wait(t)?;
        capture::refuse_legacy_sync(t)?;
        t.order(false)?;
        Ok((t.stream, t.conn))
    })?;
    conn.stream_synchronize(stream)
}

fn query(h: CUstream, per_thread: bool) -> Res<()> {
    let (stream, conn) = with_target(h, per_thread, |t| {
        capture::refuse_wait(t)?;
        Ok((t.stream, t.conn))
    })?;
    if conn.stream_query(stream)? {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_NOT_READY)
    }
}

fn event(h: CUevent) -> Res<Arc<EventObj>> {
    driver()?
        .events
        .get(h as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// Runs `body` with event `ev` and the stream `h` names for work, once `what` (the event
/// command) is known not to go into a capturing stream.
fn with_event_and_stream(
    ev: CUevent,
    h: CUstream,
    per_thread: bool,
    what: &str,
    body: impl FnOnce(&EventObj, Stream, &'static Connection) -> Res<()>,
) -> Res<()> {
    through(
        &EVENTS,
        ev as usize,
        || event(ev),
        |e| {
            let (s, conn) = for_work(h, per_thread)?;
            capture::refuse_in_capture(conn, s, what)?;
            body(e, s, conn)
        },
    )
}

fn wait_event(h: CUstream, ev: CUevent, flags: u32, per_thread: bool) -> Res<()> {
    check(flags == 0)?;
    with_event_and_stream(
        ev,
        h,
        per_thread,
        "an event wait (a cross-stream join)",
        |e, s, conn| {
            if conn.ordinal() == e.device {
                conn.stream_wait_event(s, e.event)
            } else {
                // An event of another device: its server cannot be waited on from this one.
                connection(e.device)?.event_synchronize(e.event)
            }
        },
    )
}

/// A host function (`CUhostFn`).
pub type HostFn = unsafe extern "C" fn(user: *mut c_void);
/// A stream callback (`CUstreamCallback`).
pub type StreamCallback = unsafe extern "C" fn(h: CUstream, status: CUresult, user: *mut c_void);

/// What a host function is handed, carried to the thread that calls it.
struct UserData(*mut c_void);
// SAFETY: an opaque word of the program's, handed back to its own function as CUDA hands it
// (on a thread of the driver's); the program vouches for it being usable there.
unsafe impl Send for UserData {}

/// Queues `call` in the stream `h` names, after the waits CUDA's default-stream semantics call
/// for; refused in a capturing stream (CUDA would capture a host node). `what` names the call
/// in the refusal.
fn host_func(
    h: CUstream,
    per_thread: bool,
    what: &str,
    call: impl FnOnce() + Send + 'static,
) -> Res<()> {
    let (s, conn) = for_work(h, per_thread)?;
    capture::refuse_in_capture(conn, s, what)?;
    conn.launch_host_func(s, Box::new(call))
}

fn launch_host_func(
    h: CUstream,
    f: Option<HostFn>,
    user: *mut c_void,
    per_thread: bool,
) -> Res<()> {
    let f = f.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let user = UserData(user);
    host_func(
        h,
        per_thread,
        "a host function (cuLaunchHostFunc)",
        move || {
            let user = user;
            // SAFETY: the program's function with the argument it gave for it, called once, on
            // a thread that calls nothing else meanwhile, as CUDA calls it.
            unsafe { f(user.0) }
        },
    )
}

/// `cuStreamAddCallback`: the callback is handed the stream as the program named it and
/// `CUDA_SUCCESS` (after an error the client calls no later callback of its streams).
fn add_callback(
    h: CUstream,
    cb: Option<StreamCallback>,
    user: *mut c_void,
    flags: u32,
    per_thread: bool,
) -> Res<()> {
    check(flags == 0)?;
    let cb = cb.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let (stream, user) = (UserData(h.cast()), UserData(user));
    host_func(
        h,
        per_thread,
        "a stream callback (cuStreamAddCallback)",
        move || {
            let (stream, user) = (stream, user);
            // SAFETY: as in `launch_host_func`; the stream is the handle the program passed.
            unsafe { cb(stream.0.cast(), CUresult::CUDA_SUCCESS, user.0) }
        },
    )
}

/// The flags and priority of a stream (the default streams: blocking, priority 0).
pub(crate) fn properties(h: CUstream, per_thread: bool) -> Res<(u32, i32)> {
    let t = resolve(h, per_thread)?;
    if let Kind::Legacy = t.kind {
        return Ok((0, 0));
    }
    let d = driver()?;
    let raw = h as usize;
    let s = if raw == 0 || raw == STREAM_PER_THREAD {
        d.streams.get(per_thread_stream(&t.ctx)?)
    } else {
        d.streams.get(raw)
    };
    let s = s.ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    Ok((s.flags, s.priority))
}

// ----- events -----

fn record(ev: CUevent, h: CUstream, per_thread: bool) -> Res<()> {
    with_event_and_stream(
        ev,
        h,
        per_thread,
        "an event record (a cross-stream fork)",
        |e, s, conn| {
            if conn.ordinal() != e.device {
                // CUDA refuses an event and a stream of two devices alike.
                return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
            }
            conn.event_record(e.event, s)
        },
    )
}

/// `CU_EVENT_RECORD_DEFAULT` is a plain record; `CU_EVENT_RECORD_EXTERNAL` (a record node
/// that other graphs or streams may wait on, inside a capture) is not offered by the server's
/// captures and is refused, said once.
fn record_with_flags(ev: CUevent, h: CUstream, flags: u32, per_thread: bool) -> Res<()> {
    match flags {
        0 => record(ev, h, per_thread),
        _ => {
            log::once(&format!("cuEventRecordWithFlags {flags}"), || {
                format!(
                    "cuEventRecordWithFlags: flags {flags:#x} (an external record) are not \
                     supported through mps; returning CUDA_ERROR_NOT_SUPPORTED"
                )
            });
            Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

fn elapsed(ms: *mut f32, start: CUevent, end: CUevent) -> Res<()> {
    check(!ms.is_null())?;
    let (s, e) = (event(start)?, event(end)?);
    if (s.flags | e.flags) & EVENT_DISABLE_TIMING != 0 || s.device != e.device {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    let conn = connection(s.device)?;
    if !conn.event_query(s.event)? || !conn.event_query(e.event)? {
        return Err(CUresult::CUDA_ERROR_NOT_READY);
    }
    let v = conn.event_elapsed_ms(s.event, e.event)?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(ms, v) }
}

// ----- the exports -----

exports! {
    /// # Safety
    /// `ph` must be NULL or writable.
    pub unsafe fn cuStreamCreate(ph: *mut CUstream, flags: u32) ["cuStreamCreate" 2000] =
        create(ph, flags, 0);

    /// # Safety
    /// `ph` must be NULL or writable.
    pub unsafe fn cuStreamCreateWithPriority(
        ph: *mut CUstream,
        flags: u32,
        priority: i32,
    ) ["cuStreamCreateWithPriority" 5050] =
        create(ph, flags, priority);

    /// Destroys a stream; its work still completes.
    pub fn cuStreamDestroy_v2(h: CUstream) ["cuStreamDestroy" 4000] = {
        let d = driver()?;
        let s = d
            .streams
            .remove(h as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        capture::forget_stream(connection(s.device)?, s.stream)?;
        let ordering_event = d
            .contexts
            .get(s.ctx)
            .and_then(|c| lock(&c.state).order.remove_blocking(h as usize));
        let conn = connection(s.device)?;
        conn.stream_destroy(s.stream)?;
        match ordering_event {
            Some(e) => conn.event_destroy(e),
            None => Ok(()),
        }
    };

    pub fn cuStreamSynchronize(h: CUstream) ["cuStreamSynchronize" 2000]
        per_thread cuStreamSynchronize_ptsz = |per_thread| synchronize(h, per_thread);

    pub fn cuStreamQuery(h: CUstream) ["cuStreamQuery" 2000]
        per_thread cuStreamQuery_ptsz = |per_thread| query(h, per_thread);

    pub fn cuStreamWaitEvent(h: CUstream, ev: CUevent, flags: u32) ["cuStreamWaitEvent" 3020]
        per_thread cuStreamWaitEvent_ptsz = |per_thread| wait_event(h, ev, flags, per_thread);

    /// Queues `f(user)` in the stream: it runs once the work before it is done, and later
    /// work waits for it.
    ///
    /// # Safety
    /// `f` must be NULL or a function that may be called with `user` on another thread.
    pub unsafe fn cuLaunchHostFunc(
        h: CUstream,
        f: Option<HostFn>,
        user: *mut c_void,
    ) ["cuLaunchHostFunc" 10000]
        per_thread cuLaunchHostFunc_ptsz = |per_thread| launch_host_func(h, f, user, per_thread);

    /// # Safety
    /// `cb` must be NULL or a function that may be called with `h` and `user` on another
    /// thread.
    pub unsafe fn cuStreamAddCallback(
        h: CUstream,
        cb: Option<StreamCallback>,
        user: *mut c_void,
        flags: u32,
    ) ["cuStreamAddCallback" 5000]
        per_thread cuStreamAddCallback_ptsz = |per_thread|
            add_callback(h, cb, user, flags, per_thread);

    /// # Safety
    /// `flags` must be NULL or writable.
    pub unsafe fn cuStreamGetFlags(h: CUstream, flags: *mut u32) ["cuStreamGetFlags" 5050]
        per_thread cuStreamGetFlags_ptsz = |per_thread|
            // SAFETY: the caller guarantees a non-null `flags` is writable.
            unsafe { put(flags, properties(h, per_thread)?.0) };

    /// # Safety
    /// `priority` must be NULL or writable.
    pub unsafe fn cuStreamGetPriority(h: CUstream, priority: *mut i32) ["cuStreamGetPriority" 5050]
        per_thread cuStreamGetPriority_ptsz = |per_thread|
            // SAFETY: the caller guarantees a non-null `priority` is writable.
            unsafe { put(priority, properties(h, per_thread)?.1) };

    /// # Safety
    /// `ph` must be NULL or writable.
    pub unsafe fn cuEventCreate(ph: *mut CUevent, flags: u32) ["cuEventCreate" 2000] = {
        check(
            !ph.is_null()
                && flags & !(EVENT_BLOCKING_SYNC | EVENT_DISABLE_TIMING | EVENT_INTERPROCESS) == 0,
        )?;
        if flags & EVENT_INTERPROCESS != 0 {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        let ctx = current()?;
        let event = ctx.conn()?.event_create()?;
        let (h, _) = driver()?.events.insert_with(|_| EventObj {
            ctx: ctx.handle,
            device: ctx.device,
            event,
            flags,
        });
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(ph, std::ptr::without_provenance_mut(h)) }
    };

    pub fn cuEventRecord(ev: CUevent, h: CUstream) ["cuEventRecord" 2000]
        per_thread cuEventRecord_ptsz = |per_thread| record(ev, h, per_thread);

    pub fn cuEventRecordWithFlags(
        ev: CUevent,
        h: CUstream,
        flags: u32,
    ) ["cuEventRecordWithFlags" 11010]
        per_thread cuEventRecordWithFlags_ptsz = |per_thread|
            record_with_flags(ev, h, flags, per_thread);

    pub fn cuEventSynchronize(ev: CUevent) ["cuEventSynchronize" 2000] = {
        let e = event(ev)?;
        connection(e.device)?.event_synchronize(e.event)
    };

    pub fn cuEventQuery(ev: CUevent) ["cuEventQuery" 2000] = {
        let e = event(ev)?;
        if connection(e.device)?.event_query(e.event)? {
            Ok(())
        } else {
            Err(CUresult::CUDA_ERROR_NOT_READY)
        }
    };

    /// `_v2` is CUDA 12.8's form, with the same arguments.
    ///
    /// # Safety
    /// `ms` must be NULL or writable.
    pub unsafe fn cuEventElapsedTime(
        ms: *mut f32,
        start: CUevent,
        end: CUevent,
    ) ["cuEventElapsedTime" 2000]
        alias cuEventElapsedTime_v2 ["cuEventElapsedTime" 12080] = elapsed(ms, start, end);

    pub fn cuEventDestroy_v2(ev: CUevent) ["cuEventDestroy" 4000] = {
        let d = driver()?;
        let e = d
            .events
            .remove(ev as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        connection(e.device)?.event_destroy(e.event)
    };
}
