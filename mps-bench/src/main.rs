//! `mps-bench`: native CUDA, NVIDIA MPS and mps side by side, in one run, on one GPU.
//!
//! Every client is a process of its own (this binary, re-executed as a worker). `native` gives
//! each its own CUDA context; `nvidia-mps` runs the same native workers under
//! `nvidia-cuda-mps-control -d` (started and stopped here, with pipe and log directories under
//! /tmp); `mps` runs workers that are clients of an mps server started here.

mod native;
mod plot;
mod quotas;
mod via_mps;
mod workload;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(about)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What `run` and `quotas` both need.
#[derive(clap::Args, Debug)]
struct Setup {
    /// The test kernels' PTX.
    #[arg(long, default_value = "kernels/test_kernels.ptx")]
    ptx: PathBuf,
    /// The mps-server binary (mps-control is taken from its directory) [default: next to this
    /// one].
    #[arg(long)]
    server: Option<PathBuf>,
    /// Where the results go (bench.json and throughput.svg, or quotas.json).
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// The mps server's backend: sim only checks the harness without a GPU (quotas then runs
    /// the mps rows alone).
    #[arg(long, default_value = "cuda")]
    backend: String,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runs the benchmark.
    Run {
        /// Modes, comma-separated: native, nvidia-mps, mps, and one-context (N threads of one
        /// process sharing one context, each with a stream of its own: the host-side ceiling of
        /// any one-context server; spin and tiny only).
        #[arg(long, default_value = "native,nvidia-mps,mps")]
        modes: String,
        /// Client counts for the spin and tiny workloads.
        #[arg(long, default_value = "1,2,4,8,16,32,64")]
        clients: String,
        /// Workloads, comma-separated: spin, tiny, rtt, launch-rate, copy, footprint.
        #[arg(long, default_value = "spin,tiny,rtt,launch-rate,copy,footprint")]
        workloads: String,
        #[command(flatten)]
        setup: Setup,
        /// Extra arguments for mps-server, space-separated (e.g. "--spin-us 200").
        #[arg(long, default_value = "")]
        server_args: String,
    },
    /// Measures SM shares, SM reservations and separate groups (see `quotas.rs`).
    Quotas {
        #[command(flatten)]
        setup: Setup,
    },
    /// Draws throughput.svg from a bench.json this program wrote.
    Plot {
        /// The bench.json of a run.
        #[arg(long)]
        json: PathBuf,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// One client (used by `run`).
    Worker {
        #[arg(long)]
        mode: String,
        #[arg(long)]
        workload: String,
        #[arg(long)]
        ptx: PathBuf,
        /// Threads of this process running the workload, each with a stream of its own in the
        /// process's one context (the `one-context` mode).
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
}

const NV_PIPE: &str = "/tmp/mps-bench-nvidia-pipe";
const NV_LOG: &str = "/tmp/mps-bench-nvidia-log";

/// The pipe and log directories of this run's mps servers: one pair per benchmark process, so
/// that two runs on one machine never share (or remove) each other's server.
fn mps_dirs() -> &'static (String, String) {
    static DIRS: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let pid = std::process::id();
        (
            format!("/tmp/mps-bench-pipe-{pid}"),
            format!("/tmp/mps-bench-log-{pid}"),
        )
    })
}

/// One measurement.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Record {
    mode: String,
    workload: String,
    clients: usize,
    /// Clients that completed correctly.
    completed: usize,
    values: BTreeMap<String, f64>,
    note: String,
}

fn worker_env(cmd: &mut Command, mode: &str) {
    match mode {
        "nvidia-mps" => {
            cmd.env("CUDA_MPS_PIPE_DIRECTORY", NV_PIPE)
                .env("CUDA_MPS_LOG_DIRECTORY", NV_LOG);
        }
        "mps" => {
            cmd.env("MPS_PIPE_DIRECTORY", &mps_dirs().0);
        }
        _ => {}
    }
}

/// One worker process of a group: its workload, environment of its own, and how many threads
/// run the workload in it.
#[derive(Clone, Debug)]
struct Spec {
    workload: String,
    env: Vec<(String, String)>,
    threads: usize,
}

impl Spec {
    fn new(workload: &str, env: &[(&str, &str)]) -> Spec {
        Spec {
            workload: workload.into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            threads: 1,
        }
    }
}

/// What a group of workers reported.
struct Outcome {
    /// Each worker's result values, in spec order, one per thread (None: it failed).
    results: Vec<Option<BTreeMap<String, f64>>>,
    /// The first failure's last lines of standard error.
    note: String,
    /// GPU memory in use once every worker was ready, when asked for.
    gpu_mem_used_mib: Option<f64>,
}

