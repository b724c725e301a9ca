//! `mps-bench quotas`: what SM shares, SM reservations and separate groups do, side by side
//! with NVIDIA MPS (and native CUDA where it has an equivalent).
//!
//! - sm-cap: one client runs kernels as wide as the device (264 blocks of 1024 threads on an
//!   H200) under a share of 100, 50 and 25 percent.
//! - isolation: one latency-sensitive client (launch one tiny kernel, wait, 2000 times) beside 8
//!   greedy clients that keep every SM they can reach busy; without protection, with NVIDIA's
//!   remedy (capping the greedy clients to 75 percent) and with mps's (25 percent reserved, and
//!   the greedy clients capped to 75 percent as under NVIDIA MPS). Each loaded row is set
//!   against NVIDIA MPS both uncapped and capped.
//! - groups: two clients of the spin workload in one server, and in two groups (two servers,
//!   two contexts, time-sliced by the GPU); native CUDA's two processes for reference.

use std::collections::BTreeMap;
use std::path::Path;

use crate::group::{Spec, aggregate, run_group};
use crate::service::Service;

/// One measured configuration.
#[derive(Debug, serde::Serialize)]
struct Row {
    scenario: &'static str,
    mode: &'static str,
    config: String,
    asked: usize,
    completed: usize,
    values: BTreeMap<String, f64>,
    note: String,
}

