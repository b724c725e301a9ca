//! Device memory, page-locked host memory, copies and memsets.
//!
//! Page-locked host memory (`cuMemAllocHost`, `cuMemHostAlloc`) is the server's shared host
//! buffers: copies from and to it are fully asynchronous. Copies from and to other (pageable)
//! memory go through the client's staging area. The asynchronous forms return, as CUDA's do,
//! once the source has been taken (host to device) or the data has arrived (device to host); a
//! synchronous host-to-device copy returns once its bytes are on the device, from any memory.
//!
//! Memory belongs to the device of the context that allocated it. Two devices' servers may hand
//! out the same device address, so an allocation is known by (device, address), and a copy or
//! memset goes to the device of its stream's context (for the synchronous forms, the current
//! context): a device address is read as that device's. `cuMemFree` frees the pointer of the
//! current context's device, or, when no allocation there has that address, the one device's
//! that does. `cuMemcpyPeer` copies between devices through host memory (see `peer`).
//!
//! The synchronous forms run in the default stream (legacy, or per-thread in the `_ptds`
//! variants) and keep CUDA's documented host synchronisation: a copy to or from page-locked
//! memory returns when it is done (and from pageable memory to the device too, see `htod`);
//! device-to-device copies and memsets do not wait, except into page-locked host memory.
//!
//! A page-locked host pointer given where a device address goes (CUDA's unified addressing) is
//! the buffer's device address to the server (see `pointer::pinned_device_address`).

use std::ffi::c_void;
use std::sync::Arc;

use crate::abi::{CUcontext, CUdevice, CUdeviceptr, CUresult, CUstream, MEMHOSTALLOC_FLAGS};
use crate::capture;
use crate::connection::{Connection, Res, Stream};
use crate::context::{context, current, handle_of};
use crate::driver::{Allocation, HostBuffer, connection, driver, next_buffer_id};
use crate::ffi::{check, exports, lock, put};
use crate::log;
use crate::objects::Context;
use crate::pointer::pinned_device_address;
use crate::stream::{for_legacy_work, for_work};

fn alloc(dptr: *mut CUdeviceptr, size: usize) -> Res<()> {
    check(!dptr.is_null() && size > 0)?;
    capture::unsafe_call("cuMemAlloc")?;
    let ctx = current()?;
    let p = ctx.conn()?.mem_alloc(size as u64)?;
    let a = Allocation {
        ctx: ctx.handle,
        size: size as u64,
        id: next_buffer_id(),
        pool: 0,
    };
    lock(&driver()?.allocations).insert((ctx.device, p), a);
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(dptr, p) }
}

/// The device of `devices` whose allocation `ptr` is (`has(device, ptr)`), the current device
/// `here` first; where no allocation has that address, `here` (its server then says the
/// pointer is not its own).
pub(crate) fn device_of(
    devices: CUdevice,
    has: impl Fn(CUdevice, u64) -> bool,
    ptr: u64,
    here: CUdevice,
) -> Res<CUdevice> {
    if has(here, ptr) {
        return Ok(here);
    }
    let mut holders = (0..devices).filter(|d| has(*d, ptr));
    match (holders.next(), holders.next()) {
        (None, _) => Ok(here),
        (Some(one), None) => Ok(one),
        // Several other devices hold that address: which one the program means is unknown.
        (Some(_), Some(_)) => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// A failed allocation leaves NULL in `*pp`, as NVIDIA's driver does (measured: a program that
/// reused the pointer of an earlier allocation for a refused one lost it).
fn host_alloc(pp: *mut *mut c_void, size: usize, flags: u32) -> Res<()> {
    check(!pp.is_null())?;
    let (p, result) = match allocate_host(size, flags) {
        Ok(p) => (p, Ok(())),
        Err(e) => (std::ptr::null_mut(), Err(e)),
    };
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(pp, p) }?;
    result
}

fn allocate_host(size: usize, flags: u32) -> Res<*mut c_void> {
    check(size > 0 && flags & !MEMHOSTALLOC_FLAGS == 0)?;
    capture::unsafe_call("cuMemHostAlloc")?;
    let ctx = current()?;
    let conn = ctx.conn()?;
    let p = conn.host_alloc(size)?;
    let b = HostBuffer {
        len: size,
        ctx: ctx.handle,
        device: ctx.device,
        id: next_buffer_id(),
        at: conn.host_device_address(p.cast()),
    };
    lock(&driver()?.host).insert(p as usize, b);
    Ok(p.cast())
}

/// Whether `[p, p + len)` lies in page-locked memory this library got from the server of
/// `conn`'s device: another device's server does not know the buffer, and copies it as
/// pageable memory.
fn pinned(p: usize, len: usize, conn: &Connection) -> Res<bool> {
    let host = lock(&driver()?.host);
    Ok(host
        .range(..=p)
        .next_back()
        .is_some_and(|(base, b)| p + len <= base + b.len && b.device == conn.ordinal()))
}

// ----- copies -----

/// # Safety
/// `src` must be readable for `n` bytes.
pub(crate) unsafe fn htod(
    dst: u64,
    src: *const c_void,
    n: usize,
    (stream, conn): (Stream, &Connection),
    sync: bool,
) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    check(!src.is_null())?;
    let dst = device_address(dst, conn);
    capture::admit_copy((stream, conn), sync, || pinned(src as usize, n, conn))?;
    // SAFETY: the caller guarantees src is readable for n bytes.
    unsafe { conn.memcpy_htod(dst, src.cast(), n, stream) }?;
    if sync {
        // CUDA lets a pageable copy's last DMA be in flight when the call returns, for
        // microseconds; programs rely on that window being closed (a kernel on a non-blocking
        // stream reads the data at once), and through mps it would be the server's round
        // trip. So a synchronous copy returns once its bytes are on the device.
        conn.stream_synchronize(stream)?;
    }
    Ok(())
}

