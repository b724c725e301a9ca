//! Soak: hundreds of client processes killed with SIGKILL at random moments (mid-hello, mid-copy,
//! mid-launch, holding streams, events, modules and host buffers) must leave the server as they
//! found it: its descriptors, threads and device memory back at their baseline, its resident
//! memory within a bound, and the next client served correctly. On a GPU the driver may keep
//! device memory it grew for its own use during the first soak; a second soak as large must then
//! take none more (a leak would).
//!
//! The moments come from a fixed seed, printed; `MPS_SOAK_SEED` (hex, as printed) replays
//! another and `MPS_SOAK_CLIENTS` changes how many clients are killed (default 500).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use common::{TestServer, on_gpu, ptx, role, spawn_role, wait_until};
use mps_core::handshake::Hello;
use mpsclient::{Client, Dim3, Stream};

/// The seed of the random moments unless `MPS_SOAK_SEED` says otherwise.
const SEED: u64 = 0x005e_ed0f_50a4;
/// Clients alive at once.
const AT_ONCE: usize = 32;
/// Simulated device memory: a size no other mapping of the server has, so that its pages can
/// be told apart in /proc/PID/smaps.
const SIM_MEMORY_MIB: u64 = 1000;
/// Bytes of each pageable copy: several trips through the 4 MiB staging area.
const COPY_BYTES: usize = 12 << 20;
/// What the server's resident memory may grow by over the soak. Freed heap memory stays with
/// the allocator (glibc keeps per-thread arenas, up to 8 per core, and trims each only above
/// its top), and the threads of the sessions and streams that come and go leave their arenas
/// behind; 64 MiB is room for that, while a leak of what a client held (a 12 MiB copy buffer,
/// a module, host buffers, its channel) by even a tenth of 500 clients is far more.
const RSS_SLACK: u64 = 64 << 20;
/// How far the driver's free device memory may stay from its baseline on a GPU: the driver and
/// other processes move it by a few pages; a client's leaked allocation alone is 12 MiB.
const GPU_MEMORY_SLACK: u64 = 8 << 20;

/// splitmix64: small, and the same moments on every machine for one seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a client process does until it is killed.
#[derive(Clone, Copy, Debug)]
enum Role {
    /// Sends part of a hello on a raw socket and waits.
    Hello,
    /// Pageable copies to and from the device, one after another.
    Copy,
    /// Launches in a stream, synchronising now and then.
    Launch,
    /// Holds streams, events, a module, host buffers and device memory, and keeps them busy.
    Hold,
}

const ROLES: [Role; 4] = [Role::Hello, Role::Copy, Role::Launch, Role::Hold];

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Hello => "hello",
            Role::Copy => "copy",
            Role::Launch => "launch",
            Role::Hold => "hold",
        }
    }
}

/// Told by a client process once it is doing what its role says.
const READY: &str = "soak-client-ready";

