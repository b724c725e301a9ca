//! Device-memory bookkeeping: the per-client allocation table that validates every pointer range
//! a client names, and the range allocator the simulator uses to carve its device memory.

use std::collections::BTreeMap;

use crate::status::{Error, Result, Status};

/// Allocation granularity: every allocation starts on this boundary (as cuMemAlloc's do).
pub const ALLOC_ALIGN: u64 = 256;

/// The device allocations one client holds: start address to size. Besides allocations, it
/// holds the client's mappings of physical memory into its reserved address ranges
/// (`cuMemMap`'s): they count for the address checks of copies, memsets and kernels, and a
/// range may run across adjacent mappings (a virtual range is contiguous however many physical
/// allocations back it), but they are not allocations: `remove` refuses them and `bytes` leaves
/// them out (the physical memory behind them is what is counted).
#[derive(Debug, Default, Clone)]
pub struct AllocTable {
    ranges: BTreeMap<u64, u64>,
    /// Starts of the ranges in `ranges` that are mappings.
    mapped: std::collections::BTreeSet<u64>,
    bytes: u64,
}

impl AllocTable {
    /// Records an allocation. Overlap with an existing one is a bug in the allocator below the
    /// table, reported as `MPS_ERROR_INTERNAL`.
    pub fn insert(&mut self, start: u64, size: u64) -> Result<()> {
        if size == 0 || start.checked_add(size).is_none() {
            return Err(Error::internal(format!(
                "allocation {start:#x}+{size} is empty or wraps"
            )));
        }
        let overlaps_prev = self
            .ranges
            .range(..=start)
            .next_back()
            .is_some_and(|(s, l)| s + l > start);
        let overlaps_next = self
            .ranges
            .range(start..)
            .next()
            .is_some_and(|(s, _)| *s < start + size);
        if overlaps_prev || overlaps_next {
            return Err(Error::internal(format!(
                "allocation {start:#x}+{size} overlaps an allocation already held"
            )));
        }
        self.ranges.insert(start, size);
        self.bytes += size;
        Ok(())
    }

    /// Records a mapping of physical memory at `[start, start + size)` (see the type's
    /// comment); overlap with anything held is `MPS_ERROR_INTERNAL`, as for `insert`.
    pub fn insert_mapped(&mut self, start: u64, size: u64) -> Result<()> {
        self.insert(start, size)?;
        self.bytes -= size;
        self.mapped.insert(start);
        Ok(())
    }

    /// Forgets the mapping that starts at `start` and returns its size.
    pub fn remove_mapped(&mut self, start: u64) -> Result<u64> {
        if !self.mapped.remove(&start) {
            return Err(Error::invalid_value(format!(
                "{start:#x} is not the start of a mapping of this client"
            )));
        }
        Ok(self.ranges.remove(&start).expect("a mapping is a range"))
    }

    /// Whether `start` is the start of a mapping.
    pub fn is_mapped(&self, start: u64) -> bool {
        self.mapped.contains(&start)
    }

    /// Forgets the allocation that starts at `start` and returns its size.
    pub fn remove(&mut self, start: u64) -> Result<u64> {
        if self.mapped.contains(&start) {
            return Err(Error::invalid_value(format!(
                "device pointer {start:#x} is a mapping of physical memory, not an allocation; unmap it with cuMemUnmap"
            )));
        }
        match self.ranges.remove(&start) {
            Some(size) => {
                self.bytes -= size;
                Ok(size)
            }
            None => Err(Error::invalid_handle(match self.find(start) {
                Some((s, _)) => format!(
                    "device pointer {start:#x} is inside the allocation at {s:#x}, not its start; free the pointer mps_mem_alloc returned"
                ),
                None => format!(
                    "device pointer {start:#x} is not an allocation of this client (already freed, or another client's)"
                ),
            })),
        }
    }

