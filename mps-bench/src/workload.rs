//! The workloads, written once against a [`Gpu`] that is either a native CUDA context or an mps
//! client. Each prints one `result {json}` line: a [`Report`].

use std::collections::BTreeMap;
use std::io::BufRead;
use std::time::Instant;

use crate::start::now_s;

/// One kernel parameter, passed with its exact size.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg {
    U64(u64),
    F32(f32),
}

impl Arg {
    /// The parameter's bytes, as the kernel reads them.
    pub(crate) fn bytes(self) -> Vec<u8> {
        match self {
            Arg::U64(v) => v.to_le_bytes().to_vec(),
            Arg::F32(v) => v.to_le_bytes().to_vec(),
        }
    }
}

/// What a workload needs from a GPU: everything is issued into the client's one stream, and
/// only `sync` waits for it.
pub(crate) trait Gpu {
    fn alloc(&mut self, bytes: usize) -> u64;
    fn host_alloc(&mut self, bytes: usize) -> *mut u8;
    fn launch(&mut self, kernel: &str, blocks: u32, threads: u32, args: &[Arg]);
    fn sync(&mut self);
    /// Copies `bytes` from `src` (valid until the next `sync`) to `dst`, asynchronously.
    fn htod(&mut self, dst: u64, src: *const u8, bytes: usize);
    /// Copies `bytes` from `src` to `dst` (valid until the next `sync`), asynchronously.
    fn dtoh(&mut self, dst: *mut u8, src: u64, bytes: usize);
    /// Records what is issued from now on into a graph instead of running it.
    fn begin_capture(&mut self);
    /// Ends the recording; returns its executable graph, for `launch_graph`.
    fn end_capture(&mut self) -> usize;
    /// Runs an executable graph from `end_capture`, asynchronously.
    fn launch_graph(&mut self, graph: usize);
}

/// What one client measured.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Report {
    /// When its clock started and stopped, in seconds on CLOCK_MONOTONIC.
    pub(crate) start_s: f64,
    pub(crate) end_s: f64,
    /// Units of work done between the two (kernels, requests): summed over the group's clients
    /// and divided by the group's wall clock.
    pub(crate) work: BTreeMap<String, f64>,
    /// Latencies of single operations in microseconds, pooled over the group's clients.
    pub(crate) samples_us: Vec<f64>,
    /// Figures of this client alone (rates of one client, copy bandwidths), averaged over the
    /// group's clients.
    pub(crate) values: BTreeMap<String, f64>,
}

impl Report {
    fn print(&self) {
        println!(
            "result {}",
            serde_json::to_string(self).expect("a report is plain data")
        );
    }
}

/// Work of `unit` counted between `start_s` and now.
fn done(start_s: f64, unit: &str, count: u64) -> Report {
    Report {
        start_s,
        end_s: now_s(),
        work: [(unit.to_string(), count as f64)].into(),
        ..Report::default()
    }
}

/// A run of spin kernels.
struct Spins {
    launches: u32,
    blocks: u32,
    threads: u32,
    /// How long each block spins.
    ns: u64,
    sync_every: u32,
}

/// Runs `s`; `go` returns when the clock may start.
fn spins(gpu: &mut dyn Gpu, go: &dyn Fn(), s: Spins) -> Report {
    let Spins {
        launches,
        blocks,
        threads,
        ns,
        sync_every,
    } = s;
    let counter = gpu.alloc(4);
    // Warm up (module load, first-launch costs) before the clock starts.
    for _ in 0..10 {
        gpu.launch(
            "spin_ns",
            blocks,
            threads,
            &[Arg::U64(0), Arg::U64(counter)],
        );
    }
    gpu.sync();
    go();
    let start = now_s();
    for i in 1..=launches {
        gpu.launch(
            "spin_ns",
            blocks,
            threads,
            &[Arg::U64(ns), Arg::U64(counter)],
        );
        if i % sync_every == 0 {
            gpu.sync();
        }
    }
    gpu.sync();
    done(start, "kernels", launches.into())
}

/// Bytes a request of `infer` carries each way (1024 floats).
const INFER_BYTES: usize = 4096;
/// Dependent kernels per request.
const INFER_CHAIN: usize = 12;
/// Requests per client, unless `run --requests` says otherwise.
pub(crate) const INFER_REQUESTS: usize = 500;

/// The most requests per client `infer` can check exactly: its outputs are sums in f32, exact
/// below 2^24 (inputs up to 6, 12 kernels a request, and `Vary` / `Pairs` sum growing factors).
pub(crate) fn max_requests(workload: &str) -> Option<usize> {
    match workload {
        "infer" | "infer-graph" => Some(200_000),
        "infer-vary" => Some(600),
        "infer-pairs" => Some(1_000),
        _ => None,
    }
}

