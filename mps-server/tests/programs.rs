//! Programs as users write them, run against a real server: the C API test, the C example and
//! the C++ example (include/mps.hpp), built with `-Wall -Wextra -Werror` against include/ and the
//! library this build produced, and the Rust example. Where `MPS_PREBUILT_DIR` names a directory
//! with `libmpsclient.so` and the Rust example `vector_add` (as `scripts/test-gpu build` leaves
//! them), those are used and cargo is not needed.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// The directory of prebuilt libraries and programs, if the tests are to use those.
fn prebuilt() -> Option<std::path::PathBuf> {
    std::env::var_os("MPS_PREBUILT_DIR").map(std::path::PathBuf::from)
}

/// Builds libmpsclient.so (cargo builds a dependency's cdylib only when the package itself is
/// being built, so `cargo test -p mps-server` alone would otherwise link a stale one), or takes
/// the prebuilt one, and lays it out as an installation does: `libmpsclient.so.0` (its soname)
/// and the `libmpsclient.so` link the linker looks for. Returns that directory.
fn library_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let built = prebuilt().map_or_else(build_library, |d| d.join("libmpsclient.so"));
        assert!(built.exists(), "{} not found", built.display());
        let dir = temp_dir("lib");
        std::fs::copy(&built, dir.join("libmpsclient.so.0")).unwrap();
        std::os::unix::fs::symlink("libmpsclient.so.0", dir.join("libmpsclient.so")).unwrap();
        dir
    })
}

/// Builds libmpsclient.so with cargo; returns its path.
fn build_library() -> std::path::PathBuf {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-p", "mps-client-c", "--lib"]);
    if target_dir().ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd.current_dir(root()).status().expect("run cargo");
    assert!(status.success(), "building libmpsclient failed");
    target_dir().join("libmpsclient.so")
}

/// Compiles `source` into `out` with `compiler` and `std` (C or C++), linking libmpsclient from
/// this build.
fn build_with(compiler: &str, std: &str, source: &Path, out: &Path) {
    let lib_dir = library_dir();
    let cc = compiler;
    let status = Command::new(cc)
        .args([std, "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(root().join("include"))
        .arg(source)
        .arg("-o")
        .arg(out)
        .arg("-L")
        .arg(lib_dir)
        .arg("-lmpsclient")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
}

fn build_c(source: &Path, out: &Path) {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    build_with(&cc, "-std=c11", source, out);
}

fn run_program(program: &Path, server: &TestServer) -> String {
    run_program_with(program, server, &[])
}

/// [`run_program`] with more environment.
fn run_program_with(program: &Path, server: &TestServer, env: &[(&str, &str)]) -> String {
    let out = Command::new(program)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &server.dir)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{} failed:\n{stdout}\n{}\nserver log:\n{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    stdout
}

#[test]
fn the_c_api_test_passes() {
    let dir = temp_dir("c");
    let exe = dir.join("api_test");
    build_c(&root().join("mps-server/tests/c/api_test.c"), &exe);
    let server = TestServer::start();
    let out = run_program(&exe, &server);
    assert!(out.contains("all checks passed"), "{out}");
    // Again with a lower SM share, which mps_sm_get_info must report.
    let out = run_program_with(&exe, &server, &[("MPS_ACTIVE_THREAD_PERCENTAGE", "25")]);
    assert!(out.contains("all checks passed"), "{out}");
    let info = server.client().device_info().sm_count;
    assert!(
        !out.contains(&format!("api_test: {info} of {info} SMs")),
        "{out}"
    );
}

#[test]
fn the_c_example_builds_and_runs() {
    let dir = temp_dir("c-example");
    let exe = dir.join("vector_add");
    build_c(&root().join("examples/c/vector_add.c"), &exe);
    let server = TestServer::start();
    let out = run_program(&exe, &server);
    assert!(out.contains("elements correct"), "{out}");
}

#[test]
fn the_rust_example_builds_and_runs() {
    let program = match prebuilt() {
        Some(dir) => dir.join("vector_add"),
        None => {
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "-p", "mps-client", "--example", "vector_add"]);
            if target_dir().ends_with("release") {
                cmd.arg("--release");
            }
            assert!(cmd.current_dir(root()).status().unwrap().success());
            target_dir().join("examples/vector_add")
        }
    };
    let server = TestServer::start();
    let out = run_program(&program, &server);
    assert!(out.contains("elements correct"), "{out}");
}

#[test]
fn the_cpp_example_builds_and_runs() {
    let dir = temp_dir("cpp-example");
    let exe = dir.join("vector_add_cpp");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    build_with(
        &cxx,
        "-std=c++17",
        &root().join("examples/cpp/vector_add.cpp"),
        &exe,
    );
    let server = TestServer::start();
    let out = run_program(&exe, &server);
    assert!(out.contains("(C++): 1048576 elements correct"), "{out}");
}
