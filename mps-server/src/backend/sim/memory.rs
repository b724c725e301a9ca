//! The simulator's device memory: one memory file carved by a range allocator, and an address
//! range beside it where physical allocations are mapped (CUDA's virtual memory management).
//!
//! Device addresses start at [`BASE`], so they look like GPU addresses and a host pointer passed
//! by mistake is never mistaken for one. Device address `BASE + n` is host address `host + n` of
//! one reservation of host address space, in two parts:
//! - **memory**: the first `bytes` (rounded up to the granularity) map a memfd of `bytes`
//!   read-write. `cuMemAlloc`'s allocations and physical allocations (`cuMemCreate`'s) are both
//!   ranges of it, carved by one allocator, so that both count against the device's memory.
//! - **virtual**: the rest, [`VA_FACTOR`] times the memory, is `PROT_NONE` until a physical
//!   allocation is mapped there: `vm_map` maps the memfd's pages of that allocation over the
//!   mapped range (`MAP_FIXED | MAP_SHARED`), so that the bytes at a mapped address are the
//!   physical allocation's, two mappings of one allocation alias, and an allocation unmapped and
//!   mapped elsewhere keeps its data; `vm_unmap` puts `PROT_NONE` pages back.
//!
//! Reservations are ranges of the virtual part, carved by an allocator of their own; so are
//! the device addresses of clients' host buffers, page-aligned (`map_host`: the buffer's memory
//! file mapped there, as a GPU maps page-locked host memory for the device). Nothing
//! reaches a physical allocation through its range of the memory part: no client holds it in its
//! allocation table. Pages are committed on first touch, so a large `--sim-memory` costs nothing
//! until used.
//!
//! Device memory is accessed like shared memory: only through raw pointers, never references,
//! because kernels of different streams may touch the same bytes at the same time (as they may
//! on a GPU); such races yield unspecified bytes, as they do there.

use std::collections::BTreeMap;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::lock;
use mps_core::alloc::RangeAllocator;
use mps_core::{Error, Result, Status};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, mmap_anonymous, munmap};

/// The first simulated device address.
pub const BASE: u64 = 0x7f00_0000_0000;

/// The granularity of reservations and physical allocations: 2 MiB, a GPU's.
pub const GRANULARITY: u64 = 2 << 20;

/// The page size of host buffers, and so of their device addresses.
const HOST_PAGE: u64 = 4096;

/// How many times the device's memory the address space for reservations spans (at least
/// [`MIN_VA_BYTES`]): address space is reserved beyond the memory, as on a GPU.
pub const VA_FACTOR: u64 = 4;

/// The least address space for reservations.
pub const MIN_VA_BYTES: u64 = 1 << 30;

/// Simulated device memory.
pub struct DeviceMemory {
    /// Host address of `BASE`.
    host: NonNull<u8>,
    /// Bytes of the whole host reservation.
    span: usize,
    /// Bytes of device memory (the memfd's size).
    bytes: u64,
    /// The first device address of the virtual part.
    va_base: u64,
    file: File,
    alloc: Mutex<RangeAllocator>,
    reservations: Mutex<RangeAllocator>,
    /// The mappings made in the virtual part: start to size.
    mapped: Mutex<BTreeMap<u64, u64>>,
}

// SAFETY: `host` is the start of a mapping this value owns; every access through it is by raw
// pointer into device memory, which is shared by design (see the module comment).
unsafe impl Send for DeviceMemory {}
// SAFETY: as for Send; the allocators and the mapping table are behind mutexes.
unsafe impl Sync for DeviceMemory {}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("bytes", &self.bytes)
            .finish()
    }
}

fn no_memory(what: String) -> Error {
    Error::new(Status::OutOfMemory, what)
}

