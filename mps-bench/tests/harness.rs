//! The benchmark's harness, run end to end against the simulator (the GPU figures come from the
//! H200; this keeps the harness itself from rotting where there is no GPU).

use std::path::PathBuf;
use std::process::Command;

/// Runs `mps-bench <command> --backend sim ...` with the servers this build made and the test
/// kernels, writing into a fresh directory; returns its standard output (a markdown table) and
/// the directory, or None where the servers are not built.
fn bench(command: &str, args: &[&str]) -> Option<(String, PathBuf)> {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let server = bench.with_file_name("mps-server");
    if !server.exists() || !bench.with_file_name("mps-control").exists() {
        println!(
            "skipped: mps-server and mps-control are not built (cargo test --workspace builds them)"
        );
        return None;
    }
    let out = std::env::temp_dir().join(format!("mps-bench-{command}-{}", std::process::id()));
    let ptx = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels/test_kernels.ptx");
    let run = Command::new(&bench)
        .args([command, "--backend", "sim"])
        .args(args)
        .arg("--server")
        .arg(&server)
        .arg("--ptx")
        .arg(&ptx)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    Some((table, out))
}

#[test]
fn the_harness_runs_the_mps_mode_and_writes_its_outputs() {
    let Some((table, out)) = bench(
        "run",
        &[
            "--modes",
            "mps",
            "--clients",
            "1,2",
            "--workloads",
            "spin,rtt",
        ],
    ) else {
        return;
    };
    for row in [
        "| spin | 1 | kernels_per_s |",
        "| spin | 2 | kernels_per_s |",
        "| rtt | 1 | median_us |",
    ] {
        assert!(table.contains(row), "missing {row:?} in\n{table}");
    }
    let json = std::fs::read_to_string(out.join("bench.json")).unwrap();
    let records: serde_json::Value = serde_json::from_str(&json).unwrap();
    let spin2 = records
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["mode"] == "mps" && r["workload"] == "spin" && r["clients"] == 2)
        .unwrap_or_else(|| panic!("no mps spin N=2 record in {json}"));
    assert_eq!(spin2["completed"], 2, "{json}");
    let svg = std::fs::read_to_string(out.join("throughput.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}: {svg}"));
    let texts: Vec<&str> = doc
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    for label in ["spin", "mps", "clients"] {
        assert!(
            texts.contains(&label),
            "no {label:?} in the plot's text {texts:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_quota_scenarios_run_on_the_simulator() {
    let Some((table, out)) = bench("quotas", &[]) else {
        return;
    };
    assert!(!table.contains("| note |"), "a worker failed:\n{table}");
    // The simulator runs a kernel's blocks in waves of the client's SMs, so the cap shows.
    let ratio = |config: &str| -> f64 {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| sm-cap | mps | {config} |")))
            .unwrap_or_else(|| panic!("no sm-cap row for {config}:\n{table}"));
        row.split('|')
            .nth(6)
            .unwrap()
            .trim()
            .trim_end_matches('x')
            .parse()
            .unwrap()
    };
    assert!((0.4..0.6).contains(&ratio("50%")), "{table}");
    assert!((0.2..0.3).contains(&ratio("25%")), "{table}");
    for row in [
        "| isolation | mps | 8 greedy, 25% reserved | p99_us |",
        "| groups | mps | 2 groups | kernels_per_s |",
    ] {
        assert!(table.contains(row), "no row {row}:\n{table}");
    }
    let json = std::fs::read_to_string(out.join("quotas.json")).unwrap();
    assert!(json.contains("\"scenario\": \"isolation\""), "{json}");
    let _ = std::fs::remove_dir_all(&out);
}
