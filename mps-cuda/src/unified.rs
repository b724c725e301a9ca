//! Copies whose direction comes from their addresses, as CUDA's unified addressing has it:
//! `cuMemcpy`, `cuMemcpyAsync` and the 2D copies of linear memory (`cuMemcpy2D`,
//! `cuMemcpy2DAsync`, `cuMemcpy2DUnaligned`).
//!
//! Each address is placed (`place`) against the device of the copy's stream: device memory
//! of this client there (an allocation, a mapping of a reservation, or else any range the
//! device's server holds for it: a module global, a host buffer's device address), a
//! page-locked host buffer of that device (copied directly, by DMA), device memory of another
//! device, or other host memory (pageable, staged). The copy then takes the path of its
//! direction in `memory` (host to device, device to host, device to device), so that it keeps
//! their ordering and host synchronisation; a copy between two pageable buffers is made here,
//! once the stream's earlier work is done. Where the library's tables do not know an address it
//! asks the server, which costs a round trip, so only pageable memory pays it (whose copies
//! pay round trips already).
//!
//! Addresses of another device are copied through that device's context's legacy stream, the
//! host waiting for the stream's earlier work before and for the copy after, as
//! `cuMemcpyPeerAsync` does. CUDA arrays do not exist through mps (`cuArrayCreate` is not
//! served): a 2D copy naming one is refused with CUDA_ERROR_NOT_SUPPORTED, said once.

use std::ffi::c_void;

use crate::abi::memcpy2d::{self, Memcpy2D};
use crate::abi::{CUdevice, CUdeviceptr, CUresult, CUstream};
use crate::capture;
use crate::connection::{Connection, Res};
use crate::context::context;
use crate::driver::driver;
use crate::ffi::{check, exports, lock};
use crate::log;
use crate::memory::{self, Side};
use crate::stream::{for_legacy_work, for_work};
use crate::vmm;

/// Where an address lies, for the copy's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Memory the copy's device's server knows as this client's.
    Device,
    /// A page-locked host buffer of the copy's device (the address is this process's).
    Pinned,
    /// Device memory of another device, allocated in this context.
    Elsewhere(usize),
    /// Other host memory.
    Pageable,
}

/// An address and where it lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    kind: Kind,
    at: u64,
}

impl Place {
    fn plus(self, off: u64) -> Place {
        Place {
            at: self.at + off,
            ..self
        }
    }

    fn is_host(self) -> bool {
        matches!(self.kind, Kind::Pinned | Kind::Pageable)
    }
}

