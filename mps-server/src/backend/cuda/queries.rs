//! What the driver answers about the context and a kernel: limits, function attributes,
//! occupancy. Clients ask once and keep the answers that do not change.

use cudarc::driver::result;
use cudarc::driver::sys::{
    self, CUfunction, CUfunction_attribute as F, CUlaunchAttribute, CUlaunchAttributeID,
    CUlaunchAttributeValue, CUlaunchConfig, CUlimit,
};
use mps_core::protocol::{CONTEXT_LIMITS, FUNC_ATTRIBUTES, OccupancyQuery};

use mps_driver::{Call, DriverError, check_on};

const LIMITS: [CUlimit; CONTEXT_LIMITS] = [
    CUlimit::CU_LIMIT_STACK_SIZE,
    CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE,
    CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE,
    CUlimit::CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
    CUlimit::CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
    CUlimit::CU_LIMIT_MAX_L2_FETCH_GRANULARITY,
    CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE,
    CUlimit::CU_LIMIT_SHMEM_SIZE,
    CUlimit::CU_LIMIT_CIG_ENABLED,
    CUlimit::CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED,
];

const ATTRIBUTES: [F; FUNC_ATTRIBUTES] = [
    F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
    F::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
    F::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
    F::CU_FUNC_ATTRIBUTE_NUM_REGS,
    F::CU_FUNC_ATTRIBUTE_PTX_VERSION,
    F::CU_FUNC_ATTRIBUTE_BINARY_VERSION,
    F::CU_FUNC_ATTRIBUTE_CACHE_MODE_CA,
    F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
    F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
    F::CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET,
    F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
    F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT,
    F::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH,
    F::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
    F::CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
];

/// The current context's limits; one the driver refuses (a device without it) is `None`.
pub(super) fn context_limits() -> [Option<u64>; CONTEXT_LIMITS] {
    // The context is current (the caller bound it).
    LIMITS.map(|limit| result::ctx::get_limit(limit).ok().map(|v| v as u64))
}

/// Kernel `f`'s attributes; one the driver refuses is `None`.
pub(super) fn function_attributes(f: CUfunction) -> [Option<i32>; FUNC_ATTRIBUTES] {
    // SAFETY: f is a loaded kernel.
    ATTRIBUTES.map(|attr| unsafe { result::function::get_function_attribute(f, attr) }.ok())
}

/// The occupancy figure `query` asks of kernel `f`.
pub(super) fn occupancy(f: CUfunction, query: OccupancyQuery) -> Result<u64, DriverError> {
    match query {
        OccupancyQuery::ActiveBlocks {
            block_size,
            dynamic_smem,
            flags,
        } => {
            // SAFETY: f is a loaded kernel.
            let n = unsafe {
                result::occupancy::max_active_block_per_multiprocessor_with_flags(
                    f,
                    block_size as i32,
                    dynamic_smem as usize,
                    flags,
                )
            }
            .call_on(
                "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
                || format!("blocks of {block_size} threads, {dynamic_smem} bytes of shared memory"),
            )?;
            Ok(n.max(0) as u64)
        }
        OccupancyQuery::DynamicSmem { blocks, block_size } => {
            // SAFETY: f is a loaded kernel.
            let n = unsafe {
                result::occupancy::available_dynamic_shared_mem_per_block(
                    f,
                    blocks as i32,
                    block_size as i32,
                )
            }
            .call_on("cuOccupancyAvailableDynamicSMemPerBlock", || {
                format!("{blocks} blocks of {block_size} threads")
            })?;
            Ok(n as u64)
        }
        OccupancyQuery::ActiveClusters {
            block,
            cluster,
            dynamic_smem,
            non_portable,
        } => {
            // The program allowed its kernel non-portable sizes; the server's copy is allowed
            // them too (a launch of that size would ask for it as well).
            if non_portable {
                super::device::allow_non_portable_clusters(f)?;
            }
            let explicit = cluster.x != 0 || cluster.y != 0 || cluster.z != 0;
            // SAFETY: a union of plain integers, all zero is valid.
            let mut value: CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
            value.clusterDim.x = cluster.x;
            value.clusterDim.y = cluster.y;
            value.clusterDim.z = cluster.z;
            let mut attr = CUlaunchAttribute {
                id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                pad: [0; 4],
                value,
            };
            // The grid only has to be a whole number of clusters: one cluster.
            let config = CUlaunchConfig {
                gridDimX: cluster.x.max(1),
                gridDimY: cluster.y.max(1),
                gridDimZ: cluster.z.max(1),
                blockDimX: block.x,
                blockDimY: block.y,
                blockDimZ: block.z,
                sharedMemBytes: dynamic_smem,
                hStream: std::ptr::null_mut(),
                attrs: &mut attr,
                numAttrs: explicit as u32,
            };
            let mut n = 0;
            // SAFETY: f is a loaded kernel; config and its one attribute live across the
            // call; writes one int.
            let r = unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f, &config) };
            check_on(r, "cuOccupancyMaxActiveClusters", || {
                format!(
                    "clusters of {} x {} x {} blocks of {} x {} x {} threads",
                    cluster.x, cluster.y, cluster.z, block.x, block.y, block.z
                )
            })?;
            Ok(n.max(0) as u64)
        }
    }
}
