//! The PTX inside a fatbin, which the simulator runs by entry name as it does a PTX module.
//!
//! A fatbin (what nvcc embeds in a program and cudart hands to `cuLibraryLoadData`) is a 16-byte
//! header (magic `0xba55ed50`, u16 version, u16 header size, u64 size of the parts) and then its
//! parts, each a header (u16 kind: 1 PTX, 2 ELF cubin; u16 version; u32 header size; u64
//! payload size; u32 compressed size at byte 16; u64 flags at byte 40; u64 uncompressed size at
//! byte 56) and its payload. The simulator cannot run a cubin, so only the PTX parts count. nvcc
//! compresses parts unless built with `--no-compress`: with zstd since CUDA 12.8 (decompressed
//! here), with LZ4 before (refused, naming the flag).

use std::borrow::Cow;
use std::io::Read;

use mps_core::protocol::MAX_MODULE_BYTES;
use mps_core::{Error, Result, Status};

const MAGIC: u32 = 0xba55_ed50;
const KIND_PTX: u16 = 1;
/// Flag bits of a part whose payload is compressed.
const LZ4: u64 = 0x2000;
const ZSTD: u64 = 0x8000;

fn read<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    read(b, at).map(u16::from_le_bytes)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    read(b, at).map(u32::from_le_bytes)
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    read(b, at).map(u64::from_le_bytes)
}

fn truncated() -> Error {
    Error::new(
        Status::InvalidImage,
        "fatbin is truncated: a part runs past the size its header states",
    )
}

/// Bytes the compressed PTX parts of one fatbin may decompress to in all: what a client could
/// send uncompressed. Checked against what each part's header claims before it is inflated.
const MAX_INFLATED: u64 = MAX_MODULE_BYTES;

/// The PTX texts of the fatbin `image`, in order (none if it holds only cubins).
pub(super) fn ptx_parts(image: &[u8]) -> Result<Vec<Cow<'_, [u8]>>> {
    if u32_at(image, 0) != Some(MAGIC) {
        return Err(Error::new(Status::InvalidImage, "not a fatbin (bad magic)"));
    }
    let header = u16_at(image, 6).ok_or_else(truncated)? as usize;
    let size = u64_at(image, 8).ok_or_else(truncated)? as usize;
    let end = header
        .checked_add(size)
        .filter(|e| *e <= image.len())
        .ok_or_else(truncated)?;
    let mut parts = Vec::new();
    let mut inflated = 0u64;
    let mut at = header;
    while at < end {
        let kind = u16_at(image, at).ok_or_else(truncated)?;
        let part_header = u32_at(image, at + 4).ok_or_else(truncated)? as usize;
        let payload = u64_at(image, at + 8).ok_or_else(truncated)? as usize;
        let flags = u64_at(image, at + 40).unwrap_or(0);
        let start = at.checked_add(part_header).ok_or_else(truncated)?;
        let stop = start
            .checked_add(payload)
            .filter(|s| *s <= end)
            .ok_or_else(truncated)?;
        if part_header == 0 {
            return Err(truncated());
        }
        if kind == KIND_PTX {
            let payload = &image[start..stop];
            if flags & LZ4 != 0 {
                return Err(Error::new(
                    Status::Unsupported,
                    "the fatbin's PTX is LZ4-compressed, which the simulator cannot read; \
                     build the program with nvcc --no-compress",
                ));
            }
            if flags & ZSTD != 0 {
                let compressed = u32_at(image, at + 16).ok_or_else(truncated)? as usize;
                let size = u64_at(image, at + 56).ok_or_else(truncated)?;
                inflated = inflated
                    .checked_add(size)
                    .filter(|t| *t <= MAX_INFLATED)
                    .ok_or_else(|| {
                        Error::new(
                            Status::InvalidImage,
                            format!(
                                "the fatbin's compressed PTX claims {size} bytes, more than the \
                                 {MAX_INFLATED} bytes of a module image in all; refused \
                                 before decompressing it"
                            ),
                        )
                    })?;
                let frame = payload.get(..compressed).ok_or_else(truncated)?;
                parts.push(Part::Zstd(frame, size));
            } else {
                parts.push(Part::Plain(payload));
            }
        }
        at = stop;
    }
    // Inflated only once every claim is known to fit.
    parts
        .into_iter()
        .map(|p| match p {
            Part::Plain(text) => Ok(Cow::Borrowed(text)),
            Part::Zstd(frame, size) => unzstd(frame, size).map(Cow::Owned),
        })
        .collect()
}

