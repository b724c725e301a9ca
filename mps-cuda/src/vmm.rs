//! CUDA's virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess`...), served by the device's server, which reserves the address ranges
//! (every client of a server shares its address space, so no client picks addresses), creates
//! the physical memory (counted against the client's memory limit, as `cuMemAlloc`'s is) and
//! maps it; the server checks every size, alignment and offset against the granularity, and
//! frees everything when the process dies.
//!
//! This library keeps its own handles (`CUmemGenericAllocationHandle`s: two devices' servers
//! may give the same handle) and a copy of each device's reservations and mappings, so that
//! pointer queries about mapped memory (`pointer`) are answered here. A reservation belongs to
//! the device of the context current when it was made (device 0 without one): memory of
//! another device cannot be mapped in it, since no server maps another's memory.
//!
//! An allocation may ask for a POSIX file descriptor as its shareable handle type (PyTorch's
//! expandable segments do, whether or not they ever share one): it is created, and its export
//! (`cuMemExportToShareableHandle`) refused. Other handle types, host memory, read-only or
//! revoked access and access from another device are refused with CUDA_ERROR_NOT_SUPPORTED (or
//! CUDA_ERROR_INVALID_DEVICE for another device), said once.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use crate::abi::vmm::{
    ACCESS_NONE, ACCESS_READ, ACCESS_READWRITE, ALLOCATION_PINNED, AccessDesc, AllocFlags,
    AllocationProp, GRANULARITY_MINIMUM, GRANULARITY_RECOMMENDED, HANDLE_POSIX_FD, Handle,
    LOCATION_DEVICE, Location,
};
use crate::abi::{CUdevice, CUdeviceptr, CUresult};
use crate::capture;
use crate::connection::Res;
use crate::context::current;
use crate::driver::{connection, driver, next_buffer_id};
use crate::ffi::{check, exports, lock, put};
use crate::log;

/// A physical allocation (`cuMemCreate`'s).
#[derive(Debug)]
struct Physical {
    device: CUdevice,
    /// The server's handle of it.
    server: u64,
    handle_types: u32,
    /// Creations and retains not yet released: it may be mapped while above 0.
    refs: u32,
    mappings: u32,
}

