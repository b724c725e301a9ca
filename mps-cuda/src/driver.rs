//! The process's driver state: the connection made by `cuInit`, the registries of handles, and
//! the guard every exported function runs its body in.

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::abi::CUresult;
use crate::connection::{Connection, Res};
use crate::context::Context;
use crate::handles::Registry;
use crate::log;
use crate::module::{FunctionObj, ModuleObj};
use crate::stream::{EventObj, StreamObj};

/// Everything `cuInit` sets up.
#[derive(Debug)]
pub(crate) struct Driver {
    pub(crate) conn: Connection,
    /// The device's primary context (always registered; active while retained).
    pub(crate) primary: Arc<Context>,
    pub(crate) contexts: Registry<Context>,
    pub(crate) streams: Registry<StreamObj>,
    pub(crate) events: Registry<EventObj>,
    pub(crate) modules: Registry<ModuleObj>,
    /// Functions and kernels share one registry: cudart launches a CUkernel as a CUfunction.
    pub(crate) functions: Registry<FunctionObj>,
    /// Device allocations: address → the context that made them.
    pub(crate) allocations: Mutex<HashMap<u64, usize>>,
    /// Page-locked host allocations (the server's shared host buffers): address → (length,
    /// context).
    pub(crate) host: Mutex<BTreeMap<usize, (usize, usize)>>,
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();

/// Connects once; later calls return the first call's result, as CUDA's `cuInit` does.
pub(crate) fn init() -> Res<()> {
    DRIVER
        .get_or_init(|| {
            let conn = Connection::connect().map_err(|message| {
                log::always(&format!(
                    "no device: {message} (this program runs through mps's libcuda.so.1, \
                     which serves the device of an mps server)"
                ));
                CUresult::CUDA_ERROR_NO_DEVICE
            })?;
            let contexts = Registry::default();
            let (_, primary) = contexts.insert_with(Context::primary);
            Ok(Driver {
                conn,
                primary,
                contexts,
                streams: Registry::default(),
                events: Registry::default(),
                modules: Registry::default(),
                functions: Registry::default(),
                allocations: Mutex::new(HashMap::new()),
                host: Mutex::new(BTreeMap::new()),
            })
        })
        .as_ref()
        .map(drop)
        .map_err(|e| *e)
}

/// The driver, once `cuInit` has succeeded.
pub(crate) fn driver() -> Res<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        Some(Err(e)) => Err(*e),
        None => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs an exported function's body: its error is its result, and a panic becomes
/// `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
pub(crate) fn entry(name: &str, body: impl FnOnce() -> Res<()>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => {
            log::detail_once(&format!("{name} {e:?}"), || format!("{name}: {e:?}"));
            e
        }
        Err(_) => {
            log::always(&format!(
                "{name}: internal error (panic); returning CUDA_ERROR_UNKNOWN"
            ));
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

/// Writes `value` through the out-pointer `out`; NULL is `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `out` must be NULL or valid for writing a `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> Res<()> {
    if out.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller guarantees it is writable.
    unsafe { out.write(value) };
    Ok(())
}

/// `Err(CUDA_ERROR_INVALID_VALUE)` unless `ok`.
pub(crate) fn check(ok: bool) -> Res<()> {
    if ok {
        Ok(())
    } else {
        Err(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}
