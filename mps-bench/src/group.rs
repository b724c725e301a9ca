//! A group of clients run together: one worker process per [`Spec`], every client started by one
//! [`StartLine`], and the group's figures worked out from what each reported on the shared clock.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Lines, Read};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use crate::footprint::{self, Footprint};
use crate::service::Service;
use crate::start::StartLine;
use crate::workload::Report;

/// The `CUDA_DEVICE_MAX_CONNECTIONS` that mps-server sets before it creates its context
/// (`MAX_CONNECTIONS` in mps-server/src/main.rs; a unit test below keeps the two equal): the
/// `one-context` mode measures what one context reaches with the server's settings.
pub(crate) const SERVER_MAX_CONNECTIONS: &str = "32";

/// One worker process of a group: its workload, environment of its own, and how many threads
/// run the workload in it (each a client).
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) workload: String,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) threads: usize,
    /// How much work each client does.
    pub(crate) amount: crate::workload::Amount,
}

impl Spec {
    pub(crate) fn new(workload: &str, env: &[(&str, &str)]) -> Spec {
        Spec {
            workload: workload.into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            threads: 1,
            amount: crate::workload::Amount::default(),
        }
    }
}

/// What a group of workers reported.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Each client's report, in spec order and one per thread (None: it failed).
    pub(crate) reports: Vec<Option<Report>>,
    /// The first failure's last lines of standard error.
    pub(crate) note: String,
    /// GPU memory in use once every client was ready, when asked for.
    pub(crate) footprint: Option<Footprint>,
}

struct Worker {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    ready: bool,
}

/// Runs one worker per spec, all in `mode` (whose service is running), started together.
/// Greedy workers run until every other worker has reported.
pub(crate) fn run_group(
    mode: &str,
    service: &Service,
    specs: &[Spec],
    ptx: &Path,
    footprint: bool,
) -> Outcome {
    let exe = std::env::current_exe().expect("the path of this program");
    let worker_mode = match mode {
        "mps" | "mps-transparent" => mode,
        // The same clients; only the server differs.
        "mps-batched" | "mps-unbatched" => "mps",
        _ => "native",
    };
    let mut start = StartLine::new().expect("make the start pipe");
    let mut workers: Vec<Worker> = specs
        .iter()
        .map(|spec| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "worker",
                "--mode",
                worker_mode,
                "--workload",
                &spec.workload,
            ])
            .args(["--threads", &spec.threads.to_string()])
            .args(["--requests", &spec.amount.requests.to_string()])
            .args(["--scale", &spec.amount.scale.to_string()])
            .args(["--start-fd", &start.fd().to_string(), "--ptx"])
            .arg(ptx)
            .envs(service.client_env())
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            if mode == "one-context" && std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
                cmd.env("CUDA_DEVICE_MAX_CONNECTIONS", SERVER_MAX_CONNECTIONS);
            }
            let mut child = cmd
                .spawn()
                .expect("start a worker (this program, re-executed)");
            let lines = BufReader::new(child.stdout.take().unwrap()).lines();
            Worker {
                child,
                lines,
                ready: false,
            }
        })
        .collect();
    start.spawned();
    // Every client of a worker says ready once it is set up (a failed one ends its output).
    for (w, spec) in workers.iter_mut().zip(specs) {
        let said = w
            .lines
            .by_ref()
            .take(spec.threads)
            .filter(|l| matches!(l, Ok(l) if l == "ready"))
            .count();
        w.ready = said == spec.threads;
    }
    let footprint = footprint.then(|| {
        let mut pids: Vec<u32> = workers.iter().map(|w| w.child.id()).collect();
        pids.extend(service.pids());
        footprint::sample(&pids)
    });
    start.release();

    let mut lines: Vec<Vec<String>> = vec![Vec::new(); specs.len()];
    let greedy = |i: usize| specs[i].workload == "greedy";
    for pass in [false, true] {
        if pass {
            for w in workers.iter_mut().enumerate().filter(|(i, _)| greedy(*i)) {
                if let (true, Some(stdin)) = (w.1.ready, w.1.child.stdin.as_mut()) {
                    let _ = std::io::Write::write_all(stdin, b"stop\n");
                }
            }
        }
        for (i, w) in workers.iter_mut().enumerate() {
            if greedy(i) == pass {
                lines[i] = w
                    .lines
                    .by_ref()
                    .map_while(|l| l.ok())
                    .filter_map(|l| l.strip_prefix("result ").map(str::to_string))
                    .take(specs[i].threads)
                    .collect();
            }
        }
    }
    let mut reports = Vec::new();
    let mut note = String::new();
    for (i, mut w) in workers.into_iter().enumerate() {
        let status = w.child.wait().expect("wait for a worker");
        let parsed: Vec<Report> = lines[i]
            .iter()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        if w.ready && status.success() && parsed.len() == specs[i].threads {
            reports.extend(parsed.into_iter().map(Some));
            continue;
        }
        if note.is_empty() {
            let mut err = String::new();
            let _ = w.child.stderr.as_mut().unwrap().read_to_string(&mut err);
            note = failure(&err);
            if note.is_empty() {
                note = format!("a worker ended with {status} and printed nothing on stderr");
            }
        }
        reports.extend(std::iter::repeat_n(None, specs[i].threads));
    }
    Outcome {
        reports,
        note,
        footprint,
    }
}

