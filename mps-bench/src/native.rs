//! The native competitor: a process with its own CUDA context, launching through the driver API
//! directly (the same PTX, the same kernels).

use std::ffi::{CString, c_void};

use cudarc::driver::sys::{self, CUfunction, CUgraphExec, CUresult, CUstream};
use mps_driver as driver;

use crate::workload::{Arg, Gpu};

/// The server's own driver result layer: a failure ends this worker with the call, the code and
/// its name, which the harness reports as the client's failure note.
fn check(r: CUresult, what: &'static str) {
    if let Err(e) = driver::check(r, what) {
        panic!("{e}");
    }
}

/// The kernels the workloads launch.
pub(crate) const KERNELS: [&str; 2] = ["spin_ns", "saxpy_f32"];

/// One process's CUDA context, module and stream.
pub(crate) struct Native {
    stream: CUstream,
    functions: Vec<(String, CUfunction)>,
    graphs: Vec<CUgraphExec>,
}

impl Native {
    pub(crate) fn new(ptx: &[u8]) -> Native {
        // SAFETY: plain driver set-up calls on locals; the context is retained for the life of
        // the process.
        unsafe {
            if let Err(e) = driver::init() {
                panic!("{e}");
            }
            let mut dev = 0;
            check(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet");
            let mut ctx = std::ptr::null_mut();
            check(
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
                "cuDevicePrimaryCtxRetain",
            );
            check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
            let mut image = ptx.to_vec();
            image.push(0);
            let mut module = std::ptr::null_mut();
            check(
                sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void),
                "cuModuleLoadData",
            );
            let mut functions = Vec::new();
            for name in KERNELS {
                let mut f = std::ptr::null_mut();
                let c = CString::new(name).unwrap();
                check(sys::cuModuleGetFunction(&mut f, module, c.as_ptr()), name);
                functions.push((name.to_string(), f));
            }
            // A stream of its own, as through mps (see `crate::via_mps`).
            let mut stream = std::ptr::null_mut();
            check(
                sys::cuStreamCreate(
                    &mut stream,
                    sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32,
                ),
                "cuStreamCreate",
            );
            Native {
                stream,
                functions,
                graphs: Vec::new(),
            }
        }
    }

    fn function(&self, name: &str) -> CUfunction {
        self.functions.iter().find(|(n, _)| n == name).unwrap().1
    }
}

impl Gpu for Native {
    fn alloc(&mut self, bytes: usize) -> u64 {
        let mut p = 0;
        // SAFETY: writes one device pointer.
        check(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, "cuMemAlloc");
        // SAFETY: p is a fresh allocation of at least 4 bytes. In the stream: a non-blocking
        // stream is not ordered after the legacy default stream that cuMemsetD32 would use.
        check(
            unsafe { sys::cuMemsetD32Async(p, 0, bytes / 4, self.stream) },
            "cuMemsetD32Async",
        );
        p
    }

    fn host_alloc(&mut self, bytes: usize) -> *mut u8 {
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one host pointer to `bytes` of pinned memory.
        check(
            unsafe { sys::cuMemAllocHost_v2(&mut p, bytes) },
            "cuMemAllocHost",
        );
        p as *mut u8
    }

    fn launch(&mut self, kernel: &str, blocks: u32, threads: u32, args: &[Arg]) {
        let f = self.function(kernel);
        let mut values: Vec<Vec<u8>> = args.iter().map(|a| a.bytes()).collect();
        let mut ptrs: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        // SAFETY: `ptrs` holds one pointer per kernel parameter, each to that parameter's bytes
        // at its exact size (the workloads pass the kernels' parameters in order), alive for the
        // duration of the call.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    f,
                    blocks,
                    1,
                    1,
                    threads,
                    1,
                    1,
                    0,
                    self.stream,
                    ptrs.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        );
    }

    fn sync(&mut self) {
        // SAFETY: our stream.
        check(
            unsafe { sys::cuStreamSynchronize(self.stream) },
            "cuStreamSynchronize",
        );
    }

    fn htod(&mut self, dst: u64, src: *const u8, bytes: usize) {
        // SAFETY: src is valid for `bytes` until the next sync (the trait's contract).
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, self.stream) },
            "cuMemcpyHtoDAsync",
        );
    }

    fn dtoh(&mut self, dst: *mut u8, src: u64, bytes: usize) {
        // SAFETY: dst is valid for `bytes` until the next sync (the trait's contract).
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, bytes, self.stream) },
            "cuMemcpyDtoHAsync",
        );
    }

    fn begin_capture(&mut self) {
        // Thread-local: the `one-context` mode's other threads keep launching meanwhile.
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: our stream, not capturing.
        check(
            unsafe { sys::cuStreamBeginCapture_v2(self.stream, mode) },
            "cuStreamBeginCapture",
        );
    }

    fn end_capture(&mut self) -> usize {
        let mut graph = std::ptr::null_mut();
        let mut exec = std::ptr::null_mut();
        // SAFETY: our capturing stream; each call writes one handle. The graph is not needed
        // once instantiated.
        unsafe {
            check(
                sys::cuStreamEndCapture(self.stream, &mut graph),
                "cuStreamEndCapture",
            );
            check(
                sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
                "cuGraphInstantiateWithFlags",
            );
            check(sys::cuGraphDestroy(graph), "cuGraphDestroy");
        }
        self.graphs.push(exec);
        self.graphs.len() - 1
    }

    fn launch_graph(&mut self, graph: usize) {
        // SAFETY: an executable graph of ours, into our stream.
        check(
            unsafe { sys::cuGraphLaunch(self.graphs[graph], self.stream) },
            "cuGraphLaunch",
        );
    }
}
