//! Host memory registered with the device: shared segments (client host buffers, staging areas,
//! server segments) page-locked and mapped, so that copies DMA straight from and to the
//! client's pages and the GPU can write a client's progress itself.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::driver::sys;
use mps_core::{Error, Result};
use mps_ipc::segment::Segment;

use super::context::Context;
use mps_driver::{check, check_on, released};

/// The registered segments: host base address → (length, device address).
#[derive(Default)]
pub(super) struct Registrations(Mutex<BTreeMap<usize, (usize, u64)>>);

impl Registrations {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, (usize, u64)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Page-locks and maps `segment` until [`Registrations::unregister`].
    pub(super) fn register(&self, ctx: &Context, segment: &Segment) -> Result<()> {
        let ptr = segment.as_ptr() as *mut c_void;
        let len = segment.len();
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the segment is mapped read-write in this process for `len` bytes and stays
        // mapped until unregister.
        let r = unsafe { sys::cuMemHostRegister_v2(ptr, len, flags) };
        ctx.check(check_on(r, "cuMemHostRegister", || {
            format!("{len} bytes at {ptr:p}")
        }))?;
        let mut dev = 0;
        // SAFETY: ptr was just registered with DEVICEMAP.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr, 0) };
        let mapped = check_on(r, "cuMemHostGetDevicePointer", || format!("{ptr:p}"));
        if let Err(e) = ctx.check(mapped) {
            // SAFETY: undoes the registration above.
            released(check(
                unsafe { sys::cuMemHostUnregister(ptr) },
                "cuMemHostUnregister",
            ));
            return Err(e);
        }
        self.lock().insert(ptr as usize, (len, dev));
        Ok(())
    }

    /// Undoes [`Registrations::register`]; call once no pending copy uses the segment.
    pub(super) fn unregister(&self, segment: &Segment) {
        let ptr = segment.as_ptr();
        if self.lock().remove(&(ptr as usize)).is_some() {
            // SAFETY: registered by register; no pending copy uses it (the session
            // synchronised first).
            let r = unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
            released(check(r, "cuMemHostUnregister"));
        }
    }

    /// The device address of a host address inside a registered segment.
    pub(super) fn device_address(&self, host: *const u8) -> Result<u64> {
        let addr = host as usize;
        self.lock()
            .range(..=addr)
            .next_back()
            .filter(|(base, (len, _))| addr - **base < *len)
            .map(|(base, (_, dev))| dev + (addr - base) as u64)
            .ok_or_else(|| Error::internal(format!("{host:p} is not in a registered host segment")))
    }
}
