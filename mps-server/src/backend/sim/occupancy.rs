//! What the simulator answers for a context's limits, a kernel's attributes and occupancy.
//!
//! The simulator stands in for an sm_90 device (see `attributes`), and its kernels are CPU code
//! bound by name, so the figures are a model, stated here once:
//! - **Stream priorities** range from 0 (least urgent) to -5 (most), as on an H200; the
//!   simulator accepts them and runs every stream alike.
//! - **Context limits** are CUDA's defaults: a 1 KiB stack per thread, a 1 MiB printf FIFO, an
//!   8 MiB device heap, a device-runtime sync depth of 2 and 2048 pending launches, and no
//!   persisting L2 cache (0). It has no L2 fetch granularity, shared-memory size or CIG
//!   (CUDA-in-graphics) limits to report.
//! - **A kernel** uses 32 registers per thread and no static shared, constant or local memory;
//!   it takes up to 1024 threads per block, is PTX and binary version 9.0 (`sm_90`), may use
//!   48 KiB of dynamic shared memory until the program raises it, has no preferred carveout
//!   (-1) and no cluster requirements.
//! - **An SM** holds 2048 threads, 32 blocks, 65536 registers and 228 KiB of shared memory,
//!   of which 1 KiB per block is reserved, as on compute capability 9.0; a block may use at
//!   most 227 KiB. A cluster is at most 8 blocks, and the device holds as many clusters as
//!   its SMs hold blocks, divided by the cluster's size.

use cudarc::driver::sys::CUfunction_attribute as F;
use mps_core::limits::DeviceLimits;
use mps_core::protocol::{
    CONTEXT_LIMITS, Dim3, FUNC_ATTRIBUTES, MAX_CLUSTER_BLOCKS, MAX_NON_PORTABLE_CLUSTER_BLOCKS,
    OccupancyQuery,
};
use mps_core::{Error, Result};

/// Least and greatest stream priority.
pub(super) const PRIORITIES: (i32, i32) = (0, -5);

const THREADS_PER_SM: u32 = 2048;
const BLOCKS_PER_SM: u32 = 32;
const REGISTERS_PER_SM: u32 = 65536;
const REGISTERS_PER_THREAD: u32 = 32;
const SHARED_PER_SM: u32 = 228 << 10;
const SHARED_RESERVED_PER_BLOCK: u32 = 1 << 10;

/// The context's limits, by `CUlimit`.
pub(super) fn context_limits() -> [Option<u64>; CONTEXT_LIMITS] {
    [
        Some(1024),
        Some(1 << 20),
        Some(8 << 20),
        Some(2),
        Some(2048),
        None,
        Some(0),
        None,
        None,
        None,
    ]
}

/// A kernel's attributes, by `CUfunction_attribute`.
pub(super) fn function_attributes(limits: &DeviceLimits) -> [Option<i32>; FUNC_ATTRIBUTES] {
    let mut a = [Some(0); FUNC_ATTRIBUTES];
    let mut set = |attr: F, v: i32| a[attr as usize] = Some(v);
    set(
        F::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        limits.max_threads_per_block as i32,
    );
    set(F::CU_FUNC_ATTRIBUTE_NUM_REGS, REGISTERS_PER_THREAD as i32);
    set(F::CU_FUNC_ATTRIBUTE_PTX_VERSION, 90);
    set(F::CU_FUNC_ATTRIBUTE_BINARY_VERSION, 90);
    set(
        F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        limits.max_shared_mem_per_block as i32,
    );
    set(F::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, -1);
    a
}

/// Blocks of `block_size` threads, each with `smem` bytes of shared memory, that fit on one SM.
fn blocks_per_sm(block_size: u32, smem: u32, limits: &DeviceLimits) -> Result<u32> {
    if block_size == 0 || block_size > limits.max_threads_per_block {
        return Err(Error::invalid_value(format!(
            "a block of {block_size} threads (the simulator takes 1 to {})",
            limits.max_threads_per_block
        )));
    }
    if smem > limits.max_shared_mem_per_block_optin {
        return Ok(0);
    }
    let threads = block_size.div_ceil(limits.warp_size) * limits.warp_size;
    let by_threads = THREADS_PER_SM / threads;
    let by_registers = REGISTERS_PER_SM / (threads * REGISTERS_PER_THREAD);
    let by_shared = SHARED_PER_SM / (smem + SHARED_RESERVED_PER_BLOCK);
    Ok(BLOCKS_PER_SM
        .min(by_threads)
        .min(by_registers)
        .min(by_shared))
}

