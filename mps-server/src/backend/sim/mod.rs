//! The CPU simulator: the semantics of the CUDA backend without a GPU.
//!
//! Device memory is host memory ([`memory`]); each stream is a worker thread that runs its work
//! in order, so different streams (of one client or of many) run concurrently; kernels are CPU
//! implementations bound by PTX entry name (`kernels`); events carry completion timestamps.
//!
//! A kernel fault costs the faulting client its work ([`FaultScope::Client`], the default), or,
//! modelling a GPU, the whole context ([`FaultScope::Context`]): every client of the server is
//! told, and every later call fails, as on a GPU (whose kernel fault ends the context of the
//! process); this is what lets the server's recovery be tested without one.
//!
//! Past 600 lines: the `Backend` impl and the stream workers it feeds are one idea; the kernels,
//! memory, attributes and fatbin reading live in modules of their own, and the tests take the rest.

mod attributes;
mod fatbin;
mod kernels;
pub mod memory;
mod occupancy;

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mps_core::limits::DeviceLimits;
use mps_core::protocol::{
    BackendKind, CONTEXT_LIMITS, DeviceCopy, FUNC_ATTRIBUTES, Fill, LaunchSpec, OccupancyQuery,
    ParamInfo, TENSOR_MAP_BYTES, TensorMapTiled,
};
use mps_core::ptx::{self, ImageFormat};
use mps_core::{Error, Result, Status};
use mps_ipc::segment::Segment;

use super::{Backend, ClientContext, DeviceInfo, FaultSink, Op, Publish};
use crate::sm::Assignment;
use kernels::{Builtin, KernelEnv};
use memory::DeviceMemory;

/// `CUDA_ERROR_NO_BINARY_FOR_GPU`, the driver's result for an image with no code for its device.
const NO_BINARY_FOR_GPU: u32 = 209;

/// Settings of the simulated device.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Bytes of device memory.
    pub memory_bytes: u64,
    /// Simulated SMs: a kernel's blocks run in waves of this many.
    pub sm_count: u32,
    /// What a kernel fault ends.
    pub fault_scope: FaultScope,
    /// Time each host-to-device copy takes before its bytes land, as a DMA's does: zero
    /// unless a test widens the window in which a copy is queued but not yet done, to check
    /// what waits for it.
    pub copy_latency: std::time::Duration,
}

/// What a faulting kernel takes down in the simulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultScope {
    /// The faulting client's work only: the other clients of the server run on.
    #[default]
    Client,
    /// The whole context, as on a GPU: every client of the server gets the fault, and every
    /// later call fails with it.
    Context,
}

/// The simulated context and, under [`FaultScope::Context`], its death.
#[derive(Debug)]
struct SimContext {
    scope: FaultScope,
    copy_latency: std::time::Duration,
    /// Set once `dead` holds the failure; read on every submission without a lock.
    is_dead: AtomicBool,
    dead: Mutex<Option<Error>>,
    /// Every client with a stream, to be told when the context dies.
    clients: Mutex<Vec<Weak<dyn FaultSink>>>,
}