    /// The allocation that contains `addr`, as (start, size).
    pub fn find(&self, addr: u64) -> Option<(u64, u64)> {
        self.ranges
            .range(..=addr)
            .next_back()
            .filter(|(s, l)| addr - **s < **l)
            .map(|(s, l)| (*s, *l))
    }

    /// Checks that `[addr, addr + len)` lies inside one allocation of this client. `what` names the
    /// argument in the message ("destination", "source"), `status` is the error to report (a bad
    /// pointer in a call is `INVALID_HANDLE`; the simulator reports a kernel's stray access as
    /// `ILLEGAL_ADDRESS`).
    pub fn check_range(&self, addr: u64, len: u64, what: &str, status: Status) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid_value(format!(
                "{what} range at {addr:#x} is empty"
            )));
        }
        let end = addr.checked_add(len);
        match self.find(addr) {
            Some((s, l)) if end.is_some_and(|end| end <= s + l) => Ok(()),
            Some((s, l))
                if self.mapped.contains(&s)
                    && end.is_some_and(|end| self.mapped_through(s + l, end)) =>
            {
                Ok(())
            }
            Some((s, l)) => Err(Error::new(
                status,
                format!(
                    "{what} range {addr:#x}+{len} runs past the end of its allocation {s:#x}+{l}"
                ),
            )),
            None => Err(Error::new(
                status,
                format!("{what} address {addr:#x} is not inside any allocation of this client"),
            )),
        }
    }

    /// Whether mappings follow one another without a gap from `from` to at least `end`.
    fn mapped_through(&self, mut from: u64, end: u64) -> bool {
        while from < end {
            match self.ranges.get(&from) {
                Some(l) if self.mapped.contains(&from) => from += l,
                _ => return false,
            }
        }
        true
    }

    /// Bytes of the allocations held (mappings left out).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of allocations held.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Whether no allocation is held.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Every allocation, as (start, size), in address order (mappings left out).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges
            .iter()
            .filter(|(s, _)| !self.mapped.contains(s))
            .map(|(s, l)| (*s, *l))
    }
}

/// A first-fit allocator over `[base, base + size)` with coalescing of freed ranges. The
/// simulator uses it for its device memory; the CUDA backend leaves this to the driver.
#[derive(Debug)]
pub struct RangeAllocator {
    free: BTreeMap<u64, u64>,
    base: u64,
    size: u64,
    free_bytes: u64,
}

