//! Device memory: allocation, the device's free memory, and the SMs the client runs on.

use mps_core::protocol::Request;
use mps_core::{Error, Result};

use crate::connection::Client;
use crate::handles::{DevicePtr, SmInfo};

impl Client {
    /// Allocates `size` bytes of device memory.
    pub fn mem_alloc(&self, size: u64) -> Result<DevicePtr> {
        if size == 0 {
            return Err(Error::invalid_value("cannot allocate 0 bytes"));
        }
        Ok(DevicePtr(
            self.transport.call(&Request::MemAlloc { size })?.values[0],
        ))
    }

    /// Frees device memory (after this client's pending work, as cuMemFree does), even after
    /// earlier work failed: that failure is left for the next call to report.
    pub fn mem_free(&self, ptr: DevicePtr) -> Result<()> {
        self.transport
            .call_leaving_deferred(&Request::MemFree { ptr: ptr.0 })
            .map(drop)
    }

    /// (free, total) device memory in bytes.
    pub fn mem_get_info(&self) -> Result<(u64, u64)> {
        let v = self.transport.call(&Request::MemGetInfo)?.values;
        Ok((v[0], v[1]))
    }

    /// The allocation of this client that holds `ptr`: its base and size in bytes (as
    /// `cuMemGetAddressRange`); `NOT_FOUND` where `ptr` lies in none.
    pub fn mem_get_address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, u64)> {
        let v = self
            .transport
            .call(&Request::MemGetAddressRange { ptr: ptr.0 })?
            .values;
        Ok((DevicePtr(v[0]), v[1]))
    }

    /// The SMs this client's kernels run on now (the server may change them as other clients
    /// come and go, or as the operator changes the share).
    pub fn sm_info(&self) -> Result<SmInfo> {
        let v = self.transport.call(&Request::SmInfo)?.values;
        Ok(SmInfo {
            sms: v[0] as u32,
            device_sms: v[1] as u32,
            share_percent: v[2] as u32,
            reserved_percent: v[3] as u32,
        })
    }
}
