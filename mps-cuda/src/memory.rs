//! Device memory, page-locked host memory, copies and memsets.
//!
//! Page-locked host memory (`cuMemAllocHost`, `cuMemHostAlloc`) is the server's shared host
//! buffers: copies from and to it are fully asynchronous. Copies from and to other (pageable)
//! memory go through the client's staging area and return, as CUDA's do, once the source has
//! been taken (host to device) or the data has arrived (device to host).
//!
//! The synchronous forms run in the default stream (legacy, or per-thread in the `_ptds`
//! variants) and keep CUDA's documented host synchronisation: a copy to or from page-locked
//! memory returns when it is done; device-to-device copies and memsets do not wait.

use std::ffi::c_void;

use crate::abi::{CUdeviceptr, CUresult, CUstream, MEMHOSTALLOC_FLAGS};
use crate::connection::{Res, Stream};
use crate::context::current;
use crate::driver::{check, driver, entry, lock, put};
use crate::graph;
use crate::stream::for_work;

fn alloc(dptr: *mut CUdeviceptr, size: usize) -> Res<()> {
    check(!dptr.is_null() && size > 0)?;
    graph::unsafe_call("cuMemAlloc")?;
    let ctx = current()?;
    let d = driver()?;
    let p = d.conn.mem_alloc(size as u64)?;
    lock(&d.allocations).insert(p, ctx.handle);
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(dptr, p) }
}

/// # Safety
/// `dptr` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, size: usize) -> CUresult {
    entry("cuMemAlloc_v2", || alloc(dptr, size))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    entry("cuMemFree_v2", || {
        current()?;
        graph::free_call("cuMemFree")?;
        let d = driver()?;
        d.conn.mem_free(dptr)?;
        lock(&d.allocations).remove(&dptr);
        Ok(())
    })
}

/// Free and total device memory: under a memory limit (`MPS_PINNED_DEVICE_MEM_LIMIT`), the
/// client's limit and what is left of it. The figure is live, so this asks the server.
///
/// # Safety
/// `free` and `total` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    entry("cuMemGetInfo_v2", || {
        check(!free.is_null() && !total.is_null())?;
        current()?;
        let (f, t) = driver()?.conn.mem_get_info()?;
        // SAFETY: both checked non-null; the caller guarantees they are writable.
        unsafe {
            put(free, f as usize)?;
            put(total, t as usize)
        }
    })
}

fn host_alloc(pp: *mut *mut c_void, size: usize, flags: u32) -> Res<()> {
    check(!pp.is_null() && size > 0 && flags & !MEMHOSTALLOC_FLAGS == 0)?;
    graph::unsafe_call("cuMemHostAlloc")?;
    let ctx = current()?;
    let d = driver()?;
    let p = d.conn.host_alloc(size)?;
    lock(&d.host).insert(p as usize, (size, ctx.handle));
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(pp, p.cast()) }
}

/// # Safety
/// `pp` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, size: usize) -> CUresult {
    entry("cuMemAllocHost_v2", || host_alloc(pp, size, 0))
}

/// Every flag is accepted: all contexts of the process share the buffers (PORTABLE), the
/// server maps them for the device (DEVICEMAP; their device address is not handed out), and
/// write-combining is a hint.
///
/// # Safety
/// `pp` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, size: usize, flags: u32) -> CUresult {
    entry("cuMemHostAlloc", || host_alloc(pp, size, flags))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    entry("cuMemFreeHost", || {
        current()?;
        graph::free_call("cuMemFreeHost")?;
        let d = driver()?;
        if lock(&d.host).remove(&(p as usize)).is_none() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        d.conn.host_free(p.cast())
    })
}

/// Whether `[p, p + len)` lies in page-locked memory from this library.
fn pinned(p: usize, len: usize) -> Res<bool> {
    let host = lock(&driver()?.host);
    Ok(host
        .range(..=p)
        .next_back()
        .is_some_and(|(base, (n, _))| p + len <= base + n))
}

// ----- copies -----

/// # Safety
/// `src` must be readable for `n` bytes.
unsafe fn htod(dst: u64, src: *const c_void, n: usize, stream: Stream, sync: bool) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    check(!src.is_null())?;
    graph::admit_copy(stream, sync, || pinned(src as usize, n))?;
    let conn = &driver()?.conn;
    // SAFETY: the caller guarantees src is readable for n bytes.
    unsafe { conn.memcpy_htod(dst, src.cast(), n, stream) }?;
    if sync && pinned(src as usize, n)? {
        conn.stream_synchronize(stream)?;
    }
    Ok(())
}

/// # Safety
/// `dst` must be writable for `n` bytes.
unsafe fn dtoh(dst: *mut c_void, src: u64, n: usize, stream: Stream, sync: bool) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    check(!dst.is_null())?;
    graph::admit_copy(stream, sync, || pinned(dst as usize, n))?;
    let conn = &driver()?.conn;
    // SAFETY: the caller guarantees dst is writable for n bytes.
    unsafe { conn.memcpy_dtoh(dst.cast(), src, n, stream) }?;
    if sync && pinned(dst as usize, n)? {
        conn.stream_synchronize(stream)?;
    }
    Ok(())
}

fn dtod(dst: u64, src: u64, n: usize, stream: Stream) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    driver()?.conn.memcpy_dtod(dst, src, n as u64, stream)
}

