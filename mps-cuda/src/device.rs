//! `cuInit` and the devices: answered in the library from what each device's server reported,
//! never by asking it again: name, memory, SMs and compute capability at connect; every device
//! attribute and the UUID on the first question (the server reads them from its driver, or
//! the simulator from its documented table). The devices are those the daemon serves, as
//! `CUDA_VISIBLE_DEVICES` shows them; a device is connected on the first question about it.
//! No device can access another's memory (each is a context in a server of its own).
//!
//! An attribute comes from the server's report, except those mps decides whatever the GPU
//! (`MPS`: no managed memory, say), which docs/TRANSPARENT.md lists. One the server did not
//! report is refused with CUDA_ERROR_INVALID_VALUE, as the driver refuses one it does not know.

use std::ffi::c_char;

use cudarc::driver::sys::CUdevice_attribute as A;
use mps_core::Status;

use crate::abi::device_attribute::{PCI_BUS_ID, PCI_DEVICE_ID, PCI_DOMAIN_ID};
use crate::abi::{CUdevice, CUresult, CUuuid, DRIVER_VERSION};
use crate::connection::{Connection, Device, Res, fail};
use crate::driver::{self, connection, driver};
use crate::ffi::{check, exports, put};
use crate::log;

/// Device `dev` as its server described it (connecting to it on first use).
pub(crate) fn device(dev: CUdevice) -> Res<&'static Device> {
    Ok(connection(dev)?.device())
}

/// The device's UUID: the server's report of it (the GPU's own, or the simulator's), else a
/// name-based UUID made here.
pub(crate) fn uuid_of(conn: &Connection) -> [u8; 16] {
    conn.reported_uuid()
        .unwrap_or_else(|| name_based_uuid(conn.device()))
}

/// A name-based UUID (version 8) of the server's device description, stable for one device,
/// for a server that reports no UUID.
pub(crate) fn name_based_uuid(d: &Device) -> [u8; 16] {
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
    let u = uuid_of(connection(dev)?);
    let mut v = CUuuid { bytes: [0; 16] };
    for (b, x) in v.bytes.iter_mut().zip(u) {
        *b = x as c_char;
    }
    // SAFETY: the caller guarantees a non-null `out` is writable.
    unsafe { put(out, v) }
}

/// What a client of mps has, whatever the GPU: one context shared by many processes (compute
/// mode default, MPS enabled), concurrent kernels, and none of what the library does not offer
/// (managed memory, registering host memory, shareable memory pools, cooperative launches, shareable
/// handles of physical memory, compressed or GPUDirect RDMA physical memory). Virtual memory
/// management is the server's to say ([`attribute_of`]).
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
    // Stream-ordered allocation is the library's (`mempool`), without shareable pools.
    (A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1),
    (A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, 0),
    (
        A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        0,
    ),
    (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0),
    (
        A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED,
        0,
    ),
    (A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, 0),
    (A::CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0),
    (
        A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        0,
    ),
    (A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 0),
    // Device and host addresses never overlap (64-bit CUDA has unified addressing throughout);
    // cudart picks its copy paths by it.
    (A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1),
];

/// The value of attribute `attrib` of device `d`: mps's own answer where the library decides it
/// (`MPS`), else what the server reported (`reported`). One the server did not report is
/// refused with CUDA_ERROR_INVALID_VALUE, as the driver refuses one it does not know, and said
/// once on stderr.
pub(crate) fn attribute(d: &Device, attrib: i32, reported: mps_core::Result<i32>) -> Res<i32> {
    if let Some((_, v)) = MPS.iter().find(|(a, _)| *a as i32 == attrib) {
        return Ok(*v);
    }
    if attrib == A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32 {
        return Ok(d.client_sms as i32);
    }
    match reported {
        Ok(v) => Ok(v),
        Err(e) if e.status == Status::InvalidValue => {
            log::once(&format!("attribute {attrib}"), || {
                format!(
                    "cuDeviceGetAttribute: attribute {attrib} of {} is not reported by the mps \
                     server; returning CUDA_ERROR_INVALID_VALUE",
                    d.name
                )
            });
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        }
        Err(e) => Err(fail(e)),
    }
}

/// Attribute `attrib` of the connection's device (see [`attribute`]); virtual memory
/// management is supported where the device's server has a granularity for it.
pub(crate) fn attribute_of(conn: &Connection, attrib: i32) -> Res<i32> {
    if attrib == A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED as i32 {
        return match conn.vm_granularity() {
            Ok(_) => Ok(1),
            Err(CUresult::CUDA_ERROR_NOT_SUPPORTED) => Ok(0),
            Err(e) => Err(e),
        };
    }
    attribute(conn.device(), attrib, conn.reported_attribute(attrib))
}

