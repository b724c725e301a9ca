//! Both ends in memory, one against the other: the `mps-client` crate's `Client` over a channel
//! whose server end a `Session` of this server serves on a thread, on the simulator. No process
//! and no listening socket stand between them, so what the process tests show (results, errors
//! attributed to their command, isolation between clients, release on leaving) is shown here
//! down to the rings, and fails here first.

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mps_ipc::socket::Peer;
use mpsclient::{BackendKind, Client, DeviceInfo, DevicePtr, Dim3, Function, Stream};

use super::*;
use crate::session::{ServerEnv, Session, Workers};

fn grid(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

/// Session workers as the server runs them (two, so that clients share one).
fn workers() -> Workers<SimBackend> {
    Workers::new(2, (Duration::from_micros(20), Duration::from_micros(200))).unwrap()
}

/// A real client joined to a real session of `server`, numbered `id`, served by `workers` as
/// the server serves a client whose handshake is done.
fn connect(server: &Server<SimBackend>, workers: &Workers<SimBackend>, id: u32) -> Client {
    let channel = Channel::create(Layout::default()).unwrap();
    let (client_end, server_end) = UnixStream::pair().unwrap();
    let env = ServerEnv {
        backend: server.backend.clone(),
        handles: server.handles.clone(),
        registry: server.registry.clone(),
        limits: Limits::default(),
        waits: (Duration::from_micros(20), Duration::from_micros(200)),
    };
    let peer = Peer {
        pid: std::process::id() as i32,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    let session = Session::new(env, id, peer, channel.clone(), Arc::new(server_end)).unwrap();
    workers.adopt(session);
    let info = server.backend.info();
    let device = DeviceInfo {
        name: info.name.clone(),
        total_mem: info.total_mem,
        sm_count: info.sm_count,
        cc: info.cc,
        backend: BackendKind::Sim,
    };
    Client::over(id, client_end, channel, device)
}

/// Waits until every session of `server` has ended (its client hung up).
fn all_gone(server: &Server<SimBackend>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.registry.connected() != 0 {
        assert!(Instant::now() < deadline, "a session outlived its client");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn sim_server() -> Server<SimBackend> {
    Server::new(
        SimBackend::new(SimConfig {
            memory_bytes: 64 << 20,
            sm_count: 4,
            fault_scope: Default::default(),
            copy_latency: std::time::Duration::ZERO,
        })
        .unwrap(),
    )
}

fn fill_kernel(c: &Client) -> Function {
    let m = c.module_load(PTX).unwrap();
    c.module_get_function(m, "fill_u32").unwrap()
}

#[test]
fn the_client_and_the_session_agree_on_work_and_its_results() {
    let server = sim_server();
    let workers = workers();
    let c = connect(&server, &workers, 1);
    let fill = fill_kernel(&c);
    let n = 4096u64;
    let p = c.mem_alloc(n * 4).unwrap();
    let s = c.stream_create(0).unwrap();
    let input: Vec<u8> = (0..n as u32).flat_map(u32::to_le_bytes).collect();
    c.memcpy_htod(p, &input, s).unwrap();
    let mut back = vec![0u8; input.len()];
    c.memcpy_dtoh(&mut back, p, s).unwrap();
    c.stream_synchronize(s).unwrap();
    assert_eq!(
        back, input,
        "a copy in and out of the device changed the bytes"
    );
    let value = 0xfeed_beefu32;
    c.launch(
        fill,
        grid(16),
        grid(256),
        0,
        s,
        &[&p.0.to_le_bytes(), &value.to_le_bytes(), &n.to_le_bytes()],
    )
    .unwrap();
    c.memcpy_dtoh(&mut back, p, s).unwrap();
    c.stream_synchronize(s).unwrap();
    assert!(
        back.chunks(4)
            .all(|w| u32::from_le_bytes(w.try_into().unwrap()) == value),
        "fill_u32 through the client and the session wrote something else"
    );
    // A bad geometry (an empty grid) is refused in the launch call itself, as with CUDA.
    let e = c
        .launch(
            fill,
            grid(0),
            grid(1),
            0,
            s,
            &[
                &p.0.to_le_bytes(),
                &value.to_le_bytes(),
                &1u64.to_le_bytes(),
            ],
        )
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidValue, "{e}");
    assert!(e.message.contains("zero extent"), "{e}");
    // A memset is posted without an answer: the server's refusal (outside every allocation)
    // comes back at the next wait, naming the command, and the client carries on.
    c.memset_d8(DevicePtr(p.0 + (1 << 40)), 0, 16, s).unwrap();
    let e = c.stream_synchronize(s).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    assert!(e.message.contains("command #"), "{e}");
    c.stream_destroy(s).unwrap();
    c.mem_free(p).unwrap();
    // A kernel that writes outside the client's memory poisons that client, as on a GPU.
    let q = c.mem_alloc(4).unwrap();
    c.launch(
        fill,
        grid(1),
        grid(1),
        0,
        Stream::DEFAULT,
        &[
            &(q.0 + (1 << 30)).to_le_bytes(),
            &value.to_le_bytes(),
            &1u64.to_le_bytes(),
        ],
    )
    .unwrap();
    let e = c.synchronize().unwrap_err();
    assert_eq!(e.status, Status::IllegalAddress, "{e}");
    assert_eq!(c.mem_alloc(4).unwrap_err().status, Status::IllegalAddress);
    drop(c);
    all_gone(&server);
}

#[test]
fn one_clients_handles_mean_nothing_to_another() {
    let server = sim_server();
    let workers = workers();
    let a = connect(&server, &workers, 1);
    let b = connect(&server, &workers, 2);
    let fill_a = fill_kernel(&a);
    let p = a.mem_alloc(4096).unwrap();
    let s = a.stream_create(0).unwrap();
    let e = b.mem_free(p).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    let e = b.stream_synchronize(s).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    let e = b
        .launch(
            fill_a,
            grid(1),
            grid(1),
            0,
            Stream::DEFAULT,
            &[&p.0.to_le_bytes(), &1u32.to_le_bytes(), &1u64.to_le_bytes()],
        )
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    // The owner's objects are untouched by all that.
    a.stream_synchronize(s).unwrap();
    a.mem_free(p).unwrap();
    drop((a, b));
    all_gone(&server);
}

#[test]
fn what_a_client_leaves_behind_is_released() {
    let server = sim_server();
    let (free_before, _) = server.backend.mem_get_info();
    let workers = workers();
    let c = connect(&server, &workers, 1);
    let p = c.mem_alloc(1 << 20).unwrap();
    let _s = c.stream_create(0).unwrap();
    let _e = c.event_create().unwrap();
    let _h = c.host_alloc(1 << 16).unwrap();
    let _ = (fill_kernel(&c), p);
    drop(c);
    all_gone(&server);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.backend.mem_get_info().0 != free_before {
        assert!(
            Instant::now() < deadline,
            "device memory was not given back after the client left"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn host_functions_run_in_stream_order_and_a_pending_one_does_not_outlive_its_client() {
    use std::sync::Mutex as StdMutex;
    let server = sim_server();
    let w = workers();
    let c = connect(&server, &w, 1);
    let fill = fill_kernel(&c);
    let n = 1024u64;
    let p = c.mem_alloc(n * 4).unwrap();
    let s = c.stream_create(0).unwrap();
    let host = c.host_alloc(n as usize * 4).unwrap() as usize;
    let words = move || {
        // SAFETY: the host buffer holds n words and outlives every function here (the client
        // frees it only when dropped, after its host-function thread ends).
        unsafe { std::slice::from_raw_parts(host as *const u32, n as usize) }.to_vec()
    };
    let params = |v: u32| {
        [
            p.0.to_le_bytes().to_vec(),
            v.to_le_bytes().to_vec(),
            n.to_le_bytes().to_vec(),
        ]
    };
    let seen = Arc::new(StdMutex::new(Vec::new()));
    for round in 1..=3u32 {
        let pr = params(round);
        c.launch(fill, grid(4), grid(256), 0, s, &[&pr[0], &pr[1], &pr[2]])
            .unwrap();
        // SAFETY: `host` is a host buffer of n words.
        let dst = unsafe { std::slice::from_raw_parts_mut(host as *mut u8, n as usize * 4) };
        c.memcpy_dtoh(dst, p, s).unwrap();
        let seen = seen.clone();
        c.launch_host_func(s, Box::new(move || seen.lock().unwrap().push(words())))
            .unwrap();
    }
    c.stream_synchronize(s).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.len(),
        3,
        "a synchronisation returned before its host functions ran"
    );
    for (i, w) in seen.iter().enumerate() {
        let want = i as u32 + 1;
        assert!(
            w.iter().all(|&x| x == want),
            "function {i} saw {:?}",
            &w[..4]
        );
    }
    // One function runs, the next waits behind it; the client leaves meanwhile.
    c.launch_host_func(
        s,
        Box::new(|| std::thread::sleep(Duration::from_millis(20))),
    )
    .unwrap();
    c.launch_host_func(s, Box::new(|| {})).unwrap();
    drop(c);
    all_gone(&server);
}
