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

/// A function as an untyped address: its caller knows its real type.
pub(crate) type AnyFn = unsafe extern "C" fn();

/// One exported function of the driver API, as `cuGetProcAddress` hands it out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Export {
    // Read by the tests that keep the symbols and `cuGetProcAddress`'s table in step.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) symbol: &'static str,
    pub(crate) function: AnyFn,
    /// The names it is handed out for, each with the CUDA version that introduced this ABI of
    /// the name; none for a name that only the dynamic linker serves.
    pub(crate) procs: &'static [(&'static str, i32)],
    /// Its per-thread-default-stream variant (`_ptsz`, `_ptds`), by symbol, handed out for the
    /// same names with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
    pub(crate) per_thread: Option<(&'static str, AnyFn)>,
}

/// Defines a module's exported functions and its list of them, `EXPORTS`, for
/// `cuGetProcAddress`: each function once, with the rows it is handed out for, so that the
/// symbols and the table cannot drift. Each entry is
///
/// ```text
/// /// docs
/// pub [unsafe] fn cuName_v2(params) ["cuName" 3020, ...]
///     [alias cuName_v3 ["cuName" 11000]]...      another symbol with the same body
///     = body;                                    an expression: Res<()>
/// pub [unsafe] fn cuName(params) ["cuName" 2000]
///     per_thread cuName_ptsz = |per_thread| body; the body once, per_thread false and true
/// ```
///
/// Every symbol is `#[unsafe(no_mangle)] pub extern "C" fn(params) -> CUresult`, its body run
/// in [`entry`] under its own name.
macro_rules! exports {
    (@munch [$($rows:tt)*]) => {
        /// This module's exports, as `cuGetProcAddress` hands them out.
        pub(crate) const EXPORTS: &[$crate::ffi::Export] = &[$($rows)*];
    };
    (@munch $rows:tt $(#[$attr:meta])* pub unsafe fn $($rest:tt)*) => {
        $crate::ffi::exports!(@entry $rows [$(#[$attr])*] [unsafe] $($rest)*);
    };
    (@munch $rows:tt $(#[$attr:meta])* pub fn $($rest:tt)*) => {
        $crate::ffi::exports!(@entry $rows [$(#[$attr])*] [] $($rest)*);
    };
    (@entry [$($rows:tt)*] $attrs:tt $unsafe:tt
        $f:ident $params:tt [$($name:literal $since:literal),* $(,)?]
        per_thread $pt:ident = |$v:ident| $body:expr;
        $($rest:tt)*
    ) => {
        $crate::ffi::exports!(@fn $attrs $unsafe $f $params [let $v = false;] $body);
        $crate::ffi::exports!(@fn $attrs $unsafe $pt $params [let $v = true;] $body);
        $crate::ffi::exports!(@munch [$($rows)* $crate::ffi::Export {
            symbol: stringify!($f),
            function: $crate::ffi::exports!(@address $f $params),
            procs: &[$(($name, $since)),*],
            per_thread: Some((stringify!($pt), $crate::ffi::exports!(@address $pt $params))),
        },] $($rest)*);
    };
    (@entry [$($rows:tt)*] $attrs:tt $unsafe:tt
        $f:ident $params:tt [$($name:literal $since:literal),* $(,)?]
        $(alias $a:ident [$($aname:literal $asince:literal),* $(,)?])*
        = $body:expr;
        $($rest:tt)*
    ) => {
        $crate::ffi::exports!(@fn $attrs $unsafe $f $params [] $body);
        $($crate::ffi::exports!(@fn $attrs $unsafe $a $params [] $body);)*
        $crate::ffi::exports!(@munch [$($rows)* $crate::ffi::Export {
            symbol: stringify!($f),
            function: $crate::ffi::exports!(@address $f $params),
            procs: &[$(($name, $since)),*],
            per_thread: None,
        }, $($crate::ffi::Export {
            symbol: stringify!($a),
            function: $crate::ffi::exports!(@address $a $params),
            procs: &[$(($aname, $asince)),*],
            per_thread: None,
        },)*] $($rest)*);
    };
    (@fn [$($attr:tt)*] [$($unsafe:tt)?] $f:ident ($($p:ident: $t:ty),* $(,)?)
        [$($bind:tt)*] $body:expr
    ) => {
        $($attr)*
        #[unsafe(no_mangle)]
        pub $($unsafe)? extern "C" fn $f($($p: $t),*) -> $crate::abi::CUresult {
            $($bind)*
            $crate::ffi::entry(stringify!($f), || $body)
        }
    };
    (@address $f:ident ($($p:ident: $t:ty),* $(,)?)) => {
        // SAFETY: a function pointer kept untyped; whoever is handed it calls it with its own
        // type, the one it is cast from here.
        unsafe {
            std::mem::transmute::<
                unsafe extern "C" fn($($t),*) -> $crate::abi::CUresult,
                $crate::ffi::AnyFn,
            >($f)
        }
    };
    (@$stage:ident $($rest:tt)*) => {
        compile_error!(concat!(
            "an export is not of the form `exports!` takes: ",
            stringify!($($rest)*)
        ));
    };
    ($($entries:tt)*) => {
        $crate::ffi::exports!(@munch [] $($entries)*);
    };
}
pub(crate) use exports;