impl SimContext {
    fn alive(&self) -> Result<()> {
        if !self.is_dead.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.dead.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn watch(&self, faults: &Arc<dyn FaultSink>) {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.retain(|w| w.strong_count() > 0);
        clients.push(Arc::downgrade(faults));
    }

    /// Command `seq` of the client whose faults go to `victim`, a kernel, failed with `cause`.
    /// Under [`FaultScope::Context`] the context dies: every client is told, the victim of its
    /// own command.
    fn kernel_failed(&self, cause: Error, victim: &dyn FaultSink, seq: u64) {
        if self.scope == FaultScope::Client {
            return victim.fault(seq, cause);
        }
        let mut dead = self.dead.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &*dead {
            return victim.fault(seq, e.clone());
        }
        let err = Error::new(
            cause.status,
            format!(
                "the server's simulated context failed ({}); a kernel of a client of this server \
                 faulted, and the simulator, modelling a GPU (--sim-fault-scope context), ends the \
                 context for every client: reconnect to a new server",
                cause.message
            ),
        );
        tracing::error!("{}", err.message);
        *dead = Some(err.clone());
        self.is_dead.store(true, Ordering::Release);
        drop(dead);
        // The others first, in the order they came (the server's own watch first, so that it
        // takes no new client before the victim can hear of the fault and reconnect).
        let clients = std::mem::take(&mut *self.clients.lock().unwrap_or_else(|p| p.into_inner()));
        let victim_at: *const dyn FaultSink = victim;
        for c in clients.iter().filter_map(Weak::upgrade) {
            if !std::ptr::addr_eq(Arc::as_ptr(&c), victim_at) {
                c.fault(0, err.clone());
            }
        }
        victim.fault(seq, err);
    }
}

/// The simulator.
#[derive(Debug)]
pub struct SimBackend {
    info: DeviceInfo,
    memory: Arc<DeviceMemory>,
    epoch: Instant,
    context: Arc<SimContext>,
}

impl SimBackend {
    /// A simulated device.
    pub fn new(cfg: SimConfig) -> Result<SimBackend> {
        if cfg.sm_count == 0 {
            return Err(Error::invalid_value("the simulator needs at least one SM"));
        }
        Ok(SimBackend {
            info: DeviceInfo {
                name: "mps simulator".to_string(),
                total_mem: cfg.memory_bytes,
                sm_count: cfg.sm_count,
                // Partitions of single SMs: a share or reservation gets exactly its SMs.
                sm_units: vec![1; cfg.sm_count as usize],
                // The compute capability and launch limits of the H200 the simulator stands
                // in for (documented at `DeviceLimits::SM_90`).
                cc: (9, 0),
                limits: DeviceLimits::SM_90,
                kind: BackendKind::Sim,
                attributes: attributes::attributes(cfg.sm_count),
                uuid: Some(attributes::uuid(0)),
            },
            memory: Arc::new(DeviceMemory::new(cfg.memory_bytes)?),
            epoch: Instant::now(),
            context: Arc::new(SimContext {
                scope: cfg.fault_scope,
                copy_latency: cfg.copy_latency,
                is_dead: AtomicBool::new(false),
                dead: Mutex::new(None),
                clients: Mutex::new(Vec::new()),
            }),
        })
    }
}

impl SimBackend {
    /// The simulated device as device ordinal `device` of its host: its name says which, so
    /// that a client of several devices (and a test) can tell them apart. Each server process
    /// simulates a device of its own, with its own memory.
    pub fn as_device(mut self, device: u32) -> SimBackend {
        self.info.name = format!("mps simulator {device}");
        self.info.uuid = Some(attributes::uuid(device));
        self
    }
}

/// A module: its PTX entries.
#[derive(Debug)]
pub struct SimModule {
    entries: Vec<ptx::Entry>,
}

/// A kernel bound to its CPU implementation.
#[derive(Debug)]
pub struct SimFunction {
    builtin: &'static Builtin,
    layout: Vec<ParamInfo>,
}

impl std::fmt::Debug for Builtin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

#[derive(Debug, Default)]
struct EventState {
    /// Number of the latest record that completed.
    completed: u64,
    /// When it completed, in ns since the backend started.
    at_ns: u64,
}

/// An event: records are numbered as they are queued; waits wait for the number current when
/// they were queued.
#[derive(Debug, Default)]
pub struct SimEvent {
    queued: AtomicU64,
    state: Mutex<EventState>,
    changed: Condvar,
}

impl SimEvent {
    fn state(&self) -> std::sync::MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct Job {
    seq: u64,
    op: Op<'static, SimBackend>,
    publish: Option<Publish>,
    /// For a record, its number; for a wait, the record number to wait for.
    event_no: u64,
    /// Signalled when the worker reaches this job (how the simulator synchronises a stream).
    notify: Option<mpsc::Sender<()>>,
}

/// A stream: a worker thread fed through a channel.
#[derive(Debug)]
pub struct SimStream {
    jobs: mpsc::Sender<Job>,
    worker: JoinHandle<()>,
    /// While the stream captures, the work submitted to it, in order.
    capture: RefCell<Option<Vec<Op<'static, SimBackend>>>>,
}

/// A captured graph: the work its stream was given, to be replayed in order.
#[derive(Debug)]
pub struct SimGraph {
    ops: Arc<Vec<Op<'static, SimBackend>>>,
}

/// An executable graph: the captured work, shared with the graph it was made from until a
/// launch of it is given new parameters (the work is then copied, so that launches already
/// submitted, which hold the work as it was, are not affected).
#[derive(Debug)]
pub struct SimGraphExec {
    ops: Mutex<Arc<Vec<Op<'static, SimBackend>>>>,
}

impl SimGraphExec {
    /// The work as it is now, for a launch submitted now.
    fn snapshot(&self) -> SimGraphExec {
        SimGraphExec {
            ops: Mutex::new(self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone()),
        }
    }
}

impl SimStream {
    fn send(&self, job: Job) -> Result<()> {
        self.jobs
            .send(job)
            .map_err(|_| Error::internal("simulator stream worker has stopped"))
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("seq", &self.seq).finish()
    }
}

struct Worker {
    memory: Arc<DeviceMemory>,
    context: Arc<SimContext>,
    client: ClientContext,
    sm_count: u32,
    epoch: Instant,
}

impl Worker {
    fn run(self, jobs: mpsc::Receiver<Job>) {
        for job in jobs {
            if let Some(done) = &job.notify {
                // Synchronisation is answered even for a closing or faulted client.
                let _ = done.send(());
                continue;
            }
            if self.client.closing.load(Ordering::Relaxed)
                || self.client.faults.has_faulted()
                || self.context.is_dead.load(Ordering::Acquire)
            {
                // A closing or faulted client's queued work is dropped, as a GPU context's is.
                continue;
            }
            // A bug in a simulated kernel must cost the client its work, not the worker thread.
            let started = Instant::now();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.execute(&job.op, job.event_no, job.publish.as_ref())
            }))
            .unwrap_or_else(|_| {
                Err(Error::internal(
                    "the simulator panicked while running this command",
                ))
            });
            // Waiting for another stream's event or for the host is not work of the device.
            if !matches!(job.op, Op::Wait(_) | Op::HostWait { .. }) {
                let ns = started.elapsed().as_nanos() as u64;
                self.client.busy_ns.fetch_add(ns, Ordering::Relaxed);
            }
            match result {
                Ok(()) => {
                    if let Some(p) = &job.publish
                        && !matches!(job.op, Op::Record(_))
                    {
                        p.publish();
                    }
                }
                Err(e) if matches!(job.op, Op::Launch(_)) => {
                    self.context.kernel_failed(e, &*self.client.faults, job.seq)
                }
                Err(e) => self.client.faults.fault(job.seq, e),
            }
        }
    }

    fn device(&self, addr: u64, len: u64, what: &str) -> Result<*mut u8> {
        let table = self
            .client
            .allocations
            .read()
            .unwrap_or_else(|p| p.into_inner());
        table.check_range(addr, len, what, Status::IllegalAddress)?;
        self.memory.host_ptr(addr, len)
    }

    /// Runs one unit of work; `event_no` is a record's number or the record a wait waits for,
    /// and a record publishes its stream progress (`publish`) before it wakes waiting streams.
    fn execute(
        &self,
        op: &Op<'static, SimBackend>,
        event_no: u64,
        publish: Option<&Publish>,
    ) -> Result<()> {
        match op {
            Op::Launch(LaunchSpec {
                function,
                grid,
                params,
                ..
            }) => {
                let table = self
                    .client
                    .allocations
                    .read()
                    .unwrap_or_else(|p| p.into_inner());
                let env = KernelEnv {
                    name: function.builtin.name,
                    memory: &self.memory,
                    allocations: &table,
                    closing: &self.client.closing,
                    // The client's placement bounds how many blocks run at once.
                    sm_count: match self.client.sm.sms.load(Ordering::Relaxed) {
                        0 => self.sm_count,
                        n => n,
                    },
                    grid: *grid,
                    params,
                    layout: &function.layout,
                };
                (function.builtin.run)(&env)
            }
            Op::CopyHtoD { dst, src } => {
                let (s, len) = src.as_raw();
                let d = self.device(*dst, len as u64, "copy destination")?;
                if !self.context.copy_latency.is_zero() {
                    std::thread::sleep(self.context.copy_latency);
                }
                // SAFETY: both ranges are `len` bytes of live mappings (device memory checked
                // above; the host bytes are kept alive by `src`); they cannot overlap, device
                // memory being a mapping of its own.
                unsafe { std::ptr::copy_nonoverlapping(s, d, len) };
                Ok(())
            }
            Op::CopyDtoH { dst, src } => {
                let (d, len) = dst.as_raw();
                let s = self.device(*src, len as u64, "copy source")?;
                // SAFETY: as for CopyHtoD, in the other direction.
                unsafe { std::ptr::copy_nonoverlapping(s, d, len) };
                Ok(())
            }
            Op::CopyDtoD(DeviceCopy { dst, src, len }) => {
                let s = self.device(*src, *len, "copy source")?;
                let d = self.device(*dst, *len, "copy destination")?;
                // SAFETY: both ranges lie in device memory; `copy` allows overlap.
                unsafe { std::ptr::copy(s, d, *len as usize) };
                Ok(())
            }
            Op::Memset(Fill {
                dst,
                value,
                elem_size,
                count,
            }) => {
                let len = count.checked_mul(*elem_size as u64).ok_or_else(|| {
                    Error::invalid_value(format!("memset of {count} elements overflows"))
                })?;
                let d = self.device(*dst, len, "memset destination")?;
                if *elem_size == 1 {
                    // SAFETY: len bytes at d lie in device memory.
                    unsafe { std::ptr::write_bytes(d, *value as u8, len as usize) };
                } else {
                    for i in 0..*count as usize {
                        // SAFETY: count 4-byte elements at d lie in device memory.
                        unsafe { (d as *mut u32).add(i).write_unaligned(*value) };
                    }
                }
                Ok(())
            }
            Op::Record(ev) => {
                let mut st = ev.state();
                if event_no > st.completed {
                    st.completed = event_no;
                    st.at_ns = self.epoch.elapsed().as_nanos() as u64;
                }
                // The record's progress is published before any waiting stream goes on: a
                // client that sees the waiting stream's later work done must find the event
                // complete too, as CUDA guarantees.
                if let Some(p) = publish {
                    p.publish();
                }
                ev.changed.notify_all();
                Ok(())
            }
            Op::Wait(ev) => {
                let mut st = ev.state();
                while st.completed < event_no && !self.client.closing.load(Ordering::Relaxed) {
                    st = ev
                        .changed
                        .wait_timeout(st, Duration::from_millis(10))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                Ok(())
            }
            // A replay runs the captured work in order, each launch under the client's SM
            // placement at the time it runs, as on its stream. Captures hold no event work.
            Op::GraphLaunch(exec) => {
                let ops = exec.ops.lock().unwrap_or_else(|p| p.into_inner()).clone();
                ops.iter().try_for_each(|op| self.execute(op, 0, None))
            }
            Op::HostWait { word, value, .. } => {
                // The host writes the word without ringing anything: look at it, more slowly
                // the longer the wait.
                let mut nap = Duration::from_micros(10);
                loop {
                    let now = word.load_word().ok_or_else(|| {
                        Error::internal("a host function's gate is not an aligned 8-byte word")
                    })?;
                    if now >= *value || self.client.closing.load(Ordering::Relaxed) {
                        return Ok(());
                    }
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(1));
                }
            }
            Op::Nop => Ok(()),
        }
    }
}

