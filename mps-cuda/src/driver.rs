//! The process's driver state: the devices `cuInit` found and their connections, the
//! registries of handles, and what a context's release calls in the areas that keep more.
//!
//! A device is connected on its first use (a context made on it, a question about it), not at
//! `cuInit`: a program that uses one device of several holds one client, on one server.
//! [`connection`] is the one place that maps a device (and so a context, and what belongs to
//! it) to its connection.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::abi::{CUdevice, CUresult};
use crate::connection::{Connection, Res};
use crate::ffi::lock;
use crate::handles::Registry;
use crate::log;
use crate::objects::{Context, EventObj, FunctionObj, ModuleObj, StreamObj};

/// One device this process sees (`CUDA_VISIBLE_DEVICES` applied), by its CUDA ordinal.
#[derive(Debug)]
pub(crate) struct DeviceSlot {
    ordinal: CUdevice,
    /// Set on first use.
    conn: OnceLock<Connection>,
    /// Why the connection failed, once it did: kept, as CUDA keeps a device's failure to
    /// initialise, so that every later question is not a new attempt (each of which would
    /// have the daemon start a server again).
    failed: OnceLock<CUresult>,
    /// Held while connecting, so that two threads do not both connect.
    connecting: Mutex<()>,
    /// The device's primary context (always registered; active while retained).
    pub(crate) primary: Arc<Context>,
}

impl DeviceSlot {
    fn connection(&self) -> Res<&Connection> {
        if let Some(c) = self.conn.get() {
            return Ok(c);
        }
        let _one_at_a_time = lock(&self.connecting);
        if let Some(c) = self.conn.get() {
            return Ok(c);
        }
        if let Some(&failed) = self.failed.get() {
            return Err(failed);
        }
        let c = Connection::connect(self.ordinal as u32).map_err(|(message, result)| {
            log::always(&format!(
                "device {}: {message} (its later calls fail alike)",
                self.ordinal
            ));
            self.failed.get_or_init(|| result);
            result
        })?;
        Ok(self.conn.get_or_init(|| c))
    }
}

/// Everything `cuInit` sets up.
#[derive(Debug)]
pub(crate) struct Driver {
    pub(crate) devices: Vec<DeviceSlot>,
    pub(crate) contexts: Registry<Context>,
    pub(crate) streams: Registry<StreamObj>,
    pub(crate) events: Registry<EventObj>,
    pub(crate) modules: Registry<ModuleObj>,
    /// Functions and kernels share one registry: cudart launches a CUkernel as a CUfunction.
    pub(crate) functions: Registry<FunctionObj>,
    /// Device allocations by (device, address). Two servers may hand out the same address,
    /// so the address alone names no allocation.
    pub(crate) allocations: Mutex<BTreeMap<(CUdevice, u64), Allocation>>,
    /// Page-locked host allocations (the servers' shared host buffers, mapped into this
    /// process, so their addresses are distinct), by address.
    pub(crate) host: Mutex<BTreeMap<usize, HostBuffer>>,
}

/// A device allocation (`cuMemAlloc`'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// The context that made it.
    pub(crate) ctx: usize,
    pub(crate) size: u64,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`'s.
    pub(crate) id: u64,
    /// The memory pool it came from (`CUmemoryPool`, `CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`'s);
    /// 0 for `cuMemAlloc`'s.
    pub(crate) pool: usize,
}

/// A page-locked host buffer (`cuMemHostAlloc`'s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostBuffer {
    pub(crate) len: usize,
    /// The context that made it, and its device.
    pub(crate) ctx: usize,
    pub(crate) device: CUdevice,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`'s.
    pub(crate) id: u64,
    /// Its device address (`cuMemHostGetDevicePointer`'s), if the server gave one.
    pub(crate) at: Option<u64>,
}

/// A new process-wide unique buffer id (`CU_POINTER_ATTRIBUTE_BUFFER_ID`), never 0.
pub(crate) fn next_buffer_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

static DRIVER: OnceLock<Result<Driver, CUresult>> = OnceLock::new();

