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

/// The graph API's parameter structures, with every enumeration a plain integer (a program may
/// pass a node type or memory type cudarc's enums lack), laid out as `cuda.h` 13.0 lays them
/// out (checked against cudarc's declarations below).
pub(crate) mod graph {
    use std::ffi::c_void;

    /// `CUDA_KERNEL_NODE_PARAMS_v2` (also `_v3`, the generic form's); `CUDA_KERNEL_NODE_PARAMS_v1`
    /// is its first ten fields ([`KERNEL_V1_BYTES`]).
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct KernelNodeParams {
        pub(crate) func: usize,
        pub(crate) grid: [u32; 3],
        pub(crate) block: [u32; 3],
        pub(crate) shared_mem_bytes: u32,
        pub(crate) kernel_params: *mut *mut c_void,
        pub(crate) extra: *mut *mut c_void,
        pub(crate) kern: usize,
        pub(crate) ctx: usize,
    }

    /// The size of `CUDA_KERNEL_NODE_PARAMS_v1`: [`KernelNodeParams`] without `kern` and `ctx`.
    pub(crate) const KERNEL_V1_BYTES: usize = std::mem::offset_of!(KernelNodeParams, kern);

    /// `CUDA_MEMSET_NODE_PARAMS_v2`; `_v1` is it without `ctx`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct MemsetNodeParams {
        pub(crate) dst: u64,
        pub(crate) pitch: usize,
        pub(crate) value: u32,
        pub(crate) element_size: u32,
        pub(crate) width: usize,
        pub(crate) height: usize,
        pub(crate) ctx: usize,
    }

    /// The size of `CUDA_MEMSET_NODE_PARAMS_v1`.
    pub(crate) const MEMSET_V1_BYTES: usize = std::mem::offset_of!(MemsetNodeParams, ctx);

    /// `CUDA_MEMCPY3D`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct Memcpy3D {
        pub(crate) src_x_in_bytes: usize,
        pub(crate) src_y: usize,
        pub(crate) src_z: usize,
        pub(crate) src_lod: usize,
        pub(crate) src_memory_type: u32,
        pub(crate) src_host: *const c_void,
        pub(crate) src_device: u64,
        pub(crate) src_array: usize,
        pub(crate) reserved0: usize,
        pub(crate) src_pitch: usize,
        pub(crate) src_height: usize,
        pub(crate) dst_x_in_bytes: usize,
        pub(crate) dst_y: usize,
        pub(crate) dst_z: usize,
        pub(crate) dst_lod: usize,
        pub(crate) dst_memory_type: u32,
        pub(crate) dst_host: *mut c_void,
        pub(crate) dst_device: u64,
        pub(crate) dst_array: usize,
        pub(crate) reserved1: usize,
        pub(crate) dst_pitch: usize,
        pub(crate) dst_height: usize,
        pub(crate) width_in_bytes: usize,
        pub(crate) height: usize,
        pub(crate) depth: usize,
    }

    /// `CUDA_MEMCPY_NODE_PARAMS`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct MemcpyNodeParams {
        pub(crate) flags: i32,
        pub(crate) reserved: i32,
        pub(crate) copy_ctx: usize,
        pub(crate) copy: Memcpy3D,
    }

    /// `CUDA_CHILD_GRAPH_NODE_PARAMS`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct ChildGraphNodeParams {
        pub(crate) graph: usize,
        pub(crate) ownership: u32,
    }

    /// `CUgraphNodeParams`: the type, and the union of every type's parameters from byte 16.
    #[repr(C)]
    #[derive(Clone, Copy)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct NodeParams {
        pub(crate) type_: u32,
        pub(crate) reserved0: [i32; 3],
        pub(crate) params: NodeParamsUnion,
        pub(crate) reserved2: i64,
    }

    /// The union of `CUgraphNodeParams`, as this library reads it.
    #[repr(C)]
    #[derive(Clone, Copy)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub union NodeParamsUnion {
        pub(crate) reserved1: [i64; 29],
        pub(crate) kernel: KernelNodeParams,
        pub(crate) memcpy: MemcpyNodeParams,
        pub(crate) memset: MemsetNodeParams,
        pub(crate) graph: ChildGraphNodeParams,
    }

    impl std::fmt::Debug for NodeParams {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("NodeParams")
                .field("type_", &self.type_)
                .finish_non_exhaustive()
        }
    }

    /// `CUgraphEdgeData`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct EdgeData {
        pub(crate) from_port: u8,
        pub(crate) to_port: u8,
        pub(crate) type_: u8,
        pub(crate) reserved: [u8; 5],
    }

    /// `CUgraphExecUpdateResultInfo`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug)]
    #[allow(unreachable_pub)] // named by exported functions' parameters
    pub struct ExecUpdateResultInfo {
        pub(crate) result: u32,
        pub(crate) error_node: usize,
        pub(crate) error_from_node: usize,
    }

    const _: () = {
        use cudarc::driver::sys as s;
        use std::mem::offset_of;
        assert!(size_of::<KernelNodeParams>() == size_of::<s::CUDA_KERNEL_NODE_PARAMS_v2>());
        assert!(KERNEL_V1_BYTES == size_of::<s::CUDA_KERNEL_NODE_PARAMS_v1>());
        assert!(
            offset_of!(KernelNodeParams, kernel_params)
                == offset_of!(s::CUDA_KERNEL_NODE_PARAMS_v2, kernelParams)
        );
        assert!(
            offset_of!(KernelNodeParams, ctx) == offset_of!(s::CUDA_KERNEL_NODE_PARAMS_v2, ctx)
        );
        assert!(size_of::<KernelNodeParams>() == size_of::<s::CUDA_KERNEL_NODE_PARAMS_v3>());
        assert!(size_of::<MemsetNodeParams>() == size_of::<s::CUDA_MEMSET_NODE_PARAMS_v2>());
        assert!(MEMSET_V1_BYTES == size_of::<s::CUDA_MEMSET_NODE_PARAMS_v1>());
        assert!(
            offset_of!(MemsetNodeParams, element_size)
                == offset_of!(s::CUDA_MEMSET_NODE_PARAMS_v2, elementSize)
        );
        assert!(size_of::<Memcpy3D>() == size_of::<s::CUDA_MEMCPY3D>());
        assert!(offset_of!(Memcpy3D, src_host) == offset_of!(s::CUDA_MEMCPY3D, srcHost));
        assert!(
            offset_of!(Memcpy3D, dst_memory_type) == offset_of!(s::CUDA_MEMCPY3D, dstMemoryType)
        );
        assert!(offset_of!(Memcpy3D, depth) == offset_of!(s::CUDA_MEMCPY3D, Depth));
        assert!(size_of::<MemcpyNodeParams>() == size_of::<s::CUDA_MEMCPY_NODE_PARAMS>());
        assert!(
            offset_of!(MemcpyNodeParams, copy)
                == offset_of!(s::CUDA_MEMCPY_NODE_PARAMS, copyParams)
        );
        assert!(size_of::<ChildGraphNodeParams>() == size_of::<s::CUDA_CHILD_GRAPH_NODE_PARAMS>());
        assert!(size_of::<NodeParams>() == size_of::<s::CUgraphNodeParams>());
        assert!(
            offset_of!(NodeParams, params) == offset_of!(s::CUgraphNodeParams, __bindgen_anon_1)
        );
        assert!(offset_of!(NodeParams, reserved2) == offset_of!(s::CUgraphNodeParams, reserved2));
        assert!(size_of::<EdgeData>() == size_of::<s::CUgraphEdgeData>());
        assert!(size_of::<ExecUpdateResultInfo>() == size_of::<s::CUgraphExecUpdateResultInfo>());
    };

    /// `CUgraphNodeType`.
    pub(crate) const NODE_KERNEL: u32 = 0;
    pub(crate) const NODE_MEMCPY: u32 = 1;
    pub(crate) const NODE_MEMSET: u32 = 2;
    pub(crate) const NODE_HOST: u32 = 3;
    pub(crate) const NODE_GRAPH: u32 = 4;
    pub(crate) const NODE_EMPTY: u32 = 5;
    pub(crate) const NODE_WAIT_EVENT: u32 = 6;
    pub(crate) const NODE_EVENT_RECORD: u32 = 7;
    pub(crate) const NODE_EXT_SEMAS_SIGNAL: u32 = 8;
    pub(crate) const NODE_EXT_SEMAS_WAIT: u32 = 9;
    pub(crate) const NODE_MEM_ALLOC: u32 = 10;
    pub(crate) const NODE_MEM_FREE: u32 = 11;
    pub(crate) const NODE_BATCH_MEM_OP: u32 = 12;
    pub(crate) const NODE_CONDITIONAL: u32 = 13;

    /// `CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE` and `_MOVE`.
    pub(crate) const OWNERSHIP_CLONE: u32 = 0;
    pub(crate) const OWNERSHIP_MOVE: u32 = 1;

    /// `CUmemorytype`: `CU_MEMORYTYPE_HOST`, `_DEVICE`, `_ARRAY`, `_UNIFIED`.
    pub(crate) const MEMORY_HOST: u32 = 1;
    pub(crate) const MEMORY_DEVICE: u32 = 2;
    pub(crate) const MEMORY_UNIFIED: u32 = 4;

    /// `CUgraphExecUpdateResult`: `CU_GRAPH_EXEC_UPDATE_SUCCESS`, `_ERROR_TOPOLOGY_CHANGED`,
    /// `_ERROR_NODE_TYPE_CHANGED`, `_ERROR_NOT_SUPPORTED`.
    pub(crate) const UPDATE_SUCCESS: u32 = 0;
    pub(crate) const UPDATE_TOPOLOGY_CHANGED: u32 = 2;
    pub(crate) const UPDATE_NODE_TYPE_CHANGED: u32 = 3;
    pub(crate) const UPDATE_NOT_SUPPORTED: u32 = 6;
}
