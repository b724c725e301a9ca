//! A driver call's failure: its code, its name, the call and the object, and the mps status it
//! becomes.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::result;
use cudarc::driver::sys::{CUresult, cudaError_enum as E};
use mps_core::{Error, Status};

/// Set once [`crate::init`] succeeded: the driver library is loaded and may describe its
/// errors.
pub(crate) static LOADED: AtomicBool = AtomicBool::new(false);

/// A failed driver call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverError {
    code: CUresult,
    call: &'static str,
    object: Option<String>,
}

impl DriverError {
    /// `call` returned `code` (not `CUDA_SUCCESS`).
    pub fn new(code: CUresult, call: &'static str) -> DriverError {
        debug_assert_ne!(code, CUresult::CUDA_SUCCESS);
        DriverError {
            code,
            call,
            object: None,
        }
    }

    /// Names the object the call was made on (a kernel, a stream, a size).
    pub fn on(mut self, object: impl Into<String>) -> DriverError {
        self.object = Some(object.into());
        self
    }

    /// The driver's result.
    pub fn code(&self) -> CUresult {
        self.code
    }

    /// The driver's name of the result, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`: `cuGetErrorName` once
    /// [`crate::init`] loaded the driver, else cudarc's variant, which carries the same name.
    pub fn name(&self) -> String {
        self.driver_text(|e| e.error_name())
            .unwrap_or_else(|| format!("{:?}", self.code))
    }

    /// The driver's description of the result (`cuGetErrorString`), once [`crate::init`] loaded it.
    pub fn description(&self) -> Option<String> {
        self.driver_text(|e| e.error_string())
    }

    fn driver_text(
        &self,
        ask: impl FnOnce(&result::DriverError) -> Result<&std::ffi::CStr, result::DriverError>,
    ) -> Option<String> {
        if !LOADED.load(Ordering::Acquire) {
            return None;
        }
        let e = result::DriverError(self.code);
        ask(&e).ok().map(|s| s.to_string_lossy().into_owned())
    }

    /// The driver call that failed.
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The mps status of this failure.
    pub fn status(&self) -> Status {
        status_of(self.code)
    }

    /// Whether the failure ends the context (see [`is_sticky`]).
    pub fn is_sticky(&self) -> bool {
        is_sticky(self.code)
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.call)?;
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        write!(f, " failed: {} ({})", self.name(), self.code as u32)?;
        if let Some(text) = self.description() {
            write!(f, ", {text}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DriverError {}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Error {
        Error::new(e.status(), e.to_string()).with_cuda_result(e.code as u32)
    }
}

/// `Ok` for `CUDA_SUCCESS`, otherwise the failure of `call`.
#[inline]
pub fn check(code: CUresult, call: &'static str) -> Result<(), DriverError> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DriverError::new(code, call))
    }
}

/// As [`check`], naming the object the call was made on; `object` runs only on failure.
#[inline]
pub fn check_on(
    code: CUresult,
    call: &'static str,
    object: impl FnOnce() -> String,
) -> Result<(), DriverError> {
    check(code, call).map_err(|e| e.on(object()))
}

