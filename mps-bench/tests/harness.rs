//! The benchmark's harness, run end to end against the simulator (the GPU figures come from the
//! H200; this keeps the harness itself from rotting where there is no GPU): every figure it
//! writes is a finite number, every record says how many clients completed of how many asked,
//! and the plot is an SVG document with the series it should draw.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Says that a test was skipped, and why, where `scripts/test` collects skips
/// (`MPS_TEST_SKIP_LOG`) and on stderr; under CI nothing may be skipped.
fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: {reason}; CI must build them"
    );
    if let Some(path) = std::env::var_os("MPS_TEST_SKIP_LOG") {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .expect("the skip log can be written");
    }
}

/// Runs `mps-bench <command> --backend sim ...` with the servers this build made and the test
/// kernels, writing into a fresh directory; returns its standard output (a markdown table) and
/// the directory, or None where the servers are not built.
fn bench(command: &str, args: &[&str]) -> Option<(String, PathBuf)> {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let server = bench.with_file_name("mps-server");
    if !server.exists() || !bench.with_file_name("mps-control").exists() {
        skip(
            command,
            "mps-server and mps-control are not built (cargo test --workspace builds them)",
        );
        return None;
    }
    // The tests of this file run at once: each run writes a directory of its own.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out =
        std::env::temp_dir().join(format!("mps-bench-{command}-{}-{run}", std::process::id()));
    let run = Command::new(&bench)
        .args([command, "--backend", "sim"])
        .args(args)
        .arg("--server")
        .arg(&server)
        .arg("--ptx")
        .arg(ptx())
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

fn ptx() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels/test_kernels.ptx")
}

/// The array of records or rows in `file`.
fn records(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v.as_array()
        .unwrap_or_else(|| panic!("{} is not an array: {text}", file.display()))
        .clone()
}

/// Checks that `r` has whole `asked` and `completed` counts, that every client completed, and
/// that each of its values is a finite number; returns its values.
fn checked(r: &Value) -> &serde_json::Map<String, Value> {
    let count = |k: &str| {
        r[k].as_u64()
            .unwrap_or_else(|| panic!("{k} is not a count in {r}"))
    };
    assert!(count("asked") > 0, "{r}");
    assert_eq!(count("completed"), count("asked"), "a client failed: {r}");
    let values = r["values"]
        .as_object()
        .unwrap_or_else(|| panic!("no values in {r}"));
    for (k, v) in values {
        let x = v
            .as_f64()
            .unwrap_or_else(|| panic!("{k} is not a number in {r}"));
        assert!(x.is_finite(), "{k} = {x} in {r}");
    }
    values
}

/// The texts of the SVG document `file` (which must parse as XML), trimmed.
fn svg_texts(file: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(file).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}: {svg}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_string())
        .collect()
}

