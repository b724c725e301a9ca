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

/// Cubin and fatbin images load and run as well as PTX (built here with nvcc, which a GPU
/// machine with the CUDA toolkit has).
#[test]
fn cuda_loads_cubin_and_fatbin_images() {
    if let Err(why) = mps_server::backend::cuda::probe() {
        println!("skipped: needs a GPU ({why})");
        return;
    }
    let dir = temp_dir("images");
    let source = root().join("kernels/test_kernels.cu");
    let mut images = Vec::new();
    for (kind, flag) in [("cubin", "-cubin"), ("fatbin", "-fatbin")] {
        let out = dir.join(format!("test_kernels.{kind}"));
        let status = std::process::Command::new("nvcc")
            .args([flag, "-arch=sm_90", "-o"])
            .arg(&out)
            .arg(&source)
            .status();
        match status {
            Ok(s) if s.success() => images.push((kind, std::fs::read(&out).unwrap())),
            other => {
                println!("skipped: nvcc could not build a {kind} ({other:?})");
                return;
            }
        }
    }
    let server = TestServer::start_with(&["--backend", "cuda"]);
    let c = server.client();
    for (kind, image) in images {
        let m = c
            .module_load(&image)
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        let fill = c.module_get_function(m, "fill_u32").unwrap();
        let n = 1000u64;
        let p = c.mem_alloc(n * 4).unwrap();
        let one = mpsclient::Dim3 { x: 4, y: 1, z: 1 };
        let block = mpsclient::Dim3 { x: 128, y: 1, z: 1 };
        let value = 0x1234_5678u32;
        c.launch(
            fill,
            one,
            block,
            0,
            mpsclient::Stream::DEFAULT,
            &[&p.0.to_le_bytes(), &value.to_le_bytes(), &n.to_le_bytes()],
        )
        .unwrap();
        let mut out = vec![0u8; (n * 4) as usize];
        c.memcpy_dtoh(&mut out, p, mpsclient::Stream::DEFAULT)
            .unwrap();
        assert!(
            out.chunks(4).all(|w| w == value.to_le_bytes()),
            "{kind}: fill_u32 did not fill"
        );
        c.mem_free(p).unwrap();
        c.module_unload(m).unwrap();
        println!("{kind} image of {} bytes loaded and ran", image.len());
    }
}

/// A launch may ask for more dynamic shared memory than the 48 KiB a block gets by default (up
/// to the device's opt-in limit, which the server checks): the server opts the kernel in at the
/// first launch that needs it. 60 KiB is within the opt-in limit of every device since Volta.
#[test]
fn cuda_launches_get_more_shared_memory_than_the_default() {
    if let Err(why) = mps_server::backend::cuda::probe() {
        println!("skipped: needs a GPU ({why})");
        return;
    }
    let server = TestServer::start_with(&["--backend", "cuda"]);
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let n = 512u64;
    let p = c.mem_alloc(n * 4).unwrap();
    let dim = |x| mpsclient::Dim3 { x, y: 1, z: 1 };
    for (shared, value) in [(0u32, 1u32), (60 << 10, 2), (0, 3), (60 << 10, 4)] {
        let args: [&[u8]; 3] = [&p.0.to_le_bytes(), &value.to_le_bytes(), &n.to_le_bytes()];
        let stream = mpsclient::Stream::DEFAULT;
        c.launch(fill, dim(4), dim(128), shared, stream, &args)
            .unwrap_or_else(|e| panic!("a launch with {shared} bytes of shared memory: {e}"));
        let mut out = vec![0u8; (n * 4) as usize];
        c.memcpy_dtoh(&mut out, p, stream)
            .unwrap_or_else(|e| panic!("after a launch with {shared} bytes: {e}"));
        assert!(
            out.chunks(4).all(|w| w == value.to_le_bytes()),
            "the launch with {shared} bytes of shared memory did not run"
        );
    }
}
