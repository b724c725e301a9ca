//! `cuInit` and the device: answered in the library from what the server reported when this
//! process connected (name, memory, SMs, compute capability), never by asking it again.
//!
//! Device attributes come from four sources (docs/TRANSPARENT.md lists them): the server's
//! report; CUDA's limits that hold for every compute capability CUDA 13 supports; CUDA's
//! per-compute-capability table, for the capabilities listed in `PER_CC`; and what mps itself
//! offers (no managed memory, say). Any other attribute is a fact of the GPU that the server does
//! not report (clock rates, PCI location, ...): it is answered 0, "not known", because cudart
//! reads every attribute at start (to fill `cudaDeviceProp`) and stops if one fails; with
//! `MPS_CUDA_LOG` set the library says once which ones it answered so.

use std::ffi::c_char;

use cudarc::driver::sys::CUdevice_attribute as A;

use crate::abi::{CUdevice, CUresult, CUuuid, DRIVER_VERSION};
use crate::connection::{Device, Res};
use crate::driver::{self, check, driver, entry, put};
use crate::log;

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: u32) -> CUresult {
    entry("cuInit", || {
        check(flags == 0)?;
        driver::init()
    })
}

/// # Safety
/// `version` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut i32) -> CUresult {
    // SAFETY: the caller guarantees a non-null `version` is writable.
    entry("cuDriverGetVersion", || unsafe {
        put(version, DRIVER_VERSION)
    })
}

pub(crate) fn device(dev: CUdevice) -> Res<&'static Device> {
    let d = driver()?;
    if dev != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(d.conn.device())
}

/// # Safety
/// `dev` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: i32) -> CUresult {
    entry("cuDeviceGet", || {
        device(ordinal)?;
        // SAFETY: the caller guarantees a non-null `dev` is writable.
        unsafe { put(dev, 0) }
    })
}

/// One device: the server's.
///
/// # Safety
/// `count` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut i32) -> CUresult {
    entry("cuDeviceGetCount", || {
        driver()?;
        // SAFETY: the caller guarantees a non-null `count` is writable.
        unsafe { put(count, 1) }
    })
}

/// # Safety
/// `name` must be NULL or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: i32, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetName", || {
        let d = device(dev)?;
        check(!name.is_null() && len > 0)?;
        let n = d.name.len().min(len as usize - 1);
        // SAFETY: the caller guarantees `name` is writable for `len` > n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(d.name.as_ptr(), name.cast(), n);
            name.add(n).write(0);
        }
        Ok(())
    })
}

/// The device's UUID as mps knows it: the server does not report the GPU's own, so this is a
/// name-based UUID (version 8) of the server's device description, stable for one device.
pub(crate) fn uuid(d: &Device) -> [u8; 16] {
    // FNV-1a, twice with different offsets, over the description.
    let text = format!(
        "{}|{}|{}|{}.{}",
        d.name, d.total_mem, d.sm_count, d.cc.0, d.cc.1
    );
    let fnv = |seed: u64| {
        text.bytes()
            .fold(seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    };
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_be_bytes());
    u[8..].copy_from_slice(&fnv(0x6c62_272e_07bb_0142).to_be_bytes());
    u[6] = (u[6] & 0x0f) | 0x80; // version 8
    u[8] = (u[8] & 0x3f) | 0x80; // RFC 9562 variant
    u
}

fn get_uuid(out: *mut CUuuid, dev: CUdevice) -> Res<()> {
    let u = uuid(device(dev)?);
    let mut v = CUuuid { bytes: [0; 16] };
    for (b, x) in v.bytes.iter_mut().zip(u) {
        *b = x as c_char;
    }
    // SAFETY: the caller guarantees a non-null `out` is writable.
    unsafe { put(out, v) }
}

/// # Safety
/// `uuid` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid", || get_uuid(uuid, dev))
}

/// # Safety
/// `uuid` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetUuid_v2", || get_uuid(uuid, dev))
}

/// The device's memory as the server reported it (a client's memory limit shows in
/// `cuMemGetInfo`, as under NVIDIA's MPS).
///
/// # Safety
/// `bytes` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    entry("cuDeviceTotalMem_v2", || {
        let d = device(dev)?;
        // SAFETY: the caller guarantees a non-null `bytes` is writable.
        unsafe { put(bytes, d.total_mem as usize) }
    })
}

