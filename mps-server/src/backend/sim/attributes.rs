//! The simulator's device attributes and UUID: what `cuDeviceGetAttribute` and
//! `cuDeviceGetUuid` answer for a client of a simulated device.
//!
//! The simulator stands in for an sm_90 device (an H200, see `DeviceLimits::SM_90`). Its
//! attributes are, in order:
//! - its own figures: the SM count it was given, compute capability 9.0;
//! - CUDA's limits for compute capability 9.0 (the CUDA C++ Programming Guide's technical
//!   specifications): block and grid dimensions, shared memory, registers, threads per SM;
//! - what it does: kernels run concurrently, streams have priorities, one host thread per SM
//!   executes them, there is no ECC, no PCI location (bus, device and domain 0) and no
//!   managed, pageable or registered-memory access;
//! - nominal clocks and sizes of its own (it runs on the CPU, so these describe no hardware):
//!   a 1 GHz clock, a 1 GHz memory clock on a 4096-bit bus, a 50 MiB L2 cache;
//! - 0 for every other attribute CUDA defines (up to `CU_DEVICE_ATTRIBUTE_MAX`): the simulator
//!   has none of those features (textures, surfaces, NUMA, RDMA, IPC, ...). The CUDA runtime
//!   reads nearly all of them at start and stops if one is refused, so each is answered.
//!
//! A number past `CU_DEVICE_ATTRIBUTE_MAX` is not reported, and a client refuses it
//! (`CUDA_ERROR_INVALID_VALUE`), as the driver does.

use cudarc::driver::sys::CUdevice_attribute as A;
use mps_core::protocol::DeviceAttribute;

/// The figures that do not depend on the simulator's configuration.
const FIXED: &[(A, i32)] = &[
    (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
    (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024),
    (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024),
    (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64),
    (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, i32::MAX),
    (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535),
    (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535),
    (A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 48 << 10),
    (A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 64 << 10),
    (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
    (A::CU_DEVICE_ATTRIBUTE_MAX_PITCH, i32::MAX),
    (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 64 << 10),
    (A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1_000_000),
    (A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512),
    (A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1),
    (A::CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0),
    (A::CU_DEVICE_ATTRIBUTE_INTEGRATED, 0),
    (A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1),
    (A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0),
    (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
    (A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 0),
    (A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 0),
    (A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0),
    (A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0),
    (A::CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0),
    (A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 1_000_000),
    (A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 4096),
    (A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 50 << 20),
    (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048),
    (A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 1),
    (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
    (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9),
    (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0),
    (A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1),
    (A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1),
    (A::CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1),
    (
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        228 << 10,
    ),
    (
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
        64 << 10,
    ),
    (A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0),
    (A::CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0),
    (A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0),
    (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0),
    (A::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1),
    (
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
        0,
    ),
    (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 0),
    (
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        227 << 10,
    ),
    (A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0),
    (
        A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        0,
    ),
    (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32),
    (
        A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
        1 << 10,
    ),
    (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
];

/// The attributes of a simulated device of `sm_count` SMs, sorted by attribute.
pub(super) fn attributes(sm_count: u32) -> Vec<DeviceAttribute> {
    let sms = i32::try_from(sm_count).unwrap_or(i32::MAX);
    let mut all: Vec<DeviceAttribute> = (1..A::CU_DEVICE_ATTRIBUTE_MAX as i32)
        .map(|attribute| DeviceAttribute {
            attribute,
            value: 0,
        })
        .collect();
    for &(a, v) in FIXED
        .iter()
        .chain(&[(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, sms)])
    {
        // Attribute n sits at index n - 1.
        all[a as usize - 1].value = v;
    }
    all
}

/// The UUID of simulated device `device`: a name-based UUID (RFC 9562 version 8) made of the
/// bytes "mps-sim" and the ordinal, so that each simulated device of a host has its own.
pub(super) fn uuid(device: u32) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..7].copy_from_slice(b"mps-sim");
    u[12..].copy_from_slice(&device.to_be_bytes());
    u[6] = (u[6] & 0x0f) | 0x80; // version 8
    u[8] = (u[8] & 0x3f) | 0x80; // RFC 9562 variant
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attribute_is_answered_once_in_order_with_the_sm_count() {
        let t = attributes(16);
        assert!(t.windows(2).all(|w| w[0].attribute + 1 == w[1].attribute));
        assert_eq!(t.len(), A::CU_DEVICE_ATTRIBUTE_MAX as usize - 1);
        let get = |a: A| t.iter().find(|x| x.attribute == a as i32).map(|x| x.value);
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), Some(16));
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE), Some(1_000_000));
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID), Some(0));
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED), Some(0));
    }

    #[test]
    fn each_device_has_its_own_uuid() {
        assert_ne!(uuid(0), uuid(1));
        assert_eq!(uuid(1), uuid(1));
    }
}
