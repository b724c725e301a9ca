//! Pointer queries (`cuPointerGetAttribute`, `cuPointerGetAttributes`, `cuMemGetAddressRange`),
//! answered in the library from what it keeps of each kind of memory: device allocations
//! (`cuMemAlloc`), page-locked host buffers (`cuMemHostAlloc`) and mapped ranges of
//! reservations (`cuMemMap`). Triton refuses to launch on a pointer whose
//! `CU_POINTER_ATTRIBUTE_DEVICE_POINTER` it cannot get, and asks for every pointer argument of
//! every launch, so nothing here asks the server.
//!
//! A pointer this library does not know (pageable host memory, say) is
//! CUDA_ERROR_INVALID_VALUE for `cuPointerGetAttribute`, as CUDA answers for it, and zeroes for
//! `cuPointerGetAttributes`, as CUDA documents. A page-locked host buffer's `DEVICE_POINTER`
//! is the server's mapping of it (`cuMemHostGetDevicePointer`'s), which is its address in this
//! process too where the client could map it there (as unified addressing promises), and
//! otherwise not; that device address is answered as the buffer too (its `HOST_POINTER` is the
//! address here). Memory in a reservation has no context (CONTEXT is NULL); an address
//! reserved but not mapped answers only `MAPPED` (0) and its range.

use std::ffi::c_void;

use crate::abi::pointer_attribute as P;
use crate::abi::{CUdevice, CUdeviceptr, CUresult};
use crate::connection::Res;
use crate::context::{current, to_cucontext};
use crate::driver::{Allocation, HostBuffer, driver};
use crate::ffi::{check, exports, lock};
use crate::log;
use crate::vmm::{self, Reserved};

/// What a pointer points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Memory {
    Device {
        device: CUdevice,
        base: u64,
        a: Allocation,
    },
    Host {
        base: usize,
        b: HostBuffer,
        /// The pointer's address in this process.
        host_ptr: u64,
        /// The pointer's device address (`cuMemHostGetDevicePointer`'s), if the server gave one.
        device_ptr: Option<u64>,
    },
    Reserved(Reserved),
}

/// The memory `ptr` points into, the current device's first.
fn find(ptr: u64) -> Res<Option<Memory>> {
    let d = driver()?;
    let count = d.devices.len() as CUdevice;
    let here = current().map_or(0, |c| c.device);
    {
        let allocations = lock(&d.allocations);
        let on = |dev: CUdevice| {
            let (&(_, base), a) = allocations.range((dev, 0)..=(dev, ptr)).next_back()?;
            (ptr - base < a.size).then_some(Memory::Device {
                device: dev,
                base,
                a: *a,
            })
        };
        let found = std::iter::once(here)
            .chain((0..count).filter(|x| *x != here))
            .find_map(on);
        if found.is_some() {
            return Ok(found);
        }
    }
    if let Some(r) = vmm::reserved(ptr)? {
        return Ok(Some(Memory::Reserved(r)));
    }
    let p = ptr as usize;
    let host = lock(&d.host);
    let found = host
        .range(..=p)
        .next_back()
        .filter(|(base, b)| p - **base < b.len);
    if let Some((&base, &b)) = found {
        let off = (p - base) as u64;
        return Ok(Some(Memory::Host {
            base,
            b,
            host_ptr: ptr,
            device_ptr: b.at.map(|at| at + off),
        }));
    }
    // A buffer's device address, as a kernel is given it through mps (CUDA's is the host
    // pointer itself): the same memory.
    let by_device = host.iter().find_map(|(&base, &b)| {
        let off = ptr.checked_sub(b.at?)?;
        (off < b.len as u64).then_some((base, b, off))
    });
    Ok(by_device.map(|(base, b, off)| Memory::Host {
        base,
        b,
        host_ptr: base as u64 + off,
        device_ptr: Some(ptr),
    }))
}