/// CUDA's limits for every compute capability from 7.5 on (the CUDA C++ Programming Guide's
/// technical specifications).
const EVERY_CC: &[(A, i32)] = &[
    (A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024),
    (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024),
    (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024),
    (A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64),
    (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, i32::MAX),
    (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535),
    (A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535),
    (
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
        48 * 1024,
    ),
    (A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 64 * 1024),
    (A::CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32),
    (A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 64 * 1024),
    (
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
        64 * 1024,
    ),
];

/// The same table's figures that differ by compute capability: (major, minor), then threads
/// per SM, shared memory per SM, shared memory per block on opt-in, blocks per SM.
const PER_CC: &[((u32, u32), [i32; 4])] = &[
    ((7, 5), [1024, 64 * 1024, 64 * 1024, 16]),
    ((8, 0), [2048, 164 * 1024, 163 * 1024, 32]),
    ((8, 6), [1536, 100 * 1024, 99 * 1024, 16]),
    ((8, 9), [1536, 100 * 1024, 99 * 1024, 24]),
    ((9, 0), [2048, 228 * 1024, 227 * 1024, 32]),
];

const PER_CC_ATTRIBUTES: [A; 4] = [
    A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
    A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
    A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
    A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
];

/// What a client of mps has, whatever the GPU: one context shared by many processes (compute
/// mode default, MPS enabled), concurrent kernels, and none of what the library does not offer
/// (managed memory, registering host memory, memory pools, virtual memory management,
/// cooperative launches).
const MPS: &[(A, i32)] = &[
    (A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0),
    (A::CU_DEVICE_ATTRIBUTE_MPS_ENABLED, 1),
    (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1),
    (A::CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0),
    (A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 0),
    (A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 0),
    (A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, 0),
    (A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, 0),
    (
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
        0,
    ),
    (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 0),
    (
        A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        0,
    ),
    (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 0),
    // Device and host addresses never overlap (64-bit CUDA has unified addressing throughout);
    // cudart picks its copy paths by it.
    (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
];

/// The value of attribute `attrib`, or why there is none.
pub(crate) fn attribute(d: &Device, attrib: i32) -> Res<i32> {
    let is = |a: A| a as i32 == attrib;
    if is(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
        return Ok(d.sm_count as i32);
    }
    if is(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) {
        return Ok(d.cc.0 as i32);
    }
    if is(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) {
        return Ok(d.cc.1 as i32);
    }
    if let Some((_, v)) = EVERY_CC.iter().chain(MPS).find(|(a, _)| is(*a)) {
        return Ok(*v);
    }
    if let Some(i) = PER_CC_ATTRIBUTES.iter().position(|a| is(*a))
        && let Some((_, values)) = PER_CC.iter().find(|(cc, _)| *cc == d.cc)
    {
        return Ok(values[i]);
    }
    if attrib <= 0 || attrib >= A::CU_DEVICE_ATTRIBUTE_MAX as i32 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    log::detail_once(&format!("attribute {attrib}"), || {
        format!(
            "cuDeviceGetAttribute: attribute {attrib} of {} is not reported by the mps server; \
             answering 0 (not known)",
            d.name
        )
    });
    Ok(0)
}

/// # Safety
/// `value` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    value: *mut i32,
    attrib: i32,
    dev: CUdevice,
) -> CUresult {
    entry("cuDeviceGetAttribute", || {
        let v = attribute(device(dev)?, attrib)?;
        // SAFETY: the caller guarantees a non-null `value` is writable.
        unsafe { put(value, v) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> Device {
        Device {
            name: "NVIDIA H200".into(),
            total_mem: 150_000_000_000,
            sm_count: 132,
            cc: (9, 0),
        }
    }

    #[test]
    fn attributes_come_from_the_report_the_tables_or_nowhere() {
        let d = h200();
        let get = |a: A| attribute(&d, a as i32);
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), Ok(132));
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), Ok(9));
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE), Ok(32));
        assert_eq!(
            get(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            Ok(232_448)
        );
        assert_eq!(get(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE), Ok(0));
        assert_eq!(attribute(&d, 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(
            attribute(&d, 100_000),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        // A compute capability without a row: its per-capability figures are not guessed.
        let other = Device {
            cc: (12, 0),
            ..h200()
        };
        assert_eq!(
            attribute(
                &other,
                A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR as i32
            ),
            Ok(0)
        );
    }

    #[test]
    fn the_uuid_is_stable_marked_version_8_and_differs_between_devices() {
        let a = uuid(&h200());
        assert_eq!(a, uuid(&h200()));
        assert_eq!(a[6] >> 4, 8);
        assert_eq!(a[8] >> 6, 2);
        assert_ne!(
            a,
            uuid(&Device {
                sm_count: 66,
                ..h200()
            })
        );
    }
}
