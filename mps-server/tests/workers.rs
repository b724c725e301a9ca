//! The session workers seen from outside: threads bounded with many clients, idle clients
//! costing no CPU, and a client scribbling on its wake-up words unable to stall its worker.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use mps_core::protocol::Request;

/// The server's threads by name, without the simulator's stream threads (the simulator's
/// stand-in for the GPU, not the server's own cost).
fn server_threads(pid: u32) -> Vec<String> {
    let mut names = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let comm = comm.trim().to_string();
        if !comm.starts_with("sim-stream") && !comm.is_empty() {
            names.push(comm);
        }
    }
    names.sort();
    names
}

/// CPU time the server process has used (user and system), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1;
    // After the command name: state is field 3, utime 14, stime 15.
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn connect_all(server: &TestServer, n: usize) -> Vec<RawClient> {
    (0..n)
        .map(|_| {
            let mut c = RawClient::connect(server);
            assert!(c.call(&Request::Mark, 0).result().is_ok());
            c
        })
        .collect()
}

/// Polls until `f` holds, for up to 20 s.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn threads_stay_bounded_with_many_clients() {
    let server = TestServer::start_with(&["--session-workers", "2"]);
    let pid = server.pid();
    let mut one = connect_all(&server, 1);
    let workers = |t: &[String]| t.iter().filter(|n| n.starts_with("client-")).count();
    // The hand-over threads of the handshakes end on their own.
    eventually("the handshake threads end", || {
        !server_threads(pid).iter().any(|n| n.starts_with("intake"))
    });
    let base = server_threads(pid);
    assert_eq!(workers(&base), 1, "{base:?}");

    let mut many = connect_all(&server, 60);
    eventually("the handshake threads end", || {
        !server_threads(pid).iter().any(|n| n.starts_with("intake"))
    });
    let threads = server_threads(pid);
    assert_eq!(workers(&threads), 2, "{threads:?}");
    assert_eq!(
        threads.len(),
        base.len() + 1,
        "{threads:?} against {base:?}"
    );
    // Every client is served.
    for c in many.iter_mut().chain(&mut one) {
        assert!(c.call(&Request::Mark, 0).result().is_ok());
    }
    drop(many);
    drop(one);
    eventually("a worker without clients ends", || {
        workers(&server_threads(pid)) == 0
    });
}

#[test]
fn idle_clients_cost_the_server_no_cpu() {
    let server = TestServer::start_with(&["--session-workers", "2"]);
    let pid = server.pid();
    let clients = connect_all(&server, 200);
    // Workers spin and yield for at most half a millisecond after their last command; give
    // them (and the last handshakes) a moment, then measure.
    eventually("the handshake threads end", || {
        !server_threads(pid).iter().any(|n| n.starts_with("intake"))
    });
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    // 200 idle clients: each worker wakes once a second and looks at its 100 clients, about
    // two ticks of a debug build over the 2 s, and the main thread a tick or two; 4 to 10
    // ticks in all were seen on a 2-core machine. A worker spinning for its clients would use
    // 200 ticks, a spinning thread per client the whole machine.
    assert!(
        used <= 20,
        "the server used {used} ticks of CPU over 2 s with idle clients"
    );
    drop(clients);
}

#[test]
fn a_client_that_stops_reading_its_completions_costs_its_worker_nothing() {
    // Before: a worker looked at such a client again and again (100% of a CPU per client).
    let server = TestServer::start_with(&["--session-workers", "1"]);
    let pid = server.pid();
    let mut stuck = connect_all(&server, 1).pop().unwrap();
    let complete_slots = mps_ipc::channel::Layout::default().complete_slots as usize;
    let sent = complete_slots + 300;
    for _ in 0..sent {
        stuck.send(&Request::Mark, 0, 0);
    }
    eventually("the completion ring fills", || {
        stuck.consumer.available().unwrap() as usize >= complete_slots - 1
    });
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    assert!(
        used <= 5,
        "the server used {used} ticks of CPU over 2 s with one client not reading its completions"
    );
    // Another client of the same worker is served meanwhile, and the stuck one once it reads.
    let mut other = connect_all(&server, 1).pop().unwrap();
    assert!(other.call(&Request::Mark, 0).result().is_ok());
    for _ in 0..sent {
        assert!(stuck.recv().result().is_ok());
    }
}

