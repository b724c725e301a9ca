//! Modules, kernels and events: driver objects owned by a client's tables, released when the
//! last reference goes (the release itself is `mps_driver`'s).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use cudarc::driver::sys::CUfunction;
use mps_driver::{Event, Module};

/// A loaded module, unloaded when its last kernel is gone.
#[derive(Debug)]
pub struct CudaModule(pub(super) Arc<Module>);

/// A kernel; keeps its module loaded.
#[derive(Debug)]
pub struct CudaFunction {
    pub(super) raw: CUfunction,
    pub(super) name: String,
    /// Bytes of static shared memory its blocks use.
    pub(super) static_shared: u32,
    pub(super) _module: Arc<Module>,
    /// Whether it may use the device's opt-in shared memory per block (set at its first launch
    /// that asks for more than the default).
    pub(super) opted_in: AtomicBool,
    /// Whether it may be launched in clusters of more than 8 blocks (set at the first launch
    /// that asks for that).
    pub(super) non_portable_clusters: AtomicBool,
}

/// An event, created with timing enabled.
#[derive(Debug)]
pub struct CudaEvent {
    pub(super) raw: Event,
    /// Whether it was ever recorded (elapsed time needs two records).
    pub(super) recorded: AtomicBool,
}

// SAFETY: a kernel handle may be used from any thread once the context is current there (every
// entry point binds it first), and it lives as long as its module, which it keeps.
unsafe impl Send for CudaFunction {}
// SAFETY: as above; the driver serialises what it must.
unsafe impl Sync for CudaFunction {}
