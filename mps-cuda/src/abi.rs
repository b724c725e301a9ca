//! The driver ABI's types, from cudarc's declarations of `cuda.h` (types only: nothing in this
//! library calls cudarc's loader), and the few constants cudarc does not declare.
//!
//! Enumerations that arrive from C (device attributes, flags) are taken as plain integers, never
//! as Rust enums: a value a newer program passes that the enum lacks would be undefined
//! behaviour.

pub(crate) use cudarc::driver::sys::{
    CUcontext, CUctxCreateParams, CUdevice, CUdeviceptr, CUdriverProcAddressQueryResult, CUevent,
    CUfunction, CUkernel, CUlaunchConfig, CUlibrary, CUmodule, CUresult, CUstream, CUuuid,
};

/// `CU_STREAM_LEGACY`: the context's legacy default stream, whatever the caller's default.
pub(crate) const STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
pub(crate) const STREAM_PER_THREAD: usize = 0x2;
/// `CU_STREAM_NON_BLOCKING`: a stream that does not synchronise with the legacy default stream.
pub(crate) const STREAM_NON_BLOCKING: u32 = 0x1;

/// `CU_EVENT_DISABLE_TIMING` and `CU_EVENT_INTERPROCESS`.
pub(crate) const EVENT_DISABLE_TIMING: u32 = 0x2;
pub(crate) const EVENT_INTERPROCESS: u32 = 0x4;

/// `CU_LAUNCH_PARAM_END`, `CU_LAUNCH_PARAM_BUFFER_POINTER`, `CU_LAUNCH_PARAM_BUFFER_SIZE`: the
/// keys of `cuLaunchKernel`'s `extra` array (pointer-sized values).
pub(crate) const LAUNCH_PARAM_END: usize = 0x0;
pub(crate) const LAUNCH_PARAM_BUFFER_POINTER: usize = 0x1;
pub(crate) const LAUNCH_PARAM_BUFFER_SIZE: usize = 0x2;

/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`: hand out the per-thread-default-stream
/// variant of a function.
pub(crate) const PROC_PER_THREAD_DEFAULT_STREAM: u64 = 0x2;

/// `CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP | WRITECOMBINED`: every flag `cuMemHostAlloc` knows.
pub(crate) const MEMHOSTALLOC_FLAGS: u32 = 0x1 | 0x2 | 0x4;

/// `CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX`: context flags that only
/// tune how the host waits or how memory is mapped, which a client of the server's context may
/// give and keep as its context's flags.
pub(crate) const CTX_FLAGS: u32 = 0x07 | 0x08 | 0x10;

/// `CU_MODULE_EAGER_LOADING`.
pub(crate) const MODULE_EAGER_LOADING: i32 = 0x1;
/// `CU_MODULE_LAZY_LOADING`.
pub(crate) const MODULE_LAZY_LOADING: i32 = 0x2;

/// The CUDA version whose driver ABI this library implements (13.0).
pub(crate) const DRIVER_VERSION: i32 = 13000;
