//! `mps-bench`: native CUDA, NVIDIA MPS and mps side by side, in one run, on one GPU.
//!
//! Every client is a process of its own (this binary, re-executed as a worker), except in
//! `one-context`, where it is a thread. `native` gives each its own CUDA context; `nvidia-mps`
//! runs the same native workers under `nvidia-cuda-mps-control -d` (started and stopped here,
//! with pipe and log directories under /tmp); `mps` runs workers that are clients of an mps
//! server started here; `mps-transparent` runs the native workers, unmodified, through mps's own
//! `libcuda.so.1` against an mps server (`transparent`). The clients of a group start together (`start`), and the group's
//! figures are its work over the wall clock from the first start to the last end (`group`).

mod footprint;
mod group;
mod native;
mod plot;
mod quotas;
mod record;
mod service;
mod start;
mod transparent;
mod via_mps;
mod workload;

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Parser, Subcommand};

use group::{Outcome, Spec, aggregate, run_group};
use record::Record;
use service::Service;
use start::Start;
use workload::Amount;

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
    /// The directory holding mps's driver library (libmpscuda.so of a cargo build, or the
    /// libcuda.so.1 of an installation), for the mps-transparent mode [default: this binary's
    /// directory].
    #[arg(long)]
    mps_cuda_lib: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Runs the benchmark.
    Run {
        /// Modes, comma-separated: native, nvidia-mps, mps (the server's defaults, launch
        /// batching on), mps-unbatched (mps with launch batching off), mps-batched (mps with
        /// launch batching named on), mps-transparent (the native workers
        /// through mps's libcuda.so.1, see --mps-cuda-lib), and one-context (N threads of one
        /// process sharing one context, each with a stream of its own: the host-side ceiling of
        /// any one-context server; spin, tiny and infer only). They run in the order given.
        #[arg(long, default_value = "native,nvidia-mps,mps")]
        modes: String,
        /// Client counts for the spin, tiny and infer workloads (each of them).
        #[arg(long, default_value = "1,2,4,8,16,32,64")]
        clients: String,
        /// Workloads, comma-separated: spin, tiny, infer, infer-graph, infer-vary (a factor of
        /// its own per request: nothing repeats), infer-pairs (each factor twice: a batching
        /// server makes a graph per two requests), rtt, launch-rate, copy, footprint.
        #[arg(long, default_value = "spin,tiny,infer,rtt,launch-rate,copy,footprint")]
        workloads: String,
        #[command(flatten)]
        setup: Setup,
        /// Extra arguments for mps-server, space-separated (e.g. "--spin-us 200"); for
        /// mps-control with --devices above 1.
        #[arg(long, default_value = "")]
        server_args: String,
        /// GPUs to spread the clients over: client i runs on device i % D (through
        /// CUDA_VISIBLE_DEVICES, in every mode); the mps mode then runs mps-control, which
        /// serves every device with a server each, instead of one mps-server. one-context
        /// stays on one device.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
        devices: u32,
        /// Requests per client of the infer workloads (at most 200,000 for infer and
        /// infer-graph, 600 for infer-vary, 1,000 for infer-pairs: every output is checked
        /// exactly in f32). More requests make a longer run: a soak of N clients for minutes.
        #[arg(long, default_value_t = workload::INFER_REQUESTS, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
        requests: usize,
        /// A factor on the launches of spin, tiny and launch-rate and on rtt's round trips per
        /// client (2000, 5000, 100,000 and 5000 at 1): a longer run, whose figures spread less
        /// from run to run.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        scale: u32,
        /// Runs every mode this many times, in the order given each round, so that a drift of
        /// the machine meets every mode alike. The table gives each figure's median over the
        /// rounds, and each ratio as the median of the rounds' own ratios with their range.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
    },
    /// Measures SM shares, SM reservations and separate groups (see `quotas.rs`).
    Quotas {
        #[command(flatten)]
        setup: Setup,
    },
    /// Draws the throughput plot (SVG) from a bench.json this program wrote, and prints its
    /// table (as `run` does; also for a run stopped part way).
    Plot {
        /// The bench.json of a run.
        #[arg(long)]
        json: PathBuf,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// One client, or `threads` clients (used by `run` and `quotas`).
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
        /// The inherited descriptor whose end of file starts the group.
        #[arg(long)]
        start_fd: i32,
        /// Requests per client of the infer workloads.
        #[arg(long, default_value_t = workload::INFER_REQUESTS)]
        requests: usize,
        /// The factor on the other workloads' launches (see `run --scale`).
        #[arg(long, default_value_t = 1)]
        scale: u32,
    },
}

/// The modes in the order tables and plots show them.
const MODE_ORDER: [&str; 7] = [
    "native",
    "nvidia-mps",
    "one-context",
    "mps",
    "mps-unbatched",
    "mps-batched",
    "mps-transparent",
];

/// The workloads that run with each client count (the others run one client).
fn scales(workload: &str) -> bool {
    matches!(
        workload,
        "spin" | "tiny" | "infer" | "infer-graph" | "infer-vary" | "infer-pairs"
    )
}

