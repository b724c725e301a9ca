//! The one status enum that the server, the Rust client and the C ABI share, and the error that
//! carries it with a message.

use std::fmt;

crate::wire_enum! {
    /// Result of every mps operation. The numeric values are part of the C ABI (where this is
    /// `mps_status`) and of the wire protocol: they never change, new ones are only appended.
    pub enum Status: u32, from_u32 {
        /// The operation completed.
        Success = 0 => "MPS_SUCCESS",
        /// An argument is out of range, null where it must not be, or inconsistent with another.
        InvalidValue = 1 => "MPS_ERROR_INVALID_VALUE",
        /// A handle (pointer, stream, event, module, function, host buffer) is unknown to this
        /// client.
        InvalidHandle = 2 => "MPS_ERROR_INVALID_HANDLE",
        /// The device (or the simulator's memory) cannot satisfy an allocation.
        OutOfMemory = 3 => "MPS_ERROR_OUT_OF_MEMORY",
        /// Work is still pending (a query, not a failure).
        NotReady = 4 => "MPS_ERROR_NOT_READY",
        /// A named object (a kernel in a module) does not exist.
        NotFound = 5 => "MPS_ERROR_NOT_FOUND",
        /// A kernel or copy touched memory outside the client's allocations.
        IllegalAddress = 6 => "MPS_ERROR_ILLEGAL_ADDRESS",
        /// A kernel could not be launched or failed while running.
        LaunchFailed = 7 => "MPS_ERROR_LAUNCH_FAILED",
        /// The server is unreachable, or the connection to it was lost.
        Connection = 8 => "MPS_ERROR_CONNECTION",
        /// Client and server speak different protocol versions.
        ProtocolMismatch = 9 => "MPS_ERROR_PROTOCOL_MISMATCH",
        /// The caller is not allowed to do this.
        PermissionDenied = 10 => "MPS_ERROR_PERMISSION_DENIED",
        /// A per-client limit (memory, streams, events, ...) would be exceeded.
        QuotaExceeded = 11 => "MPS_ERROR_QUOTA_EXCEEDED",
        /// The operation is not supported by this server or backend.
        Unsupported = 12 => "MPS_ERROR_UNSUPPORTED",
        /// A bug or an unexpected failure inside mps; the message says where.
        Internal = 13 => "MPS_ERROR_INTERNAL",
        /// A module image is neither PTX, cubin nor fatbin, or does not parse.
        InvalidImage = 14 => "MPS_ERROR_INVALID_IMAGE",
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed operation: its status and a message that says what happened, to which object, and
/// what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// The status (never `Success`).
    pub status: Status,
    /// What happened, in one line.
    pub message: String,
    /// The CUDA driver's result behind the error (a `CUresult`, never `CUDA_SUCCESS`) where the
    /// server's driver returned one; `None` for mps's own refusals. Programs that branch on the
    /// driver's exact result (cuBLAS skips an image with no code for the device on
    /// `CUDA_ERROR_NO_BINARY_FOR_GPU`) need it where the status folds several into one.
    pub cuda_result: Option<u32>,
}

/// Shorthand used across mps.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with this status and message.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        debug_assert_ne!(status, Status::Success);
        Error {
            status,
            message: message.into(),
            cuda_result: None,
        }
    }

    /// The same error, carrying the CUDA driver's result `code` (zero, `CUDA_SUCCESS`, is none).
    pub fn with_cuda_result(mut self, code: u32) -> Error {
        self.cuda_result = (code != 0).then_some(code);
        self
    }

    /// `MPS_ERROR_INVALID_VALUE` with a message.
    pub fn invalid_value(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidValue, message)
    }

    /// `MPS_ERROR_INVALID_HANDLE` with a message.
    pub fn invalid_handle(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidHandle, message)
    }

    /// `MPS_ERROR_INTERNAL` with a message.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(Status::Internal, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_values_are_stable_and_round_trip() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert_eq!(Status::from_u32(i as u32), Some(*s));
            assert_eq!(s.c_name().to_str().unwrap(), s.name());
        }
        assert_eq!(Status::from_u32(Status::ALL.len() as u32), None);
        assert_eq!(Status::from_u32(u32::MAX), None);
    }

    #[test]
    fn display_names_status_and_message() {
        let e = Error::invalid_handle("stream 7 belongs to another client");
        assert_eq!(
            e.to_string(),
            "MPS_ERROR_INVALID_HANDLE: stream 7 belongs to another client"
        );
    }
}
