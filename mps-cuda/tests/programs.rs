//! Driver-API programs in C, built with `-Wall -Wextra -Werror` against nothing but this
//! library (`-lcuda`, or `dlopen("libcuda.so.1")`), run through `mps-run` against a real server
//! (the simulator; `MPS_TEST_BACKEND=cuda` for a GPU). Each prints "all checks passed" when
//! every CUDA result and every value it checks is what CUDA documents; natively (NVIDIA's
//! driver, scripts/cuda-runtime-compare) each prints the same. Checks of what CUDA leaves
//! undefined or of mps's own refusals and limits run only with `MPS_ONLY=1`, as here; programs
//! that check nothing else (`requires_mps`) are not run natively.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::{Server, built, crate_dir, root, temp_dir};

/// A directory holding `libcuda.so`, a link to this build's library, for the linker's `-lcuda`
/// (the program records the library's soname, `libcuda.so.1`, as NVIDIA's does).
fn link_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("link");
        std::os::unix::fs::symlink(built().join("libmpscuda.so"), dir.join("libcuda.so")).unwrap();
        dir
    })
}

/// Compiles `tests/c/<name>.c`, linked with `-lcuda` against this build's library.
fn build(name: &str) -> PathBuf {
    let src = crate_dir().join("tests/c");
    let exe = temp_dir(name).join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread"])
        .arg("-I")
        .arg(&src)
        .arg(src.join(format!("{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(link_dir())
        .args(["-lcuda", "-ldl"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(status.success(), "compiling {name}.c failed");
    exe
}

/// Runs `exe` through mps-run against `server`, with `env` added, and with the checks that
/// hold only through mps turned on (`MPS_ONLY=1`, see `mps_only()` in tests/c/cuda_api.h).
fn run(exe: &Path, server: &Server, env: &[(&str, &str)]) -> Output {
    Command::new(built().join("mps-run"))
        .arg(exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &server.dir)
        .env("MPS_ONLY", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Runs program `name`; it must pass every check. Returns its stdout and stderr.
fn passes(name: &str, env: &[(&str, &str)]) -> (String, String) {
    let exe = build(name);
    let server = Server::start();
    let out = run(&exe, &server, env);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{name} failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log()
    );
    (stdout, stderr)
}

#[test]
fn vector_add_with_modules_libraries_and_both_ways_of_passing_parameters() {
    passes("vector_add", &[]);
}

#[test]
fn mps_run_makes_the_program_load_this_library() {
    // Only this library knows of mps servers: with none in the pipe directory, the program's
    // cuInit fails with this library's message, whatever other libcuda.so.1 the machine has.
    let exe = build("vector_add");
    let empty = temp_dir("no-server");
    let out = Command::new(built().join("mps-run"))
        .arg(&exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("mps-cuda: no device: cannot reach an mps server"),
        "{stderr}"
    );
    assert!(stderr.contains("cuInit(0) returned 100"), "{stderr}");
}

#[test]
fn streams_events_and_the_legacy_default_stream() {
    passes("streams_events", &[]);
}

#[test]
fn pinned_host_memory_with_async_copies_and_memsets() {
    passes("pinned_memset", &[]);
}

#[test]
fn mem_get_info_reports_the_client_memory_limit() {
    passes("mem_limit", &[("MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M")]);
}

#[test]
fn threads_have_their_own_current_context_and_streams() {
    passes("threads", &[]);
}

#[test]
fn proc_addresses_by_version_and_unsupported_functions_refused_once() {
    let (_, stderr) = passes("proc_unsupported", &[]);
    let said = stderr
        .lines()
        .filter(|l| l.contains("cuGraphCreate is not supported through mps"))
        .count();
    assert_eq!(said, 1, "{stderr}");
    assert!(
        stderr.contains("cuGetExportTable(1734dc26800d47458726c0f1e7dd8bca) is not supported"),
        "{stderr}"
    );
}

#[test]
fn the_export_tables_behave_as_the_runtime_expects() {
    passes("export_tables", &[]);
}

#[test]
fn a_kernel_fault_surfaces_at_the_next_synchronising_call() {
    passes("async_error", &[]);
}

#[test]
fn stream_capture_makes_graphs_that_replay_with_new_data_and_keeps_cudas_rules() {
    let (stdout, stderr) = passes("graph_capture", &[]);
    // y = 3x for the last round's x[4095] = 4095 + 3000: the fourth launch read new input.
    assert!(
        stdout.contains("4 graph launches: y[4095] = 21285.0"),
        "{stdout}"
    );
    // What mps cannot capture is said once each, by name.
    for what in ["an event record", "a copy through pageable memory"] {
        let said = stderr
            .lines()
            .filter(|l| l.contains(what) && l.contains("is not supported through mps"))
            .count();
        assert_eq!(said, 1, "{what}: {stderr}");
    }
}
