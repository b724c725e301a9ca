//! Host memory this client shares with the server: the host buffers it mapped, by address, and
//! the locks on the staging area and on a host buffer's hand-over.

use std::collections::BTreeMap;
use std::sync::{Mutex, RwLock};

use mps_ipc::segment::Segment;

/// A host buffer this client mapped.
#[derive(Debug)]
pub(crate) struct HostMapping {
    pub(crate) handle: u64,
    pub(crate) segment: Segment,
    /// Its device address: where kernels and copies reach it (0 if the server gave none).
    pub(crate) device: u64,
}

/// The client's shared host memory.
#[derive(Debug, Default)]
pub(crate) struct HostMemory {
    /// Host buffers from `host_alloc`, by address.
    pub(crate) buffers: RwLock<BTreeMap<usize, HostMapping>>,
    /// Held while the staging area is in use (pageable copies, module images).
    pub(crate) staging: Mutex<()>,
    /// Held from a host-buffer request until its descriptor has been read from the socket.
    pub(crate) handover: Mutex<()>,
}