/// The device's PCI domain, bus and device, as `cuDeviceGetAttribute` reports them.
pub(crate) fn pci_location(conn: &Connection) -> [Res<i32>; 3] {
    [PCI_DOMAIN_ID, PCI_BUS_ID, PCI_DEVICE_ID].map(|a| attribute_of(conn, a))
}

/// The device's PCI address in CUDA's form, `domain:bus:device.function` in hexadecimal.
fn pci_bus_id(conn: &Connection) -> Res<String> {
    let [domain, bus, device] = pci_location(conn);
    Ok(format!("{:04X}:{:02X}:{:02X}.0", domain?, bus?, device?))
}

/// `(domain, bus, device)` of a PCI address in one of CUDA's forms (a missing domain is 0, the
/// function is not compared: a GPU is function 0).
fn parse_pci_bus_id(text: &str) -> Option<(u32, u32, u32)> {
    let hex = |s: &str| u32::from_str_radix(s.trim(), 16).ok();
    let (head, _function) = match text.rsplit_once('.') {
        Some((h, f)) => (h, Some(hex(f)?)),
        None => (text, None),
    };
    let parts: Vec<&str> = head.split(':').collect();
    match parts[..] {
        [domain, bus, device] => Some((hex(domain)?, hex(bus)?, hex(device)?)),
        [bus, device] if _function.is_some() => Some((0, hex(bus)?, hex(device)?)),
        _ => None,
    }
}

// ----- the exports -----