/// How `infer` issues its requests.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Infer {
    /// Every request the same work.
    Plain,
    /// Each request one launch of a graph captured once.
    Graph,
    /// Every request scales by a factor of its own, so no two runs are alike: what a server
    /// that batches repeated runs pays when nothing repeats.
    Vary,
    /// Each factor used by two requests in a row: a batching server makes a graph for every
    /// second request and launches it once.
    Pairs,
}

/// A small inference server's request, batch 1: its 4 KiB input in, a chain of 12 short kernels
/// each reading what the one before wrote (`y = a * x + y`, 1024 floats), its 4 KiB output
/// back, and a synchronise; the output is checked. Copies are from and to pinned memory, as
/// inference servers keep their I/O buffers. `Graph` captures the request once (after the
/// warm-up) and makes each request one launch of it and the synchronise; `Vary` and `Pairs`
/// change the factor `a` between requests (see [`Infer`]).
fn infer(gpu: &mut dyn Gpu, go: &dyn Fn(), how: Infer, requests: usize) -> Report {
    let n = INFER_BYTES / 4;
    let (x, y) = (gpu.alloc(INFER_BYTES), gpu.alloc(INFER_BYTES));
    let (input, output) = (gpu.host_alloc(INFER_BYTES), gpu.host_alloc(INFER_BYTES));
    let input_of = |i: usize| (i % 7) as f32;
    // SAFETY: `input` is INFER_BYTES of pinned memory, 1024 aligned f32s, this client's alone.
    let inputs = unsafe { std::slice::from_raw_parts_mut(input as *mut f32, n) };
    for (i, v) in inputs.iter_mut().enumerate() {
        *v = input_of(i);
    }
    // The factor of request r (0 is the warm-up); whole numbers, so that the sums stay exact.
    let factor = |r: usize| match how {
        Infer::Plain | Infer::Graph => 1.0f32,
        Infer::Vary => (1 + r) as f32,
        Infer::Pairs => (1 + r / 2) as f32,
    };
    let issue = |gpu: &mut dyn Gpu, a: f32| {
        gpu.htod(x, input, INFER_BYTES);
        for _ in 0..INFER_CHAIN {
            let args = [Arg::F32(a), Arg::U64(x), Arg::U64(y), Arg::U64(n as u64)];
            gpu.launch("saxpy_f32", 4, 256, &args);
        }
        gpu.dtoh(output, y, INFER_BYTES);
    };
    // Warm up: the first request loads the kernel and touches every buffer.
    issue(gpu, factor(0));
    gpu.sync();
    // A capture runs nothing: the check below counts the same requests either way.
    let exec = (how == Infer::Graph).then(|| {
        gpu.begin_capture();
        issue(gpu, 1.0);
        gpu.end_capture()
    });
    let request = |gpu: &mut dyn Gpu, r: usize| {
        match exec {
            Some(g) => gpu.launch_graph(g),
            None => issue(gpu, factor(r)),
        }
        gpu.sync();
    };
    go();
    let start = now_s();
    let mut samples_us = Vec::with_capacity(requests);
    for r in 1..=requests {
        let t = Instant::now();
        request(gpu, r);
        samples_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let end_s = now_s();
    // y began at 0 and gained a * x on each of the 12 kernels of every request; the values
    // stay below 2^24, so the f32 sums are exact.
    let scale: f32 = (0..=requests).map(factor).sum::<f32>() * INFER_CHAIN as f32;
    // SAFETY: `output` is INFER_BYTES of pinned memory, written by the last (synchronised) copy.
    let outputs = unsafe { std::slice::from_raw_parts(output as *const f32, n) };
    for (i, v) in outputs.iter().enumerate() {
        let want = input_of(i) * scale;
        assert!(*v == want, "infer: output {i} is {v}, not {want}");
    }
    Report {
        start_s: start,
        end_s,
        work: [("requests".to_string(), requests as f64)].into(),
        samples_us,
        values: BTreeMap::new(),
    }
}

/// How much work each client does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Amount {
    /// Requests of the infer workloads.
    pub(crate) requests: usize,
    /// A factor on the launches of `spin`, `tiny` and `launch-rate` and the round trips of
    /// `rtt`: at 1, `tiny` with one client takes about 20 ms on an H200, too short for a
    /// difference of a few percent to stand out of the run-to-run spread.
    pub(crate) scale: u32,
}

impl Default for Amount {
    fn default() -> Self {
        Amount {
            requests: INFER_REQUESTS,
            scale: 1,
        }
    }
}