/// One worker process: `threads` clients of `workload`, each on a stream of its own; each says
/// ready once set up, waits for the group's start, and prints its report.
fn worker(mode: &str, ptx: &[u8], workload: &str, threads: usize, amount: Amount, start: Start) {
    // A client that fails ends the whole worker at once: its other threads would otherwise wait
    // for a start the parent gives only once every client said ready.
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::exit(101);
    }));
    let client = |ptx: &[u8], workload: &str, start: &Start| {
        let mut gpu: Box<dyn workload::Gpu> = match mode {
            "mps" => Box::new(via_mps::ViaMps::new(ptx)),
            // The native worker as it is, once its driver library is known to be mps's.
            "mps-transparent" => {
                transparent::check_loaded();
                Box::new(native::Native::new(ptx))
            }
            _ => Box::new(native::Native::new(ptx)),
        };
        workload::run(gpu.as_mut(), workload, amount, &|| {
            println!("ready");
            start.wait();
        });
    };
    if threads == 1 {
        return client(ptx, workload, &start);
    }
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| client(ptx, workload, &start));
        }
    });
}

/// The record of a group of `asked` clients.
fn record(
    mode: &str,
    workload: &str,
    asked: usize,
    outcome: Outcome,
    baseline_mib: Option<f64>,
) -> Record {
    let done: Vec<_> = outcome.reports.iter().flatten().collect();
    let mut note = outcome.note;
    let values = match outcome.footprint {
        Some(f) => {
            let mut v = std::collections::BTreeMap::new();
            if let Some((mib, n)) = f.per_process {
                v.insert("gpu_mem_per_process_mib".to_string(), mib);
                v.insert("gpu_processes".to_string(), n as f64);
            }
            if let (Some(used), Some(base)) = (f.device_wide_mib, baseline_mib) {
                v.insert("gpu_mem_device_wide_mib".to_string(), used - base);
            }
            if !f.stable {
                note += " footprint: nvidia-smi's readings did not settle within the deadline";
            }
            v
        }
        None => aggregate(&done),
    };
    Record {
        mode: mode.into(),
        round: 0,
        workload: workload.into(),
        asked,
        completed: done.len(),
        values,
        note: note.trim().to_string(),
    }
}

/// How `run` goes beyond its modes, client counts and workloads.
struct Plan {
    /// GPUs the clients are spread over.
    devices: u32,
    amount: Amount,
    /// Times every mode runs.
    rounds: u32,
}