/// Runs the workers of one configuration: the figures of the first (the client under test),
/// and where every client counts kernels, the throughput of all.
fn measure(
    scenario: &'static str,
    (mode, service): (&'static str, &Service),
    config: &str,
    specs: &[Spec],
    ptx: &Path,
) -> Row {
    let outcome = run_group(mode, service, specs, ptx, false);
    let mut values = BTreeMap::new();
    if let Some(Some(first)) = outcome.reports.first() {
        values = aggregate(&[first]);
        values.retain(|k, _| k != "kernels_per_s" && k != "wall_s");
    }
    let done: Vec<_> = outcome.reports.iter().flatten().collect();
    let asked = outcome.reports.len();
    if !done.is_empty() && done.iter().all(|r| r.work.contains_key("kernels")) {
        values.extend(aggregate(&done).remove_entry("kernels_per_s"));
    }
    let note = if done.len() < asked {
        format!("{} worker(s) failed: {}", asked - done.len(), outcome.note)
    } else {
        String::new()
    };
    eprintln!(
        "{scenario} {mode} {config}: {}/{asked} {values:?} {note}",
        done.len()
    );
    Row {
        scenario,
        mode,
        config: config.into(),
        asked,
        completed: done.len(),
        values,
        note,
    }
}

/// The isolation scenario's workers: the rtt client (with `env`) and 8 greedy ones (with
/// `greedy_env`).
fn loaded(env: &[(&str, &str)], greedy_env: &[(&str, &str)]) -> Vec<Spec> {
    let mut specs = vec![Spec::new("rtt-short", env)];
    specs.extend(std::iter::repeat_n(Spec::new("greedy", greedy_env), 8));
    specs
}

/// The isolation rows' greedy clients capped as NVIDIA MPS users cap them.
const CAPPED: &str = "8 greedy capped at 75%";

/// Runs every scenario; writes quotas.json and returns the markdown table.
pub(crate) fn run(ptx: &Path, server: &Path, backend: &str, out: &Path) -> String {
    let mut rows = Vec::new();
    let nv_share = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
    let share = "MPS_ACTIVE_THREAD_PERCENTAGE";
    let wide = |env: &[(&str, &str)]| vec![Spec::new("wide", env)];
    let rtt = [Spec::new("rtt-short", &[])];

    if backend == "cuda" {
        let native = ("native", &Service::None);
        rows.push(measure("sm-cap", native, "100%", &wide(&[]), ptx));
        rows.push(measure("isolation", native, "unloaded", &rtt, ptx));
        let two = vec![Spec::new("spin", &[]); 2];
        rows.push(measure("groups", native, "2 processes", &two, ptx));

        let service = Service::start("nvidia-mps", server, backend, "");
        let nv = ("nvidia-mps", &service);
        for p in ["100", "50", "25"] {
            let config = format!("{p}%");
            rows.push(measure("sm-cap", nv, &config, &wide(&[(nv_share, p)]), ptx));
        }
        rows.push(measure("isolation", nv, "unloaded", &rtt, ptx));
        rows.push(measure("isolation", nv, "8 greedy", &loaded(&[], &[]), ptx));
        let capped = loaded(&[], &[(nv_share, "75")]);
        rows.push(measure("isolation", nv, CAPPED, &capped, ptx));
    }

    let service = Service::start("mps", server, backend, "");
    let mps = ("mps", &service);
    for p in ["100", "50", "25"] {
        let config = format!("{p}%");
        rows.push(measure("sm-cap", mps, &config, &wide(&[(share, p)]), ptx));
    }
    rows.push(measure("isolation", mps, "unloaded", &rtt, ptx));
    rows.push(measure(
        "isolation",
        mps,
        "8 greedy",
        &loaded(&[], &[]),
        ptx,
    ));
    let capped = loaded(&[], &[(share, "75")]);
    rows.push(measure("isolation", mps, CAPPED, &capped, ptx));
    let reserved = loaded(&[("MPS_SM_RESERVE", "25")], &[]);
    rows.push(measure(
        "isolation",
        mps,
        "8 greedy, 25% reserved",
        &reserved,
        ptx,
    ));
    drop(service);

    let service = Service::start("mps-daemon", server, backend, "");
    let daemon = ("mps", &service);
    let same = vec![Spec::new("spin", &[("MPS_GROUP", "a")]); 2];
    rows.push(measure("groups", daemon, "1 group", &same, ptx));
    let apart = [
        Spec::new("spin", &[("MPS_GROUP", "a")]),
        Spec::new("spin", &[("MPS_GROUP", "b")]),
    ];
    rows.push(measure("groups", daemon, "2 groups", &apart, ptx));
    drop(service);

    std::fs::create_dir_all(out).unwrap_or_else(|e| panic!("cannot create {}: {e}", out.display()));
    let json = serde_json::to_string_pretty(&rows).expect("rows are plain data");
    std::fs::write(out.join("quotas.json"), json).expect("write quotas.json");
    table(&rows)
}

/// `a`'s figure `k` against `reference`'s, where both ran with every client and both have it.
fn ratio(a: &Row, reference: Option<&Row>, k: &str) -> String {
    let Some(b) = reference else {
        return String::new();
    };
    if (a.completed, a.asked) != (b.completed, b.asked) {
        return format!(
            "not comparable ({}/{} vs {}/{})",
            a.completed, a.asked, b.completed, b.asked
        );
    }
    match (a.values.get(k), b.values.get(k)) {
        (Some(x), Some(y)) if *y != 0.0 => match x / y {
            x if x < 0.1 => format!("{x:.3}x"),
            x => format!("{x:.2}x"),
        },
        _ => "—".into(),
    }
}

/// Every row with the figures that matter for its scenario, and each against its reference: in
/// sm-cap the same mode at 100%, in groups mps in one group, in isolation NVIDIA MPS with 8
/// greedy clients, uncapped and capped at 75% (unloaded latencies and medians are context, not
/// a comparison).
fn table(rows: &[Row]) -> String {
    let find = |scenario: &str, mode: &str, config: &str| {
        rows.iter()
            .find(|r| r.scenario == scenario && r.mode == mode && r.config == config)
    };
    let mut s = String::from(
        "| scenario | mode | configuration | completed | figure | value | vs reference \
         | vs NVIDIA MPS capped at 75% |\n",
    );
    s += "| --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for r in rows {
        let (keys, reference, capped) = match r.scenario {
            "sm-cap" => (&["kernels_per_s"][..], find("sm-cap", r.mode, "100%"), None),
            "isolation" => (
                &["median_us", "p99_us"][..],
                find("isolation", "nvidia-mps", "8 greedy"),
                find("isolation", "nvidia-mps", CAPPED),
            ),
            _ => (
                &["kernels_per_s"][..],
                find("groups", "mps", "1 group"),
                None,
            ),
        };
        for k in keys {
            let value = r.values.get(*k).map_or("—".into(), |v| format!("{v:.1}"));
            let compared = *k != "median_us" && r.config != "unloaded";
            let (vs, vs_capped) = match compared {
                true => (ratio(r, reference, k), ratio(r, capped, k)),
                false => (String::new(), String::new()),
            };
            s += &format!(
                "| {} | {} | {} | {}/{} | {k} | {value} | {vs} | {vs_capped} |\n",
                r.scenario, r.mode, r.config, r.completed, r.asked
            );
        }
        if !r.note.is_empty() {
            s += &format!(
                "| {} | {} | {} | | note | {} | | |\n",
                r.scenario, r.mode, r.config, r.note
            );
        }
    }
    s
}