/// The device address of `ptr` where it points into a page-locked host buffer of device
/// `dev`: under CUDA's unified addressing such a host pointer is also a device address, which a
/// program may pass wherever one goes (XLA copies from and sets its pinned buffers so), while
/// the server knows only the buffer's device address. `None` for any other pointer, a device
/// allocation or mapping with the same address first (the servers and this process have
/// address spaces of their own): that is used as it is.
pub(crate) fn pinned_device_address(ptr: u64, dev: CUdevice) -> Option<u64> {
    let d = driver().ok()?;
    if lock(&d.host).is_empty() {
        return None;
    }
    match find(ptr).ok()?? {
        Memory::Host {
            b,
            device_ptr: Some(at),
            ..
        } if b.device == dev => Some(at),
        _ => None,
    }
}

/// An attribute's value, in the C type CUDA gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Value {
    /// A pointer, device address or `size_t`.
    Word(u64),
    U64(u64),
    U32(u32),
    I32(i32),
    /// A boolean, written as the C API's booleans are, a 32-bit 0 or 1: callers pass an
    /// `int` (cudart's `isManaged`) or `unsigned int` (CUDA.jl's) without clearing it first.
    Bool(bool),
}

/// Why an attribute has no value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// It does not apply to this memory (or the memory is unknown): CUDA_ERROR_INVALID_VALUE
    /// alone, a zero among several.
    NotApplicable,
    /// This library does not answer it.
    Unsupported,
}

/// The value of attribute `attr` for `ptr`, in `memory`.
fn value(memory: Option<Memory>, ptr: u64, attr: u32) -> Result<Value, Missing> {
    use Missing::{NotApplicable as No, Unsupported};
    use Value::{Bool, I32, U32, U64, Word};
    let rw = crate::abi::vmm::ACCESS_READWRITE;
    match attr {
        P::P2P_TOKENS => return Err(Unsupported),
        a if !(P::CONTEXT..=P::IS_HW_DECOMPRESS_CAPABLE).contains(&a) => return Err(Unsupported),
        _ => {}
    }
    let memory = memory.ok_or(No)?;
    if let Memory::Reserved(r) = memory {
        // Reserved but not mapped: only where it is, and that nothing is mapped there.
        let Some(m) = r.mapping else {
            return match attr {
                P::MAPPED => Ok(Bool(false)),
                P::RANGE_START_ADDR => Ok(Word(r.range.0)),
                P::RANGE_SIZE => Ok(Word(r.range.1)),
                P::DEVICE_ORDINAL => Ok(I32(r.device)),
                _ => Err(No),
            };
        };
        return Ok(match attr {
            P::CONTEXT => Word(0),
            P::MEMORY_TYPE => U32(P::MEMORYTYPE_DEVICE),
            P::DEVICE_POINTER => Word(ptr),
            P::HOST_POINTER => return Err(No),
            P::SYNC_MEMOPS => Bool(false),
            P::BUFFER_ID | P::MEMORY_BLOCK_ID => U64(m.id),
            P::IS_MANAGED
            | P::IS_LEGACY_CUDA_IPC_CAPABLE
            | P::IS_GPU_DIRECT_RDMA_CAPABLE
            | P::IS_HW_DECOMPRESS_CAPABLE => Bool(false),
            P::DEVICE_ORDINAL => I32(r.device),
            P::RANGE_START_ADDR => Word(r.range.0),
            P::RANGE_SIZE => Word(r.range.1),
            P::MAPPED => Bool(true),
            P::ALLOWED_HANDLE_TYPES => U64(m.handle_types as u64),
            P::ACCESS_FLAGS => U32(if m.access { rw } else { 0 }),
            P::MEMPOOL_HANDLE => Word(0),
            P::MAPPING_SIZE => Word(m.size),
            P::MAPPING_BASE_ADDR => Word(m.start),
            _ => return Err(Unsupported),
        });
    }
    // A device allocation or a host buffer: one range, the whole of it mapped.
    let (device, ctx, base, size, id, host) = match memory {
        Memory::Device { device, base, a } => (device, a.ctx, base, a.size, a.id, None),
        Memory::Host {
            base,
            b,
            host_ptr,
            device_ptr,
        } => {
            let host = Some((host_ptr, device_ptr));
            (b.device, b.ctx, base as u64, b.len as u64, b.id, host)
        }
        Memory::Reserved(_) => unreachable!("answered above"),
    };
    Ok(match attr {
        P::CONTEXT => Word(to_cucontext(ctx) as u64),
        P::MEMORY_TYPE => U32(if host.is_some() {
            P::MEMORYTYPE_HOST
        } else {
            P::MEMORYTYPE_DEVICE
        }),
        P::DEVICE_POINTER => match host {
            None => Word(ptr),
            Some((_, Some(d))) => Word(d),
            Some((_, None)) => return Err(No),
        },
        P::HOST_POINTER => match host {
            Some((h, _)) => Word(h),
            None => return Err(No),
        },
        P::SYNC_MEMOPS => Bool(false),
        P::BUFFER_ID | P::MEMORY_BLOCK_ID => U64(id),
        P::IS_MANAGED
        | P::IS_LEGACY_CUDA_IPC_CAPABLE
        | P::IS_GPU_DIRECT_RDMA_CAPABLE
        | P::IS_HW_DECOMPRESS_CAPABLE => Bool(false),
        P::DEVICE_ORDINAL => I32(device),
        P::RANGE_START_ADDR | P::MAPPING_BASE_ADDR => Word(base),
        P::RANGE_SIZE | P::MAPPING_SIZE => Word(size),
        P::MAPPED => Bool(true),
        P::ALLOWED_HANDLE_TYPES => U64(0),
        P::ACCESS_FLAGS => U32(rw),
        // A stream-ordered allocation's pool (`mempool`); none for other memory.
        P::MEMPOOL_HANDLE => Word(match memory {
            Memory::Device { a, .. } => a.pool as u64,
            _ => 0,
        }),
        _ => return Err(Unsupported),
    })
}

