//! TMA descriptors encoded by the driver (`cuTensorMapEncodeTiled`, `cuTensorMapReplaceAddress`).

use std::ffi::c_void;

use cudarc::driver::sys;
use mps_core::protocol::{TENSOR_MAP_BYTES, TensorMapTiled};
use mps_core::{Error, Result};
use mps_driver::check_on;

/// The driver's descriptor of `map`, in the current context; the session has checked its rank,
/// span and enumerations, the driver checks the rest and answers `CUDA_ERROR_INVALID_VALUE`.
pub(super) fn encode_tiled(map: &TensorMapTiled) -> Result<[u8; TENSOR_MAP_BYTES]> {
    // Checked again here, as the enumerations' values become Rust enums below.
    let known = |name: &str, value: u8, max: u8| {
        if value <= max {
            Ok(u32::from(value))
        } else {
            Err(Error::invalid_value(format!(
                "tensor map: {name} {value} is not one CUDA 13.0 defines"
            )))
        }
    };
    let data_type = known("data type", map.data_type, 15)?;
    let interleave = known("interleave", map.interleave, 2)?;
    let swizzle = known("swizzle", map.swizzle, 6)?;
    let l2 = known("L2 promotion", map.l2_promotion, 3)?;
    let oob = known("out-of-bounds fill", map.oob_fill, 1)?;
    let mut out = sys::CUtensorMap { opaque: [0; 16] };
    let s = &map.shape;
    // SAFETY: each enumeration is `repr(u32)` with the contiguous values 0..=max checked
    // above; the arrays hold 5 (4 strides) entries, at least the rank the session allows; the
    // driver writes the 128-byte descriptor into `out` and reads no memory at the address.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut out,
            std::mem::transmute::<u32, sys::CUtensorMapDataType>(data_type),
            u32::from(map.rank),
            map.address as *mut c_void,
            s.dims.as_ptr(),
            s.strides.as_ptr(),
            s.box_dims.as_ptr(),
            s.element_strides.as_ptr(),
            std::mem::transmute::<u32, sys::CUtensorMapInterleave>(interleave),
            std::mem::transmute::<u32, sys::CUtensorMapSwizzle>(swizzle),
            std::mem::transmute::<u32, sys::CUtensorMapL2promotion>(l2),
            std::mem::transmute::<u32, sys::CUtensorMapFloatOOBfill>(oob),
        )
    };
    check_on(r, "cuTensorMapEncodeTiled", || {
        format!("a tensor map of rank {} at {:#x}", map.rank, map.address)
    })?;
    let mut bytes = [0u8; TENSOR_MAP_BYTES];
    bytes.copy_from_slice(bytemuck::cast_slice(&out.opaque));
    Ok(bytes)
}

/// The driver's copy of the client's descriptor `map` naming `address` instead; the driver
/// rewrites only the 128 bytes given it.
pub(super) fn replace_address(
    map: &[u8; TENSOR_MAP_BYTES],
    address: u64,
) -> Result<[u8; TENSOR_MAP_BYTES]> {
    let mut out = sys::CUtensorMap { opaque: [0; 16] };
    bytemuck::cast_slice_mut(&mut out.opaque).copy_from_slice(map);
    // SAFETY: `out` is an aligned 128-byte descriptor the driver reads and rewrites; it reads
    // no memory at the address.
    let r = unsafe { sys::cuTensorMapReplaceAddress(&mut out, address as *mut c_void) };
    check_on(r, "cuTensorMapReplaceAddress", || {
        format!("a tensor map given the address {address:#x}")
    })?;
    let mut bytes = [0u8; TENSOR_MAP_BYTES];
    bytes.copy_from_slice(bytemuck::cast_slice(&out.opaque));
    Ok(bytes)
}