/// Runs every workload in every mode, `plan.rounds` times; writes bench.json and
/// throughput.svg into `out` and prints the table.
fn run(
    modes: &[&str],
    counts: &[usize],
    workloads: &[&str],
    setup: &Setup,
    server_args: &str,
    plan: Plan,
) {
    let Plan {
        devices,
        amount,
        rounds,
    } = plan;
    let began = Instant::now();
    let baseline = workloads
        .contains(&"footprint")
        .then(|| footprint::settled(footprint::device_used_mib).0)
        .flatten();
    let out = &setup.out;
    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));
    // Written after every group, so that a run stopped part way keeps what it measured.
    let save = |records: &[Record]| {
        let json = serde_json::to_string_pretty(records).expect("records are plain data");
        let part = out.join("bench.json.part");
        std::fs::write(&part, json).expect("write bench.json");
        std::fs::rename(&part, out.join("bench.json")).expect("write bench.json");
    };
    // Found before any mode runs, so that a missing library stops the run at once.
    let library = modes
        .contains(&"mps-transparent")
        .then(|| transparent::Library::prepare(&setup.mps_cuda_lib()));
    let mut records = Vec::new();
    let rounds = (0..rounds as usize).flat_map(|round| modes.iter().map(move |m| (round, m)));
    for (round, mode) in rounds {
        let t = Instant::now();
        // The transparent mode's workers join an mps server as the mps mode's do.
        let (service_mode, extra_env) = match &library {
            Some(l) if *mode == "mps-transparent" => ("mps", l.env()),
            _ => (*mode, Vec::new()),
        };
        let extra_env: Vec<(&str, &str)> = extra_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // The batched and unbatched modes are the mps mode with the server's launch batching
        // named on or off.
        let batching = match service_mode {
            "mps-batched" => Some("on"),
            "mps-unbatched" => Some("off"),
            _ => None,
        };
        let (service_mode, server_args) = match batching {
            Some(b) if devices > 1 => (
                "mps",
                format!("{server_args} --server-arg=--launch-batching --server-arg={b}"),
            ),
            Some(b) => ("mps", format!("{server_args} --launch-batching {b}")),
            None => (service_mode, server_args.to_string()),
        };
        let service = if service_mode == "mps" && devices > 1 {
            // One daemon for every device, as a host of several GPUs runs mps.
            let mut args = server_args;
            if setup.backend == "sim" {
                args += &format!(" --sim-devices {devices}");
            }
            Service::start("mps-daemon", &setup.server(), &setup.backend, &args)
        } else {
            Service::start(service_mode, &setup.server(), &setup.backend, &server_args)
        };
        for w in workloads {
            if *mode == "one-context" && !scales(w) {
                continue;
            }
            let runs: Vec<(usize, &str)> = match *w {
                w if scales(w) => counts.iter().map(|n| (*n, w)).collect(),
                "footprint" => [1, 8, 32].iter().map(|n| (*n, "idle")).collect(),
                w => vec![(1, w)],
            };
            for (n, workload) in runs {
                let mut specs = if *mode == "one-context" {
                    vec![Spec {
                        threads: n,
                        ..Spec::new(workload, &[])
                    }]
                } else if devices > 1 {
                    (0..n)
                        .map(|i| {
                            let device = (i as u32 % devices).to_string();
                            let mut env = extra_env.clone();
                            env.push(("CUDA_VISIBLE_DEVICES", device.as_str()));
                            Spec::new(workload, &env)
                        })
                        .collect()
                } else {
                    vec![Spec::new(workload, &extra_env); n]
                };
                for s in &mut specs {
                    s.amount = amount;
                }
                let g = Instant::now();
                let footprint = *w == "footprint";
                let outcome = run_group(mode, &service, &specs, &setup.ptx, footprint);
                let r = Record {
                    round,
                    ..record(mode, w, n, outcome, baseline)
                };
                eprintln!(
                    "{mode} {w} N={n}: {}/{n} completed in {:.1} s {:?} {}",
                    r.completed,
                    g.elapsed().as_secs_f64(),
                    r.values,
                    r.note
                );
                records.push(r);
                save(&records);
            }
        }
        drop(service);
        eprintln!(
            "{mode} (round {}): {:.1} s",
            round + 1,
            t.elapsed().as_secs_f64()
        );
    }
    let ordered: Vec<&str> = MODE_ORDER
        .into_iter()
        .filter(|m| modes.contains(m))
        .collect();
    drop(library);
    plot::write(
        &record::series(&records),
        &ordered,
        &out.join("throughput.svg"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    println!("{}", record::table(&records, &ordered));
    for r in records.iter().filter(|r| r.completed < r.asked) {
        println!(
            "{} {} N={} (round {}): {} of {} clients completed; first failure: {}",
            r.mode,
            r.workload,
            r.asked,
            r.round + 1,
            r.completed,
            r.asked,
            r.note
        );
    }
    eprintln!("run: {:.1} s", began.elapsed().as_secs_f64());
}

impl Setup {
    /// The directory of mps's driver library: the one named, else this binary's.
    fn mps_cuda_lib(&self) -> PathBuf {
        self.mps_cuda_lib.clone().unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("the path of this program");
            exe.parent()
                .expect("a program has a directory")
                .to_path_buf()
        })
    }

    /// The mps-server binary: the one named, else the one next to this binary.
    fn server(&self) -> PathBuf {
        self.server.clone().unwrap_or_else(|| {
            std::env::current_exe()
                .expect("the path of this program")
                .with_file_name("mps-server")
        })
    }
}

fn list(s: &str) -> Vec<&str> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .collect()
}

fn read_ptx(ptx: &Path) -> Vec<u8> {
    std::fs::read(ptx).unwrap_or_else(|e| panic!("cannot read the PTX {}: {e}", ptx.display()))
}

fn main() {
    match Args::parse().cmd {
        Cmd::Plot { json, out } => {
            let text = std::fs::read_to_string(&json)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", json.display()));
            let records: Vec<Record> = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not a bench.json: {e}", json.display()));
            let modes: Vec<&str> = MODE_ORDER
                .into_iter()
                .filter(|m| records.iter().any(|r| r.mode == *m))
                .collect();
            plot::write(&record::series(&records), &modes, &out).unwrap_or_else(|e| panic!("{e}"));
            println!("{}", record::table(&records, &modes));
        }
        Cmd::Worker {
            mode,
            workload,
            ptx,
            threads,
            start_fd,
            requests,
            scale,
        } => worker(
            &mode,
            &read_ptx(&ptx),
            &workload,
            threads,
            Amount { requests, scale },
            Start::inherited(start_fd),
        ),
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
            devices,
            requests,
            scale,
            rounds,
        } => {
            let modes = list(&modes);
            for (i, m) in modes.iter().enumerate() {
                if modes[..i].contains(m) {
                    panic!("--modes: {m} is named twice; --rounds repeats every mode");
                }
            }
            if let Some(m) = modes.iter().find(|m| !MODE_ORDER.contains(m)) {
                panic!(
                    "--modes: unknown mode {m} (one of {})",
                    MODE_ORDER.join(", ")
                );
            }
            let counts: Vec<usize> = list(&clients)
                .iter()
                .map(|c| {
                    c.parse()
                        .unwrap_or_else(|_| panic!("--clients: {c} is not a count"))
                })
                .collect();
            let workloads = list(&workloads);
            for w in &workloads {
                if let Some(max) = workload::max_requests(w).filter(|m| requests > *m) {
                    panic!(
                        "--requests {requests}: {w} checks its outputs exactly for at most {max} \
                         requests per client"
                    );
                }
            }
            run(
                &modes,
                &counts,
                &workloads,
                &setup,
                &server_args,
                Plan {
                    devices,
                    amount: Amount { requests, scale },
                    rounds,
                },
            );
        }
    }
}
