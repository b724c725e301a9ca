//! Virtual memory management (CUDA's `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`...): the
//! server reserves address space, creates physical memory and maps it, so that the clients who
//! share its address space never overlap and every byte is counted against its client.

use mps_core::Result;
use mps_core::protocol::Request;

use crate::connection::Client;
use crate::handles::DevicePtr;

/// A physical allocation of device memory (`CUmemGenericAllocationHandle`'s), valid only for
/// the client that created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhysicalMem(pub u64);

impl Client {
    /// The granularity of reservations, physical allocations and mappings on the server's
    /// device (`cuMemGetAllocationGranularity`'s minimum); `UNSUPPORTED` without VMM.
    pub fn vm_granularity(&self) -> Result<u64> {
        Ok(self.transport.call(&Request::VmGranularity)?.values[0])
    }

    /// Reserves `size` bytes of device address space on an `align` boundary (0: the
    /// granularity); both multiples of the granularity.
    pub fn vm_reserve(&self, size: u64, align: u64) -> Result<DevicePtr> {
        let v = self.transport.call(&Request::VmReserve { size, align })?;
        Ok(DevicePtr(v.values[0]))
    }

    /// Frees a reservation in which nothing is mapped any more.
    pub fn vm_free(&self, va: DevicePtr) -> Result<()> {
        self.transport.call(&Request::VmFree { va: va.0 }).map(drop)
    }

    /// Creates `size` bytes of physical device memory (a multiple of the granularity), counted
    /// against this client's device-memory limit.
    pub fn vm_create(&self, size: u64) -> Result<PhysicalMem> {
        let v = self.transport.call(&Request::VmCreate { size })?;
        Ok(PhysicalMem(v.values[0]))
    }

    /// Releases a physical allocation; its memory goes back once no mapping uses it.
    pub fn vm_release(&self, handle: PhysicalMem) -> Result<()> {
        self.transport
            .call(&Request::VmRelease { handle: handle.0 })
            .map(drop)
    }

    /// Maps `size` bytes of `handle`, from `offset`, at `va` inside one of this client's
    /// reservations. The device reaches the mapping once [`Client::vm_set_access`] allows it.
    pub fn vm_map(&self, va: DevicePtr, size: u64, handle: PhysicalMem, offset: u64) -> Result<()> {
        let req = Request::VmMap {
            va: va.0,
            size,
            handle: handle.0,
            offset,
        };
        self.transport.call(&req).map(drop)
    }

    /// Unmaps the whole mappings that make up `[va, va + size)`, after this client's pending
    /// work (as `cuMemUnmap`).
    pub fn vm_unmap(&self, va: DevicePtr, size: u64) -> Result<()> {
        self.transport
            .call(&Request::VmUnmap { va: va.0, size })
            .map(drop)
    }

    /// Lets the device read and write the mappings that make up `[va, va + size)`.
    pub fn vm_set_access(&self, va: DevicePtr, size: u64) -> Result<()> {
        self.transport
            .call(&Request::VmSetAccess { va: va.0, size })
            .map(drop)
    }

    /// The physical allocation mapped at `va` and its size, retained: it needs one more
    /// [`Client::vm_release`] (as `cuMemRetainAllocationHandle`).
    pub fn vm_retain_handle(&self, va: DevicePtr) -> Result<(PhysicalMem, u64)> {
        let v = self
            .transport
            .call(&Request::VmHandleAt { va: va.0 })?
            .values;
        Ok((PhysicalMem(v[0]), v[1]))
    }
}
