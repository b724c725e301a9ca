//! The mps competitor: a client process of an mps server.

use mpsclient::{Client, Dim3, Function, Stream};

use crate::workload::Gpu;

pub(crate) struct ViaMps {
    client: Client,
    functions: Vec<(String, Function)>,
}

impl ViaMps {
    pub(crate) fn new(ptx: &[u8]) -> ViaMps {
        let client = Client::connect(None).expect("connect to the mps server");
        let module = client.module_load(ptx).expect("module load");
        let functions = ["spin_ns", "fill_u32"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    client.module_get_function(module, n).unwrap(),
                )
            })
            .collect();
        ViaMps { client, functions }
    }
}

impl Gpu for ViaMps {
    fn alloc(&mut self, bytes: usize) -> u64 {
        let p = self.client.mem_alloc(bytes as u64).unwrap();
        self.client
            .memset_d32(p, 0, bytes as u64 / 4, Stream::DEFAULT)
            .unwrap();
        p.0
    }

    fn host_alloc(&mut self, bytes: usize) -> *mut u8 {
        self.client.host_alloc(bytes).unwrap()
    }

    fn launch(&mut self, kernel: &str, blocks: u32, threads: u32, args: &[u64]) {
        let f = self.functions.iter().find(|(n, _)| n == kernel).unwrap().1;
        let bytes: Vec<[u8; 8]> = args.iter().map(|a| a.to_le_bytes()).collect();
        let refs: Vec<&[u8]> = bytes.iter().map(|b| &b[..]).collect();
        let d = |x| Dim3 { x, y: 1, z: 1 };
        self.client
            .launch(f, d(blocks), d(threads), 0, Stream::DEFAULT, &refs)
            .unwrap();
    }

    fn sync(&mut self) {
        self.client.stream_synchronize(Stream::DEFAULT).unwrap();
    }

    fn htod(&mut self, dst: u64, src: *const u8, bytes: usize) {
        // SAFETY: src is valid for `bytes` (a host buffer or a Vec of the bench).
        unsafe {
            self.client
                .memcpy_htod_raw(mpsclient::DevicePtr(dst), src, bytes, Stream::DEFAULT)
        }
        .unwrap();
        self.sync();
    }

    fn dtoh(&mut self, dst: *mut u8, src: u64, bytes: usize) {
        // SAFETY: dst is valid for `bytes`.
        unsafe {
            self.client
                .memcpy_dtoh_raw(dst, mpsclient::DevicePtr(src), bytes, Stream::DEFAULT)
        }
        .unwrap();
        self.sync();
    }
}
