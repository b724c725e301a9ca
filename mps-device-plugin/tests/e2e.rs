//! End to end on the simulator: a control daemon of two simulated GPUs, the plugin learning
//! them from it and registering with a fake kubelet, `Allocate` for two containers, and the
//! containers' processes started with exactly the environment the plugin returned (merged as
//! the kubelet merges it, each mount's container path replaced by its host path: no mount
//! namespace) and held to what their pods asked for: the memory limit refuses what passes it,
//! and the daemon's status shows each client's limit, SM share and group. With a Python that
//! has torch, an unmodified PyTorch program is one of the containers. Then the daemon goes
//! away, and `ListAndWatch` marks every unit unhealthy until it is back.
//!
//! The daemon and server are this build's (`cargo test --workspace` builds them; elsewhere the
//! test says it skipped, which fails under CI).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use mps_device_plugin::api::device_plugin_client::DevicePluginClient;
use mps_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
};
use mps_device_plugin::daemon::{Daemon, PROBE_GROUP};
use mps_device_plugin::plugin;
use mps_device_plugin::shares::{GIB, GROUP_PREFIX, HEALTHY, Resource, UNHEALTHY, device_id};
use tokio::sync::watch;
use tonic::transport::Channel;

/// Says that a test was skipped, and why, on stderr and in `$MPS_TEST_SKIP_LOG`; under CI
/// nothing may be skipped.
fn skip(test: &str, reason: &str) {
    let line = format!("SKIPPED: {test}: {reason}\n");
    eprint!("{line}");
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: {reason}; CI must provide it"
    );
    if let Some(path) = std::env::var_os("MPS_TEST_SKIP_LOG") {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .expect("the skip log can be written");
    }
}

/// `target/<profile>`, from this test executable's path (`target/<profile>/deps/..`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// This crate's directory: `$MPS_ROOT/mps-device-plugin` for a test executable run on another
/// machine in a copy of the tree.
fn crate_dir() -> PathBuf {
    std::env::var_os("MPS_ROOT")
        .map(|r| PathBuf::from(r).join("mps-device-plugin"))
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

/// A binary of this build: `$var` if set, else `target/<profile>/<name>`, if it exists.
fn built(name: &str, var: &str) -> Option<PathBuf> {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join(name));
    path.exists().then_some(path)
}

/// A running `mps-control -f` on the simulator, asked to quit on drop.
struct TestDaemon {
    dir: PathBuf,
    child: Child,
}

