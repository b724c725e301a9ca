//! The CUDA backend: one primary context on one device, driven through cudarc's raw driver API
//! (loaded dynamically, so the server builds and runs where no driver is installed).
//!
//! - Each client stream is a CUDA stream of its own (non-blocking, priority honoured), so work of
//!   different streams, of one client or of many, runs concurrently on the device.
//!   `CUDA_DEVICE_MAX_CONNECTIONS` is raised before the context exists (see `main`), or streams
//!   would share hardware queues and falsely serialise.
//! - Kernel parameters go to cuLaunchKernel as one packed buffer
//!   (`CU_LAUNCH_PARAM_BUFFER_POINTER`), laid out by `cuFuncGetParamInfo`.
//! - Progress is written by the GPU itself: `cuStreamWriteValue64` into the client's stream slot,
//!   in the server segment, which is registered with `cuMemHostRegister(DEVICEMAP)`. No server
//!   thread is on the completion path; clients poll the slot (spinning, then napping).
//! - Host buffers and the staging area are registered too, so copies DMA straight from and to the
//!   client's pages.
//! - A kernel fault destroys the context for every client of the server (the device gives no
//!   finer containment): a health thread notices and tells every client.
//! - SM shares and reservations are green contexts (`partition`); a client's streams move to
//!   its new partition at their next submission after a change.
//! - GPU busy time is sampled: every few milliseconds the health thread asks each stream
//!   whether it has work pending, and credits the interval to the clients whose streams do.
//!   (Timing every command with events would cost two driver calls per launch.)

mod partition;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUcontext, CUevent, CUfunction, CUmodule, CUresult, CUstream};
use mps_core::protocol::{BackendKind, ParamInfo};
use mps_core::ptx::ImageFormat;
use mps_core::{Error, Result, Status};
use mps_ipc::segment::Segment;

use super::{Backend, ClientContext, DeviceInfo, FaultSink, HostBytes, Op, Publish, SmSlot};
use crate::sm::Assignment;
use partition::{Partition, Partitions};

/// How often the health thread samples which streams have work pending.
const BUSY_SAMPLE: Duration = Duration::from_millis(5);

thread_local! {
    static BOUND: Cell<bool> = const { Cell::new(false) };
}

fn error_name(r: CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: both calls only write a pointer to a static string, or leave it null.
    unsafe {
        sys::cuGetErrorName(r, &mut name);
        sys::cuGetErrorString(r, &mut text);
    }
    let s = |p: *const std::ffi::c_char| {
        if p.is_null() {
            format!("{r:?}")
        } else {
            // SAFETY: the driver returns NUL-terminated static strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    format!("{} ({})", s(name), s(text))
}

/// Turns a CUDA result into ours, naming the call that failed.
fn result_of(r: CUresult, what: &str) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::new(
            status_of(r),
            format!("{what}: {}", error_name(r)),
        ))
    }
}