#[test]
fn the_harness_runs_the_mps_mode_and_writes_finite_figures_and_a_plot() {
    let workloads = "spin,tiny,infer,infer-graph,rtt,launch-rate";
    let args = [
        "--modes",
        "mps",
        "--clients",
        "1,2",
        "--workloads",
        workloads,
    ];
    let Some((table, out)) = bench("run", &args) else {
        return;
    };
    let records = records(&out.join("bench.json"));
    // What each workload must report, per client count.
    let expected: [(&str, &[usize], &[&str]); 6] = [
        ("spin", &[1, 2], &["kernels_per_s", "wall_s"]),
        ("tiny", &[1, 2], &["kernels_per_s", "wall_s"]),
        ("infer", &[1, 2], &["requests_per_s", "median_us", "p99_us"]),
        (
            "infer-graph",
            &[1, 2],
            &["requests_per_s", "median_us", "p99_us"],
        ),
        ("rtt", &[1], &["median_us", "p99_us"]),
        ("launch-rate", &[1], &["launches_per_s", "with_sync_per_s"]),
    ];
    assert_eq!(
        records.len(),
        expected.iter().map(|e| e.1.len()).sum::<usize>(),
        "{records:?}"
    );
    for r in &records {
        checked(r);
    }
    for (workload, counts, keys) in expected {
        for n in counts {
            let r = records
                .iter()
                .find(|r| r["mode"] == "mps" && r["workload"] == workload && r["asked"] == *n)
                .unwrap_or_else(|| panic!("no mps {workload} N={n} record in {records:?}"));
            let values = checked(r);
            for k in keys {
                assert!(values.contains_key(*k), "no {k} in {r}");
            }
            let row = format!("| {workload} | {n} | completed | {n}/{n} |");
            assert!(table.contains(&row), "missing {row:?} in\n{table}");
        }
    }
    let texts = svg_texts(&out.join("throughput.svg"));
    for label in ["spin", "tiny", "infer", "mps", "clients", "requests/s"] {
        assert!(
            texts.iter().any(|t| t == label),
            "no {label:?} in {texts:?}"
        );
    }
    // `plot` draws the same figure and prints the same table again from the records.
    let again = out.join("again.svg");
    let plot = Command::new(env!("CARGO_BIN_EXE_mps-bench"))
        .args(["plot", "--json"])
        .arg(out.join("bench.json"))
        .arg("--out")
        .arg(&again)
        .output()
        .unwrap();
    assert!(plot.status.success());
    assert!(table.starts_with(&*String::from_utf8_lossy(&plot.stdout)));
    assert_eq!(
        std::fs::read_to_string(&again).unwrap(),
        std::fs::read_to_string(out.join("throughput.svg")).unwrap()
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// Whether mps's driver library is built next to mps-bench, building it first where it is not:
/// `cargo test` builds no cdylib for another package's tests (a cdylib is not linkable), so a
/// clean tree has none until something asks for it. Where cargo cannot build it, says the test is
/// skipped.
fn mps_cuda_built(test: &str) -> bool {
    static BUILT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let lib = bench.with_file_name("libmpscuda.so");
    let built = *BUILT.get_or_init(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "mps-cuda", "--lib"]);
        if bench.parent().is_some_and(|dir| dir.ends_with("release")) {
            cargo.arg("--release");
        }
        let status = cargo
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .status()
            .expect("cargo runs");
        status.success() && lib.exists()
    });
    if !built {
        skip(
            test,
            "libmpscuda.so could not be built (cargo build -p mps-cuda --lib)",
        );
    }
    built
}