impl RangeAllocator {
    /// An allocator over `size` bytes starting at `base` (both multiples of [`ALLOC_ALIGN`]).
    pub fn new(base: u64, size: u64) -> RangeAllocator {
        debug_assert!(base % ALLOC_ALIGN == 0);
        let size = size - size % ALLOC_ALIGN;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(base, size);
        }
        RangeAllocator {
            free,
            base,
            size,
            free_bytes: size,
        }
    }

    /// Allocates `size` bytes (a multiple of `align`, itself a power of two multiple of
    /// [`ALLOC_ALIGN`]) starting on an `align` boundary: the first free range that holds it.
    pub fn alloc_aligned(&mut self, size: u64, align: u64) -> Result<u64> {
        if size == 0 || align % ALLOC_ALIGN != 0 || !align.is_power_of_two() || size % align != 0 {
            return Err(Error::invalid_value(format!(
                "cannot allocate {size} bytes aligned to {align}"
            )));
        }
        let found = self.free.iter().find_map(|(&s, &l)| {
            let at = s.checked_next_multiple_of(align)?;
            (at.checked_add(size)? <= s + l).then_some((s, l, at))
        });
        let Some((start, len, at)) = found else {
            return Err(Error::new(
                Status::OutOfMemory,
                format!(
                    "no free range of {size} bytes aligned to {align} ({} of {} bytes free, possibly fragmented)",
                    self.free_bytes, self.size
                ),
            ));
        };
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if start + len > at + size {
            self.free.insert(at + size, start + len - at - size);
        }
        self.free_bytes -= size;
        Ok(at)
    }

    /// Allocates `size` bytes (rounded up to [`ALLOC_ALIGN`]) and returns (start, rounded size).
    pub fn alloc(&mut self, size: u64) -> Result<(u64, u64)> {
        let rounded = size
            .checked_add(ALLOC_ALIGN - 1)
            .map(|s| s - s % ALLOC_ALIGN)
            .filter(|s| *s > 0)
            .ok_or_else(|| Error::invalid_value(format!("cannot allocate {size} bytes")))?;
        let found = self
            .free
            .iter()
            .find(|(_, len)| **len >= rounded)
            .map(|(s, l)| (*s, *l));
        let Some((start, len)) = found else {
            return Err(Error::new(
                Status::OutOfMemory,
                format!(
                    "no free range of {rounded} bytes ({} of {} bytes free, possibly fragmented)",
                    self.free_bytes, self.size
                ),
            ));
        };
        self.free.remove(&start);
        if len > rounded {
            self.free.insert(start + rounded, len - rounded);
        }
        self.free_bytes -= rounded;
        Ok((start, rounded))
    }

    /// Returns `[start, start + size)` (as `alloc` gave it) to the free ranges.
    pub fn free(&mut self, start: u64, size: u64) {
        debug_assert!(start >= self.base && start + size <= self.base + self.size);
        self.free_bytes += size;
        let mut start = start;
        let mut size = size;
        if let Some((&ps, &pl)) = self.free.range(..start).next_back()
            && ps + pl == start
        {
            self.free.remove(&ps);
            start = ps;
            size += pl;
        }
        if let Some(&nl) = self.free.get(&(start + size)) {
            self.free.remove(&(start + size));
            size += nl;
        }
        self.free.insert(start, size);
    }

    /// Bytes free.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Bytes managed.
    pub fn total_bytes(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_range_accepts_inside_and_rejects_everything_else() {
        let mut t = AllocTable::default();
        t.insert(0x1000, 0x100).unwrap();
        t.insert(0x2000, 0x100).unwrap();
        let ok = |a, l| t.check_range(a, l, "x", Status::InvalidHandle).is_ok();
        assert!(ok(0x1000, 0x100));
        assert!(ok(0x10ff, 1));
        assert!(ok(0x2080, 0x80));
        assert!(!ok(0x1000, 0x101), "past the end");
        assert!(!ok(0x10ff, 2));
        assert!(!ok(0x1100, 1), "gap between allocations");
        assert!(!ok(0xfff, 2), "before the first");
        assert!(!ok(0x1000, 0x1001), "spanning two allocations");
        assert!(!ok(0x1000, 0), "empty");
        assert!(!ok(u64::MAX, 2), "wrapping");
        assert!(!ok(0x2000, u64::MAX), "wrapping length");
        let e = t
            .check_range(0x3000, 4, "source", Status::IllegalAddress)
            .unwrap_err();
        assert_eq!(e.status, Status::IllegalAddress);
        assert!(e.message.contains("source address 0x3000"), "{e}");
    }

    #[test]
    fn table_rejects_overlap_and_tracks_bytes() {
        let mut t = AllocTable::default();
        t.insert(0x1000, 0x100).unwrap();
        assert!(t.insert(0x10f0, 0x10).is_err());
        assert!(t.insert(0xf80, 0x100).is_err());
        assert!(t.insert(0x1000, 0x10).is_err());
        assert!(t.insert(0x5000, 0).is_err());
        t.insert(0x1100, 0x100).unwrap();
        assert_eq!(t.bytes(), 0x200);
        let e = t.remove(0x1010).unwrap_err();
        assert!(e.message.contains("not its start"), "{e}");
        assert_eq!(t.remove(0x1000).unwrap(), 0x100);
        assert_eq!(t.remove(0x1000).unwrap_err().status, Status::InvalidHandle);
        assert_eq!(t.bytes(), 0x100);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn allocator_aligns_fills_and_coalesces() {
        let mut a = RangeAllocator::new(0x10000, 4096);
        let (p1, s1) = a.alloc(1).unwrap();
        assert_eq!((p1, s1), (0x10000, 256));
        let (p2, _) = a.alloc(1000).unwrap();
        assert_eq!(p2, 0x10100);
        let (p3, s3) = a.alloc(4096 - 256 - 1024).unwrap();
        assert_eq!(p3, 0x10500);
        assert_eq!(a.free_bytes(), 0);
        assert_eq!(a.alloc(1).unwrap_err().status, Status::OutOfMemory);
        a.free(p2, 1024);
        a.free(p1, 256);
        assert_eq!(a.free_bytes(), 1280);
        // The two freed ranges coalesced: 1280 contiguous bytes fit.
        assert_eq!(a.alloc(1280).unwrap().0, 0x10000);
        a.free(0x10000, 1280);
        a.free(p3, s3);
        assert_eq!(a.free_bytes(), 4096);
        assert_eq!(a.alloc(4096).unwrap(), (0x10000, 4096));
        assert!(a.alloc(0).is_err());
        assert!(a.alloc(u64::MAX).is_err());
    }

    #[test]
    fn allocator_survives_a_random_workload() {
        // A deterministic pseudo-random sequence of allocs and frees; the free list must always
        // add up and never hand out overlapping ranges.
        let mut a = RangeAllocator::new(0, 1 << 20);
        let mut held = AllocTable::default();
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 != 0 || live.is_empty() {
                if let Ok((p, s)) = a.alloc(x % 20000 + 1) {
                    held.insert(p, s).unwrap();
                    live.push((p, s));
                }
            } else {
                let (p, s) = live.swap_remove((x as usize / 3) % live.len());
                held.remove(p).unwrap();
                a.free(p, s);
            }
            assert_eq!(a.free_bytes() + held.bytes(), 1 << 20);
        }
    }

    #[test]
    fn a_range_may_run_across_adjacent_mappings_but_not_into_an_allocation() {
        let mut t = AllocTable::default();
        t.insert_mapped(0x10000, 0x1000).unwrap();
        t.insert_mapped(0x11000, 0x1000).unwrap();
        t.insert(0x12000, 0x1000).unwrap();
        assert_eq!(t.bytes(), 0x1000);
        assert_eq!(t.iter().collect::<Vec<_>>(), [(0x12000, 0x1000)]);
        let s = Status::InvalidHandle;
        t.check_range(0x10800, 0x1800, "dst", s).unwrap();
        assert!(t.check_range(0x10800, 0x2000, "dst", s).is_err());
        // A mapping is unmapped, not freed; an allocation is freed, not unmapped.
        assert!(
            t.remove(0x10000)
                .unwrap_err()
                .message
                .contains("cuMemUnmap")
        );
        assert!(t.remove_mapped(0x12000).is_err());
        assert_eq!(t.remove_mapped(0x11000).unwrap(), 0x1000);
        assert!(t.check_range(0x10800, 0x1000, "dst", s).is_err());
        assert!(t.is_mapped(0x10000) && !t.is_mapped(0x11000));
    }

    #[test]
    fn aligned_allocations_start_on_their_boundary_and_give_back_the_rest() {
        let mut a = RangeAllocator::new(0x1_0100, 0x10_0000);
        let p = a.alloc_aligned(0x2_0000, 0x1_0000).unwrap();
        assert_eq!(p, 0x2_0000);
        assert_eq!(a.free_bytes(), 0x10_0000 - 0x2_0000);
        assert!(
            a.alloc_aligned(0x100, 0x1_0000).is_err(),
            "size not a multiple"
        );
        let e = a.alloc_aligned(0x20_0000, 0x1_0000).unwrap_err();
        assert_eq!(e.status, Status::OutOfMemory);
        a.free(p, 0x2_0000);
        assert_eq!(a.free_bytes(), 0x10_0000);
        assert_eq!(a.alloc(0x10_0000).unwrap(), (0x1_0100, 0x10_0000));
    }
}