/// # Safety
/// `dst` must be writable for `n` bytes.
pub(crate) unsafe fn dtoh(
    dst: *mut c_void,
    src: u64,
    n: usize,
    (stream, conn): (Stream, &Connection),
    sync: bool,
) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    check(!dst.is_null())?;
    let src = device_address(src, conn);
    capture::admit_copy((stream, conn), sync, || pinned(dst as usize, n, conn))?;
    // SAFETY: the caller guarantees dst is writable for n bytes.
    unsafe { conn.memcpy_dtoh(dst.cast(), src, n, stream) }?;
    if sync && pinned(dst as usize, n, conn)? {
        conn.stream_synchronize(stream)?;
    }
    Ok(())
}

/// The address `ptr`, passed as a device address, has for `conn`'s server: a page-locked host
/// pointer's device address ([`pinned_device_address`]), else `ptr`.
fn device_address(ptr: u64, conn: &Connection) -> u64 {
    pinned_device_address(ptr, conn.ordinal()).unwrap_or(ptr)
}

/// A synchronous device-to-device copy or memset whose destination `dst` is page-locked host
/// memory (given as a device address) returns once it is done, as CUDA's do; into device
/// memory it does not wait.
fn finish_into(dst: u64, (stream, conn): (Stream, &Connection), sync: bool) -> Res<()> {
    if sync && pinned_device_address(dst, conn.ordinal()).is_some() {
        conn.stream_synchronize(stream)?;
    }
    Ok(())
}

pub(crate) fn dtod(
    dst: u64,
    src: u64,
    n: usize,
    (stream, conn): (Stream, &Connection),
    sync: bool,
) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    let (to, from) = (device_address(dst, conn), device_address(src, conn));
    conn.memcpy_dtod(to, from, n as u64, stream)?;
    finish_into(dst, (stream, conn), sync)
}

// ----- memsets -----

fn d8(dst: u64, value: u8, n: usize, stream: Res<(Stream, &Connection)>, sync: bool) -> Res<()> {
    let (stream, conn) = stream?;
    if n == 0 {
        return Ok(());
    }
    conn.memset_d8(device_address(dst, conn), value, n as u64, stream)?;
    finish_into(dst, (stream, conn), sync)
}

fn d32(dst: u64, value: u32, n: usize, stream: Res<(Stream, &Connection)>, sync: bool) -> Res<()> {
    let (stream, conn) = stream?;
    if n == 0 {
        return Ok(());
    }
    check(dst % 4 == 0)?;
    conn.memset_d32(device_address(dst, conn), value, n as u64, stream)?;
    finish_into(dst, (stream, conn), sync)
}

// ----- copies between devices -----

/// The most host memory a copy between devices stages at once.
const PEER_CHUNK: usize = 64 << 20;

/// A side of a copy: the stream it runs in and its device's connection.
pub(crate) type Side<'a> = (Stream, &'a Connection);

