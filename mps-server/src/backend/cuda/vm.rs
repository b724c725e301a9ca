//! CUDA's virtual memory management for the server's clients: reservations of device address
//! space, physical allocations pinned on the server's device, their mappings and access.
//!
//! The session checked every size, alignment, offset and handle against the client's own
//! tables; what is left here is the driver's calls, made in the server's one context, so that
//! every client's reservation is a range of the one address space they share. Physical
//! allocations ask for no shareable handle type: clients reach them only through the server.

use cudarc::driver::sys::{self, CUmemAccessDesc, CUmemAllocationProp, CUmemLocation};
use mps_core::Result;
use mps_driver::{check, check_on, released};

use super::context::Context;

/// The server's device as a `CUmemLocation`.
fn location(ordinal: i32) -> CUmemLocation {
    CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal,
    }
}

/// Pinned device memory on the server's device, with no shareable handle.
fn properties(ordinal: i32) -> CUmemAllocationProp {
    // SAFETY: a plain C struct for which all zeroes is valid (no handle types, no flags).
    let mut prop: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    prop.location = location(ordinal);
    prop
}

/// The driver's minimum granularity for the server's device (`None` where the driver refuses:
/// a device or driver without VMM).
pub(super) fn granularity(ordinal: i32) -> Option<u64> {
    let prop = properties(ordinal);
    let mut g = 0usize;
    // SAFETY: `g` and `prop` are valid for the call.
    let r = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    match check(r, "cuMemGetAllocationGranularity") {
        Ok(()) if g.is_power_of_two() => Some(g as u64),
        Ok(()) => {
            tracing::warn!("the driver's allocation granularity {g} is not a power of two");
            None
        }
        Err(e) => {
            tracing::warn!("virtual memory management is unavailable: {e}");
            None
        }
    }
}

pub(super) fn reserve(ctx: &Context, size: u64, align: u64) -> Result<u64> {
    ctx.enter()?;
    let mut va = 0;
    // SAFETY: `va` is writable; the driver picks the address (hint 0) and checks the sizes.
    let r = unsafe { sys::cuMemAddressReserve(&mut va, size as usize, align as usize, 0, 0) };
    ctx.check(check_on(r, "cuMemAddressReserve", || {
        format!("{size} bytes aligned to {align}")
    }))?;
    Ok(va)
}

pub(super) fn free(ctx: &Context, va: u64, size: u64) {
    ctx.bind();
    // SAFETY: `[va, va + size)` is a reservation of `reserve` in which nothing is mapped.
    released(check(
        unsafe { sys::cuMemAddressFree(va, size as usize) },
        "cuMemAddressFree",
    ));
}

pub(super) fn create(ctx: &Context, ordinal: i32, size: u64) -> Result<u64> {
    ctx.enter()?;
    let prop = properties(ordinal);
    let mut handle = 0;
    // SAFETY: `handle` and `prop` are valid for the call.
    let r = unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) };
    ctx.check(check_on(r, "cuMemCreate", || format!("{size} bytes")))?;
    Ok(handle)
}

pub(super) fn release(ctx: &Context, phys: u64) {
    ctx.bind();
    // SAFETY: `phys` came from `create`, and no mapping uses it.
    released(check(unsafe { sys::cuMemRelease(phys) }, "cuMemRelease"));
}

pub(super) fn map(ctx: &Context, va: u64, size: u64, phys: u64, offset: u64) -> Result<()> {
    ctx.enter()?;
    // SAFETY: the session checked that `[va, va + size)` lies in a reservation of this client
    // where nothing is mapped, and `[offset, offset + size)` in the allocation `phys`.
    let r = unsafe { sys::cuMemMap(va, size as usize, offset as usize, phys, 0) };
    ctx.check(check_on(r, "cuMemMap", || {
        format!("{size} bytes at {va:#x} from offset {offset}")
    }))
}

pub(super) fn unmap(ctx: &Context, va: u64, size: u64) {
    ctx.bind();
    // SAFETY: one mapping made by `map`, which the session ensured no work uses.
    released(check(
        unsafe { sys::cuMemUnmap(va, size as usize) },
        "cuMemUnmap",
    ));
}

pub(super) fn set_access(ctx: &Context, ordinal: i32, va: u64, size: u64) -> Result<()> {
    ctx.enter()?;
    let desc = CUmemAccessDesc {
        location: location(ordinal),
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `desc` is one valid descriptor; the session checked the range is mapped.
    let r = unsafe { sys::cuMemSetAccess(va, size as usize, &desc, 1) };
    ctx.check(check_on(r, "cuMemSetAccess", || {
        format!("{size} bytes at {va:#x}")
    }))
}