#[test]
fn a_client_scribbling_on_its_wake_up_words_cannot_stall_its_worker() {
    let mut server = TestServer::start_with(&["--session-workers", "1"]);
    let good = connect_all(&server, 1).pop().unwrap();
    let hostile = connect_all(&server, 1).pop().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let scribbler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let bell = hostile.channel.submit_bell();
            let mut x: u32 = 0x9e37_79b9;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                // Its doorbell word and the worker's sleeper count in its segment: garbage,
                // zero, and rings for nothing.
                bell.word().store(x, Ordering::SeqCst);
                bell.sleepers()
                    .store(if x & 1 == 0 { 0 } else { x }, Ordering::SeqCst);
                bell.ring();
            }
            hostile
        })
    };
    let mut good = good;
    for _ in 0..300 {
        assert!(good.call(&Request::Mark, 0).result().is_ok());
    }
    stop.store(true, Ordering::Relaxed);
    let mut hostile = scribbler.join().unwrap();
    // The worker sleeps again and wakes for the good client (whose words are its own), and
    // the scribbler itself is still served.
    for _ in 0..50 {
        assert!(good.call(&Request::Mark, 0).result().is_ok());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(hostile.call(&Request::Mark, 0).result().is_ok());
    assert!(server.is_alive(), "log:\n{}", server.log());
}

#[test]
fn zero_workers_serve_each_client_on_a_thread_of_its_own() {
    let server = TestServer::start_with(&["--session-workers", "0"]);
    let pid = server.pid();
    let mut clients = connect_all(&server, 5);
    let own = |t: &[String]| {
        t.iter()
            .filter(|n| {
                n.strip_prefix("client-")
                    .is_some_and(|id| id.parse::<u32>().is_ok())
            })
            .count()
    };
    let threads = server_threads(pid);
    assert_eq!(own(&threads), 5, "{threads:?}");
    for c in &mut clients {
        assert!(c.call(&Request::Mark, 0).result().is_ok());
    }
    drop(clients);
    eventually("the clients' threads end", || {
        own(&server_threads(pid)) == 0
    });
}

/// A worker holding a client's batched run sleeps while the client pauses inside it, instead
/// of spinning for the whole hold; the client's next command wakes it and completes the run,
/// which is launched from its graph with exact results. So does a thread of the client's own
/// (`--session-workers 0`).
#[test]
fn a_held_run_costs_its_worker_no_cpu_while_the_client_pauses() {
    for workers in ["1", "0"] {
        held_run_pauses(workers);
    }
}

/// A client that fills a device buffer of 256 words with `fill_u32` launches in a stream of
/// its own and reads it back into a host buffer: runs that launch batching learns.
struct Filler {
    c: mpsclient::Client,
    fill: mpsclient::Function,
    x: mpsclient::DevicePtr,
    out: *mut u8,
    s: mpsclient::Stream,
}

impl Filler {
    const WORDS: u64 = 256;

    fn new(server: &TestServer) -> Filler {
        let c = server.client();
        let m = c.module_load(&ptx()).unwrap();
        let fill = c.module_get_function(m, "fill_u32").unwrap();
        let x = c.mem_alloc(Self::WORDS * 4).unwrap();
        let out = c.host_alloc(Self::WORDS as usize * 4).unwrap();
        let s = c.stream_create(0).unwrap();
        Filler { c, fill, x, out, s }
    }

    /// Launches a fill of the buffer with `v`.
    fn post(&self, v: u32) {
        let args = [
            self.x.0.to_le_bytes().to_vec(),
            v.to_le_bytes().to_vec(),
            Self::WORDS.to_le_bytes().to_vec(),
        ];
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        let one = mpsclient::Dim3 { x: 1, y: 1, z: 1 };
        let block = mpsclient::Dim3 { x: 256, y: 1, z: 1 };
        self.c
            .launch(self.fill, one, block, 0, self.s, &refs)
            .unwrap();
    }

