//! Copies between host and device, and the host buffers that make them direct.
//!
//! From or into a host buffer of [`Client::host_alloc`] (pages the server maps too) a copy is
//! one command, ordered in its stream. Other (pageable) host memory goes through the staging
//! area in two halves, one being filled or drained while the other's copy runs.

use mps_core::handshake::HostBufferFd;
use mps_core::protocol::{DeviceCopy, Fill, HostRef, Request, flags};
use mps_core::{Error, Result};
use mps_ipc::segment::Segment;
use mps_ipc::socket;

use crate::connection::Client;
use crate::handles::{DevicePtr, Stream};
use crate::host::HostMapping;
use crate::transport::{lock, lost};

impl Client {
    /// Allocates a host buffer shared with the server: copies from and to it are fully
    /// asynchronous and need no staging. Returns its address in this process: its device
    /// address too ([`Client::host_device_address`]) unless this process already mapped
    /// something there.
    pub fn host_alloc(&self, size: usize) -> Result<*mut u8> {
        if size == 0 {
            return Err(Error::invalid_value("cannot allocate a 0-byte host buffer"));
        }
        let _g = lock(&self.host.handover);
        let reply = self
            .transport
            .call(&Request::HostAlloc { size: size as u64 })?;
        let [handle, len, device, _] = reply.values;
        let mut msg: HostBufferFd = bytemuck::Zeroable::zeroed();
        let fds = socket::recv(&self.transport.socket, bytemuck::bytes_of_mut(&mut msg), 1)
            .map_err(|e| lost(format!("receiving a host buffer: {e}")))?;
        let checked = msg.check(handle, len).and_then(|()| {
            fds.into_iter()
                .next()
                .ok_or_else(|| lost("the server's host buffer message carried no descriptor"))
        });
        let fd = match checked {
            Ok(fd) => fd,
            Err(e) => {
                // The socket is out of step with the ring: nothing later on it can be trusted.
                return Err(self.transport.lose(e.message));
            }
        };
        // At the device address where there is room, so that one address names the buffer on
        // host and device, as CUDA's unified addressing does: kernels given the host pointer
        // (XLA's semaphores, zero-copy programs) then reach the buffer.
        let segment = Segment::open_at(fd, len as usize, device as usize)?;
        let addr = segment.as_ptr();
        self.host
            .buffers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                addr as usize,
                HostMapping {
                    handle,
                    segment,
                    device,
                },
            );
        Ok(addr)
    }

    /// The device address of host address `ptr` inside a host buffer of
    /// [`Client::host_alloc`] (`cuMemHostGetDevicePointer`'s): where kernels and copies reach
    /// that byte. `None` outside every host buffer.
    pub fn host_device_address(&self, ptr: *const u8) -> Option<DevicePtr> {
        let host = self.host.buffers.read().unwrap_or_else(|p| p.into_inner());
        let addr = ptr as usize;
        let (base, m) = host.range(..=addr).next_back()?;
        let off = addr - base;
        (off < m.segment.len() && m.device != 0).then_some(DevicePtr(m.device + off as u64))
    }

    /// Frees a host buffer from [`Client::host_alloc`] (after this client's pending work), even
    /// after earlier work failed: that failure is left for the next call to report.
    pub fn host_free(&self, ptr: *mut u8) -> Result<()> {
        let handle = {
            let host = self.host.buffers.read().unwrap_or_else(|p| p.into_inner());
            host.get(&(ptr as usize)).map(|m| m.handle).ok_or_else(|| {
                Error::invalid_value(format!(
                    "{ptr:p} is not the start of a host buffer from mps_host_alloc"
                ))
            })?
        };
        // Made even after earlier work failed (that failure is the next call's to report).
        self.transport
            .call_leaving_deferred(&Request::HostFree { handle })?;
        self.host
            .buffers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ptr as usize));
        Ok(())
    }

    /// The host buffer holding `[ptr, ptr + len)`, as (handle, offset), if `ptr` is in one.
    fn host_ref(&self, ptr: *const u8, len: usize) -> Result<Option<HostRef>> {
        let host = self.host.buffers.read().unwrap_or_else(|p| p.into_inner());
        let addr = ptr as usize;
        let Some((base, m)) = host.range(..=addr).next_back() else {
            return Ok(None);
        };
        let off = addr - base;
        if off >= m.segment.len() {
            return Ok(None);
        }
        if len > m.segment.len() - off {
            return Err(Error::invalid_value(format!(
                "host range {ptr:p}+{len} runs past the end of its {}-byte host buffer",
                m.segment.len()
            )));
        }
        Ok(Some(HostRef::Buffer {
            handle: m.handle,
            offset: off as u64,
        }))
    }

    // ----- copies -----

    /// Copies host memory to the device. From a host buffer the copy is asynchronous (ordered in
    /// `stream`); from other memory the call returns once the source has been taken.
    ///
    /// # Safety
    /// `src` must be valid for reading `len` bytes.
    pub unsafe fn memcpy_htod_raw(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid_value("copy of 0 bytes"));
        }
        if let Some(h) = self.host_ref(src, len)? {
            return self
                .transport
                .enqueue(
                    &Request::CopyHtoD {
                        dst: dst.0,
                        src: h,
                        len: len as u64,
                    },
                    stream,
                )
                .map(drop);
        }
        self.transport.check()?;
        self.stream_slot(stream)?;
        self.refuse_capturing(stream, "copy from pageable memory in")?;
        self.through_staging(
            len,
            stream,
            |offset, start, n| Request::CopyHtoD {
                dst: dst.0 + start as u64,
                src: HostRef::Staging { offset },
                len: n as u64,
            },
            |half, start, n| {
                // SAFETY: the caller guarantees src..src+len is readable; the staging half is
                // ours (staging lock held) and the previous copy from it has been taken.
                unsafe { std::ptr::copy_nonoverlapping(src.add(start), half, n) }
            },
            |seq, _, _, _| self.transport.wait_reply(seq).map(drop),
        )
    }

    /// Copies device memory to the host. Into a host buffer the copy is asynchronous (ordered in
    /// `stream`); into other memory the call returns once the data has arrived.
    ///
    /// # Safety
    /// `dst` must be valid for writing `len` bytes.
    pub unsafe fn memcpy_dtoh_raw(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: Stream,
    ) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid_value("copy of 0 bytes"));
        }
        if let Some(h) = self.host_ref(dst, len)? {
            return self
                .transport
                .enqueue(
                    &Request::CopyDtoH {
                        dst: h,
                        src: src.0,
                        len: len as u64,
                    },
                    stream,
                )
                .map(drop);
        }
        self.transport.check()?;
        let slot = self.stream_slot(stream)?;
        self.refuse_capturing(stream, "copy to pageable memory in")?;
        self.through_staging(
            len,
            stream,
            |offset, start, n| Request::CopyDtoH {
                dst: HostRef::Staging { offset },
                src: src.0 + start as u64,
                len: n as u64,
            },
            |_, _, _| {},
            |seq, half, start, n| {
                self.transport.wait_reply(seq)?;
                self.transport.wait_stream_seq(slot, seq)?;
                self.transport.check()?;
                // SAFETY: the caller guarantees dst..dst+len is writable; the server wrote this
                // half and published its completion (Acquire in wait_stream_seq) before we read
                // it.
                unsafe { std::ptr::copy_nonoverlapping(half, dst.add(start), n) };
                Ok(())
            },
        )
    }

    /// Moves `len` bytes through the two halves of the staging area, one chunk in flight per
    /// half, so that one half is filled or drained while the other's copy runs. For the chunk of
    /// `n` bytes at `start`: `fill(half, start, n)` readies its half before the command is
    /// submitted, `request(offset, start, n)` is the command (the half at staging `offset`), and
    /// `finish(seq, half, start, n)` completes it before its half is used again, or at the end,
    /// in submission order. The first failure is returned, after every submitted chunk is
    /// finished.
    fn through_staging(
        &self,
        len: usize,
        stream: Stream,
        request: impl Fn(u64, usize, usize) -> Request<'static>,
        fill: impl Fn(*mut u8, usize, usize),
        finish: impl Fn(u64, *mut u8, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let _g = lock(&self.host.staging);
        let (staging, staging_len) = self.transport.channel.staging();
        let half = staging_len / 2;
        // SAFETY: h is 0 or 1, so the half lies within the staging area.
        let half_at = |h: usize| unsafe { staging.add(h * half) };
        // (seq, start, n) of the chunk in flight in each half.
        let mut pending: [Option<(u64, usize, usize)>; 2] = [None, None];
        let mut result = Ok(());
        for (k, start) in (0..len).step_by(half).enumerate() {
            let n = half.min(len - start);
            let h = k % 2;
            if let Some((seq, s, m)) = pending[h].take() {
                result = finish(seq, half_at(h), s, m);
                if result.is_err() {
                    break;
                }
            }
            fill(half_at(h), start, n);
            let req = request((h * half) as u64, start, n);
            match self
                .transport
                .submit_request(&req, stream, flags::REPLY | flags::MARK)
            {
                Ok(seq) => pending[h] = Some((seq, start, n)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut rest: Vec<_> = (0..2).filter_map(|h| pending[h].map(|p| (p, h))).collect();
        rest.sort_by_key(|((seq, ..), _)| *seq);
        for ((seq, start, n), h) in rest {
            let r = finish(seq, half_at(h), start, n);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Copies `src` to the device (see [`Client::memcpy_htod_raw`]).
    pub fn memcpy_htod(&self, dst: DevicePtr, src: &[u8], stream: Stream) -> Result<()> {
        // SAFETY: a slice is valid for reading its length.
        unsafe { self.memcpy_htod_raw(dst, src.as_ptr(), src.len(), stream) }
    }

    /// Copies device memory into `dst` (see [`Client::memcpy_dtoh_raw`]).
    pub fn memcpy_dtoh(&self, dst: &mut [u8], src: DevicePtr, stream: Stream) -> Result<()> {
        // SAFETY: a mutable slice is valid for writing its length.
        unsafe { self.memcpy_dtoh_raw(dst.as_mut_ptr(), src, dst.len(), stream) }
    }

    /// Copies between device ranges, asynchronously.
    pub fn memcpy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: Stream,
    ) -> Result<()> {
        if len == 0 {
            return Err(Error::invalid_value("copy of 0 bytes"));
        }
        let copy = DeviceCopy {
            dst: dst.0,
            src: src.0,
            len,
        };
        let req = Request::CopyDtoD { copy };
        self.transport.enqueue(&req, stream).map(drop)
    }

    /// Sets `count` bytes to `value`, asynchronously.
    pub fn memset_d8(&self, dst: DevicePtr, value: u8, count: u64, stream: Stream) -> Result<()> {
        self.memset(dst, value as u32, 1, count, stream)
    }

    /// Sets `count` 32-bit words to `value`, asynchronously.
    pub fn memset_d32(&self, dst: DevicePtr, value: u32, count: u64, stream: Stream) -> Result<()> {
        self.memset(dst, value, 4, count, stream)
    }

    fn memset(
        &self,
        dst: DevicePtr,
        value: u32,
        elem_size: u8,
        count: u64,
        stream: Stream,
    ) -> Result<()> {
        if count == 0 {
            return Err(Error::invalid_value("memset of 0 elements"));
        }
        let fill = Fill {
            dst: dst.0,
            value,
            elem_size,
            count,
        };
        let req = Request::Memset { fill };
        self.transport.enqueue(&req, stream).map(drop)
    }
}