/// Names the call, and the object it was made on, of a result of cudarc's result layer
/// (`cudarc::driver::result`), which keeps only the code.
pub trait Call<T> {
    /// The result, a failure naming `call`.
    fn call(self, call: &'static str) -> Result<T, DriverError>;
    /// As [`Call::call`], naming the object too; `object` runs only on failure.
    fn call_on(self, call: &'static str, object: impl FnOnce() -> String)
    -> Result<T, DriverError>;
}

impl<T> Call<T> for Result<T, result::DriverError> {
    #[inline]
    fn call(self, call: &'static str) -> Result<T, DriverError> {
        self.map_err(|e| DriverError::new(e.0, call))
    }

    #[inline]
    fn call_on(
        self,
        call: &'static str,
        object: impl FnOnce() -> String,
    ) -> Result<T, DriverError> {
        self.map_err(|e| DriverError::new(e.0, call).on(object()))
    }
}

/// For a call that releases something (in a `Drop`, or while tearing down), whose failure
/// leaves nothing to do but say so: a dead context fails every release.
pub fn released(r: Result<(), DriverError>) {
    if let Err(e) = r {
        tracing::debug!("{e}");
    }
}

/// Whether a failure leaves the context unusable: every later call of any thread fails with it,
/// and only a new process gets a working context.
pub fn is_sticky(code: CUresult) -> bool {
    matches!(
        code,
        E::CUDA_ERROR_ILLEGAL_ADDRESS
            | E::CUDA_ERROR_MISALIGNED_ADDRESS
            | E::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | E::CUDA_ERROR_LAUNCH_FAILED
            | E::CUDA_ERROR_LAUNCH_TIMEOUT
            | E::CUDA_ERROR_HARDWARE_STACK_ERROR
            | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | E::CUDA_ERROR_INVALID_PC
            | E::CUDA_ERROR_ASSERT
            | E::CUDA_ERROR_ECC_UNCORRECTABLE
            | E::CUDA_ERROR_NVLINK_UNCORRECTABLE
            | E::CUDA_ERROR_CONTAINED
            | E::CUDA_ERROR_TENSOR_MEMORY_LEAK
    )
}

/// The mps status a driver result becomes: the one table.
pub fn status_of(code: CUresult) -> Status {
    match code {
        E::CUDA_SUCCESS => Status::Success,
        // A kernel touched memory it may not: the client's fault, reported as such.
        E::CUDA_ERROR_ILLEGAL_ADDRESS
        | E::CUDA_ERROR_MISALIGNED_ADDRESS
        | E::CUDA_ERROR_INVALID_ADDRESS_SPACE => Status::IllegalAddress,
        // Every other way a kernel can fail to launch or to finish, the sticky ones included.
        E::CUDA_ERROR_LAUNCH_FAILED
        | E::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        | E::CUDA_ERROR_LAUNCH_TIMEOUT
        | E::CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING
        | E::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
        | E::CUDA_ERROR_INVALID_CLUSTER_SIZE
        | E::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | E::CUDA_ERROR_HARDWARE_STACK_ERROR
        | E::CUDA_ERROR_INVALID_PC
        | E::CUDA_ERROR_ASSERT
        | E::CUDA_ERROR_TENSOR_MEMORY_LEAK
        | E::CUDA_ERROR_ECC_UNCORRECTABLE
        | E::CUDA_ERROR_NVLINK_UNCORRECTABLE
        | E::CUDA_ERROR_CONTAINED => Status::LaunchFailed,
        E::CUDA_ERROR_INVALID_VALUE | E::CUDA_ERROR_INVALID_DEVICE => Status::InvalidValue,
        E::CUDA_ERROR_OUT_OF_MEMORY => Status::OutOfMemory,
        E::CUDA_ERROR_NOT_READY => Status::NotReady,
        E::CUDA_ERROR_NOT_FOUND | E::CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND => Status::NotFound,
        // The image is not one this device and driver can load.
        E::CUDA_ERROR_INVALID_IMAGE
        | E::CUDA_ERROR_INVALID_PTX
        | E::CUDA_ERROR_INVALID_SOURCE
        | E::CUDA_ERROR_NO_BINARY_FOR_GPU
        | E::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
        | E::CUDA_ERROR_JIT_COMPILER_NOT_FOUND
        | E::CUDA_ERROR_JIT_COMPILATION_DISABLED
        | E::CUDA_ERROR_SHARED_OBJECT_INIT_FAILED => Status::InvalidImage,
        // No usable driver or device, or a feature this driver or device lacks.
        E::CUDA_ERROR_NOT_SUPPORTED
        | E::CUDA_ERROR_NO_DEVICE
        | E::CUDA_ERROR_STUB_LIBRARY
        | E::CUDA_ERROR_NOT_INITIALIZED
        | E::CUDA_ERROR_DEINITIALIZED
        | E::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
        | E::CUDA_ERROR_SYSTEM_NOT_READY
        | E::CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE
        | E::CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER
        | E::CUDA_ERROR_DEVICE_UNAVAILABLE
        | E::CUDA_ERROR_DEVICE_NOT_LICENSED
        | E::CUDA_ERROR_UNSUPPORTED_LIMIT
        | E::CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY
        | E::CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC
        | E::CUDA_ERROR_INVALID_RESOURCE_TYPE
        | E::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION => Status::Unsupported,
        E::CUDA_ERROR_NOT_PERMITTED => Status::PermissionDenied,
        // Handles, contexts and registrations are the server's own, checked before every call:
        // a failure about them is a bug of the server, as is anything unforeseen.
        _ => Status::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_faults_are_sticky_and_keep_the_statuses_clients_are_told() {
        for (code, status) in [
            (E::CUDA_ERROR_ILLEGAL_ADDRESS, Status::IllegalAddress),
            (E::CUDA_ERROR_MISALIGNED_ADDRESS, Status::IllegalAddress),
            (E::CUDA_ERROR_INVALID_ADDRESS_SPACE, Status::IllegalAddress),
            (E::CUDA_ERROR_LAUNCH_FAILED, Status::LaunchFailed),
            (E::CUDA_ERROR_LAUNCH_TIMEOUT, Status::LaunchFailed),
            (E::CUDA_ERROR_ILLEGAL_INSTRUCTION, Status::LaunchFailed),
            (E::CUDA_ERROR_HARDWARE_STACK_ERROR, Status::LaunchFailed),
            (E::CUDA_ERROR_INVALID_PC, Status::LaunchFailed),
            (E::CUDA_ERROR_ASSERT, Status::LaunchFailed),
            (E::CUDA_ERROR_ECC_UNCORRECTABLE, Status::LaunchFailed),
            (E::CUDA_ERROR_NVLINK_UNCORRECTABLE, Status::LaunchFailed),
            (E::CUDA_ERROR_CONTAINED, Status::LaunchFailed),
            (E::CUDA_ERROR_TENSOR_MEMORY_LEAK, Status::LaunchFailed),
        ] {
            assert!(is_sticky(code), "{code:?} ends the context");
            assert_eq!(status_of(code), status, "{code:?}");
        }
    }

    #[test]
    fn request_errors_map_to_their_statuses_and_leave_the_context_alive() {
        for (code, status) in [
            (E::CUDA_ERROR_INVALID_VALUE, Status::InvalidValue),
            (E::CUDA_ERROR_OUT_OF_MEMORY, Status::OutOfMemory),
            (E::CUDA_ERROR_NOT_READY, Status::NotReady),
            (E::CUDA_ERROR_NOT_FOUND, Status::NotFound),
            (E::CUDA_ERROR_INVALID_IMAGE, Status::InvalidImage),
            (E::CUDA_ERROR_INVALID_PTX, Status::InvalidImage),
            (E::CUDA_ERROR_NO_BINARY_FOR_GPU, Status::InvalidImage),
            (E::CUDA_ERROR_UNSUPPORTED_PTX_VERSION, Status::InvalidImage),
            (E::CUDA_ERROR_NOT_SUPPORTED, Status::Unsupported),
            (E::CUDA_ERROR_NO_DEVICE, Status::Unsupported),
            (E::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, Status::LaunchFailed),
            (E::CUDA_ERROR_INVALID_HANDLE, Status::Internal),
            (E::CUDA_ERROR_INVALID_CONTEXT, Status::Internal),
            (E::CUDA_ERROR_NOT_PERMITTED, Status::PermissionDenied),
            (E::CUDA_ERROR_UNKNOWN, Status::Internal),
        ] {
            assert!(!is_sticky(code), "{code:?} leaves the context usable");
            assert_eq!(status_of(code), status, "{code:?}");
        }
    }

    #[test]
    fn an_error_keeps_the_code_its_name_the_call_and_the_object() {
        let called = std::cell::Cell::new(false);
        assert!(
            check_on(E::CUDA_SUCCESS, "cuMemAlloc", || {
                called.set(true);
                String::new()
            })
            .is_ok()
        );
        assert!(!called.get(), "a successful call formats no object");
        let e = check_on(E::CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", || {
            "1048576 bytes".into()
        })
        .unwrap_err();
        assert_eq!(e.code(), E::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(e.call(), "cuMemAlloc");
        let err: Error = e.into();
        assert_eq!(err.status, Status::OutOfMemory);
        assert!(
            err.message
                .starts_with("cuMemAlloc (1048576 bytes) failed: CUDA_ERROR_OUT_OF_MEMORY (2)"),
            "{}",
            err.message
        );
        let e = check(E::CUDA_ERROR_ILLEGAL_ADDRESS, "cuStreamSynchronize").unwrap_err();
        assert!(e.is_sticky());
        assert!(
            e.to_string()
                .starts_with("cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)")
        );
    }
}