    /// Copies the buffer to the host, synchronises the stream and checks that every word is
    /// `v`.
    fn finish(&self, v: u32) {
        let n = Self::WORDS as usize;
        // SAFETY: the host buffer holds n u32s; nothing else touches it meanwhile.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.out, n * 4) };
        self.c.memcpy_dtoh(dst, self.x, self.s).unwrap();
        self.c.stream_synchronize(self.s).unwrap();
        // SAFETY: as above, read once the copy completed.
        let got = unsafe { std::slice::from_raw_parts(self.out as *const u32, n) };
        assert!(got.iter().all(|w| *w == v), "{v}");
    }
}

/// A server with `workers` session workers that holds a batched run through pauses of up to
/// 5 s, however slowly the test posts it.
fn holding_server(workers: &str) -> TestServer {
    TestServer::start_with(&[
        "--session-workers",
        workers,
        "--batch-hold-us",
        "5000000",
        "--batch-pacing",
        "off",
    ])
}

fn held_run_pauses(workers: &str) {
    let server = holding_server(workers);
    let pid = server.pid();
    let f = Filler::new(&server);
    // The shape is learned, then made a graph.
    for v in 0..2 {
        f.post(v);
        f.post(v + 1);
        f.finish(v + 1);
    }
    f.post(7);
    // The worker spins and yields for at most half a millisecond before it sleeps.
    std::thread::sleep(Duration::from_millis(50));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_ticks(pid) - before;
    f.post(8);
    f.finish(8);
    // A spinning worker would use the whole second (100 ticks).
    assert!(
        used <= 10,
        "the server ({workers} workers) used {used} ticks of CPU over 1 s holding a run"
    );
    drop(f);
    server.wait_for_log("launch batching: 1 runs launched from cached graphs, 1 not");
}

/// While a worker holds a client's batched run, the run's further commands go unrung until
/// the one that completes its shape, so that they cost the worker no wake-up each; the run is
/// still launched from its graph with exact results. So with a thread of the client's own.
#[test]
fn a_held_runs_commands_ring_only_at_its_end() {
    for workers in ["1", "0"] {
        held_run_rings(workers);
    }
}

fn held_run_rings(workers: &str) {
    let server = holding_server(workers);
    let f = Filler::new(&server);
    // A run of three launches and a copy, ended by a synchronise.
    let request = |v: u32, pause: bool| {
        f.post(v);
        if pause {
            // The worker takes the first launch and holds it before the next comes.
            std::thread::sleep(Duration::from_millis(20));
        }
        f.post(v + 1);
        f.post(v + 2);
        f.finish(v + 2);
    };
    // The shape is learned, then made a graph.
    request(0, false);
    request(10, false);
    const HELD: u32 = 10;
    for i in 0..HELD {
        request(100 + 10 * i, true);
    }
    drop(f);
    let log = server.wait_for_log("doorbell rings: ");
    let line = log
        .lines()
        .find(|l| l.contains("doorbell rings: "))
        .unwrap();
    let tail = line.split("doorbell rings: ").nth(1).unwrap();
    let words: Vec<&str> = tail.split_whitespace().collect();
    let (rings, commands): (i64, i64) = (words[0].parse().unwrap(), words[2].parse().unwrap());
    // Each held request's second and third launches went unrung: its first launch, its copy
    // (which completes the shape) and its synchronise rang. So may the second request's,
    // held too where the worker took its first launch before the next came. The server rings
    // once itself to wake the worker when the client hangs up, which the count may include.
    let unrung = commands - rings;
    let held = 2 * i64::from(HELD);
    assert!(
        (held - 1..=held + 2).contains(&unrung),
        "{workers} workers: {unrung} commands unrung, where {held} were due: {line}"
    );
    assert!(
        line.contains(&format!("{HELD} runs launched from cached graphs")),
        "{line}"
    );
}