/// Whether an error leaves the context unusable (every later call fails with it).
fn is_sticky(r: CUresult) -> bool {
    use sys::cudaError_enum::*;
    matches!(
        r,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

fn status_of(r: CUresult) -> Status {
    use sys::cudaError_enum::*;
    match r {
        CUDA_SUCCESS => Status::Success,
        CUDA_ERROR_INVALID_VALUE => Status::InvalidValue,
        CUDA_ERROR_OUT_OF_MEMORY => Status::OutOfMemory,
        CUDA_ERROR_NOT_READY => Status::NotReady,
        CUDA_ERROR_NOT_FOUND => Status::NotFound,
        CUDA_ERROR_ILLEGAL_ADDRESS | CUDA_ERROR_MISALIGNED_ADDRESS => Status::IllegalAddress,
        CUDA_ERROR_INVALID_IMAGE
        | CUDA_ERROR_INVALID_PTX
        | CUDA_ERROR_NO_BINARY_FOR_GPU
        | CUDA_ERROR_UNSUPPORTED_PTX_VERSION
        | CUDA_ERROR_JIT_COMPILER_NOT_FOUND => Status::InvalidImage,
        CUDA_ERROR_LAUNCH_FAILED
        | CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
        | CUDA_ERROR_LAUNCH_TIMEOUT
        | CUDA_ERROR_ILLEGAL_INSTRUCTION
        | CUDA_ERROR_HARDWARE_STACK_ERROR
        | CUDA_ERROR_INVALID_PC
        | CUDA_ERROR_ASSERT => Status::LaunchFailed,
        CUDA_ERROR_NOT_SUPPORTED => Status::Unsupported,
        _ => Status::Internal,
    }
}

/// The probe `--backend auto` runs: is a driver installed and does it see a device?
pub fn probe() -> std::result::Result<(), String> {
    // SAFETY: is_culib_present only tries to open the library; it never panics.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda.so was not found (no NVIDIA driver installed)".into());
    }
    // SAFETY: the library is present, so cudarc can resolve the symbols.
    let r = unsafe { sys::cuInit(0) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(format!("cuInit failed: {}", error_name(r)));
    }
    let mut n = 0;
    // SAFETY: writes one int.
    let r = unsafe { sys::cuDeviceGetCount(&mut n) };
    if r != CUresult::CUDA_SUCCESS || n == 0 {
        return Err(format!("no CUDA device ({})", error_name(r)));
    }
    Ok(())
}

struct ModuleInner {
    raw: CUmodule,
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: the module was loaded by us and is unloaded once, when the last function that
        // names it is gone. An error here (a dead context) leaves nothing to do.
        unsafe { sys::cuModuleUnload(self.raw) };
    }
}

/// A loaded module.
#[derive(Debug)]
pub struct CudaModule(Arc<ModuleInner>);

/// A kernel; keeps its module loaded.
#[derive(Debug)]
pub struct CudaFunction {
    raw: CUfunction,
    name: String,
    _module: Arc<ModuleInner>,
}

impl std::fmt::Debug for ModuleInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CUmodule({:p})", self.raw)
    }
}

/// An event, created with timing enabled.
#[derive(Debug)]
pub struct CudaEvent {
    raw: CUevent,
    recorded: AtomicBool,
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once; pending records keep working (CUDA
        // releases the event when they complete).
        unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}

/// A stream: a CUDA stream in the client's current partition (or the primary context), which
/// is replaced by one in the new partition when the client's placement changes.
#[derive(Debug)]
pub struct CudaStream {
    raw: Cell<CUstream>,
    priority: i32,
    client: u32,
    busy: Arc<AtomicU64>,
    sm: Arc<SmSlot>,
    /// The placement generation `raw` was made for.
    seen: Cell<u64>,
    /// Keeps the green context alive while `raw` lives in it.
    partition: RefCell<Option<Arc<Partition>>>,
}

/// A stream the health thread samples for GPU busy time.
struct Live {
    raw: CUstream,
    busy: Arc<AtomicU64>,
}

// SAFETY: CUDA driver handles may be used from any thread once the context is current there
// (every entry point binds it first).
unsafe impl Send for CudaStream {}
// SAFETY: as above.
unsafe impl Send for ModuleInner {}
// SAFETY: as above; the driver serialises what it must.
unsafe impl Sync for ModuleInner {}
// SAFETY: as above.
unsafe impl Send for CudaFunction {}
// SAFETY: as above.
unsafe impl Sync for CudaFunction {}
// SAFETY: as above.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

struct Shared {
    ctx: CUcontext,
    /// Set once `dead` holds the context's failure; checked on every submission, so it must not
    /// be a lock that all session threads contend on.
    is_dead: AtomicBool,
    dead: Mutex<Option<Error>>,
    clients: Mutex<Vec<Weak<dyn FaultSink>>>,
    /// Every client stream, for busy-time sampling. A stream leaves this list before it is
    /// destroyed, under the lock the sampler holds while it queries.
    live: Mutex<Vec<Live>>,
}

// SAFETY: a CUcontext may be made current on any thread.
unsafe impl Send for Shared {}
// SAFETY: as above; the other fields are locked.
unsafe impl Sync for Shared {}

impl Shared {
    fn bind(&self) {
        BOUND.with(|b| {
            if !b.get() {
                // SAFETY: the context lives as long as the backend (the primary context is
                // never released while the server runs).
                unsafe { sys::cuCtxSetCurrent(self.ctx) };
                b.set(true);
            }
        });
    }