impl Backend for SimBackend {
    type Stream = SimStream;
    type Event = SimEvent;
    type Module = SimModule;
    type Function = SimFunction;
    type Graph = SimGraph;
    type GraphExec = SimGraphExec;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_alloc(&self, size: u64) -> Result<u64> {
        self.context.alive()?;
        self.memory.alloc(size)
    }

    fn mem_free(&self, ptr: u64, size: u64) {
        self.memory.free(ptr, size)
    }

    fn mem_get_info(&self) -> (u64, u64) {
        self.memory.info()
    }

    fn vm_granularity(&self) -> u64 {
        memory::GRANULARITY
    }

    fn vm_reserve(&self, size: u64, align: u64) -> Result<u64> {
        self.context.alive()?;
        self.memory.reserve(size, align)
    }

    fn vm_free(&self, va: u64, size: u64) {
        self.memory.unreserve(va, size)
    }

    fn vm_create(&self, size: u64) -> Result<u64> {
        self.context.alive()?;
        self.memory.create(size)
    }

    fn vm_release(&self, phys: u64, size: u64) {
        self.memory.release(phys, size)
    }

    fn vm_map(&self, va: u64, size: u64, phys: u64, offset: u64) -> Result<()> {
        self.context.alive()?;
        self.memory.map(va, size, phys, offset)
    }

