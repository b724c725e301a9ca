//! The stream-ordered allocator (`cuMemAllocAsync`, `cuMemFreeAsync`) and its memory pools,
//! kept in this library over the server's ordinary device memory.
//!
//! - An allocation is made at once: a block the pool holds idle, where it may be reused (see
//!   below), else new device memory from the server, counted against the client's memory
//!   limit like `cuMemAlloc`'s, so that running out is CUDA_ERROR_OUT_OF_MEMORY from the call
//!   (after the device's pools have given their idle blocks back and it was tried again).
//! - A free is ordered after the work before it in its stream: the block goes back to its pool
//!   with an event recorded there, and is handed out again only where that order holds: in the
//!   same stream (whose later work follows the free), once the event has completed
//!   (`CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`), or in another stream made to wait for the
//!   event (`CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`). Event dependencies the
//!   program made itself are not followed: a pool may always decline to reuse.
//! - Idle blocks go back to the server at `cuMemPoolTrimTo`, at a context synchronisation
//!   (`cuCtxSynchronize`: what a pool holds above its release threshold, largest blocks first),
//!   when an allocation would otherwise fail, when their pool is destroyed and when their
//!   context is released; a server's free waits for all of the client's work, so none goes back
//!   before its stream's work is done, and a client's exit gives the server back everything.
//!   Stream and event synchronisations give nothing back (CUDA's pools "try to" there too):
//!   there, the server's free would wait for the other streams' work as well.
//! - A block is reused for a request of between half its size and its size, the smallest that
//!   fits; sizes are rounded up to 512 bytes.
//! - Pools are of device memory of one device, which only that device accesses; shareable
//!   (IPC) pools are refused, as their export would be. Inside a stream capture, stream-ordered
//!   allocation is refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, the capture invalidated):
//!   CUDA would record allocation nodes, which the server's captures do not have.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::Mutex;

use crate::abi::mempool::{self as A, PoolProps};
use crate::abi::vmm::{
    ACCESS_NONE, ACCESS_READWRITE, ALLOCATION_PINNED, AccessDesc, LOCATION_DEVICE, Location,
};
use crate::abi::{CUdevice, CUdeviceptr, CUresult, CUstream};
use crate::capture;
use crate::connection::{Connection, Event, Res, Stream};
use crate::driver::{self, Allocation, Stage, connection, driver, next_buffer_id};
use crate::ffi::{check, exports, lock, put};
use crate::log;
use crate::objects::Context;
use crate::stream::{for_work, with_target};

/// `CUmemoryPool`: a handle of this library's.
type PoolHandle = *mut c_void;

/// Sizes are rounded up to this, so that freed blocks fit later requests of about their size.
const GRAIN: u64 = 512;

/// A freed block is reused for a request of at least 1/`FIT` of its size, so that a
/// small request does not take (and hold) a large block.
const FIT: u64 = 2;

/// A block freed into its pool, waiting to be reused or given back.
#[derive(Debug)]
struct Idle {
    ptr: u64,
    size: u64,
    ctx: usize,
    /// The stream it was freed in.
    stream: Stream,
    /// The event recorded there after the free, until it is seen complete (then kept for
    /// another free).
    event: Option<Event>,
}

impl Idle {
    /// Whether the work before its free is done (so any stream may use it at once).
    fn done(&self, conn: &Connection) -> bool {
        self.event
            .is_none_or(|e| conn.event_query(e).unwrap_or(false))
    }
}

/// How a pool may reuse freed blocks, and what it holds.
#[derive(Debug)]
struct Pool {
    device: CUdevice,
    /// The pool's most reserved bytes (0 for no limit other than the client's).
    max_size: u64,
    opportunistic: bool,
    internal_dependencies: bool,
    follow_event_dependencies: bool,
    release_threshold: u64,
    /// Blocks handed out: address → size.
    used: BTreeMap<u64, u64>,
    idle: Vec<Idle>,
    used_high: u64,
    reserved_high: u64,
    /// Destroyed by the program while blocks were still out: gone once they are back.
    destroyed: bool,
}

impl Pool {
    fn new(device: CUdevice, max_size: u64) -> Pool {
        Pool {
            device,
            max_size,
            opportunistic: true,
            internal_dependencies: true,
            follow_event_dependencies: true,
            release_threshold: 0,
            used: BTreeMap::new(),
            idle: Vec::new(),
            used_high: 0,
            reserved_high: 0,
            destroyed: false,
        }
    }