impl TestDaemon {
    fn start(dir: &Path, control: &Path, server: &Path) -> TestDaemon {
        let child = Command::new(control)
            .arg("-f")
            .args(
                if std::env::var("MPS_TEST_BACKEND").as_deref() == Ok("cuda") {
                    &["--backend", "cuda"][..]
                } else {
                    &[
                        "--backend",
                        "sim",
                        "--sim-devices",
                        "2",
                        "--sim-memory",
                        "2GiB",
                    ][..]
                },
            )
            // PyTorch's stream pools need more streams than a client's default.
            .args(["--server-arg=--max-streams", "--server-arg=255"])
            .arg("--server")
            .arg(server)
            .arg("--pipe-dir")
            .arg(dir)
            .arg("--log-dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let d = TestDaemon {
            dir: dir.to_path_buf(),
            child,
        };
        let until = std::time::Instant::now() + WAIT;
        while std::os::unix::net::UnixStream::connect(dir.join("control.sock")).is_err() {
            assert!(
                std::time::Instant::now() < until,
                "the daemon did not start:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("control.log")).unwrap_or_default()
    }

    /// Quits the daemon and waits for it to exit.
    fn quit(mut self) {
        let _ = Daemon::new(&self.dir).command("quit -t 1");
        let _ = self.child.wait();
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let _ = Daemon::new(&self.dir).command("quit -t 1");
        let until = std::time::Instant::now() + WAIT;
        while self.child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A container's environment from its `Allocate` responses, merged as the kubelet merges them
/// (the first value of a key stays), with each mount's container path replaced by its host
/// path, since these processes see the host's file system.
fn container_env(responses: &[&ContainerAllocateResponse]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut mounts = HashMap::new();
    for r in responses {
        let mut keys: Vec<_> = r.envs.iter().collect();
        keys.sort();
        for (k, v) in keys {
            if !env.iter().any(|(e, _)| e == k) {
                env.push((k.clone(), v.clone()));
            }
        }
        for m in &r.mounts {
            mounts.insert(m.container_path.clone(), m.host_path.clone());
        }
    }
    for (_, v) in &mut env {
        if let Some(host) = mounts.get(v.as_str()) {
            *v = host.clone();
        }
    }
    env
}

async fn allocate(
    client: &mut DevicePluginClient<Channel>,
    resource: Resource,
    gpu: u32,
    units: std::ops::Range<u32>,
) -> ContainerAllocateResponse {
    let ids = units.map(|u| device_id(resource, gpu, u)).collect();
    let mut r = within(
        "Allocate",
        client.allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
        }),
    )
    .await
    .unwrap()
    .into_inner();
    r.container_responses.remove(0)
}

/// A process of a container: started with the container's environment, it has said "ready"
/// (it is connected and has checked its limit) and waits for a line.
struct Running {
    child: Child,
    said: Vec<String>,
    /// Reads the rest of what it says, so that it writes to a live pipe.
    rest: std::thread::JoinHandle<Vec<String>>,
}

fn spawn_ready(mut cmd: Command, env: &[(String, String)]) -> Running {
    let mut child = cmd
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = Vec::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line == "ready" {
            let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
            return Running { child, said, rest };
        }
        said.push(line);
    }
    panic!(
        "a container's process ended before it was ready ({:?}); it said:\n{}",
        child.wait(),
        said.join("\n")
    );
}

impl Running {
    fn finish(mut self) {
        let _ = self.child.stdin.take().unwrap().write_all(b"go\n");
        let status = self.child.wait().unwrap();
        let rest = self.rest.join().unwrap();
        assert!(
            status.success(),
            "a container's process failed: {status}\n{}\n{}",
            self.said.join("\n"),
            rest.join("\n")
        );
    }
}

/// The columns of `status`'s client row of process `pid`, by name.
fn client_row(status: &str, pid: u32) -> HashMap<String, String> {
    let clients = status.split("\n\n").nth(1).unwrap_or_default();
    let mut lines = clients.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let row = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.get(1) == Some(&pid.to_string().as_str()))
        .unwrap_or_else(|| panic!("no client {pid} in status:\n{status}"));
    header
        .iter()
        .zip(row)
        .map(|(h, v)| (h.to_string(), v.to_string()))
        .collect()
}

/// The (group, device) of server `pid` in `status`.
fn server_row(status: &str, pid: &str) -> (String, String) {
    let w: Vec<&str> = status
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pid))
        .unwrap_or_else(|| panic!("no server {pid} in status:\n{status}"))
        .split_whitespace()
        .collect();
    (w[2].to_string(), w[6].to_string())
}

/// The plugin binary, stopped (SIGTERM) by [`Plugin::stop`], killed on drop; its log is
/// shown when a test fails.
struct Plugin(Child, PathBuf);

impl Plugin {
    /// Stops the plugin as the kubelet's node would (SIGTERM): it exits cleanly and takes its
    /// sockets away.
    fn stop(mut self, kubelet_dir: &Path) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.0.wait().unwrap();
        assert!(status.success(), "the plugin exited with {status}");
        for r in Resource::ALL {
            assert!(
                !kubelet_dir.join(r.socket()).exists(),
                "{} left behind",
                r.socket()
            );
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if std::thread::panicking() {
            eprintln!(
                "the plugin's log:\n{}",
                std::fs::read_to_string(&self.1).unwrap_or_default()
            );
        }
    }
}

/// A Python that imports torch: `$MPS_TEST_TORCH_PYTHON`, else `python3` if it can.
fn torch_python() -> Option<String> {
    let given = std::env::var("MPS_TEST_TORCH_PYTHON").ok();
    let python = given.clone().unwrap_or_else(|| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || given.is_none(),
        "MPS_TEST_TORCH_PYTHON={python} cannot import torch"
    );
    ok.then_some(python)
}

