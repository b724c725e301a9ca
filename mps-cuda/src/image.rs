//! The length of a module image given only its address, as `cuModuleLoadData` and
//! `cuLibraryLoadData` receive it: PTX ends at its NUL, a cubin (ELF) at the furthest of its
//! headers and sections, a fatbin after its header's stated size; the wrapper nvcc emits around
//! a fatbin points at the fatbin.

use std::ffi::CStr;

/// `__fatBinC_Wrapper_t`'s magic, then a version, then a pointer to the fatbin.
const WRAPPER_MAGIC: u32 = 0x4662_43b1;
/// A fatbin's header: magic, version (u16), header size (u16), size of what follows (u64).
const FATBIN_MAGIC: u32 = 0xba55_ed50;
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];

/// The image at `p` as a byte slice, or `None` if it is none of the above.
///
/// # Safety
/// `p` must point at a complete module image (PTX, cubin, fatbin, or nvcc's fatbin wrapper).
pub(crate) unsafe fn image<'a>(p: *const u8) -> Option<&'a [u8]> {
    if p.is_null() {
        return None;
    }
    // Read the magic a byte at a time, stopping at a NUL: a PTX text may be shorter than four
    // bytes, and none of the binary magics holds a zero byte.
    let mut head = [0u8; 4];
    for (i, b) in head.iter_mut().enumerate() {
        // SAFETY: bytes up to and including the first NUL belong to the image, whatever it is.
        *b = unsafe { p.add(i).read() };
        if *b == 0 {
            break;
        }
    }
    let magic = u32::from_le_bytes(head);
    if magic == WRAPPER_MAGIC {
        // SAFETY: the wrapper is { u32 magic, u32 version, const void *data, void *unused }.
        let data = unsafe { p.add(8).cast::<*const u8>().read_unaligned() };
        // SAFETY: the wrapper's data is the fatbin it wraps.
        return unsafe { image(data) }.filter(|_| !data.is_null());
    }
    let len = if magic == FATBIN_MAGIC {
        // SAFETY: a fatbin header is 16 bytes.
        let header = unsafe { p.add(6).cast::<u16>().read_unaligned() } as usize;
        // SAFETY: as above.
        let size = unsafe { p.add(8).cast::<u64>().read_unaligned() } as usize;
        header.checked_add(size)?
    } else if head == ELF_MAGIC {
        // SAFETY: an ELF image starts with its ELF header.
        unsafe { elf_len(p) }?
    } else {
        // SAFETY: what remains is PTX text, which is NUL-terminated.
        unsafe { CStr::from_ptr(p.cast()) }
            .to_bytes_with_nul()
            .len()
    };
    // SAFETY: the image is `len` bytes long, by its own description.
    Some(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The end of the furthest part of a 64-bit little-endian ELF image.
///
/// # Safety
/// `p` must point at a complete ELF image.
unsafe fn elf_len(p: *const u8) -> Option<usize> {
    let rd = |off: usize, n: usize| -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: every read is within the ELF64 header, or within the section and program
        // header tables it locates, which a complete image contains; n <= 8.
        unsafe { std::ptr::copy_nonoverlapping(p.add(off), b.as_mut_ptr(), n) };
        u64::from_le_bytes(b)
    };
    if rd(4, 1) != 2 || rd(5, 1) != 1 {
        return None; // not ELF64 little-endian
    }
    let (phoff, shoff) = (rd(0x20, 8) as usize, rd(0x28, 8) as usize);
    let (phentsize, phnum) = (rd(0x36, 2) as usize, rd(0x38, 2) as usize);
    let (shentsize, shnum) = (rd(0x3a, 2) as usize, rd(0x3c, 2) as usize);
    let mut end = 0x40usize
        .max(phoff + phentsize * phnum)
        .max(shoff + shentsize * shnum);
    for i in 0..shnum {
        let sh = shoff + i * shentsize;
        const SHT_NOBITS: u64 = 8;
        if rd(sh + 4, 4) != SHT_NOBITS {
            end = end.max((rd(sh + 0x18, 8) + rd(sh + 0x20, 8)) as usize);
        }
    }
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        end = end.max((rd(ph + 0x08, 8) + rd(ph + 0x20, 8)) as usize);
    }
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_ends_at_its_nul() {
        let ptx = b".version 8.0\n.target sm_75\n\0garbage";
        // SAFETY: NUL-terminated.
        let img = unsafe { image(ptx.as_ptr()) }.unwrap();
        assert_eq!(img.len(), ptx.len() - "garbage".len());
        // A text shorter than a magic is read no further than its NUL.
        let short = Box::new(*b"a\0");
        // SAFETY: NUL-terminated.
        assert_eq!(unsafe { image(short.as_ptr()) }.unwrap(), b"a\0");
    }

    #[test]
    fn a_fatbin_is_as_long_as_its_header_says_and_a_wrapper_leads_to_it() {
        let mut fatbin = Vec::new();
        fatbin.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        fatbin.extend_from_slice(&1u16.to_le_bytes());
        fatbin.extend_from_slice(&16u16.to_le_bytes());
        fatbin.extend_from_slice(&24u64.to_le_bytes());
        fatbin.extend_from_slice(&[7u8; 40]);
        // SAFETY: a complete fatbin (16 + 24 bytes, and more after it).
        assert_eq!(unsafe { image(fatbin.as_ptr()) }.unwrap().len(), 40);
        #[repr(C)]
        struct Wrapper(u32, u32, *const u8, *const u8);
        let w = Wrapper(WRAPPER_MAGIC, 1, fatbin.as_ptr(), std::ptr::null());
        // SAFETY: a wrapper around the fatbin above.
        let img = unsafe { image((&raw const w).cast()) }.unwrap();
        assert_eq!(img.as_ptr(), fatbin.as_ptr());
        assert_eq!(img.len(), 40);
    }

    #[test]
    fn an_elf_image_ends_after_its_last_section() {
        let mut elf = vec![0u8; 0x200];
        elf[..4].copy_from_slice(&ELF_MAGIC);
        elf[4] = 2;
        elf[5] = 1;
        // One section header at 0x100 (64 bytes) describing a section at 0x40..0x140+0x30.
        elf[0x28..0x30].copy_from_slice(&0x100u64.to_le_bytes());
        elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        elf[0x3c..0x3e].copy_from_slice(&1u16.to_le_bytes());
        elf[0x100 + 4..0x100 + 8].copy_from_slice(&1u32.to_le_bytes());
        elf[0x100 + 0x18..0x100 + 0x20].copy_from_slice(&0x150u64.to_le_bytes());
        elf[0x100 + 0x20..0x100 + 0x28].copy_from_slice(&0x30u64.to_le_bytes());
        // SAFETY: the image above is complete.
        assert_eq!(unsafe { image(elf.as_ptr()) }.unwrap().len(), 0x180);
    }
}
