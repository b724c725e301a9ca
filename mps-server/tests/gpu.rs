//! Backend selection. The GPU half runs where a CUDA device exists and says it was skipped
//! elsewhere; the simulator half the other way round.

mod common;

use common::*;
use mpsclient::BackendKind;

#[test]
fn auto_serves_the_gpu_where_there_is_one() {
    if let Err(why) = mps_server::backend::cuda::probe() {
        println!("skipped: needs a GPU ({why})");
        return;
    }
    let server = TestServer::start_with(&["--backend", "auto"]);
    let c = server.client();
    let info = c.device_info();
    assert_eq!(info.backend, BackendKind::Cuda, "{info:?}");
    assert!(info.sm_count > 0 && info.total_mem > 0, "{info:?}");
    server.wait_for_log("backend: CUDA device 0");
    println!("served {info:?}");
}

#[test]
fn auto_falls_back_to_the_simulator_without_a_gpu() {
    if mps_server::backend::cuda::probe().is_ok() {
        println!("skipped: this machine has a GPU");
        return;
    }
    let server = TestServer::start_with(&["--backend", "auto"]);
    assert_eq!(server.client().device_info().backend, BackendKind::Sim);
    server.wait_for_log("no usable GPU");
}

#[test]
fn asking_for_cuda_without_a_gpu_fails_with_the_reason() {
    if mps_server::backend::cuda::probe().is_ok() {
        println!("skipped: this machine has a GPU");
        return;
    }
    let dir = temp_dir("nocuda");
    let out = std::process::Command::new(server_bin())
        .args(["--backend", "cuda", "--pipe-dir"])
        .arg(&dir)
        .arg("--log-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("libcuda.so was not found") || err.contains("CUDA"),
        "{err}"
    );
}
