//! A connection to one device's mps server: the only module that calls the mps client library,
//! so that the rest of the library speaks in CUDA's terms and a change of client crate is a
//! change here.
//!
//! Every failure is logged (with `MPS_CUDA_LOG`) with the client's message and returned as the
//! CUDA result the server's driver gave, or else that of its status.

use std::sync::RwLock;

use mps_client::Client;
use mps_client::{Error, PhysicalMem};
pub(crate) use mps_client::{Event, Function, Graph, GraphExec, KernelLayout, Module, Stream};
use mps_core::protocol::{Cluster, Dim3, ParamInfo};

use crate::abi::CUresult;
use crate::{errors, log};

pub(crate) use crate::ffi::Res;

pub(crate) fn fail(e: Error) -> CUresult {
    log::failure(&e.message);
    errors::from_error(e.status, e.cuda_result)
}

/// The device as the server described it when this process connected.
#[derive(Clone, Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) total_mem: u64,
    pub(crate) sm_count: u32,
    /// The SMs this process's kernels run on (its share or reservation): what the program is
    /// told the device's multiprocessor count is, as NVIDIA's MPS tells its clients, since
    /// libraries size kernels by that count and some of cuDNN's fail or never finish on fewer
    /// SMs than it says. The server keeps every client at least the SMs it was told.
    pub(crate) client_sms: u32,
    pub(crate) cc: (u32, u32),
}

/// The connection to one device's server, shared by every context and thread of the process
/// that uses that device.
#[derive(Debug)]
pub(crate) struct Connection {
    client: Client,
    /// The device's CUDA ordinal in this process.
    ordinal: i32,
    device: Device,
    /// The device's VMM granularity, once the server gave it.
    granularity: std::sync::OnceLock<u64>,
    /// Held shared by the calls the server (or client) refuses while a stream of the process
    /// captures (freeing or mapping memory, a synchronisation of the whole device), and
    /// exclusively through an internal capture ([`Connection::internal_capture`]), so that such
    /// a call waits those few round trips out instead of failing.
    internal: RwLock<()>,
}

impl Connection {
    /// How many devices this process sees through `$MPS_PIPE_DIRECTORY` (else `/tmp/mps`), with
    /// `CUDA_VISIBLE_DEVICES` applied as CUDA applies it.
    pub(crate) fn device_count() -> Result<u32, String> {
        Client::device_count(None).map_err(|e| e.message)
    }

    /// Connects to device `ordinal` (of those this process sees): to its server, through the
    /// daemon or server of `$MPS_PIPE_DIRECTORY`. A failure gives the client's message and the
    /// CUDA result of its status.
    pub(crate) fn connect(ordinal: u32) -> Result<Connection, (String, CUresult)> {
        let client = Client::connect_device(None, ordinal)
            .map_err(|e| (e.message, errors::from_error(e.status, e.cuda_result)))?;
        let sms = client
            .sm_info()
            .map_err(|e| (e.message, errors::from_error(e.status, e.cuda_result)))?;
        let d = client.device_info();
        let device = Device {
            name: d.name.clone(),
            total_mem: d.total_mem,
            sm_count: d.sm_count,
            client_sms: sms.sms,
            cc: d.cc,
        };
        Ok(Connection {
            client,
            ordinal: ordinal as i32,
            device,
            granularity: std::sync::OnceLock::new(),
            internal: RwLock::new(()),
        })
    }