exports! {
    pub fn cuInit(flags: u32) ["cuInit" 2000] = {
        check(flags == 0)?;
        driver::init()
    };

    /// # Safety
    /// `version` must be NULL or writable.
    pub unsafe fn cuDriverGetVersion(version: *mut i32) ["cuDriverGetVersion" 2020] =
        // SAFETY: the caller guarantees a non-null `version` is writable.
        unsafe { put(version, DRIVER_VERSION) };

    /// # Safety
    /// `dev` must be NULL or writable.
    pub unsafe fn cuDeviceGet(dev: *mut CUdevice, ordinal: i32) ["cuDeviceGet" 2000] = {
        driver()?.device(ordinal)?;
        // SAFETY: the caller guarantees a non-null `dev` is writable.
        unsafe { put(dev, ordinal) }
    };

    /// The devices the daemon serves, as `CUDA_VISIBLE_DEVICES` shows them (counted at `cuInit`).
    ///
    /// # Safety
    /// `count` must be NULL or writable.
    pub unsafe fn cuDeviceGetCount(count: *mut i32) ["cuDeviceGetCount" 2000] = {
        let n = driver()?.devices.len() as i32;
        // SAFETY: the caller guarantees a non-null `count` is writable.
        unsafe { put(count, n) }
    };

    /// # Safety
    /// `name` must be NULL or writable for `len` bytes.
    pub unsafe fn cuDeviceGetName(
        name: *mut c_char,
        len: i32,
        dev: CUdevice,
    ) ["cuDeviceGetName" 2000] = {
        let d = device(dev)?;
        check(!name.is_null() && len > 0)?;
        let n = d.name.len().min(len as usize - 1);
        // SAFETY: the caller guarantees `name` is writable for `len` > n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(d.name.as_ptr(), name.cast(), n);
            name.add(n).write(0);
        }
        Ok(())
    };

    /// The device's PCI address as the server's driver reports it, in CUDA's form
    /// `domain:bus:device.function` (`0000:19:00.0`; 13 bytes with the NUL), cut to `len`.
    ///
    /// # Safety
    /// `id` must be NULL or writable for `len` bytes.
    pub unsafe fn cuDeviceGetPCIBusId(
        id: *mut c_char,
        len: i32,
        dev: CUdevice,
    ) ["cuDeviceGetPCIBusId" 4010] = {
        check(!id.is_null() && len > 0)?;
        let text = pci_bus_id(connection(dev)?)?;
        let n = text.len().min(len as usize - 1);
        // SAFETY: the caller guarantees `id` is writable for `len` > n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), id.cast(), n);
            id.add(n).write(0);
        }
        Ok(())
    };

    /// The device whose PCI address is `id`, in any of CUDA's forms (`domain:bus:device.function`,
    /// `domain:bus:device`, `bus:device.function`; hexadecimal).
    ///
    /// # Safety
    /// `dev` must be NULL or writable; `id` NULL or a NUL-terminated string.
    pub unsafe fn cuDeviceGetByPCIBusId(
        dev: *mut CUdevice,
        id: *const c_char,
    ) ["cuDeviceGetByPCIBusId" 4010] = {
        check(!dev.is_null() && !id.is_null())?;
        // SAFETY: checked non-null; the caller guarantees a NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(id) }.to_string_lossy();
        let want = parse_pci_bus_id(&text).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let count = driver()?.devices.len() as CUdevice;
        for d in 0..count {
            if let [Ok(domain), Ok(bus), Ok(device)] = pci_location(connection(d)?) {
                if (domain as u32, bus as u32, device as u32) == want {
                    // SAFETY: checked non-null; the caller guarantees it is writable.
                    return unsafe { put(dev, d) };
                }
            }
        }
        Err(CUresult::CUDA_ERROR_INVALID_DEVICE)
    };

    /// # Safety
    /// `uuid` must be NULL or writable.
    pub unsafe fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) ["cuDeviceGetUuid" 9020]
        alias cuDeviceGetUuid_v2 ["cuDeviceGetUuid" 11040] = get_uuid(uuid, dev);

    /// The device's memory as the server reported it (a client's memory limit shows in
    /// `cuMemGetInfo`, as under NVIDIA's MPS).
    ///
    /// # Safety
    /// `bytes` must be NULL or writable.
    pub unsafe fn cuDeviceTotalMem_v2(
        bytes: *mut usize,
        dev: CUdevice,
    ) ["cuDeviceTotalMem" 3020] = {
        let d = device(dev)?;
        // SAFETY: the caller guarantees a non-null `bytes` is writable.
        unsafe { put(bytes, d.total_mem as usize) }
    };

    /// # Safety
    /// `value` must be NULL or writable.
    pub unsafe fn cuDeviceGetAttribute(
        value: *mut i32,
        attrib: i32,
        dev: CUdevice,
    ) ["cuDeviceGetAttribute" 2000] = {
        let v = attribute_of(connection(dev)?, attrib)?;
        // SAFETY: the caller guarantees a non-null `value` is writable.
        unsafe { put(value, v) }
    };

    /// Whether `dev` can access `peer`'s memory: never, through mps (each device is a context in a
    /// server of its own, and no server maps another's memory); CUDA says 0 for a device and
    /// itself too.
    ///
    /// # Safety
    /// `can` must be NULL or writable.
    pub unsafe fn cuDeviceCanAccessPeer(
        can: *mut i32,
        dev: CUdevice,
        peer: CUdevice,
    ) ["cuDeviceCanAccessPeer" 4000] = {
        let d = driver()?;
        d.device(dev)?;
        d.device(peer)?;
        // SAFETY: the caller guarantees a non-null `can` is writable.
        unsafe { put(can, 0) }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pci_bus_id_is_read_in_each_of_cudas_forms() {
        assert_eq!(parse_pci_bus_id("0000:19:00.0"), Some((0, 0x19, 0)));
        assert_eq!(parse_pci_bus_id("0001:3B:1f"), Some((1, 0x3b, 0x1f)));
        assert_eq!(parse_pci_bus_id("3b:00.0"), Some((0, 0x3b, 0)));
        assert_eq!(parse_pci_bus_id("3b:00"), None);
        assert_eq!(parse_pci_bus_id("not a bus id"), None);
    }

    fn h200() -> Device {
        Device {
            name: "NVIDIA H200".into(),
            total_mem: 150_000_000_000,
            sm_count: 132,
            client_sms: 132,
            cc: (9, 0),
        }
    }

    fn not_reported() -> mps_core::Result<i32> {
        Err(mps_core::Error::invalid_value("not reported"))
    }

    #[test]
    fn attributes_are_the_servers_but_for_what_mps_decides() {
        let d = h200();
        let clock = A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE as i32;
        assert_eq!(attribute(&d, clock, Ok(1_980_000)), Ok(1_980_000));
        // The GPU has managed memory; a client of mps does not.
        let managed = A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY as i32;
        assert_eq!(attribute(&d, managed, Ok(1)), Ok(0));
        assert_eq!(attribute(&d, managed, not_reported()), Ok(0));
    }

    #[test]
    fn the_multiprocessor_count_is_the_clients_share_as_nvidia_mps_reports_it() {
        let d = Device {
            client_sms: 72,
            ..h200()
        };
        let sms = A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32;
        assert_eq!(attribute(&d, sms, Ok(132)), Ok(72));
        assert_eq!(attribute(&h200(), sms, Ok(132)), Ok(132));
    }

    #[test]
    fn an_attribute_the_server_did_not_report_is_refused_as_the_driver_refuses_it() {
        let d = h200();
        assert_eq!(
            attribute(&d, 100_000, not_reported()),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        // A lost server is not an unknown attribute.
        let lost = mps_core::Error::new(Status::Connection, "gone");
        assert_ne!(
            attribute(&d, A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE as i32, Err(lost)),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn the_name_based_uuid_is_stable_marked_version_8_and_differs_between_devices() {
        let a = name_based_uuid(&h200());
        assert_eq!(a, name_based_uuid(&h200()));
        assert_eq!(a[6] >> 4, 8);
        assert_eq!(a[8] >> 6, 2);
        assert_ne!(
            a,
            name_based_uuid(&Device {
                sm_count: 66,
                ..h200()
            })
        );
    }
}
