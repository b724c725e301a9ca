//! What the server reports of its device, read from the driver: name, memory, SMs, compute
//! capability, launch limits, every attribute the driver answers and the UUID.

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUdevice, CUdevice_attribute_enum as A, CUfunction};
use mps_core::limits::DeviceLimits;
use mps_core::protocol::{BackendKind, DeviceAttribute, Dim3};

use crate::backend::DeviceInfo;
use mps_driver::{Call, DriverError, all_attributes, attribute, uuid};

/// Describes device `dev`; `units` splits its SM count into the partition units.
pub(super) fn describe(
    dev: CUdevice,
    units: impl FnOnce(u32) -> Vec<u32>,
) -> Result<DeviceInfo, DriverError> {
    let name = mps_driver::name(dev)?;
    let total = mps_driver::total_mem(dev)?;
    let sms = unsigned(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(DeviceInfo {
        name,
        total_mem: total,
        sm_count: sms,
        sm_units: units(sms),
        cc: (
            unsigned(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            unsigned(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        limits: limits(dev)?,
        kind: BackendKind::Cuda,
        attributes: all_attributes(dev)?
            .into_iter()
            .map(|(attribute, value)| DeviceAttribute { attribute, value })
            .collect(),
        // A driver without cuDeviceGetUuid_v2's answer leaves the client to make one up.
        uuid: uuid(dev).ok(),
    })
}

/// The launch limits of device `dev`, from its attributes.
fn limits(dev: CUdevice) -> Result<DeviceLimits, DriverError> {
    let dim = |x, y, z| -> Result<Dim3, DriverError> {
        Ok(Dim3 {
            x: unsigned(dev, x)?,
            y: unsigned(dev, y)?,
            z: unsigned(dev, z)?,
        })
    };
    Ok(DeviceLimits {
        max_threads_per_block: unsigned(dev, A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_block: dim(
            A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
            A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
            A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
        )?,
        max_grid: dim(
            A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
            A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
            A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
        )?,
        max_shared_mem_per_block: unsigned(
            dev,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK,
        )?,
        max_shared_mem_per_block_optin: unsigned(
            dev,
            A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )?,
        warp_size: unsigned(dev, A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
    })
}

/// An attribute that is a count or a size (the driver's int is never negative for these).
fn unsigned(dev: CUdevice, attr: A) -> Result<u32, DriverError> {
    attribute(dev, attr).map(|v| v.max(0) as u32)
}

/// The static shared memory of kernel `f`, in bytes.
pub(super) fn static_shared_memory(f: CUfunction) -> Result<u32, DriverError> {
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES;
    // SAFETY: f is a loaded kernel.
    let bytes =
        unsafe { result::function::get_function_attribute(f, attr) }.call("cuFuncGetAttribute")?;
    Ok(bytes.max(0) as u32)
}

/// Lets kernel `f`, with `fixed` bytes of static shared memory, use as much dynamic shared memory
/// as the device allows a block beside them
/// ([`DeviceLimits::max_shared_mem_per_block_optin`] less `fixed`); without this a block may use
/// only the default shared memory per block, static and dynamic together.
/// Lets kernel `f` be launched in clusters larger than the portable 8 blocks.
pub(super) fn allow_non_portable_clusters(f: CUfunction) -> Result<(), DriverError> {
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
    // SAFETY: f is a loaded kernel; 1 is a value the driver documents for the attribute.
    unsafe { result::function::set_function_attribute(f, attr, 1) }
        .call_on("cuFuncSetAttribute", || {
            "NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 1".to_string()
        })
}

pub(super) fn allow_dynamic_shared_memory(
    f: CUfunction,
    fixed: u32,
    limits: &DeviceLimits,
) -> Result<(), DriverError> {
    let dynamic = limits.max_shared_mem_per_block_optin.saturating_sub(fixed);
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // SAFETY: f is a loaded kernel; the value is within what the driver documents for it (the
    // opt-in limit less the kernel's static shared memory).
    unsafe { result::function::set_function_attribute(f, attr, dynamic as i32) }
        .call_on("cuFuncSetAttribute", || {
            format!("MAX_DYNAMIC_SHARED_SIZE_BYTES = {dynamic}")
        })
}
