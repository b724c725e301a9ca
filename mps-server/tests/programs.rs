//! Programs as users write them, run against a real server: the C API test, the C example and
//! the C++ example (include/mps.hpp), built with `-Wall -Wextra -Werror` against include/ and the
//! library this build produced, and the Rust example. Where `MPS_PREBUILT_DIR` names a directory
//! with `libmpsclient.so` and the Rust example `vector_add` (as `scripts/test-gpu build` leaves
//! them), those are used and cargo is not needed.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

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
