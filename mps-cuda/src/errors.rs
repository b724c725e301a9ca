//! CUDA results: the one table from mps statuses to CUDA results, and the names and descriptions
//! that `cuGetErrorName` and `cuGetErrorString` return.

use std::ffi::c_char;

use mps_core::Status;

use crate::abi::CUresult;

/// The CUDA result of a failed call: the server's driver's own result where the error carries
/// one this library knows by name, else the result of its status.
pub(crate) fn from_error(status: Status, cuda_result: Option<u32>) -> CUresult {
    cuda_result
        .and_then(find)
        .map_or_else(|| from_status(status), |(r, ..)| *r)
}

/// The CUDA result for an mps status. An mps client's memory limit surfaces as CUDA's
/// out-of-memory (as under NVIDIA's MPS); a lost server as an unavailable device.
pub(crate) fn from_status(status: Status) -> CUresult {
    match status {
        Status::Success => CUresult::CUDA_SUCCESS,
        Status::InvalidValue => CUresult::CUDA_ERROR_INVALID_VALUE,
        Status::InvalidHandle => CUresult::CUDA_ERROR_INVALID_HANDLE,
        Status::OutOfMemory => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        Status::NotReady => CUresult::CUDA_ERROR_NOT_READY,
        Status::NotFound => CUresult::CUDA_ERROR_NOT_FOUND,
        Status::IllegalAddress => CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        Status::LaunchFailed => CUresult::CUDA_ERROR_LAUNCH_FAILED,
        Status::Connection => CUresult::CUDA_ERROR_DEVICE_UNAVAILABLE,
        Status::ProtocolMismatch => CUresult::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
        Status::PermissionDenied => CUresult::CUDA_ERROR_NOT_PERMITTED,
        Status::QuotaExceeded => CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        Status::Unsupported => CUresult::CUDA_ERROR_NOT_SUPPORTED,
        Status::Internal => CUresult::CUDA_ERROR_UNKNOWN,
        Status::InvalidImage => CUresult::CUDA_ERROR_INVALID_IMAGE,
    }
}

macro_rules! results {
    ($($name:ident => $text:literal,)*) => {
        /// (result, its name, its description), NUL-terminated for C.
        const RESULTS: &[(CUresult, &str, &str)] = &[
            $((CUresult::$name, concat!(stringify!($name), "\0"), concat!($text, "\0")),)*
        ];
    };
}