/// Where `ptr` lies for the server of `conn` (see the module's documentation). The copy's
/// device comes first, since two servers may hand out the same address: its allocations, its
/// reservations, host buffers (by either address), then its server's ranges; only then another
/// device's allocations and reservations.
fn place(ptr: u64, conn: &Connection) -> Res<Place> {
    check(ptr != 0)?;
    let d = driver()?;
    let here = conn.ordinal();
    let at = |kind| Ok(Place { kind, at: ptr });
    let holder = |dev: CUdevice| {
        let allocations = lock(&d.allocations);
        let (&(_, base), a) = allocations.range((dev, 0)..=(dev, ptr)).next_back()?;
        (ptr - base < a.size).then_some(a.ctx)
    };
    if holder(here).is_some() {
        return at(Kind::Device);
    }
    let reserved = vmm::reserved(ptr)?;
    if reserved.is_some_and(|r| r.device == here) {
        return at(Kind::Device);
    }
    {
        let host = lock(&d.host);
        let p = ptr as usize;
        let by_host = host
            .range(..=p)
            .next_back()
            .filter(|(base, b)| p - **base < b.len);
        if let Some((_, b)) = by_host {
            // Another device's buffer is host memory to this device's server.
            return at(if b.device == here {
                Kind::Pinned
            } else {
                Kind::Pageable
            });
        }
        // A buffer's device address, as kernels are given it: the buffer, at its address here.
        let by_device = host.iter().find_map(|(&base, b)| {
            let off = ptr.checked_sub(b.at?)?;
            (b.device == here && off < b.len as u64).then_some(base as u64 + off)
        });
        if let Some(h) = by_device {
            return Ok(Place {
                kind: Kind::Pinned,
                at: h,
            });
        }
    }
    if conn.owns(ptr)? {
        return at(Kind::Device);
    }
    let others = (0..d.devices.len() as CUdevice).filter(|dev| *dev != here);
    if let Some(ctx) = others.filter_map(holder).next() {
        return at(Kind::Elsewhere(ctx));
    }
    if let Some(r) = reserved {
        log::once("unified copy of another device's reservation", || {
            format!(
                "a copy in a stream of device {here} names {ptr:#x}, in a reservation of device \
                 {}: copies of another device's virtual memory are not supported through mps; \
                 returning CUDA_ERROR_INVALID_VALUE (copy it with cuMemcpyPeer)",
                r.device
            )
        });
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    at(Kind::Pageable)
}

/// Copies `n` bytes from `src` to `dst` in `side`'s stream, by their direction; `sync` for the
/// synchronous forms, whose host synchronisation each direction's path keeps.
///
/// # Safety
/// A host `src` must be readable and a host `dst` writable for `n` bytes (page-locked memory
/// until the copy is done).
unsafe fn copy(dst: Place, src: Place, n: usize, side: Side<'static>, sync: bool) -> Res<()> {
    use Kind::{Device, Elsewhere, Pageable, Pinned};
    match (dst.kind, src.kind) {
        (Elsewhere(_), _) | (_, Elsewhere(_)) => {
            // SAFETY: the caller's guarantee is `elsewhere`'s precondition.
            unsafe { elsewhere(dst, src, n, side) }
        }
        (Device, Device) | (Pinned, Pinned) => memory::dtod(dst.at, src.at, n, side, sync),
        (Device, Pinned | Pageable) | (Pinned, Pageable) => {
            // A pinned destination, given here by its host address, is taken as the buffer's
            // device address by `htod`; a pinned source is copied from directly.
            let from = src.at as *const c_void;
            // SAFETY: the caller guarantees a host source is readable.
            unsafe { memory::htod(dst.at, from, n, side, sync) }
        }
        (Pinned | Pageable, Device) | (Pageable, Pinned) => {
            // SAFETY: the caller guarantees a host destination is writable.
            unsafe { memory::dtoh(dst.at as *mut c_void, src.at, n, side, sync) }
        }
        (Pageable, Pageable) => {
            // SAFETY: the caller's guarantee.
            unsafe { host_to_host(dst.at, src.at, n, side) }
        }
    }
}

/// A copy between two pageable host buffers, made by this process once the work before it in
/// the stream is done (later work is submitted after it returns, so follows it).
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes.
unsafe fn host_to_host(dst: u64, src: u64, n: usize, (stream, conn): Side<'static>) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    capture::refuse_in_capture(conn, stream, "a copy between two pageable host buffers")?;
    conn.stream_synchronize(stream)?;
    // SAFETY: the caller guarantees both ranges; CUDA leaves overlapping ranges undefined,
    // and `copy` is defined for them all the same.
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
    Ok(())
}

/// A copy naming memory of another device: made on that device, in the legacy stream of the
/// context that allocated it, after `side`'s earlier work and before its later work (the host
/// waits for both), through host memory between two devices.
///
/// # Safety
/// As [`copy`].
unsafe fn elsewhere(dst: Place, src: Place, n: usize, side: Side<'static>) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    capture::refuse_in_capture(side.1, side.0, "a copy of another device's memory")?;
    side.1.stream_synchronize(side.0)?;
    let on = |p: Place| -> Res<Side<'static>> {
        match p.kind {
            Kind::Elsewhere(ctx) => for_legacy_work(context(ctx)?),
            _ => Ok(side),
        }
    };
    let (to, from) = (on(dst)?, on(src)?);
    match (dst.is_host(), src.is_host()) {
        (false, false) => memory::peer(dst.at, to, src.at, from, n)?,
        // SAFETY: the caller guarantees the host source is readable (as pageable memory to the
        // other device, which stages it).
        (false, true) => unsafe { memory::htod(dst.at, src.at as *const c_void, n, to, true) }?,
        // SAFETY: the caller guarantees the host destination is writable.
        (true, false) => unsafe { memory::dtoh(dst.at as *mut c_void, src.at, n, from, true) }?,
        (true, true) => unreachable!("one side is another device's memory"),
    }
    to.1.stream_synchronize(to.0)
}

