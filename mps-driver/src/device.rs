//! Loading the driver, and what it says of a device.

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice, CUdevice_attribute, CUresult, cudaError_enum as E};

use crate::error::{Call, DriverError, LOADED, check_on};

/// Whether the driver library (libcuda.so) can be loaded.
pub fn is_present() -> bool {
    // SAFETY: is_culib_present only tries to open the library; it never panics.
    unsafe { sys::is_culib_present() }
}

/// Loads the driver library and initialises it. Every other driver call comes after it:
/// cudarc panics when a call is made and the library is missing. Without the library this
/// fails with `CUDA_ERROR_STUB_LIBRARY`, the driver's own word for "no real driver here".
pub fn init() -> Result<(), DriverError> {
    if !is_present() {
        return Err(
            DriverError::new(E::CUDA_ERROR_STUB_LIBRARY, "loading libcuda.so")
                .on("no NVIDIA driver is installed"),
        );
    }
    // The library is present, so cudarc can resolve the symbol.
    result::init().call("cuInit")?;
    LOADED.store(true, std::sync::atomic::Ordering::Release);
    Ok(())
}

/// How many CUDA devices the driver sees (after `CUDA_VISIBLE_DEVICES`); loads and initialises
/// the driver first.
pub fn device_count() -> Result<u32, DriverError> {
    init()?;
    let n = result::device::get_count().call("cuDeviceGetCount")?;
    Ok(n.max(0) as u32)
}

/// One attribute of device `dev`.
pub fn attribute(dev: CUdevice, attr: CUdevice_attribute) -> Result<i32, DriverError> {
    // SAFETY: the driver checks `dev` and `attr` (an invalid device is an error, not UB).
    unsafe { result::device::get_attribute(dev, attr) }.call_on("cuDeviceGetAttribute", || {
        format!("{attr:?} of device {dev}")
    })
}

/// The CUDA version (12.0, as `CUDA_VERSION` spells it) whose `cuDeviceGetAttribute` signature
/// [`all_attributes`] asks `cuGetProcAddress` for.
const CUDA_12_0: i32 = 12000;

/// Every attribute of device `dev` from 1 to `CU_DEVICE_ATTRIBUTE_MAX` that the driver answers,
/// as (attribute, value), in order; an attribute the driver refuses (one it does not know, or a
/// number CUDA left unused) is left out.
pub fn all_attributes(dev: CUdevice) -> Result<Vec<(i32, i32)>, DriverError> {
    // The numbers are asked as plain ints: some in the range are no variant of cudarc's enum,
    // so the function is taken from the driver with its C signature rather than through the
    // enum-typed binding.
    type GetAttribute = unsafe extern "C" fn(*mut i32, i32, CUdevice) -> CUresult;
    let mut pfn: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut found = sys::CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    // SAFETY: the name is NUL-terminated; the call writes one pointer and one status.
    let r = unsafe {
        sys::cuGetProcAddress_v2(
            c"cuDeviceGetAttribute".as_ptr(),
            &mut pfn,
            CUDA_12_0,
            0,
            &mut found,
        )
    };
    check_on(r, "cuGetProcAddress", || "cuDeviceGetAttribute".into())?;
    if pfn.is_null() {
        return Err(
            DriverError::new(E::CUDA_ERROR_NOT_FOUND, "cuGetProcAddress")
                .on(format!("cuDeviceGetAttribute: {found:?}")),
        );
    }
    // SAFETY: the driver documents cuDeviceGetAttribute as
    // `CUresult (int *pi, CUdevice_attribute attrib, CUdevice dev)`, the enum an int in C.
    let get: GetAttribute = unsafe { std::mem::transmute(pfn) };
    let mut all = Vec::new();
    for attr in 1..CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX as i32 {
        let mut value = 0;
        // SAFETY: writes one int; the driver checks `attr` and `dev`.
        if unsafe { get(&mut value, attr, dev) } == E::CUDA_SUCCESS {
            all.push((attr, value));
        }
    }
    Ok(all)
}

/// The UUID of device `dev` (`cuDeviceGetUuid_v2`).
pub fn uuid(dev: CUdevice) -> Result<[u8; 16], DriverError> {
    let u =
        result::device::get_uuid(dev).call_on("cuDeviceGetUuid_v2", || format!("device {dev}"))?;
    Ok(u.bytes.map(|b| b as u8))
}

/// Device `dev`'s name (`cuDeviceGetName`).
pub fn name(dev: CUdevice) -> Result<String, DriverError> {
    result::device::get_name(dev).call_on("cuDeviceGetName", || format!("device {dev}"))
}

/// Device `dev`'s memory in bytes (`cuDeviceTotalMem`).
pub fn total_mem(dev: CUdevice) -> Result<u64, DriverError> {
    // SAFETY: the driver checks `dev`; writes one size_t.
    let bytes = unsafe { result::device::total_mem(dev) }
        .call_on("cuDeviceTotalMem", || format!("device {dev}"))?;
    Ok(bytes as u64)
}