/// A mapping of (part of) a physical allocation.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    size: u64,
    handle: Handle,
    /// Whether the device may access it (`cuMemSetAccess`).
    access: bool,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`'s.
    id: u64,
}

/// This process's handles, and each device's reservations and mappings by (device, address).
#[derive(Debug)]
struct Tables {
    next: Handle,
    physical: BTreeMap<Handle, Physical>,
    /// (device, the server's handle) → this library's.
    by_server: BTreeMap<(CUdevice, u64), Handle>,
    reservations: BTreeMap<(CUdevice, u64), u64>,
    mappings: BTreeMap<(CUdevice, u64), Mapping>,
}

static TABLES: Mutex<Tables> = Mutex::new(Tables {
    next: 1,
    physical: BTreeMap::new(),
    by_server: BTreeMap::new(),
    reservations: BTreeMap::new(),
    mappings: BTreeMap::new(),
});

/// The entry of `map` on device `d` that holds `[va, va + len)`, with its start.
fn holding<T: Copy>(
    map: &BTreeMap<(CUdevice, u64), T>,
    d: CUdevice,
    va: u64,
    len: u64,
    size: impl Fn(&T) -> u64,
) -> Option<(u64, T)> {
    let (&(_, start), &entry) = map.range((d, 0)..=(d, va)).next_back()?;
    (va.checked_add(len)? <= start + size(&entry) && va < start + size(&entry).max(1))
        .then_some((start, entry))
}

/// The devices to look on for an address: the current context's first.
fn devices_from_here() -> Res<impl Iterator<Item = CUdevice>> {
    let count = driver()?.devices.len() as CUdevice;
    let here = here()?;
    Ok(std::iter::once(here).chain((0..count).filter(move |d| *d != here)))
}

/// The device a reservation is made on: the current context's, else device 0.
fn here() -> Res<CUdevice> {
    driver()?;
    Ok(current().map_or(0, |c| c.device))
}

impl Tables {
    /// The reservation that holds `[va, va + len)`: (device, start, size).
    fn reservation(&self, va: u64, len: u64) -> Res<Option<(CUdevice, u64, u64)>> {
        Ok(devices_from_here()?.find_map(|d| {
            holding(&self.reservations, d, va, len, |s| *s).map(|(start, size)| (d, start, size))
        }))
    }

    /// The mapping that holds `va`: (device, start, mapping).
    fn mapping(&self, va: u64) -> Res<Option<(CUdevice, u64, Mapping)>> {
        Ok(devices_from_here()?.find_map(|d| {
            holding(&self.mappings, d, va, 1, |m| m.size).map(|(start, m)| (d, start, m))
        }))
    }

    /// Forgets a physical allocation once nothing holds it (the server then freed it too).
    fn drop_if_unused(&mut self, handle: Handle) {
        if let Some(p) = self.physical.get(&handle)
            && p.refs == 0
            && p.mappings == 0
        {
            let key = (p.device, p.server);
            self.physical.remove(&handle);
            self.by_server.remove(&key);
        }
    }
}

/// Says once why `what` is refused, and refuses it with `result`.
fn refuse(what: &str, result: CUresult) -> CUresult {
    log::once(what, || {
        format!("{what} is not supported through mps; returning {result:?}")
    });
    result
}

/// The device of an allocation's properties: pinned memory on a device this process sees.
fn device_of(prop: &AllocationProp) -> Res<CUdevice> {
    check(prop.type_ == ALLOCATION_PINNED)?;
    location_of(prop)
}

/// The device of the properties' location, whatever their type (NVIDIA's driver answers a
/// granularity for an allocation type it would not create, measured on the H200).
fn location_of(prop: &AllocationProp) -> Res<CUdevice> {
    match prop.location.type_ {
        LOCATION_DEVICE => {}
        // CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA, _HOST_NUMA_CURRENT.
        2..=4 => {
            return Err(refuse(
                "host memory from cuMemCreate",
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
            ));
        }
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
    driver()?.device(prop.location.id)?;
    Ok(prop.location.id)
}

/// Reads the caller's allocation properties.
///
/// # Safety
/// `prop` must be NULL or point at a `CUmemAllocationProp`.
unsafe fn read_prop(prop: *const AllocationProp) -> Res<AllocationProp> {
    check(!prop.is_null())?;
    // SAFETY: checked non-null; the caller guarantees what it points at.
    Ok(unsafe { prop.read() })
}

fn get_granularity(out: *mut usize, prop: AllocationProp, option: u32) -> Res<()> {
    let dev = location_of(&prop)?;
    check(option == GRANULARITY_MINIMUM || option == GRANULARITY_RECOMMENDED)?;
    // The server's is the driver's minimum, which on the GPUs mps serves is the recommended one
    // too (2 MiB).
    let g = connection(dev)?.vm_granularity()?;
    // SAFETY: the caller guarantees a non-null `out` is writable.
    unsafe { put(out, g as usize) }
}

fn create(out: *mut Handle, size: usize, prop: AllocationProp, flags: u64) -> Res<()> {
    check(!out.is_null() && flags == 0)?;
    let dev = device_of(&prop)?;
    let types = prop.requested_handle_types;
    if types & !HANDLE_POSIX_FD != 0 {
        return Err(refuse(
            &format!("cuMemCreate with shareable handle types {types:#x}"),
            CUresult::CUDA_ERROR_NOT_SUPPORTED,
        ));
    }
    if types == HANDLE_POSIX_FD {
        log::detail_once("cuMemCreate POSIX", || {
            "cuMemCreate: an allocation that asks for a POSIX file descriptor handle is made, \
             but cannot be exported (cuMemExportToShareableHandle is not served)"
                .into()
        });
    }
    let server = connection(dev)?.vm_create(size as u64)?;
    let mut t = lock(&TABLES);
    let h = t.next;
    t.next += 1;
    let p = Physical {
        device: dev,
        server,
        handle_types: types,
        refs: 1,
        mappings: 0,
    };
    t.physical.insert(h, p);
    t.by_server.insert((dev, server), h);
    drop(t);
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, h) }
}

fn release(handle: Handle) -> Res<()> {
    let (dev, server) = {
        let t = lock(&TABLES);
        let p = t.physical.get(&handle).filter(|p| p.refs > 0);
        let p = p.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        (p.device, p.server)
    };
    connection(dev)?.vm_release(server)?;
    let mut t = lock(&TABLES);
    if let Some(p) = t.physical.get_mut(&handle) {
        p.refs -= 1;
    }
    t.drop_if_unused(handle);
    Ok(())
}

fn reserve(out: *mut CUdeviceptr, size: usize, align: usize, hint: u64, flags: u64) -> Res<()> {
    check(!out.is_null() && flags == 0)?;
    if hint != 0 {
        log::detail_once("cuMemAddressReserve hint", || {
            "cuMemAddressReserve: the server picks every address; the hint is not followed".into()
        });
    }
    let dev = here()?;
    let va = connection(dev)?.vm_reserve(size as u64, align as u64)?;
    lock(&TABLES).reservations.insert((dev, va), size as u64);
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, va) }
}

fn address_free(va: u64, size: usize) -> Res<()> {
    let dev = {
        let t = lock(&TABLES);
        devices_from_here()?
            .find(|d| t.reservations.get(&(*d, va)) == Some(&(size as u64)))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
    };
    connection(dev)?.vm_free(va)?;
    lock(&TABLES).reservations.remove(&(dev, va));
    Ok(())
}

fn map(va: u64, size: usize, offset: usize, handle: Handle, flags: u64) -> Res<()> {
    check(flags == 0)?;
    let (dev, server) = {
        let t = lock(&TABLES);
        let p = t.physical.get(&handle).filter(|p| p.refs > 0);
        let p = p.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let (rdev, ..) = t
            .reservation(va, size as u64)?
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        if rdev != p.device {
            return Err(refuse(
                "cuMemMap of one device's memory in a range reserved while another device's \
                 context was current",
                CUresult::CUDA_ERROR_INVALID_VALUE,
            ));
        }
        (p.device, p.server)
    };
    // CUDA documents that the offset must be 0 for now; NVIDIA's driver answers a nonzero one,
    // and an address off the granularity, with CUDA_ERROR_NOT_SUPPORTED (measured on the H200).
    let conn = connection(dev)?;
    if offset != 0 || va % conn.vm_granularity()? != 0 {
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    conn.vm_map(va, size as u64, server, offset as u64)?;
    let mut t = lock(&TABLES);
    let m = Mapping {
        size: size as u64,
        handle,
        access: false,
        id: next_buffer_id(),
    };
    t.mappings.insert((dev, va), m);
    if let Some(p) = t.physical.get_mut(&handle) {
        p.mappings += 1;
    }
    Ok(())
}

/// The device of the reservation holding `[va, va + size)`.
fn reserved_on(va: u64, size: u64) -> Res<CUdevice> {
    let t = lock(&TABLES);
    let (dev, ..) = t
        .reservation(va, size)?
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    Ok(dev)
}

fn unmap(va: u64, size: usize) -> Res<()> {
    let dev = reserved_on(va, size as u64)?;
    let conn = connection(dev)?;
    // Unmapping waits for the device, as freeing does: not while a stream there captures.
    capture::free_call(conn, "cuMemUnmap")?;
    conn.vm_unmap(va, size as u64)?;
    let mut t = lock(&TABLES);
    let gone: Vec<(CUdevice, u64)> = t
        .mappings
        .range((dev, va)..(dev, va + size as u64))
        .map(|(k, _)| *k)
        .collect();
    for k in gone {
        let Some(m) = t.mappings.remove(&k) else {
            continue;
        };
        if let Some(p) = t.physical.get_mut(&m.handle) {
            p.mappings -= 1;
        }
        t.drop_if_unused(m.handle);
    }
    Ok(())
}

fn set_access(va: u64, size: usize, descs: &[AccessDesc]) -> Res<()> {
    check(!descs.is_empty())?;
    let dev = reserved_on(va, size as u64)?;
    let d = driver()?;
    let mut grant = false;
    for desc in descs {
        check(desc.location.type_ == LOCATION_DEVICE)?;
        d.device(desc.location.id)?;
        match desc.flags {
            ACCESS_READWRITE if desc.location.id == dev => grant = true,
            ACCESS_NONE if desc.location.id != dev => {}
            ACCESS_READWRITE => {
                return Err(refuse(
                    "cuMemSetAccess for a device other than the memory's own",
                    CUresult::CUDA_ERROR_INVALID_DEVICE,
                ));
            }
            ACCESS_READ | ACCESS_NONE => {
                return Err(refuse(
                    "cuMemSetAccess with read-only or no access",
                    CUresult::CUDA_ERROR_NOT_SUPPORTED,
                ));
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }
    if !grant {
        return Ok(());
    }
    connection(dev)?.vm_set_access(va, size as u64)?;
    let mut t = lock(&TABLES);
    for (_, m) in t.mappings.range_mut((dev, va)..(dev, va + size as u64)) {
        m.access = true;
    }
    Ok(())
}

fn get_access(out: *mut u64, location: *const Location, va: u64) -> Res<()> {
    check(!out.is_null() && !location.is_null())?;
    // SAFETY: checked non-null; the caller guarantees it points at a CUmemLocation.
    let loc = unsafe { location.read() };
    check(loc.type_ == LOCATION_DEVICE)?;
    driver()?.device(loc.id)?;
    let (dev, _, m) = lock(&TABLES)
        .mapping(va)?
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let flags = if loc.id == dev && m.access {
        ACCESS_READWRITE
    } else {
        ACCESS_NONE
    };
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, flags as u64) }
}

fn retain(out: *mut Handle, addr: *mut c_void) -> Res<()> {
    check(!out.is_null())?;
    let va = addr as u64;
    let (dev, ..) = lock(&TABLES)
        .mapping(va)?
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let conn = connection(dev)?;
    let server = conn.vm_retain_handle(va)?;
    let mut t = lock(&TABLES);
    let Some(&h) = t.by_server.get(&(dev, server)) else {
        // Not one of this library's: give the server its reference back.
        drop(t);
        let _ = conn.vm_release(server);
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    };
    if let Some(p) = t.physical.get_mut(&h) {
        p.refs += 1;
    }
    drop(t);
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, h) }
}

fn properties(out: *mut AllocationProp, handle: Handle) -> Res<()> {
    let prop = {
        let t = lock(&TABLES);
        let p = t
            .physical
            .get(&handle)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        AllocationProp {
            type_: ALLOCATION_PINNED,
            requested_handle_types: p.handle_types,
            location: Location {
                type_: LOCATION_DEVICE,
                id: p.device,
            },
            win32_handle_meta_data: std::ptr::null_mut(),
            // Neither compression nor GPUDirect RDMA is granted.
            alloc_flags: AllocFlags::default(),
        }
    };
    // SAFETY: the caller guarantees a non-null `out` is writable.
    unsafe { put(out, prop) }
}

/// What this library knows of a device address in a reservation, for pointer queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reserved {
    pub(crate) device: CUdevice,
    /// The reservation: start and size.
    pub(crate) range: (u64, u64),
    /// The mapping there, if any.
    pub(crate) mapping: Option<Mapped>,
}

/// A mapping, for pointer queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mapped {
    pub(crate) start: u64,
    pub(crate) size: u64,
    pub(crate) access: bool,
    /// Its physical allocation's shareable handle types.
    pub(crate) handle_types: u32,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`'s.
    pub(crate) id: u64,
}