    /// Turns a CUDA result into ours; a sticky error marks the context dead and tells every
    /// client.
    fn check(&self, r: CUresult, what: &str) -> Result<()> {
        let Err(err) = result_of(r, what) else {
            return Ok(());
        };
        if is_sticky(r) {
            self.die(&err);
        }
        Err(err)
    }

    fn die(&self, cause: &Error) {
        let mut dead = self.dead.lock().unwrap_or_else(|p| p.into_inner());
        if dead.is_some() {
            return;
        }
        let err = Error::new(
            cause.status,
            format!(
                "the server's CUDA context failed ({}); a kernel of a client of this server \
                 faulted, and on a GPU that ends the context for every client: reconnect to a \
                 new server",
                cause.message
            ),
        );
        tracing::error!("{}", err.message);
        *dead = Some(err.clone());
        self.is_dead.store(true, Ordering::Release);
        drop(dead);
        let clients = std::mem::take(&mut *self.clients.lock().unwrap_or_else(|p| p.into_inner()));
        for c in clients.iter().filter_map(Weak::upgrade) {
            c.fault(0, err.clone());
        }
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Vec<Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Credits `interval` to every client with work pending on one of its streams.
    fn sample_busy(&self, interval: Duration) {
        let live = self.live();
        let mut credited: Vec<*const AtomicU64> = Vec::new();
        for s in live.iter() {
            // SAFETY: the stream is live: it leaves this list (under this lock) before it is
            // destroyed.
            let r = unsafe { sys::cuStreamQuery(s.raw) };
            let ptr = Arc::as_ptr(&s.busy);
            if r == CUresult::CUDA_ERROR_NOT_READY && !credited.contains(&ptr) {
                s.busy
                    .fetch_add(interval.as_nanos() as u64, Ordering::Relaxed);
                credited.push(ptr);
            }
        }
    }

    fn alive(&self) -> Result<()> {
        if !self.is_dead.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.dead.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// The CUDA backend.
pub struct CudaBackend {
    shared: Arc<Shared>,
    info: DeviceInfo,
    /// Host base address of each registered segment → (length, device address).
    registered: Mutex<BTreeMap<usize, (usize, u64)>>,
    priorities: (i32, i32),
    partitions: Partitions,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.info.name)
            .finish()
    }
}

impl CudaBackend {
    /// Opens device `ordinal`'s primary context. Call [`probe`] first: cudarc panics when the
    /// driver library is missing.
    pub fn new(ordinal: i32) -> Result<CudaBackend> {
        probe().map_err(|e| Error::new(Status::Unsupported, e))?;
        let mut dev = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut name = [0 as std::ffi::c_char; 128];
        let mut total = 0usize;
        let (mut sms, mut major, mut minor) = (0, 0, 0);
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: plain driver queries writing into the locals above; the context is retained
        // for the life of the process.
        unsafe {
            result_of(sys::cuDeviceGet(&mut dev, ordinal), "cuDeviceGet")?;
            result_of(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            )?;
            result_of(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
            result_of(
                sys::cuDeviceGetName(name.as_mut_ptr(), 127, dev),
                "cuDeviceGetName",
            )?;
            result_of(
                sys::cuDeviceTotalMem_v2(&mut total, dev),
                "cuDeviceTotalMem",
            )?;
            use sys::CUdevice_attribute_enum::*;
            result_of(
                sys::cuDeviceGetAttribute(&mut sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                "cuDeviceGetAttribute",
            )?;
            result_of(
                sys::cuDeviceGetAttribute(
                    &mut major,
                    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                    dev,
                ),
                "cuDeviceGetAttribute",
            )?;
            result_of(
                sys::cuDeviceGetAttribute(
                    &mut minor,
                    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                    dev,
                ),
                "cuDeviceGetAttribute",
            )?;
            result_of(
                sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest),
                "cuCtxGetStreamPriorityRange",
            )?;
        }
        BOUND.with(|b| b.set(true));
        let partitions = Partitions::discover(dev);
        if let Some(why) = partitions.unsupported() {
            tracing::warn!("SM shares and reservations are unavailable: {why}");
        }
        // SAFETY: cuDeviceGetName wrote a NUL-terminated string into the buffer.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let shared = Arc::new(Shared {
            ctx,
            is_dead: AtomicBool::new(false),
            dead: Mutex::new(None),
            clients: Mutex::new(Vec::new()),
            live: Mutex::new(Vec::new()),
        });
        spawn_health_thread(shared.clone())?;
        Ok(CudaBackend {
            shared,
            info: DeviceInfo {
                name,
                total_mem: total as u64,
                sm_count: sms as u32,
                sm_units: partitions.unit_sizes(sms as u32),
                cc: (major as u32, minor as u32),
                kind: BackendKind::Cuda,
            },
            registered: Mutex::new(BTreeMap::new()),
            priorities: (least, greatest),
            partitions,
        })
    }