// The descriptions are CUDA's own wording for these results.
results! {
    CUDA_SUCCESS => "no error",
    CUDA_ERROR_INVALID_VALUE => "invalid argument",
    CUDA_ERROR_OUT_OF_MEMORY => "out of memory",
    CUDA_ERROR_NOT_INITIALIZED => "initialization error",
    CUDA_ERROR_DEINITIALIZED => "driver shutting down",
    CUDA_ERROR_PROFILER_DISABLED => "profiler disabled while using a system-wide profiling tool",
    CUDA_ERROR_STUB_LIBRARY => "CUDA driver is a stub library",
    CUDA_ERROR_DEVICE_UNAVAILABLE => "CUDA-capable device(s) is/are busy or unavailable",
    CUDA_ERROR_NO_DEVICE => "no CUDA-capable device is detected",
    CUDA_ERROR_INVALID_DEVICE => "invalid device ordinal",
    CUDA_ERROR_INVALID_IMAGE => "device kernel image is invalid",
    CUDA_ERROR_INVALID_CONTEXT => "invalid device context",
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT => "context already current",
    CUDA_ERROR_NO_BINARY_FOR_GPU => "no kernel image is available for execution on the device",
    CUDA_ERROR_UNSUPPORTED_LIMIT => "limit is not supported on this architecture",
    CUDA_ERROR_INVALID_PTX => "a PTX JIT compilation failed",
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION => "the provided PTX was compiled with an unsupported toolchain.",
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND => "PTX JIT compiler library not found",
    CUDA_ERROR_SHARED_OBJECT_INIT_FAILED => "shared object initialization failed",
    CUDA_ERROR_INVALID_SOURCE => "device kernel image is invalid",
    CUDA_ERROR_FILE_NOT_FOUND => "file not found",
    CUDA_ERROR_OPERATING_SYSTEM => "OS call failed or operation not supported on this OS",
    CUDA_ERROR_INVALID_HANDLE => "invalid resource handle",
    CUDA_ERROR_ILLEGAL_STATE => "the operation cannot be performed in the present state",
    CUDA_ERROR_NOT_FOUND => "named symbol not found",
    CUDA_ERROR_NOT_READY => "device not ready",
    CUDA_ERROR_ILLEGAL_ADDRESS => "an illegal memory access was encountered",
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES => "too many resources requested for launch",
    CUDA_ERROR_LAUNCH_TIMEOUT => "the launch timed out and was terminated",
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE => "cannot set while device is active in this process",
    CUDA_ERROR_CONTEXT_IS_DESTROYED => "context is destroyed",
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => "part or all of the requested memory range is already mapped",
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => "pointer does not correspond to a registered memory region",
    CUDA_ERROR_MISALIGNED_ADDRESS => "misaligned address",
    CUDA_ERROR_LAUNCH_FAILED => "unspecified launch failure",
    CUDA_ERROR_HARDWARE_STACK_ERROR => "hardware stack error",
    CUDA_ERROR_ILLEGAL_INSTRUCTION => "an illegal instruction was encountered",
    CUDA_ERROR_INVALID_PC => "invalid program counter",
    CUDA_ERROR_NOT_PERMITTED => "operation not permitted",
    CUDA_ERROR_NOT_SUPPORTED => "operation not supported",
    CUDA_ERROR_SYSTEM_NOT_READY => "system not yet initialized",
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => "system has unsupported display driver / cuda driver combination",
    CUDA_ERROR_MPS_CONNECTION_FAILED => "MPS client failed to connect to the MPS control daemon or the MPS server",
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => "operation not permitted when stream is capturing",
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => "operation failed due to a previous error during capture",
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => "operation would make the legacy stream depend on a capturing blocking stream",
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => "attempt to terminate a thread-local capture sequence from another thread",
    CUDA_ERROR_INVALID_CLUSTER_SIZE => "invalid cluster size",
    CUDA_ERROR_TIMEOUT => "wait operation timed out",
    CUDA_ERROR_UNKNOWN => "unknown error",
}

fn find(code: u32) -> Option<&'static (CUresult, &'static str, &'static str)> {
    RESULTS.iter().find(|(r, ..)| *r as u32 == code)
}

/// The name of result `code` as a C string (`CUDA_ERROR_INVALID_VALUE`), if it has one here.
pub(crate) fn name(code: u32) -> Option<*const c_char> {
    find(code).map(|(_, n, _)| n.as_ptr().cast())
}

/// CUDA's description of result `code` as a C string, if it has one here.
pub(crate) fn description(code: u32) -> Option<*const c_char> {
    find(code).map(|(_, _, d)| d.as_ptr().cast())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_maps_to_a_result_with_a_name() {
        for status in Status::ALL {
            let r = from_status(status);
            assert!(
                find(r as u32).is_some(),
                "{status:?} maps to {r:?}, which has no name"
            );
        }
    }

    #[test]
    fn the_drivers_own_result_wins_where_it_is_known() {
        let image = Status::InvalidImage;
        assert_eq!(from_error(image, None), CUresult::CUDA_ERROR_INVALID_IMAGE);
        assert_eq!(
            from_error(image, Some(209)),
            CUresult::CUDA_ERROR_NO_BINARY_FOR_GPU
        );
        // A result this library has no name for is not handed to the program.
        assert_eq!(
            from_error(image, Some(123_456)),
            CUresult::CUDA_ERROR_INVALID_IMAGE
        );
    }

    #[test]
    fn names_are_the_results_own() {
        for (r, n, d) in RESULTS {
            assert_eq!(n.trim_end_matches('\0'), format!("{r:?}"));
            assert!(d.ends_with('\0') && d.len() > 1);
        }
        assert!(find(123_456).is_none());
    }
}
