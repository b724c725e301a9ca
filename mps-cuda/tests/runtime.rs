//! Runtime-API programs (`tests/cu/*.cu`), compiled by nvcc twice, with cudart static (nvcc's
//! default) and with `-cudart shared`, run unmodified through `mps-run` against a server (the
//! simulator; `MPS_TEST_BACKEND=cuda` for a GPU). Each program checks its own results with
//! CUDA's semantics and prints lines that are the same natively; the test also checks those.
//!
//! nvcc comes from `$MPS_TEST_NVCC` (a CUDA toolkit's `bin/nvcc`, its cudart in `../lib64`) or
//! from NVIDIA's PyPI wheels in `.cuda-wheels/` (installed by `scripts/cuda-wheels`). Without
//! either, each test is skipped (`common::skip`: said on stderr and in `$MPS_TEST_SKIP_LOG`),
//! and fails instead under CI.
//!
//! The kernels are the simulator's (kernels/test_kernels.cu's names and bodies), compiled for
//! sm_90 with their PTX kept (compressed, nvcc's default), which is what the simulator runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Daemon, Server, backend, built, crate_dir, root, temp_dir};

/// What a program runs against: a server, or a control daemon.
trait Against {
    fn pipe_dir(&self) -> &Path;
    fn log(&self) -> String;
}

impl Against for Server {
    fn pipe_dir(&self) -> &Path {
        &self.dir
    }
    fn log(&self) -> String {
        Server::log(self)
    }
}

impl Against for Daemon {
    fn pipe_dir(&self) -> &Path {
        &self.dir
    }
    fn log(&self) -> String {
        Daemon::log(self)
    }
}

/// A compiler: nvcc, and the directory of its cudart.
struct Nvcc {
    nvcc: PathBuf,
    cudart: PathBuf,
}

fn nvcc() -> Option<Nvcc> {
    if let Some(n) = std::env::var_os("MPS_TEST_NVCC") {
        let nvcc = PathBuf::from(n);
        let cudart = nvcc.parent()?.parent()?.join("lib64");
        return Some(Nvcc { nvcc, cudart });
    }
    let wheels = root().join(".cuda-wheels/nvidia/cu13");
    let nvcc = wheels.join("bin/nvcc");
    nvcc.exists().then(|| Nvcc {
        nvcc,
        cudart: wheels.join("lib"),
    })
}

#[derive(Clone, Copy, Debug)]
enum Cudart {
    Static,
    Shared,
}

