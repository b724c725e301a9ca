//! Modules, kernels and events: driver objects owned by a client's tables, released when the
//! last reference goes.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use cudarc::driver::sys::{self, CUevent, CUfunction, CUmodule};

use mps_driver::released;

/// A loaded module, unloaded when its last kernel is gone.
pub(super) struct ModuleInner {
    pub(super) raw: CUmodule,
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by us and is unloaded once, when the last function that
        // names it is gone.
        released(unsafe { sys::cuModuleUnload(self.raw) }, "cuModuleUnload");
    }
}

impl std::fmt::Debug for ModuleInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CUmodule({:p})", self.raw)
    }
}

/// A loaded module.
#[derive(Debug)]
pub struct CudaModule(pub(super) Arc<ModuleInner>);

/// A kernel; keeps its module loaded.
#[derive(Debug)]
pub struct CudaFunction {
    pub(super) raw: CUfunction,
    pub(super) name: String,
    /// Bytes of static shared memory its blocks use.
    pub(super) static_shared: u32,
    pub(super) _module: Arc<ModuleInner>,
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
    pub(super) raw: CUevent,
    /// Whether it was ever recorded (elapsed time needs two records).
    pub(super) recorded: AtomicBool,
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once; pending records keep working (CUDA
        // releases the event when they complete).
        released(
            unsafe { sys::cuEventDestroy_v2(self.raw) },
            "cuEventDestroy",
        );
    }
}

// SAFETY: CUDA driver handles may be used from any thread once the context is current there
// (every entry point binds it first).
unsafe impl Send for ModuleInner {}
// SAFETY: as above; the driver serialises what it must.
unsafe impl Sync for ModuleInner {}
// SAFETY: as above.
unsafe impl Send for CudaFunction {}
// SAFETY: as above.
unsafe impl Sync for CudaFunction {}
// SAFETY: as above.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}