fn grid(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

/// Plays `role` until killed; any error is a panic, which the soak reports as a failure.
fn play(role: &str, hello_bytes: usize) {
    let ready = || println!("{READY}");
    if role == "hello" {
        let dir = std::env::var_os("MPS_PIPE_DIRECTORY").unwrap();
        let path = std::path::Path::new(&dir).join(mps_ipc::socket::SOCKET_NAME);
        let sock = std::os::unix::net::UnixStream::connect(path).unwrap();
        let hello = Hello::new("default").unwrap();
        let bytes = bytemuck::bytes_of(&hello);
        mps_ipc::socket::send(&sock, &bytes[..hello_bytes.min(bytes.len() - 1)], &[]).unwrap();
        ready();
        // Waits for the kill (or for the server to drop the unfinished hello, then waits on).
        let mut rest = Vec::new();
        let _ = (&sock).read_to_end(&mut rest);
        loop {
            std::thread::park();
        }
    }
    let c = Client::connect(None).unwrap();
    match role {
        "copy" => {
            let d = c.mem_alloc(COPY_BYTES as u64).unwrap();
            let mut src = vec![0u8; COPY_BYTES];
            let mut back = vec![0u8; COPY_BYTES];
            ready();
            for round in (0..=u8::MAX).cycle() {
                src.fill(round);
                c.memcpy_htod(d, &src, Stream::DEFAULT).unwrap();
                c.memcpy_dtoh(&mut back, d, Stream::DEFAULT).unwrap();
                assert!(back == src, "copy round {round} came back wrong");
            }
        }
        "launch" => {
            let m = c.module_load(&ptx()).unwrap();
            let fill = c.module_get_function(m, "fill_u32").unwrap();
            let n = 1u64 << 16;
            let p = c.mem_alloc(n * 4).unwrap();
            let s = c.stream_create(0).unwrap();
            ready();
            for v in 0u32.. {
                let args: [&[u8]; 3] = [&p.0.to_le_bytes(), &v.to_le_bytes(), &n.to_le_bytes()];
                c.launch(fill, grid(64), grid(256), 0, s, &args).unwrap();
                if v % 16 == 15 {
                    c.stream_synchronize(s).unwrap();
                }
            }
        }
        "hold" => {
            let streams: Vec<_> = (0..4).map(|_| c.stream_create(0).unwrap()).collect();
            let events: Vec<_> = (0..8).map(|_| c.event_create().unwrap()).collect();
            let m = c.module_load(&ptx()).unwrap();
            c.module_get_function(m, "add_f32").unwrap();
            for _ in 0..4 {
                let b = c.host_alloc(256 << 10).unwrap();
                // SAFETY: b is a host buffer of 256 KiB, this client's own.
                unsafe { std::ptr::write_bytes(b, 0xa5, 256 << 10) };
            }
            let d = c.mem_alloc(1 << 20).unwrap();
            c.memset_d8(d, 1, 1 << 20, streams[0]).unwrap();
            ready();
            for i in 0usize.. {
                let s = streams[i % streams.len()];
                c.event_record(events[i % events.len()], s).unwrap();
                c.stream_synchronize(s).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        other => panic!("no soak role {other:?}"),
    }
}

/// The server process's numbers that must come back after its clients are killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    fds: usize,
    threads: usize,
}

impl Held {
    /// Whether this is what the server held at `base`: the same descriptors, and the same
    /// threads, or on a GPU no more of them (the CUDA driver ends some of the threads it started
    /// for its own work: one ended between two soaks on an H200).
    fn back_at(&self, base: Held) -> bool {
        self.fds == base.fds
            && (self.threads == base.threads || on_gpu() && self.threads <= base.threads)
    }
}

fn held(pid: u32) -> Held {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    Held {
        fds,
        threads: status_field(pid, "Threads:") as usize,
    }
}

/// A number field of /proc/PID/status (kB for memory fields).
fn status_field(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(name)).unwrap();
    line[name.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The server's resident bytes, less the simulated device memory's pages: those stay resident
/// once touched, as memory given to a GPU stays the device's, and device memory in use is
/// checked on its own.
fn rss(pid: u32) -> u64 {
    let total = status_field(pid, "VmRSS:") << 10;
    if on_gpu() {
        return total;
    }
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let sim_kb = format!("{}", SIM_MEMORY_MIB << 10);
    let mut lines = smaps.lines();
    while let Some(l) = lines.next() {
        let is_sim = l
            .strip_prefix("Size:")
            .is_some_and(|kb| kb.trim().trim_end_matches("kB").trim() == sim_kb);
        if is_sim {
            let rss_kb: u64 = lines
                .find_map(|l| l.strip_prefix("Rss:"))
                .unwrap()
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap();
            return total - (rss_kb << 10);
        }
    }
    panic!("no mapping of {SIM_MEMORY_MIB} MiB (the simulated device memory) in the server")
}

/// What the server holds with no client: a probe's connection (or the one TestServer made to
/// see the server up) may still be closing, so the counts are read until two readings 200 ms
/// apart agree.
fn settled(pid: u32) -> Held {
    let (held_now, _) = wait_until(
        "the server's descriptors and threads settle",
        || {
            let a = held(pid);
            std::thread::sleep(Duration::from_millis(200));
            (a, held(pid))
        },
        |(a, b)| a == b,
    );
    held_now
}

/// Free device memory, as a client sees it (the probe holds none itself).
fn device_free(server: &TestServer) -> u64 {
    server.client().mem_get_info().unwrap().0
}

/// What one client process did before its kill.
struct Killed {
    role: Role,
    ready: bool,
    failure: Option<String>,
}

/// Runs client `index` of the soak: spawns it, kills it at the moment its random numbers pick.
fn run_client(server: &TestServer, seed: u64, index: usize) -> Killed {
    let mut rng = Rng(seed ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let role = ROLES[rng.below(ROLES.len() as u64) as usize];
    let hello_bytes = rng.below(size_of::<Hello>() as u64) as usize;
    // A quarter are killed while starting or connecting, the others while doing their work.
    let after_ready = rng.below(4) != 0;
    let delay = Duration::from_micros(rng.below(if after_ready { 80_000 } else { 150_000 }));
    let mut child = spawn(server, role, hello_bytes);
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains(READY) {
                let _ = tx.send(());
            }
        }
    });
    let mut ready = false;
    if after_ready {
        ready = rx.recv_timeout(Duration::from_secs(60)).is_ok();
    }
    std::thread::sleep(delay);
    ready |= rx.try_recv().is_ok();
    // A client that ended by itself failed: its role runs until killed.
    let ended = child.try_wait().unwrap();
    let _ = child.kill();
    let status = child.wait().unwrap();
    let failure = match ended {
        Some(_) => {
            let mut err = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut err);
            Some(format!(
                "client {index} ({}) ended by itself ({status}): {err}",
                role.name()
            ))
        }
        None if after_ready && !ready => Some(format!(
            "client {index} ({}) never got going in 60 s",
            role.name()
        )),
        None => None,
    };
    Killed {
        role,
        ready,
        failure,
    }
}

