//! TMA descriptors (`cuTensorMapEncodeTiled`): the session checks what a hostile client could
//! use to make the server read or describe memory that is not its own, and the backend encodes.
//!
//! Checked here, as `cuTensorMapEncodeTiled` documents them (so that the simulator refuses what
//! the driver does): the rank (1..=5), CUDA 13.0's values of each enumeration, the global
//! address aligned to 16 bytes (32 with a 32-byte interleave), dimensions of 1 to 2^32
//! elements, strides that are multiples of 16 below 2^40, a box of 1 to 256 elements and
//! element strides of 1 to 8 along each dimension. And mps's own: the bytes the dimensions and
//! strides span from the global address lie in one of the client's allocations or mappings
//! (for an interleaved layout, the outer dimensions' span and one interleave unit of the
//! innermost). The rest (the box's bytes against the swizzle, the rank an interleave needs) is
//! the driver's to check; it answers `CUDA_ERROR_INVALID_VALUE` to the client.

use mps_core::protocol::{Completion, TENSOR_MAP_BYTES, TensorMapTiled};
use mps_core::{Error, Result, Status};

use super::{Answer, SessionCore};
use crate::backend::Backend;

/// The largest value of each enumeration CUDA 13.0 defines: data type, interleave, swizzle, L2
/// promotion and out-of-bounds fill.
pub(crate) const MAX_DATA_TYPE: u8 = 15;
pub(crate) const MAX_INTERLEAVE: u8 = 2;
pub(crate) const MAX_SWIZZLE: u8 = 6;
pub(crate) const MAX_L2_PROMOTION: u8 = 3;
pub(crate) const MAX_OOB_FILL: u8 = 1;

/// The bytes from the global address that a tiled map's tensor spans, once its parameters are
/// checked as the [module](self) says; or why it is refused.
pub(crate) fn checked_span(map: &TensorMapTiled) -> Result<u64> {
    let bad = |what: String| Error::invalid_value(format!("tensor map: {what}"));
    let rank = usize::from(map.rank);
    if !(1..=mps_core::protocol::TENSOR_MAP_MAX_RANK).contains(&rank) {
        return Err(bad(format!("rank {rank} is not 1 to 5")));
    }
    for (name, value, max) in [
        ("data type", map.data_type, MAX_DATA_TYPE),
        ("interleave", map.interleave, MAX_INTERLEAVE),
        ("swizzle", map.swizzle, MAX_SWIZZLE),
        ("L2 promotion", map.l2_promotion, MAX_L2_PROMOTION),
        ("out-of-bounds fill", map.oob_fill, MAX_OOB_FILL),
    ] {
        if value > max {
            return Err(bad(format!("{name} {value} is not one CUDA defines")));
        }
    }
    let align = if map.interleave == 2 { 32 } else { 16 };
    if map.address % align != 0 {
        return Err(bad(format!(
            "global address {:#x} is not aligned to {align} bytes",
            map.address
        )));
    }
    let dims = &map.shape.dims[..rank];
    if let Some(i) = dims.iter().position(|&d| d == 0 || d > 1 << 32) {
        return Err(bad(format!(
            "dimension {i} of {} is not 1 to 2^32",
            dims[i]
        )));
    }
    let strides = &map.shape.strides[..rank - 1];
    if let Some(i) = strides.iter().position(|&s| s % 16 != 0 || s >= 1 << 40) {
        return Err(bad(format!(
            "stride {i} of {} bytes is not a multiple of 16 below 2^40",
            strides[i]
        )));
    }
    for (name, values, max) in [
        ("box dimension", &map.shape.box_dims[..rank], 256),
        ("element stride", &map.shape.element_strides[..rank], 8),
    ] {
        if let Some(i) = values.iter().position(|&v| v == 0 || v > max) {
            return Err(bad(format!(
                "{name} {i} of {} is not 1 to {max}",
                values[i]
            )));
        }
    }
    let inner = match map.interleave {
        0 => match map.data_type {
            // Sixteen 4-bit elements in 8 bytes; sixteen 4- or 6-bit ones in 16.
            13 => dims[0].div_ceil(16).checked_mul(8),
            14 | 15 => dims[0].div_ceil(16).checked_mul(16),
            t => dims[0].checked_mul(ELEMENT_BYTES[usize::from(t)]),
        },
        1 => Some(16),
        _ => Some(32),
    };
    let overflow = || bad("its dimensions and strides span more than 2^64 bytes".to_string());
    let mut span = inner.ok_or_else(overflow)?;
    for (&d, &stride) in dims[1..].iter().zip(strides) {
        span = (d - 1)
            .checked_mul(stride)
            .and_then(|s| s.checked_add(span))
            .ok_or_else(overflow)?;
    }
    Ok(span)
}

/// Bytes of an element of each whole-byte data type (`CUtensorMapDataType` 0..=12).
const ELEMENT_BYTES: [u64; 13] = [1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4];