    /// The device address of a host address inside a registered segment.
    fn device_address(&self, host: *const u8) -> Result<u64> {
        let reg = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        let addr = host as usize;
        reg.range(..=addr)
            .next_back()
            .filter(|(base, (len, _))| addr - **base < *len)
            .map(|(base, (_, dev))| dev + (addr - base) as u64)
            .ok_or_else(|| Error::internal(format!("{host:p} is not in a registered host segment")))
    }

    /// Creates a raw stream in `partition` (None: the primary context) and lists it for busy
    /// sampling.
    fn raw_stream(
        &self,
        partition: Option<&Partition>,
        priority: i32,
        busy: &Arc<AtomicU64>,
    ) -> Result<CUstream> {
        let flags = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: creates a stream in the bound primary context or in a live green context.
        let r = unsafe {
            match partition {
                Some(p) => sys::cuGreenCtxStreamCreate(&mut s, p.green, flags, priority),
                None => sys::cuStreamCreateWithPriority(&mut s, flags, priority),
            }
        };
        self.shared.check(r, "creating a stream")?;
        self.shared.live().push(Live {
            raw: s,
            busy: busy.clone(),
        });
        Ok(s)
    }

    /// Waits for a raw stream's work (queued work cannot be cancelled on a GPU) and destroys
    /// it.
    fn retire(&self, raw: CUstream) {
        self.shared.live().retain(|l| l.raw != raw);
        // SAFETY: a live stream, destroyed once, after its work is done.
        unsafe {
            sys::cuStreamSynchronize(raw);
            sys::cuStreamDestroy_v2(raw);
        }
    }

    /// Moves a stream to its client's current partition if the placement changed since the
    /// stream was made: the old stream's work completes before any later work starts on the
    /// new one, so stream order holds.
    fn follow_placement(&self, stream: &CudaStream) -> Result<()> {
        let generation = stream.sm.generation.load(Ordering::Acquire);
        if generation == stream.seen.get() {
            return Ok(());
        }
        let next = self.partitions.of(stream.client);
        let same = match (&next, &*stream.partition.borrow()) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if !same {
            let raw = self.raw_stream(next.as_deref(), stream.priority, &stream.busy)?;
            self.retire(stream.raw.replace(raw));
            *stream.partition.borrow_mut() = next;
        }
        stream.seen.set(generation);
        Ok(())
    }