fn spawn(server: &TestServer, role: Role, hello_bytes: usize) -> Child {
    // The role's one parameter travels in its name.
    spawn_role(
        "soak_kills_clients_at_random_moments",
        &format!("{}:{hello_bytes}", role.name()),
        server,
    )
}

/// Kills `count` clients, `AT_ONCE` alive at a time; panics on any that failed by itself.
fn kill_clients(server: &TestServer, seed: u64, first: usize, count: usize) -> Vec<Killed> {
    let next = AtomicUsize::new(first);
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..AT_ONCE.min(count) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= first + count {
                        return;
                    }
                    let k = run_client(server, seed, i);
                    done.lock().unwrap().push(k);
                }
            });
        }
    });
    let done = done.into_inner().unwrap();
    let failures: Vec<_> = done.iter().filter_map(|k| k.failure.as_deref()).collect();
    assert!(
        failures.is_empty(),
        "{} of {count} clients failed before their kill (seed {seed:#x}):\n{}",
        failures.len(),
        failures.join("\n")
    );
    done
}

/// Waits until the server holds what it held at `base` and its device memory is free again.
fn wait_for_baseline(server: &TestServer, base: Held, free: u64, when: &str) {
    let pid = server.pid();
    wait_until(
        &format!("{when}: the server's descriptors and threads back at {base:?}"),
        || held(pid),
        |h| h.back_at(base),
    );
    let slack = if on_gpu() { GPU_MEMORY_SLACK } else { 0 };
    wait_until(
        &format!("{when}: free device memory back at {free} (within {slack})"),
        || device_free(server),
        |f| *f + slack >= free,
    );
    // The probe's own connection is gone again before anything else is measured.
    wait_until(
        &format!("{when}: the probe's connection closed"),
        || held(pid),
        |h| h.back_at(base),
    );
}

/// The free device memory once two readings 200 ms apart agree (within the slack).
fn settle_device_free(server: &TestServer) -> u64 {
    wait_until(
        "the GPU's free memory settles",
        || {
            let a = device_free(server);
            std::thread::sleep(Duration::from_millis(200));
            (a, device_free(server))
        },
        |(a, b)| a.abs_diff(*b) <= GPU_MEMORY_SLACK,
    )
    .1
}

