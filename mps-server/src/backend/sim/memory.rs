//! The simulator's device memory: one anonymous mapping carved by a range allocator.
//!
//! Device addresses start at [`BASE`], so they look like GPU addresses and a host pointer passed
//! by mistake is never mistaken for one. Pages are committed on first touch, so a large
//! `--sim-memory` costs nothing until used.
//!
//! Device memory is accessed like shared memory: only through raw pointers, never references,
//! because kernels of different streams may touch the same bytes at the same time (as they may
//! on a GPU); such races yield unspecified bytes, as they do there.

use std::sync::Mutex;

use memmap2::MmapMut;
use mps_core::alloc::RangeAllocator;
use mps_core::{Error, Result, Status};

/// The first simulated device address.
pub const BASE: u64 = 0x7f00_0000_0000;

/// Simulated device memory.
pub struct DeviceMemory {
    map: MmapMut,
    alloc: Mutex<RangeAllocator>,
}

impl std::fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("bytes", &self.map.len())
            .finish()
    }
}

impl DeviceMemory {
    /// `bytes` of simulated device memory.
    pub fn new(bytes: u64) -> Result<DeviceMemory> {
        let len = usize::try_from(bytes)
            .map_err(|_| Error::invalid_value("simulated memory size does not fit in memory"))?;
        let map = MmapMut::map_anon(len).map_err(|e| {
            Error::new(
                Status::OutOfMemory,
                format!("cannot reserve {bytes} bytes of simulated device memory: {e}"),
            )
        })?;
        Ok(DeviceMemory {
            map,
            alloc: Mutex::new(RangeAllocator::new(BASE, bytes)),
        })
    }

    fn allocator(&self) -> std::sync::MutexGuard<'_, RangeAllocator> {
        self.alloc.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The host address of `[addr, addr + len)`, if that range lies inside simulated memory.
    /// This is the memory-safety check; whether the range belongs to the client is checked
    /// separately, against its allocation table.
    pub fn host_ptr(&self, addr: u64, len: u64) -> Result<*mut u8> {
        let off = addr.checked_sub(BASE);
        match off {
            Some(off)
                if off
                    .checked_add(len)
                    .is_some_and(|e| e <= self.map.len() as u64) =>
            {
                // SAFETY: off + len <= the mapping's length (checked just above).
                Ok(unsafe { (self.map.as_ptr() as *mut u8).add(off as usize) })
            }
            _ => Err(Error::new(
                Status::IllegalAddress,
                format!("address range {addr:#x}+{len} is outside device memory"),
            )),
        }
    }
}
