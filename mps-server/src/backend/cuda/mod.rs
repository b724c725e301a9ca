//! The CUDA backend: one primary context on one device, driven through cudarc's raw driver API
//! (loaded dynamically, so the server builds and runs where no driver is installed).
//!
//! - Each client stream is a CUDA stream of its own (non-blocking, priority honoured), so work of
//!   different streams, of one client or of many, runs concurrently on the device.
//!   `CUDA_DEVICE_MAX_CONNECTIONS` is raised before the context exists (see `main`), or streams
//!   would share hardware queues and falsely serialise.
//! - Kernel parameters go to cuLaunchKernel as one packed buffer
//!   (`CU_LAUNCH_PARAM_BUFFER_POINTER`), laid out by `cuFuncGetParamInfo`: the buffer the
//!   session hands over, not a copy of it.
//! - Progress is written by the GPU itself: `cuStreamWriteValue64` into the client's stream slot,
//!   in the server segment, which is registered with `cuMemHostRegister(DEVICEMAP)`. No server
//!   thread is on the completion path; clients poll the slot (spinning, then napping). Each
//!   stream keeps the slot's device address, so a marked command takes no lock that other
//!   sessions take.
//! - Host buffers and the staging area are registered too, so copies DMA straight from and to the
//!   client's pages.
//! - A kernel fault destroys the context for every client of the server (the device gives no
//!   finer containment): a health thread notices and tells every client (`context`, `health`).
//! - SM shares and reservations are green contexts (`partition`); a client's streams move to
//!   its new partition at their next submission after a change (`stream`).
//! - GPU busy time is sampled by the health thread (`health`).
//!
//! Every driver result goes through one layer (the `mps-driver` crate, which the benchmark's
//! native workers share), which keeps the driver's code and name and maps it to an mps status.

mod context;
mod device;
mod exclusive;
pub use exclusive::prioritise_driver_writers;
mod graph;
mod health;
mod host;
mod objects;
mod partition;
mod queries;
mod stream;
mod tensor_map;
mod vm;

use std::ffi::{CString, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUfunction, CUresult, CUstream};
use mps_core::protocol::{
    CONTEXT_LIMITS, DeviceCopy, FUNC_ATTRIBUTES, Fill, LaunchSpec, OccupancyQuery, ParamInfo,
    TENSOR_MAP_BYTES, TensorMapTiled,
};
use mps_core::ptx::ImageFormat;
use mps_core::{Error, Result, Status};
use mps_ipc::segment::Segment;

use super::{Backend, ClientContext, DeviceInfo, HostBytes, Op, Publish};
use crate::sm::Assignment;
use context::Context;
pub use graph::{CudaGraph, CudaGraphExec};
use health::LiveStreams;
use host::Registrations;
use mps_driver::{self as driver, Call, Event, Module, check_on, released};
pub use objects::{CudaEvent, CudaFunction, CudaModule};
use partition::Partitions;
pub use stream::CudaStream;

/// The probe `--backend auto` runs: is a driver installed and does it see a device?
pub fn probe() -> std::result::Result<(), String> {
    if !driver::is_present() {
        return Err("libcuda.so was not found (no NVIDIA driver installed)".into());
    }
    let n = driver::device_count().map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("the driver sees no CUDA device".into());
    }
    Ok(())
}

/// The CUDA backend.
pub struct CudaBackend {
    ctx: Arc<Context>,
    info: DeviceInfo,
    host: Registrations,
    live: Arc<LiveStreams>,
    priorities: (i32, i32),
    partitions: Partitions,
    /// The device's ordinal, for the locations of physical memory and access.
    ordinal: i32,
    /// The driver's minimum VMM granularity (`None`: no VMM, and the sessions refuse it).
    granularity: Option<u64>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.info.name)
            .finish()
    }
}