    fn used(&self) -> u64 {
        self.used.values().sum()
    }

    fn reserved(&self) -> u64 {
        self.used() + self.idle.iter().map(|b| b.size).sum::<u64>()
    }

    /// Hands `ptr` out, raising the high-water marks.
    fn hand_out(&mut self, ptr: u64, size: u64) {
        self.used.insert(ptr, size);
        self.used_high = self.used_high.max(self.used());
        self.reserved_high = self.reserved_high.max(self.reserved());
    }
}

/// Every pool, each device's default and current pool, and events kept for later frees.
#[derive(Debug, Default)]
struct Pools {
    next: usize,
    pools: HashMap<usize, Pool>,
    default: HashMap<CUdevice, usize>,
    current: HashMap<CUdevice, usize>,
    spare_events: Vec<(CUdevice, Event)>,
}

static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

/// Runs `body` on the pools, made on first use.
fn with_pools<R>(body: impl FnOnce(&mut Pools) -> R) -> R {
    let mut p = lock(&POOLS);
    body(p.get_or_insert_with(|| Pools {
        // Pool handles stand apart from the library's other handles (`handles`) by their
        // range, so that a stream or context passed as a pool is not one.
        next: 0x4d50_0000,
        ..Pools::default()
    }))
}

impl Pools {
    fn create(&mut self, pool: Pool) -> usize {
        self.next += 16;
        self.pools.insert(self.next, pool);
        self.next
    }

    fn default_of(&mut self, dev: CUdevice) -> usize {
        if let Some(&h) = self.default.get(&dev) {
            return h;
        }
        let h = self.create(Pool::new(dev, 0));
        self.default.insert(dev, h);
        h
    }

    fn current_of(&mut self, dev: CUdevice) -> usize {
        match self.current.get(&dev) {
            Some(&h) => h,
            None => self.default_of(dev),
        }
    }

    /// The live pool `h`; CUDA_ERROR_INVALID_VALUE for any other handle.
    fn get(&mut self, h: PoolHandle) -> Res<&mut Pool> {
        self.pools
            .get_mut(&(h as usize))
            .filter(|p| !p.destroyed)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }

    /// An idle block of `pool` for `size` bytes that work in `stream` may use now, and whether
    /// the stream must first wait for the block's free: the smallest that fits, of those freed
    /// in the same stream or `done` first, then of those the stream can be made to wait for.
    fn reusable(
        &mut self,
        pool: usize,
        size: u64,
        stream: Stream,
        done: impl Fn(&Idle) -> bool,
    ) -> Option<(Idle, bool)> {
        let p = self.pools.get_mut(&pool)?;
        let fits = |b: &Idle| b.size >= size && b.size <= size.saturating_mul(FIT);
        let best = |ok: &dyn Fn(&Idle) -> bool| {
            p.idle
                .iter()
                .enumerate()
                .filter(|(_, b)| fits(b) && ok(b))
                .min_by_key(|(_, b)| b.size)
                .map(|(i, _)| i)
        };
        let opportunistic = p.opportunistic;
        let now =
            best(&|b: &Idle| b.stream == stream || (opportunistic && done(b))).map(|i| (i, false));
        let pick = now.or_else(|| {
            p.internal_dependencies
                .then(|| best(&|_: &Idle| true))
                .flatten()
                .map(|i| (i, true))
        });
        pick.map(|(i, wait)| (p.idle.swap_remove(i), wait))
    }

    /// Forgets the blocks handed out that are no allocation of their pool any more: freed by
    /// `cuMemFree` (which CUDA allows for them too) or with their context.
    fn forget_freed(&mut self) {
        let Ok(d) = driver() else { return };
        let allocations = lock(&d.allocations);
        for (h, p) in self.pools.iter_mut() {
            let dev = p.device;
            p.used
                .retain(|ptr, _| allocations.get(&(dev, *ptr)).is_some_and(|a| a.pool == *h));
        }
    }

    /// Takes the idle blocks that `block` picks out of the pools that `pool` picks: they are
    /// for the caller to give back (outside the lock, since a free waits for the device). A
    /// destroyed pool left with nothing goes.
    fn take_idle(
        &mut self,
        pool: impl Fn(usize, &Pool) -> bool,
        block: impl Fn(&Idle) -> bool,
    ) -> Vec<(CUdevice, Idle)> {
        let mut out = Vec::new();
        for (_, p) in self.pools.iter_mut().filter(|(h, p)| pool(**h, p)) {
            let (taken, kept) = std::mem::take(&mut p.idle).into_iter().partition(&block);
            p.idle = kept;
            out.extend(taken.into_iter().map(|b: Idle| (p.device, b)));
        }
        self.pools
            .retain(|_, p| !(p.destroyed && p.used.is_empty() && p.idle.is_empty()));
        out
    }
}