/// Copies `n` bytes from `src` (on `from`'s device) to `dst` (on `to`'s). On one device this is
/// a device-to-device copy in `to`'s stream. Between two, no server can reach the other's
/// memory, so it goes through host memory, a piece at a time: the piece is read (a copy to
/// pageable memory, which returns once the data has arrived) and then written (a copy from
/// pageable memory, which returns once it has been taken).
pub(crate) fn peer(dst: u64, to: Side<'_>, src: u64, from: Side<'_>, n: usize) -> Res<()> {
    if to.1.ordinal() == from.1.ordinal() {
        return dtod(dst, src, n, to, false);
    }
    let (dst, src) = (device_address(dst, to.1), device_address(src, from.1));
    let mut buf = vec![0u8; n.min(PEER_CHUNK)];
    let mut done = 0;
    while done < n {
        let len = (n - done).min(PEER_CHUNK);
        let at = done as u64;
        // SAFETY: `buf` is writable for `len` <= its length bytes.
        unsafe { from.1.memcpy_dtoh(buf.as_mut_ptr(), src + at, len, from.0) }?;
        // SAFETY: `buf` is readable for `len` bytes, and stays alive until the copy has taken
        // them (a pageable copy returns then).
        unsafe { to.1.memcpy_htod(dst + at, buf.as_ptr(), len, to.0) }?;
        done += len;
    }
    Ok(())
}

/// `cuMemcpyPeer`: between two contexts, in their legacy default streams; with `per_thread`
/// (its `_ptds` variant), in the calling thread's per-thread default stream.
fn peer_sync(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    per_thread: bool,
) -> Res<()> {
    if per_thread {
        return peer_async(dst, dst_ctx, src, src_ctx, n, std::ptr::null_mut(), true);
    }
    let (to, from) = (context(handle_of(dst_ctx))?, context(handle_of(src_ctx))?);
    if n == 0 {
        return Ok(());
    }
    let (to, from) = (for_legacy_work(to)?, for_legacy_work(from)?);
    if to.1.ordinal() == from.1.ordinal() && to.0 != from.0 {
        // Two contexts of one device: the copy follows the source context's work, as
        // CUDA orders it after both contexts' (the destination's by its stream).
        from.1.stream_synchronize(from.0)?;
    }
    peer(dst, to, src, from, n)
}

/// Where the side of a copy on context `c`'s device runs: in `stream` if that is on the same
/// device (`true`), else in `c`'s legacy default stream (`false`).
fn side_of(c: Arc<Context>, stream: Side<'static>) -> Res<(Side<'static>, bool)> {
    if c.device == stream.1.ordinal() {
        Ok((stream, true))
    } else {
        Ok((for_legacy_work(c)?, false))
    }
}

/// `cuMemcpyPeerAsync`: ordered in stream `h` as CUDA orders it, by running each side of the
/// copy on `h`'s device in `h`, and a side on another device in its context's legacy stream,
/// with the host waiting where `h` cannot order that side: for `h`'s earlier work before the
/// copy reads, and for the copy before `h`'s later work. The copy may so return done, which
/// CUDA allows an asynchronous copy.
fn peer_async(
    dst: u64,
    dst_ctx: CUcontext,
    src: u64,
    src_ctx: CUcontext,
    n: usize,
    h: CUstream,
    per_thread: bool,
) -> Res<()> {
    let (to, from) = (context(handle_of(dst_ctx))?, context(handle_of(src_ctx))?);
    let stream = for_work(h, per_thread)?;
    if n == 0 {
        return Ok(());
    }
    let (to, to_in_h) = side_of(to, stream)?;
    let (from, from_in_h) = side_of(from, stream)?;
    if to.1.ordinal() != from.1.ordinal() {
        // Staged through the host, with waits: nothing a capture could record.
        capture::refuse_in_capture(stream.1, stream.0, "a copy between two devices")?;
    }
    if !from_in_h {
        stream.1.stream_synchronize(stream.0)?;
    }
    peer(dst, to, src, from, n)?;
    if !to_in_h {
        log::detail_once("cuMemcpyPeerAsync host wait", || {
            "cuMemcpyPeerAsync: the copy's destination is not on its stream's device; the \
             host waits for it"
                .into()
        });
        to.1.stream_synchronize(to.0)?;
    }
    Ok(())
}

// ----- the exports -----