/// Writes `v` at `data`, as its C type.
///
/// # Safety
/// `data` must be writable for the attribute's C type.
unsafe fn write(data: *mut c_void, v: Value) {
    // SAFETY: the caller guarantees room for the attribute's type; C callers need not align
    // a word in a buffer, so the writes are unaligned.
    unsafe {
        match v {
            Value::Word(x) => data.cast::<usize>().write_unaligned(x as usize),
            Value::U64(x) => data.cast::<u64>().write_unaligned(x),
            Value::U32(x) => data.cast::<u32>().write_unaligned(x),
            Value::I32(x) => data.cast::<i32>().write_unaligned(x),
            Value::Bool(x) => data.cast::<u32>().write_unaligned(x as u32),
        }
    }
}

/// The zero of attribute `attr`'s C type, for memory it does not apply to.
fn zero(attr: u32) -> Value {
    match attr {
        P::MEMORY_TYPE | P::ACCESS_FLAGS => Value::U32(0),
        P::DEVICE_ORDINAL => Value::I32(0),
        P::BUFFER_ID | P::MEMORY_BLOCK_ID | P::ALLOWED_HANDLE_TYPES => Value::U64(0),
        P::SYNC_MEMOPS
        | P::IS_MANAGED
        | P::IS_LEGACY_CUDA_IPC_CAPABLE
        | P::MAPPED
        | P::IS_GPU_DIRECT_RDMA_CAPABLE
        | P::IS_HW_DECOMPRESS_CAPABLE => Value::Bool(false),
        _ => Value::Word(0),
    }
}