#[test]
fn the_transparent_mode_runs_the_native_workers_through_mps_cuda() {
    if !mps_cuda_built("the_transparent_mode_runs_the_native_workers_through_mps_cuda") {
        return;
    }
    // The native workers as they are, through the library against a simulator server (the
    // library is found next to mps-bench, its default). Each worker checks that the driver it
    // loaded is that library before it makes a call, so a completed record is one measured
    // through it.
    let args = [
        "--modes",
        "mps,mps-transparent",
        "--clients",
        "1,2",
        "--workloads",
        "spin,infer,infer-graph,rtt,launch-rate",
    ];
    let Some((table, out)) = bench("run", &args) else {
        return;
    };
    let records = records(&out.join("bench.json"));
    // infer-graph: each worker captures its request with cuStreamBeginCapture and replays it
    // with cuGraphLaunch, through the library's stream capture.
    let expected: [(&str, &[usize], &[&str]); 5] = [
        ("spin", &[1, 2], &["kernels_per_s"]),
        ("infer", &[1, 2], &["requests_per_s", "p99_us"]),
        ("infer-graph", &[1, 2], &["requests_per_s", "p99_us"]),
        ("rtt", &[1], &["median_us", "p99_us"]),
        ("launch-rate", &[1], &["launches_per_s"]),
    ];
    let per_mode = expected.iter().map(|e| e.1.len()).sum::<usize>();
    assert_eq!(records.len(), 2 * per_mode, "{records:?}");
    for (workload, counts, keys) in expected {
        for n in counts {
            let r = records
                .iter()
                .find(|r| {
                    r["mode"] == "mps-transparent" && r["workload"] == workload && r["asked"] == *n
                })
                .unwrap_or_else(|| panic!("no mps-transparent {workload} N={n} in {records:?}"));
            let values = checked(r);
            for k in keys {
                assert!(values.contains_key(*k), "no {k} in {r}");
            }
            let row = format!("| {workload} | {n} | completed | {n}/{n} | {n}/{n} |");
            assert!(table.contains(&row), "missing {row:?} in\n{table}");
        }
    }
    let texts = svg_texts(&out.join("throughput.svg"));
    assert!(texts.iter().any(|t| t == "mps-transparent"), "{texts:?}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_transparent_worker_refuses_a_driver_library_other_than_the_one_named() {
    if !mps_cuda_built("a_transparent_worker_refuses_a_driver_library_other_than_the_one_named") {
        return;
    }
    // A worker whose library path leads to a libcuda.so other than the file it was told to
    // expect (here: mps's library, while the expected file is mps-run) must stop before its
    // first driver call, naming both.
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let links = std::env::temp_dir().join(format!("mps-bench-other-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&links);
    std::fs::create_dir_all(&links).unwrap();
    std::os::unix::fs::symlink(
        bench.with_file_name("libmpscuda.so"),
        links.join("libcuda.so"),
    )
    .unwrap();
    let expected = bench.with_file_name("mps-run");
    // The worker's start line must be an inherited pipe: bash hands it one as descriptor 3.
    let run = Command::new("bash")
        .args([
            "-c",
            "exec \"$0\" worker --mode mps-transparent --workload rtt --ptx \"$1\" \
             --start-fd 3 3< <(:)",
        ])
        .arg(&bench)
        .arg(ptx())
        .env("LD_LIBRARY_PATH", &links)
        .env("MPS_BENCH_LIBCUDA", &expected)
        .env("MPS_PIPE_DIRECTORY", links.join("no-server"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    let _ = std::fs::remove_dir_all(&links);
    assert!(!run.status.success(), "{stderr}");
    assert!(
        stderr.contains("loaded the CUDA driver from")
            && stderr.contains(&format!("not mps's library {}", expected.display())),
        "{stderr}"
    );
}

#[test]
fn the_quota_scenarios_run_on_the_simulator() {
    let Some((table, out)) = bench("quotas", &[]) else {
        return;
    };
    assert!(!table.contains("| note |"), "a worker failed:\n{table}");
    let rows = records(&out.join("quotas.json"));
    for r in &rows {
        checked(r);
    }
    let row = |scenario: &str, config: &str| {
        rows.iter()
            .find(|r| r["scenario"] == scenario && r["mode"] == "mps" && r["config"] == config)
            .unwrap_or_else(|| panic!("no mps {scenario} row for {config} in {rows:?}"))
    };
    // Every SM cap has its row with a rate. How the rate follows the cap is the benchmark's
    // figure (on the GPU), not this test's: on a loaded machine the simulator's times are not
    // the SMs' (the control suite checks the cap itself, by what ran where).
    for config in ["100%", "50%", "25%"] {
        assert!(row("sm-cap", config)["values"]["kernels_per_s"].is_f64());
    }
    for config in [
        "8 greedy",
        "8 greedy capped at 75%",
        "8 greedy, 25% reserved",
    ] {
        let r = row("isolation", config);
        assert_eq!(r["asked"], 9, "{r}");
        assert!(r["values"]["p99_us"].is_f64(), "{r}");
    }
    assert!(row("groups", "2 groups")["values"]["kernels_per_s"].is_f64());
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn scripts_bench_gpu_runs_the_parts_and_writes_its_files() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let built = bench.parent().unwrap();
    if !built.join("mps-server").exists() || !built.join("mps-control").exists() {
        skip(
            "scripts_bench_gpu_runs_the_parts_and_writes_its_files",
            "mps-server and mps-control are not built (cargo test --workspace builds them)",
        );
        return;
    }
    // The script stops what a failed part leaves running by the path of its programs: a folder
    // of this test's own (hard links, so the paths stay ours) keeps it off the other tests.
    let bin = built.join(format!("bench-gpu-test-{}", std::process::id()));
    let out = std::env::temp_dir().join(format!("mps-bench-gpu-{}", std::process::id()));
    std::fs::create_dir_all(&bin).unwrap();
    let transparent =
        mps_cuda_built("scripts_bench_gpu_runs_the_parts_and_writes_its_files: mps-transparent");
    let mut files = vec!["mps-bench", "mps-server", "mps-control"];
    if transparent {
        files.push("libmpscuda.so");
    }
    for b in &files {
        let _ = std::fs::remove_file(bin.join(b));
        std::fs::hard_link(built.join(b), bin.join(b)).unwrap();
    }
    let modes = if transparent {
        "mps,mps-transparent"
    } else {
        "mps"
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let run = Command::new(root.join("scripts/bench-gpu"))
        .arg(&bin)
        .arg(&out)
        .args(["--backend", "sim", "--modes", modes, "--clients", "1,2"])
        .args(["--workloads", "spin,infer", "--no-quotas", "--rounds", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let tables = std::fs::read_to_string(out.join("tables.md")).unwrap();
    assert!(
        tables.contains("| infer | 2 | completed | 2/2 |"),
        "{tables}"
    );
    if transparent {
        // The mps-transparent workers found the library in BIN_DIR (--mps-cuda-lib).
        assert!(
            tables.contains("| infer | 2 | completed | 2/2 | 2/2 |"),
            "{tables}"
        );
    }
    let log = std::fs::read_to_string(out.join("bench.log")).unwrap();
    for line in ["== run: ", "== total: ", "mps-server"] {
        assert!(log.contains(line), "no {line:?} in {log}");
    }
    let records = records(&out.join("bench.json"));
    for r in &records {
        checked(r);
    }
    // --rounds reached mps-bench: each group ran twice.
    let second = |r: &&Value| r["round"].as_u64() == Some(1);
    assert_eq!(records.iter().filter(second).count() * 2, records.len());
    svg_texts(&out.join("throughput.svg"));
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&bin);
}

/// `--requests` sets the infer workloads' requests per client (a longer run: a soak), every
/// output still checked; a count past what a workload can check exactly is refused at once,
/// naming the limit.
#[test]
fn requests_per_client_set_the_length_of_an_infer_run_within_what_is_checked() {
    let args = [
        "--modes",
        "mps",
        "--clients",
        "2",
        "--workloads",
        "infer",
        "--requests",
        "40",
    ];
    let Some((_, out)) = bench("run", &args) else {
        return;
    };
    let records = records(&out.join("bench.json"));
    let v = checked(&records[0]);
    let done = v["requests_per_s"].as_f64().unwrap() * v["wall_s"].as_f64().unwrap();
    assert!(
        (done - 80.0).abs() < 1e-6,
        "2 clients of 40 requests made {done}: {records:?}"
    );
    let _ = std::fs::remove_dir_all(&out);

    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let refused = Command::new(&bench)
        .args([
            "run",
            "--backend",
            "sim",
            "--modes",
            "mps",
            "--clients",
            "1",
        ])
        .args(["--workloads", "infer-vary", "--requests", "601"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("at most 600 requests"), "{err}");
}

/// `--rounds` runs every mode that many times, a record per round, and `--scale` multiplies the
/// launches of the launch workloads; naming a mode twice is refused, pointing at `--rounds`.
#[test]
fn rounds_repeat_every_mode_and_scale_lengthens_the_launch_workloads() {
    let args = [
        "--modes",
        "mps",
        "--clients",
        "1",
        "--workloads",
        "tiny",
        "--rounds",
        "2",
        "--scale",
        "2",
    ];
    let Some((table, out)) = bench("run", &args) else {
        return;
    };
    let records = records(&out.join("bench.json"));
    let rounds: Vec<u64> = records
        .iter()
        .map(|r| r["round"].as_u64().unwrap())
        .collect();
    assert_eq!(rounds, [0, 1], "{records:?}");
    for r in &records {
        let v = checked(r);
        let done = v["kernels_per_s"].as_f64().unwrap() * v["wall_s"].as_f64().unwrap();
        assert!(
            (done - 10_000.0).abs() < 1e-3,
            "tiny at scale 2 launched {done}: {r}"
        );
    }
    assert!(table.contains("| tiny | 1 | kernels_per_s |"), "{table}");
    let _ = std::fs::remove_dir_all(&out);

    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let refused = Command::new(&bench)
        .args(["run", "--backend", "sim", "--modes", "mps,native,mps"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(err.contains("mps is named twice; --rounds"), "{err}");
}