    fn copy_in(&self, stream: CUstream, dst: u64, src: &HostBytes) -> Result<()> {
        let (ptr, len) = src.as_raw();
        // SAFETY: `src` keeps its bytes alive until the session synchronises (shared pages) or,
        // for a private copy (pageable source), the driver has taken the bytes when the call
        // returns; the device range was validated against the client's allocations.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, ptr as *const c_void, len, stream) };
        self.shared.check(r, "cuMemcpyHtoDAsync")
    }
}

/// The health thread's own stream.
struct HealthStream(CUstream);

// SAFETY: a stream handle may be used from any thread.
unsafe impl Send for HealthStream {}

/// Watches the context: a fault is reported by the next driver call of any thread, so a
/// thread of our own queries a stream of ours every few milliseconds, and tells every client as
/// soon as the context is gone (clients waiting on GPU-written progress would otherwise wait
/// forever).
fn spawn_health_thread(shared: Arc<Shared>) -> Result<()> {
    let mut stream: CUstream = std::ptr::null_mut();
    let flags = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: creates a stream in the current (bound) context.
    let r = unsafe { sys::cuStreamCreate(&mut stream, flags) };
    shared.check(r, "cuStreamCreate")?;
    let stream = HealthStream(stream);
    std::thread::Builder::new()
        .name("cuda-health".into())
        .spawn(move || {
            // Capture the whole stream (Send), not its raw field.
            let stream = stream;
            shared.bind();
            let mut sampled = Instant::now();
            loop {
                std::thread::sleep(Duration::from_millis(2));
                let now = Instant::now();
                if now - sampled >= BUSY_SAMPLE {
                    shared.sample_busy(now - sampled);
                    sampled = now;
                }
                // SAFETY: queries our own stream.
                let r = unsafe { sys::cuStreamQuery(stream.0) };
                if r != CUresult::CUDA_SUCCESS && r != CUresult::CUDA_ERROR_NOT_READY {
                    let _ = shared.check(r, "the device context");
                    if is_sticky(r) {
                        return;
                    }
                }
            }
        })
        .map(drop)
        .map_err(|e| Error::internal(format!("cannot start the health thread: {e}")))
}

impl Backend for CudaBackend {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Module = CudaModule;
    type Function = CudaFunction;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_alloc(&self, size: u64) -> Result<u64> {
        self.shared.bind();
        self.shared.alive()?;
        let mut p = 0;
        // SAFETY: writes one device pointer.
        let r = unsafe { sys::cuMemAlloc_v2(&mut p, size as usize) };
        self.shared
            .check(r, &format!("cuMemAlloc of {size} bytes"))?;
        Ok(p)
    }

    fn mem_free(&self, ptr: u64, _size: u64) {
        self.shared.bind();
        // SAFETY: ptr came from cuMemAlloc and the session ensured no work of the client uses
        // it. A failure (a dead context) leaves nothing to free.
        unsafe { sys::cuMemFree_v2(ptr) };
    }

    fn mem_get_info(&self) -> (u64, u64) {
        self.shared.bind();
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes.
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        (free as u64, total as u64)
    }

    fn host_register(&self, segment: &Segment) -> Result<()> {
        self.shared.bind();
        let ptr = segment.as_ptr() as *mut c_void;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the segment is mapped read-write in this process for `len` bytes and stays
        // mapped until host_unregister.
        let r = unsafe { sys::cuMemHostRegister_v2(ptr, segment.len(), flags) };
        self.shared.check(r, "cuMemHostRegister")?;
        let mut dev = 0;
        // SAFETY: ptr was just registered with DEVICEMAP.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, ptr, 0) };
        if let Err(e) = self.shared.check(r, "cuMemHostGetDevicePointer") {
            // SAFETY: undoes the registration above.
            unsafe { sys::cuMemHostUnregister(ptr) };
            return Err(e);
        }
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ptr as usize, (segment.len(), dev));
        Ok(())
    }