    /// The CUDA ordinal of its device in this process.
    pub(crate) fn ordinal(&self) -> i32 {
        self.ordinal
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    /// Device attribute `attribute` as the server reported it (fetched once, then kept by the
    /// client); `InvalidValue` for one it did not report.
    pub(crate) fn reported_attribute(&self, attribute: i32) -> mps_core::Result<i32> {
        self.client.device_attribute(attribute)
    }

    /// The device's UUID as the server reported it, if it did.
    pub(crate) fn reported_uuid(&self) -> Option<[u8; 16]> {
        self.client.device_uuid().ok().flatten()
    }

    // ----- memory -----

    pub(crate) fn mem_alloc(&self, size: u64) -> Res<u64> {
        self.client.mem_alloc(size).map(|p| p.0).map_err(fail)
    }

    pub(crate) fn mem_free(&self, ptr: u64) -> Res<()> {
        let _not_during = self.outside_internal_capture();
        self.client
            .mem_free(mps_client::DevicePtr(ptr))
            .map_err(fail)
    }

    /// (free, total) bytes: under a memory limit, the client's.
    pub(crate) fn mem_get_info(&self) -> Res<(u64, u64)> {
        self.client.mem_get_info().map_err(fail)
    }

    /// Whether `ptr` lies in one of this client's ranges on the server: an allocation, a
    /// mapping, a module global or a host buffer's device address.
    pub(crate) fn owns(&self, ptr: u64) -> Res<bool> {
        match self
            .client
            .mem_get_address_range(mps_client::DevicePtr(ptr))
        {
            Ok(_) => Ok(true),
            Err(e) if e.status == mps_core::Status::NotFound => Ok(false),
            Err(e) => Err(fail(e)),
        }
    }

    pub(crate) fn host_alloc(&self, size: usize) -> Res<*mut u8> {
        self.client.host_alloc(size).map_err(fail)
    }

    /// The device address of `ptr` in one of this connection's host buffers: where the
    /// server's kernels and copies reach it.
    pub(crate) fn host_device_address(&self, ptr: *const u8) -> Option<u64> {
        self.client.host_device_address(ptr).map(|p| p.0)
    }

    pub(crate) fn host_free(&self, ptr: *mut u8) -> Res<()> {
        let _not_during = self.outside_internal_capture();
        self.client.host_free(ptr).map_err(fail)
    }

    /// # Safety
    /// `src` must be readable for `len` bytes.
    pub(crate) unsafe fn memcpy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        stream: Stream,
    ) -> Res<()> {
        let dst = mps_client::DevicePtr(dst);
        // SAFETY: the caller's guarantee is the client's precondition.
        unsafe { self.client.memcpy_htod_raw(dst, src, len, stream) }.map_err(fail)
    }

    /// # Safety
    /// `dst` must be writable for `len` bytes.
    pub(crate) unsafe fn memcpy_dtoh(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        stream: Stream,
    ) -> Res<()> {
        let src = mps_client::DevicePtr(src);
        // SAFETY: the caller's guarantee is the client's precondition.
        unsafe { self.client.memcpy_dtoh_raw(dst, src, len, stream) }.map_err(fail)
    }

    pub(crate) fn memcpy_dtod(&self, dst: u64, src: u64, len: u64, stream: Stream) -> Res<()> {
        let (dst, src) = (mps_client::DevicePtr(dst), mps_client::DevicePtr(src));
        self.client.memcpy_dtod(dst, src, len, stream).map_err(fail)
    }

    pub(crate) fn memset_d8(&self, dst: u64, value: u8, count: u64, stream: Stream) -> Res<()> {
        let dst = mps_client::DevicePtr(dst);
        self.client
            .memset_d8(dst, value, count, stream)
            .map_err(fail)
    }

    pub(crate) fn memset_d32(&self, dst: u64, value: u32, count: u64, stream: Stream) -> Res<()> {
        let dst = mps_client::DevicePtr(dst);
        self.client
            .memset_d32(dst, value, count, stream)
            .map_err(fail)
    }

    // ----- virtual memory management -----

    /// The granularity of the device's reservations, physical allocations and mappings
    /// (asked once); `CUDA_ERROR_NOT_SUPPORTED` where its server has no VMM.
    pub(crate) fn vm_granularity(&self) -> Res<u64> {
        if let Some(g) = self.granularity.get() {
            return Ok(*g);
        }
        let g = self.client.vm_granularity().map_err(fail)?;
        Ok(*self.granularity.get_or_init(|| g))
    }

    pub(crate) fn vm_reserve(&self, size: u64, align: u64) -> Res<u64> {
        self.client
            .vm_reserve(size, align)
            .map(|p| p.0)
            .map_err(fail)
    }

    pub(crate) fn vm_free(&self, va: u64) -> Res<()> {
        self.client.vm_free(mps_client::DevicePtr(va)).map_err(fail)
    }

    pub(crate) fn vm_create(&self, size: u64) -> Res<u64> {
        self.client.vm_create(size).map(|p| p.0).map_err(fail)
    }

    pub(crate) fn vm_release(&self, handle: u64) -> Res<()> {
        self.client.vm_release(PhysicalMem(handle)).map_err(fail)
    }

