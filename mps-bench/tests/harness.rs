//! The benchmark's harness, run end to end against the simulator (the GPU figures come from the
//! H200; this keeps the harness itself from rotting where there is no GPU).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_harness_runs_the_mps_mode_and_writes_its_outputs() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_mps-bench"));
    let server = bench.with_file_name("mps-server");
    if !server.exists() {
        println!(
            "skipped: {} is not built (cargo test --workspace builds it)",
            server.display()
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("mps-bench-test-{}", std::process::id()));
    let ptx = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../kernels/test_kernels.ptx");
    let run = Command::new(&bench)
        .args([
            "run",
            "--modes",
            "mps",
            "--backend",
            "sim",
            "--clients",
            "1,2",
            "--workloads",
            "spin,rtt",
            "--server",
        ])
        .arg(&server)
        .arg("--ptx")
        .arg(&ptx)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{table}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for row in [
        "| spin | 1 | kernels_per_s |",
        "| spin | 2 | kernels_per_s |",
        "| rtt | 1 | median_us |",
    ] {
        assert!(table.contains(row), "missing {row:?} in\n{table}");
    }
    let json = std::fs::read_to_string(out.join("bench.json")).unwrap();
    assert!(
        json.contains(
            "\"mode\": \"mps\", \"workload\": \"spin\", \"clients\": 2, \"completed\": 2"
        ),
        "{json}"
    );
    let png = std::fs::read(out.join("throughput.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    let _ = std::fs::remove_dir_all(&out);
}
