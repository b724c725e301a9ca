//! `mps-bench quotas`: what SM shares, SM reservations and separate groups do, side by side
//! with NVIDIA MPS (and native CUDA where it has an equivalent).
//!
//! - sm-cap: one client runs kernels as wide as the device (264 blocks of 1024 threads on an
//!   H200) under a share of 100, 50 and 25 percent.
//! - isolation: one latency-sensitive client (launch one tiny kernel, wait, 2000 times) beside 8
//!   greedy clients that keep every SM they can reach busy; without protection, with NVIDIA's
//!   remedy (capping the greedy clients to 75 percent) and with mps's (25 percent reserved).
//! - groups: two clients of the spin workload in one server, and in two groups (two servers,
//!   two contexts, time-sliced by the GPU); native CUDA's two processes for reference.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Service, Spec, run_group, throughput};

/// One measured configuration.
#[derive(serde::Serialize)]
struct Row {
    scenario: &'static str,
    mode: &'static str,
    config: String,
    values: BTreeMap<String, f64>,
    note: String,
}

/// Runs the workers of one configuration and keeps the values of the first (the client under
/// test), adding the throughput of all where they report kernels.
fn measure(
    scenario: &'static str,
    mode: &'static str,
    config: &str,
    specs: &[Spec],
    ptx: &Path,
) -> Row {
    let outcome = run_group(mode, specs, ptx, false);
    let mut values = BTreeMap::new();
    let failed = outcome.results.iter().filter(|r| r.is_none()).count();
    if let Some(Some(first)) = outcome.results.first() {
        values.extend(first.iter().map(|(k, v)| (k.clone(), *v)));
    }
    let done: Vec<_> = outcome.results.iter().flatten().collect();
    if !done.is_empty() && done.iter().all(|r| r.contains_key("kernels")) {
        values.insert("kernels_per_s".into(), throughput(&done).0);
    }
    let note = if failed > 0 {
        format!("{failed} worker(s) failed: {}", outcome.note)
    } else {
        String::new()
    };
    eprintln!("{scenario} {mode} {config}: {values:?} {note}");
    Row {
        scenario,
        mode,
        config: config.into(),
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

/// Runs every scenario; writes quotas.json and returns the markdown table.
pub(crate) fn run(ptx: &Path, server: &Path, backend: &str, out: &Path) -> String {
    let mut rows = Vec::new();
    let nv_share = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
    let share = "MPS_ACTIVE_THREAD_PERCENTAGE";
    let wide = |env: &[(&str, &str)]| vec![Spec::new("wide", env)];

    if backend == "cuda" {
        rows.push(measure("sm-cap", "native", "100%", &wide(&[]), ptx));
        let rtt = [Spec::new("rtt-short", &[])];
        rows.push(measure("isolation", "native", "unloaded", &rtt, ptx));
        let two = vec![Spec::new("spin", &[]); 2];
        rows.push(measure("groups", "native", "2 processes", &two, ptx));

        let nv = Service::start("nvidia-mps", server, backend, "");
        for p in ["100", "50", "25"] {
            let config = format!("{p}%");
            rows.push(measure(
                "sm-cap",
                "nvidia-mps",
                &config,
                &wide(&[(nv_share, p)]),
                ptx,
            ));
        }
        rows.push(measure("isolation", "nvidia-mps", "unloaded", &rtt, ptx));
        let plain = loaded(&[], &[]);
        rows.push(measure("isolation", "nvidia-mps", "8 greedy", &plain, ptx));
        let capped = loaded(&[], &[(nv_share, "75")]);
        let config = "8 greedy capped at 75%";
        rows.push(measure("isolation", "nvidia-mps", config, &capped, ptx));
        drop(nv);
    }

    let mps = Service::start("mps", server, backend, "");
    for p in ["100", "50", "25"] {
        let config = format!("{p}%");
        rows.push(measure("sm-cap", "mps", &config, &wide(&[(share, p)]), ptx));
    }
    let rtt = [Spec::new("rtt-short", &[])];
    rows.push(measure("isolation", "mps", "unloaded", &rtt, ptx));
    rows.push(measure(
        "isolation",
        "mps",
        "8 greedy",
        &loaded(&[], &[]),
        ptx,
    ));
    let reserved = loaded(&[("MPS_SM_RESERVE", "25")], &[]);
    let config = "8 greedy, 25% reserved";
    rows.push(measure("isolation", "mps", config, &reserved, ptx));
    drop(mps);

    let daemon = Service::start("mps-daemon", server, backend, "");
    let same = vec![Spec::new("spin", &[("MPS_GROUP", "a")]); 2];
    rows.push(measure("groups", "mps", "1 group", &same, ptx));
    let apart = [
        Spec::new("spin", &[("MPS_GROUP", "a")]),
        Spec::new("spin", &[("MPS_GROUP", "b")]),
    ];
    rows.push(measure("groups", "mps", "2 groups", &apart, ptx));
    drop(daemon);

    std::fs::create_dir_all(out).unwrap();
    std::fs::write(
        out.join("quotas.json"),
        serde_json::to_string_pretty(&rows).unwrap(),
    )
    .unwrap();
    table(&rows)
}

/// Every row with the figures that matter for its scenario, and each against its reference: in
/// sm-cap the same mode at 100%, in isolation NVIDIA MPS with 8 greedy clients, in groups mps in
/// one group.
fn table(rows: &[Row]) -> String {
    let get = |r: &Row, k: &str| r.values.get(k).copied();
    let find = |scenario: &str, mode: &str, config: &str| {
        rows.iter()
            .find(|r| r.scenario == scenario && r.mode == mode && r.config == config)
    };
    let mut s =
        String::from("| scenario | mode | configuration | figure | value | vs reference |\n");
    s += "| --- | --- | --- | --- | --- | --- |\n";
    for r in rows {
        let (key, reference) = match r.scenario {
            "sm-cap" => ("kernels_per_s", find("sm-cap", r.mode, "100%")),
            "isolation" => ("p99_us", find("isolation", "nvidia-mps", "8 greedy")),
            _ => ("kernels_per_s", find("groups", "mps", "1 group")),
        };
        let mut keys = vec![key];
        if r.scenario == "isolation" {
            keys.insert(0, "median_us");
        }
        for k in keys {
            let value = get(r, k).map_or("—".into(), |v| format!("{v:.1}"));
            // Unloaded latencies are context, not a comparison.
            let compared = k != "median_us" && r.config != "unloaded";
            let ratio = match (get(r, k), reference.and_then(|x| get(x, k))) {
                (Some(a), Some(b)) if b != 0.0 && compared => match a / b {
                    x if x < 0.1 => format!("{x:.3}x"),
                    x => format!("{x:.2}x"),
                },
                _ => "—".into(),
            };
            s += &format!(
                "| {} | {} | {} | {k} | {value} | {ratio} |\n",
                r.scenario, r.mode, r.config
            );
        }
        if !r.note.is_empty() {
            s += &format!(
                "| {} | {} | {} | note | {} | |\n",
                r.scenario, r.mode, r.config, r.note
            );
        }
    }
    s
}