/// Gives idle blocks back to their servers; their events are kept for later frees. The first
/// failure, once all are tried.
fn give_back(blocks: Vec<(CUdevice, Idle)>) -> Res<()> {
    let mut first = Ok(());
    for (dev, b) in blocks {
        let r = connection(dev).and_then(|c| c.mem_free(b.ptr));
        if let Some(e) = b.event {
            with_pools(|p| p.spare_events.push((dev, e)));
        }
        if first.is_ok() {
            first = r;
        }
    }
    first
}

/// An event of device `dev` for a free: a spare one, else one of an idle block whose free is
/// done, else a new one. So a process holds as many as it has frees in flight.
fn event_for(dev: CUdevice, conn: &Connection) -> Res<Event> {
    let spare = with_pools(|p| {
        if let Some(i) = p.spare_events.iter().position(|(d, _)| *d == dev) {
            return Some(p.spare_events.swap_remove(i).1);
        }
        p.pools
            .values_mut()
            .filter(|pool| pool.device == dev)
            .flat_map(|pool| pool.idle.iter_mut())
            .find(|b| b.event.is_some() && b.done(conn))
            .and_then(|b| b.event.take())
    });
    match spare {
        Some(e) => Ok(e),
        None => conn.event_create(),
    }
}

/// Registers, once (at the first stream-ordered allocation), what the pools do at a context's
/// release ([`release_context`]) and after a context synchronisation
/// ([`release_above_threshold`]).
fn register_hooks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        driver::on_release(Stage::Late, release_context);
        driver::on_synchronized(release_above_threshold);
    });
}

/// Once all of the process's work on `conn`'s device is done: each of its pools that holds
/// more than its release threshold gives idle blocks back until it does not (the largest
/// first), as CUDA's pools do at a synchronisation.
fn release_above_threshold(conn: &Connection) -> Res<()> {
    let dev = conn.ordinal();
    let blocks = with_pools(|p| {
        let mut out = Vec::new();
        for pool in p.pools.values_mut().filter(|pool| pool.device == dev) {
            pool.idle.sort_by_key(|b| b.size);
            while pool.reserved() > pool.release_threshold {
                let Some(b) = pool.idle.pop() else { break };
                out.push((dev, b));
            }
        }
        out
    });
    give_back(blocks)
}

/// A context's release: its idle blocks go back to the server, and its blocks still out are
/// forgotten, since the release frees them with the context's other allocations.
fn release_context(ctx: &Context) -> Res<()> {
    let (h, dev) = (ctx.handle, ctx.device);
    let out: Vec<u64> = lock(&driver()?.allocations)
        .iter()
        .filter(|((d, _), a)| *d == dev && a.ctx == h && a.pool != 0)
        .map(|((_, p), _)| *p)
        .collect();
    let blocks = with_pools(|pools| {
        for p in pools.pools.values_mut().filter(|p| p.device == dev) {
            out.iter().for_each(|ptr| {
                p.used.remove(ptr);
            });
        }
        pools.take_idle(|_, p| p.device == dev, |b| b.ctx == h)
    });
    give_back(blocks)
}

// ----- allocating and freeing -----

