//! The client's memory: device allocations, host buffers, and the host bytes copies name.

use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::Ordering;

use mps_core::alloc::AllocTable;
use mps_core::handle::HandleKind;
use mps_core::protocol::HostRef;
use mps_core::{Error, Result, Status};
use mps_ipc::segment::Segment;

use super::{Answer, DONE, SessionCore};
use crate::backend::{Backend, HostBytes};
use crate::session::limits::exceeded;
use crate::session::tables::ensure_room;

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
        let limit = self.mem_limit.load(Ordering::Relaxed);
        let held = self.allocations.bytes();
        if limit != 0 && held.checked_add(size).is_none_or(|total| total > limit) {
            return Err(Error::new(
                Status::QuotaExceeded,
                format!(
                    "allocating {size} bytes on top of the {held} this client holds would pass \
                     its device-memory limit of {limit} bytes (MPS_PINNED_DEVICE_MEM_LIMIT, or \
                     the operator's set_device_pinned_mem_limit)"
                ),
            ));
        }
        let ptr = self.backend.mem_alloc(size)?;
        if let Err(e) = self.allocations.insert(ptr, size) {
            self.backend.mem_free(ptr, size);
            return Err(e);
        }
        let shared = self.shared_allocations().insert(ptr, size);
        if let Err(e) = shared {
            let _ = self.allocations.remove(ptr);
            self.backend.mem_free(ptr, size);
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
        DONE
    }

    pub(super) fn host_free(&mut self, handle: u64) -> Result<Answer> {
        self.host.get(handle)?;
        self.synchronize_all()?;
        let seg = self.host.remove(handle)?;
        self.host_bytes -= seg.len() as u64;
        self.backend.host_unregister(&seg);
        DONE
    }

    /// Forgets a host buffer whose descriptor never reached the client.
    pub(crate) fn host_buffer_unsent(&mut self, handle: u64) {
        if let Ok(seg) = self.host.remove(handle) {
            self.host_bytes -= seg.len() as u64;
            self.backend.host_unregister(&seg);
        }
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
        let seg = Segment::create("mps-host", bytes as usize)?;
        self.backend.host_register(&seg)?;
        let h = self.handles.next(HandleKind::HostBuffer);
        let segment = Arc::new(seg);
        self.host.insert(h, segment.clone())?;
        self.host_bytes += bytes;
        Ok(Answer::HostBuffer { segment, handle: h })
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
                let seg = self.host.get(handle)?;
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
