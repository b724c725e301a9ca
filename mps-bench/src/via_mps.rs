//! The mps competitor: a client process of an mps server.
//!
//! Like the native workers it launches into a stream it created (`mps_stream_create`, a
//! non-blocking CUDA stream in the server) rather than its default stream: the stream a client
//! that shares a device creates for its work (an inference server's per-model stream, a
//! framework's side stream), the only kind the `one-context` mode's threads can use without
//! serialising on each other, and so the same kind of stream in every mode.

use mps_client::{Client, DevicePtr, Dim3, Function, GraphExec, Stream};

use crate::native::KERNELS;
use crate::workload::{Arg, Gpu};

pub(crate) struct ViaMps {
    client: Client,
    stream: Stream,
    functions: Vec<(String, Function)>,
    graphs: Vec<GraphExec>,
}

impl ViaMps {
    pub(crate) fn new(ptx: &[u8]) -> ViaMps {
        let client = Client::connect(None).expect("connect to the mps server");
        let module = client.module_load(ptx).expect("module load");
        let functions = KERNELS
            .iter()
            .map(|n| {
                let f = client.module_get_function(module, n);
                (
                    n.to_string(),
                    f.unwrap_or_else(|e| panic!("kernel {n}: {e}")),
                )
            })
            .collect();
        let stream = client.stream_create(0).expect("create a stream");
        ViaMps {
            client,
            stream,
            functions,
            graphs: Vec::new(),
        }
    }
}

impl Gpu for ViaMps {
    fn alloc(&mut self, bytes: usize) -> u64 {
        let p = self.client.mem_alloc(bytes as u64).unwrap();
        self.client
            .memset_d32(p, 0, bytes as u64 / 4, self.stream)
            .unwrap();
        p.0
    }

    fn host_alloc(&mut self, bytes: usize) -> *mut u8 {
        self.client.host_alloc(bytes).unwrap()
    }

    fn launch(&mut self, kernel: &str, blocks: u32, threads: u32, args: &[Arg]) {
        let f = self.functions.iter().find(|(n, _)| n == kernel).unwrap().1;
        let bytes: Vec<Vec<u8>> = args.iter().map(|a| a.bytes()).collect();
        let refs: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
        let d = |x| Dim3 { x, y: 1, z: 1 };
        self.client
            .launch(f, d(blocks), d(threads), 0, self.stream, &refs)
            .unwrap_or_else(|e| panic!("launch {kernel}: {e}"));
    }

    fn sync(&mut self) {
        self.client.stream_synchronize(self.stream).unwrap();
    }

    fn htod(&mut self, dst: u64, src: *const u8, bytes: usize) {
        // SAFETY: src is valid for `bytes` until the next sync (the trait's contract).
        unsafe {
            self.client
                .memcpy_htod_raw(DevicePtr(dst), src, bytes, self.stream)
        }
        .unwrap();
    }

    fn dtoh(&mut self, dst: *mut u8, src: u64, bytes: usize) {
        // SAFETY: dst is valid for `bytes` until the next sync (the trait's contract).
        unsafe {
            self.client
                .memcpy_dtoh_raw(dst, DevicePtr(src), bytes, self.stream)
        }
        .unwrap();
    }

    fn begin_capture(&mut self) {
        self.client.stream_begin_capture(self.stream).unwrap();
    }

    fn end_capture(&mut self) -> usize {
        let graph = self.client.stream_end_capture(self.stream).unwrap();
        let exec = self.client.graph_instantiate(graph).unwrap();
        self.client.graph_destroy(graph).unwrap();
        self.graphs.push(exec);
        self.graphs.len() - 1
    }

    fn launch_graph(&mut self, graph: usize) {
        self.client
            .graph_launch(self.graphs[graph], self.stream)
            .unwrap_or_else(|e| panic!("graph launch: {e}"));
    }
}