/// `cuMemAllocAsync` (`pool` None: the stream's device's current pool) and
/// `cuMemAllocFromPoolAsync`.
fn alloc_async(
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<PoolHandle>,
    h: CUstream,
    per_thread: bool,
) -> Res<()> {
    check(!dptr.is_null() && size > 0)?;
    let ctx = with_target(h, per_thread, |t| Ok(t.ctx.handle))?;
    let (stream, conn) = for_work(h, per_thread)?;
    capture::refuse_in_capture(
        conn,
        stream,
        "a stream-ordered allocation (cuMemAllocAsync)",
    )?;
    register_hooks();
    let dev = conn.ordinal();
    let size = (size as u64).div_ceil(GRAIN) * GRAIN;
    let (handle, reuse) = with_pools(|p| -> Res<_> {
        let handle = match pool {
            Some(h) => {
                check(p.get(h)?.device == dev)?;
                h as usize
            }
            None => p.current_of(dev),
        };
        Ok((handle, p.reusable(handle, size, stream, |b| b.done(conn))))
    })?;
    let (ptr, size) = match reuse {
        Some((b, wait)) => {
            if let (true, Some(e)) = (wait, b.event) {
                if let Err(err) = conn.stream_wait_event(stream, e) {
                    // Not handed out: the block stays the pool's.
                    with_pools(|p| p.pools.get_mut(&handle).map(|pool| pool.idle.push(b)));
                    return Err(err);
                }
            }
            if let Some(e) = b.event {
                with_pools(|p| p.spare_events.push((dev, e)));
            }
            (b.ptr, b.size)
        }
        None => (fresh(handle, size, dev, conn)?, size),
    };
    let a = Allocation {
        ctx,
        size,
        id: next_buffer_id(),
        pool: handle,
    };
    // An allocation before it is counted as out: `forget_freed` keeps only allocations.
    lock(&driver()?.allocations).insert((dev, ptr), a);
    with_pools(|p| {
        p.forget_freed();
        if let Some(pool) = p.pools.get_mut(&handle) {
            pool.hand_out(ptr, size);
        }
    });
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(dptr, ptr) }
}

/// New device memory for pool `handle` of device `dev`: out of memory, the device's pools give
/// their idle blocks back and it is tried once more.
fn fresh(handle: usize, size: u64, dev: CUdevice, conn: &Connection) -> Res<u64> {
    let max = with_pools(|p| {
        p.pools
            .get(&handle)
            .map(|pool| (pool.max_size, pool.reserved()))
    });
    if let Some((max, reserved)) = max.filter(|(max, _)| *max != 0) {
        if reserved + size > max {
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
    }
    match conn.mem_alloc(size) {
        Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
            let idle = with_pools(|p| p.take_idle(|_, p| p.device == dev, |_| true));
            if idle.is_empty() {
                return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            }
            give_back(idle)?;
            conn.mem_alloc(size)
        }
        r => r,
    }
}

/// `cuMemFreeAsync`: a pool's block goes back to it, ordered after `h`'s earlier work (see the
/// module's documentation); memory of `cuMemAlloc` is freed once that work is done.
fn free_async(ptr: CUdeviceptr, h: CUstream, per_thread: bool) -> Res<()> {
    check(ptr != 0)?;
    let (stream, conn) = for_work(h, per_thread)?;
    capture::refuse_in_capture(conn, stream, "a stream-ordered free (cuMemFreeAsync)")?;
    let dev = conn.ordinal();
    let d = driver()?;
    let a = *lock(&d.allocations)
        .get(&(dev, ptr))
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if a.pool == 0 {
        log::detail_once("cuMemFreeAsync of cuMemAlloc", || {
            "cuMemFreeAsync of memory from cuMemAlloc: freed once the stream's earlier work is \
             done, the host waiting for it"
                .into()
        });
        capture::free_call(conn, "cuMemFreeAsync")?;
        conn.stream_synchronize(stream)?;
        conn.mem_free(ptr)?;
        lock(&d.allocations).remove(&(dev, ptr));
        return Ok(());
    }
    let event = event_for(dev, conn)?;
    if let Err(e) = conn.event_record(event, stream) {
        with_pools(|p| p.spare_events.push((dev, event)));
        return Err(e);
    }
    lock(&d.allocations).remove(&(dev, ptr));
    with_pools(|p| {
        if let Some(pool) = p.pools.get_mut(&a.pool) {
            pool.used.remove(&ptr);
            pool.idle.push(Idle {
                ptr,
                size: a.size,
                ctx: a.ctx,
                stream,
                event: Some(event),
            });
        }
    });
    Ok(())
}

// ----- pools -----

/// # Safety
/// `props` must be NULL or a `CUmemPoolProps`.
unsafe fn create(out: *mut PoolHandle, props: *const PoolProps) -> Res<()> {
    check(!out.is_null() && !props.is_null())?;
    // SAFETY: checked non-null; the caller guarantees it is a CUmemPoolProps.
    let props = unsafe { props.read_unaligned() };
    check(props.alloc_type == ALLOCATION_PINNED)?;
    if props.location.type_ != LOCATION_DEVICE || props.handle_types != 0 {
        log::once("cuMemPoolCreate kind", || {
            format!(
                "cuMemPoolCreate: only pools of device memory without shareable handles are \
                 supported through mps (asked: location type {}, handle types {:#x}); \
                 returning CUDA_ERROR_NOT_SUPPORTED",
                props.location.type_, props.handle_types
            )
        });
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    let dev = props.location.id;
    driver()?.device(dev)?;
    let h = with_pools(|p| p.create(Pool::new(dev, props.max_size as u64)));
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, h as PoolHandle) }
}