impl<B: Backend> SessionCore<B> {
    /// Encodes a tiled TMA descriptor of the client's memory; the reply's data is the
    /// descriptor.
    pub(super) fn tensor_map_encode_tiled(
        &mut self,
        seq: u64,
        map: &TensorMapTiled,
    ) -> Result<Answer> {
        let span = checked_span(map)?;
        self.allocations
            .check_range(map.address, span, "tensor map", Status::InvalidValue)?;
        let descriptor = self.backend.tensor_map_encode_tiled(map)?;
        Ok(descriptor_reply(seq, &descriptor))
    }

    /// A client's descriptor made to name `address` instead. The descriptor is opaque, so
    /// only the new address is checked: aligned to 16 bytes and inside the client's memory
    /// (the driver then checks its alignment against the descriptor's interleave).
    pub(super) fn tensor_map_replace_address(
        &mut self,
        seq: u64,
        address: u64,
        map: &[u8],
    ) -> Result<Answer> {
        let map: &[u8; TENSOR_MAP_BYTES] = map.try_into().map_err(|_| {
            Error::invalid_value(format!(
                "a tensor map of {} bytes, not {TENSOR_MAP_BYTES}",
                map.len()
            ))
        })?;
        if address % 16 != 0 {
            return Err(Error::invalid_value(format!(
                "tensor map: global address {address:#x} is not aligned to 16 bytes"
            )));
        }
        self.allocations
            .check_range(address, 1, "tensor map", Status::InvalidValue)?;
        let descriptor = self.backend.tensor_map_replace_address(map, address)?;
        Ok(descriptor_reply(seq, &descriptor))
    }
}

/// The reply carrying a descriptor.
fn descriptor_reply(seq: u64, descriptor: &[u8; TENSOR_MAP_BYTES]) -> Answer {
    let mut c = Completion::reply(seq, [TENSOR_MAP_BYTES as u64, 0, 0, 0]);
    c.data[..TENSOR_MAP_BYTES].copy_from_slice(descriptor);
    c.data_len = TENSOR_MAP_BYTES as u32;
    Answer::Full(Box::new(c))
}

#[cfg(test)]
mod tests {
    use mps_core::protocol::TensorShape;

    use super::*;

    fn map(rank: u8, dims: [u64; 5], strides: [u64; 4]) -> TensorMapTiled {
        TensorMapTiled {
            data_type: 7,
            rank,
            interleave: 0,
            swizzle: 0,
            l2_promotion: 0,
            oob_fill: 0,
            address: 0x1000,
            shape: TensorShape {
                dims,
                strides,
                box_dims: [8; 5],
                element_strides: [1; 5],
            },
        }
    }

    #[test]
    fn the_span_reaches_the_last_element() {
        assert_eq!(checked_span(&map(1, [10, 0, 0, 0, 0], [0; 4])).unwrap(), 40);
        // Rows of 16 floats padded to 128 bytes, 3 rows: two strides and a row.
        assert_eq!(
            checked_span(&map(2, [16, 3, 0, 0, 0], [128, 0, 0, 0])).unwrap(),
            2 * 128 + 64
        );
        let mut m = map(3, [4, 2, 2, 0, 0], [16, 64, 0, 0]);
        assert_eq!(checked_span(&m).unwrap(), 64 + 16 + 16);
        m.data_type = 13;
        assert_eq!(checked_span(&m).unwrap(), 64 + 16 + 8);
    }

    #[test]
    fn refusals_name_the_field() {
        let err = |m: TensorMapTiled| checked_span(&m).unwrap_err().to_string();
        assert!(err(map(0, [1; 5], [0; 4])).contains("rank 0"));
        assert!(err(map(6, [1; 5], [0; 4])).contains("rank 6"));
        assert!(err(map(2, [4, 0, 0, 0, 0], [16, 0, 0, 0])).contains("dimension 1 of 0"));
        assert!(err(map(2, [4, 2, 0, 0, 0], [24, 0, 0, 0])).contains("stride 0 of 24"));
        assert!(err(map(2, [4, 2, 0, 0, 0], [1 << 40, 0, 0, 0])).contains("below 2^40"));
        let mut m = map(1, [4, 0, 0, 0, 0], [0; 4]);
        m.address += 8;
        assert!(err(m).contains("not aligned to 16"));
        m.address += 8;
        m.interleave = 2;
        assert!(err(m).contains("not aligned to 32"));
        let mut m = map(1, [4, 0, 0, 0, 0], [0; 4]);
        m.shape.box_dims[0] = 257;
        assert!(err(m).contains("box dimension 0 of 257"));
        m.shape.box_dims[0] = 8;
        m.shape.element_strides[0] = 0;
        assert!(err(m).contains("element stride 0 of 0"));
        let mut m = map(1, [4, 0, 0, 0, 0], [0; 4]);
        m.swizzle = 7;
        assert!(err(m).contains("swizzle 7"));
        assert!(
            err(map(
                3,
                [4, 1 << 32, 1 << 32, 0, 0],
                [1 << 39, 1 << 39, 0, 0]
            ))
            .contains("2^64")
        );
    }
}
