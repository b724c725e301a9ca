//! What every exported function is built from: its result type, the panic boundary its body
//! runs in, and the checks and writes of the pointers a C caller passes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard};

use crate::abi::CUresult;
use crate::log;

/// What a call gives: its value, or the CUDA result of its failure.
pub(crate) type Res<T> = Result<T, CUresult>;

/// Runs an exported function's body: its error is its result, and a panic becomes
/// `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
pub(crate) fn entry(name: &str, body: impl FnOnce() -> Res<()>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(e)) => {
            log::detail_once(format_args!("{name} {e:?}"), || format!("{name}: {e:?}"));
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

/// Locks `m`; a lock poisoned by a panic is taken as it is (the panic boundary has already
/// turned that panic into the call's error).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