/// Runs one worker per spec, all in one mode, started together. Greedy workers run until every
/// other worker has reported.
fn run_group(mode: &str, specs: &[Spec], ptx: &Path, footprint: bool) -> Outcome {
    let exe = std::env::current_exe().unwrap();
    let worker_mode = if mode == "mps" { "mps" } else { "native" };
    let mut children: Vec<Child> = specs
        .iter()
        .map(|spec| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "worker",
                "--mode",
                worker_mode,
                "--workload",
                &spec.workload,
                "--threads",
                &spec.threads.to_string(),
                "--ptx",
            ])
            .arg(ptx)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            worker_env(&mut cmd, mode);
            cmd.spawn().expect("spawn worker")
        })
        .collect();
    let mut readers: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()).lines())
        .collect();
    let ready: Vec<bool> = readers
        .iter_mut()
        .map(|r| matches!(r.next(), Some(Ok(l)) if l == "ready"))
        .collect();
    let gpu_mem_used_mib = footprint.then(|| {
        std::thread::sleep(Duration::from_millis(500));
        gpu_memory_used_mib()
    });
    for c in children.iter_mut() {
        if let Some(stdin) = c.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
        }
    }
    let mut lines: Vec<Vec<String>> = vec![Vec::new(); specs.len()];
    let greedy = |i: usize| specs[i].workload == "greedy";
    for pass in [false, true] {
        if pass {
            for (i, c) in children.iter_mut().enumerate().filter(|(i, _)| greedy(*i)) {
                if let (true, Some(stdin)) = (ready[i], c.stdin.as_mut()) {
                    let _ = stdin.write_all(b"stop\n");
                }
            }
        }
        for (i, r) in readers.iter_mut().enumerate() {
            if greedy(i) == pass {
                lines[i] = r
                    .by_ref()
                    .map_while(|l| l.ok())
                    .filter(|l| l.starts_with("result "))
                    .take(specs[i].threads)
                    .collect();
            }
        }
    }
    let mut results = Vec::new();
    let mut note = String::new();
    for (i, mut c) in children.into_iter().enumerate() {
        let status = c.wait().unwrap();
        match &lines[i] {
            l if ready[i] && status.success() && l.len() == specs[i].threads => {
                results.extend(l.iter().map(|l| {
                    Some(
                        l.split_whitespace()
                            .skip(1)
                            .filter_map(|kv| kv.split_once('='))
                            .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(f64::NAN)))
                            .collect(),
                    )
                }))
            }
            _ => {
                let mut err = String::new();
                let _ = std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err);
                if note.is_empty() {
                    note = err.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
                }
                results.push(None);
            }
        }
    }
    Outcome {
        results,
        note,
        gpu_mem_used_mib,
    }
}

/// Kernels per second of workers that ran together (all their kernels over the slowest one's
/// time), and that time.
fn throughput(results: &[&BTreeMap<String, f64>]) -> (f64, f64) {
    let kernels: f64 = results.iter().map(|r| r["kernels"]).sum();
    let slowest = results.iter().map(|r| r["elapsed_s"]).fold(0.0, f64::max);
    (kernels / slowest, slowest)
}

/// Runs `clients` workers of one mode and workload together; returns each one's result values.
fn group(mode: &str, workload: &str, clients: usize, ptx: &Path, footprint: bool) -> Record {
    let specs = if mode == "one-context" {
        // One process, a thread per client.
        vec![Spec {
            threads: clients,
            ..Spec::new(workload, &[])
        }]
    } else {
        vec![Spec::new(workload, &[]); clients]
    };
    let outcome = run_group(mode, &specs, ptx, footprint);
    let results: Vec<_> = outcome.results.iter().flatten().collect();
    let mut values = BTreeMap::new();
    if let Some(mib) = outcome.gpu_mem_used_mib {
        values.insert("gpu_mem_used_mib".into(), mib);
    }
    let completed = results.len();
    match workload {
        "spin" | "tiny" if completed > 0 => {
            let (kernels_per_s, slowest) = throughput(&results);
            values.insert("kernels_per_s".into(), kernels_per_s);
            values.insert("slowest_client_s".into(), slowest);
        }
        _ if completed > 0 && !footprint => {
            for k in results[0].keys() {
                let mean = results.iter().map(|r| r[k]).sum::<f64>() / completed as f64;
                values.insert(k.clone(), mean);
            }
        }
        _ => {}
    }
    Record {
        mode: mode.into(),
        workload: workload.into(),
        clients,
        completed,
        values,
        note: outcome.note,
    }
}