fn unsupported(attr: u32) -> CUresult {
    log::once(&format!("pointer attribute {attr}"), || {
        format!(
            "cuPointerGetAttribute: attribute {attr} is not answered through mps; returning \
             CUDA_ERROR_NOT_SUPPORTED"
        )
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

fn get_attribute(data: *mut c_void, attr: u32, ptr: u64) -> Res<()> {
    check(!data.is_null())?;
    match value(find(ptr)?, ptr, attr) {
        // SAFETY: checked non-null; the caller guarantees room for the attribute's type.
        Ok(v) => unsafe { write(data, v) },
        Err(Missing::NotApplicable) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        Err(Missing::Unsupported) => return Err(unsupported(attr)),
    }
    Ok(())
}

/// # Safety
/// `attrs` and `data` must hold `n` entries, each `data[i]` writable for `attrs[i]`'s type.
unsafe fn get_attributes(n: u32, attrs: *const i32, data: *const *mut c_void, ptr: u64) -> Res<()> {
    check(n > 0 && !attrs.is_null() && !data.is_null())?;
    // SAFETY: checked non-null; the caller guarantees `n` entries in each.
    let (attrs, data) = unsafe {
        (
            std::slice::from_raw_parts(attrs, n as usize),
            std::slice::from_raw_parts(data, n as usize),
        )
    };
    check(data.iter().all(|d| !d.is_null()))?;
    let memory = find(ptr)?;
    let answer = |a: i32| match value(memory, ptr, a as u32) {
        Ok(v) => Ok(v),
        Err(Missing::NotApplicable) => Ok(zero(a as u32)),
        Err(Missing::Unsupported) => Err(a as u32),
    };
    // Nothing is written unless every attribute is answered; the count is the caller's, so
    // nothing is allocated for it.
    if let Some(a) = attrs.iter().find_map(|&a| answer(a).err()) {
        return Err(unsupported(a));
    }
    for (d, &a) in data.iter().zip(attrs) {
        if let Ok(v) = answer(a) {
            // SAFETY: checked non-null; the caller guarantees room for each attribute's type.
            unsafe { write(*d, v) };
        }
    }
    Ok(())
}

/// The (base, size) of the allocation or mapping holding `ptr`.
fn address_range(ptr: u64) -> Res<(u64, u64)> {
    match find(ptr)? {
        Some(Memory::Device { base, a, .. }) => Ok((base, a.size)),
        Some(Memory::Reserved(Reserved {
            mapping: Some(m), ..
        })) => Ok((m.start, m.size)),
        _ => Err(CUresult::CUDA_ERROR_NOT_FOUND),
    }
}

// ----- the exports -----

exports! {
    /// # Safety
    /// `data` must be NULL or writable for the attribute's type.
    pub unsafe fn cuPointerGetAttribute(
        data: *mut c_void,
        attribute: u32,
        ptr: CUdeviceptr,
    ) ["cuPointerGetAttribute" 4000] = get_attribute(data, attribute, ptr);

    /// # Safety
    /// `attributes` and `data` must hold `n` entries, each `data[i]` writable for
    /// `attributes[i]`'s type.
    pub unsafe fn cuPointerGetAttributes(
        n: u32,
        attributes: *const i32,
        data: *const *mut c_void,
        ptr: CUdeviceptr,
    ) ["cuPointerGetAttributes" 7000] =
        // SAFETY: the caller's guarantee is get_attributes's precondition.
        unsafe { get_attributes(n, attributes, data, ptr) };

    /// The allocation (`cuMemAlloc`'s) or mapping (`cuMemMap`'s) holding `ptr`:
    /// CUDA_ERROR_NOT_FOUND elsewhere. Either out-pointer may be NULL.
    ///
    /// # Safety
    /// `base` and `size` must each be NULL or writable.
    pub unsafe fn cuMemGetAddressRange_v2(
        base: *mut CUdeviceptr,
        size: *mut usize,
        ptr: CUdeviceptr,
    ) ["cuMemGetAddressRange" 3020] = {
        let (b, s) = address_range(ptr)?;
        // SAFETY: each written only when non-null; the caller guarantees they are writable.
        unsafe {
            if !base.is_null() {
                base.write(b);
            }
            if !size.is_null() {
                size.write(s as usize);
            }
        }
        Ok(())
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> Option<Memory> {
        let a = Allocation {
            ctx: 0x40,
            size: 0x1000,
            id: 7,
            pool: 0,
        };
        Some(Memory::Device {
            device: 1,
            base: 0x7000,
            a,
        })
    }

    #[test]
    fn device_memory_answers_as_cuda_does() {
        let v = |attr| value(device(), 0x7010, attr);
        assert_eq!(v(P::MEMORY_TYPE), Ok(Value::U32(P::MEMORYTYPE_DEVICE)));
        assert_eq!(v(P::DEVICE_POINTER), Ok(Value::Word(0x7010)));
        assert_eq!(v(P::HOST_POINTER), Err(Missing::NotApplicable));
        assert_eq!(v(P::CONTEXT), Ok(Value::Word(0x40)));
        assert_eq!(v(P::DEVICE_ORDINAL), Ok(Value::I32(1)));
        assert_eq!(v(P::RANGE_START_ADDR), Ok(Value::Word(0x7000)));
        assert_eq!(v(P::RANGE_SIZE), Ok(Value::Word(0x1000)));
        assert_eq!(v(P::BUFFER_ID), Ok(Value::U64(7)));
        assert_eq!(v(P::IS_MANAGED), Ok(Value::Bool(false)));
        assert_eq!(v(P::P2P_TOKENS), Err(Missing::Unsupported));
        assert_eq!(v(99), Err(Missing::Unsupported));
        // Unknown memory has no attributes.
        assert_eq!(value(None, 1, P::MEMORY_TYPE), Err(Missing::NotApplicable));
    }

    #[test]
    fn a_host_buffer_answers_both_its_addresses_by_either() {
        let b = HostBuffer {
            len: 0x1000,
            ctx: 0x40,
            device: 0,
            id: 3,
            at: Some(0x9_0000),
        };
        // Asked by its device address, 0x10 into the buffer at 0x5000.
        let by_device = Some(Memory::Host {
            base: 0x5000,
            b,
            host_ptr: 0x5010,
            device_ptr: Some(0x9_0010),
        });
        let v = |attr| value(by_device, 0x9_0010, attr);
        assert_eq!(v(P::MEMORY_TYPE), Ok(Value::U32(P::MEMORYTYPE_HOST)));
        assert_eq!(v(P::HOST_POINTER), Ok(Value::Word(0x5010)));
        assert_eq!(v(P::DEVICE_POINTER), Ok(Value::Word(0x9_0010)));
        assert_eq!(v(P::RANGE_START_ADDR), Ok(Value::Word(0x5000)));
        let no_device = Some(Memory::Host {
            base: 0x5000,
            b: HostBuffer { at: None, ..b },
            host_ptr: 0x5010,
            device_ptr: None,
        });
        let v = |attr| value(no_device, 0x5010, attr);
        assert_eq!(v(P::DEVICE_POINTER), Err(Missing::NotApplicable));
    }

    #[test]
    fn reserved_memory_answers_its_range_and_whether_it_is_mapped() {
        let m = vmm::Mapped {
            start: 0x20_0000,
            size: 0x20_0000,
            access: true,
            handle_types: 1,
            id: 9,
        };
        let r = |mapping| {
            Some(Memory::Reserved(Reserved {
                device: 0,
                range: (0x20_0000, 0x100_0000),
                mapping,
            }))
        };
        let at = |mapping, attr| value(r(mapping), 0x30_0000, attr);
        assert_eq!(at(None, P::MAPPED), Ok(Value::Bool(false)));
        assert_eq!(at(None, P::RANGE_SIZE), Ok(Value::Word(0x100_0000)));
        assert_eq!(at(None, P::DEVICE_POINTER), Err(Missing::NotApplicable));
        assert_eq!(at(Some(m), P::MAPPED), Ok(Value::Bool(true)));
        assert_eq!(at(Some(m), P::DEVICE_POINTER), Ok(Value::Word(0x30_0000)));
        assert_eq!(at(Some(m), P::MAPPING_SIZE), Ok(Value::Word(0x20_0000)));
        assert_eq!(at(Some(m), P::RANGE_START_ADDR), Ok(Value::Word(0x20_0000)));
        assert_eq!(at(Some(m), P::ALLOWED_HANDLE_TYPES), Ok(Value::U64(1)));
        assert_eq!(at(Some(m), P::ACCESS_FLAGS), Ok(Value::U32(3)));
        assert_eq!(at(Some(m), P::CONTEXT), Ok(Value::Word(0)));
    }
}