    fn host_unregister(&self, segment: &Segment) {
        self.shared.bind();
        let ptr = segment.as_ptr();
        if self
            .registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(ptr as usize))
            .is_some()
        {
            // SAFETY: registered by host_register; no pending copy uses it (the session
            // synchronised first).
            unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
        }
    }

    fn module_load(&self, image: &[u8]) -> Result<CudaModule> {
        self.shared.bind();
        self.shared.alive()?;
        let format = ImageFormat::detect(image)?;
        // PTX must reach the driver NUL-terminated.
        let mut owned;
        let bytes = if format == ImageFormat::Ptx && image.last() != Some(&0) {
            owned = image.to_vec();
            owned.push(0);
            &owned[..]
        } else {
            image
        };
        let mut m: CUmodule = std::ptr::null_mut();
        // SAFETY: bytes is a complete image (NUL-terminated if PTX) that outlives the call.
        let r = unsafe { sys::cuModuleLoadData(&mut m, bytes.as_ptr() as *const c_void) };
        self.shared
            .check(r, &format!("loading a {format:?} module"))?;
        Ok(CudaModule(Arc::new(ModuleInner { raw: m })))
    }

    fn module_function(
        &self,
        module: &CudaModule,
        name: &str,
    ) -> Result<(CudaFunction, Vec<ParamInfo>)> {
        self.shared.bind();
        let cname = CString::new(name)
            .map_err(|_| Error::invalid_value("kernel name contains a NUL byte"))?;
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; cname is NUL-terminated.
        let r = unsafe { sys::cuModuleGetFunction(&mut f, module.0.raw, cname.as_ptr()) };
        if r == CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(Error::new(
                Status::NotFound,
                format!("the module has no kernel named {name:?}"),
            ));
        }
        self.shared
            .check(r, &format!("cuModuleGetFunction({name:?})"))?;
        let mut params = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: f is a valid function; the driver writes two sizes or fails past the last
            // parameter.
            let r = unsafe { sys::cuFuncGetParamInfo(f, params.len(), &mut off, &mut size) };
            if r != CUresult::CUDA_SUCCESS {
                break;
            }
            params.push(ParamInfo {
                offset: off as u32,
                size: size as u32,
            });
        }
        let func = CudaFunction {
            raw: f,
            name: name.to_string(),
            _module: module.0.clone(),
        };
        Ok((func, params))
    }

    fn place(&self, assignments: &[Assignment]) -> Result<()> {
        self.shared.bind();
        self.shared.alive()?;
        self.partitions.place(assignments)
    }

    fn stream_create(&self, priority: i32, client: &ClientContext) -> Result<CudaStream> {
        self.shared.bind();
        self.shared.alive()?;
        // CUDA priorities: lower is more urgent, between `greatest` and `least`.
        let (least, greatest) = self.priorities;
        let p = priority.clamp(greatest, least);
        // The generation is read before the partition, so a change in between is followed at
        // the first submission.
        let seen = client.sm.generation.load(Ordering::Acquire);
        let partition = self.partitions.of(client.id);
        let s = self.raw_stream(partition.as_deref(), p, &client.busy_ns)?;
        let mut clients = self
            .shared
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        clients.retain(|w| w.strong_count() > 0);
        if !clients
            .iter()
            .any(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(&client.faults)))
        {
            clients.push(Arc::downgrade(&client.faults));
        }
        Ok(CudaStream {
            raw: Cell::new(s),
            priority: p,
            client: client.id,
            busy: client.busy_ns.clone(),
            sm: client.sm.clone(),
            seen: Cell::new(seen),
            partition: RefCell::new(partition),
        })
    }

    fn submit(
        &self,
        stream: &CudaStream,
        _seq: u64,
        op: Op<'_, Self>,
        publish: Option<Publish>,
    ) -> Result<()> {
        self.shared.bind();
        self.shared.alive()?;
        self.follow_placement(stream)?;
        let s = stream.raw.get();
        match op {
            Op::Launch {
                function,
                grid,
                block,
                shared_mem,
                params,
            } => {
                let mut size = params.len();
                let mut extra = [
                    sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
                    params.as_ptr() as *mut c_void,
                    sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
                    &mut size as *mut usize as *mut c_void,
                    sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut c_void,
                ];
                let extra_ptr = if params.is_empty() {
                    std::ptr::null_mut()
                } else {
                    extra.as_mut_ptr()
                };
                // SAFETY: the function is loaded (its module is kept alive by `function`); the
                // packed buffer has exactly the layout cuFuncGetParamInfo reported (the session
                // checked its size) and is copied by the driver during the call.
                let r = unsafe {
                    sys::cuLaunchKernel(
                        function.raw,
                        grid.x,
                        grid.y,
                        grid.z,
                        block.x,
                        block.y,
                        block.z,
                        shared_mem,
                        s,
                        std::ptr::null_mut(),
                        extra_ptr,
                    )
                };
                self.shared
                    .check(r, &format!("launching {}", function.name))?;
            }
            Op::CopyHtoD { dst, src } => self.copy_in(s, dst, &src)?,
            Op::CopyDtoH { dst, src } => {
                let (ptr, len) = dst.as_raw();
                // SAFETY: dst is a registered shared segment (host buffer or staging) that the
                // session keeps mapped until it synchronises; the device range was validated.
                let r = unsafe { sys::cuMemcpyDtoHAsync_v2(ptr as *mut c_void, src, len, s) };
                self.shared.check(r, "cuMemcpyDtoHAsync")?;
            }
            Op::CopyDtoD { dst, src, len } => {
                // SAFETY: both device ranges were validated against the client's allocations.
                let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len as usize, s) };
                self.shared.check(r, "cuMemcpyDtoDAsync")?;
            }
            Op::Memset {
                dst,
                value,
                elem_size,
                count,
            } => {
                // SAFETY: the device range was validated against the client's allocations.
                let r = unsafe {
                    if elem_size == 1 {
                        sys::cuMemsetD8Async(dst, value as u8, count as usize, s)
                    } else {
                        sys::cuMemsetD32Async(dst, value, count as usize, s)
                    }
                };
                self.shared.check(r, "cuMemset")?;
            }
            Op::Record(ev) => {
                // SAFETY: both handles are live.
                let r = unsafe { sys::cuEventRecord(ev.raw, s) };
                self.shared.check(r, "cuEventRecord")?;
                ev.recorded.store(true, Ordering::Release);
            }
            Op::Wait(ev) => {
                // SAFETY: both handles are live.
                let r = unsafe { sys::cuStreamWaitEvent(s, ev.raw, 0) };
                self.shared.check(r, "cuStreamWaitEvent")?;
            }
            Op::Nop => {}
        }
        if let Some(p) = publish {
            let word = p.channel.stream_done(p.slot) as *const _ as *const u8;
            let dev = self.device_address(word)?;
            // SAFETY: `dev` is the device address of the client's progress word in its
            // registered server segment, which stays registered until the session ends (after
            // its streams are synchronised).
            let r = unsafe { sys::cuStreamWriteValue64_v2(s, dev, p.seq, 0) };
            self.shared.check(r, "cuStreamWriteValue64")?;
        }
        Ok(())
    }

    fn stream_synchronize(&self, stream: &CudaStream, _closing: &AtomicBool) -> Result<()> {
        self.shared.bind();
        // SAFETY: a live stream.
        let r = unsafe { sys::cuStreamSynchronize(stream.raw.get()) };
        self.shared.check(r, "cuStreamSynchronize")
    }

    fn stream_destroy(&self, stream: CudaStream) {
        self.shared.bind();
        // Waiting for the work lets the stream's progress slot and the client's memory be
        // reused safely; the partition is released after the stream.
        self.retire(stream.raw.get());
        drop(stream);
    }

    fn event_create(&self) -> Result<CudaEvent> {
        self.shared.bind();
        self.shared.alive()?;
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: creates an event (timing enabled) in the bound context.
        let r = unsafe { sys::cuEventCreate(&mut e, 0) };
        self.shared.check(r, "cuEventCreate")?;
        Ok(CudaEvent {
            raw: e,
            recorded: AtomicBool::new(false),
        })
    }

    fn event_elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        self.shared.bind();
        for (ev, which) in [(start, "start"), (end, "end")] {
            if !ev.recorded.load(Ordering::Acquire) {
                return Err(Error::invalid_value(format!(
                    "the {which} event was never recorded"
                )));
            }
        }
        let mut ms = 0f32;
        // SAFETY: both events are live and recorded.
        let r = unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, end.raw) };
        if r == CUresult::CUDA_ERROR_NOT_READY {
            return Err(Error::new(
                Status::NotReady,
                "an event's latest record has not completed yet",
            ));
        }
        self.shared.check(r, "cuEventElapsedTime")?;
        Ok(ms)
    }
}
