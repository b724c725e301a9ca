//! The client's virtual memory (CUDA's `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`...):
//! its reservations of device address space, its physical allocations and their mappings.
//!
//! Every client of a server shares one address space, so the server reserves (clients never
//! choose addresses). Physical allocations are charged like `cuMemAlloc`'s, against the
//! client's limit and the process's and user's sums. A mapping counts for the address checks
//! of copies, memsets and kernels once its access is set (as on a GPU, where touching a mapping
//! without access faults) and stops counting when unmapped. A handle is a server handle in the
//! client's own table, so another client's is refused. A released physical allocation lives on
//! while mapped, as CUDA's does; a retained one (`cuMemRetainAllocationHandle`) needs one more
//! release.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use mps_core::handle::{HandleKind, HandleTable};
use mps_core::{Error, Result, Status};

use super::{Answer, DONE, SessionCore};
use crate::backend::Backend;
use crate::quota::Bounds;
use crate::session::limits::exceeded;

/// A physical allocation.
#[derive(Debug)]
pub(crate) struct Physical {
    /// The backend's handle.
    phys: u64,
    size: u64,
    /// Creations and retains not yet released; usable for new mappings while above 0.
    refs: u32,
    mappings: u32,
}

/// A mapping of part of a physical allocation.
#[derive(Debug, Clone, Copy)]
struct Mapping {
    size: u64,
    handle: u64,
    /// Whether its access was set (it is then in the allocation table).
    access: bool,
}

/// The client's reservations, physical allocations and mappings.
#[derive(Debug)]
pub(crate) struct Vm {
    reservations: BTreeMap<u64, u64>,
    physical: HandleTable<Physical>,
    mappings: BTreeMap<u64, Mapping>,
    /// Bytes of `physical`, charged.
    bytes: u64,
}

