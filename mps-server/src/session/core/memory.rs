//! The client's memory: device allocations, host buffers, and the host bytes copies name.

use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::Ordering;

use mps_core::alloc::{ALLOC_ALIGN, AllocTable};
use mps_core::handle::HandleKind;
use mps_core::protocol::HostRef;
use mps_core::{Error, Result, Status};
use mps_ipc::segment::Segment;

use super::{Answer, DONE, SessionCore};
use crate::backend::{Backend, HostBytes};
use crate::quota::Bounds;
use crate::session::limits::exceeded;
use crate::session::tables::ensure_room;

/// A client's host buffer: its segment, registered for the device, and the device address at
/// which kernels and copies reach it.
#[derive(Debug)]
pub(crate) struct HostBuffer {
    pub(crate) segment: Arc<Segment>,
    pub(crate) device: u64,
}

impl HostBuffer {
    /// Unmaps and unregisters it; no work may use it any more.
    pub(crate) fn release<B: Backend>(self, backend: &B) {
        backend.host_unmap(self.device, self.segment.len() as u64);
        backend.host_unregister(&self.segment);
    }
}

/// What an allocation of `size` bytes takes of the device: whole granules of the allocator
/// (the simulator's, and the alignment cuMemAlloc gives). A size that cannot be rounded is
/// past every limit and every device.
fn charged(size: u64) -> u64 {
    size.checked_next_multiple_of(ALLOC_ALIGN)
        .unwrap_or(u64::MAX)
}

impl<B: Backend> SessionCore<B> {
    pub(super) fn check_device(&self, addr: u64, len: u64, what: &str) -> Result<()> {
        self.allocations
            .check_range(addr, len, what, Status::InvalidHandle)
    }

