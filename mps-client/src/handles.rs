//! The values a client hands out and takes back: device pointers, streams, events, modules,
//! kernels, and what the server says about its device and the client's SMs.

use mps_core::handshake::{BackendKind, DeviceInfoWire};

/// A device pointer.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The pointer `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

/// A stream; [`Stream::DEFAULT`] is the client's own default stream, which does not synchronise
/// with its other streams.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(pub u64);

impl Stream {
    /// The client's default stream.
    pub const DEFAULT: Stream = Stream(0);
}

/// An event.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

/// A graph captured from a stream.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Graph(pub u64);

/// An executable graph, made from a captured one.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphExec(pub u64);

/// A loaded module.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Module(pub u64);

/// A kernel of a loaded module.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Function(pub u64);

/// The device behind the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Device memory in bytes.
    pub total_mem: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability (major, minor).
    pub cc: (u32, u32),
    /// The server's backend.
    pub backend: BackendKind,
}

impl DeviceInfo {
    pub(crate) fn from_wire(d: &DeviceInfoWire, backend: BackendKind) -> DeviceInfo {
        DeviceInfo {
            name: d.name(),
            total_mem: d.total_mem,
            sm_count: d.sm_count,
            cc: (d.cc_major, d.cc_minor),
            backend,
        }
    }
}

/// Where a client's kernels run: see [`Client::sm_info`](crate::Client::sm_info).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmInfo {
    /// SMs the client's kernels may use (its share or reservation, rounded up to the device's
    /// partition size).
    pub sms: u32,
    /// SMs of the device.
    pub device_sms: u32,
    /// The share in force, percent.
    pub share_percent: u32,
    /// SMs reserved for the client alone, percent (0: none).
    pub reserved_percent: u32,
}