/// The figure `query` asks for, on a device of `sms` SMs.
pub(super) fn occupancy(query: OccupancyQuery, sms: u32, limits: &DeviceLimits) -> Result<u64> {
    match query {
        OccupancyQuery::ActiveBlocks {
            block_size,
            dynamic_smem,
            ..
        } => Ok(blocks_per_sm(block_size, dynamic_smem, limits)? as u64),
        OccupancyQuery::DynamicSmem { blocks, block_size } => {
            if blocks == 0 || blocks_per_sm(block_size, 0, limits)? < blocks {
                return Ok(0);
            }
            let per_block = (SHARED_PER_SM / blocks).saturating_sub(SHARED_RESERVED_PER_BLOCK);
            Ok(per_block.min(limits.max_shared_mem_per_block_optin) as u64)
        }
        OccupancyQuery::ActiveClusters {
            block,
            cluster,
            dynamic_smem,
            non_portable,
        } => {
            let size = match cluster {
                Dim3 { x: 0, y: 0, z: 0 } => 1,
                c => c.volume().unwrap_or(u64::MAX),
            };
            let most = if non_portable {
                MAX_NON_PORTABLE_CLUSTER_BLOCKS
            } else {
                MAX_CLUSTER_BLOCKS
            } as u64;
            if size == 0 || size > most {
                return Err(Error::invalid_value(format!(
                    "a cluster of {} x {} x {} blocks (the simulator takes 1 to {most})",
                    cluster.x, cluster.y, cluster.z
                )));
            }
            let threads = block
                .volume()
                .filter(|t| *t <= u32::MAX as u64)
                .ok_or_else(|| Error::invalid_value("a block of more than 2^32 threads"))?;
            let per_sm = blocks_per_sm(threads as u32, dynamic_smem, limits)?;
            Ok(sms as u64 * per_sm as u64 / size)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: DeviceLimits = DeviceLimits::SM_90;

    fn active(block_size: u32, dynamic_smem: u32) -> u64 {
        let q = OccupancyQuery::ActiveBlocks {
            block_size,
            dynamic_smem,
            flags: 0,
        };
        occupancy(q, 132, &L).unwrap()
    }

    #[test]
    fn blocks_are_bounded_by_threads_blocks_and_shared_memory() {
        assert_eq!(active(32, 0), 32, "at most 32 blocks");
        assert_eq!(active(256, 0), 8, "2048 threads");
        assert_eq!(active(1000, 0), 2, "a block is whole warps");
        assert_eq!(active(1024, 0), 2);
        assert_eq!(active(128, 100 << 10), 2, "228 KiB less 1 KiB per block");
        assert_eq!(active(128, 227 << 10), 1);
        assert_eq!(
            active(128, (227 << 10) + 1),
            0,
            "more than a block may have"
        );
        let bad = OccupancyQuery::ActiveBlocks {
            block_size: 1025,
            dynamic_smem: 0,
            flags: 0,
        };
        assert!(occupancy(bad, 132, &L).is_err());
    }

    #[test]
    fn dynamic_shared_memory_leaves_room_for_the_blocks_asked() {
        let q = |blocks, block_size| {
            occupancy(OccupancyQuery::DynamicSmem { blocks, block_size }, 132, &L).unwrap()
        };
        assert_eq!(q(1, 128), 227 << 10, "a block's own ceiling");
        assert_eq!(q(2, 128), (114 << 10) - 1024);
        assert_eq!(q(9, 256), 0, "9 blocks of 256 threads never fit");
        assert_eq!(q(0, 256), 0);
        // What it answers fits, as the active-blocks figure says.
        let smem = q(3, 256) as u32;
        assert!(active(256, smem) >= 3 && active(256, smem + 1024) < 3);
    }

    #[test]
    fn clusters_divide_the_device_blocks() {
        let q = |c: Dim3| {
            occupancy(
                OccupancyQuery::ActiveClusters {
                    block: Dim3 { x: 256, y: 1, z: 1 },
                    cluster: c,
                    dynamic_smem: 0,
                    non_portable: false,
                },
                132,
                &L,
            )
        };
        assert_eq!(q(Dim3 { x: 2, y: 1, z: 1 }).unwrap(), 132 * 8 / 2);
        assert_eq!(q(Dim3 { x: 0, y: 0, z: 0 }).unwrap(), 132 * 8);
        assert!(q(Dim3 { x: 3, y: 3, z: 1 }).is_err());
    }
}
