//! The server's one CUDA context: binding it to each thread, and its death.
//!
//! A kernel fault ends the context for every client (the device gives no finer containment).
//! The first driver call that reports such a failure marks the context dead and tells every
//! client; later submissions fail at once with the same error.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::result;
use cudarc::driver::sys::CUcontext;
use mps_core::{Error, Result};

use crate::backend::FaultSink;
use mps_driver::{Call, DriverError};

thread_local! {
    /// Whether the context is current on this thread.
    static BOUND: Cell<bool> = const { Cell::new(false) };
}

/// The primary context and what became of it.
pub(super) struct Context {
    raw: CUcontext,
    /// Set once `dead` holds the context's failure; checked on every submission, so it must not
    /// be a lock that all session threads contend on.
    is_dead: AtomicBool,
    dead: Mutex<Option<Error>>,
    /// Every client with a stream, to be told when the context dies.
    clients: Mutex<Vec<Weak<dyn FaultSink>>>,
}

// SAFETY: a CUcontext may be made current on any thread.
unsafe impl Send for Context {}
// SAFETY: as above; the other fields are atomic or locked.
unsafe impl Sync for Context {}

impl Context {
    /// The driver's handle.
    pub(super) fn raw(&self) -> CUcontext {
        self.raw
    }

    /// Wraps `raw`, which is current on the calling thread.
    pub(super) fn new(raw: CUcontext) -> Context {
        BOUND.with(|b| b.set(true));
        Context {
            raw,
            is_dead: AtomicBool::new(false),
            dead: Mutex::new(None),
            clients: Mutex::new(Vec::new()),
        }
    }

    /// Makes the context current on the calling thread (once per thread).
    /// Waits first while another thread's call needs the driver to itself
    /// ([`super::exclusive`]): every entry point that makes a driver call comes here.
    pub(super) fn bind(&self) {
        super::exclusive::hold_back();
        BOUND.with(|b| {
            if !b.get() {
                // SAFETY: the context lives as long as the backend (the primary context is
                // never released while the server runs).
                let r = unsafe { result::ctx::set_current(self.raw) };
                // A failure leaves the thread unbound; its next driver call reports why.
                b.set(r.call("cuCtxSetCurrent").is_ok());
            }
        });
    }

    /// Makes the context current on the calling thread, as every entry point that does work
    /// must first ([`Context::bind`]), and fails with the context's failure once it died
    /// ([`Context::alive`]).
    #[inline]
    pub(super) fn enter(&self) -> Result<()> {
        self.bind();
        self.alive()
    }

    /// Turns a driver result into ours; a failure that ends the context marks it dead and
    /// tells every client.
    pub(super) fn check<T>(&self, r: std::result::Result<T, DriverError>) -> Result<T> {
        r.map_err(|e| self.fail(e))
    }

    /// As [`Context::check`], for a failure in hand.
    pub(super) fn fail(&self, e: DriverError) -> Error {
        let sticky = e.is_sticky();
        let err = Error::from(e);
        if sticky {
            self.die(&err);
        }
        err
    }

    /// Fails with the context's failure once it died.
    pub(super) fn alive(&self) -> Result<()> {
        if !self.is_dead.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.dead.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Has `faults` told when the context dies (once per client).
    pub(super) fn watch(&self, faults: &Arc<dyn FaultSink>) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.retain(|w| w.strong_count() > 0);
        if !clients
            .iter()
            .any(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(faults)))
        {
            clients.push(Arc::downgrade(faults));
        }
    }

    fn die(&self, cause: &Error) {
        let mut dead = self.dead.lock().unwrap_or_else(|p| p.into_inner());
        if dead.is_some() {
            return;
        }
        let err = Error::new(
            cause.status,
            format!(
                "the server's CUDA context failed ({}); a kernel of a client of this server \
                 faulted, and on a GPU that ends the context for every client: reconnect to a \
                 new server",
                cause.message
            ),
        )
        .with_cuda_result(cause.cuda_result.unwrap_or(0));
        tracing::error!("{}", err.message);
        *dead = Some(err.clone());
        self.is_dead.store(true, Ordering::Release);
        drop(dead);
        let clients = std::mem::take(&mut *self.clients.lock().unwrap_or_else(|p| p.into_inner()));
        for c in clients.iter().filter_map(Weak::upgrade) {
            c.fault(0, err.clone());
        }
    }
}
