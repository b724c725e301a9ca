//! The fuzz targets' bodies: each takes bytes as a peer could send them and must never panic,
//! whatever they are; what decodes must encode back to the same. The cargo-fuzz binaries in
//! `fuzz_targets/` call them, and `mps-server/tests/fuzz_targets.rs` includes this file to run
//! them on stable Rust over the corpora and their mutations.

use mps_core::protocol::{Command, Hello, Request, SLOT_BYTES};
use mps_core::ptx::{ImageFormat, parse_entries, parse_entries_within};
use mps_server::backend::Backend;
use mps_server::backend::sim::{SimBackend, SimConfig};

/// The PTX reader: format detection and the entries' parameter layouts.
pub fn ptx(data: &[u8]) {
    let _ = ImageFormat::detect(data);
    if let Ok(entries) = parse_entries(data) {
        for e in &entries {
            // Offsets only grow, and the total is the last one's end.
            assert!(
                e.params
                    .windows(2)
                    .all(|w| w[0].offset + w[0].size <= w[1].offset)
            );
            let _ = e.param_bytes();
        }
        let most = entries.len().saturating_sub(1);
        assert!(entries.is_empty() || parse_entries_within(data, most).is_err());
    }
}

/// The fatbin reader, through the simulator's module loader (the fatbin's parts, their zstd
/// frames, and the PTX in them).
pub fn fatbin(data: &[u8]) {
    static SIM: std::sync::OnceLock<SimBackend> = std::sync::OnceLock::new();
    let sim = SIM.get_or_init(|| {
        SimBackend::new(SimConfig {
            memory_bytes: 1 << 20,
            sm_count: 4,
            fault_scope: Default::default(),
            copy_latency: std::time::Duration::ZERO,
        })
        .expect("a simulator of 1 MiB")
    });
    let _ = sim.module_load(data);
}

/// The hello decoder and its checks, as the server and the daemon apply them.
pub fn hello(data: &[u8]) {
    let Ok(hello) = Hello::decode(data) else {
        return;
    };
    let _ = hello.check_version();
    let _ = hello.check_flags();
    if let Ok(group) = hello.check() {
        assert_eq!(hello.group().unwrap(), group);
    }
    let _ = hello.asks_device_list();
}

/// The command decoder: a command slot and its payload slots.
pub fn command(data: &[u8]) {
    if data.len() < SLOT_BYTES {
        return;
    }
    let cmd: Command = bytemuck::pod_read_unaligned(&data[..SLOT_BYTES]);
    let payload = &data[SLOT_BYTES..];
    let Ok(req) = Request::decode(&cmd, payload) else {
        return;
    };
    let (again, bytes) = req.encode(cmd.seq, cmd.stream, cmd.flags);
    let mut padded = bytes.to_vec();
    padded.resize(bytes.len().div_ceil(SLOT_BYTES) * SLOT_BYTES, 0);
    assert_eq!(Request::decode(&again, &padded).unwrap(), req);
}