/// # Safety
/// `src` must be readable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's guarantee is htod's precondition.
    entry("cuMemcpyHtoD_v2", || unsafe {
        htod(dst, src, n, for_work(std::ptr::null_mut(), false)?, true)
    })
}

/// # Safety
/// `src` must be readable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's guarantee is htod's precondition.
    entry("cuMemcpyHtoD_v2_ptds", || unsafe {
        htod(dst, src, n, for_work(std::ptr::null_mut(), true)?, true)
    })
}

/// # Safety
/// `src` must be readable for `n` bytes (until the copy is done, for page-locked memory).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    h: CUstream,
) -> CUresult {
    // SAFETY: the caller's guarantee is htod's precondition.
    entry("cuMemcpyHtoDAsync_v2", || unsafe {
        htod(dst, src, n, for_work(h, false)?, false)
    })
}

/// # Safety
/// `src` must be readable for `n` bytes (until the copy is done, for page-locked memory).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    h: CUstream,
) -> CUresult {
    // SAFETY: the caller's guarantee is htod's precondition.
    entry("cuMemcpyHtoDAsync_v2_ptsz", || unsafe {
        htod(dst, src, n, for_work(h, true)?, false)
    })
}

/// # Safety
/// `dst` must be writable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    // SAFETY: the caller's guarantee is dtoh's precondition.
    entry("cuMemcpyDtoH_v2", || unsafe {
        dtoh(dst, src, n, for_work(std::ptr::null_mut(), false)?, true)
    })
}

/// # Safety
/// `dst` must be writable for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
) -> CUresult {
    // SAFETY: the caller's guarantee is dtoh's precondition.
    entry("cuMemcpyDtoH_v2_ptds", || unsafe {
        dtoh(dst, src, n, for_work(std::ptr::null_mut(), true)?, true)
    })
}

/// # Safety
/// `dst` must be writable for `n` bytes (until the copy is done, for page-locked memory).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    h: CUstream,
) -> CUresult {
    // SAFETY: the caller's guarantee is dtoh's precondition.
    entry("cuMemcpyDtoHAsync_v2", || unsafe {
        dtoh(dst, src, n, for_work(h, false)?, false)
    })
}

/// # Safety
/// `dst` must be writable for `n` bytes (until the copy is done, for page-locked memory).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    h: CUstream,
) -> CUresult {
    // SAFETY: the caller's guarantee is dtoh's precondition.
    entry("cuMemcpyDtoHAsync_v2_ptsz", || unsafe {
        dtoh(dst, src, n, for_work(h, true)?, false)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    entry("cuMemcpyDtoD_v2", || {
        dtod(dst, src, n, for_work(std::ptr::null_mut(), false)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2_ptds(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    entry("cuMemcpyDtoD_v2_ptds", || {
        dtod(dst, src, n, for_work(std::ptr::null_mut(), true)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    h: CUstream,
) -> CUresult {
    entry("cuMemcpyDtoDAsync_v2", || {
        dtod(dst, src, n, for_work(h, false)?)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    h: CUstream,
) -> CUresult {
    entry("cuMemcpyDtoDAsync_v2_ptsz", || {
        dtod(dst, src, n, for_work(h, true)?)
    })
}

// ----- memsets -----

fn d8(dst: u64, value: u8, n: usize, stream: Res<Stream>) -> Res<()> {
    let stream = stream?;
    if n == 0 {
        return Ok(());
    }
    driver()?.conn.memset_d8(dst, value, n as u64, stream)
}

fn d32(dst: u64, value: u32, n: usize, stream: Res<Stream>) -> Res<()> {
    let stream = stream?;
    if n == 0 {
        return Ok(());
    }
    check(dst % 4 == 0)?;
    driver()?.conn.memset_d32(dst, value, n as u64, stream)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    entry("cuMemsetD8_v2", || {
        d8(dst, value, n, for_work(std::ptr::null_mut(), false))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2_ptds(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    entry("cuMemsetD8_v2_ptds", || {
        d8(dst, value, n, for_work(std::ptr::null_mut(), true))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, h: CUstream) -> CUresult {
    entry("cuMemsetD8Async", || d8(dst, value, n, for_work(h, false)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async_ptsz(
    dst: CUdeviceptr,
    value: u8,
    n: usize,
    h: CUstream,
) -> CUresult {
    entry("cuMemsetD8Async_ptsz", || {
        d8(dst, value, n, for_work(h, true))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, value: u32, n: usize) -> CUresult {
    entry("cuMemsetD32_v2", || {
        d32(dst, value, n, for_work(std::ptr::null_mut(), false))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32_v2_ptds(dst: CUdeviceptr, value: u32, n: usize) -> CUresult {
    entry("cuMemsetD32_v2_ptds", || {
        d32(dst, value, n, for_work(std::ptr::null_mut(), true))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async(
    dst: CUdeviceptr,
    value: u32,
    n: usize,
    h: CUstream,
) -> CUresult {
    entry("cuMemsetD32Async", || {
        d32(dst, value, n, for_work(h, false))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async_ptsz(
    dst: CUdeviceptr,
    value: u32,
    n: usize,
    h: CUstream,
) -> CUresult {
    entry("cuMemsetD32Async_ptsz", || {
        d32(dst, value, n, for_work(h, true))
    })
}