/// The reservation holding `va`, if any, and its mapping there.
pub(crate) fn reserved(va: u64) -> Res<Option<Reserved>> {
    let t = lock(&TABLES);
    let Some((device, start, size)) = t.reservation(va, 1)? else {
        return Ok(None);
    };
    let mapping = holding(&t.mappings, device, va, 1, |m| m.size).map(|(s, m)| Mapped {
        start: s,
        size: m.size,
        access: m.access,
        handle_types: t.physical.get(&m.handle).map_or(0, |p| p.handle_types),
        id: m.id,
    });
    Ok(Some(Reserved {
        device,
        range: (start, size),
        mapping,
    }))
}

// ----- the exports -----

exports! {
    /// # Safety
    /// `granularity` must be NULL or writable; `prop` NULL or a `CUmemAllocationProp`.
    pub unsafe fn cuMemGetAllocationGranularity(
        granularity: *mut usize,
        prop: *const AllocationProp,
        option: u32,
    ) ["cuMemGetAllocationGranularity" 10020] = {
        check(!granularity.is_null())?;
        // SAFETY: the caller's guarantee is read_prop's precondition.
        get_granularity(granularity, unsafe { read_prop(prop) }?, option)
    };

    /// # Safety
    /// `handle` must be NULL or writable; `prop` NULL or a `CUmemAllocationProp`.
    pub unsafe fn cuMemCreate(
        handle: *mut Handle,
        size: usize,
        prop: *const AllocationProp,
        flags: u64,
    ) ["cuMemCreate" 10020] =
        // SAFETY: the caller's guarantee is read_prop's precondition.
        create(handle, size, unsafe { read_prop(prop) }?, flags);

    pub fn cuMemRelease(handle: Handle) ["cuMemRelease" 10020] = release(handle);

    /// # Safety
    /// `ptr` must be NULL or writable.
    pub unsafe fn cuMemAddressReserve(
        ptr: *mut CUdeviceptr,
        size: usize,
        alignment: usize,
        addr: CUdeviceptr,
        flags: u64,
    ) ["cuMemAddressReserve" 10020] = reserve(ptr, size, alignment, addr, flags);

    pub fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) ["cuMemAddressFree" 10020] =
        address_free(ptr, size);

    pub fn cuMemMap(
        ptr: CUdeviceptr,
        size: usize,
        offset: usize,
        handle: Handle,
        flags: u64,
    ) ["cuMemMap" 10020] = map(ptr, size, offset, handle, flags);

    /// Unmaps once this process's work on the device is done with the memory (refused while a
    /// stream of the device captures, as `cuMemFree` is).
    pub fn cuMemUnmap(ptr: CUdeviceptr, size: usize) ["cuMemUnmap" 10020] = unmap(ptr, size);

    /// # Safety
    /// `desc` must be NULL or point at `count` `CUmemAccessDesc`s.
    pub unsafe fn cuMemSetAccess(
        ptr: CUdeviceptr,
        size: usize,
        desc: *const AccessDesc,
        count: usize,
    ) ["cuMemSetAccess" 10020] = {
        check(!desc.is_null() && count > 0)?;
        // SAFETY: checked non-null; the caller guarantees `count` descriptors there.
        let descs = unsafe { std::slice::from_raw_parts(desc, count) };
        set_access(ptr, size, descs)
    };

    /// # Safety
    /// `flags` must be NULL or writable; `location` NULL or a `CUmemLocation`.
    pub unsafe fn cuMemGetAccess(
        flags: *mut u64,
        location: *const Location,
        ptr: CUdeviceptr,
    ) ["cuMemGetAccess" 10020] = get_access(flags, location, ptr);

    /// # Safety
    /// `handle` must be NULL or writable.
    pub unsafe fn cuMemRetainAllocationHandle(
        handle: *mut Handle,
        addr: *mut c_void,
    ) ["cuMemRetainAllocationHandle" 11000] = retain(handle, addr);

    /// # Safety
    /// `prop` must be NULL or writable.
    pub unsafe fn cuMemGetAllocationPropertiesFromHandle(
        prop: *mut AllocationProp,
        handle: Handle,
    ) ["cuMemGetAllocationPropertiesFromHandle" 10020] = properties(prop, handle);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_held_by_the_entry_it_lies_in_on_its_device() {
        let mut m = BTreeMap::new();
        m.insert((0, 0x1000), 0x1000u64);
        m.insert((1, 0x1000), 0x3000u64);
        let at = |d, va, len| holding(&m, d, va, len, |s| *s).map(|(s, _)| s);
        assert_eq!(at(0, 0x1000, 1), Some(0x1000));
        assert_eq!(at(0, 0x1fff, 1), Some(0x1000));
        assert_eq!(at(0, 0x1000, 0x1000), Some(0x1000));
        // Past its end on device 0, inside device 1's.
        assert_eq!(at(0, 0x2000, 1), None);
        assert_eq!(at(1, 0x2000, 1), Some(0x1000));
        assert_eq!(at(0, 0x1800, 0x1000), None);
        assert_eq!(at(0, 0xfff, 1), None);
        assert_eq!(at(0, u64::MAX, 2), None);
    }
}