fn gpu_memory_used_mib() -> f64 {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        .output();
    out.ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .lines()
                .next()?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(f64::NAN)
}

/// A running mode's service (NVIDIA's daemon or our server), stopped on drop.
enum Service {
    None,
    Nvidia,
    Mps(Child),
    /// mps-control, starting one server per group.
    MpsDaemon(Child),
}

impl Service {
    fn start(mode: &str, server: &Path, backend: &str, extra: &str) -> Service {
        match mode {
            "nvidia-mps" => {
                for d in [NV_PIPE, NV_LOG] {
                    std::fs::create_dir_all(d).unwrap();
                }
                let ok = Command::new("nvidia-cuda-mps-control")
                    .arg("-d")
                    .env("CUDA_MPS_PIPE_DIRECTORY", NV_PIPE)
                    .env("CUDA_MPS_LOG_DIRECTORY", NV_LOG)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "nvidia-cuda-mps-control -d failed");
                Service::Nvidia
            }
            "mps" | "mps-daemon" => {
                let (pipe, log) = mps_dirs();
                let _ = std::fs::remove_dir_all(pipe);
                let mut cmd = if mode == "mps" {
                    Command::new(server)
                } else {
                    let mut c = Command::new(server.with_file_name("mps-control"));
                    c.arg("-f").arg("--server").arg(server);
                    c
                };
                let child = cmd
                    .args(["--backend", backend, "--pipe-dir", pipe, "--log-dir", log])
                    .args(extra.split_whitespace())
                    .env("MPS_LOG", "warn")
                    .spawn()
                    .expect("start mps-server");
                let sock = Path::new(pipe).join("mps.sock");
                let t = Instant::now();
                while std::os::unix::net::UnixStream::connect(&sock).is_err() {
                    assert!(
                        t.elapsed() < Duration::from_secs(30),
                        "mps-server did not start"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                if mode == "mps" {
                    Service::Mps(child)
                } else {
                    Service::MpsDaemon(child)
                }
            }
            _ => Service::None,
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        match self {
            Service::None => {}
            Service::Nvidia => {
                let child = Command::new("nvidia-cuda-mps-control")
                    .env("CUDA_MPS_PIPE_DIRECTORY", NV_PIPE)
                    .env("CUDA_MPS_LOG_DIRECTORY", NV_LOG)
                    .stdin(Stdio::piped())
                    .spawn();
                if let Ok(mut c) = child {
                    let _ = c.stdin.take().unwrap().write_all(b"quit\n");
                    let _ = c.wait();
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Service::Mps(c) | Service::MpsDaemon(c) => {
                let _ = c.kill();
                let _ = c.wait();
                let _ = std::fs::remove_dir_all(&mps_dirs().0);
            }
        }
    }
}

fn table(records: &[Record], modes: &[&str]) -> String {
    let mut rows: Vec<(String, usize, String)> = Vec::new();
    for r in records {
        for k in r.values.keys() {
            let key = (r.workload.clone(), r.clients, k.clone());
            if !rows.contains(&key) {
                rows.push(key);
            }
        }
    }
    let find = |m: &str, w: &str, n: usize, k: &str| {
        records
            .iter()
            .find(|r| r.mode == m && r.workload == w && r.clients == n)
            .and_then(|r| r.values.get(k).copied())
    };
    let mut s = format!(
        "| workload | N | figure | {} | mps/native | mps/nvidia-mps |\n",
        modes.join(" | ")
    );
    s += &format!("|{}\n", " --- |".repeat(modes.len() + 5));
    for (w, n, k) in rows {
        let cell = |v: Option<f64>| v.map_or("—".to_string(), |v| format!("{v:.4}"));
        let mut line = format!("| {w} | {n} | {k} |");
        for m in modes {
            line += &format!(" {} |", cell(find(m, &w, n, &k)));
        }
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
            _ => "—".into(),
        };
        let mps = find("mps", &w, n, &k);
        line += &format!(
            " {} | {} |",
            ratio(mps, find("native", &w, n, &k)),
            ratio(mps, find("nvidia-mps", &w, n, &k))
        );
        s += &line;
        s.push('\n');
    }
    s
}

/// Kernels/s against client count, per workload and mode, from the spin and tiny records.
fn series(records: &[Record]) -> plot::Series {
    let mut s = plot::Series::new();
    for r in records.iter().filter(|r| r.completed > 0) {
        if let Some(v) = r.values.get("kernels_per_s") {
            s.entry(r.workload.clone())
                .or_insert_with(|| ("kernels/s".into(), BTreeMap::new()))
                .1
                .entry(r.mode.clone())
                .or_default()
                .push(plot::Point {
                    asked: r.clients,
                    completed: r.completed,
                    value: *v,
                });
        }
    }
    s
}

/// `threads` threads of this process run `workload` natively, each with a stream of its own in
/// the process's primary context; they start together when the parent says go, and each prints
/// its result line.
fn threaded_worker(ptx: &[u8], workload: &str, threads: usize) {
    use std::sync::{Arc, Barrier};
    let (ready, go) = (
        Arc::new(Barrier::new(threads + 1)),
        Arc::new(Barrier::new(threads + 1)),
    );
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (ready, go) = (ready.clone(), go.clone());
            let (ptx, workload) = (ptx.to_vec(), workload.to_string());
            std::thread::spawn(move || {
                let mut gpu = native::Native::new(&ptx);
                workload::run(&mut gpu, &workload, &|| {
                    ready.wait();
                    go.wait();
                });
            })
        })
        .collect();
    ready.wait();
    workload::wait_for_go();
    go.wait();
    for h in handles {
        h.join().expect("a worker thread panicked");
    }
}

impl Setup {
    /// The mps-server binary: the one named, else the one next to this binary.
    fn server(&self) -> PathBuf {
        self.server.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .unwrap()
                .with_file_name("mps-server")
        })
    }
}