/// A fresh client after the soak gets every answer right.
fn a_fresh_client_is_served(server: &TestServer) {
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let n = 1u64 << 12;
    let p = c.mem_alloc(n * 4).unwrap();
    let s = c.stream_create(0).unwrap();
    let v = 0x50a4u32;
    let args: [&[u8]; 3] = [&p.0.to_le_bytes(), &v.to_le_bytes(), &n.to_le_bytes()];
    c.launch(fill, grid(16), grid(256), 0, s, &args).unwrap();
    let mut out = vec![0u8; (n * 4) as usize];
    c.memcpy_dtoh(&mut out, p, s).unwrap();
    c.stream_synchronize(s).unwrap();
    assert!(
        out.chunks_exact(4)
            .all(|w| u32::from_le_bytes(w.try_into().unwrap()) == v),
        "a fresh client's fill came back wrong after the soak"
    );
    let hb = c.host_alloc(1 << 20).unwrap();
    c.host_free(hb).unwrap();
    c.mem_free(p).unwrap();
}

#[test]
fn soak_kills_clients_at_random_moments() {
    if let Some(r) = role() {
        let (name, bytes) = r.split_once(':').unwrap();
        play(name, bytes.parse().unwrap());
        return;
    }
    let seed = std::env::var("MPS_SOAK_SEED")
        .ok()
        .map(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap())
        .unwrap_or(SEED);
    let clients: usize = std::env::var("MPS_SOAK_CLIENTS")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or(500);
    eprintln!("soak: seed {seed:#x} (MPS_SOAK_SEED), {clients} clients, {AT_ONCE} at once");
    let sim_memory = format!("{SIM_MEMORY_MIB}MiB");
    let server = if on_gpu() {
        TestServer::start()
    } else {
        TestServer::start_with(&["--sim-memory", &sim_memory])
    };
    let pid = server.pid();
    let free = device_free(&server);
    let base = settled(pid);
    eprintln!("soak: baseline {base:?}, {free} bytes of device memory free");

    // A first round brings the server's lazily made state (allocator arenas, the simulator's
    // touched pages) to its working size. The simulator must already be back at its baseline;
    // a CUDA driver may keep what it made on first use (threads for its own work, a context's
    // local memory grown for a kernel), so on a GPU the baseline is read again after it.
    kill_clients(&server, seed, 0, AT_ONCE);
    let (base, free) = if on_gpu() {
        // The probe's connection closes before the counts are read.
        let free = settle_device_free(&server);
        let base = settled(pid);
        eprintln!("soak: baseline after the first round {base:?}, {free} bytes free");
        (base, free)
    } else {
        wait_for_baseline(&server, base, free, "after the first round");
        (base, free)
    };
    let mut rss_base = rss(pid);
    eprintln!("soak: resident memory after the first round {rss_base} bytes");

    let killed = kill_clients(&server, seed, AT_ONCE, clients);
    for role in ROLES {
        let of: Vec<_> = killed
            .iter()
            .filter(|k| k.role.name() == role.name())
            .collect();
        let busy = of.iter().filter(|k| k.ready).count();
        eprintln!(
            "soak: {} {} clients killed, {busy} of them mid-work",
            of.len(),
            role.name()
        );
        assert!(busy > 0, "no {} client was killed mid-work", role.name());
    }
    if on_gpu() {
        // The driver may keep device memory it grew while 32 clients at a time loaded modules
        // and made streams (its own pools), so the free figure can settle below the baseline.
        // A leak would take more with every round; such a high-water mark does not: a second
        // soak as large must leave the free figure where the first left it. The resident memory
        // holds the driver's host memory too (it grew by 92 MiB over both soaks on an H200), so
        // its bound, too, applies to the second soak.
        let settled_free = settle_device_free(&server);
        rss_base = rss(pid);
        eprintln!(
            "soak: {} bytes of device memory free after the soak ({} fewer than the baseline)",
            settled_free,
            free.saturating_sub(settled_free)
        );
        kill_clients(&server, seed, AT_ONCE + clients, clients);
        wait_for_baseline(&server, base, settled_free, "after a second soak as large");
    } else {
        wait_for_baseline(&server, base, free, "after the soak");
    }
    let grown = rss(pid).saturating_sub(rss_base);
    eprintln!("soak: resident memory grew by {grown} bytes");
    assert!(
        grown <= RSS_SLACK,
        "the server's resident memory grew by {grown} bytes over {clients} killed clients \
         (bound {RSS_SLACK}; seed {seed:#x})"
    );
    a_fresh_client_is_served(&server);
}