    pub(crate) fn vm_map(&self, va: u64, size: u64, handle: u64, offset: u64) -> Res<()> {
        let _not_during = self.outside_internal_capture();
        let va = mps_client::DevicePtr(va);
        self.client
            .vm_map(va, size, PhysicalMem(handle), offset)
            .map_err(fail)
    }

    pub(crate) fn vm_unmap(&self, va: u64, size: u64) -> Res<()> {
        let _not_during = self.outside_internal_capture();
        self.client
            .vm_unmap(mps_client::DevicePtr(va), size)
            .map_err(fail)
    }

    pub(crate) fn vm_set_access(&self, va: u64, size: u64) -> Res<()> {
        self.client
            .vm_set_access(mps_client::DevicePtr(va), size)
            .map_err(fail)
    }

    /// The server's handle of the physical allocation mapped at `va`, retained (one more
    /// release is due).
    pub(crate) fn vm_retain_handle(&self, va: u64) -> Res<u64> {
        let (h, _) = self
            .client
            .vm_retain_handle(mps_client::DevicePtr(va))
            .map_err(fail)?;
        Ok(h.0)
    }

    // ----- modules and launches -----

    pub(crate) fn module_load(&self, image: &[u8]) -> Res<Module> {
        self.client.module_load(image).map_err(fail)
    }

    pub(crate) fn module_unload(&self, module: Module) -> Res<()> {
        self.client.module_unload(module).map_err(fail)
    }

    /// The kernel `name` of `module` and its parameters' (offset, size), as the server reported
    /// them.
    /// The server context's priority range and limits (the client keeps them).
    pub(crate) fn context_limits(&self) -> Res<mps_client::ContextLimits> {
        self.client.context_limits().map_err(fail)
    }

    /// Kernel `f`'s attributes as the server's driver reports them now.
    pub(crate) fn function_attributes(&self, f: Function) -> Res<mps_client::FunctionAttributes> {
        self.client.function_attributes(f).map_err(fail)
    }

    /// A module global's (address, size).
    pub(crate) fn module_global(&self, module: Module, name: &str) -> Res<(u64, u64)> {
        let (p, size) = self.client.module_get_global(module, name).map_err(fail)?;
        Ok((p.0, size))
    }

    /// The names of `module`'s kernels, as the server's driver lists them.
    pub(crate) fn module_function_names(&self, module: Module) -> Res<Vec<String>> {
        self.client.module_function_names(module).map_err(fail)
    }

    /// The server's tiled TMA descriptor of `map`.
    pub(crate) fn tensor_map_encode_tiled(
        &self,
        map: &mps_client::TensorMapTiled,
    ) -> Res<[u8; mps_client::TENSOR_MAP_BYTES]> {
        self.client.tensor_map_encode_tiled(map).map_err(fail)
    }

    /// The server's copy of descriptor `map` naming `address` instead.
    pub(crate) fn tensor_map_replace_address(
        &self,
        map: &[u8; mps_client::TENSOR_MAP_BYTES],
        address: u64,
    ) -> Res<[u8; mps_client::TENSOR_MAP_BYTES]> {
        self.client
            .tensor_map_replace_address(map, mps_client::DevicePtr(address))
            .map_err(fail)
    }

    pub(crate) fn occupancy(&self, f: Function, q: mps_client::OccupancyQuery) -> Res<u64> {
        self.client.occupancy(f, q).map_err(fail)
    }

    /// The parameter layout of `function`, kept by the library's function object so that a
    /// launch does not look it up again.
    pub(crate) fn kernel_layout(&self, function: Function) -> Res<KernelLayout> {
        self.client.kernel_layout(function).map_err(fail)
    }

    pub(crate) fn get_function(
        &self,
        module: Module,
        name: &str,
    ) -> Res<(Function, Vec<ParamInfo>)> {
        let f = self
            .client
            .module_get_function(module, name)
            .map_err(fail)?;
        let mut params = Vec::new();
        // The client holds the layout it fetched; it answers "no such parameter" past the end.
        while let Ok(p) = self.client.function_param_info(f, params.len() as u32) {
            params.push(p);
        }
        Ok((f, params))
    }