impl CudaBackend {
    /// Opens device `ordinal`'s primary context. With `context_per_client`, a client whose
    /// kernels may use the whole device gets a green context of its own over every SM for its
    /// streams (see `partition`); without, it uses the primary context's. Call [`probe`] first:
    /// cudarc panics when the driver library is missing.
    pub fn new(ordinal: i32, context_per_client: bool) -> Result<CudaBackend> {
        probe().map_err(|e| Error::new(Status::Unsupported, e))?;
        let dev =
            result::device::get(ordinal).call_on("cuDeviceGet", || format!("ordinal {ordinal}"))?;
        // SAFETY: `dev` is the driver's; the primary context is retained for the life of the
        // process, so it stays valid once current.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .call_on("cuDevicePrimaryCtxRetain", || format!("device {ordinal}"))?;
        // SAFETY: as above.
        unsafe { result::ctx::set_current(ctx) }.call("cuCtxSetCurrent")?;
        let (least, greatest) =
            result::stream::get_priority_range().call("cuCtxGetStreamPriorityRange")?;
        let partitions = Partitions::discover(dev, context_per_client);
        if let Some(why) = partitions.unsupported() {
            tracing::warn!("SM shares and reservations are unavailable: {why}");
        }
        let info = device::describe(dev, |sms| partitions.unit_sizes(sms))?;
        let ctx = Arc::new(Context::new(ctx));
        let live = Arc::new(LiveStreams::default());
        health::spawn(ctx.clone(), live.clone())?;
        Ok(CudaBackend {
            ctx,
            info,
            host: Registrations::default(),
            live,
            priorities: (least, greatest),
            partitions,
            ordinal,
            granularity: vm::granularity(ordinal),
        })
    }

    /// Lets `function` use more dynamic shared memory than the default per block, up to the
    /// device's opt-in limit that the server checks launches against. Done at its first launch
    /// that needs it, so that kernels that never do keep the driver's defaults.
    fn opt_in(&self, function: &CudaFunction) -> Result<()> {
        if function.opted_in.load(Ordering::Acquire) {
            return Ok(());
        }
        let allowed = device::allow_dynamic_shared_memory(
            function.raw,
            function.static_shared,
            &self.info.limits,
        );
        self.ctx
            .check(allowed.map_err(|e| e.on(format!("kernel {:?}", function.name))))?;
        function.opted_in.store(true, Ordering::Release);
        Ok(())
    }

    /// Opts `function` in (see [`CudaBackend::opt_in`]) where a launch of it with `shared_mem`
    /// bytes of dynamic shared memory needs more than the default per block.
    fn opt_in_for(&self, function: &CudaFunction, shared_mem: u32) -> Result<()> {
        let default = self.info.limits.max_shared_mem_per_block;
        if shared_mem.saturating_add(function.static_shared) > default {
            self.opt_in(function)?;
        }
        Ok(())
    }

    /// Looks `name` (a `what`: kernel, global) up in a module with `call`, which gets it as a C
    /// string: a name the module lacks is mps's `NotFound`, naming it.
    fn look_up(
        &self,
        what: &str,
        name: &str,
        call: &'static str,
        lookup: impl FnOnce(*const std::ffi::c_char) -> CUresult,
    ) -> Result<()> {
        let cname = CString::new(name)
            .map_err(|_| Error::invalid_value(format!("{what} name contains a NUL byte")))?;
        let r = lookup(cname.as_ptr());
        if r == CUresult::CUDA_ERROR_NOT_FOUND {
            return Err(Error::new(
                Status::NotFound,
                format!("the module has no {what} named {name:?}"),
            ));
        }
        self.ctx
            .check(check_on(r, call, || format!("{what} {name:?}")))
    }

    /// Lets `function` be launched in clusters of up to 16 blocks, once.
    fn allow_non_portable_clusters(&self, function: &CudaFunction) -> Result<()> {
        if function.non_portable_clusters.load(Ordering::Acquire) {
            return Ok(());
        }
        let allowed = device::allow_non_portable_clusters(function.raw);
        self.ctx
            .check(allowed.map_err(|e| e.on(format!("kernel {:?}", function.name))))?;
        function
            .non_portable_clusters
            .store(true, Ordering::Release);
        Ok(())
    }