fn destroy(h: PoolHandle) -> Res<()> {
    let handle = h as usize;
    let blocks = with_pools(|p| -> Res<_> {
        let dev = p.get(h)?.device;
        // A device's default pool lasts as long as the device.
        check(p.default.get(&dev) != Some(&handle))?;
        if p.current.get(&dev) == Some(&handle) {
            p.current.remove(&dev);
        }
        p.get(h)?.destroyed = true;
        p.forget_freed();
        Ok(p.take_idle(|x, _| x == handle, |_| true))
    })?;
    give_back(blocks)
}

fn trim_to(h: PoolHandle, keep: usize) -> Res<()> {
    let blocks = with_pools(|p| -> Res<_> {
        let pool = p.get(h)?;
        let mut out = Vec::new();
        // The largest blocks first: the fewest frees to get under the figure.
        pool.idle.sort_by_key(|b| b.size);
        while pool.reserved() > keep as u64 {
            let Some(b) = pool.idle.pop() else { break };
            out.push((pool.device, b));
        }
        Ok(out)
    })?;
    give_back(blocks)
}

/// # Safety
/// `value` must be NULL or point at the attribute's type (an `int` or a `cuuint64_t`).
unsafe fn set_attribute(h: PoolHandle, attr: u32, value: *const c_void) -> Res<()> {
    check(!value.is_null())?;
    with_pools(|p| {
        let pool = p.get(h)?;
        // SAFETY: checked non-null; the caller guarantees the attribute's type.
        let flag = || unsafe { value.cast::<i32>().read_unaligned() } != 0;
        // SAFETY: as above.
        let word = || unsafe { value.cast::<u64>().read_unaligned() };
        match attr {
            A::REUSE_FOLLOW_EVENT_DEPENDENCIES => pool.follow_event_dependencies = flag(),
            A::REUSE_ALLOW_OPPORTUNISTIC => pool.opportunistic = flag(),
            A::REUSE_ALLOW_INTERNAL_DEPENDENCIES => pool.internal_dependencies = flag(),
            A::RELEASE_THRESHOLD => pool.release_threshold = word(),
            // A high-water mark may only be reset (to the current figure), by setting 0.
            A::RESERVED_MEM_HIGH if word() == 0 => pool.reserved_high = pool.reserved(),
            A::USED_MEM_HIGH if word() == 0 => pool.used_high = pool.used(),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    })
}

/// # Safety
/// `value` must be NULL or writable for the attribute's type.
unsafe fn get_attribute(h: PoolHandle, attr: u32, value: *mut c_void) -> Res<()> {
    check(!value.is_null())?;
    enum V {
        Flag(bool),
        Word(u64),
    }
    let v = with_pools(|p| -> Res<V> {
        p.forget_freed();
        let pool = p.get(h)?;
        Ok(match attr {
            A::REUSE_FOLLOW_EVENT_DEPENDENCIES => V::Flag(pool.follow_event_dependencies),
            A::REUSE_ALLOW_OPPORTUNISTIC => V::Flag(pool.opportunistic),
            A::REUSE_ALLOW_INTERNAL_DEPENDENCIES => V::Flag(pool.internal_dependencies),
            A::RELEASE_THRESHOLD => V::Word(pool.release_threshold),
            A::RESERVED_MEM_CURRENT => V::Word(pool.reserved()),
            A::RESERVED_MEM_HIGH => V::Word(pool.reserved_high),
            A::USED_MEM_CURRENT => V::Word(pool.used()),
            A::USED_MEM_HIGH => V::Word(pool.used_high),
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        })
    })?;
    // SAFETY: checked non-null; the caller guarantees room for the attribute's type.
    unsafe {
        match v {
            V::Flag(f) => value.cast::<i32>().write_unaligned(f as i32),
            V::Word(w) => value.cast::<u64>().write_unaligned(w),
        }
    }
    Ok(())
}

/// # Safety
/// `map` must be NULL or hold `count` `CUmemAccessDesc`s.
unsafe fn set_access(h: PoolHandle, map: *const AccessDesc, count: usize) -> Res<()> {
    check(!map.is_null() || count == 0)?;
    let dev = with_pools(|p| p.get(h).map(|pool| pool.device))?;
    let devices = driver()?.devices.len() as CUdevice;
    for i in 0..count {
        // SAFETY: the caller guarantees `count` entries.
        let a = unsafe { map.add(i).read_unaligned() };
        check(a.location.type_ == LOCATION_DEVICE && (0..devices).contains(&a.location.id))?;
        match (a.location.id == dev, a.flags) {
            (true, ACCESS_READWRITE) | (false, ACCESS_NONE) => {}
            // The pool's own device always reads and writes it.
            (true, _) => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
            (false, _) => {
                log::once("cuMemPoolSetAccess peer", || {
                    format!(
                        "cuMemPoolSetAccess: access to a pool of device {dev} from device {} is \
                         not supported through mps (no server maps another's memory); \
                         returning CUDA_ERROR_NOT_SUPPORTED",
                        a.location.id
                    )
                });
                return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
            }
        }
    }
    Ok(())
}

/// # Safety
/// `flags` must be NULL or writable, `location` NULL or a `CUmemLocation`.
unsafe fn get_access(flags: *mut u32, h: PoolHandle, location: *const Location) -> Res<()> {
    check(!flags.is_null() && !location.is_null())?;
    // SAFETY: checked non-null; the caller guarantees it is a CUmemLocation.
    let at = unsafe { location.read_unaligned() };
    let dev = with_pools(|p| p.get(h).map(|pool| pool.device))?;
    let devices = driver()?.devices.len() as CUdevice;
    check(at.type_ == LOCATION_DEVICE && (0..devices).contains(&at.id))?;
    let f = if at.id == dev {
        ACCESS_READWRITE
    } else {
        ACCESS_NONE
    };
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(flags, f) }
}