/// The role of a container's process: a client of the Rust crate that checks its memory
/// limit, says ready, and waits.
fn container_role() {
    let limit: u64 = std::env::var("MPS_TEST_LIMIT_GIB")
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * GIB;
    let c = mps_client::Client::connect(None).expect("the container joins its group");
    let (_, total) = c.mem_get_info().unwrap();
    assert_eq!(total, limit, "mem_get_info's total is the pod's limit");
    let held = c.mem_alloc(limit - (1 << 20)).expect("within the limit");
    let e = c.mem_alloc(2 << 20).expect_err("past the limit");
    assert_eq!(e.status, mps_client::Status::QuotaExceeded, "{e}");
    let sm = c.sm_info().unwrap();
    // The share is SMs taken away, not a number reported: fewer SMs than the device has.
    assert!(sm.share_percent < 100 && sm.sms < sm.device_sms, "{sm:?}");
    println!(
        "limit {limit} held, refused past it; SM share {}%: {} of {} SMs",
        sm.share_percent, sm.sms, sm.device_sms
    );
    println!("ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    c.mem_free(held).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_get_the_limits_their_pods_asked_for_and_health_follows_the_daemon() {
    let test = "containers_get_the_limits_their_pods_asked_for_and_health_follows_the_daemon";
    if std::env::var("MPS_TEST_ROLE").as_deref() == Ok("container") {
        container_role();
        return;
    }
    let (Some(control), Some(server)) = (
        built("mps-control", "MPS_CONTROL_BIN"),
        built("mps-server", "MPS_SERVER_BIN"),
    ) else {
        skip(
            test,
            "mps-control and mps-server are not built (cargo test --workspace builds them)",
        );
        return;
    };
    let cuda = std::env::var("MPS_TEST_BACKEND").as_deref() == Ok("cuda");
    let dir = temp_dir("e2e");
    let pipe = dir.join("pipe");
    let kubelet_dir = dir.join("kubelet");
    std::fs::create_dir_all(&pipe).unwrap();
    std::fs::create_dir_all(&kubelet_dir).unwrap();
    let daemon = TestDaemon::start(&pipe, &control, &server);

    // The inventory, as the plugin takes it: on the simulator two GPUs of 2 GiB; no probe
    // server is left behind.
    let d = Daemon::new(&pipe);
    let gpus = {
        let d = d.clone();
        tokio::task::spawn_blocking(move || d.inventory(None, 0))
            .await
            .unwrap()
            .unwrap()
    };
    if !cuda {
        assert_eq!(
            gpus.iter()
                .map(|g| (g.ordinal, g.memory_units))
                .collect::<Vec<_>>(),
            [(0, 2), (1, 2)]
        );
    }
    let status = d.command("status").unwrap();
    assert!(!status.contains(PROBE_GROUP), "{status}");
    // Pod A goes to the last GPU, pod B and the PyTorch pod to the first.
    let (ga, gb) = (gpus.last().unwrap().ordinal, gpus[0].ordinal);

    // mps's CUDA library, for the unmodified program: a directory with libcuda.so.1 in it.
    let built_lib = built("libmpscuda.so", "MPS_CUDA_LIBRARY");
    let lib = dir.join("lib");
    if let Some(built_lib) = &built_lib {
        std::fs::create_dir_all(&lib).unwrap();
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink(built_lib, lib.join(name)).unwrap();
        }
    }

    // The plugin itself, as the DaemonSet runs it, against the fake kubelet.
    let mut kubelet = FakeKubelet::start(&kubelet_dir);
    let plugin_log = dir.join("plugin.log");
    let mut plugin = Command::new(
        std::env::var_os("MPS_PLUGIN_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_mps-device-plugin").into()),
    );
    plugin
        .arg("--pipe-dir")
        .arg(&pipe)
        .arg("--kubelet-dir")
        .arg(&kubelet_dir)
        .args(["--health-interval-ms", "50", "--watch-interval-ms", "20"])
        .args(["--reap-idle-s", "0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&plugin_log).unwrap());
    match &built_lib {
        Some(_) => plugin.arg("--cuda-lib-dir").arg(&lib),
        None => plugin.arg("--no-cuda-library"),
    };
    let plugin = Plugin(plugin.spawn().unwrap(), plugin_log);
    let regs = kubelet.both_registrations().await;
    let mut mem = kubelet.connect(&regs[0].endpoint).await;
    let mut sm = kubelet.connect(&regs[1].endpoint).await;
    let mut watch_mem = list_and_watch(&mut mem).await;
    let mut l = next_list(&mut watch_mem).await;
    while !l.devices.iter().all(|d| d.health == HEALTHY) {
        l = next_list(&mut watch_mem).await;
    }
    assert_eq!(
        l.devices.len(),
        gpus.iter().map(|g| g.memory_units as usize).sum::<usize>()
    );

    // Two pods: A asks for 1 GiB and 30% of its GPU, B for 1 GiB and 50% of its own. The
    // units are those a kubelet could hand out: no unit twice, on one GPU or two.
    let one = ga == gb;
    let a_mem = allocate(&mut mem, Resource::Memory, ga, 0..1).await;
    let a_sm = allocate(&mut sm, Resource::Sm, ga, 0..30).await;
    let b_sm = allocate(&mut sm, Resource::Sm, gb, if one { 30..80 } else { 0..50 }).await;
    let b_mem = allocate(&mut mem, Resource::Memory, gb, 1..2).await;
    // The kubelet's order of a container's resources is its own: A's memory first, B's SMs.
    let a_env = container_env(&[&a_mem, &a_sm]);
    let b_env = container_env(&[&b_sm, &b_mem]);
    let role = |limit: &str| {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args([test, "--exact", "--nocapture"])
            .env("MPS_TEST_ROLE", "container")
            .env("MPS_TEST_LIMIT_GIB", limit);
        c
    };
    let a = spawn_ready(role("1"), &a_env);
    let b = spawn_ready(role("1"), &b_env);
    assert!(
        a.said.iter().any(|l| l.contains("SM share 30%")),
        "{:?}",
        a.said
    );
    assert!(
        b.said.iter().any(|l| l.contains("SM share 50%")),
        "{:?}",
        b.said
    );

    eprintln!("pod A: {}\npod B: {}", a.said.join(" "), b.said.join(" "));
    let status = d.command("status").unwrap();
    for (p, env, share, device) in [(&a, &a_env, "30", ga), (&b, &b_env, "50", gb)] {
        let row = client_row(&status, p.child.id());
        assert_eq!(row["MEM-LIMIT"], GIB.to_string(), "{status}");
        assert_eq!(row["SHARE%"], share, "{status}");
        let group = &env.iter().find(|(k, _)| k == "MPS_GROUP").unwrap().1;
        assert_eq!(
            server_row(&status, &row["SERVER-PID"]),
            (group.clone(), device.to_string())
        );
    }
    assert_ne!(
        client_row(&status, a.child.id())["SERVER-PID"],
        client_row(&status, b.child.id())["SERVER-PID"]
    );

    // An unmodified PyTorch program as a third container: 1 GiB and 20% of B's GPU; on a GPU
    // it runs kernels too.
    match torch_python().filter(|_| built_lib.is_some()) {
        Some(python) => {
            let t_unit = if one { 2 } else { 0 };
            let t_mem = allocate(&mut mem, Resource::Memory, gb, t_unit..t_unit + 1).await;
            let t_sm = allocate(&mut sm, Resource::Sm, gb, 80..100).await;
            let env = container_env(&[&t_sm, &t_mem]);
            let mut cmd = Command::new(python);
            cmd.arg(crate_dir().join("tests/py/container.py")).arg("1");
            if cuda {
                cmd.arg("--compute");
            }
            let t = spawn_ready(cmd, &env);
            assert!(
                t.said.iter().any(|l| l.contains("refused past it")),
                "{:?}",
                t.said
            );
            let status = d.command("status").unwrap();
            let row = client_row(&status, t.child.id());
            assert_eq!(row["SHARE%"], "20", "{status}");
            assert_eq!(row["MEM-LIMIT"], GIB.to_string(), "{status}");
            t.finish();
        }
        None => skip(
            &format!("{test} (its PyTorch container)"),
            "no Python with torch (scripts/torch-env installs one; MPS_TEST_TORCH_PYTHON names \
             it), or no libmpscuda.so built",
        ),
    }
    a.finish();
    b.finish();

    // The containers gone, their groups' servers are stopped (here with no grace).
    let (stop_reap, reap_stop) = watch::channel(false);
    let reap = tokio::spawn(plugin::reap_idle_servers(
        d.clone(),
        GROUP_PREFIX.into(),
        Duration::from_millis(50),
        Duration::ZERO,
        reap_stop,
    ));
    within("the idle servers to be stopped", async {
        while d.command("get_server_list").unwrap() != "" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let _ = stop_reap.send(true);
    within("the reaper to stop", reap).await.unwrap();

    // The daemon goes: every unit unhealthy; a daemon back: healthy again.
    daemon.quit();
    let mut l = next_list(&mut watch_mem).await;
    while !l.devices.iter().all(|d| d.health == UNHEALTHY) {
        l = next_list(&mut watch_mem).await;
    }
    let daemon = TestDaemon::start(&pipe, &control, &server);
    let mut l = next_list(&mut watch_mem).await;
    while !l.devices.iter().all(|d| d.health == HEALTHY) {
        l = next_list(&mut watch_mem).await;
    }
    plugin.stop(&kubelet_dir);
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