/// Runs `workload` (as much of it as `amount` says) and prints its report; `go` returns when
/// the clock may start (when the whole group starts).
pub(crate) fn run(gpu: &mut dyn Gpu, workload: &str, amount: Amount, go: &dyn Fn()) {
    let Amount { requests, scale } = amount;
    let zero = |counter| [Arg::U64(0), Arg::U64(counter)];
    let report = match workload {
        "spin" => spins(
            gpu,
            go,
            Spins {
                launches: 2000 * scale,
                blocks: 4,
                threads: 128,
                ns: 20_000,
                sync_every: 10,
            },
        ),
        "tiny" => spins(
            gpu,
            go,
            Spins {
                launches: 5000 * scale,
                blocks: 1,
                threads: 32,
                ns: 2_000,
                sync_every: 50,
            },
        ),
        // As wide as an H200 takes in one wave (two blocks of 1024 threads per SM): its
        // throughput follows the SMs the client may use.
        "wide" => spins(
            gpu,
            go,
            Spins {
                launches: 200,
                blocks: 264,
                threads: 1024,
                ns: 500_000,
                sync_every: 10,
            },
        ),
        "infer" => infer(gpu, go, Infer::Plain, requests),
        "infer-graph" => infer(gpu, go, Infer::Graph, requests),
        "infer-vary" => infer(gpu, go, Infer::Vary, requests),
        "infer-pairs" => infer(gpu, go, Infer::Pairs, requests),
        // Keeps every SM it can reach busy until told to stop (a line on standard input).
        "greedy" => {
            let counter = gpu.alloc(4);
            gpu.launch("spin_ns", 264, 1024, &zero(counter));
            gpu.sync();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            go();
            let flag = stop.clone();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = std::io::stdin().lock().read_line(&mut line);
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            });
            let start = now_s();
            let mut launches = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..4 {
                    let args = [Arg::U64(1_000_000), Arg::U64(counter)];
                    gpu.launch("spin_ns", 264, 1024, &args);
                }
                gpu.sync();
                launches += 4;
            }
            done(start, "kernels", launches)
        }
        "rtt" | "rtt-short" => {
            let samples = (if workload == "rtt" { 5000 } else { 2000 }) * scale as usize;
            let counter = gpu.alloc(4);
            for _ in 0..200 {
                gpu.launch("spin_ns", 1, 32, &zero(counter));
                gpu.sync();
            }
            go();
            let start = now_s();
            let mut samples_us = Vec::with_capacity(samples);
            for _ in 0..samples {
                let t = Instant::now();
                gpu.launch("spin_ns", 1, 32, &zero(counter));
                gpu.sync();
                samples_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            Report {
                samples_us,
                ..done(start, "round_trips", samples as u64)
            }
        }
        "launch-rate" => {
            let counter = gpu.alloc(4);
            for _ in 0..1000 {
                gpu.launch("spin_ns", 1, 32, &zero(counter));
            }
            gpu.sync();
            go();
            let n = 100_000 * scale;
            let start = now_s();
            let t = Instant::now();
            for _ in 0..n {
                gpu.launch("spin_ns", 1, 32, &zero(counter));
            }
            let submit = t.elapsed().as_secs_f64();
            gpu.sync();
            let total = t.elapsed().as_secs_f64();
            let values = [
                ("launches_per_s".to_string(), n as f64 / submit),
                ("with_sync_per_s".to_string(), n as f64 / total),
            ];
            Report {
                start_s: start,
                end_s: now_s(),
                values: values.into(),
                ..Report::default()
            }
        }
        "copy" => {
            let bytes = 256usize << 20;
            let dev = gpu.alloc(bytes);
            let pinned = gpu.host_alloc(bytes);
            let mut pageable = vec![1u8; bytes];
            // SAFETY: pinned is `bytes` long; touch it so both sources are resident.
            unsafe { std::ptr::write_bytes(pinned, 1, bytes) };
            go();
            let start = now_s();
            let best = |gpu: &mut dyn Gpu, f: &dyn Fn(&mut dyn Gpu)| {
                (0..3)
                    .map(|_| {
                        let t = Instant::now();
                        f(gpu);
                        gpu.sync();
                        bytes as f64 / t.elapsed().as_secs_f64() / 1e9
                    })
                    .fold(0.0, f64::max)
            };
            let pp = pageable.as_mut_ptr();
            let values = [
                ("h2d_pinned_gbs", best(gpu, &|g| g.htod(dev, pinned, bytes))),
                ("d2h_pinned_gbs", best(gpu, &|g| g.dtoh(pinned, dev, bytes))),
                ("h2d_pageable_gbs", best(gpu, &|g| g.htod(dev, pp, bytes))),
                ("d2h_pageable_gbs", best(gpu, &|g| g.dtoh(pp, dev, bytes))),
            ];
            Report {
                start_s: start,
                end_s: now_s(),
                values: values.map(|(k, v)| (k.to_string(), v)).into(),
                ..Report::default()
            }
        }
        "idle" => {
            let _ = gpu.alloc(4);
            gpu.sync();
            go();
            let now = now_s();
            Report {
                start_s: now,
                end_s: now,
                ..Report::default()
            }
        }
        other => panic!(
            "unknown workload {other}: spin, tiny, wide, infer, infer-graph, infer-vary, \
             infer-pairs, greedy, rtt, rtt-short, launch-rate, copy or idle"
        ),
    };
    report.print();
}
