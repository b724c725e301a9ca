//! Contexts: the device's primary context and created ones, and each thread's stack of current
//! contexts.
//!
//! A context belongs to one device, and every context of a device is a view of the one context
//! that device's server owns: memory of one is usable from another of the same device, as in one
//! CUDA context. Each device has its primary context. What a context owns (allocations, streams, events, modules,
//! its legacy default stream) is freed when it is destroyed, or when the primary context's last
//! retain is released or it is reset.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use crate::abi::{CTX_FLAGS, CUcontext, CUctxCreateParams, CUdevice, CUresult};
use crate::capture;
use crate::connection::Res;
use crate::driver::{self, Stage, connection, driver};
use crate::ffi::{check, exports, lock, put};
use crate::memo::{self, Memo, through};
use crate::objects::{Context, ContextState};
use crate::order::LegacyOrder;

thread_local! {
    /// The calling thread's context stack, top last.
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn handle_of(ctx: CUcontext) -> usize {
    ctx as usize
}

pub(crate) fn to_cucontext(handle: usize) -> CUcontext {
    std::ptr::without_provenance_mut(handle)
}

/// The active context `handle` names.
pub(crate) fn context(handle: usize) -> Res<Arc<Context>> {
    let ctx = driver()?
        .contexts
        .get(handle)
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if !lock(&ctx.state).active {
        return Err(CUresult::CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    Ok(ctx)
}

/// The handle of the calling thread's current context, if it has one (not checked for being
/// active).
pub(crate) fn current_handle() -> Option<usize> {
    // Once the thread's storage is gone, it has none: a library's exit handlers (cuFFT's) run
    // after the main thread's thread-local destructors, and call the driver API.
    STACK.try_with(|s| s.borrow().last().copied()).ok()?
}

/// The calling thread's current context.
pub(crate) fn current() -> Res<Arc<Context>> {
    context(current_handle().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?)
}

thread_local! {
    /// The contexts this thread found active, with their devices.
    static FOUND_ACTIVE: Memo<usize, CUdevice> = Memo::default();
}

/// The device of the active context `ctx`, or of the current context where it is NULL. A
/// launch asks whether there is one, and cudart asks its device about a dozen times per launch
/// (`cuCtxGetDevice`): an answer about an active context is kept until handles change
/// ([`crate::memo`]), a thread-local look-up instead of the registry's lock and the context's.
fn device_of(ctx: CUcontext) -> Res<CUdevice> {
    let h = if ctx.is_null() {
        current_handle().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?
    } else {
        handle_of(ctx)
    };
    through(
        &FOUND_ACTIVE,
        h,
        || context(h).map(|c| c.device),
        |d| Ok(*d),
    )
}

/// As [`current`], where only whether there is one matters (a launch).
pub(crate) fn require_current() -> Res<()> {
    device_of(std::ptr::null_mut()).map(drop)
}

/// `ctx`, or the current context where it is NULL.
pub(crate) fn given_or_current(ctx: CUcontext) -> Res<Arc<Context>> {
    if ctx.is_null() {
        current()
    } else {
        context(handle_of(ctx))
    }
}

/// The primary context of device `dev` (`CUDA_ERROR_INVALID_DEVICE` for one not seen).
pub(crate) fn primary_of(dev: CUdevice) -> Res<&'static Arc<Context>> {
    Ok(&driver()?.device(dev)?.primary)
}

/// Frees everything context `ctx` owns, after its work is done; the first failure is returned
/// once everything has been tried. What the areas above keep for it (the runtime's storage,
/// modules) they free in their release hooks ([`driver::on_release`]).
fn release_resources(ctx: &Context) -> Res<()> {
    // The runtime's per-context state goes first, while the context still works.
    let mut early = Ok(());
    driver::run_release_hooks(ctx, Stage::Early, |r| {
        if early.is_ok() {
            early = r;
        }
    });
    let d = driver()?;
    let conn = ctx.conn()?;
    // A capturing stream cannot be waited for or destroyed: its capture ends first.
    let ended = capture::end_captures_of(ctx.handle);
    let mut first = early.and(ended).and(conn.synchronize());
    let mut keep = |r: Res<()>| {
        if first.is_ok() {
            first = r;
        }
    };
    let h = ctx.handle;
    for s in d.streams.remove_where(|s| s.ctx == h) {
        keep(conn.stream_destroy(s.stream));
    }
    for e in d.events.remove_where(|e| e.ctx == h) {
        keep(conn.event_destroy(e.event));
    }
    driver::run_release_hooks(ctx, Stage::Late, &mut keep);
    let mine: Vec<(CUdevice, u64)> = {
        let mut a = lock(&d.allocations);
        let mine: Vec<(CUdevice, u64)> = a
            .iter()
            .filter(|(_, a)| a.ctx == h)
            .map(|(key, _)| *key)
            .collect();
        mine.iter().for_each(|p| {
            a.remove(p);
        });
        mine
    };
    for (_, p) in mine {
        keep(conn.mem_free(p));
    }
    let host: Vec<usize> = {
        let mut a = lock(&d.host);
        let mine: Vec<usize> = a
            .iter()
            .filter(|(_, b)| b.ctx == h)
            .map(|(p, _)| *p)
            .collect();
        mine.iter().for_each(|p| {
            a.remove(p);
        });
        mine
    };
    for p in host {
        keep(conn.host_free(std::ptr::without_provenance_mut(p)));
    }
    let order = std::mem::take(&mut lock(&ctx.state).order);
    for e in order.events() {
        keep(conn.event_destroy(e));
    }
    first
}

fn create(pctx: *mut CUcontext, flags: u32, dev: CUdevice) -> Res<()> {
    let d = driver()?;
    d.device(dev)?;
    check(!pctx.is_null() && flags & !CTX_FLAGS == 0)?;
    let legacy = connection(dev)?.stream_create(0)?;
    let (handle, _) = d.contexts.insert_with(|handle| Context {
        handle,
        primary: false,
        device: dev,
        state: Mutex::new(ContextState {
            active: true,
            retains: 0,
            flags,
            legacy,
            order: LegacyOrder::default(),
        }),
    });
    STACK.with(|s| s.borrow_mut().push(handle));
    // SAFETY: checked non-null above; the caller guarantees it is writable.
    unsafe { put(pctx, to_cucontext(handle)) }
}

fn push(ctx: CUcontext) -> Res<()> {
    let c = context(handle_of(ctx))?;
    STACK.with(|s| s.borrow_mut().push(c.handle));
    Ok(())
}

fn pop(pctx: *mut CUcontext) -> Res<()> {
    driver()?;
    let top = STACK
        .with(|s| s.borrow_mut().pop())
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        // SAFETY: non-null, and the caller of the export guarantees it is writable.
        unsafe { put(pctx, to_cucontext(top)) }?;
    }
    Ok(())
}

// ----- the primary context -----

fn primary_release(dev: CUdevice) -> Res<()> {
    let p = primary_of(dev)?;
    let last = {
        let mut st = lock(&p.state);
        if st.retains == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        st.retains -= 1;
        st.retains == 0
    };
    if last {
        let r = release_resources(p);
        lock(&p.state).active = false;
        memo::handles_changed();
        return r;
    }
    Ok(())
}

fn primary_reset(dev: CUdevice) -> Res<()> {
    let p = primary_of(dev)?;
    if !lock(&p.state).active {
        return Ok(());
    }
    release_resources(p)
}

fn primary_set_flags(dev: CUdevice, flags: u32) -> Res<()> {
    let p = primary_of(dev)?;
    check(flags & !CTX_FLAGS == 0)?;
    lock(&p.state).flags = flags;
    Ok(())
}

// ----- the exports -----

exports! {
    /// Creates a context and makes it current.
    ///
    /// # Safety
    /// `pctx` must be NULL or writable.
    pub unsafe fn cuCtxCreate_v2(
        pctx: *mut CUcontext,
        flags: u32,
        dev: CUdevice,
    ) ["cuCtxCreate" 3020] =
        create(pctx, flags, dev);

    /// `cuCtxCreate_v3`: execution-affinity parameters are not supported (none may be given).
    ///
    /// # Safety
    /// `pctx` must be NULL or writable.
    pub unsafe fn cuCtxCreate_v3(
        pctx: *mut CUcontext,
        _params: *mut std::ffi::c_void,
        num_params: i32,
        flags: u32,
        dev: CUdevice,
    ) ["cuCtxCreate" 11040] = {
        if num_params != 0 {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    };

    /// `cuCtxCreate_v4` (CUDA 13's cuCtxCreate): creation parameters (affinity, CIG) are not
    /// supported; NULL or empty ones are.
    ///
    /// # Safety
    /// `pctx` must be NULL or writable; `params` NULL or readable.
    pub unsafe fn cuCtxCreate_v4(
        pctx: *mut CUcontext,
        params: *mut CUctxCreateParams,
        flags: u32,
        dev: CUdevice,
    ) ["cuCtxCreate" 12050] = {
        // SAFETY: the caller guarantees a non-null `params` is readable.
        if let Some(p) = unsafe { params.as_ref() }
            && (p.numExecAffinityParams != 0 || !p.cigParams.is_null())
        {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        create(pctx, flags, dev)
    };

    /// Destroys a created context (its work done first); it is popped from the calling thread.
    pub fn cuCtxDestroy_v2(ctx: CUcontext) ["cuCtxDestroy" 4000] = {
        let c = context(handle_of(ctx))?;
        if c.primary {
            return Err(CUresult::CUDA_ERROR_INVALID_CONTEXT);
        }
        let result = release_resources(&c);
        let legacy = {
            let mut st = lock(&c.state);
            st.active = false;
            st.legacy
        };
        driver()?.contexts.remove(c.handle);
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            if s.last() == Some(&c.handle) {
                s.pop();
            }
        });
        result.and(c.conn()?.stream_destroy(legacy))
    };

    /// # Safety
    /// `pctx` must be NULL or writable.
    pub unsafe fn cuCtxGetCurrent(pctx: *mut CUcontext) ["cuCtxGetCurrent" 4000] = {
        driver()?;
        let top = current_handle().unwrap_or(0);
        // SAFETY: the caller guarantees a non-null `pctx` is writable.
        unsafe { put(pctx, to_cucontext(top)) }
    };

    /// Replaces the top of the calling thread's stack (NULL pops it). The primary context may be
    /// made current before it is retained, as NVIDIA's driver allows and cudart does (it takes the
    /// handle from its interface table, sets it, then retains it). Making a context of another
    /// device current is how a program switches devices (`cudaSetDevice`).
    pub fn cuCtxSetCurrent(ctx: CUcontext) ["cuCtxSetCurrent" 4000] = {
        if ctx.is_null() {
            driver()?;
            STACK.with(|s| s.borrow_mut().pop());
            return Ok(());
        }
        let c = match driver()?.contexts.get(handle_of(ctx)) {
            Some(p) if p.primary => p,
            _ => context(handle_of(ctx))?,
        };
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            s.pop();
            s.push(c.handle);
        });
        Ok(())
    };

    /// Its unversioned name, with the same arguments, is exported too: libraries also take it by
    /// `dlsym` (`cuGetProcAddress` hands out only the `_v2`).
    pub fn cuCtxPushCurrent_v2(ctx: CUcontext) ["cuCtxPushCurrent" 4000]
        alias cuCtxPushCurrent [] = push(ctx);

    /// Its unversioned name is exported too (see `cuCtxPushCurrent_v2`).
    ///
    /// # Safety
    /// `pctx` must be NULL or writable.
    pub unsafe fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) ["cuCtxPopCurrent" 4000]
        alias cuCtxPopCurrent [] = pop(pctx);

    /// # Safety
    /// `device` must be NULL or writable.
    pub unsafe fn cuCtxGetDevice(device: *mut CUdevice) ["cuCtxGetDevice" 2000] = {
        let dev = device_of(std::ptr::null_mut())?;
        // SAFETY: the caller guarantees a non-null `device` is writable.
        unsafe { put(device, dev) }
    };

    /// CUDA 13's form: the device of `ctx`, or of the current context where it is NULL.
    ///
    /// # Safety
    /// `device` must be NULL or writable.
    pub unsafe fn cuCtxGetDevice_v2(
        device: *mut CUdevice,
        ctx: CUcontext,
    ) ["cuCtxGetDevice" 13000] = {
        let dev = device_of(ctx)?;
        // SAFETY: the caller guarantees a non-null `device` is writable.
        unsafe { put(device, dev) }
    };

    /// The driver API version a context was made with: 3020 (CUDA 3.2's, the `_v2` ABI) for every
    /// context, the version NVIDIA's driver reports for contexts of the current API. cudart asks it
    /// when a thread first uses a context.
    ///
    /// # Safety
    /// `version` must be NULL or writable.
    pub unsafe fn cuCtxGetApiVersion(
        ctx: CUcontext,
        version: *mut u32,
    ) ["cuCtxGetApiVersion" 3020] = {
        given_or_current(ctx)?;
        // SAFETY: the caller guarantees a non-null `version` is writable.
        unsafe { put(version, 3020) }
    };

    /// # Safety
    /// `flags` must be NULL or writable.
    pub unsafe fn cuCtxGetFlags(flags: *mut u32) ["cuCtxGetFlags" 7000] = {
        let f = lock(&current()?.state).flags;
        // SAFETY: the caller guarantees a non-null `flags` is writable.
        unsafe { put(flags, f) }
    };

    /// Waits for all work of the process on the context's device (every context of a device is a
    /// view of its server's one context).
    pub fn cuCtxSynchronize() ["cuCtxSynchronize" 2000] = {
        let ctx = current()?;
        let conn = ctx.conn()?;
        capture::refuse_context_wait(ctx.handle, conn)?;
        conn.synchronize()?;
        driver::run_synchronized_hooks(conn)
    };

    /// CUDA 13's form, naming the context (NULL: the current one).
    pub fn cuCtxSynchronize_v2(ctx: CUcontext) ["cuCtxSynchronize" 13000] = {
        let ctx = given_or_current(ctx)?;
        let conn = ctx.conn()?;
        capture::refuse_context_wait(ctx.handle, conn)?;
        conn.synchronize()?;
        driver::run_synchronized_hooks(conn)
    };

    /// Refused as CUDA refuses it where `cuDeviceCanAccessPeer` says 0, which it always does
    /// through mps: `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED` (after the checks of the arguments).
    pub fn cuCtxEnablePeerAccess(peer: CUcontext, flags: u32) ["cuCtxEnablePeerAccess" 4000] = {
        current()?;
        context(handle_of(peer))?;
        check(flags == 0)?;
        Err(CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
    };

    /// Peer access is never enabled: `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`, as CUDA says for a peer
    /// not enabled.
    pub fn cuCtxDisablePeerAccess(peer: CUcontext) ["cuCtxDisablePeerAccess" 4000] = {
        current()?;
        context(handle_of(peer))?;
        Err(CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED)
    };

    /// # Safety
    /// `pctx` must be NULL or writable.
    pub unsafe fn cuDevicePrimaryCtxRetain(
        pctx: *mut CUcontext,
        dev: CUdevice,
    ) ["cuDevicePrimaryCtxRetain" 7000] = {
        let p = primary_of(dev)?;
        check(!pctx.is_null())?;
        // The device is connected here, if it is not yet, so that an unreachable server fails
        // the retain as a context that cannot be made fails it in CUDA.
        p.conn()?;
        {
            let mut st = lock(&p.state);
            st.retains += 1;
            st.active = true;
        }
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(pctx, to_cucontext(p.handle)) }
    };

    pub fn cuDevicePrimaryCtxRelease(dev: CUdevice) ["cuDevicePrimaryCtxRelease" 7000]
        alias cuDevicePrimaryCtxRelease_v2 ["cuDevicePrimaryCtxRelease" 11000] =
        primary_release(dev);

    pub fn cuDevicePrimaryCtxReset(dev: CUdevice) ["cuDevicePrimaryCtxReset" 7000]
        alias cuDevicePrimaryCtxReset_v2 ["cuDevicePrimaryCtxReset" 11000] = primary_reset(dev);

    /// # Safety
    /// `flags` and `active` must be NULL or writable.
    pub unsafe fn cuDevicePrimaryCtxGetState(
        dev: CUdevice,
        flags: *mut u32,
        active: *mut i32,
    ) ["cuDevicePrimaryCtxGetState" 7000] = {
        let p = primary_of(dev)?;
        check(!flags.is_null() && !active.is_null())?;
        let (f, a) = {
            let st = lock(&p.state);
            (st.flags, st.active)
        };
        // SAFETY: both checked non-null; the caller guarantees they are writable.
        unsafe {
            put(flags, f)?;
            put(active, a as i32)
        }
    };

    pub fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: u32) ["cuDevicePrimaryCtxSetFlags" 7000]
        alias cuDevicePrimaryCtxSetFlags_v2 ["cuDevicePrimaryCtxSetFlags" 11000] =
        primary_set_flags(dev, flags);
}