/// Compiles `tests/cu/<name>.cu` with cudart linked as `cudart`.
fn build(nv: &Nvcc, name: &str, cudart: Cudart) -> PathBuf {
    let src = crate_dir().join("tests/cu");
    let exe = temp_dir(name).join(format!("{name}-{cudart:?}"));
    let mut cmd = Command::new(&nv.nvcc);
    cmd.arg("-L")
        .arg(&nv.cudart)
        .args(["-gencode", "arch=compute_90,code=[compute_90,sm_90]"])
        .args([
            "-cudart",
            if matches!(cudart, Cudart::Shared) {
                "shared"
            } else {
                "static"
            },
        ])
        .arg(src.join(format!("{name}.cu")))
        .arg("-o")
        .arg(&exe);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {:?}: {e}", nv.nvcc));
    assert!(
        out.status.success(),
        "nvcc failed on {name}.cu:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Builds program `name` both ways and runs each through mps-run against a fresh server; each
/// must exit 0, print "<name>: done", and print every line of `expected`. Says so and does
/// nothing without nvcc.
fn passes(name: &str, env: &[(&str, &str)], expected: &[&str]) {
    passes_against(name, env, expected, &|| Box::new(Server::start()));
}

/// As [`passes`], against what `start` starts for each run.
fn passes_against(
    name: &str,
    env: &[(&str, &str)],
    expected: &[&str],
    start: &dyn Fn() -> Box<dyn Against>,
) {
    let Some(nv) = nvcc() else {
        common::skip(
            name,
            "needs nvcc (run scripts/cuda-wheels, or set MPS_TEST_NVCC to a CUDA toolkit's \
             bin/nvcc)",
        );
        return;
    };
    for cudart in [Cudart::Static, Cudart::Shared] {
        let exe = build(&nv, name, cudart);
        let server = start();
        let out = Command::new(built().join("mps-run"))
            .arg(&exe)
            .env("MPS_PIPE_DIRECTORY", server.pipe_dir())
            // The shared cudart, for `-cudart shared`; mps-run puts its libcuda.so.1 first.
            .env("LD_LIBRARY_PATH", &nv.cudart)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let lines: Vec<&str> = stdout.lines().collect();
        let done = format!("{name}: done");
        let missing: Vec<&str> = expected
            .iter()
            .copied()
            .chain([done.as_str()])
            .filter(|e| !lines.contains(e))
            .collect();
        assert!(
            out.status.success() && missing.is_empty(),
            "{name} ({cudart:?} cudart) failed ({}), missing {missing:?}:\n{stdout}\n{stderr}\n\
             server log:\n{}",
            out.status,
            server.log()
        );
    }
}

#[test]
fn vector_add() {
    passes(
        "vector_add",
        &[],
        &["c[12345] = 37035.0", "65536 elements added"],
    );
}

#[test]
fn streams_events_and_stream_wait_event() {
    passes(
        "streams_events",
        &[],
        &[
            "first half 9, second half 7, spins 1",
            "elapsed at least the 2 ms spin: yes",
        ],
    );
}

#[test]
fn pinned_memory_with_asynchronous_copies() {
    passes("pinned_async", &[], &["y[100] = 201.0, y[16383] = 32767.0"]);
}

#[test]
fn host_functions_and_stream_callbacks_in_stream_order() {
    passes("host_func", &[], &["host functions: 2, in order"]);
}

#[test]
fn memset() {
    passes("memset", &[], &["bytes: ab 11 11 ab"]);
}

#[test]
fn a_struct_parameter_and_many_parameters() {
    passes(
        "params",
        &[],
        &[
            "struct: y[999] = 502.5",
            "many parameters: sum 1103511637992",
        ],
    );
}

#[test]
fn device_to_device_copies() {
    passes("device_copy", &[], &["copied 5eed twice"]);
}

#[test]
fn stream_ordered_allocation_and_copies_by_address() {
    passes(
        "async_alloc",
        &[],
        &[
            "async allocation rounds right: 8 of 8",
            "default pool in use after the frees: 0",
            "cudaMemcpyDefault round trip: same",
            "2D rows right: 16 of 16, gap byte ee",
        ],
    );
}

#[test]
fn device_properties() {
    let mut expected = vec![
        "devices 1, current 0",
        "warp 32, threads per block 1024, block 1024x1024x64, grid 2147483647x65535x65535",
        "shared per block 49152, registers per block 65536",
    ];
    // The simulator's figures (mps-server/src/backend/sim/attributes.rs); a GPU's are its own,
    // which scripts/cuda-runtime-compare compares with what the program prints natively.
    if std::env::var("MPS_TEST_BACKEND").map_or(true, |b| b == "sim") {
        expected.push("clock 1000000 kHz, L2 52428800 bytes, memory bus 4096 bits");
    }
    passes("device_props", &[], &expected);
}

#[test]
fn mem_get_info_under_a_memory_limit() {
    passes(
        "mem_info",
        &[("MPS_PINNED_DEVICE_MEM_LIMIT", "0=256M")],
        &[
            "allocating more than is free: cudaErrorMemoryAllocation",
            "total 256 MiB",
        ],
    );
}

#[test]
fn two_threads_with_streams_of_their_own() {
    passes("threads", &[], &["thread 1 ok, thread 2 ok"]);
}

#[test]
fn legacy_default_stream_ordering() {
    passes(
        "legacy_stream",
        &[],
        &[
            "blocking stream after default stream: 1",
            "default stream after blocking stream: 2",
        ],
    );
}

#[test]
fn an_illegal_address_is_reported_at_the_next_synchronising_call() {
    passes(
        "illegal_address",
        &[],
        &[
            "launch: cudaSuccess",
            "synchronize: cudaErrorIllegalAddress (an illegal memory access was encountered)",
        ],
    );
}

#[test]
fn several_devices_with_cuda_set_device() {
    let test = "several_devices_with_cuda_set_device";
    let count = Daemon::start().device_count();
    if count < 2 {
        common::skip(
            test,
            &format!("it needs two devices, the daemon serves {count}"),
        );
        return;
    }
    let mut expected = vec![
        "devices 2",
        "device 0: y[1000] = 1000.0",
        "device 1: y[1000] = 2000.0",
        "peer copy: x[1000] = 2000.0",
    ];
    // Each device's name is its own server's report: the simulator names them by ordinal.
    if backend() == "sim" {
        expected.extend([
            "device 0: mps simulator 0, cc 9.0",
            "device 1: mps simulator 1, cc 9.0",
        ]);
    }
    passes_against(
        "multi_device",
        &[],
        &expected,
        &|| Box::new(Daemon::start()),
    );
}

#[test]
fn graphs_built_node_by_node_launch_and_update() {
    passes(
        "graph_nodes",
        &[],
        &[
            "built nodes: 7",
            "2 launches: y[4095] = 20380.0",
            "after the update: y[4095] = 30475.0",
        ],
    );
}

#[test]
fn stream_capture_and_graph_launches_with_new_input() {
    passes(
        "graph",
        &[],
        &[
            "captured nodes: 5",
            "4 graph launches: y[4095] = 21285.0",
            "capture on the legacy stream: cudaErrorStreamCaptureUnsupported",
            "end without a capture: cudaErrorIllegalState",
            "synchronise while capturing: cudaErrorStreamCaptureUnsupported",
            "end after it: cudaErrorStreamCaptureInvalidated, graph none",
            "cudaMalloc during a global capture: cudaErrorStreamCaptureUnsupported",
            "end after it: cudaErrorStreamCaptureInvalidated",
            "cudaMalloc in relaxed mode during a capture: cudaSuccess",
        ],
    );
}