    fn copy_in(&self, stream: CUstream, dst: u64, src: &HostBytes) -> Result<()> {
        let (ptr, len) = src.as_raw();
        // SAFETY: `src` keeps its bytes alive until the session synchronises (shared pages) or,
        // for a private copy (pageable source), the driver has taken the bytes when the call
        // returns; the device range was validated against the client's allocations.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, ptr as *const c_void, len, stream) };
        self.ctx.check(check_on(r, "cuMemcpyHtoDAsync", || {
            format!("{len} bytes to {dst:#x}")
        }))
    }
}

/// Runs `call` with the kernel parameters `params` in the packed form a launch's `extra` takes
/// (`CU_LAUNCH_PARAM_BUFFER_POINTER`, `_SIZE`, `_END`; null for a kernel without parameters),
/// which is valid for the call only: the driver copies the buffer before it returns.
pub(super) fn with_packed_params<R>(params: &[u8], call: impl FnOnce(*mut *mut c_void) -> R) -> R {
    let mut size = params.len();
    let mut extra = [
        sys::CU_LAUNCH_PARAM_BUFFER_POINTER_AS_INT as usize as *mut c_void,
        params.as_ptr() as *mut c_void,
        sys::CU_LAUNCH_PARAM_BUFFER_SIZE_AS_INT as usize as *mut c_void,
        &mut size as *mut usize as *mut c_void,
        sys::CU_LAUNCH_PARAM_END_AS_INT as usize as *mut c_void,
    ];
    call(if params.is_empty() {
        std::ptr::null_mut()
    } else {
        extra.as_mut_ptr()
    })
}

impl Backend for CudaBackend {
    type Stream = CudaStream;
    type Event = CudaEvent;
    type Module = CudaModule;
    type Function = CudaFunction;
    type Graph = CudaGraph;
    type GraphExec = CudaGraphExec;

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_alloc(&self, size: u64) -> Result<u64> {
        self.ctx.enter()?;
        // SAFETY: the context is current; the driver checks the size.
        let r = unsafe { result::malloc_sync(size as usize) };
        self.ctx
            .check(r.call_on("cuMemAlloc", || format!("{size} bytes")))
    }

    fn mem_free(&self, ptr: u64, _size: u64) {
        self.ctx.bind();
        // SAFETY: ptr came from cuMemAlloc and the session ensured no work of the client uses
        // it.
        released(unsafe { result::free_sync(ptr) }.call("cuMemFree"));
    }

    fn mem_get_info(&self) -> (u64, u64) {
        self.ctx.bind();
        match result::mem_get_info().call("cuMemGetInfo") {
            Ok((free, total)) => (free as u64, total as u64),
            // A dead context reports nothing free.
            Err(e) => {
                tracing::debug!("{e}");
                (0, 0)
            }
        }
    }

    fn vm_granularity(&self) -> u64 {
        // Without VMM, a granularity no size meets: every reservation and allocation is
        // refused by the session with the granularity in the message, before the driver.
        self.granularity.unwrap_or(0)
    }

    fn vm_reserve(&self, size: u64, align: u64) -> Result<u64> {
        vm::reserve(&self.ctx, size, align)
    }

    fn vm_free(&self, va: u64, size: u64) {
        vm::free(&self.ctx, va, size)
    }

    fn vm_create(&self, size: u64) -> Result<u64> {
        vm::create(&self.ctx, self.ordinal, size)
    }

    fn vm_release(&self, phys: u64, _size: u64) {
        vm::release(&self.ctx, phys)
    }

    fn vm_map(&self, va: u64, size: u64, phys: u64, offset: u64) -> Result<()> {
        vm::map(&self.ctx, va, size, phys, offset)
    }

    fn vm_unmap(&self, va: u64, size: u64) {
        vm::unmap(&self.ctx, va, size)
    }

    fn vm_set_access(&self, va: u64, size: u64) -> Result<()> {
        vm::set_access(&self.ctx, self.ordinal, va, size)
    }

