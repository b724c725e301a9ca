//! vector_add: the smallest complete mps client in Rust.
//!
//! With a server running: `cargo run -p mps-client --example vector_add [kernels/test_kernels.ptx]`

use mps_client::{Client, Dim3, Stream};

fn main() -> Result<(), mps_client::Error> {
    let ptx_path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "kernels/test_kernels.ptx".into());
    let image = std::fs::read(&ptx_path)
        .map_err(|e| mps_client::Error::invalid_value(format!("cannot read {ptx_path}: {e}")))?;

    // $MPS_PIPE_DIRECTORY, else /tmp/mps.
    let client = Client::connect(None)?;
    let dev = client.device_info();
    println!(
        "device: {} ({} SMs, {:?} backend)",
        dev.name, dev.sm_count, dev.backend
    );

    let module = client.module_load(&image)?;
    let add = client.module_get_function(module, "add_f32")?;

    let n = 1usize << 20;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let bytes = (n * 4) as u64;
    let stream = client.stream_create(0)?;
    let (da, db, dout) = (
        client.mem_alloc(bytes)?,
        client.mem_alloc(bytes)?,
        client.mem_alloc(bytes)?,
    );
    client.memcpy_htod(da, bytemuck::cast_slice(&a), stream)?;
    client.memcpy_htod(db, bytemuck::cast_slice(&b), stream)?;
    let n64 = n as u64;
    client.launch(
        add,
        Dim3 { x: 256, y: 1, z: 1 },
        Dim3 { x: 256, y: 1, z: 1 },
        0,
        stream,
        &[
            &da.0.to_le_bytes(),
            &db.0.to_le_bytes(),
            &dout.0.to_le_bytes(),
            &n64.to_le_bytes(),
        ],
    )?;
    let mut out = vec![0f32; n];
    client.memcpy_dtoh(bytemuck::cast_slice_mut(&mut out), dout, stream)?;
    if let Some(i) = (0..n).find(|&i| out[i] != 3.0 * i as f32) {
        eprintln!("out[{i}] = {}, expected {}", out[i], 3.0 * i as f32);
        std::process::exit(1);
    }
    println!("vector_add: {n} elements correct");
    for p in [da, db, dout] {
        client.mem_free(p)?;
    }
    client.stream_synchronize(Stream::DEFAULT)?;
    Ok(())
}
