//! TMA descriptors (`cuTensorMapEncodeTiled`, `cuTensorMapReplaceAddress`). A `CUtensorMap`
//! names a device address of the server's context, so the server encodes it; the 128 bytes come
//! back into the program's.
//! What is checked here is what the arrays' reading needs (non-null pointers, a rank of 1 to 5
//! that sizes them) and the descriptor's alignment (64 bytes, as CUDA documents); the server
//! checks the rest and answers CUDA's errors.

use std::ffi::c_void;

use mps_client::{TENSOR_MAP_BYTES, TensorMapTiled, TensorShape};

use crate::abi::CUresult;
use crate::connection::Res;
use crate::context::current;
use crate::ffi::{check, exports};

/// An enumeration's value, which must fit the byte it travels in (CUDA's all do).
fn small(value: u32) -> Res<u8> {
    u8::try_from(value).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
}

/// # Safety
/// Each array must hold the entries `rank` sizes it to (`strides` one fewer) when `rank` is 1
/// to 5; `out` must be NULL or writable for 128 bytes.
#[allow(clippy::too_many_arguments)]
unsafe fn encode_tiled(
    out: *mut c_void,
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    box_dims: *const u32,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
) -> Res<()> {
    check(!out.is_null() && out as usize % 64 == 0 && (1..=5).contains(&rank))?;
    let n = rank as usize;
    check(!dims.is_null() && !box_dims.is_null() && !element_strides.is_null())?;
    check(n == 1 || !strides.is_null())?;
    let mut shape = TensorShape::default();
    // SAFETY: the caller guarantees `rank` entries in each array (`rank - 1` strides), which
    // are non-null; `shape`'s arrays hold 5 (4).
    unsafe {
        shape.dims[..n].copy_from_slice(std::slice::from_raw_parts(dims, n));
        if n > 1 {
            shape.strides[..n - 1].copy_from_slice(std::slice::from_raw_parts(strides, n - 1));
        }
        shape.box_dims[..n].copy_from_slice(std::slice::from_raw_parts(box_dims, n));
        shape.element_strides[..n].copy_from_slice(std::slice::from_raw_parts(element_strides, n));
    }
    let map = TensorMapTiled {
        data_type: small(data_type)?,
        rank: rank as u8,
        interleave: small(interleave)?,
        swizzle: small(swizzle)?,
        l2_promotion: small(l2_promotion)?,
        oob_fill: small(oob_fill)?,
        address: address as u64,
        shape,
    };
    let bytes = current()?.conn()?.tensor_map_encode_tiled(&map)?;
    // SAFETY: `out` is non-null and writable for the descriptor's 128 bytes (the caller's
    // guarantee); a byte copy needs no alignment.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), TENSOR_MAP_BYTES) };
    Ok(())
}

/// # Safety
/// `map` must be NULL or readable and writable for 128 bytes.
unsafe fn replace_address(map: *mut c_void, address: *mut c_void) -> Res<()> {
    check(!map.is_null() && map as usize % 64 == 0)?;
    let mut bytes = [0u8; TENSOR_MAP_BYTES];
    // SAFETY: `map` is non-null and readable for 128 bytes (the caller's guarantee).
    unsafe {
        std::ptr::copy_nonoverlapping(map.cast::<u8>(), bytes.as_mut_ptr(), TENSOR_MAP_BYTES)
    };
    let bytes = current()?
        .conn()?
        .tensor_map_replace_address(&bytes, address as u64)?;
    // SAFETY: as above, writable.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.cast::<u8>(), TENSOR_MAP_BYTES) };
    Ok(())
}

exports! {
    /// # Safety
    /// `tensorMap` must be a descriptor, readable and writable for 128 bytes.
    pub unsafe fn cuTensorMapReplaceAddress(
        tensor_map: *mut c_void,
        address: *mut c_void,
    ) ["cuTensorMapReplaceAddress" 12000] =
        // SAFETY: the caller's guarantee is replace_address's precondition.
        unsafe { replace_address(tensor_map, address) };

    /// # Safety
    /// As `cuTensorMapEncodeTiled` documents: `tensorMap` writable for 128 bytes, the arrays
    /// sized by the rank.
    pub unsafe fn cuTensorMapEncodeTiled(
        tensor_map: *mut c_void,
        data_type: u32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        box_dims: *const u32,
        element_strides: *const u32,
        interleave: u32,
        swizzle: u32,
        l2_promotion: u32,
        oob_fill: u32,
    ) ["cuTensorMapEncodeTiled" 12000] =
        // SAFETY: the caller's guarantee is encode_tiled's precondition.
        unsafe {
            encode_tiled(
                tensor_map, data_type, rank, address, dims, strides, box_dims, element_strides,
                interleave, swizzle, l2_promotion, oob_fill,
            )
        };
}