/// Counts the devices once; later calls return the first call's result, as CUDA's `cuInit`
/// does. No device is connected yet (see the module's documentation).
pub(crate) fn init() -> Res<()> {
    DRIVER
        .get_or_init(|| {
            let count = Connection::device_count().map_err(|message| {
                log::always(&format!(
                    "no device: {message} (this program runs through mps's libcuda.so.1, \
                     which serves the devices of an mps server)"
                ));
                CUresult::CUDA_ERROR_NO_DEVICE
            })?;
            if count == 0 {
                log::always(
                    "no device: the mps server serves none that CUDA_VISIBLE_DEVICES shows \
                     (unset it, or list the ordinals of served devices)",
                );
                return Err(CUresult::CUDA_ERROR_NO_DEVICE);
            }
            let contexts = Registry::memoised();
            let devices = (0..count as CUdevice)
                .map(|ordinal| DeviceSlot {
                    ordinal,
                    conn: OnceLock::new(),
                    failed: OnceLock::new(),
                    connecting: Mutex::new(()),
                    primary: contexts
                        .insert_with(|handle| Context::primary(handle, ordinal))
                        .1,
                })
                .collect();
            Ok(Driver {
                devices,
                contexts,
                streams: Registry::memoised(),
                events: Registry::memoised(),
                modules: Registry::default(),
                functions: Registry::memoised(),
                allocations: Mutex::new(BTreeMap::new()),
                host: Mutex::new(BTreeMap::new()),
            })
        })
        .as_ref()
        .map(drop)
        .map_err(|e| *e)
}

/// The driver, once `cuInit` has succeeded.
pub(crate) fn driver() -> Res<&'static Driver> {
    match DRIVER.get() {
        Some(Ok(d)) => Ok(d),
        Some(Err(e)) => Err(*e),
        None => Err(CUresult::CUDA_ERROR_NOT_INITIALIZED),
    }
}

impl Driver {
    /// Device `dev`; `CUDA_ERROR_INVALID_DEVICE` for an ordinal this process does not see.
    pub(crate) fn device(&self, dev: CUdevice) -> Res<&DeviceSlot> {
        usize::try_from(dev)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)
    }
}

/// The connection to device `dev`'s server, made on the first call for that device. Every
/// object (context, stream, event, module, allocation) reaches its server through this, by the
/// device it belongs to.
pub(crate) fn connection(dev: CUdevice) -> Res<&'static Connection> {
    driver()?.device(dev)?.connection()
}

impl Context {
    /// The connection to its device's server.
    pub(crate) fn conn(&self) -> Res<&'static Connection> {
        connection(self.device)
    }
}

/// When a hook runs in a context's release: `Early` before anything else, while the context
/// still works; `Late` once its work is done and its streams and events are gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Early,
    Late,
}

/// What an area of the library that keeps things of its own for a context (the runtime's
/// context-local storage, modules) frees when the context is released; the first failure.
pub(crate) type ReleaseHook = fn(&Context) -> Res<()>;

static HOOKS: Mutex<Vec<(Stage, ReleaseHook)>> = Mutex::new(Vec::new());

/// Has `hook` run at `stage` of every later release of a context. An area registers its hook
/// once, when it first keeps something for a context (with a `Once`), so that the release
/// needs to know no area above it.
pub(crate) fn on_release(stage: Stage, hook: ReleaseHook) {
    lock(&HOOKS).push((stage, hook));
}

/// What an area that keeps device memory idle (the memory pools) gives back once all of the
/// process's work on the device of a connection is done (`cuCtxSynchronize`).
pub(crate) type SynchronizedHook = fn(&Connection) -> Res<()>;

static SYNCHRONIZED: Mutex<Vec<SynchronizedHook>> = Mutex::new(Vec::new());

/// Has `hook` run after every later context synchronisation; registered once, as
/// [`on_release`]'s hooks are.
pub(crate) fn on_synchronized(hook: SynchronizedHook) {
    lock(&SYNCHRONIZED).push(hook);
}

/// Runs the synchronisation hooks for `conn`'s device, outside the lock; the first failure.
pub(crate) fn run_synchronized_hooks(conn: &Connection) -> Res<()> {
    let hooks: Vec<SynchronizedHook> = lock(&SYNCHRONIZED).clone();
    hooks.into_iter().try_for_each(|h| h(conn))
}

/// Runs the hooks of `stage` for `ctx`, in the order they were registered, each result to
/// `keep`. The hooks run outside the lock: one may call back into the library.
pub(crate) fn run_release_hooks(ctx: &Context, stage: Stage, mut keep: impl FnMut(Res<()>)) {
    let hooks: Vec<ReleaseHook> = lock(&HOOKS)
        .iter()
        .filter(|(s, _)| *s == stage)
        .map(|(_, h)| *h)
        .collect();
    for hook in hooks {
        keep(hook(ctx));
    }
}