impl Vm {
    pub(crate) fn new(max: usize) -> Vm {
        Vm {
            reservations: BTreeMap::new(),
            physical: HandleTable::new(HandleKind::Physical, max),
            mappings: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// Bytes of physical memory held.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The reservation that holds `[va, va + size)`.
    fn reservation_of(&self, va: u64, size: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.reservations.range(..=va).next_back()?;
        va.checked_add(size)
            .is_some_and(|end| end <= s + l)
            .then_some((s, l))
    }

    /// The mappings that make up `[va, va + size)` exactly, in order.
    fn mappings_of(&self, va: u64, size: u64) -> Result<Vec<u64>> {
        let mut at = va;
        let mut starts = Vec::new();
        let end = va.saturating_add(size);
        while at < end {
            match self.mappings.get(&at) {
                Some(m) => {
                    starts.push(at);
                    at += m.size;
                }
                None => break,
            }
        }
        if at != end || starts.is_empty() {
            return Err(Error::invalid_value(format!(
                "{va:#x}+{size} is not a range of whole mappings of this client (map it with cuMemMap first)"
            )));
        }
        Ok(starts)
    }

    /// Drops what the client held, in the order the device needs: mappings, then physical
    /// memory, then reservations; its work must be done.
    pub(crate) fn release<B: Backend>(&mut self, backend: &B) {
        for (va, m) in std::mem::take(&mut self.mappings) {
            backend.vm_unmap(va, m.size);
        }
        for (_, p) in self.physical.drain() {
            backend.vm_release(p.phys, p.size);
        }
        for (va, size) in std::mem::take(&mut self.reservations) {
            backend.vm_free(va, size);
        }
        self.bytes = 0;
    }
}

impl<B: Backend> SessionCore<B> {
    /// The device's granularity, or why the device has none.
    fn granularity(&self) -> Result<u64> {
        match self.backend.vm_granularity() {
            0 => Err(Error::new(
                Status::Unsupported,
                "the server's device does not support virtual memory management",
            )),
            g => Ok(g),
        }
    }

    /// Checks that `value` (named `what`) is a positive multiple of the granularity.
    fn granules(&self, value: u64, what: &str, may_be_zero: bool) -> Result<u64> {
        let g = self.granularity()?;
        if (value == 0 && !may_be_zero) || value % g != 0 {
            return Err(Error::invalid_value(format!(
                "{what} {value} is not a {}multiple of the allocation granularity {g} (cuMemGetAllocationGranularity)",
                if may_be_zero { "" } else { "positive " }
            )));
        }
        Ok(g)
    }

    pub(super) fn vm_granularity(&self) -> Result<Answer> {
        Ok(Answer::Values([self.granularity()?, 0, 0, 0]))
    }

    pub(super) fn vm_reserve(&mut self, size: u64, align: u64) -> Result<Answer> {
        let g = self.granules(size, "a reservation's size", false)?;
        if align != 0 && !align.is_power_of_two() {
            return Err(Error::invalid_value(format!(
                "a reservation's alignment {align} is not a power of two"
            )));
        }
        let max = self.limits.max_allocations;
        if self.vm.reservations.len() >= max {
            return Err(exceeded(
                "max_allocations",
                format!("this client already holds {max} reservations, its limit"),
            ));
        }
        let va = self.backend.vm_reserve(size, align.max(g))?;
        self.vm.reservations.insert(va, size);
        Ok(Answer::Values([va, 0, 0, 0]))
    }

    pub(super) fn vm_free(&mut self, va: u64) -> Result<Answer> {
        let Some(&size) = self.vm.reservations.get(&va) else {
            return Err(Error::invalid_value(format!(
                "{va:#x} is not the start of a reservation of this client"
            )));
        };
        if self.vm.mappings.range(va..va + size).next().is_some() {
            return Err(Error::invalid_value(format!(
                "the reservation {va:#x}+{size} still has mappings: unmap them (cuMemUnmap) first"
            )));
        }
        self.vm.reservations.remove(&va);
        self.backend.vm_free(va, size);
        DONE
    }

    pub(super) fn vm_create(&mut self, size: u64) -> Result<Answer> {
        self.granules(size, "a physical allocation's size", false)?;
        self.vm.physical.ensure_room()?;
        let bounds = Bounds {
            process_device: self.mem_limit.load(Ordering::Relaxed),
            user_device: self.limits.max_user_device_bytes,
            user_host: self.limits.max_user_host_bytes,
        };
        self.charges.device(size, &bounds)?;
        let phys = match self.backend.vm_create(size) {
            Ok(p) => p,
            Err(e) => {
                self.charges.free_device(size);
                return Err(e);
            }
        };
        let h = self.handles.next(HandleKind::Physical);
        let entry = Physical {
            phys,
            size,
            refs: 1,
            mappings: 0,
        };
        if let Err(e) = self.vm.physical.insert(h, entry) {
            self.backend.vm_release(phys, size);
            self.charges.free_device(size);
            return Err(e);
        }
        self.vm.bytes += size;
        Ok(Answer::Values([h.0, 0, 0, 0]))
    }

    /// Frees a physical allocation once nothing holds it.
    fn vm_drop_if_unused(&mut self, handle: u64) {
        let unused = self
            .vm
            .physical
            .get(handle)
            .is_ok_and(|p| p.refs == 0 && p.mappings == 0);
        if unused && let Ok(p) = self.vm.physical.remove(handle) {
            self.backend.vm_release(p.phys, p.size);
            self.charges.free_device(p.size);
            self.vm.bytes -= p.size;
        }
    }

    /// A physical allocation of this client that may be mapped or released.
    fn live_physical(&mut self, handle: u64) -> Result<&mut Physical> {
        match self.vm.physical.get_mut(handle) {
            Ok(p) if p.refs > 0 => Ok(p),
            Ok(_) => Err(Error::invalid_handle(format!(
                "physical allocation {handle:#x} was released (it lives only while mapped)"
            ))),
            Err(e) => Err(e),
        }
    }

    pub(super) fn vm_release(&mut self, handle: u64) -> Result<Answer> {
        self.live_physical(handle)?.refs -= 1;
        self.vm_drop_if_unused(handle);
        DONE
    }

    pub(super) fn vm_map(
        &mut self,
        va: u64,
        size: u64,
        handle: u64,
        offset: u64,
    ) -> Result<Answer> {
        self.granules(size, "a mapping's size", false)?;
        self.granules(offset, "a mapping's offset", true)?;
        self.granules(va, "a mapping's address", false)?;
        if self.vm.reservation_of(va, size).is_none() {
            return Err(Error::invalid_value(format!(
                "{va:#x}+{size} does not lie inside one reservation of this client (cuMemAddressReserve)"
            )));
        }
        let overlaps = self
            .vm
            .mappings
            .range(..va + size)
            .next_back()
            .is_some_and(|(s, m)| s + m.size > va);
        if overlaps {
            return Err(Error::invalid_value(format!(
                "{va:#x}+{size} overlaps a mapping already there: unmap it first"
            )));
        }
        let p = self.live_physical(handle)?;
        if offset.checked_add(size).is_none_or(|end| end > p.size) {
            return Err(Error::invalid_value(format!(
                "offset {offset} + size {size} runs past the physical allocation's {} bytes",
                p.size
            )));
        }
        let phys = p.phys;
        self.backend.vm_map(va, size, phys, offset)?;
        self.live_physical(handle)?.mappings += 1;
        let m = Mapping {
            size,
            handle,
            access: false,
        };
        self.vm.mappings.insert(va, m);
        DONE
    }

    pub(super) fn vm_set_access(&mut self, va: u64, size: u64) -> Result<Answer> {
        let starts = self.vm.mappings_of(va, size)?;
        self.backend.vm_set_access(va, size)?;
        for s in starts {
            let m = self.vm.mappings.get_mut(&s).expect("found a moment ago");
            if !m.access {
                m.access = true;
                let len = m.size;
                self.table_mapping(s, len)?;
            }
        }
        DONE
    }

    pub(super) fn vm_unmap(&mut self, va: u64, size: u64) -> Result<Answer> {
        let starts = self.vm.mappings_of(va, size)?;
        // As cuMemFree, the client's work must be done with the memory first.
        self.synchronize_all()?;
        for s in starts {
            let m = self.vm.mappings.remove(&s).expect("found a moment ago");
            if m.access {
                self.untable_mapping(s);
            }
            self.backend.vm_unmap(s, m.size);
            if let Ok(p) = self.vm.physical.get_mut(m.handle) {
                p.mappings -= 1;
            }
            self.vm_drop_if_unused(m.handle);
        }
        DONE
    }

    pub(super) fn vm_handle_at(&mut self, va: u64) -> Result<Answer> {
        let found = self
            .vm
            .mappings
            .range(..=va)
            .next_back()
            .filter(|(s, m)| va - **s < m.size)
            .map(|(_, m)| *m);
        let Some(m) = found else {
            return Err(Error::invalid_value(format!(
                "{va:#x} lies in no mapping of this client"
            )));
        };
        let p = self.vm.physical.get_mut(m.handle)?;
        p.refs += 1;
        Ok(Answer::Values([m.handle, p.size, 0, 0]))
    }
}