/// A PTX part as found: its text, or a zstd frame and the size it claims.
enum Part<'a> {
    Plain(&'a [u8]),
    Zstd(&'a [u8], u64),
}

/// The `size` bytes that the zstd frame `frame` decompresses to.
fn unzstd(frame: &[u8], size: u64) -> Result<Vec<u8>> {
    let bad = |e: String| {
        Error::new(
            Status::InvalidImage,
            format!("the fatbin's compressed PTX does not decompress: {e}"),
        )
    };
    // `size` is within MAX_INFLATED (checked by the caller); the reserve follows what the
    // frame can hold at most, not a claim alone.
    let mut out = Vec::with_capacity(size.min(frame.len() as u64 * 64) as usize);
    ruzstd::decoding::StreamingDecoder::new(frame)
        .map_err(|e| bad(e.to_string()))?
        .take(size)
        .read_to_end(&mut out)
        .map_err(|e| bad(e.to_string()))?;
    if out.len() as u64 != size {
        return Err(bad(format!(
            "{} bytes, not the {size} its header states",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(kind: u16, flags: u64, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 64];
        p[0..2].copy_from_slice(&kind.to_le_bytes());
        p[4..8].copy_from_slice(&64u32.to_le_bytes());
        p[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        p[40..48].copy_from_slice(&flags.to_le_bytes());
        p.extend_from_slice(payload);
        p
    }

    fn fatbin(parts: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = parts.concat();
        let mut f = MAGIC.to_le_bytes().to_vec();
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        f.extend_from_slice(&(body.len() as u64).to_le_bytes());
        f.extend(body);
        f
    }

    #[test]
    fn ptx_parts_are_found_and_cubins_skipped() {
        let f = fatbin(&[part(2, 0, b"\x7fELF...."), part(1, 0, b".version 9.0\0\0")]);
        assert_eq!(ptx_parts(&f).unwrap(), [&b".version 9.0\0\0"[..]]);
        let only_cubin = fatbin(&[part(2, 0, b"\x7fELF")]);
        assert!(ptx_parts(&only_cubin).unwrap().is_empty());
    }

    /// A zstd frame of "PTX" in one raw block (the format's simplest form): magic, frame
    /// header (single segment, 1-byte content size), block header (last, raw, 3 bytes).
    const ZSTD_PTX: &[u8] = b"\x28\xb5\x2f\xfd\x20\x03\x19\x00\x00PTX";

    fn compressed(flags: u64, frame: &[u8], size: u64) -> Vec<u8> {
        let mut p = part(1, flags, frame);
        p[16..20].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        p[56..64].copy_from_slice(&size.to_le_bytes());
        p
    }

    #[test]
    fn zstd_compressed_ptx_is_decompressed() {
        let f = fatbin(&[compressed(0x8011, ZSTD_PTX, 3)]);
        assert_eq!(ptx_parts(&f).unwrap(), [&b"PTX"[..]]);
        let wrong_size = fatbin(&[compressed(0x8011, ZSTD_PTX, 4)]);
        assert_eq!(
            ptx_parts(&wrong_size).unwrap_err().status,
            Status::InvalidImage
        );
    }

    #[test]
    fn a_decompressed_size_past_a_module_image_is_refused_before_inflating() {
        // A frame of a few bytes claiming 1 TiB, and parts whose claims pass it together.
        let e = ptx_parts(&fatbin(&[compressed(0x8011, ZSTD_PTX, 1 << 40)])).unwrap_err();
        assert!(e.message.contains("before decompressing"), "{}", e.message);
        let half = MAX_INFLATED / 2 + 1;
        let two = fatbin(&[
            compressed(0x8011, ZSTD_PTX, half),
            compressed(0x8011, ZSTD_PTX, half),
        ]);
        assert!(ptx_parts(&two).unwrap_err().message.contains("in all"));
    }

    #[test]
    fn lz4_and_truncated_fatbins_are_refused() {
        let f = fatbin(&[compressed(0x2011, b"\x04\x22\x4d\x18", 3)]);
        let e = ptx_parts(&f).unwrap_err();
        assert!(e.message.contains("--no-compress"), "{}", e.message);
        let mut cut = fatbin(&[part(1, 0, b".version")]);
        cut.truncate(cut.len() - 2);
        assert_eq!(ptx_parts(&cut).unwrap_err().status, Status::InvalidImage);
    }
}