/// `cuMemcpy` and `cuMemcpyAsync`.
///
/// # Safety
/// As [`copy`], for whichever of `dst` and `src` are host memory.
unsafe fn unified(dst: u64, src: u64, n: usize, side: Side<'static>, sync: bool) -> Res<()> {
    if n == 0 {
        return Ok(());
    }
    let (d, s) = (place(dst, side.1)?, place(src, side.1)?);
    // SAFETY: the caller's guarantee.
    unsafe { copy(d, s, n, side, sync) }
}

// ----- 2D copies -----

/// One side of a 2D copy: where its first row starts and its pitch.
#[derive(Clone, Copy, Debug)]
struct Plane {
    start: Place,
    pitch: usize,
}

/// The side of a 2D copy that `memory_type`, `host`, `device`, `x`, `y` and `pitch` describe,
/// for the server of `conn`.
#[allow(clippy::too_many_arguments)]
fn plane(
    memory_type: u32,
    host: *const c_void,
    device: u64,
    (x, y, pitch): (usize, usize, usize),
    width: usize,
    height: usize,
    conn: &Connection,
) -> Res<Plane> {
    // The rows must fit in the pitch, as CUDA requires of a 2D copy's pitches.
    check(height <= 1 || x + width <= pitch)?;
    let off = (y as u64)
        .checked_mul(pitch as u64)
        .and_then(|o| o.checked_add(x as u64))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let base = match memory_type {
        memcpy2d::HOST => {
            check(!host.is_null())?;
            match place(host as u64, conn)? {
                p if p.is_host() => p,
                // A host side is host memory, whatever a device of this process calls it.
                _ => Place {
                    kind: Kind::Pageable,
                    at: host as u64,
                },
            }
        }
        memcpy2d::DEVICE => {
            check(device != 0)?;
            match place(device, conn)? {
                // A device side the tables do not know is left to the server to refuse.
                p if p.kind == Kind::Pageable => Place {
                    kind: Kind::Device,
                    at: device,
                },
                p => p,
            }
        }
        memcpy2d::UNIFIED => place(device, conn)?,
        memcpy2d::ARRAY => {
            log::once("2D copy of a CUDA array", || {
                "a 2D copy of a CUDA array is not supported through mps (CUDA arrays are not); \
                 returning CUDA_ERROR_NOT_SUPPORTED"
                    .into()
            });
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    Ok(Plane {
        start: base.plus(off),
        pitch,
    })
}

/// `cuMemcpy2D`, `cuMemcpy2DUnaligned` and `cuMemcpy2DAsync`: one copy where the rows are
/// contiguous on both sides, else a copy a row, in the stream's order. The synchronous forms
/// return as CUDA's do: once done where either side is host memory, at once between device
/// memory.
///
/// # Safety
/// `p` must be NULL or a `CUDA_MEMCPY2D` whose host sides are valid for the rows it names.
unsafe fn copy_2d(p: *const Memcpy2D, side: Side<'static>, sync: bool) -> Res<()> {
    check(!p.is_null())?;
    // SAFETY: checked non-null; the caller guarantees it is a CUDA_MEMCPY2D.
    let m = unsafe { p.read_unaligned() };
    let (width, height) = (m.width_in_bytes, m.height);
    if width == 0 || height == 0 {
        return Ok(());
    }
    let conn = side.1;
    let src = plane(
        m.src_memory_type,
        m.src_host,
        m.src_device,
        (m.src_x_in_bytes, m.src_y, m.src_pitch),
        width,
        height,
        conn,
    )?;
    let dst = plane(
        m.dst_memory_type,
        m.dst_host,
        m.dst_device,
        (m.dst_x_in_bytes, m.dst_y, m.dst_pitch),
        width,
        height,
        conn,
    )?;
    let host_side = src.start.is_host() || dst.start.is_host();
    if sync && host_side {
        capture::refuse_in_capture(conn, side.0, "a synchronous copy")?;
    }
    let contiguous = height == 1 || (src.pitch == width && dst.pitch == width);
    if contiguous {
        // SAFETY: the caller guarantees the rows' host memory.
        unsafe { copy(dst.start, src.start, width * height, side, false) }?;
    } else {
        for row in 0..height as u64 {
            let (d, s) = (
                dst.start.plus(row * dst.pitch as u64),
                src.start.plus(row * src.pitch as u64),
            );
            // SAFETY: the caller guarantees each row's host memory.
            unsafe { copy(d, s, width, side, false) }?;
        }
    }
    if sync && host_side {
        conn.stream_synchronize(side.0)?;
    }
    Ok(())
}

// ----- the exports -----

exports! {
    /// # Safety
    /// Whichever of `dst` and `src` are host memory must be writable and readable for `n`
    /// bytes.
    pub unsafe fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, n: usize) ["cuMemcpy" 4000]
        per_thread cuMemcpy_ptds = |per_thread|
            // SAFETY: the caller's guarantee is unified's precondition.
            unsafe { unified(dst, src, n, for_work(std::ptr::null_mut(), per_thread)?, true) };

    /// # Safety
    /// As `cuMemcpy`, page-locked memory until the copy is done.
    pub unsafe fn cuMemcpyAsync(
        dst: CUdeviceptr,
        src: CUdeviceptr,
        n: usize,
        h: CUstream,
    ) ["cuMemcpyAsync" 4000]
        per_thread cuMemcpyAsync_ptsz = |per_thread|
            // SAFETY: the caller's guarantee is unified's precondition.
            unsafe { unified(dst, src, n, for_work(h, per_thread)?, false) };

    /// # Safety
    /// `p` must be NULL or a `CUDA_MEMCPY2D` whose host sides are valid for its rows.
    pub unsafe fn cuMemcpy2D_v2(p: *const Memcpy2D) ["cuMemcpy2D" 3020]
        per_thread cuMemcpy2D_v2_ptds = |per_thread|
            // SAFETY: the caller's guarantee is copy_2d's precondition.
            unsafe { copy_2d(p, for_work(std::ptr::null_mut(), per_thread)?, true) };

    /// As `cuMemcpy2D`: mps places no alignment requirement on either.
    ///
    /// # Safety
    /// As `cuMemcpy2D_v2`.
    pub unsafe fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) ["cuMemcpy2DUnaligned" 3020]
        per_thread cuMemcpy2DUnaligned_v2_ptds = |per_thread|
            // SAFETY: the caller's guarantee is copy_2d's precondition.
            unsafe { copy_2d(p, for_work(std::ptr::null_mut(), per_thread)?, true) };

    /// # Safety
    /// As `cuMemcpy2D_v2`, page-locked memory until the copy is done.
    pub unsafe fn cuMemcpy2DAsync_v2(p: *const Memcpy2D, h: CUstream) ["cuMemcpy2DAsync" 3020]
        per_thread cuMemcpy2DAsync_v2_ptsz = |per_thread|
            // SAFETY: the caller's guarantee is copy_2d's precondition.
            unsafe { copy_2d(p, for_work(h, per_thread)?, false) };
}