    fn host_register(&self, segment: &Segment) -> Result<()> {
        self.ctx.bind();
        self.host.register(&self.ctx, segment)
    }

    fn host_unregister(&self, segment: &Segment) {
        self.ctx.bind();
        self.host.unregister(segment);
    }

    fn host_map(&self, segment: &Segment) -> Result<u64> {
        // Registered with DEVICEMAP: the driver mapped it for the device already.
        self.host.device_address(segment.as_ptr())
    }

    fn host_unmap(&self, _addr: u64, _len: u64) {}

    fn module_load(&self, image: &[u8]) -> Result<CudaModule> {
        self.ctx.enter()?;
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
        // SAFETY: bytes is a complete image (NUL-terminated if PTX): the format was detected
        // from its headers.
        let module = unsafe { Module::load_data(bytes) };
        let module = self
            .ctx
            .check(module.map_err(|e| e.on(format!("a {format:?} image"))))?;
        Ok(CudaModule(Arc::new(module)))
    }

    fn module_function(
        &self,
        module: &CudaModule,
        name: &str,
    ) -> Result<(CudaFunction, Vec<ParamInfo>)> {
        self.ctx.bind();
        let mut f: CUfunction = std::ptr::null_mut();
        self.look_up("kernel", name, "cuModuleGetFunction", |cname| {
            // SAFETY: the module is loaded; cname is NUL-terminated.
            unsafe { sys::cuModuleGetFunction(&mut f, module.0.raw(), cname) }
        })?;
        let mut params = Vec::new();
        loop {
            let (mut off, mut size) = (0usize, 0usize);
            // SAFETY: f is a valid function; the driver writes two sizes or fails past the last
            // parameter.
            let r = unsafe { sys::cuFuncGetParamInfo(f, params.len(), &mut off, &mut size) };
            // The driver fails past the last parameter: that ends the list.
            if r != CUresult::CUDA_SUCCESS {
                break;
            }
            params.push(ParamInfo {
                offset: off as u32,
                size: size as u32,
            });
        }
        let static_shared = self
            .ctx
            .check(device::static_shared_memory(f).map_err(|e| e.on(format!("kernel {name:?}"))))?;
        let func = CudaFunction {
            raw: f,
            static_shared,
            name: name.to_string(),
            _module: module.0.clone(),
            opted_in: AtomicBool::new(false),
            non_portable_clusters: AtomicBool::new(false),
        };
        Ok((func, params))
    }

