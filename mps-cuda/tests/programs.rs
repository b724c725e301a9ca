//! Driver-API programs in C, built with `-Wall -Wextra -Werror` against nothing but this
//! library (`-lcuda`, or `dlopen("libcuda.so.1")`), run through `mps-run` against a real server
//! (the simulator; `MPS_TEST_BACKEND=cuda` for a GPU). Each prints "all checks passed" when
//! every CUDA result and every value it checks is what CUDA documents; natively (NVIDIA's
//! driver, scripts/cuda-runtime-compare) each prints the same. Checks of what CUDA leaves
//! undefined or of mps's own refusals and limits run only with `MPS_ONLY=1`, as here; programs
//! that check nothing else (`requires_mps`) are not run natively.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::Instant;

use common::{DEADLINE, Daemon, Row, Server, backend, built, crate_dir, root, skip, temp_dir};

/// A directory holding `libcuda.so`, a link to this build's library, for the linker's `-lcuda`
/// (the program records the library's soname, `libcuda.so.1`, as NVIDIA's does).
fn link_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = temp_dir("link");
        std::os::unix::fs::symlink(built().join("libmpscuda.so"), dir.join("libcuda.so")).unwrap();
        dir
    })
}

/// Compiles `tests/c/<name>.c`, linked with `-lcuda` against this build's library.
fn build(name: &str) -> PathBuf {
    let src = crate_dir().join("tests/c");
    let exe = temp_dir(name).join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread"])
        .arg("-I")
        .arg(&src)
        .arg(src.join(format!("{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(link_dir())
        .args(["-lcuda", "-ldl"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
    assert!(status.success(), "compiling {name}.c failed");
    exe
}

/// Runs `exe` through mps-run against the server or daemon of pipe directory `dir`, with `env`
/// added, and with the checks that hold only through mps turned on (`MPS_ONLY=1`, see
/// `mps_only()` in tests/c/cuda_api.h).
fn run(exe: &Path, dir: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(built().join("mps-run"))
        .arg(exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", dir)
        .env("MPS_ONLY", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Runs program `name`; it must pass every check. Returns its stdout and stderr.
fn passes(name: &str, env: &[(&str, &str)]) -> (String, String) {
    passes_on(name, env, &Server::start())
}

/// As [`passes`], against `server`.
fn passes_on(name: &str, env: &[(&str, &str)], server: &Server) -> (String, String) {
    let exe = build(name);
    let out = run(&exe, &server.dir, env);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{name} failed ({}):\n{stdout}\n{stderr}\nserver log:\n{}",
        out.status,
        server.log()
    );
    (stdout, stderr)
}

#[test]
fn vector_add_with_modules_libraries_and_both_ways_of_passing_parameters() {
    passes("vector_add", &[]);
}

#[test]
fn mps_run_makes_the_program_load_this_library() {
    // Only this library knows of mps servers: with none in the pipe directory, the program's
    // cuInit fails with this library's message, whatever other libcuda.so.1 the machine has.
    let exe = build("vector_add");
    let empty = temp_dir("no-server");
    let out = Command::new(built().join("mps-run"))
        .arg(&exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &empty)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("mps-cuda: no device: cannot reach an mps server"),
        "{stderr}"
    );
    assert!(stderr.contains("cuInit(0) returned 100"), "{stderr}");
}

#[test]
fn context_limits_kernel_attributes_and_occupancy() {
    let server = Server::start();
    passes_on("kernel_queries", &[], &server);
    // The figure asked again before each launch came from the library: no question reached
    // the server inside the launches' run (each would have ended it).
    let enders = server.wait_for_log_line("runs ended by");
    assert!(!enders.contains("occupancy"), "{enders}");
}

#[test]
fn context_ids_events_of_a_whole_context_and_its_sm_resource() {
    let (stdout, _) = passes("context_wide", &[]);
    assert!(
        stdout.contains("cuCtxRecordEvent: waits for every stream"),
        "{stdout}"
    );
    assert!(
        stdout.contains("cuCtxWaitEvent: every stream waits"),
        "{stdout}"
    );
}

#[test]
fn streams_events_and_the_legacy_default_stream() {
    passes("streams_events", &[]);
}

#[test]
fn pinned_host_memory_with_async_copies_and_memsets() {
    passes("pinned_memset", &[]);
}

#[test]
fn the_multiprocessor_count_is_the_clients_share() {
    if backend() == "sim" {
        // Half of the simulator's 16 SMs.
        passes(
            "sm_share",
            &[("MPS_ACTIVE_THREAD_PERCENTAGE", "50"), ("EXPECT_SMS", "8")],
        );
        // Without a share, the whole device.
        passes("sm_share", &[("EXPECT_SMS", "16")]);
        return;
    }
    // On a GPU the share is whole units of SMs (8 on an H200), rounded up: at least half of the
    // device's SMs and fewer than all of them.
    let count = |env: &[(&str, &str)]| -> u32 {
        let (stdout, _) = passes("sm_share", env);
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix("multiprocessor count "))
            .unwrap_or_else(|| panic!("sm_share printed no multiprocessor count: {stdout}"));
        line.trim().parse().unwrap()
    };
    let whole = count(&[]);
    let half = count(&[("MPS_ACTIVE_THREAD_PERCENTAGE", "50")]);
    assert!(
        half * 2 >= whole && half < whole,
        "a 50% share is told {half} of the device's {whole} SMs"
    );
}

#[test]
fn a_synchronous_copy_has_landed_before_a_non_blocking_stream_reads_it() {
    // On the simulator each copy takes 5 ms before its bytes land: a kernel on another stream
    // queued before the copy is done reads what was there before.
    let server = if backend() == "sim" {
        Server::start_with(&["--sim-copy-latency-us", "5000"])
    } else {
        Server::start()
    };
    passes_on("copy_order", &[], &server);
}

#[test]
fn nvidias_variable_names_stand_in_for_unset_mps_ones() {
    // A setup made for NVIDIA's MPS: its pipe directory and client limits, no MPS_* variable.
    let server = Server::start();
    let nvidia = |name: &str, env: &[(&str, &str)]| {
        let out = Command::new(built().join("mps-run"))
            .arg(build(name))
            .arg(root().join("kernels/test_kernels.ptx"))
            .env_remove("MPS_PIPE_DIRECTORY")
            .env("CUDA_MPS_PIPE_DIRECTORY", &server.dir)
            .env("MPS_ONLY", "1")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success() && stdout.contains("all checks passed"),
            "{name} with {env:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    nvidia(
        "mem_limit",
        &[("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M")],
    );
    if backend() == "sim" {
        nvidia(
            "sm_share",
            &[
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50"),
                ("EXPECT_SMS", "8"),
            ],
        );
        // mps's own name wins where both are set.
        nvidia(
            "sm_share",
            &[
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50"),
                ("MPS_ACTIVE_THREAD_PERCENTAGE", "25"),
                ("EXPECT_SMS", "4"),
            ],
        );
    }
}

#[test]
fn virtual_memory_reserved_mapped_grown_and_freed_as_xla_and_pytorch_do() {
    passes("vmm", &[]);
    // Physical memory counts against the client's limit, refused past it as out of memory.
    passes(
        "vmm",
        &[
            ("MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M"),
            ("EXPECT_LIMIT_MB", "64"),
        ],
    );
}

#[test]
fn pointer_queries_on_device_host_pageable_and_mapped_memory() {
    passes("pointer_queries", &[]);
}

#[test]
fn unified_copies_between_device_pinned_and_pageable_memory_and_2d_rows() {
    passes("unified_copy", &[]);
}

#[test]
fn stream_ordered_allocation_reuses_blocks_in_stream_order_within_the_limit() {
    passes("mem_pool", &[]);
    // Pool memory counts against the client's limit; past it, out of memory from the call.
    passes(
        "mem_pool",
        &[
            ("MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M"),
            ("EXPECT_LIMIT_MB", "64"),
        ],
    );
}

#[test]
fn mem_get_info_reports_the_client_memory_limit() {
    passes("mem_limit", &[("MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M")]);
}

#[test]
fn host_functions_run_in_stream_order_and_a_pending_one_does_not_hold_the_server() {
    let server = Server::start();
    let exe = build("host_func");
    for env in [&[][..], &[("PENDING_EXIT", "1")][..]] {
        let out = run(&exe, &server.dir, env);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("all checks passed"),
            "host_func with {env:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The client that left with a function pending is released: its stream, waiting for the
    // function, does not hold its session.
    let started = Instant::now();
    while server.log().matches("client disconnected").count() < 2 {
        assert!(
            started.elapsed() < DEADLINE,
            "a client that left with a host function pending was not released; log:\n{}",
            server.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn threads_have_their_own_current_context_and_streams() {
    passes("threads", &[]);
}

#[test]
fn proc_addresses_by_version_and_unsupported_functions_refused_once() {
    let (_, stderr) = passes("proc_unsupported", &[]);
    let said = stderr
        .lines()
        .filter(|l| l.contains("cuGraphDebugDotPrint is not supported through mps"))
        .count();
    assert_eq!(said, 1, "{stderr}");
    assert!(
        stderr.contains("cuGetExportTable(69a28e9f24498b47b030c5da330ea4e9) is not supported"),
        "{stderr}"
    );
}

#[test]
fn a_tiled_tensor_map_is_encoded_by_the_server_and_refused_as_cuda_documents() {
    passes("tensor_map", &[]);
}

#[test]
fn a_modules_kernels_are_listed_named_and_walked_as_cufft_walks_them() {
    passes("module_functions", &[]);
}

#[test]
fn the_export_tables_behave_as_the_runtime_expects() {
    passes("export_tables", &[]);
}

#[test]
fn a_kernel_fault_surfaces_at_the_next_synchronising_call() {
    passes("async_error", &[]);
}

/// A program that holds what it made (`MPS_TEST_HOLD`): it has printed "holding" once its
/// work was done, and keeps its resources until its stdin closes.
struct Holding {
    child: std::process::Child,
    pid: u32,
    lines: mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<()>,
    printed: String,
}

/// Runs `exe` through mps-run against `daemon` with `MPS_TEST_HOLD` and `env`, and waits until
/// it holds.
fn hold(exe: &Path, daemon: &Daemon, env: &[(&str, &str)]) -> Holding {
    let mut child = Command::new(built().join("mps-run"))
        .arg(exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &daemon.dir)
        .env("MPS_ONLY", "1")
        .env("MPS_TEST_HOLD", "1")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // mps-run executes the program in its own process: the pid is the program's.
    let pid = child.id();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut printed = String::new();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                printed.push_str(&line);
                printed.push('\n');
                if line == "holding" {
                    break;
                }
            }
            Err(e) => {
                let _ = child.kill();
                let mut err = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                panic!(
                    "the program never held ({e}):\n{printed}\n{err}\n{}",
                    daemon.log()
                );
            }
        }
    }
    Holding {
        child,
        pid,
        lines,
        reader,
        printed,
    }
}

impl Holding {
    /// Lets the program finish; it must pass every check. Returns its stdout.
    fn release(mut self, daemon: &Daemon) -> String {
        drop(self.child.stdin.take());
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = self.child.wait().unwrap();
        self.reader.join().unwrap();
        let mut printed = self.printed;
        printed.extend(self.lines.try_iter().map(|l| l + "\n"));
        assert!(
            status.success() && printed.contains("all checks passed"),
            "process {} failed ({status}):\n{printed}\n{err}\ndaemon log:\n{}",
            self.pid,
            daemon.log()
        );
        printed
    }
}

/// Runs `exe` as [`hold`] does, calls `inspect` with its pid while it holds, and lets it
/// finish (see [`Holding::release`]).
fn run_holding(
    exe: &Path,
    daemon: &Daemon,
    env: &[(&str, &str)],
    inspect: impl FnOnce(u32),
) -> String {
    let h = hold(exe, daemon, env);
    inspect(h.pid);
    h.release(daemon)
}

fn number(row: &Row, column: &str) -> u64 {
    row.get(column)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no number in column {column} of {row:?}"))
}

/// The client rows of process `pid` in `status`, each with the device of its server.
fn rows_of(daemon: &Daemon, pid: u32) -> Vec<(u64, Row)> {
    let (servers, clients) = daemon.status();
    clients
        .into_iter()
        .filter(|c| number(c, "CLIENT-PID") == pid as u64)
        .map(|c| {
            let server = servers
                .iter()
                .find(|s| s.get("SERVER-PID") == c.get("SERVER-PID"))
                .unwrap_or_else(|| panic!("client {c:?} of no listed server: {servers:?}"));
            (number(server, "DEVICE"), c)
        })
        .collect()
}

/// A daemon of two devices, or `None` (after saying why) where fewer exist.
fn two_devices(test: &str) -> Option<Daemon> {
    let daemon = Daemon::start();
    let count = daemon.device_count();
    if count < 2 {
        skip(
            test,
            &format!("it needs two devices, the daemon serves {count}"),
        );
        return None;
    }
    Some(daemon)
}

#[test]
fn every_device_is_reported_and_each_does_its_work_on_its_own_server() {
    let Some(daemon) =
        two_devices("every_device_is_reported_and_each_does_its_work_on_its_own_server")
    else {
        return;
    };
    let exe = build("multi_device");
    let printed = run_holding(&exe, &daemon, &[], |pid| {
        // The program holds memory and has launched on both devices: it is a client of each
        // device's server, with its work there.
        let mut rows = rows_of(&daemon, pid);
        rows.sort_by_key(|(d, _)| *d);
        let devices: Vec<u64> = rows.iter().map(|(d, _)| *d).collect();
        assert_eq!(devices, [0, 1], "{rows:?}");
        for (device, row) in &rows {
            assert!(
                number(row, "MEM-BYTES") >= 3 << 18,
                "device {device}: {row:?}"
            );
            assert!(number(row, "LAUNCHES") >= 2, "device {device}: {row:?}");
        }
    });
    assert!(printed.contains("devices: 2\n"), "{printed}");
    if backend() == "sim" {
        // Each name is its own server's report.
        assert!(printed.contains("device 0: mps simulator 0\n"), "{printed}");
        assert!(printed.contains("device 1: mps simulator 1\n"), "{printed}");
    }
}

#[test]
fn cuda_visible_devices_shows_one_device_whose_work_lands_on_its_server() {
    let Some(daemon) =
        two_devices("cuda_visible_devices_shows_one_device_whose_work_lands_on_its_server")
    else {
        return;
    };
    let exe = build("multi_device");
    let printed = run_holding(&exe, &daemon, &[("CUDA_VISIBLE_DEVICES", "1")], |pid| {
        let rows = rows_of(&daemon, pid);
        assert_eq!(rows.len(), 1, "{rows:?}");
        let (device, row) = &rows[0];
        assert_eq!(
            *device, 1,
            "the program's device 0 is the host's device 1: {row:?}"
        );
        assert!(number(row, "LAUNCHES") >= 2, "{row:?}");
        // No server of device 0 was ever needed.
        let (servers, _) = daemon.status();
        assert!(
            servers.iter().all(|s| number(s, "DEVICE") == 1),
            "{servers:?}"
        );
    });
    assert!(printed.contains("devices: 1\n"), "{printed}");
    if backend() == "sim" {
        assert!(printed.contains("device 0: mps simulator 1\n"), "{printed}");
    }
}

#[test]
fn unmodified_processes_share_the_daemon_under_its_limits_groups_and_lists() {
    let daemon = Daemon::start();
    // The operator's limit, as mps.h clients get it (mps-server/tests/control.rs tests it for
    // them): cuMemGetInfo reports it, and an allocation beyond it is CUDA_ERROR_OUT_OF_MEMORY.
    daemon.ctl("set_default_device_pinned_mem_limit 0 64M");
    let limited = run(&build("mem_limit"), &daemon.dir, &[]);
    assert!(
        limited.status.success(),
        "mem_limit under the daemon's limit:\n{}{}",
        String::from_utf8_lossy(&limited.stdout),
        String::from_utf8_lossy(&limited.stderr)
    );

    // Three unmodified processes at once, all on device 0: two in the default group, one in
    // group "critical", which the daemon routes to a server of its own, asking for half the SMs
    // and a lower priority as any mps client asks.
    let exe = build("multi_device");
    let device_0 = ("CUDA_VISIBLE_DEVICES", "0");
    let a = hold(&exe, &daemon, &[device_0]);
    let b = hold(&exe, &daemon, &[device_0]);
    let c = hold(
        &exe,
        &daemon,
        &[
            device_0,
            ("MPS_GROUP", "critical"),
            ("MPS_ACTIVE_THREAD_PERCENTAGE", "50"),
            ("MPS_CLIENT_PRIORITY", "1"),
        ],
    );
    let (servers, clients) = daemon.status();
    let server_of = |group: &str| {
        let s: Vec<&Row> = servers
            .iter()
            .filter(|s| s.get("GROUP").map(String::as_str) == Some(group))
            .collect();
        assert_eq!(s.len(), 1, "group {group}: {servers:?}");
        assert_eq!(number(s[0], "DEVICE"), 0, "{servers:?}");
        s[0]["SERVER-PID"].clone()
    };
    let listed = |server: &str| {
        let mut pids: Vec<u32> = daemon
            .ctl(&format!("get_client_list {server}"))
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        pids.sort_unstable();
        pids
    };
    let mut default_pids = vec![a.pid, b.pid];
    default_pids.sort_unstable();
    assert_eq!(listed(&server_of("default")), default_pids);
    assert_eq!(listed(&server_of("critical")), vec![c.pid]);
    // Each is listed with its work, the daemon's limit, and its own share and priority.
    for (pid, share, priority) in [(a.pid, 100, 0), (b.pid, 100, 0), (c.pid, 50, 1)] {
        let row = clients
            .iter()
            .find(|r| number(r, "CLIENT-PID") == pid as u64)
            .unwrap_or_else(|| panic!("process {pid} not in status: {clients:?}"));
        assert_eq!(number(row, "MEM-LIMIT"), 64 << 20, "{row:?}");
        assert_eq!(number(row, "SHARE%"), share, "{row:?}");
        assert_eq!(number(row, "PRIORITY"), priority, "{row:?}");
        assert!(number(row, "MEM-BYTES") >= 3 << 18, "{row:?}");
        assert!(number(row, "LAUNCHES") >= 2, "{row:?}");
    }
    for h in [a, b, c] {
        let printed = h.release(&daemon);
        assert!(printed.contains("devices: 1\n"), "{printed}");
    }
}

#[test]
fn graphs_built_node_by_node_run_update_and_refuse_what_mps_cannot_serve() {
    let (stdout, stderr) = passes("graph_build", &[]);
    // v = 7x for the last round's x[4095] = 4095 + 5000: the update from the clone held.
    assert!(
        stdout.contains("built graph: 0 wrong results over 6 launches, v[4095] = 63665.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("captured work in built graphs: v[0] = 2.0"),
        "{stdout}"
    );
    // What mps refuses is said once each, naming it.
    for what in [
        "cuGraphConditionalHandleCreate is not supported",
        "a graph node host (CU_GRAPH_NODE_TYPE_HOST) is not supported",
        "adding a node: not supported through mps for a graph captured from a stream",
    ] {
        let said = stderr.lines().filter(|l| l.contains(what)).count();
        assert_eq!(said, 1, "{what}: {stderr}");
    }
}

#[test]
fn stream_capture_makes_graphs_that_replay_with_new_data_and_keeps_cudas_rules() {
    let (stdout, stderr) = passes("graph_capture", &[]);
    // y = 3x for the last round's x[4095] = 4095 + 3000: the fourth launch read new input.
    assert!(
        stdout.contains("4 graph launches: y[4095] = 21285.0"),
        "{stdout}"
    );
    // What mps cannot capture is said once each, by name.
    for what in ["an event record", "a copy through pageable memory"] {
        let said = stderr
            .lines()
            .filter(|l| l.contains(what) && l.contains("is not supported through mps"))
            .count();
        assert_eq!(said, 1, "{what}: {stderr}");
    }
}