    /// Launches with `params[i]` pointing at parameter `i`, as `cuLaunchKernel` takes them.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each readable for that parameter's
    /// size.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn launch(
        &self,
        kernel: &KernelLayout,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        cluster: Option<Cluster>,
        stream: Stream,
        params: *const *const u8,
    ) -> Res<()> {
        let dim = |d: [u32; 3]| Dim3 {
            x: d[0],
            y: d[1],
            z: d[2],
        };
        // SAFETY: the caller's guarantee is the client's precondition.
        unsafe {
            self.client.launch_raw_kernel(
                kernel,
                dim(grid),
                dim(block),
                shared_mem,
                cluster,
                stream,
                params,
            )
        }
        .map_err(fail)
    }

    // ----- streams and events -----

    pub(crate) fn stream_create(&self, priority: i32) -> Res<Stream> {
        self.client.stream_create(priority).map_err(fail)
    }

    pub(crate) fn stream_destroy(&self, stream: Stream) -> Res<()> {
        self.client.stream_destroy(stream).map_err(fail)
    }

    pub(crate) fn stream_synchronize(&self, stream: Stream) -> Res<()> {
        self.client.stream_synchronize(stream).map_err(fail)
    }

    pub(crate) fn stream_query(&self, stream: Stream) -> Res<bool> {
        self.client.stream_query(stream).map_err(fail)
    }

    /// Queues host function `f` in `stream` (see `mps_client::Client::launch_host_func`).
    pub(crate) fn launch_host_func(&self, stream: Stream, f: mps_client::HostFn) -> Res<()> {
        self.client.launch_host_func(stream, f).map_err(fail)
    }

    pub(crate) fn stream_wait_event(&self, stream: Stream, event: Event) -> Res<()> {
        self.client.stream_wait_event(stream, event).map_err(fail)
    }

    /// Waits for all of this process's work on this device.
    pub(crate) fn synchronize(&self) -> Res<()> {
        let _not_during = self.outside_internal_capture();
        self.client.synchronize().map_err(fail)
    }

    pub(crate) fn event_create(&self) -> Res<Event> {
        self.client.event_create().map_err(fail)
    }

    pub(crate) fn event_destroy(&self, event: Event) -> Res<()> {
        self.client.event_destroy(event).map_err(fail)
    }

    pub(crate) fn event_record(&self, event: Event, stream: Stream) -> Res<()> {
        self.client.event_record(event, stream).map_err(fail)
    }

    pub(crate) fn event_synchronize(&self, event: Event) -> Res<()> {
        self.client.event_synchronize(event).map_err(fail)
    }

    pub(crate) fn event_query(&self, event: Event) -> Res<bool> {
        self.client.event_query(event).map_err(fail)
    }

    pub(crate) fn event_elapsed_ms(&self, start: Event, end: Event) -> Res<f32> {
        self.client.event_elapsed_ms(start, end).map_err(fail)
    }

    // ----- graphs -----

    /// Runs `f`, a capture of this library's own (a plan of a built graph, captured in an
    /// internal stream), while no call that a capture would make fail is under way, and holds
    /// such calls back until it is done.
    pub(crate) fn internal_capture<R>(&self, f: impl FnOnce() -> R) -> R {
        let _alone = self.internal.write().unwrap_or_else(|p| p.into_inner());
        f()
    }

    fn outside_internal_capture(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.internal.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stream_begin_capture(&self, stream: Stream) -> Res<()> {
        self.client.stream_begin_capture(stream).map_err(fail)
    }

    /// The graph `stream` captured, and how many nodes (commands) it holds.
    pub(crate) fn stream_end_capture(&self, stream: Stream) -> Res<(Graph, u64)> {
        self.client.stream_end_capture_counted(stream).map_err(fail)
    }

    pub(crate) fn graph_instantiate(&self, graph: Graph) -> Res<GraphExec> {
        self.client.graph_instantiate(graph).map_err(fail)
    }

    pub(crate) fn graph_launch(&self, exec: GraphExec, stream: Stream) -> Res<()> {
        self.client.graph_launch(exec, stream).map_err(fail)
    }

    pub(crate) fn graph_destroy(&self, graph: Graph) -> Res<()> {
        self.client.graph_destroy(graph).map_err(fail)
    }

    pub(crate) fn graph_exec_destroy(&self, exec: GraphExec) -> Res<()> {
        self.client.graph_exec_destroy(exec).map_err(fail)
    }
}