    fn module_global(&self, module: &CudaModule, name: &str) -> Result<(u64, u64)> {
        self.ctx.enter()?;
        let (mut ptr, mut size) = (0, 0);
        self.look_up("global", name, "cuModuleGetGlobal", |cname| {
            // SAFETY: the module is loaded; cname is NUL-terminated; writes an address and a
            // size.
            unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut size, module.0.raw(), cname) }
        })?;
        Ok((ptr, size as u64))
    }

    fn tensor_map_encode_tiled(&self, map: &TensorMapTiled) -> Result<[u8; TENSOR_MAP_BYTES]> {
        self.ctx.enter()?;
        tensor_map::encode_tiled(map)
    }

    fn tensor_map_replace_address(
        &self,
        map: &[u8; TENSOR_MAP_BYTES],
        address: u64,
    ) -> Result<[u8; TENSOR_MAP_BYTES]> {
        self.ctx.enter()?;
        tensor_map::replace_address(map, address)
    }

    fn module_function_names(&self, module: &CudaModule) -> Result<Vec<String>> {
        self.ctx.enter()?;
        let on = || "a module".to_string();
        let mut count = 0u32;
        // SAFETY: the module is loaded; the driver writes a count.
        let r = unsafe { sys::cuModuleGetFunctionCount(&mut count, module.0.raw()) };
        self.ctx
            .check(check_on(r, "cuModuleGetFunctionCount", on))?;
        let mut functions: Vec<CUfunction> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: the module is loaded; `functions` has room for `count` handles.
        let r = unsafe {
            sys::cuModuleEnumerateFunctions(functions.as_mut_ptr(), count, module.0.raw())
        };
        self.ctx
            .check(check_on(r, "cuModuleEnumerateFunctions", on))?;
        functions
            .into_iter()
            .map(|f| {
                let mut name: *const std::ffi::c_char = std::ptr::null();
                // SAFETY: f is a function of the loaded module; the driver writes a pointer to
                // its NUL-terminated name, which lives as long as the module.
                let r = unsafe { sys::cuFuncGetName(&mut name, f) };
                self.ctx.check(check_on(r, "cuFuncGetName", on))?;
                // SAFETY: the driver succeeded, so `name` is a NUL-terminated string.
                Ok(unsafe { std::ffi::CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned())
            })
            .collect()
    }

    fn context_limits(&self) -> ((i32, i32), [Option<u64>; CONTEXT_LIMITS]) {
        self.ctx.bind();
        (self.priorities, queries::context_limits())
    }

    fn function_attributes(
        &self,
        function: &CudaFunction,
    ) -> Result<[Option<i32>; FUNC_ATTRIBUTES]> {
        self.ctx.enter()?;
        Ok(queries::function_attributes(function.raw))
    }

    fn occupancy(&self, function: &CudaFunction, query: OccupancyQuery) -> Result<u64> {
        self.ctx.enter()?;
        // As its launches will: a kernel asked about more dynamic shared memory than the
        // default per block is opted in first, so that the figure is the one launches get.
        self.opt_in(function)?;
        self.ctx.check(queries::occupancy(function.raw, query))
    }

    fn place(&self, assignments: &[Assignment]) -> Result<()> {
        self.ctx.enter()?;
        self.partitions.place(assignments)
    }

    fn stream_create(&self, priority: i32, client: &ClientContext) -> Result<CudaStream> {
        self.ctx.enter()?;
        self.new_stream(priority, client)
    }

    fn submit(
        &self,
        stream: &CudaStream,
        _seq: u64,
        op: Op<'_, Self>,
        publish: Option<Publish>,
    ) -> Result<()> {
        self.ctx.enter()?;
        stream.submitted.fetch_add(1, Ordering::Release);
        let capturing = stream.capture.borrow().is_some();
        if capturing && publish.is_some() {
            return Err(mps_core::Error::internal(
                "a progress mark reached a capturing stream",
            ));
        }
        // A capturing stream cannot move to another partition; it follows after the capture.
        if !capturing {
            self.follow_client(stream)?;
        }
        let s = stream.raw.get();
        // The graph must keep alive what its nodes refer to (kernels, host buffers).
        let keep = capturing.then(|| op_keep(&op));
        match op {
            Op::Launch(LaunchSpec {
                function,
                grid,
                block,
                shared_mem,
                cluster,
                params,
            }) => {
                self.opt_in_for(&function, shared_mem)?;
                if cluster.is_some_and(|c| c.non_portable) {
                    self.allow_non_portable_clusters(&function)?;
                }
                let r = with_packed_params(&params, |extra_ptr| match cluster {
                    // SAFETY: the function is loaded (its module is kept alive by `function`);
                    // the packed buffer has exactly the layout cuFuncGetParamInfo reported (the
                    // session checked its size) and is copied by the driver during the call.
                    None => unsafe {
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
                    },
                    Some(c) => {
                        // SAFETY: a union of plain integers, all zero is valid.
                        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
                        value.clusterDim.x = c.dims.x;
                        value.clusterDim.y = c.dims.y;
                        value.clusterDim.z = c.dims.z;
                        let mut attr = sys::CUlaunchAttribute {
                            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                            pad: [0; 4],
                            value,
                        };
                        let config = sys::CUlaunchConfig {
                            gridDimX: grid.x,
                            gridDimY: grid.y,
                            gridDimZ: grid.z,
                            blockDimX: block.x,
                            blockDimY: block.y,
                            blockDimZ: block.z,
                            sharedMemBytes: shared_mem,
                            hStream: s,
                            attrs: &mut attr,
                            numAttrs: 1,
                        };
                        // SAFETY: as for cuLaunchKernel above; the configuration and its one
                        // attribute outlive the call.
                        unsafe {
                            sys::cuLaunchKernelEx(
                                &config,
                                function.raw,
                                std::ptr::null_mut(),
                                extra_ptr,
                            )
                        }
                    }
                });
                self.ctx.check(check_on(r, "cuLaunchKernel", || {
                    format!(
                        "kernel {:?}, grid ({}, {}, {}), block ({}, {}, {}), {shared_mem} bytes \
                         of shared memory, on a stream of client {}",
                        function.name,
                        grid.x,
                        grid.y,
                        grid.z,
                        block.x,
                        block.y,
                        block.z,
                        stream.client
                    )
                }))?;
            }
            Op::CopyHtoD { dst, src } => self.copy_in(s, dst, &src)?,
            Op::CopyDtoH { dst, src } => {
                let (ptr, len) = dst.as_raw();
                // SAFETY: dst is a registered shared segment (host buffer or staging) that the
                // session keeps mapped until it synchronises; the device range was validated.
                let r = unsafe { sys::cuMemcpyDtoHAsync_v2(ptr as *mut c_void, src, len, s) };
                self.ctx.check(check_on(r, "cuMemcpyDtoHAsync", || {
                    format!("{len} bytes from {src:#x}, client {}", stream.client)
                }))?;
            }
            Op::CopyDtoD(DeviceCopy { dst, src, len }) => {
                // SAFETY: both device ranges were validated against the client's allocations.
                let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len as usize, s) };
                self.ctx.check(check_on(r, "cuMemcpyDtoDAsync", || {
                    format!("{len} bytes {src:#x} to {dst:#x}, client {}", stream.client)
                }))?;
            }
            Op::Memset(Fill {
                dst,
                value,
                elem_size,
                count,
            }) => {
                // SAFETY: the device range was validated against the client's allocations.
                let r = unsafe {
                    if elem_size == 1 {
                        sys::cuMemsetD8Async(dst, value as u8, count as usize, s)
                    } else {
                        sys::cuMemsetD32Async(dst, value, count as usize, s)
                    }
                };
                self.ctx.check(check_on(r, "cuMemsetAsync", || {
                    format!(
                        "{count} elements of {elem_size} bytes at {dst:#x}, client {}",
                        stream.client
                    )
                }))?;
            }
            Op::Record(ev) => {
                // SAFETY: both handles are live.
                let r = unsafe { sys::cuEventRecord(ev.raw.raw(), s) };
                self.ctx.check(check_on(r, "cuEventRecord", || {
                    format!("an event of client {}", stream.client)
                }))?;
                ev.recorded.store(true, Ordering::Release);
            }
            Op::Wait(ev) => {
                // SAFETY: both handles are live.
                let r = unsafe { sys::cuStreamWaitEvent(s, ev.raw.raw(), 0) };
                self.ctx.check(check_on(r, "cuStreamWaitEvent", || {
                    format!("an event of client {}", stream.client)
                }))?;
            }
            Op::GraphLaunch(exec) => {
                // SAFETY: a live executable graph (kept alive by `exec` until the call returns;
                // the driver keeps it until the launch completes) and a live stream.
                let r = unsafe { sys::cuGraphLaunch(exec.raw.raw(), s) };
                self.ctx.check(check_on(r, "cuGraphLaunch", || {
                    format!("a graph of client {}", stream.client)
                }))?;
            }
            Op::HostWait { device, value, .. } => {
                let geq = sys::CUstreamWaitValue_flags_enum::CU_STREAM_WAIT_VALUE_GEQ as u32;
                // SAFETY: `device` is the device address of 8 bytes of a registered host buffer
                // of the client, which stays registered while work of its streams is pending.
                let r = unsafe { sys::cuStreamWaitValue64_v2(s, device, value, geq) };
                self.ctx.check(check_on(r, "cuStreamWaitValue64", || {
                    format!(
                        "a host function's gate at {device:#x} (value {value}), client {}",
                        stream.client
                    )
                }))?;
            }
            Op::Nop => {}
        }
        if let Some(captured) = stream.capture.borrow_mut().as_mut() {
            captured.ops += 1;
            captured.keep.extend(keep.flatten());
        }
        if let Some(p) = publish {
            let dev = self.progress_address(stream, &p)?;
            // SAFETY: `dev` is the device address of the client's progress word in its
            // registered server segment, which stays registered until the session ends (after
            // its streams are synchronised).
            let r = unsafe { sys::cuStreamWriteValue64_v2(s, dev, p.seq, 0) };
            self.ctx.check(check_on(r, "cuStreamWriteValue64", || {
                format!(
                    "progress of stream slot {} of client {}",
                    p.slot, stream.client
                )
            }))?;
        }
        Ok(())
    }

    fn stream_synchronize(&self, stream: &CudaStream, _closing: &AtomicBool) -> Result<()> {
        self.ctx.bind();
        // SAFETY: a live stream.
        let r = unsafe { sys::cuStreamSynchronize(stream.raw.get()) };
        self.ctx.check(check_on(r, "cuStreamSynchronize", || {
            format!("a stream of client {}", stream.client)
        }))
    }

    fn stream_destroy(&self, stream: CudaStream) {
        self.ctx.bind();
        // Waiting for the work lets the stream's progress slot and the client's memory be
        // reused safely; the partition is released after the stream.
        self.retire(stream.raw.get());
        drop(stream);
    }

    fn capture_begin(&self, stream: &CudaStream) -> Result<()> {
        self.begin_capture(stream)
    }

    fn capture_end(&self, stream: &CudaStream) -> Result<CudaGraph> {
        self.end_capture(stream)
    }

    fn graph_instantiate(&self, graph: &CudaGraph) -> Result<CudaGraphExec> {
        self.instantiate(graph)
    }

    fn graph_exec_update(
        &self,
        exec: &CudaGraphExec,
        index: usize,
        op: &Op<'_, Self>,
    ) -> Result<()> {
        self.update(exec, index, op)
    }

    fn event_create(&self) -> Result<CudaEvent> {
        self.ctx.enter()?;
        // Timing enabled: the default flags.
        let e = Event::create(sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(CudaEvent {
            raw: self.ctx.check(e)?,
            recorded: AtomicBool::new(false),
        })
    }

    fn event_elapsed_ms(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f32> {
        self.ctx.bind();
        for (ev, which) in [(start, "start"), (end, "end")] {
            if !ev.recorded.load(Ordering::Acquire) {
                return Err(Error::invalid_value(format!(
                    "the {which} event was never recorded"
                )));
            }
        }
        // SAFETY: both events are live and recorded.
        match unsafe { result::event::elapsed(start.raw.raw(), end.raw.raw()) } {
            Err(e) if e.0 == CUresult::CUDA_ERROR_NOT_READY => Err(Error::new(
                Status::NotReady,
                "an event's latest record has not completed yet",
            )),
            r => self.ctx.check(r.call("cuEventElapsedTime")),
        }
    }
}

/// What a captured command refers to that must outlive the graph: its kernel (and so its
/// module) and its host pages. A launch's parameters are copied by the driver.
fn op_keep(op: &Op<'_, CudaBackend>) -> Option<Op<'static, CudaBackend>> {
    let shared = |h: &HostBytes| match h {
        HostBytes::Shared {
            segment,
            offset,
            len,
        } => Some(HostBytes::Shared {
            segment: segment.clone(),
            offset: *offset,
            len: *len,
        }),
        HostBytes::Owned(_) => None,
    };
    match op {
        Op::Launch(l) => Some(Op::Launch(
            l.as_ref()
                .map(Arc::clone, |_| std::borrow::Cow::Borrowed(&[][..])),
        )),
        Op::CopyHtoD { dst, src } => shared(src).map(|src| Op::CopyHtoD { dst: *dst, src }),
        Op::CopyDtoH { dst, src } => shared(dst).map(|dst| Op::CopyDtoH { dst, src: *src }),
        _ => None,
    }
}
