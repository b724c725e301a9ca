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

/// `CU_EVENT_BLOCKING_SYNC`, `CU_EVENT_DISABLE_TIMING` and `CU_EVENT_INTERPROCESS`.
pub(crate) const EVENT_BLOCKING_SYNC: u32 = 0x1;
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

/// `CUlaunchAttributeID`: the ids of `cuLaunchKernelEx`'s attributes, as the integers they are
/// in C (a program may pass an id cudarc's enum lacks, so the id is never read as the enum).
pub(crate) mod launch_attribute {
    use cudarc::driver::sys::CUlaunchAttributeID as L;

    pub(crate) const IGNORE: u32 = L::CU_LAUNCH_ATTRIBUTE_IGNORE as u32;
    pub(crate) const ACCESS_POLICY_WINDOW: u32 = L::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW as u32;
    pub(crate) const COOPERATIVE: u32 = L::CU_LAUNCH_ATTRIBUTE_COOPERATIVE as u32;
    pub(crate) const SYNCHRONIZATION_POLICY: u32 =
        L::CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY as u32;
    pub(crate) const CLUSTER_DIMENSION: u32 = L::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION as u32;
    pub(crate) const CLUSTER_SCHEDULING_POLICY_PREFERENCE: u32 =
        L::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE as u32;
    pub(crate) const PROGRAMMATIC_STREAM_SERIALIZATION: u32 =
        L::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION as u32;
    pub(crate) const PRIORITY: u32 = L::CU_LAUNCH_ATTRIBUTE_PRIORITY as u32;
    pub(crate) const MEM_SYNC_DOMAIN_MAP: u32 = L::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP as u32;
    pub(crate) const MEM_SYNC_DOMAIN: u32 = L::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN as u32;
    pub(crate) const PREFERRED_SHARED_MEMORY_CARVEOUT: u32 =
        L::CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT as u32;
}

/// `CUfunction_attribute`: the kernel attributes this library keeps or checks, as indices of
/// a function's attribute array (the server's order, which is CUDA's).
pub(crate) mod function_attribute {
    use cudarc::driver::sys::CUfunction_attribute as F;

    pub(crate) const SHARED_SIZE_BYTES: usize = F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES as usize;
    pub(crate) const MAX_DYNAMIC_SHARED_SIZE_BYTES: usize =
        F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as usize;
    pub(crate) const PREFERRED_SHARED_MEMORY_CARVEOUT: usize =
        F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT as usize;
    pub(crate) const NON_PORTABLE_CLUSTER_SIZE_ALLOWED: usize =
        F::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED as usize;
    pub(crate) const CLUSTER_SCHEDULING_POLICY_PREFERENCE: usize =
        F::CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE as usize;
}

/// `CUdevice_attribute`s this library asks for itself, as the integers `cuDeviceGetAttribute`
/// takes.
pub(crate) mod device_attribute {
    use cudarc::driver::sys::CUdevice_attribute as D;

    pub(crate) const PCI_DOMAIN_ID: i32 = D::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID as i32;
    pub(crate) const PCI_BUS_ID: i32 = D::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as i32;
    pub(crate) const PCI_DEVICE_ID: i32 = D::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID as i32;
    pub(crate) const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 =
        D::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as i32;
}

/// CUDA's virtual memory management types, with every enumeration a plain integer (a program
/// may pass a value cudarc's enums lack), laid out as `cuda.h` lays them out (checked against
/// cudarc's declarations below).
pub(crate) mod vmm {
    /// `CUmemGenericAllocationHandle`.
    pub(crate) type Handle = u64;

    /// `CUmemLocation`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct Location {
        pub(crate) type_: u32,
        pub(crate) id: i32,
    }

    /// `CUmemAllocationProp`'s `allocFlags`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct AllocFlags {
        pub(crate) compression_type: u8,
        pub(crate) gpu_direct_rdma_capable: u8,
        pub(crate) usage: u16,
        pub(crate) reserved: [u8; 4],
    }

    /// `CUmemAllocationProp`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct AllocationProp {
        pub(crate) type_: u32,
        pub(crate) requested_handle_types: u32,
        pub(crate) location: Location,
        pub(crate) win32_handle_meta_data: *mut std::ffi::c_void,
        pub(crate) alloc_flags: AllocFlags,
    }

    /// `CUmemAccessDesc`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct AccessDesc {
        pub(crate) location: Location,
        pub(crate) flags: u32,
    }

    const _: () = {
        use cudarc::driver::sys as s;
        assert!(size_of::<Location>() == size_of::<s::CUmemLocation>());
        assert!(size_of::<AllocationProp>() == size_of::<s::CUmemAllocationProp>());
        assert!(align_of::<AllocationProp>() == align_of::<s::CUmemAllocationProp>());
        assert!(size_of::<AccessDesc>() == size_of::<s::CUmemAccessDesc>());
    };

    /// `CU_MEM_ALLOCATION_TYPE_PINNED`.
    pub(crate) const ALLOCATION_PINNED: u32 = 1;
    /// `CU_MEM_LOCATION_TYPE_DEVICE`.
    pub(crate) const LOCATION_DEVICE: u32 = 1;
    /// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: the one shareable handle type an allocation
    /// may ask for (it is created, and its export refused: see `vmm`).
    pub(crate) const HANDLE_POSIX_FD: u32 = 0x1;
    /// `CU_MEM_ACCESS_FLAGS_PROT_NONE`, `_READ` and `_READWRITE`.
    pub(crate) const ACCESS_NONE: u32 = 0x0;
    pub(crate) const ACCESS_READ: u32 = 0x1;
    pub(crate) const ACCESS_READWRITE: u32 = 0x3;
    /// `CU_MEM_ALLOC_GRANULARITY_MINIMUM` and `_RECOMMENDED`.
    pub(crate) const GRANULARITY_MINIMUM: u32 = 0x0;
    pub(crate) const GRANULARITY_RECOMMENDED: u32 = 0x1;
}

