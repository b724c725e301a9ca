//! Several devices behind one control daemon: a server per (user, group, device), clients that
//! choose their device (or several), `CUDA_VISIBLE_DEVICES`, limits per device, and a fault on
//! one device that leaves the other serving.
//!
//! On the simulator the daemon presents two devices (`--sim-devices 2`), each server simulating
//! its own. With `MPS_TEST_BACKEND=cuda` the same tests run on the GPUs the driver sees; with
//! fewer than two each test says so and returns.

mod common;

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;

use common::daemon::{ServerRow, TestDaemon};
use common::*;
use mps_core::handshake::{Hello, Welcome};
use mps_ipc::socket;
use mpsclient::ffi::{mps_client, mps_connect_device, mps_device_count, mps_disconnect};
use mpsclient::{Client, Dim3, Status, Stream};

fn grid(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

/// The control daemon of two devices (`--sim-devices 2` on the simulator; the GPUs the driver
/// sees otherwise) with `extra` arguments; `None` (after saying so) where fewer than two exist.
fn two_devices(test: &str, extra: &[&str]) -> Option<TestDaemon> {
    let d = daemon(extra);
    let count = Client::device_count(Some(&d.dir)).unwrap();
    if count < 2 {
        skip(
            test,
            &format!("it needs two devices, the daemon serves {count}"),
        );
        return None;
    }
    Some(d)
}

/// The daemon as [`two_devices`] starts it, whatever the number of devices.
fn daemon(extra: &[&str]) -> TestDaemon {
    let args = [&["--sim-devices", "2"], extra].concat();
    TestDaemon::launch("multigpu", &server_bin(), &args, |cmd| {
        cmd.env_remove("CUDA_VISIBLE_DEVICES");
    })
}

/// The servers of `device`, from `status`.
fn on_device(d: &TestDaemon, device: u32) -> Vec<ServerRow> {
    d.servers()
        .into_iter()
        .filter(|s| s.device == device)
        .collect()
}

/// Fills `n` words with `value` on `c`'s device and checks what comes back.
fn fill_and_check(c: &Client, value: u32, n: u64) {
    let m = c.module_load(&ptx()).unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let p = c.mem_alloc(n * 4).unwrap();
    c.launch(
        fill,
        grid(n.div_ceil(256) as u32),
        grid(256),
        0,
        Stream::DEFAULT,
        &[&p.0.to_le_bytes(), &value.to_le_bytes(), &n.to_le_bytes()],
    )
    .unwrap();
    let mut out = vec![0u8; (n * 4) as usize];
    c.memcpy_dtoh(&mut out, p, Stream::DEFAULT).unwrap();
    c.stream_synchronize(Stream::DEFAULT).unwrap();
    let wrong = out
        .chunks(4)
        .position(|w| u32::from_le_bytes(w.try_into().unwrap()) != value);
    assert_eq!(wrong, None, "fill_u32({value}) on {}", c.device_info().name);
    c.mem_free(p).unwrap();
    c.module_unload(m).unwrap();
}

/// On the simulator, the device a client reached, from its name.
fn assert_sim_device(c: &Client, device: u32) {
    if !on_gpu() {
        assert_eq!(c.device_info().name, format!("mps simulator {device}"));
    }
}

/// A hello for host device `device`, sent by hand; the refusal's message.
fn refusal_for_device(dir: &Path, device: u32) -> mpsclient::Error {
    let s = UnixStream::connect(dir.join(socket::SOCKET_NAME)).unwrap();
    let hello = Hello::for_device("default", device).unwrap();
    socket::send(&s, bytemuck::bytes_of(&hello), &[]).unwrap();
    let mut w: Welcome = bytemuck::Zeroable::zeroed();
    socket::recv(&s, bytemuck::bytes_of_mut(&mut w), 2).unwrap();
    w.check(&"the daemon").unwrap_err()
}

#[test]
fn a_client_of_device_1_reaches_the_server_of_device_1() {
    let test = "a_client_of_device_1_reaches_the_server_of_device_1";
    let Some(d) = two_devices(test, &[]) else {
        return;
    };
    assert_eq!(Client::device_count(Some(&d.dir)).unwrap(), 2);
    let c = Client::connect_device(Some(&d.dir), 1).unwrap();
    assert_eq!(c.device(), 1);
    assert_sim_device(&c, 1);
    fill_and_check(&c, 0x1111, 4096);

    // One server, of device 1, which took this client; device 0 has none yet.
    let servers = d.servers();
    assert_eq!(servers.len(), 1, "{servers:?}");
    assert_eq!(
        (servers[0].device, servers[0].routed),
        (1, 1),
        "{servers:?}"
    );
    let pid = servers[0].pid;
    assert_eq!(d.ctl_line("get_server_list 1"), format!("{pid}\n"));
    assert_eq!(d.ctl_line("get_server_list 0"), "");
    assert!(
        d.log("control.log").contains("started a server"),
        "{}",
        d.log("control.log")
    );

    // Device 0 gets a server of its own.
    let c0 = Client::connect(Some(&d.dir)).unwrap();
    assert_eq!(c0.device(), 0);
    assert_sim_device(&c0, 0);
    let zero = on_device(&d, 0);
    assert_eq!(zero.len(), 1, "{zero:?}");
    assert_ne!(zero[0].pid, pid);
    assert_eq!(on_device(&d, 1)[0].pid, pid);

    // A device this process does not see, and a device the daemon does not serve.
    let e = Client::connect_device(Some(&d.dir), 2).unwrap_err();
    assert_eq!(e.status, Status::InvalidValue);
    assert!(e.message.contains("sees 2 device(s)"), "{e}");
    let e = refusal_for_device(&d.dir, 5);
    assert_eq!(e.status, Status::InvalidValue);
    assert!(e.message.contains("serves devices 0, 1"), "{e}");
}

#[test]
fn memory_limits_are_per_device() {
    let test = "memory_limits_are_per_device";
    if role().as_deref() == Some("limits") {
        // MPS_PINNED_DEVICE_MEM_LIMIT=4MiB,1=1MiB: device 1 has its own limit, device 0 the
        // plain one; MPS_ACTIVE_THREAD_PERCENTAGE=1=50: device 1 alone gets half the SMs.
        let c0 = Client::connect_device(None, 0).unwrap();
        let c1 = Client::connect_device(None, 1).unwrap();
        assert_eq!(c0.sm_info().unwrap().share_percent, 100);
        assert_eq!(c1.sm_info().unwrap().share_percent, 50);
        assert_eq!(c0.mem_get_info().unwrap().1, 4 << 20);
        assert_eq!(c1.mem_get_info().unwrap().1, 1 << 20);
        c0.mem_alloc(2 << 20).unwrap();
        let e = c1.mem_alloc(2 << 20).unwrap_err();
        assert_eq!(e.status, Status::QuotaExceeded, "{e}");
        return;
    }
    let Some(d) = two_devices(test, &[]) else {
        return;
    };
    // The operator's default, per device: device 1's new servers give 1 MiB per client.
    d.ctl_line("set_default_device_pinned_mem_limit 1 1MiB");
    assert_eq!(
        d.ctl_line("get_default_device_pinned_mem_limit 1"),
        "1048576\n"
    );
    assert_eq!(d.ctl_line("get_default_device_pinned_mem_limit 0"), "0\n");
    let c0 = Client::connect_device(Some(&d.dir), 0).unwrap();
    let c1 = Client::connect_device(Some(&d.dir), 1).unwrap();
    c0.mem_alloc(2 << 20).unwrap();
    let e = c1.mem_alloc(2 << 20).unwrap_err();
    assert_eq!(e.status, Status::QuotaExceeded, "{e}");
    c1.mem_alloc(512 << 10).unwrap();
    // A device the daemon does not serve has no default to set.
    let out = Command::new(control_bin())
        .arg("--pipe-dir")
        .arg(&d.dir)
        .args(["set_default_device_pinned_mem_limit", "7", "1MiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("serves devices 0, 1"),
        "{out:?}"
    );
    drop((c0, c1));

    // The client's own limit, per device (a process of its own: the variable is read at
    // connect).
    d.run_role(
        test,
        "limits",
        &[
            ("MPS_PINNED_DEVICE_MEM_LIMIT", "4MiB,1=1MiB"),
            ("MPS_ACTIVE_THREAD_PERCENTAGE", "1=50"),
        ],
    );
}

#[test]
fn one_process_works_on_both_devices_at_once() {
    let test = "one_process_works_on_both_devices_at_once";
    let Some(d) = two_devices(test, &[]) else {
        return;
    };
    let clients: Vec<Client> = (0..2)
        .map(|dev| Client::connect_device(Some(&d.dir), dev).unwrap())
        .collect();
    for (dev, c) in clients.iter().enumerate() {
        assert_sim_device(c, dev as u32);
    }
    std::thread::scope(|s| {
        for (dev, c) in clients.iter().enumerate() {
            s.spawn(move || {
                for round in 0..20u32 {
                    fill_and_check(c, (dev as u32) << 16 | round, 1 << 16);
                }
            });
        }
    });
    let servers = d.servers();
    let mut devices: Vec<u32> = servers.iter().map(|s| s.device).collect();
    devices.sort_unstable();
    assert_eq!(devices, vec![0, 1], "{servers:?}");
    assert!(servers.iter().all(|s| s.routed == 1), "{servers:?}");
}

#[test]
fn cuda_visible_devices_picks_and_renumbers_devices() {
    let test = "cuda_visible_devices_picks_and_renumbers_devices";
    match role().as_deref() {
        // CUDA_VISIBLE_DEVICES=1: host device 1 is this process's device 0, and only device.
        Some("only-1") => {
            assert_eq!(Client::device_count(None).unwrap(), 1);
            let c = Client::connect(None).unwrap();
            assert_eq!(c.device(), 0);
            assert_sim_device(&c, 1);
            fill_and_check(&c, 7, 1024);
            return;
        }
        // CUDA_VISIBLE_DEVICES=1,0: swapped.
        Some("swapped") => {
            assert_eq!(Client::device_count(None).unwrap(), 2);
            assert_sim_device(&Client::connect_device(None, 0).unwrap(), 1);
            assert_sim_device(&Client::connect_device(None, 1).unwrap(), 0);
            return;
        }
        // CUDA_VISIBLE_DEVICES=0,9,1: the invalid entry ends the list.
        Some("cut") => {
            assert_eq!(Client::device_count(None).unwrap(), 1);
            let e = Client::connect_device(None, 1).unwrap_err();
            assert_eq!(e.status, Status::InvalidValue, "{e}");
            return;
        }
        _ => {}
    }
    let Some(d) = two_devices(test, &[]) else {
        return;
    };
    d.run_role(test, "only-1", &[("CUDA_VISIBLE_DEVICES", "1")]);
    // The client reached device 1's server; device 0 was not started.
    let servers = d.servers();
    assert_eq!(servers.len(), 1, "{servers:?}");
    assert_eq!(
        (servers[0].device, servers[0].routed),
        (1, 1),
        "{servers:?}"
    );
    d.run_role(test, "swapped", &[("CUDA_VISIBLE_DEVICES", "1,0")]);
    d.run_role(test, "cut", &[("CUDA_VISIBLE_DEVICES", "0,9,1")]);
}

#[test]
fn a_fault_on_one_device_leaves_the_other_serving() {
    let test = "a_fault_on_one_device_leaves_the_other_serving";
    // The simulator's fault model of a GPU: a fault ends the whole context.
    let Some(d) = two_devices(test, &["--sim-fault-scope", "context"]) else {
        return;
    };
    let c0 = Client::connect_device(Some(&d.dir), 0).unwrap();
    let c1 = Client::connect_device(Some(&d.dir), 1).unwrap();
    fill_and_check(&c1, 1, 4096);
    let one = on_device(&d, 1);
    assert_eq!(one.len(), 1, "{one:?}");
    let old0 = on_device(&d, 0)[0].pid;

    // A kernel fault on device 0.
    let m = c0.module_load(&ptx()).unwrap();
    let f = c0.module_get_function(m, "fault_write").unwrap();
    let e = match c0.launch(
        f,
        grid(1),
        grid(1),
        0,
        Stream::DEFAULT,
        &[&0x10u64.to_le_bytes()],
    ) {
        Err(e) => e,
        Ok(()) => c0.synchronize().unwrap_err(),
    };
    assert_eq!(e.status, Status::IllegalAddress, "{e}");

    // Device 0's server is replaced; device 1's serves on, the same server, unaffected.
    wait_for(
        "a fresh server for device 0",
        || {
            let zero = on_device(&d, 0);
            zero.iter()
                .any(|s| s.pid != old0 && s.state == "ACTIVE")
                .then_some(())
        },
        || d.ctl_line("status"),
    );
    for round in 0..10 {
        fill_and_check(&c1, 100 + round, 4096);
    }
    assert_eq!(on_device(&d, 1), one);
    // A new client of device 0 is served by the fresh server.
    drop(c0);
    let fresh = Client::connect_device(Some(&d.dir), 0).unwrap();
    fill_and_check(&fresh, 9, 4096);
}

#[test]
fn a_standalone_server_serves_its_own_device_only() {
    if on_gpu() {
        let n = mps_driver::device_count().unwrap();
        if n < 2 {
            skip(
                "a_standalone_server_serves_its_own_device_only",
                &format!("it needs two GPUs, the driver sees {n}"),
            );
            return;
        }
    }
    let server = TestServer::start_with(&["--device", "1"]);
    // The client sees the one device there is, as its device 0.
    assert_eq!(Client::device_count(Some(&server.dir)).unwrap(), 1);
    let c = server.client();
    assert_eq!(c.device(), 0);
    assert_sim_device(&c, 1);
    fill_and_check(&c, 3, 1024);
    // A client that asks for another device is told which one this server serves.
    let e = refusal_for_device(&server.dir, 0);
    assert_eq!(e.status, Status::InvalidValue);
    assert!(
        e.message.contains("serves device 1 only, not device 0"),
        "{e}"
    );
}

#[test]
fn the_c_abi_counts_devices_and_connects_to_each() {
    let test = "the_c_abi_counts_devices_and_connects_to_each";
    let Some(d) = two_devices(test, &[]) else {
        return;
    };
    let dir = std::ffi::CString::new(d.dir.as_os_str().as_encoded_bytes()).unwrap();
    let mut count = 0u32;
    // SAFETY: a NUL-terminated directory and a writable count.
    let status = unsafe { mps_device_count(dir.as_ptr(), &mut count) };
    assert_eq!((status, count), (Status::Success, 2));
    for device in 0..2 {
        let mut client: *mut mps_client = std::ptr::null_mut();
        // SAFETY: as above, and a writable client pointer.
        let status = unsafe { mps_connect_device(dir.as_ptr(), device, &mut client) };
        assert_eq!(status, Status::Success);
        // SAFETY: a client from mps_connect_device, disconnected once.
        assert_eq!(unsafe { mps_disconnect(client) }, Status::Success);
    }
    let mut client: *mut mps_client = std::ptr::null_mut();
    // SAFETY: as above.
    let status = unsafe { mps_connect_device(dir.as_ptr(), 2, &mut client) };
    assert_eq!(status, Status::InvalidValue);
    assert!(client.is_null());
    let routed: Vec<(u32, u64)> = d.servers().iter().map(|s| (s.device, s.routed)).collect();
    assert_eq!(routed.len(), 2, "{routed:?}");
    assert!(routed.iter().all(|(_, n)| *n == 1), "{routed:?}");
}

#[test]
fn the_daemon_serves_the_devices_it_is_given() {
    let test = "the_daemon_serves_the_devices_it_is_given";
    let Some(d) = two_devices(test, &[]) else {
        return;
    };
    drop(d);
    // A device that does not exist is refused at start, saying how many there are.
    let dir = temp_dir("multigpu");
    let out = Command::new(control_bin())
        .args(["-f", "--backend", &backend(), "--sim-devices", "2"])
        .args(["--devices", "0,5", "--pipe-dir"])
        .arg(&dir)
        .arg("--log-dir")
        .arg(&dir)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--devices names device 5"), "{said}");

    // Device 1 alone: it is the clients' device 0, and device 0 is not served.
    let d = daemon(&["--devices", "1"]);
    assert_eq!(Client::device_count(Some(&d.dir)).unwrap(), 1);
    let c = Client::connect(Some(&d.dir)).unwrap();
    assert_sim_device(&c, 1);
    fill_and_check(&c, 5, 1024);
    let e = refusal_for_device(&d.dir, 0);
    assert!(
        e.message.contains("this mps-control serves devices 1"),
        "{e}"
    );
    assert_eq!(
        d.servers().iter().map(|s| s.device).collect::<Vec<_>>(),
        vec![1]
    );
}