    fn vm_unmap(&self, va: u64, size: u64) {
        self.memory.unmap(va, size)
    }

    fn vm_set_access(&self, _va: u64, _size: u64) -> Result<()> {
        // Mapped pages are read-write from the start; the session makes them the client's.
        self.context.alive()
    }

    fn host_register(&self, _segment: &Segment) -> Result<()> {
        Ok(())
    }

    fn host_unregister(&self, _segment: &Segment) {}

    fn host_map(&self, segment: &Segment) -> Result<u64> {
        self.memory.map_host(segment.fd(), segment.len() as u64)
    }

    fn host_unmap(&self, addr: u64, len: u64) {
        self.memory.unmap_host(addr, len)
    }

    fn module_load(&self, image: &[u8]) -> Result<SimModule> {
        /// Kernel entries the PTX parts of one fatbin may hold in all (every part's, before
        /// those of the same name are merged): the server's default per PTX module.
        const MAX_FATBIN_ENTRIES: usize = 1 << 14;
        self.context.alive()?;
        match ImageFormat::detect(image)? {
            ImageFormat::Ptx => Ok(SimModule {
                entries: ptx::parse_entries(image)?,
            }),
            // Its PTX parts' entries. A fatbin of cubins alone has no code the simulator can
            // run: as a driver answers a fatbin with no code for its device.
            ImageFormat::Fatbin => {
                let parts = fatbin::ptx_parts(image)?;
                if parts.is_empty() {
                    return Err(Error::new(
                        Status::InvalidImage,
                        "the fatbin holds no PTX, and the simulator runs no cubin \
                         (CUDA_ERROR_NO_BINARY_FOR_GPU)",
                    )
                    .with_cuda_result(NO_BINARY_FOR_GPU));
                }
                // The same kernel in several parts (one per architecture) is one entry; the
                // names seen are kept in a set (a scan of the list for each was quadratic).
                let mut entries: Vec<ptx::Entry> = Vec::new();
                let mut names = std::collections::HashSet::new();
                let mut found = 0usize;
                for text in parts {
                    let most = MAX_FATBIN_ENTRIES - found;
                    let list = ptx::parse_entries_within(&text, most).map_err(|e| {
                        Error::new(
                            e.status,
                            format!(
                                "{} (a fatbin's PTX parts may hold {MAX_FATBIN_ENTRIES} kernel \
                                 entries in all)",
                                e.message
                            ),
                        )
                    })?;
                    found += list.len();
                    for e in list {
                        if names.insert(e.name.clone()) {
                            entries.push(e);
                        }
                    }
                }
                Ok(SimModule { entries })
            }
            other => Err(Error::new(
                Status::Unsupported,
                format!("the simulator loads PTX and fatbins with PTX, not a {other:?} image"),
            )),
        }
    }

