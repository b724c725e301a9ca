//! Backend selection and module images. The GPU half runs where a CUDA device exists and says
//! it was skipped elsewhere (see `common::skip`); the simulator half the other way round.

mod common;

use common::*;
use mpsclient::BackendKind;

#[test]
fn auto_serves_the_gpu_where_there_is_one() {
    if let Err(why) = mps_server::backend::cuda::probe() {
        skip(
            "auto_serves_the_gpu_where_there_is_one",
            &format!("needs a GPU ({why})"),
        );
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
        skip(
            "auto_falls_back_to_the_simulator_without_a_gpu",
            "this machine has a GPU",
        );
        return;
    }
    let server = TestServer::start_with(&["--backend", "auto"]);
    assert_eq!(server.client().device_info().backend, BackendKind::Sim);
    server.wait_for_log("no usable GPU");
}

#[test]
fn asking_for_cuda_without_a_gpu_fails_with_the_reason() {
    let Err(why) = mps_server::backend::cuda::probe() else {
        skip(
            "asking_for_cuda_without_a_gpu_fails_with_the_reason",
            "this machine has a GPU",
        );
        return;
    };
    let dir = temp_dir("nocuda");
    let out = std::process::Command::new(server_bin())
        .args(["--backend", "cuda", "--pipe-dir"])
        .arg(&dir)
        .arg("--log-dir")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    // The server gives the reason the probe found (no driver, no device, cuInit's error).
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&why),
        "the server's error does not say {why:?}:\n{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Loads `image` (a module of the test kernels) into a CUDA server and checks that its
/// `fill_u32` fills.
fn load_and_fill(kind: &str, image: &[u8]) {
    let server = TestServer::start_with(&["--backend", "cuda"]);
    let c = server.client();
    let m = c
        .module_load(image)
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let n = 1000u64;
    let p = c.mem_alloc(n * 4).unwrap();
    let grid = mpsclient::Dim3 { x: 4, y: 1, z: 1 };
    let block = mpsclient::Dim3 { x: 128, y: 1, z: 1 };
    let value = 0x1234_5678u32;
    c.launch(
        fill,
        grid,
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

/// Builds the test kernels as `kind` (cubin or fatbin) with nvcc, if the machine has it.
fn nvcc_image(kind: &str) -> Result<Vec<u8>, String> {
    let dir = temp_dir("images");
    let out = dir.join(format!("test_kernels.{kind}"));
    let status = std::process::Command::new("nvcc")
        .arg(format!("-{kind}"))
        .args(["-arch=sm_90", "-o"])
        .arg(&out)
        .arg(root().join("kernels/test_kernels.cu"))
        .status()
        .map_err(|e| format!("cannot run nvcc: {e}"))?;
    if !status.success() {
        return Err(format!("nvcc -{kind} failed ({status})"));
    }
    let image = std::fs::read(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(image)
}

/// A cubin of the checked-in PTX for device 0, from the driver's own linker (no toolkit
/// needed).
fn driver_cubin() -> Result<Vec<u8>, String> {
    use cudarc::driver::sys::{self, CUresult};
    use std::ffi::c_void;
    let check = |r: CUresult, what: &str| {
        if r == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(format!("{what} failed: {r:?}"))
        }
    };
    let mut ptx = ptx();
    ptx.push(0);
    // SAFETY: probe() found the driver, so cudarc resolves these symbols; every pointer handed
    // to the driver is to a live local of the type it expects; the linker's output is copied
    // out before cuLinkDestroy frees it.
    unsafe {
        check(sys::cuInit(0), "cuInit")?;
        let mut dev = 0;
        check(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet")?;
        let mut ctx = std::ptr::null_mut();
        check(
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            "cuDevicePrimaryCtxRetain",
        )?;
        check(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
        let mut link = std::ptr::null_mut();
        check(
            sys::cuLinkCreate_v2(0, std::ptr::null_mut(), std::ptr::null_mut(), &mut link),
            "cuLinkCreate",
        )?;
        let linked = check(
            sys::cuLinkAddData_v2(
                link,
                sys::CUjitInputType::CU_JIT_INPUT_PTX,
                ptx.as_mut_ptr() as *mut c_void,
                ptx.len(),
                c"test_kernels.ptx".as_ptr(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ),
            "cuLinkAddData",
        )
        .and_then(|()| {
            let (mut cubin, mut size) = (std::ptr::null_mut(), 0usize);
            check(
                sys::cuLinkComplete(link, &mut cubin, &mut size),
                "cuLinkComplete",
            )?;
            Ok(std::slice::from_raw_parts(cubin as *const u8, size).to_vec())
        });
        sys::cuLinkDestroy(link);
        sys::cuDevicePrimaryCtxRelease_v2(dev);
        linked
    }
}

/// A cubin loads and runs as well as PTX. It comes from nvcc where the machine has the CUDA
/// toolkit, else from the driver's linker, so a GPU machine without nvcc runs this test too.
#[test]
fn cuda_loads_cubin_images() {
    if let Err(why) = mps_server::backend::cuda::probe() {
        skip("cuda_loads_cubin_images", &format!("needs a GPU ({why})"));
        return;
    }
    let image = nvcc_image("cubin").or_else(|nvcc| {
        println!("{nvcc}; the driver's linker makes the cubin");
        driver_cubin()
    });
    load_and_fill("cubin", &image.expect("a cubin of the test kernels"));
}

/// A fatbin loads and runs as well as PTX (only nvcc makes one).
#[test]
fn cuda_loads_fatbin_images() {
    const TEST: &str = "cuda_loads_fatbin_images";
    if let Err(why) = mps_server::backend::cuda::probe() {
        skip(TEST, &format!("needs a GPU ({why})"));
        return;
    }
    match nvcc_image("fatbin") {
        Ok(image) => load_and_fill("fatbin", &image),
        Err(why) => skip(TEST, &format!("needs nvcc, to build a fatbin: {why}")),
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