fn main() {
    match Args::parse().cmd {
        Cmd::Plot { json, out } => {
            let text = std::fs::read_to_string(&json).expect("read the json");
            let records: Vec<Record> = serde_json::from_str(&text).expect("parse the json");
            // The modes the run measured, in the order `run` draws them.
            let modes: Vec<&str> = ["native", "nvidia-mps", "one-context", "mps"]
                .into_iter()
                .filter(|m| records.iter().any(|r| r.mode == *m))
                .collect();
            plot::write(&series(&records), &modes, &out).expect("write the plot");
        }
        Cmd::Worker {
            mode,
            workload,
            ptx,
            threads,
        } => {
            let ptx = std::fs::read(&ptx).expect("read the PTX");
            if threads > 1 {
                return threaded_worker(&ptx, &workload, threads);
            }
            let mut gpu: Box<dyn workload::Gpu> = if mode == "mps" {
                Box::new(via_mps::ViaMps::new(&ptx))
            } else {
                Box::new(native::Native::new(&ptx))
            };
            workload::run(gpu.as_mut(), &workload, &workload::wait_for_go);
        }
        Cmd::Quotas { setup } => {
            let table = quotas::run(&setup.ptx, &setup.server(), &setup.backend, &setup.out);
            println!("{table}");
        }
        Cmd::Run {
            modes,
            clients,
            workloads,
            setup,
            server_args,
        } => {
            let server = setup.server();
            let Setup {
                ptx, out, backend, ..
            } = setup;
            let modes: Vec<&str> = modes.split(',').collect();
            let counts: Vec<usize> = clients.split(',').map(|c| c.parse().unwrap()).collect();
            let workloads: Vec<&str> = workloads.split(',').collect();
            let baseline = gpu_memory_used_mib();
            let mut records = Vec::new();
            for mode in &modes {
                let service = Service::start(mode, &server, &backend, &server_args);
                for w in &workloads {
                    if *mode == "one-context" && !matches!(*w, "spin" | "tiny") {
                        continue;
                    }
                    let runs: Vec<(usize, &str, bool)> = match *w {
                        "spin" | "tiny" => counts.iter().map(|n| (*n, *w, false)).collect(),
                        "footprint" => [1, 8, 32].iter().map(|n| (*n, "idle", true)).collect(),
                        _ => vec![(1, *w, false)],
                    };
                    for (n, workload, footprint) in runs {
                        let mut r = group(mode, workload, n, &ptx, footprint);
                        r.workload = w.to_string();
                        if let Some(v) = r.values.get_mut("gpu_mem_used_mib") {
                            *v -= baseline;
                        }
                        eprintln!(
                            "{mode} {w} N={n}: {}/{n} completed {:?} {}",
                            r.completed, r.values, r.note
                        );
                        records.push(r);
                    }
                }
                drop(service);
            }
            std::fs::create_dir_all(&out).unwrap();
            let json = serde_json::to_string_pretty(&records).unwrap();
            std::fs::write(out.join("bench.json"), json).unwrap();
            plot::write(&series(&records), &modes, &out.join("throughput.svg"))
                .expect("write the plot");
            println!("{}", table(&records, &modes));
            for r in records.iter().filter(|r| r.completed < r.clients) {
                println!(
                    "{} {} N={}: {} of {} clients completed; first failure: {}",
                    r.mode, r.workload, r.clients, r.completed, r.clients, r.note
                );
            }
        }
    }
}