exports! {
    /// # Safety
    /// `dptr` must be NULL or writable.
    pub unsafe fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) ["cuMemAlloc" 3020] =
        alloc(dptr, size);

    pub fn cuMemFree_v2(dptr: CUdeviceptr) ["cuMemFree" 3020] = {
        // Freeing 0 does nothing and succeeds, as with NVIDIA's driver: cuBLAS frees 0 in
        // `cublasCreate`, and refused, cublasCreate fails (measured on the H200).
        if dptr == 0 {
            return Ok(());
        }
        let here = current()?.device;
        let d = driver()?;
        let dev = {
            let allocations = lock(&d.allocations);
            let has = |dev, p| allocations.contains_key(&(dev, p));
            device_of(d.devices.len() as CUdevice, has, dptr, here)?
        };
        let conn = connection(dev)?;
        capture::free_call(conn, "cuMemFree")?;
        conn.mem_free(dptr)?;
        lock(&d.allocations).remove(&(dev, dptr));
        Ok(())
    };

    /// Free and total device memory: under a memory limit (`MPS_PINNED_DEVICE_MEM_LIMIT`), the
    /// client's limit and what is left of it. The figure is live, so this asks the server.
    ///
    /// # Safety
    /// `free` and `total` must be NULL or writable.
    pub unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) ["cuMemGetInfo" 3020] = {
        check(!free.is_null() && !total.is_null())?;
        let (f, t) = current()?.conn()?.mem_get_info()?;
        // SAFETY: both checked non-null; the caller guarantees they are writable.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    };

    /// # Safety
    /// `pp` must be NULL or writable.
    pub unsafe fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) ["cuMemAllocHost" 3020] =
        host_alloc(pp, size, 0);

    /// Every flag is accepted: all contexts of the process share the buffers (PORTABLE), the
    /// server maps them for the device whatever the flags (DEVICEMAP: `cuMemHostGetDevicePointer`
    /// gives their device address), and write-combining is a hint.
    ///
    /// # Safety
    /// `pp` must be NULL or writable.
    pub unsafe fn cuMemHostAlloc(
        pp: *mut *mut c_void,
        size: usize,
        flags: u32,
    ) ["cuMemHostAlloc" 2020] =
        host_alloc(pp, size, flags);

    /// The device address of page-locked memory: the server's mapping of the buffer, which is
    /// not its address in this process (the server maps it in its own). CUDA_ERROR_INVALID_VALUE
    /// for memory not from `cuMemHostAlloc` or `cuMemAllocHost`, or flags other than 0.
    ///
    /// # Safety
    /// `pdptr` must be NULL or writable.
    pub unsafe fn cuMemHostGetDevicePointer_v2(
        pdptr: *mut CUdeviceptr,
        p: *mut c_void,
        flags: u32,
    ) ["cuMemHostGetDevicePointer" 3020] = {
        check(!pdptr.is_null() && flags == 0)?;
        let dev = lock(&driver()?.host)
            .range(..=(p as usize))
            .next_back()
            .filter(|(base, b)| p as usize - **base < b.len)
            .map(|(_, b)| b.device)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let d = connection(dev)?
            .host_device_address(p.cast())
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(pdptr, d) }
    };

    pub fn cuMemFreeHost(p: *mut c_void) ["cuMemFreeHost" 2000] = {
        current()?;
        let host = &driver()?.host;
        let dev = lock(host)
            .get(&(p as usize))
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?
            .device;
        let conn = connection(dev)?;
        capture::free_call(conn, "cuMemFreeHost")?;
        // Forgotten only once the server freed it: a buffer it keeps (a graph copies through
        // it) stays this library's, to be freed later and to be waited for as page-locked.
        conn.host_free(p.cast())?;
        lock(host).remove(&(p as usize));
        Ok(())
    };

    /// # Safety
    /// `src` must be readable for `n` bytes.
    pub unsafe fn cuMemcpyHtoD_v2(
        dst: CUdeviceptr,
        src: *const c_void,
        n: usize,
    ) ["cuMemcpyHtoD" 3020]
        per_thread cuMemcpyHtoD_v2_ptds = |per_thread|
            // SAFETY: the caller's guarantee is htod's precondition.
            unsafe { htod(dst, src, n, for_work(std::ptr::null_mut(), per_thread)?, true) };

    /// # Safety
    /// `src` must be readable for `n` bytes (until the copy is done, for page-locked memory).
    pub unsafe fn cuMemcpyHtoDAsync_v2(
        dst: CUdeviceptr,
        src: *const c_void,
        n: usize,
        h: CUstream,
    ) ["cuMemcpyHtoDAsync" 3020]
        per_thread cuMemcpyHtoDAsync_v2_ptsz = |per_thread|
            // SAFETY: the caller's guarantee is htod's precondition.
            unsafe { htod(dst, src, n, for_work(h, per_thread)?, false) };

    /// # Safety
    /// `dst` must be writable for `n` bytes.
    pub unsafe fn cuMemcpyDtoH_v2(
        dst: *mut c_void,
        src: CUdeviceptr,
        n: usize,
    ) ["cuMemcpyDtoH" 3020]
        per_thread cuMemcpyDtoH_v2_ptds = |per_thread|
            // SAFETY: the caller's guarantee is dtoh's precondition.
            unsafe { dtoh(dst, src, n, for_work(std::ptr::null_mut(), per_thread)?, true) };

    /// # Safety
    /// `dst` must be writable for `n` bytes (until the copy is done, for page-locked memory).
    pub unsafe fn cuMemcpyDtoHAsync_v2(
        dst: *mut c_void,
        src: CUdeviceptr,
        n: usize,
        h: CUstream,
    ) ["cuMemcpyDtoHAsync" 3020]
        per_thread cuMemcpyDtoHAsync_v2_ptsz = |per_thread|
            // SAFETY: the caller's guarantee is dtoh's precondition.
            unsafe { dtoh(dst, src, n, for_work(h, per_thread)?, false) };

    pub fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) ["cuMemcpyDtoD" 3020]
        per_thread cuMemcpyDtoD_v2_ptds = |per_thread|
            dtod(dst, src, n, for_work(std::ptr::null_mut(), per_thread)?, true);

    pub fn cuMemcpyDtoDAsync_v2(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        h: CUstream,
    ) ["cuMemcpyDtoDAsync" 3020]
        per_thread cuMemcpyDtoDAsync_v2_ptsz = |per_thread|
            dtod(dst, src, n, for_work(h, per_thread)?, false);

    pub fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) ["cuMemsetD8" 3020]
        per_thread cuMemsetD8_v2_ptds = |per_thread|
            d8(dst, value, n, for_work(std::ptr::null_mut(), per_thread), true);

    pub fn cuMemsetD8Async(
        dst: CUdeviceptr,
        value: u8,
        n: usize,
        h: CUstream,
    ) ["cuMemsetD8Async" 3020]
        per_thread cuMemsetD8Async_ptsz = |per_thread| d8(dst, value, n, for_work(h, per_thread), false);

    pub fn cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize) ["cuMemsetD32" 3020]
        per_thread cuMemsetD32_v2_ptds = |per_thread|
            d32(dst, value, n, for_work(std::ptr::null_mut(), per_thread), true);

    pub fn cuMemsetD32Async(
        dst: CUdeviceptr,
        value: u32,
        n: usize,
        h: CUstream,
    ) ["cuMemsetD32Async" 3020]
        per_thread cuMemsetD32Async_ptsz = |per_thread| d32(dst, value, n, for_work(h, per_thread), false);

    pub fn cuMemcpyPeer(
        dst: CUdeviceptr,
        dst_ctx: CUcontext,
        src: CUdeviceptr,
        src_ctx: CUcontext,
        n: usize,
    ) ["cuMemcpyPeer" 4000]
        per_thread cuMemcpyPeer_ptds = |per_thread|
            peer_sync(dst, dst_ctx, src, src_ctx, n, per_thread);

    pub fn cuMemcpyPeerAsync(
        dst: CUdeviceptr,
        dst_ctx: CUcontext,
        src: CUdeviceptr,
        src_ctx: CUcontext,
        n: usize,
        h: CUstream,
    ) ["cuMemcpyPeerAsync" 4000]
        per_thread cuMemcpyPeerAsync_ptsz = |per_thread|
            peer_async(dst, dst_ctx, src, src_ctx, n, h, per_thread);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_is_the_current_devices_first_else_the_one_device_that_has_it() {
        let keys = [
            (0, 0x1000),
            (1, 0x1000),
            (1, 0x2000),
            (2, 0x3000),
            (3, 0x3000),
        ];
        let has = |d, p| keys.contains(&(d, p));
        let of = |ptr, here| device_of(4, has, ptr, here);
        // Two servers handed out 0x1000: the current device's is meant.
        assert_eq!(of(0x1000, 0), Ok(0));
        assert_eq!(of(0x1000, 1), Ok(1));
        // Only device 1 has 0x2000, whichever device is current.
        assert_eq!(of(0x2000, 0), Ok(1));
        // Nobody has it: the current device's server says so.
        assert_eq!(of(0x9000, 2), Ok(2));
        // Two other devices have it: which one is meant is unknown.
        assert_eq!(of(0x3000, 0), Err(CUresult::CUDA_ERROR_INVALID_VALUE));
    }
}
