//! The workloads, written once against a [`Gpu`] that is either a native CUDA context or an mps
//! client. Each prints one `result key=value ...` line.

use std::io::BufRead;
use std::time::Instant;

/// What a workload needs from a GPU.
pub(crate) trait Gpu {
    fn alloc(&mut self, bytes: usize) -> u64;
    fn host_alloc(&mut self, bytes: usize) -> *mut u8;
    fn launch(&mut self, kernel: &str, blocks: u32, threads: u32, args: &[u64]);
    fn sync(&mut self);
    fn htod(&mut self, dst: u64, src: *const u8, bytes: usize);
    fn dtoh(&mut self, dst: *mut u8, src: u64, bytes: usize);
}

/// Blocks until the parent says go (every client starts together).
pub(crate) fn wait_for_go() {
    println!("ready");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
}

/// Spin kernels, `launches` of them, synchronising every `sync_every`; `go` returns when the
/// clock may start.
fn spins(
    gpu: &mut dyn Gpu,
    go: &dyn Fn(),
    launches: u32,
    blocks: u32,
    threads: u32,
    ns: u64,
    sync_every: u32,
) {
    let counter = gpu.alloc(4);
    // Warm up (module load, first-launch costs) before the clock starts.
    for _ in 0..10 {
        gpu.launch("spin_ns", blocks, threads, &[0, counter]);
    }
    gpu.sync();
    go();
    let t = Instant::now();
    for i in 1..=launches {
        gpu.launch("spin_ns", blocks, threads, &[ns, counter]);
        if i % sync_every == 0 {
            gpu.sync();
        }
    }
    gpu.sync();
    println!(
        "result elapsed_s={} kernels={launches}",
        t.elapsed().as_secs_f64()
    );
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

/// Runs `workload` and prints its result line; `go` returns when the clock may start (when the
/// parent says so, for a worker process of its own).
pub(crate) fn run(gpu: &mut dyn Gpu, workload: &str, go: &dyn Fn()) {
    match workload {
        "spin" => spins(gpu, go, 2000, 4, 128, 20_000, 10),
        "tiny" => spins(gpu, go, 5000, 1, 32, 2_000, 50),
        // As wide as an H200 takes in one wave (two blocks of 1024 threads per SM): its
        // throughput follows the SMs the client may use.
        "wide" => spins(gpu, go, 200, 264, 1024, 500_000, 10),
        // Keeps every SM it can reach busy until told to stop.
        "greedy" => {
            let counter = gpu.alloc(4);
            gpu.launch("spin_ns", 264, 1024, &[0, counter]);
            gpu.sync();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            go();
            let flag = stop.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = std::io::stdin().lock().read_line(&mut line);
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let t = Instant::now();
            let mut launches = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..4 {
                    gpu.launch("spin_ns", 264, 1024, &[1_000_000, counter]);
                }
                gpu.sync();
                launches += 4;
            }
            println!(
                "result elapsed_s={} kernels={launches}",
                t.elapsed().as_secs_f64()
            );
        }
        "rtt" | "rtt-short" => {
            let samples = if workload == "rtt" { 5000 } else { 2000 };
            let counter = gpu.alloc(4);
            for _ in 0..200 {
                gpu.launch("spin_ns", 1, 32, &[0, counter]);
                gpu.sync();
            }
            go();
            let mut us = Vec::with_capacity(samples);
            for _ in 0..samples {
                let t = Instant::now();
                gpu.launch("spin_ns", 1, 32, &[0, counter]);
                gpu.sync();
                us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            us.sort_by(f64::total_cmp);
            println!(
                "result median_us={} p99_us={}",
                percentile(&us, 0.5),
                percentile(&us, 0.99)
            );
        }
        "launch-rate" => {
            let counter = gpu.alloc(4);
            for _ in 0..1000 {
                gpu.launch("spin_ns", 1, 32, &[0, counter]);
            }
            gpu.sync();
            go();
            let n = 100_000;
            let t = Instant::now();
            for _ in 0..n {
                gpu.launch("spin_ns", 1, 32, &[0, counter]);
            }
            let submit = t.elapsed().as_secs_f64();
            gpu.sync();
            let total = t.elapsed().as_secs_f64();
            println!(
                "result launches_per_s={} with_sync_per_s={}",
                n as f64 / submit,
                n as f64 / total
            );
        }
        "copy" => {
            let bytes = 256usize << 20;
            let dev = gpu.alloc(bytes);
            let pinned = gpu.host_alloc(bytes);
            let mut pageable = vec![1u8; bytes];
            // SAFETY: pinned is `bytes` long; touch it so both sources are resident.
            unsafe { std::ptr::write_bytes(pinned, 1, bytes) };
            go();
            let best = |f: &mut dyn FnMut()| {
                (0..3)
                    .map(|_| {
                        let t = Instant::now();
                        f();
                        bytes as f64 / t.elapsed().as_secs_f64() / 1e9
                    })
                    .fold(0.0, f64::max)
            };
            let h2d_pinned = best(&mut || gpu.htod(dev, pinned, bytes));
            let d2h_pinned = best(&mut || gpu.dtoh(pinned, dev, bytes));
            let pp = pageable.as_mut_ptr();
            let h2d_pageable = best(&mut || gpu.htod(dev, pp, bytes));
            let d2h_pageable = best(&mut || gpu.dtoh(pp, dev, bytes));
            println!(
                "result h2d_pinned_gbs={h2d_pinned} d2h_pinned_gbs={d2h_pinned} \
                 h2d_pageable_gbs={h2d_pageable} d2h_pageable_gbs={d2h_pageable}"
            );
        }
        "idle" => {
            let _ = gpu.alloc(4);
            gpu.sync();
            go();
            println!("result idle=1");
        }
        other => panic!("unknown workload {other}"),
    }
}