impl DeviceMemory {
    /// `bytes` of simulated device memory.
    pub fn new(bytes: u64) -> Result<DeviceMemory> {
        let memory_part = bytes
            .checked_next_multiple_of(GRANULARITY)
            .filter(|b| *b > 0)
            .ok_or_else(|| Error::invalid_value(format!("{bytes} bytes of simulated memory")))?;
        let va_bytes = memory_part.saturating_mul(VA_FACTOR).max(MIN_VA_BYTES);
        let span = memory_part
            .checked_add(va_bytes)
            .and_then(|s| usize::try_from(s).ok())
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| Error::invalid_value("simulated memory size does not fit in memory"))?;
        let fd = memfd_create(c"mps-sim-device-memory", MFdFlags::MFD_CLOEXEC)
            .map_err(|e| no_memory(format!("cannot create the simulator's memory file: {e}")))?;
        let file = File::from(fd);
        file.set_len(bytes).map_err(|e| {
            no_memory(format!(
                "cannot size the simulator's memory file to {bytes} bytes: {e}"
            ))
        })?;
        // SAFETY: a fresh anonymous reservation, placed by the kernel; nothing is at risk.
        let host = unsafe {
            mmap_anonymous(
                None,
                span,
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .map_err(|e| {
            no_memory(format!(
                "cannot reserve {span} bytes of address space for simulated device memory: {e}"
            ))
        })?
        .cast::<u8>();
        let memory = DeviceMemory {
            host,
            span: span.get(),
            bytes,
            va_base: BASE + memory_part,
            file,
            alloc: Mutex::new(RangeAllocator::new(BASE, bytes)),
            reservations: Mutex::new(RangeAllocator::new(BASE + memory_part, va_bytes)),
            mapped: Mutex::new(BTreeMap::new()),
        };
        // The memory part: the whole file, read-write (dropping `memory` undoes the reservation
        // on failure).
        memory.map_file(BASE, memory_part, 0).map_err(|e| {
            no_memory(format!(
                "cannot map {bytes} bytes of simulated device memory: {e}"
            ))
        })?;
        Ok(memory)
    }

    /// The host address of device address `addr` inside the reservation.
    fn host_of(&self, addr: u64) -> NonZeroUsize {
        debug_assert!(addr >= BASE && addr - BASE < self.span as u64);
        NonZeroUsize::new(self.host.as_ptr() as usize + (addr - BASE) as usize)
            .expect("inside a mapping")
    }

    /// Maps `len` bytes of the memory file from `offset` at device address `addr`, read-write,
    /// over whatever was there.
    fn map_file(&self, addr: u64, len: u64, offset: u64) -> nix::Result<()> {
        let len = NonZeroUsize::new(len as usize).ok_or(nix::errno::Errno::EINVAL)?;
        // SAFETY: `[addr, addr + len)` lies inside this value's own reservation (the callers
        // check it), so MAP_FIXED replaces only pages of it; no reference into them exists.
        unsafe {
            mmap(
                Some(self.host_of(addr)),
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                &self.file,
                offset as i64,
            )
        }
        .map(drop)
    }

    fn allocator(&self) -> std::sync::MutexGuard<'_, RangeAllocator> {
        lock(&self.alloc)
    }

    /// Allocates `size` bytes.
    pub fn alloc(&self, size: u64) -> Result<u64> {
        let (ptr, _) = self.allocator().alloc(size)?;
        Ok(ptr)
    }

    /// Frees an allocation of `size` bytes (as asked for) at `ptr`.
    pub fn free(&self, ptr: u64, size: u64) {
        let rounded = size.next_multiple_of(mps_core::alloc::ALLOC_ALIGN);
        self.allocator().free(ptr, rounded);
    }

    /// (free, total) bytes.
    pub fn info(&self) -> (u64, u64) {
        let a = self.allocator();
        (a.free_bytes(), a.total_bytes())
    }

    /// Reserves `size` bytes of the virtual part on an `align` boundary (multiples of the
    /// granularity).
    pub fn reserve(&self, size: u64, align: u64) -> Result<u64> {
        lock(&self.reservations)
            .alloc_aligned(size, align.max(GRANULARITY))
            .map_err(|e| {
                Error::new(
                    e.status,
                    format!(
                        "cannot reserve {size} bytes of device address space: {}",
                        e.message
                    ),
                )
            })
    }

    /// Frees a reservation.
    pub fn unreserve(&self, va: u64, size: u64) {
        lock(&self.reservations).free(va, size);
    }

    /// Creates a physical allocation of `size` bytes (a multiple of the granularity): returns
    /// its range of the memory part, its handle.
    pub fn create(&self, size: u64) -> Result<u64> {
        self.allocator().alloc_aligned(size, GRANULARITY)
    }