    pub(super) fn shared_allocations(&self) -> std::sync::RwLockWriteGuard<'_, AllocTable> {
        write(&self.ctx.allocations)
    }

    pub(super) fn mem_alloc(&mut self, size: u64) -> Result<Answer> {
        if size == 0 {
            return Err(Error::invalid_value("cannot allocate 0 bytes"));
        }
        let max = self.limits.max_allocations;
        if self.allocations.len() >= max {
            return Err(exceeded(
                "max_allocations",
                format!("this client already holds {max} device allocations, its limit"),
            ));
        }
        // Counted as the allocation takes it: a 1-byte allocation holds a granule of the device.
        let takes = charged(size);
        let bounds = Bounds {
            process_device: self.mem_limit.load(Ordering::Relaxed),
            user_device: self.limits.max_user_device_bytes,
            user_host: self.limits.max_user_host_bytes,
        };
        self.charges.device(takes, &bounds)?;
        let ptr = match self.backend.mem_alloc(size) {
            Ok(ptr) => ptr,
            Err(e) => {
                self.charges.free_device(takes);
                return Err(e);
            }
        };
        let undo = |this: &mut Self| {
            this.backend.mem_free(ptr, size);
            this.charges.free_device(takes);
        };
        if let Err(e) = self.allocations.insert(ptr, size) {
            undo(self);
            return Err(e);
        }
        let shared = self.shared_allocations().insert(ptr, size);
        if let Err(e) = shared {
            let _ = self.allocations.remove(ptr);
            undo(self);
            return Err(e);
        }
        Ok(Answer::Values([ptr, 0, 0, 0]))
    }

    pub(super) fn mem_free(&mut self, ptr: u64) -> Result<Answer> {
        // Fail early (before synchronising) on a pointer that is not an allocation's start.
        let size = match self.allocations.find(ptr) {
            Some((start, size)) if start == ptr => size,
            _ => {
                return Err(self
                    .allocations
                    .remove(ptr)
                    .expect_err("pointer was not found a moment ago"));
            }
        };
        self.synchronize_all()?;
        self.allocations.remove(ptr)?;
        let _ = self.shared_allocations().remove(ptr);
        self.backend.mem_free(ptr, size);
        self.charges.free_device(charged(size));
        DONE
    }

    pub(super) fn host_free(&mut self, handle: u64) -> Result<Answer> {
        self.host.get(handle)?;
        self.synchronize_all()?;
        let b = self.host.remove(handle)?;
        self.forget_host_buffer(b);
        DONE
    }

    /// Forgets a host buffer whose descriptor never reached the client.
    pub(crate) fn host_buffer_unsent(&mut self, handle: u64) {
        if let Ok(b) = self.host.remove(handle) {
            self.forget_host_buffer(b);
        }
    }

    /// Adds a mapping (of physical memory, of a host buffer, a module global) at `start` to the
    /// client's ranges, in its own table and the one shared with the workers, or to neither.
    pub(super) fn table_mapping(&mut self, start: u64, len: u64) -> Result<()> {
        self.allocations.insert_mapped(start, len)?;
        let shared = self.shared_allocations().insert_mapped(start, len);
        if shared.is_err() {
            let _ = self.allocations.remove_mapped(start);
        }
        shared
    }

    /// Takes the mapping at `start` out of both tables of the client's ranges.
    pub(super) fn untable_mapping(&mut self, start: u64) {
        let _ = self.allocations.remove_mapped(start);
        let _ = self.shared_allocations().remove_mapped(start);
    }

    /// Gives back a host buffer taken out of the table, which no work uses any more.
    fn forget_host_buffer(&mut self, b: HostBuffer) {
        let len = b.segment.len() as u64;
        self.host_bytes -= len;
        self.charges.free_host(len);
        self.untable_mapping(b.device);
        b.release(&*self.backend);
    }

    pub(super) fn host_alloc(&mut self, size: u64) -> Result<Answer> {
        if size == 0 {
            return Err(Error::invalid_value("cannot allocate a 0-byte host buffer"));
        }
        ensure_room(
            &self.host,
            HandleKind::HostBuffer,
            "max_host_buffers",
            self.limits.max_host_buffers,
        )?;
        let max = self.limits.max_host_bytes;
        let bytes = size
            .checked_next_multiple_of(4096)
            .filter(|b| self.host_bytes.checked_add(*b).is_some_and(|t| t <= max))
            .ok_or_else(|| {
                exceeded(
                    "max_host_bytes",
                    format!(
                        "a host buffer of {size} bytes on top of the {} this client's host \
                         buffers hold would pass its limit of {max} bytes",
                        self.host_bytes
                    ),
                )
            })?;
        let bounds = Bounds {
            process_device: 0,
            user_device: 0,
            user_host: self.limits.max_user_host_bytes,
        };
        self.charges.host(bytes, &bounds)?;
        let made = Segment::create("mps-host", bytes as usize).and_then(|seg| {
            self.backend.host_register(&seg)?;
            match self.backend.host_map(&seg) {
                Ok(device) => Ok((seg, device)),
                Err(e) => {
                    self.backend.host_unregister(&seg);
                    Err(e)
                }
            }
        });
        let (seg, device) = match made {
            Ok(made) => made,
            Err(e) => {
                self.charges.free_host(bytes);
                return Err(e);
            }
        };
        let b = HostBuffer {
            segment: Arc::new(seg),
            device,
        };
        // Kernels and copies may name the buffer by its device address, as the client's.
        if let Err(e) = self.table_mapping(device, bytes) {
            b.release(&*self.backend);
            self.charges.free_host(bytes);
            return Err(e);
        }
        let h = self.handles.next(HandleKind::HostBuffer);
        let segment = b.segment.clone();
        if let Err(e) = self.host.insert(h, b) {
            self.untable_mapping(device);
            HostBuffer { segment, device }.release(&*self.backend);
            self.charges.free_host(bytes);
            return Err(e);
        }
        self.host_bytes += bytes;
        Ok(Answer::HostBuffer {
            segment,
            handle: h,
            device,
        })
    }

    /// Host bytes named by a copy. The staging area's bytes are taken now for a host-to-device
    /// copy (`take`), so the client may reuse the staging area as soon as the reply arrives.
    pub(super) fn host_bytes(&self, r: HostRef, len: u64, take: bool) -> Result<HostBytes> {
        let (segment, base, limit, offset, what) = match r {
            HostRef::Staging { offset } => {
                let (ptr, staging_len) = self.channel.staging();
                let seg = self.channel.client_segment();
                let base = ptr as usize - seg.as_ptr() as usize;
                (seg, base, staging_len, offset, "staging area")
            }
            HostRef::Buffer { handle, offset } => {
                let seg = &self.host.get(handle)?.segment;
                (seg, 0, seg.len(), offset, "host buffer")
            }
        };
        if offset.checked_add(len).is_none_or(|e| e > limit as u64) {
            return Err(Error::invalid_value(format!(
                "host range {offset}+{len} runs past the end of its {limit}-byte {what}"
            )));
        }
        let at = base + offset as usize;
        if take {
            let mut copy = vec![0u8; len as usize].into_boxed_slice();
            // SAFETY: at + len lies inside the segment (checked above); the client may be
            // writing these bytes concurrently, which can only change what we copy.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    segment.as_ptr().add(at),
                    copy.as_mut_ptr(),
                    copy.len(),
                )
            };
            return Ok(HostBytes::Owned(copy));
        }
        Ok(HostBytes::Shared {
            segment: segment.clone(),
            offset: at,
            len: len as usize,
        })
    }
}

pub(super) fn write(table: &RwLock<AllocTable>) -> std::sync::RwLockWriteGuard<'_, AllocTable> {
    table.write().unwrap_or_else(|p| p.into_inner())
}