    fn module_function(
        &self,
        module: &SimModule,
        name: &str,
    ) -> Result<(SimFunction, Vec<ParamInfo>)> {
        let entry = module
            .entries
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| {
                Error::new(
                    Status::NotFound,
                    format!("the module has no kernel named {name:?}"),
                )
            })?;
        let builtin = kernels::bind(name, &entry.params)?;
        let f = SimFunction {
            builtin,
            layout: entry.params.clone(),
        };
        Ok((f, entry.params.clone()))
    }

    /// The simulator's kernels are built in and hold no device variables: every name is
    /// missing, as a name a module lacks is on a GPU.
    fn module_global(&self, _module: &SimModule, name: &str) -> Result<(u64, u64)> {
        self.context.alive()?;
        Err(Error::new(
            Status::NotFound,
            format!("the module has no global named {name:?} (the simulator's modules hold none)"),
        ))
    }

    fn module_function_names(&self, module: &SimModule) -> Result<Vec<String>> {
        self.context.alive()?;
        Ok(module.entries.iter().map(|e| e.name.clone()).collect())
    }

    /// The simulator's kernels use no TMA: its descriptor is the parameters themselves, the
    /// address, the six small fields (a byte each, two zero bytes) and the shape's arrays,
    /// exactly 128 bytes, so the same request always gets the same descriptor.
    fn tensor_map_encode_tiled(&self, map: &TensorMapTiled) -> Result<[u8; TENSOR_MAP_BYTES]> {
        self.context.alive()?;
        let mut d = [0u8; TENSOR_MAP_BYTES];
        d[..8].copy_from_slice(&map.address.to_le_bytes());
        d[8..14].copy_from_slice(&[
            map.data_type,
            map.rank,
            map.interleave,
            map.swizzle,
            map.l2_promotion,
            map.oob_fill,
        ]);
        d[16..].copy_from_slice(bytemuck::bytes_of(&map.shape));
        Ok(d)
    }

    /// The simulator's descriptor starts with its address.
    fn tensor_map_replace_address(
        &self,
        map: &[u8; TENSOR_MAP_BYTES],
        address: u64,
    ) -> Result<[u8; TENSOR_MAP_BYTES]> {
        self.context.alive()?;
        let mut d = *map;
        d[..8].copy_from_slice(&address.to_le_bytes());
        Ok(d)
    }

    fn context_limits(&self) -> ((i32, i32), [Option<u64>; CONTEXT_LIMITS]) {
        (occupancy::PRIORITIES, occupancy::context_limits())
    }

    fn function_attributes(
        &self,
        _function: &SimFunction,
    ) -> Result<[Option<i32>; FUNC_ATTRIBUTES]> {
        self.context.alive()?;
        Ok(occupancy::function_attributes(&self.info.limits))
    }

    fn occupancy(&self, _function: &SimFunction, query: OccupancyQuery) -> Result<u64> {
        self.context.alive()?;
        occupancy::occupancy(query, self.info.sm_count, &self.info.limits)
    }

    fn place(&self, _assignments: &[Assignment]) -> Result<()> {
        // Workers read each client's SM count from its slot at every launch.
        Ok(())
    }

    fn stream_create(&self, _priority: i32, client: &ClientContext) -> Result<SimStream> {
        self.context.alive()?;
        let (tx, rx) = mpsc::channel();
        let worker = Worker {
            memory: self.memory.clone(),
            context: self.context.clone(),
            client: client.clone(),
            sm_count: self.info.sm_count,
            epoch: self.epoch,
        };
        let worker = std::thread::Builder::new()
            .name(format!("sim-stream-c{}", client.id))
            .spawn(move || worker.run(rx))
            .map_err(|e| {
                Error::new(
                    Status::OutOfMemory,
                    format!("cannot start a simulator stream thread: {e}"),
                )
            })?;
        self.context.watch(&client.faults);
        Ok(SimStream {
            jobs: tx,
            worker,
            capture: RefCell::new(None),
        })
    }

    fn submit(
        &self,
        stream: &SimStream,
        seq: u64,
        op: Op<'_, SimBackend>,
        publish: Option<Publish>,
    ) -> Result<()> {
        self.context.alive()?;
        if let Some(captured) = stream.capture.borrow_mut().as_mut() {
            if publish.is_some()
                || matches!(
                    op,
                    Op::Record(_) | Op::Wait(_) | Op::GraphLaunch(_) | Op::HostWait { .. }
                )
            {
                return Err(Error::internal(format!(
                    "command {seq} reached a capturing simulator stream, which records only \
                     copies, memsets and launches without progress marks"
                )));
            }
            captured.push(op.into_owned());
            return Ok(());
        }
        let event_no = match &op {
            Op::Record(ev) => ev.queued.fetch_add(1, Ordering::AcqRel) + 1,
            Op::Wait(ev) => ev.queued.load(Ordering::Acquire),
            _ => 0,
        };
        // A graph runs as it is now: parameters given to it later are for later launches.
        let op = match op {
            Op::GraphLaunch(exec) => Op::GraphLaunch(Arc::new(exec.snapshot())),
            op => op,
        };
        stream.send(Job {
            seq,
            // The worker runs it after this call returns.
            op: op.into_owned(),
            publish,
            event_no,
            notify: None,
        })
    }

    fn stream_synchronize(&self, stream: &SimStream, closing: &AtomicBool) -> Result<()> {
        let (tx, rx) = mpsc::channel();
        let job = Job {
            seq: 0,
            op: Op::Nop,
            publish: None,
            event_no: 0,
            notify: Some(tx),
        };
        stream.send(job)?;
        // Wait in slices so a client that goes away meanwhile is noticed.
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(()) => return Ok(()),
                Err(mpsc::RecvTimeoutError::Timeout) if !closing.load(Ordering::Relaxed) => {}
                Err(_) => return Err(Error::internal("stream synchronisation was abandoned")),
            }
        }
    }

    fn stream_destroy(&self, stream: SimStream) {
        // Closing the channel lets the worker finish what is queued (or drop it, for a closing
        // client) and exit; waiting for it guarantees no work of the stream outlives it.
        drop(stream.jobs);
        let _ = stream.worker.join();
    }

    fn capture_begin(&self, stream: &SimStream) -> Result<()> {
        let mut capture = stream.capture.borrow_mut();
        if capture.is_some() {
            return Err(Error::internal("the simulator stream is already capturing"));
        }
        *capture = Some(Vec::new());
        Ok(())
    }

    fn capture_end(&self, stream: &SimStream) -> Result<SimGraph> {
        let ops = stream
            .capture
            .borrow_mut()
            .take()
            .ok_or_else(|| Error::internal("the simulator stream is not capturing"))?;
        Ok(SimGraph { ops: Arc::new(ops) })
    }

    fn graph_instantiate(&self, graph: &SimGraph) -> Result<SimGraphExec> {
        Ok(SimGraphExec {
            ops: Mutex::new(graph.ops.clone()),
        })
    }

    fn graph_exec_update(
        &self,
        exec: &SimGraphExec,
        index: usize,
        op: &Op<'_, Self>,
    ) -> Result<()> {
        let mut ops = exec.ops.lock().unwrap_or_else(|p| p.into_inner());
        match (ops.get(index), op) {
            (Some(Op::Launch(was)), Op::Launch(l))
                if Arc::ptr_eq(&was.function, &l.function)
                    && was.params.len() == l.params.len()
                    && was.cluster == l.cluster => {}
            (Some(Op::Memset(was)), Op::Memset(f))
                if (was.elem_size, was.count) == (f.elem_size, f.count) => {}
            _ => {
                return Err(Error::invalid_value(format!(
                    "operation {index} of the graph is not a launch of the same kernel or a \
                     memset of the same size"
                )));
            }
        }
        // Launches already submitted keep the work they were given.
        let mut copy: Vec<Op<'static, SimBackend>> =
            ops.iter().map(|op| op.duplicate().into_owned()).collect();
        copy[index] = op.duplicate().into_owned();
        *ops = Arc::new(copy);
        Ok(())
    }

    fn event_create(&self) -> Result<SimEvent> {
        self.context.alive()?;
        Ok(SimEvent::default())
    }

    fn event_elapsed_ms(&self, start: &SimEvent, end: &SimEvent) -> Result<f32> {
        let read = |ev: &SimEvent, which: &str| -> Result<u64> {
            let queued = ev.queued.load(Ordering::Acquire);
            let st = ev.state();
            if queued == 0 {
                return Err(Error::invalid_value(format!(
                    "the {which} event was never recorded"
                )));
            }
            if st.completed < queued {
                return Err(Error::new(
                    Status::NotReady,
                    format!("the {which} event's latest record has not completed yet"),
                ));
            }
            Ok(st.at_ns)
        };
        let (s, e) = (read(start, "start")?, read(end, "end")?);
        Ok((e as f64 - s as f64) as f32 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mps_core::protocol::Dim3;

    /// Every fault a client was told of.
    #[derive(Debug, Default)]
    struct Heard(Mutex<Vec<(u64, Error)>>);

    impl FaultSink for Heard {
        fn fault(&self, seq: u64, err: Error) {
            self.0.lock().unwrap().push((seq, err));
        }

        fn has_faulted(&self) -> bool {
            !self.0.lock().unwrap().is_empty()
        }
    }

    impl Heard {
        fn all(&self) -> Told {
            self.0.lock().unwrap().clone()
        }
    }

    fn client(id: u32, heard: &Arc<Heard>) -> ClientContext {
        ClientContext {
            id,
            allocations: Arc::default(),
            closing: Arc::default(),
            faults: heard.clone(),
            sm: Arc::default(),
            busy_ns: Arc::default(),
            gates: Arc::default(),
            priority: Arc::default(),
        }
    }

    /// What one client was told: (command, error) for each fault.
    type Told = Vec<(u64, Error)>;

    /// Client 1 launches `fault_write` at an address it does not hold (command 7) beside client
    /// 2; returns the backend and what each client was told.
    fn fault_under(scope: FaultScope) -> (SimBackend, Told, Told) {
        let sim = SimBackend::new(SimConfig {
            memory_bytes: 1 << 20,
            sm_count: 2,
            fault_scope: scope,
            copy_latency: std::time::Duration::ZERO,
        })
        .unwrap();
        let (victim, other) = (Arc::new(Heard::default()), Arc::new(Heard::default()));
        let stream = sim.stream_create(0, &client(1, &victim)).unwrap();
        let _bystander = sim.stream_create(0, &client(2, &other)).unwrap();
        let ptx = include_bytes!("../../../../kernels/test_kernels.ptx");
        let module = sim.module_load(ptx).unwrap();
        let (function, _) = sim.module_function(&module, "fault_write").unwrap();
        let one = Dim3 { x: 1, y: 1, z: 1 };
        let launch = Op::Launch(LaunchSpec {
            function: Arc::new(function),
            grid: one,
            block: one,
            shared_mem: 0,
            cluster: None,
            params: 0x10u64.to_le_bytes().to_vec().into(),
        });
        sim.submit(&stream, 7, launch, None).unwrap();
        // Returns once the stream's work has run, and so once the fault was reported.
        sim.stream_destroy(stream);
        (sim, victim.all(), other.all())
    }

    #[test]
    fn by_default_a_kernel_fault_costs_only_its_client() {
        let (sim, victim, other) = fault_under(FaultScope::Client);
        let [(7, e)] = &victim[..] else {
            panic!("the victim heard {victim:?}");
        };
        assert_eq!(e.status, Status::IllegalAddress, "{e}");
        assert!(e.message.contains("fault_write"), "{e}");
        assert!(other.is_empty(), "the other client heard {other:?}");
        assert!(sim.mem_alloc(16).is_ok());
    }

    #[test]
    fn modelling_a_gpu_a_kernel_fault_ends_the_context_for_every_client() {
        let (sim, victim, other) = fault_under(FaultScope::Context);
        let [(7, e)] = &victim[..] else {
            panic!("the victim heard {victim:?}");
        };
        assert_eq!(e.status, Status::IllegalAddress, "{e}");
        assert!(
            e.message.contains("context failed") && e.message.contains("fault_write"),
            "{e}"
        );
        // The other client is told too, of the same failure.
        let [(0, o)] = &other[..] else {
            panic!("the other client heard {other:?}");
        };
        assert_eq!(o, e);
        // And every later call fails with it, as a dead CUDA context's do.
        assert_eq!(sim.mem_alloc(16).unwrap_err(), *e);
        let heard = Arc::new(Heard::default());
        assert_eq!(sim.stream_create(0, &client(3, &heard)).unwrap_err(), *e);
    }
}