    /// Releases a physical allocation.
    pub fn release(&self, phys: u64, size: u64) {
        self.allocator().free(phys, size);
    }

    /// Maps `size` bytes of the physical allocation `phys` from `offset` at `va`.
    pub fn map(&self, va: u64, size: u64, phys: u64, offset: u64) -> Result<()> {
        let in_virtual = va >= self.va_base
            && va % GRANULARITY == 0
            && size % GRANULARITY == 0
            && va
                .checked_add(size)
                .is_some_and(|end| end <= BASE + self.span as u64);
        let file_offset = phys - BASE + offset;
        if !in_virtual || file_offset + size > self.bytes {
            return Err(Error::internal(format!(
                "mapping {va:#x}+{size} of {phys:#x}+{offset} is outside simulated memory"
            )));
        }
        let mut mapped = lock(&self.mapped);
        self.map_file(va, size, file_offset).map_err(|e| {
            no_memory(format!(
                "cannot map {size} bytes at {va:#x} in simulated memory: {e}"
            ))
        })?;
        mapped.insert(va, size);
        Ok(())
    }

    /// Maps a host buffer (the `len` bytes, a multiple of the page size, of the memory file
    /// `fd`) into the virtual part, as a GPU maps page-locked host memory for the device, and
    /// returns its device address: kernels and copies there reach the buffer's own pages.
    pub fn map_host(&self, fd: BorrowedFd<'_>, len: u64) -> Result<u64> {
        if len == 0 || len % HOST_PAGE != 0 {
            return Err(Error::invalid_value(format!(
                "a host buffer of {len} bytes is not whole pages"
            )));
        }
        let size = len;
        // Page-aligned, as a GPU maps host memory: a small buffer takes no granule of its own.
        let va = lock(&self.reservations)
            .alloc_aligned(size, HOST_PAGE)
            .map_err(|e| {
                Error::new(
                    e.status,
                    format!(
                        "cannot find device addresses for a host buffer: {}",
                        e.message
                    ),
                )
            })?;
        let mut mapped = lock(&self.mapped);
        let pages = NonZeroUsize::new(len as usize).expect("checked above: not empty");
        // SAFETY: `[va, va + len)` is a fresh reservation inside this value's own address
        // range, so MAP_FIXED replaces only its inaccessible pages; no reference into them
        // exists.
        let r = unsafe {
            mmap(
                Some(self.host_of(va)),
                pages,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED,
                fd,
                0,
            )
        };
        if let Err(e) = r {
            drop(mapped);
            self.unreserve(va, size);
            return Err(no_memory(format!(
                "cannot map a host buffer of {len} bytes in simulated memory: {e}"
            )));
        }
        mapped.insert(va, len);
        Ok(va)
    }

    /// Undoes [`DeviceMemory::map_host`].
    pub fn unmap_host(&self, va: u64, len: u64) {
        self.unmap(va, len);
        self.unreserve(va, len);
    }

    /// Unmaps what `map` mapped at `va`.
    pub fn unmap(&self, va: u64, size: u64) {
        let mut mapped = lock(&self.mapped);
        if mapped.remove(&va) != Some(size) {
            tracing::error!("simulator: no mapping {va:#x}+{size} to unmap");
            return;
        }
        // SAFETY: `[va, va + size)` was a mapping inside this value's reservation (recorded by
        // `map`); MAP_FIXED puts inaccessible pages back over it and nothing else.
        let r = unsafe {
            mmap_anonymous(
                Some(self.host_of(va)),
                NonZeroUsize::new(size as usize).expect("mappings are not empty"),
                ProtFlags::PROT_NONE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE | MapFlags::MAP_FIXED,
            )
        };
        if let Err(e) = r {
            tracing::error!("simulator: cannot unmap {va:#x}+{size}: {e}");
        }
    }

    /// Whether `[va, va + len)` is covered by mappings without a gap.
    fn is_mapped(&self, va: u64, len: u64) -> bool {
        let mapped = lock(&self.mapped);
        let Some((&s, &l)) = mapped.range(..=va).next_back() else {
            return false;
        };
        let (mut at, end) = (s + l, va.saturating_add(len));
        if va >= at {
            return false;
        }
        while at < end {
            match mapped.get(&at) {
                Some(l) => at += l,
                None => return false,
            }
        }
        true
    }

