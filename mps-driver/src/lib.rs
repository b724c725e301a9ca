//! The CUDA driver as mps uses it: its results as mps errors, and the device's description.
//!
//! Every driver call whose failure matters goes through [`check`] (or [`check_on`], which names
//! the object only when the call failed, so that a successful call formats nothing). A failure
//! becomes a [`DriverError`] that keeps the driver's code, its name and the call and object that
//! failed; [`status_of`] is the one table from a `CUresult` to an mps [`Status`], and
//! [`is_sticky`] says which failures end the context. Releases whose failure leaves nothing to do
//! go through [`released`].
//!
//! The server's CUDA backend and other programs that drive CUDA themselves (the benchmark's
//! native workers) report failures the same way:
//!
//! ```no_run
//! use cudarc::driver::sys;
//! use mps_driver::{self as driver, DriverError, check, check_on};
//!
//! fn first_device() -> Result<sys::CUdevice, DriverError> {
//!     driver::init()?;
//!     let mut dev = 0;
//!     // SAFETY: writes one int.
//!     let r = unsafe { sys::cuDeviceGet(&mut dev, 0) };
//!     check_on(r, "cuDeviceGet", || "ordinal 0".into())?;
//!     Ok(dev)
//! }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::{self, CUdevice, CUdevice_attribute, CUresult, cudaError_enum as E};
use mps_core::{Error, Status};

/// Set once [`init`] succeeded: the driver library is loaded and may describe its errors.
static LOADED: AtomicBool = AtomicBool::new(false);

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
    /// [`init`] loaded the driver, else cudarc's variant, which carries the same name.
    pub fn name(&self) -> String {
        self.driver_text(|e| e.error_name())
            .unwrap_or_else(|| format!("{:?}", self.code))
    }

    /// The driver's description of the result (`cuGetErrorString`), once [`init`] loaded it.
    pub fn description(&self) -> Option<String> {
        self.driver_text(|e| e.error_string())
    }

    fn driver_text(
        &self,
        ask: impl FnOnce(
            &cudarc::driver::result::DriverError,
        ) -> Result<&std::ffi::CStr, cudarc::driver::result::DriverError>,
    ) -> Option<String> {
        if !LOADED.load(Ordering::Acquire) {
            return None;
        }
        let e = cudarc::driver::result::DriverError(self.code);
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

/// For a call that releases something (in a `Drop`, or while tearing down), whose failure
/// leaves nothing to do but say so: a dead context fails every release.
pub fn released(code: CUresult, call: &'static str) {
    if let Err(e) = check(code, call) {
        tracing::debug!("{e}");
    }
}

/// Whether the driver library (libcuda.so) can be loaded.
pub fn is_present() -> bool {
    // SAFETY: is_culib_present only tries to open the library; it never panics.
    unsafe { sys::is_culib_present() }
}

/// Loads the driver library and initialises it. Every other driver call comes after it:
/// cudarc panics when a call is made and the library is missing. Without the library this
/// fails with `CUDA_ERROR_STUB_LIBRARY`, the driver's own word for "no real driver here".
pub fn init() -> Result<(), DriverError> {
    if !is_present() {
        return Err(
            DriverError::new(E::CUDA_ERROR_STUB_LIBRARY, "loading libcuda.so")
                .on("no NVIDIA driver is installed"),
        );
    }
    // SAFETY: the library is present, so cudarc can resolve the symbol.
    check(unsafe { sys::cuInit(0) }, "cuInit")?;
    LOADED.store(true, Ordering::Release);
    Ok(())
}

/// How many CUDA devices the driver sees (after `CUDA_VISIBLE_DEVICES`); loads and initialises
/// the driver first.
pub fn device_count() -> Result<u32, DriverError> {
    init()?;
    let mut n = 0;
    // SAFETY: writes one int.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
    Ok(n.max(0) as u32)
}

/// One attribute of device `dev`.
pub fn attribute(dev: CUdevice, attr: CUdevice_attribute) -> Result<i32, DriverError> {
    let mut value = 0;
    // SAFETY: writes one int; the driver checks `dev` and `attr`.
    let r = unsafe { sys::cuDeviceGetAttribute(&mut value, attr, dev) };
    check_on(r, "cuDeviceGetAttribute", || {
        format!("{attr:?} of device {dev}")
    })?;
    Ok(value)
}

/// Every attribute of device `dev` from 1 to `CU_DEVICE_ATTRIBUTE_MAX` that the driver answers,
/// as (attribute, value), in order; an attribute the driver refuses (one it does not know, or a
/// number CUDA left unused) is left out.
pub fn all_attributes(dev: CUdevice) -> Result<Vec<(i32, i32)>, DriverError> {
    // The numbers are asked as plain ints: some in the range are no variant of cudarc's enum,
    // so the function is taken from the driver with its C signature rather than through the
    // enum-typed binding.
    type GetAttribute = unsafe extern "C" fn(*mut i32, i32, CUdevice) -> CUresult;
    let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut found = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: the name is NUL-terminated; the call writes one pointer and one status.
    let r = unsafe {
        sys::cuGetProcAddress_v2(
            c"cuDeviceGetAttribute".as_ptr(),
            &mut pfn,
            12000,
            0,
            &mut found,
        )
    };
    check_on(r, "cuGetProcAddress", || "cuDeviceGetAttribute".into())?;
    if pfn.is_null() {
        return Err(
            DriverError::new(E::CUDA_ERROR_NOT_FOUND, "cuGetProcAddress")
                .on(format!("cuDeviceGetAttribute: {found:?}")),
        );
    }
    // SAFETY: the driver documents cuDeviceGetAttribute as
    // `CUresult (int *pi, CUdevice_attribute attrib, CUdevice dev)`, the enum an int in C.
    let get: GetAttribute = unsafe { std::mem::transmute(pfn) };
    let mut all = Vec::new();
    for attr in 1..CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX as i32 {
        let mut value = 0;
        // SAFETY: writes one int; the driver checks `attr` and `dev`.
        if unsafe { get(&mut value, attr, dev) } == E::CUDA_SUCCESS {
            all.push((attr, value));
        }
    }
    Ok(all)
}

/// The UUID of device `dev` (`cuDeviceGetUuid_v2`).
pub fn uuid(dev: CUdevice) -> Result<[u8; 16], DriverError> {
    let mut u = sys::CUuuid { bytes: [0; 16] };
    // SAFETY: writes one CUuuid.
    let r = unsafe { sys::cuDeviceGetUuid_v2(&mut u, dev) };
    check_on(r, "cuDeviceGetUuid_v2", || format!("device {dev}"))?;
    Ok(u.bytes.map(|b| b as u8))
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