/// The device that a CUDA 13 pool query's location and allocation type name: device memory
/// only.
///
/// # Safety
/// `location` must be NULL or a `CUmemLocation`.
unsafe fn located(location: *const Location, alloc_type: u32) -> Res<CUdevice> {
    check(!location.is_null())?;
    // SAFETY: checked non-null; the caller guarantees it is a CUmemLocation.
    let at = unsafe { location.read_unaligned() };
    check(alloc_type == ALLOCATION_PINNED)?;
    if at.type_ != LOCATION_DEVICE {
        log::once("memory pool of the host", || {
            format!(
                "memory pools of location type {} (not a device) are not supported through \
                 mps; returning CUDA_ERROR_NOT_SUPPORTED",
                at.type_
            )
        });
        return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
    }
    driver()?.device(at.id)?;
    Ok(at.id)
}

fn device_pool(out: *mut PoolHandle, dev: CUdevice, current: bool) -> Res<()> {
    check(!out.is_null())?;
    driver()?.device(dev)?;
    let h = with_pools(|p| {
        if current {
            p.current_of(dev)
        } else {
            p.default_of(dev)
        }
    });
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, h as PoolHandle) }
}

fn set_device_pool(dev: CUdevice, h: PoolHandle) -> Res<()> {
    driver()?.device(dev)?;
    with_pools(|p| {
        check(p.get(h)?.device == dev)?;
        p.current.insert(dev, h as usize);
        Ok(())
    })
}

// ----- the exports -----