/// What a failed worker's standard error says went wrong: its panic's message, else its last
/// lines.
fn failure(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    match lines.iter().position(|l| l.contains("panicked at")) {
        Some(i) => lines[i..(i + 2).min(lines.len())].join(" "),
        None => lines
            .iter()
            .rev()
            .take(3)
            .rev()
            .copied()
            .collect::<Vec<_>>()
            .join(" | "),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The figures of clients that ran together: each unit of work summed over the clients and
/// divided by the wall clock from the first client's start to the last one's end (`<unit>_per_s`,
/// and `wall_s`); latencies pooled over the clients (`median_us`, `p99_us`); each client's own
/// figures averaged. Only finite numbers are kept.
pub(crate) fn aggregate(reports: &[&Report]) -> BTreeMap<String, f64> {
    let mut values = BTreeMap::new();
    if reports.is_empty() {
        return values;
    }
    let first = reports
        .iter()
        .map(|r| r.start_s)
        .fold(f64::INFINITY, f64::min);
    let last = reports
        .iter()
        .map(|r| r.end_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let wall = last - first;
    values.insert("wall_s".to_string(), wall);
    let mut work: BTreeMap<&str, f64> = BTreeMap::new();
    for r in reports {
        for (unit, n) in &r.work {
            *work.entry(unit).or_default() += n;
        }
    }
    for (unit, n) in work.into_iter().filter(|(_, n)| *n > 0.0) {
        values.insert(format!("{unit}_per_s"), n / wall);
    }
    let mut samples: Vec<f64> = reports.iter().flat_map(|r| r.samples_us.clone()).collect();
    if !samples.is_empty() {
        samples.sort_by(f64::total_cmp);
        values.insert("median_us".to_string(), percentile(&samples, 0.5));
        values.insert("p99_us".to_string(), percentile(&samples, 0.99));
    }
    for k in reports[0].values.keys() {
        let sum: f64 = reports.iter().filter_map(|r| r.values.get(k)).sum();
        values.insert(k.clone(), sum / reports.len() as f64);
    }
    values.retain(|_, v| v.is_finite());
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(start_s: f64, end_s: f64, kernels: f64, samples_us: &[f64]) -> Report {
        Report {
            start_s,
            end_s,
            work: [("kernels".to_string(), kernels)].into(),
            samples_us: samples_us.to_vec(),
            values: [("rate".to_string(), kernels)].into(),
        }
    }

    #[test]
    fn the_aggregate_is_all_work_over_the_first_start_to_the_last_end() {
        // Two clients that overlap for part of the time: 300 kernels over 3 seconds of wall
        // clock, not over either client's own time.
        let a = report(10.0, 12.0, 100.0, &[1.0, 2.0]);
        let b = report(11.0, 13.0, 200.0, &[3.0, 4.0]);
        let v = aggregate(&[&a, &b]);
        assert_eq!(v["wall_s"], 3.0);
        assert_eq!(v["kernels_per_s"], 100.0);
        assert_eq!(v["median_us"], 3.0);
        assert_eq!(v["p99_us"], 4.0);
        assert_eq!(v["rate"], 150.0);
    }

    #[test]
    fn a_group_that_took_no_time_has_no_rate() {
        let a = report(5.0, 5.0, 10.0, &[]);
        let v = aggregate(&[&a]);
        assert!(!v.contains_key("kernels_per_s"), "{v:?}");
        assert!(v.values().all(|x| x.is_finite()));
    }

    #[test]
    fn one_context_uses_the_connections_the_server_sets() {
        let server = include_str!("../../mps-server/src/main.rs");
        let line = format!("const MAX_CONNECTIONS: &str = \"{SERVER_MAX_CONNECTIONS}\";");
        assert!(
            server.contains(&line),
            "mps-server no longer sets CUDA_DEVICE_MAX_CONNECTIONS to \
             {SERVER_MAX_CONNECTIONS}: update SERVER_MAX_CONNECTIONS to match"
        );
    }
}