    /// The host address of `[addr, addr + len)`, if that range lies inside simulated memory
    /// (the memory part, or mappings of the virtual part). This is the memory-safety check;
    /// whether the range belongs to the client is checked separately, against its allocation
    /// table.
    pub fn host_ptr(&self, addr: u64, len: u64) -> Result<*mut u8> {
        let inside = match (addr.checked_sub(BASE), addr.checked_add(len)) {
            (Some(_), Some(end)) if end <= BASE + self.bytes => true,
            (Some(_), Some(_)) if addr >= self.va_base => self.is_mapped(addr, len),
            _ => false,
        };
        if !inside {
            return Err(Error::new(
                Status::IllegalAddress,
                format!("address range {addr:#x}+{len} is outside device memory"),
            ));
        }
        Ok(self.host_of(addr).get() as *mut u8)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the reservation is this value's; no pointer into it outlives it (workers hold
        // the memory by Arc).
        if let Err(e) = unsafe { munmap(self.host.cast(), self.span) } {
            tracing::error!("simulator: cannot unmap its device memory: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(m: &DeviceMemory, addr: u64, bytes: &[u8]) {
        let p = m.host_ptr(addr, bytes.len() as u64).unwrap();
        // SAFETY: host_ptr checked the range lies in accessible simulated memory.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) }
    }

    fn read(m: &DeviceMemory, addr: u64, len: usize) -> Vec<u8> {
        let p = m.host_ptr(addr, len as u64).unwrap();
        // SAFETY: as in `write`.
        unsafe { std::slice::from_raw_parts(p, len) }.to_vec()
    }

    #[test]
    fn a_host_buffer_mapped_for_the_device_is_its_own_pages() {
        let m = DeviceMemory::new(8 << 20).unwrap();
        let seg = mps_ipc::segment::Segment::create("mps-test-host", 8192).unwrap();
        let va = m.map_host(seg.fd(), 8192).unwrap();
        assert!(va >= m.va_base && va % HOST_PAGE == 0, "{va:#x}");
        write(&m, va + 8190, b"dv");
        // SAFETY: the segment is mapped read-write for 8192 bytes in this process.
        let mine = unsafe { std::slice::from_raw_parts(seg.as_ptr().add(8190), 2) };
        assert_eq!(mine, b"dv");
        assert!(m.host_ptr(va + 8192, 1).is_err(), "past the buffer");
        m.unmap_host(va, 8192);
        assert!(m.host_ptr(va, 1).is_err(), "unmapped");
        // Its address space went back: the same reservation is made again.
        assert_eq!(m.map_host(seg.fd(), 8192).unwrap(), va);
        m.unmap_host(va, 8192);
    }

    #[test]
    fn a_mapping_is_its_physical_allocations_bytes() {
        let m = DeviceMemory::new(8 << 20).unwrap();
        let phys = m.create(GRANULARITY).unwrap();
        assert_eq!(m.info().0, 6 << 20, "physical memory is device memory");
        let va = m.reserve(4 * GRANULARITY, 0).unwrap();
        assert!(m.host_ptr(va, 1).is_err(), "nothing mapped yet");
        m.map(va, GRANULARITY, phys, 0).unwrap();
        m.map(va + 2 * GRANULARITY, GRANULARITY, phys, 0).unwrap();
        write(&m, va + 10, b"aliased");
        assert_eq!(read(&m, va + 2 * GRANULARITY + 10, 7), b"aliased");
        // Unmapped, then mapped elsewhere: the data stays with the allocation.
        m.unmap(va, GRANULARITY);
        m.unmap(va + 2 * GRANULARITY, GRANULARITY);
        assert!(m.host_ptr(va, 1).is_err());
        m.map(va + GRANULARITY, GRANULARITY, phys, 0).unwrap();
        assert_eq!(read(&m, va + GRANULARITY + 10, 7), b"aliased");
        // A range across a gap in the mappings is outside device memory.
        assert!(m.host_ptr(va + GRANULARITY, GRANULARITY + 1).is_err());
        m.unmap(va + GRANULARITY, GRANULARITY);
        m.release(phys, GRANULARITY);
        m.unreserve(va, 4 * GRANULARITY);
        assert_eq!(m.info().0, 8 << 20);
    }
}