exports! {
    /// # Safety
    /// `dptr` must be NULL or writable.
    pub unsafe fn cuMemAllocAsync(
        dptr: *mut CUdeviceptr,
        size: usize,
        h: CUstream,
    ) ["cuMemAllocAsync" 11020]
        per_thread cuMemAllocAsync_ptsz = |per_thread| alloc_async(dptr, size, None, h, per_thread);

    /// # Safety
    /// `dptr` must be NULL or writable.
    pub unsafe fn cuMemAllocFromPoolAsync(
        dptr: *mut CUdeviceptr,
        size: usize,
        pool: PoolHandle,
        h: CUstream,
    ) ["cuMemAllocFromPoolAsync" 11020]
        per_thread cuMemAllocFromPoolAsync_ptsz = |per_thread|
            alloc_async(dptr, size, Some(pool), h, per_thread);

    pub fn cuMemFreeAsync(dptr: CUdeviceptr, h: CUstream) ["cuMemFreeAsync" 11020]
        per_thread cuMemFreeAsync_ptsz = |per_thread| free_async(dptr, h, per_thread);

    /// # Safety
    /// `pool` must be NULL or writable, `props` NULL or a `CUmemPoolProps`.
    pub unsafe fn cuMemPoolCreate(
        pool: *mut PoolHandle,
        props: *const PoolProps,
    ) ["cuMemPoolCreate" 11020] =
        // SAFETY: the caller's guarantee is create's precondition.
        unsafe { create(pool, props) };

    pub fn cuMemPoolDestroy(pool: PoolHandle) ["cuMemPoolDestroy" 11020] = destroy(pool);

    pub fn cuMemPoolTrimTo(pool: PoolHandle, keep: usize) ["cuMemPoolTrimTo" 11020] =
        trim_to(pool, keep);

    /// # Safety
    /// `value` must be NULL or point at the attribute's type.
    pub unsafe fn cuMemPoolSetAttribute(
        pool: PoolHandle,
        attr: u32,
        value: *const c_void,
    ) ["cuMemPoolSetAttribute" 11020] =
        // SAFETY: the caller's guarantee is set_attribute's precondition.
        unsafe { set_attribute(pool, attr, value) };

    /// # Safety
    /// `value` must be NULL or writable for the attribute's type.
    pub unsafe fn cuMemPoolGetAttribute(
        pool: PoolHandle,
        attr: u32,
        value: *mut c_void,
    ) ["cuMemPoolGetAttribute" 11020] =
        // SAFETY: the caller's guarantee is get_attribute's precondition.
        unsafe { get_attribute(pool, attr, value) };

    /// # Safety
    /// `map` must be NULL or hold `count` `CUmemAccessDesc`s.
    pub unsafe fn cuMemPoolSetAccess(
        pool: PoolHandle,
        map: *const AccessDesc,
        count: usize,
    ) ["cuMemPoolSetAccess" 11020] =
        // SAFETY: the caller's guarantee is set_access's precondition.
        unsafe { set_access(pool, map, count) };

    /// # Safety
    /// `flags` must be NULL or writable, `location` NULL or a `CUmemLocation`.
    pub unsafe fn cuMemPoolGetAccess(
        flags: *mut u32,
        pool: PoolHandle,
        location: *const Location,
    ) ["cuMemPoolGetAccess" 11020] =
        // SAFETY: the caller's guarantee is get_access's precondition.
        unsafe { get_access(flags, pool, location) };

    /// # Safety
    /// `pool` must be NULL or writable.
    pub unsafe fn cuDeviceGetDefaultMemPool(
        pool: *mut PoolHandle,
        dev: CUdevice,
    ) ["cuDeviceGetDefaultMemPool" 11020] =
        device_pool(pool, dev, false);

    /// # Safety
    /// `pool` must be NULL or writable.
    pub unsafe fn cuDeviceGetMemPool(
        pool: *mut PoolHandle,
        dev: CUdevice,
    ) ["cuDeviceGetMemPool" 11020] =
        device_pool(pool, dev, true);

    pub fn cuDeviceSetMemPool(dev: CUdevice, pool: PoolHandle) ["cuDeviceSetMemPool" 11020] =
        set_device_pool(dev, pool);

    /// # Safety
    /// `pool` must be NULL or writable, `location` NULL or a `CUmemLocation`.
    pub unsafe fn cuMemGetDefaultMemPool(
        pool: *mut PoolHandle,
        location: *const Location,
        alloc_type: u32,
    ) ["cuMemGetDefaultMemPool" 13000] =
        // SAFETY: the caller's guarantee is located's precondition.
        device_pool(pool, unsafe { located(location, alloc_type) }?, false);

    /// # Safety
    /// `pool` must be NULL or writable, `location` NULL or a `CUmemLocation`.
    pub unsafe fn cuMemGetMemPool(
        pool: *mut PoolHandle,
        location: *const Location,
        alloc_type: u32,
    ) ["cuMemGetMemPool" 13000] =
        // SAFETY: the caller's guarantee is located's precondition.
        device_pool(pool, unsafe { located(location, alloc_type) }?, true);

    /// # Safety
    /// `location` must be NULL or a `CUmemLocation`.
    pub unsafe fn cuMemSetMemPool(
        location: *const Location,
        alloc_type: u32,
        pool: PoolHandle,
    ) ["cuMemSetMemPool" 13000] =
        // SAFETY: the caller's guarantee is located's precondition.
        set_device_pool(unsafe { located(location, alloc_type) }?, pool);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(ptr: u64, size: u64, stream: u64, event: Option<u64>) -> Idle {
        Idle {
            ptr,
            size,
            ctx: 0x40,
            stream: Stream(stream),
            event: event.map(Event),
        }
    }

    fn pools_with(blocks: Vec<Idle>) -> (Pools, usize) {
        let mut p = Pools::default();
        let h = p.create(Pool::new(0, 0));
        p.pools.get_mut(&h).unwrap().idle = blocks;
        (p, h)
    }

    #[test]
    fn a_block_is_reused_where_its_free_is_ordered_before_the_new_user() {
        let never = |_: &Idle| false;
        // Freed in the same stream: used at once, its free still pending.
        let (mut p, h) = pools_with(vec![idle(0x1000, 4096, 7, Some(1))]);
        assert_eq!(
            p.reusable(h, 4096, Stream(7), never)
                .map(|(b, w)| (b.ptr, w)),
            Some((0x1000, false))
        );
        // Another stream: at once if its free is done, else after a wait for its event.
        let (mut p, h) = pools_with(vec![idle(0x1000, 4096, 7, Some(1))]);
        assert_eq!(
            p.reusable(h, 4096, Stream(8), |_| true).map(|(_, w)| w),
            Some(false)
        );
        let (mut p, h) = pools_with(vec![idle(0x1000, 4096, 7, Some(1))]);
        assert_eq!(
            p.reusable(h, 4096, Stream(8), never).map(|(_, w)| w),
            Some(true)
        );
        // Neither allowed: not reused in another stream before its free is seen done.
        let (mut p, h) = pools_with(vec![idle(0x1000, 4096, 7, Some(1))]);
        let pool = p.pools.get_mut(&h).unwrap();
        pool.internal_dependencies = false;
        assert!(p.reusable(h, 4096, Stream(8), never).is_none());
        let pool = p.pools.get_mut(&h).unwrap();
        pool.opportunistic = false;
        assert!(p.reusable(h, 4096, Stream(8), |_| true).is_none());
        assert!(p.reusable(h, 4096, Stream(7), never).is_some());
    }

    #[test]
    fn the_smallest_block_that_fits_is_taken_and_none_twice_the_size() {
        let blocks = vec![
            idle(0x1000, 8192, 1, None),
            idle(0x9000, 4096, 1, None),
            idle(0x20000, 2048, 1, None),
        ];
        let (mut p, h) = pools_with(blocks);
        let take =
            |p: &mut Pools, size| p.reusable(h, size, Stream(1), |_| true).map(|(b, _)| b.ptr);
        assert_eq!(take(&mut p, 3000), Some(0x9000));
        // 8192 is more than twice 3000.
        assert_eq!(take(&mut p, 3000), None);
        assert_eq!(take(&mut p, 5000), Some(0x1000));
        assert_eq!(take(&mut p, 1024), Some(0x20000));
    }

    #[test]
    fn the_figures_count_blocks_out_and_idle_and_keep_their_highs() {
        let (mut p, h) = pools_with(vec![idle(0x1000, 4096, 1, None)]);
        let pool = p.pools.get_mut(&h).unwrap();
        pool.hand_out(0x8000, 1024);
        pool.hand_out(0x9000, 2048);
        assert_eq!((pool.used(), pool.reserved()), (3072, 7168));
        pool.used.remove(&0x8000);
        assert_eq!(
            (pool.used(), pool.used_high, pool.reserved_high),
            (2048, 3072, 7168)
        );
    }

    #[test]
    fn taking_idle_blocks_takes_those_picked_and_ends_a_destroyed_pool_left_empty() {
        let (mut p, h) = pools_with(vec![
            idle(0x1000, 4096, 1, None),
            idle(0x2000, 4096, 2, None),
        ]);
        let taken = p.take_idle(|x, _| x == h, |b| b.stream == Stream(2));
        assert_eq!(
            taken.iter().map(|(_, b)| b.ptr).collect::<Vec<_>>(),
            [0x2000]
        );
        assert_eq!(p.pools[&h].idle.len(), 1);
        p.pools.get_mut(&h).unwrap().destroyed = true;
        let taken = p.take_idle(|_, _| true, |_| true);
        assert_eq!(taken.len(), 1);
        assert!(!p.pools.contains_key(&h));
    }
}