/// `CUpointer_attribute` and `CUmemorytype`: what `cuPointerGetAttribute` is asked.
pub(crate) mod pointer_attribute {
    pub(crate) const CONTEXT: u32 = 1;
    pub(crate) const MEMORY_TYPE: u32 = 2;
    pub(crate) const DEVICE_POINTER: u32 = 3;
    pub(crate) const HOST_POINTER: u32 = 4;
    pub(crate) const P2P_TOKENS: u32 = 5;
    pub(crate) const SYNC_MEMOPS: u32 = 6;
    pub(crate) const BUFFER_ID: u32 = 7;
    pub(crate) const IS_MANAGED: u32 = 8;
    pub(crate) const DEVICE_ORDINAL: u32 = 9;
    pub(crate) const IS_LEGACY_CUDA_IPC_CAPABLE: u32 = 10;
    pub(crate) const RANGE_START_ADDR: u32 = 11;
    pub(crate) const RANGE_SIZE: u32 = 12;
    pub(crate) const MAPPED: u32 = 13;
    pub(crate) const ALLOWED_HANDLE_TYPES: u32 = 14;
    pub(crate) const IS_GPU_DIRECT_RDMA_CAPABLE: u32 = 15;
    pub(crate) const ACCESS_FLAGS: u32 = 16;
    pub(crate) const MEMPOOL_HANDLE: u32 = 17;
    pub(crate) const MAPPING_SIZE: u32 = 18;
    pub(crate) const MAPPING_BASE_ADDR: u32 = 19;
    pub(crate) const MEMORY_BLOCK_ID: u32 = 20;
    pub(crate) const IS_HW_DECOMPRESS_CAPABLE: u32 = 21;

    /// `CU_MEMORYTYPE_HOST` and `CU_MEMORYTYPE_DEVICE`.
    pub(crate) const MEMORYTYPE_HOST: u32 = 1;
    pub(crate) const MEMORYTYPE_DEVICE: u32 = 2;
}

/// `CUDA_MEMCPY2D` (the `_v2` ABI), with its memory types plain integers, laid out as `cuda.h`
/// lays it out (checked against cudarc's declaration below).
pub(crate) mod memcpy2d {
    use std::ffi::c_void;

    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct Memcpy2D {
        pub(crate) src_x_in_bytes: usize,
        pub(crate) src_y: usize,
        pub(crate) src_memory_type: u32,
        pub(crate) src_host: *const c_void,
        pub(crate) src_device: u64,
        pub(crate) src_array: *mut c_void,
        pub(crate) src_pitch: usize,
        pub(crate) dst_x_in_bytes: usize,
        pub(crate) dst_y: usize,
        pub(crate) dst_memory_type: u32,
        pub(crate) dst_host: *mut c_void,
        pub(crate) dst_device: u64,
        pub(crate) dst_array: *mut c_void,
        pub(crate) dst_pitch: usize,
        pub(crate) width_in_bytes: usize,
        pub(crate) height: usize,
    }

    const _: () = {
        use cudarc::driver::sys as s;
        assert!(size_of::<Memcpy2D>() == size_of::<s::CUDA_MEMCPY2D>());
        assert!(align_of::<Memcpy2D>() == align_of::<s::CUDA_MEMCPY2D>());
        assert!(std::mem::offset_of!(Memcpy2D, dst_x_in_bytes) == 56);
        assert!(std::mem::offset_of!(Memcpy2D, height) == 120);
    };

    /// `CUmemorytype`.
    pub(crate) const HOST: u32 = 1;
    pub(crate) const DEVICE: u32 = 2;
    pub(crate) const ARRAY: u32 = 3;
    pub(crate) const UNIFIED: u32 = 4;
}

/// The stream-ordered allocator's types (`CUmemPoolProps`) and `CUmemPool_attribute`, as
/// plain integers, laid out as `cuda.h` lays them out (checked against cudarc's declarations).
pub(crate) mod mempool {
    use super::vmm::Location;

    /// `CUmemPoolProps`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct PoolProps {
        pub(crate) alloc_type: u32,
        pub(crate) handle_types: u32,
        pub(crate) location: Location,
        pub(crate) win32_security_attributes: *mut std::ffi::c_void,
        pub(crate) max_size: usize,
        pub(crate) usage: u16,
        pub(crate) reserved: [u8; 54],
    }

    const _: () = {
        use cudarc::driver::sys as s;
        assert!(size_of::<PoolProps>() == size_of::<s::CUmemPoolProps>());
        assert!(align_of::<PoolProps>() == align_of::<s::CUmemPoolProps>());
        assert!(std::mem::offset_of!(PoolProps, max_size) == 24);
    };

    /// `CUmemPool_attribute`.
    pub(crate) const REUSE_FOLLOW_EVENT_DEPENDENCIES: u32 = 1;
    pub(crate) const REUSE_ALLOW_OPPORTUNISTIC: u32 = 2;
    pub(crate) const REUSE_ALLOW_INTERNAL_DEPENDENCIES: u32 = 3;
    pub(crate) const RELEASE_THRESHOLD: u32 = 4;
    pub(crate) const RESERVED_MEM_CURRENT: u32 = 5;
    pub(crate) const RESERVED_MEM_HIGH: u32 = 6;
    pub(crate) const USED_MEM_CURRENT: u32 = 7;
    pub(crate) const USED_MEM_HIGH: u32 = 8;
}
