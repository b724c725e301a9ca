//! Launch batching: a repeated run served from one cached graph with the results of the
//! unbatched path, runs that differ never served by a stale graph, every terminator ending a
//! run, errors answered by the command that caused them, the cache's bounds, and no graph at
//! all with batching off.

use super::*;
use crate::backend::sim::SimBackend;
use crate::registry::Stats;

/// The default limits, named for what these tests rely on: launch batching on, holding runs
/// however fast the test posts them (pacing has tests of its own).
fn batching() -> Limits {
    Limits {
        launch_batching: true,
        batch_pacing: BatchPacing::Off,
        ..Limits::default()
    }
}

/// A launch of `function` in a grid of `blocks` blocks, in `cluster` (none: not in clusters).
fn launch_in_clusters(
    function: u64,
    params: &[u8],
    blocks: u32,
    cluster: Option<mps_core::protocol::Cluster>,
) -> Request<'_> {
    match launch(function, params) {
        Request::Launch { mut spec } => {
            spec.grid.x = blocks;
            spec.cluster = cluster;
            Request::Launch { spec }
        }
        _ => unreachable!("launch() makes a launch"),
    }
}

/// Hands the core a command that asks for nothing back; it must be accepted silently.
fn quiet<B: Backend>(c: &mut Client<B>, req: &Request<'_>, stream: u64) -> u64 {
    let out = c.send(req, stream, 0);
    assert!(matches!(out, Output::Silent), "{req:?}: {out:?}");
    c.seq
}

fn set_u32s(seg: &Segment, values: &[u32]) {
    for (i, v) in values.iter().enumerate() {
        // SAFETY: the callers' buffers hold at least values.len() words.
        unsafe { (seg.as_ptr() as *mut u32).add(i).write_unaligned(*v) };
    }
}

fn counters(stats: &Stats) -> [u64; 4] {
    [
        stats.batch_hits.load(Ordering::Relaxed),
        stats.batch_misses.load(Ordering::Relaxed),
        stats.batch_graphs.load(Ordering::Relaxed),
        stats.batch_entries.load(Ordering::Relaxed),
    ]
}

/// A client of the simulator set up as a small inference server: input and output host
/// buffers, device buffers x and y, the kernels, and a stream.
struct Rig {
    c: Client<SimBackend>,
    s: u64,
    slot: u32,
    add: u64,
    fill: u64,
    n: u64,
    x: u64,
    y: u64,
    input: (u64, Arc<Segment>),
    output: (u64, Arc<Segment>),
}

impl Rig {
    fn new(server: &Server<SimBackend>, limits: Limits) -> Rig {
        let mut c = server.client(limits);
        let m = c.load_module(PTX).unwrap();
        let (add, fill) = (c.function(m, "add_f32"), c.function(m, "fill_u32"));
        let n = 256u64;
        let (x, y) = (c.alloc(n * 4), c.alloc(n * 4));
        let input = host_buffer(&mut c, n * 4);
        let output = host_buffer(&mut c, n * 8);
        let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
        let mut rig = Rig {
            c,
            s,
            slot: slot as u32,
            add,
            fill,
            n,
            x,
            y,
            input,
            output,
        };
        rig.fill_now(rig.y, 0);
        rig
    }

    fn sync(&mut self) {
        sync(&mut self.c, self.s, self.slot);
    }

    fn fill_now(&mut self, p: u64, value: u32) {
        let params = fill_params(p, value, self.n);
        quiet(&mut self.c, &launch(self.fill, &params), self.s);
        self.sync();
    }

    fn copy_in(&self) -> Request<'static> {
        Request::CopyHtoD {
            dst: self.x,
            src: HostRef::Buffer {
                handle: self.input.0,
                offset: 0,
            },
            len: self.n * 4,
        }
    }

    fn copy_out(&self, from: u64, offset: u64) -> Request<'static> {
        Request::CopyDtoH {
            dst: HostRef::Buffer {
                handle: self.output.0,
                offset,
            },
            src: from,
            len: self.n * 4,
        }
    }

    /// One request: input in, `chain` dependent kernels (y = x + y), output out, synchronise;
    /// returns the output.
    fn infer(&mut self, chain: usize) -> Vec<u32> {
        let (s, copy_in, copy_out) = (self.s, self.copy_in(), self.copy_out(self.y, 0));
        quiet(&mut self.c, &copy_in, s);
        let params = add_params(self.x, self.y, self.y, self.n);
        for _ in 0..chain {
            quiet(&mut self.c, &launch(self.add, &params), s);
        }
        quiet(&mut self.c, &copy_out, s);
        self.sync();
        u32s(&self.output.1, self.n as usize)
    }

    fn counters(&self) -> [u64; 4] {
        counters(self.c.core.stats())
    }
}

#[test]
fn a_repeated_run_is_launched_from_one_cached_graph_with_the_results_of_the_unbatched_path() {
    let server = sim();
    let mut batched = Rig::new(&server, batching());
    let off = Limits {
        launch_batching: false,
        ..Limits::default()
    };
    let mut plain = Rig::new(&server, off);
    for rig in [&batched, &plain] {
        let input: Vec<u32> = (0..rig.n as u32)
            .map(|i| (i % 5 + 1) as f32)
            .map(f32::to_bits)
            .collect();
        set_u32s(&rig.input.1, &input);
    }
    for request in 1..=6u32 {
        let (b, p) = (batched.infer(12), plain.infer(12));
        assert_eq!(b, p, "request {request}");
        let want: Vec<u32> = (0..batched.n as u32)
            .map(|i| ((i % 5 + 1) * 12 * request) as f32)
            .map(f32::to_bits)
            .collect();
        assert_eq!(b, want, "request {request}");
    }
    // The first request taught the shape, the second made its graph, the other four were
    // launched from it.
    assert_eq!(batched.counters(), [4, 1, 1, 1]);
    assert_eq!(plain.counters(), [0, 0, 0, 0]);
    assert!(!batched.c.core.holds_run());
}

#[test]
fn a_run_with_other_parameters_is_served_by_the_cached_graph_with_its_own() {
    let server = sim();
    let mut r = Rig::new(&server, batching());
    let n = r.n as usize;
    let run = |r: &mut Rig, value: u32| {
        let params = fill_params(r.x, value, r.n);
        let (s, out) = (r.s, r.copy_out(r.x, 0));
        quiet(&mut r.c, &launch(r.fill, &params), s);
        quiet(&mut r.c, &out, s);
        r.sync();
        u32s(&r.output.1, n)
    };
    for _ in 0..3 {
        assert_eq!(run(&mut r, 7), vec![7; n]);
    }
    assert_eq!(r.counters(), [1, 1, 1, 1]);
    // Another value is the same work: the graph's launch is given the run's parameters.
    assert_eq!(run(&mut r, 9), vec![9; n]);
    assert_eq!(run(&mut r, 7), vec![7; n]);
    assert_eq!(r.counters(), [3, 1, 1, 1]);
    let stats = r.c.core.stats();
    assert_eq!(stats.batch_learned.load(Ordering::Relaxed), 1);
    assert_eq!(stats.batch_diverged.load(Ordering::Relaxed), 0);
    // A run that begins as the shape and copies elsewhere leaves it once held.
    let (s, params) = (r.s, fill_params(r.x, 7, r.n));
    quiet(&mut r.c, &launch(r.fill, &params), s);
    let other = r.copy_out(r.x, r.n * 4);
    quiet(&mut r.c, &other, s);
    r.sync();
    assert_eq!(u32s(&r.output.1, 2 * n)[n..], vec![7; n]);
    assert_eq!(r.c.core.stats().batch_diverged.load(Ordering::Relaxed), 1);
}

#[test]
fn a_run_whose_memset_moves_is_served_by_the_cached_graph_with_its_own() {
    let server = sim();
    let mut r = Rig::new(&server, batching());
    let n = r.n as usize;
    // A memset of x or y, then a copy of both out.
    let run = |r: &mut Rig, dst: u64, value: u32, count: u64| {
        let fill = Fill {
            dst,
            value,
            elem_size: 4,
            count,
        };
        let (s, x, y) = (r.s, r.copy_out(r.x, 0), r.copy_out(r.y, r.n * 4));
        quiet(&mut r.c, &Request::Memset { fill }, s);
        quiet(&mut r.c, &x, s);
        quiet(&mut r.c, &y, s);
        r.sync();
        u32s(&r.output.1, 2 * n)
    };
    let both = |x: u32, y: u32| [vec![x; n], vec![y; n]].concat();
    let (x, y, len) = (r.x, r.y, r.n);
    r.fill_now(x, 0);
    for _ in 0..3 {
        assert_eq!(run(&mut r, x, 7, len), both(7, 0));
    }
    assert_eq!(r.counters(), [1, 1, 1, 1]);
    // Elsewhere, with another value: the graph's memset is given the run's.
    assert_eq!(run(&mut r, y, 9, len), both(7, 9));
    assert_eq!(run(&mut r, x, 3, len), both(3, 9));
    assert_eq!(r.counters(), [3, 1, 1, 1]);
    // Half as many elements is other work, done as asked.
    let mut half = both(5, 9);
    half[n / 2..n].fill(3);
    assert_eq!(run(&mut r, x, 5, len / 2), half);
    assert_eq!(r.counters()[0], 3);
}

#[test]
fn new_parameters_reach_only_the_launches_of_a_graph_submitted_after_them() {
    let server = sim();
    let mut r = Rig::new(&server, batching());
    let n = r.n as usize;
    let (z, w) = (r.c.alloc(r.n * 4), r.c.alloc(r.n * 4));
    let m = r.c.load_module(PTX).unwrap();
    let spin = r.c.function(m, "spin_ns");
    let counter = r.c.alloc(4);
    // A run of two fills, of buffers its parameters name.
    let run = |r: &mut Rig, a: u64, b: u64, value: u32| {
        let s = r.s;
        for p in [a, b] {
            quiet(&mut r.c, &launch(r.fill, &fill_params(p, value, r.n)), s);
        }
    };
    for _ in 0..2 {
        let (x, y) = (r.x, r.y);
        run(&mut r, x, y, 1);
        r.sync();
    }
    assert_eq!(r.counters(), [0, 1, 1, 1]);
    for p in [r.x, r.y, z, w] {
        r.fill_now(p, 0);
    }
    // The stream is held up by a kernel while both runs are queued behind it as launches of
    // the one graph, the second with other buffers: the first must still fill its own.
    let mut params = [0u8; 16];
    params[..8].copy_from_slice(&200_000_000u64.to_le_bytes());
    params[8..].copy_from_slice(&counter.to_le_bytes());
    let s = r.s;
    quiet(&mut r.c, &launch(spin, &params), s);
    // A wait for an event never recorded ends the spin's run, so that the next begins.
    let event = r.c.event();
    quiet(&mut r.c, &Request::StreamWaitEvent { event }, s);
    let (x, y) = (r.x, r.y);
    run(&mut r, x, y, 7);
    run(&mut r, z, w, 9);
    assert_eq!(r.counters()[0], 2, "both runs were launched from the graph");
    r.sync();
    let read = |r: &mut Rig, p: u64| {
        let (s, out) = (r.s, r.copy_out(p, 0));
        quiet(&mut r.c, &out, s);
        r.sync();
        u32s(&r.output.1, n)
    };
    assert_eq!(read(&mut r, x), vec![7; n]);
    assert_eq!(read(&mut r, y), vec![7; n]);
    assert_eq!(read(&mut r, z), vec![9; n]);
    assert_eq!(read(&mut r, w), vec![9; n]);
}

/// A command that ends a run, sent to the rig.
type Terminator = Box<dyn Fn(&mut Rig)>;

#[test]
fn every_terminator_ends_a_held_run_after_queueing_it() {
    let server = sim();
    let mut r = Rig::new(&server, batching());
    let n = r.n as usize;
    let t = r.c.stream();
    let event = r.c.event();
    let spare = r.c.alloc(64);
    // The shape: x filled and copied out, y filled and copied out after it.
    let send = |r: &mut Rig, step: usize, value: u32| {
        let s = r.s;
        match step {
            0 => quiet(&mut r.c, &launch(r.fill, &fill_params(r.x, value, r.n)), s),
            1 => {
                let out = r.copy_out(r.x, 0);
                quiet(&mut r.c, &out, s)
            }
            2 => quiet(&mut r.c, &launch(r.fill, &fill_params(r.y, value, r.n)), s),
            _ => {
                let out = r.copy_out(r.y, r.n * 4);
                quiet(&mut r.c, &out, s)
            }
        };
    };
    for _ in 0..2 {
        (0..4).for_each(|step| send(&mut r, step, 3));
        r.sync();
    }
    assert_eq!(r.counters(), [0, 1, 1, 1]);
    let terminators: Vec<(&str, Terminator)> = vec![
        (
            "an event record",
            Box::new(move |r: &mut Rig| {
                let s = r.s;
                r.c.send(&Request::EventRecord { event }, s, flags::MARK);
            }),
        ),
        (
            "a wait for an event",
            Box::new(move |r: &mut Rig| {
                let s = r.s;
                quiet(&mut r.c, &Request::StreamWaitEvent { event }, s);
            }),
        ),
        (
            "a synchronise",
            Box::new(|r: &mut Rig| {
                let s = r.s;
                r.c.send(&Request::Mark, s, flags::MARK);
            }),
        ),
        (
            "a free",
            Box::new(move |r: &mut Rig| {
                r.c.ok(&Request::MemFree { ptr: spare }, 0);
            }),
        ),
        (
            "work on another stream",
            Box::new(move |r: &mut Rig| {
                let params = fill_params(r.y, 1, 4);
                quiet(&mut r.c, &launch(r.fill, &params), t);
            }),
        ),
        (
            "a query of the device's memory",
            Box::new(|r: &mut Rig| {
                r.c.ok(&Request::MemGetInfo, 0);
            }),
        ),
    ];
    r.c.send(&Request::EventRecord { event }, t, flags::MARK);
    for (what, terminate) in &terminators {
        set_u32s(&r.output.1, &vec![0; 2 * n]);
        send(&mut r, 0, 3);
        send(&mut r, 1, 3);
        assert!(r.c.core.holds_run(), "before {what}");
        let [hits, misses, ..] = r.counters();
        terminate(&mut r);
        assert!(!r.c.core.holds_run(), "{what} left the run held");
        let [now_hits, now_misses, ..] = r.counters();
        assert_eq!(now_hits + now_misses, hits + misses + 1, "{what}");
        r.sync();
        let out = u32s(&r.output.1, 2 * n);
        assert_eq!(
            out[..n],
            vec![3; n][..],
            "{what}: the held copy did not run"
        );
        assert_eq!(out[n..], vec![0; n][..], "{what}");
    }
    // The whole shape is still served from its graph (not cut at the prefix, which the
    // interrupted runs made a shape of its own).
    let [hits, misses, ..] = r.counters();
    (0..4).for_each(|step| send(&mut r, step, 3));
    r.sync();
    assert_eq!(r.counters()[..2], [hits + 1, misses]);
}

#[test]
fn an_invalid_command_inside_a_run_is_refused_against_its_own_sequence_number() {
    let server = sim();
    let mut r = Rig::new(&server, batching());
    let n = r.n as usize;
    let s = r.s;
    let fill_x = fill_params(r.x, 5, r.n);
    let fill_y = fill_params(r.y, 5, r.n);
    let run = |r: &mut Rig| {
        quiet(&mut r.c, &launch(r.fill, &fill_x), s);
        quiet(&mut r.c, &launch(r.fill, &fill_y), s);
        let out = r.copy_out(r.x, 0);
        quiet(&mut r.c, &out, s);
        r.sync();
    };
    run(&mut r);
    run(&mut r);
    set_u32s(&r.output.1, &vec![0; n]);
    quiet(&mut r.c, &launch(r.fill, &fill_x), s);
    assert!(r.c.core.holds_run());
    // y's fill with a parameter short.
    let out = r.c.send(&launch(r.fill, &fill_y[..16]), s, 0);
    let bad = r.c.seq;
    match out {
        Output::Post(c) => {
            assert_eq!(c.seq, bad);
            let e = c.result().unwrap_err();
            assert_eq!(e.status, Status::InvalidValue, "{e}");
            assert!(e.message.contains("24 bytes of parameters"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!r.c.core.holds_run());
    assert!(r.c.core.take_batch_errors().is_empty());
    let out = r.copy_out(r.x, 0);
    quiet(&mut r.c, &out, s);
    r.sync();
    assert_eq!(u32s(&r.output.1, n), vec![5; n]);
}

/// The recorder's kernel `k` takes 12 bytes; `i` makes each launch of a run differ.
fn k_params(i: u8) -> Vec<u8> {
    (0..12).map(|b| b ^ i).collect()
}

/// The recorder's kernel `k` of a module of its own for each of `n` shapes: runs that launch
/// other kernels are other shapes (other geometry or parameters alone are not).
fn kernels(c: &mut Client<Recorder>, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let m = c.load_module(PTX).unwrap();
            c.function(m, "k")
        })
        .collect()
}

/// The recorder's kernel `k` and a stream of the client's own.
fn kernel_and_stream(c: &mut Client<Recorder>) -> (u64, u64) {
    let m = c.load_module(PTX).unwrap();
    (c.function(m, "k"), c.stream())
}

/// Graph launches among `sent`.
fn launched_graphs(sent: &[Submitted]) -> usize {
    sent.iter().filter(|x| x.op == Opcode::GraphLaunch).count()
}

/// The batching limits with pacing that sees the CPUs `contended` or not.
fn paced(contended: bool) -> Limits {
    Limits {
        batch_pacing: BatchPacing::Assume { contended },
        ..batching()
    }
}

/// `runs` runs of three launches of `f` (see [`run_of`]); the launches' numbers.
fn recorder_run(c: &mut Client<Recorder>, f: u64, s: u64, runs: usize) -> Vec<u64> {
    (0..runs).flat_map(|_| run_of(c, s, &[f; 3])).collect()
}

#[test]
fn a_refused_graph_launch_falls_back_to_each_command_which_answers_for_itself() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    recorder_run(&mut c, f, s, 3);
    assert_eq!(counters(c.core.stats()), [1, 1, 1, 1]);
    server.backend.take();
    // The launch of the cached graph is refused: the three launches go one by one.
    server
        .backend
        .refuse_graph_launch
        .store(true, Ordering::Relaxed);
    let seqs = recorder_run(&mut c, f, s, 1);
    let sent: Vec<(u64, Opcode)> = server
        .backend
        .take()
        .iter()
        .map(|s| (s.seq, s.op))
        .collect();
    let want: Vec<(u64, Opcode)> = seqs.iter().map(|&q| (q, Opcode::Launch)).collect();
    assert_eq!(sent[..3], want[..], "{sent:?}");
    assert!(c.core.take_batch_errors().is_empty());
    // And a command the backend refuses there is answered under its own number.
    server
        .backend
        .refuse_seq
        .store(c.seq + 2, Ordering::Relaxed);
    let seqs = recorder_run(&mut c, f, s, 1);
    let errors = c.core.take_batch_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].seq, seqs[1]);
    assert!(errors[0].result().unwrap_err().message.contains("refused"));
}

/// A held run whose every command fails (a dead context) reports its first failure alone,
/// against that command: the completions it posts stay within the room the shell reserved.
#[test]
fn a_held_run_that_fails_throughout_reports_its_first_failure_alone() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    recorder_run(&mut c, f, s, 3);
    server
        .backend
        .refuse_graph_launch
        .store(true, Ordering::Relaxed);
    server
        .backend
        .refuse_from_seq
        .store(c.seq + 1, Ordering::Relaxed);
    let seqs = recorder_run(&mut c, f, s, 1);
    let errors = c.core.take_batch_errors();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].seq, seqs[0]);
}

#[test]
fn with_batching_off_no_graph_is_ever_made() {
    let server = Server::new(Recorder::new(16));
    let off = Limits {
        launch_batching: false,
        ..Limits::default()
    };
    let mut c = server.client(off);
    let (f, s) = kernel_and_stream(&mut c);
    let seqs = recorder_run(&mut c, f, s, 5);
    let b = &server.backend;
    assert_eq!(b.captures.load(Ordering::Relaxed), 0);
    assert_eq!(b.live_graphs.load(Ordering::Relaxed), 0);
    let launched: Vec<u64> = b
        .take()
        .iter()
        .filter(|s| s.op == Opcode::Launch)
        .map(|s| s.seq)
        .collect();
    assert_eq!(launched, seqs);
    assert_eq!(counters(c.core.stats()), [0, 0, 0, 0]);

    // The same runs with batching on: one capture, three launches of its graph.
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    recorder_run(&mut c, f, s, 5);
    assert_eq!(b.captures.load(Ordering::Relaxed), 1);
    assert_eq!(launched_graphs(&b.take()), 4);
    assert_eq!(counters(c.core.stats()), [3, 1, 1, 1]);
}

#[test]
fn the_cache_keeps_within_its_entries_and_bytes() {
    let server = Server::new(Recorder::new(16));
    let limits = Limits {
        max_batch_entries: 2,
        max_batch_bytes: 1024,
        ..batching()
    };
    let mut c = server.client(limits);
    let (f, s) = kernel_and_stream(&mut c);
    let shapes = kernels(&mut c, 4);
    // Four shapes, each run three times (learned, made a graph, launched from it).
    for (shape, &g) in shapes.iter().enumerate() {
        for _ in 0..3 {
            for i in 0..3 {
                quiet(&mut c, &launch(g, &k_params(i)), s);
            }
            c.send(&Request::Mark, s, flags::MARK);
        }
        let [hits, _, graphs, entries] = counters(c.core.stats());
        assert_eq!((hits, graphs), (shape as u64 + 1, shape as u64 + 1));
        assert!(entries <= 2, "{entries} shapes cached");
        assert!(c.core.stats().batch_bytes.load(Ordering::Relaxed) <= 1024);
        // Graphs of evicted shapes are gone.
        assert!(server.backend.live_graphs.load(Ordering::Relaxed) <= 2);
    }
    // A run larger than the bytes a client may cache is never learned.
    let before = counters(c.core.stats());
    for _ in 0..3 {
        for i in 64..104 {
            quiet(&mut c, &launch(f, &k_params(i)), s);
        }
        c.send(&Request::Mark, s, flags::MARK);
    }
    assert_eq!(counters(c.core.stats()), before);
}

#[test]
fn a_clients_own_capture_and_batching_never_mix() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    recorder_run(&mut c, f, s, 3);
    let before = counters(c.core.stats());
    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    for i in 0..3 {
        quiet(&mut c, &launch(f, &k_params(i)), s);
        assert!(!c.core.holds_run());
    }
    let [_, recorded, ..] = c.ok(&Request::StreamEndCapture { stream: s }, 0);
    assert_eq!(recorded, 3);
    assert_eq!(counters(c.core.stats()), before);
}

#[test]
fn freeing_a_host_buffer_forgets_the_shapes_that_copy_through_it() {
    let server = sim();
    let mut r = Rig::new(&server, batching());
    r.infer(2);
    r.infer(2);
    assert_eq!(r.counters()[3], 1);
    let (hb, _) = r.input.clone();
    r.c.ok(&Request::HostFree { handle: hb }, 0);
    assert_eq!(r.counters()[3], 0);
    assert_eq!(r.c.core.stats().batch_bytes.load(Ordering::Relaxed), 0);
}

#[test]
fn a_shape_serves_only_the_stream_it_was_learned_in_and_goes_with_it() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let m = c.load_module(PTX).unwrap();
    let f = c.function(m, "k");
    let (s, t) = (c.stream(), c.stream());
    recorder_run(&mut c, f, s, 3);
    assert_eq!(counters(c.core.stats()), [1, 1, 1, 1]);
    // The same run in another stream is learned there, not launched from s's graph.
    recorder_run(&mut c, f, t, 1);
    assert_eq!(counters(c.core.stats()), [1, 1, 1, 2]);
    recorder_run(&mut c, f, t, 2);
    assert_eq!(counters(c.core.stats()), [2, 2, 2, 2]);
    let launches: Vec<u32> = server
        .backend
        .take()
        .iter()
        .filter(|x| x.op == Opcode::GraphLaunch)
        .map(|x| x.stream)
        .collect();
    // Two in each stream (the first of each made its graph).
    assert_eq!(launches.len(), 4, "{launches:?}");
    assert_eq!(launches[0], launches[1]);
    assert_eq!(launches[2], launches[3]);
    assert_ne!(launches[0], launches[2]);
    c.ok(&Request::StreamDestroy { stream: t }, 0);
    assert_eq!(counters(c.core.stats())[3], 1);
    assert_eq!(server.backend.live_graphs.load(Ordering::Relaxed), 1);
}

#[test]
fn unloading_a_module_forgets_the_shapes_that_launch_its_kernels() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (m, other) = (c.load_module(PTX).unwrap(), c.load_module(PTX).unwrap());
    let (f, g) = (c.function(m, "k"), c.function(other, "k"));
    let s = c.stream();
    recorder_run(&mut c, f, s, 3);
    recorder_run(&mut c, g, s, 3);
    assert_eq!(counters(c.core.stats()), [2, 2, 2, 2]);
    c.ok(&Request::ModuleUnload { module: m }, 0);
    assert_eq!(counters(c.core.stats())[3], 1);
    assert_eq!(server.backend.live_graphs.load(Ordering::Relaxed), 1);
    // The other module's shape still serves its runs.
    recorder_run(&mut c, g, s, 1);
    assert_eq!(counters(c.core.stats())[0], 3);
}

/// Runs that each come twice (a new shape every second run) make graphs that serve only the
/// run they were made for: once four new shapes have followed one of them, no more are made
/// and no run is held, while a shape that keeps coming still gets its graph, later.
#[test]
fn graphs_that_serve_only_their_own_run_stop_being_made() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let s = c.stream();
    let shapes = kernels(&mut c, 31);
    let runs = |c: &mut Client<Recorder>, shape: usize, times: usize| {
        for _ in 0..times {
            for i in 0..3 {
                quiet(c, &launch(shapes[shape], &k_params(i)), s);
            }
            c.send(&Request::Mark, s, flags::MARK);
        }
    };
    let graph_launches = |b: &Recorder| launched_graphs(&b.take());
    // Shapes 0 to 3 get a graph at their second run. Shape 4 is the fourth new shape since
    // shape 0's graph, which served that run alone: from then on a shape needs four runs.
    for shape in 0..5 {
        runs(&mut c, shape, 2);
    }
    assert_eq!(counters(c.core.stats())[..3], [0, 4, 4]);
    assert_eq!(graph_launches(&server.backend), 4);
    // Fifteen more pairs: no graph, nothing held, every launch on its own.
    for shape in 5..20 {
        runs(&mut c, shape, 2);
    }
    assert_eq!(counters(c.core.stats())[..3], [0, 4, 4]);
    let sent = server.backend.take();
    assert_eq!(
        sent.iter().filter(|s| s.op == Opcode::Launch).count(),
        15 * 2 * 3
    );
    assert!(sent.iter().all(|s| s.op != Opcode::GraphLaunch));
    // A shape that keeps coming: learned, seen twice more, its graph made at the fourth run
    // and launched again at the fifth.
    runs(&mut c, 30, 5);
    assert_eq!(counters(c.core.stats())[..3], [1, 5, 5]);
    assert_eq!(graph_launches(&server.backend), 2);
}

#[test]
fn runs_that_begin_alike_and_then_differ_stop_being_held() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    let others = kernels(&mut c, 40);
    // Each run the same first launch, then one of a kernel of its own. Whether the first
    // launch was held back, run by run.
    let mut run = |n: usize| {
        quiet(&mut c, &launch(f, &k_params(0)), s);
        let held = c.core.holds_run();
        quiet(&mut c, &launch(others[n], &k_params(1)), s);
        c.send(&Request::Mark, s, flags::MARK);
        held
    };
    let held: Vec<bool> = (0..40).map(&mut run).collect();
    // The first run is learned; the next ones are held until eight of them left their shape.
    assert_eq!(held.iter().filter(|&&h| h).count(), 8, "{held:?}");
    assert!(
        held[1..9].iter().all(|&h| h) && !held[9..].iter().any(|&h| h),
        "{held:?}"
    );
    assert_eq!(c.core.stats().batch_diverged.load(Ordering::Relaxed), 8);
    assert_eq!(counters(c.core.stats())[..3], [0, 8, 0]);
    // Nothing was lost: every launch reached the backend, none as a graph.
    let sent = server.backend.take();
    assert_eq!(sent.iter().filter(|s| s.op == Opcode::Launch).count(), 80);
    assert!(sent.iter().all(|s| s.op != Opcode::GraphLaunch));
}

/// Launches of `kernels` in stream `s`, the `i`-th with `k_params(i)`; their numbers.
fn launches_of(c: &mut Client<Recorder>, s: u64, kernels: &[u64]) -> Vec<u64> {
    kernels
        .iter()
        .enumerate()
        .map(|(i, &k)| quiet(c, &launch(k, &k_params(i as u8)), s))
        .collect()
}

/// A run of [`launches_of`] `kernels`, ended by a synchronise's mark; the launches' numbers.
fn run_of(c: &mut Client<Recorder>, s: u64, kernels: &[u64]) -> Vec<u64> {
    let seqs = launches_of(c, s, kernels);
    c.send(&Request::Mark, s, flags::MARK);
    seqs
}

/// A short shape learned first (as a program's first runs are cut short while it warms up)
/// does not cut the longer runs that begin with it into pieces: a run that went on after the
/// short shape's graph was launched is learned whole, and its own graph then serves it; a run
/// that leaves the longer shape still has its beginning served by the short one.
#[test]
fn a_run_that_goes_on_past_a_shorter_shape_is_learned_whole() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    let g = kernels(&mut c, 1)[0];
    for _ in 0..3 {
        run_of(&mut c, s, &[f, f]);
    }
    assert_eq!(counters(c.core.stats()), [1, 1, 1, 1]);
    // The short shape's graph serves the first two launches; the run is learned at its end.
    run_of(&mut c, s, &[f, f, g, g]);
    assert_eq!(counters(c.core.stats()), [2, 1, 1, 2]);
    // Held past the short shape, it makes its own graph, then is launched from it.
    run_of(&mut c, s, &[f, f, g, g]);
    assert_eq!(counters(c.core.stats()), [2, 2, 2, 2]);
    server.backend.take();
    run_of(&mut c, s, &[f, f, g, g]);
    assert_eq!(counters(c.core.stats()), [3, 2, 2, 2]);
    let sent = server.backend.take();
    let ops: Vec<Opcode> = sent.iter().map(|s| s.op).collect();
    assert_eq!(ops, [Opcode::GraphLaunch, Opcode::Mark]);
    // The short shape still serves a run that is just it, a run not cut short.
    let enders = c.core.batch_enders();
    run_of(&mut c, s, &[f, f]);
    assert_eq!(counters(c.core.stats()), [4, 2, 2, 2]);
    assert_eq!(c.core.batch_enders(), enders);
    assert_eq!(c.core.stats().batch_learned.load(Ordering::Relaxed), 2);
    // And a run held past it that then leaves the longer shape: its first two launches still
    // go as the short shape's graph, the rest one by one.
    server.backend.take();
    run_of(&mut c, s, &[f, f, g, f]);
    assert_eq!(counters(c.core.stats())[0], 5);
    let ops: Vec<Opcode> = server.backend.take().iter().map(|s| s.op).collect();
    assert_eq!(
        ops,
        [
            Opcode::GraphLaunch,
            Opcode::Launch,
            Opcode::Launch,
            Opcode::Mark
        ]
    );
}

/// A run held for a long shape that the client pauses in (its hold runs out) goes as the
/// shorter shapes its pieces make up, in order, with what lies between them one by one.
#[test]
fn a_run_held_in_vain_still_goes_as_the_shapes_its_pieces_make_up() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    let g = kernels(&mut c, 1)[0];
    // [f, f] and [f, f, g, f, f, g], each with its graph.
    for _ in 0..3 {
        run_of(&mut c, s, &[f, f]);
    }
    for _ in 0..3 {
        run_of(&mut c, s, &[f, f, g, f, f, g]);
    }
    assert_eq!(counters(c.core.stats())[2], 2);
    server.backend.take();
    let seqs = launches_of(&mut c, s, &[f, f, g, f, f]);
    assert!(c.core.holds_run());
    c.core.flush_held();
    let sent: Vec<(Opcode, u64)> = server
        .backend
        .take()
        .iter()
        .map(|s| (s.op, s.seq))
        .collect();
    assert_eq!(
        sent,
        [
            (Opcode::GraphLaunch, seqs[0]),
            (Opcode::Launch, seqs[2]),
            (Opcode::GraphLaunch, seqs[3])
        ]
    );
    c.send(&Request::Mark, s, flags::MARK);
}

/// Random requests made of a few pieces that repeat (so shapes are learned, held, launched
/// and left), with fills and memsets of new values, moved buffers, requests cut short and holds
/// that run out midway, give
/// a batching client the device memory of one that does not batch, after every request:
/// nothing held is lost, reordered, sent twice or sent with stale work.
#[test]
fn random_runs_give_the_results_of_the_unbatched_path() {
    let server = sim();
    let plain = Limits {
        launch_batching: false,
        ..Limits::default()
    };
    let mut rigs = [Rig::new(&server, batching()), Rig::new(&server, plain)];
    let bufs: Vec<[u64; 4]> = rigs
        .iter_mut()
        .map(|r| {
            let (z, w) = (r.c.alloc(r.n * 4), r.c.alloc(r.n * 4));
            [r.x, r.y, z, w]
        })
        .collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let f32_bits = |v: u64| (v as f32).to_bits();
    for request in 0..1000 {
        // The pieces of this request: (kind, buffer a, buffer b, value), the same for both.
        // 3 begins as 1 and 2 do, then leaves them; 4 is pieces at random after the first; 5
        // is the second piece of 1 and 2 alone, a shape their holds can end in; 6 leaves every
        // shape after the first piece.
        let program = [0usize, 0, 1, 2, 2, 3, 4, 5, 6][next(9) as usize];
        let moved = next(6) == 0;
        let (a, b) = if moved { (2, 3) } else { (0, 1) };
        let mut pieces: Vec<(u8, usize, usize, u32)> = Vec::new();
        let v = f32_bits(1 + next(5));
        if program != 5 {
            pieces.push((0, a, b, v));
        }
        if (1..3).contains(&program) || program == 5 {
            pieces.push((1, b, 2, f32_bits(1 + next(3))));
        }
        if (2..4).contains(&program) {
            pieces.push((2, 2, 3, 0));
        }
        if program == 6 {
            pieces.push((3, 0, 2, 1 + next(rigs[0].n - 1) as u32));
        }
        if program == 4 {
            for _ in 0..1 + next(3) {
                let kind = next(3) as u8;
                pieces.push((kind, next(4) as usize, 2, f32_bits(1 + next(3))));
            }
        }
        let cut = if next(8) == 0 {
            next(3) as usize + 1
        } else {
            usize::MAX
        };
        // The command after which the hold runs out, if it does in this request.
        let hold_out = if next(5) == 0 {
            next(8) as usize
        } else {
            usize::MAX
        };
        for (r, bufs) in rigs.iter_mut().zip(&bufs) {
            let (s, n) = (r.s, r.n);
            let mut commands = 0;
            let mut post = |r: &mut Rig, req: &Request<'_>| {
                if commands < cut {
                    quiet(&mut r.c, req, s);
                }
                if commands == hold_out {
                    // What the shell does when the client's ring stays empty for the hold.
                    r.c.core.flush_held();
                    assert!(r.c.core.take_batch_errors().is_empty());
                }
                commands += 1;
            };
            for &(kind, i, j, value) in &pieces {
                let (p, q) = (bufs[i], bufs[j]);
                match kind {
                    0 => {
                        post(r, &launch(r.fill, &fill_params(p, value, n)));
                        post(r, &launch(r.add, &add_params(p, q, q, n)));
                    }
                    1 => {
                        let fill = Fill {
                            dst: q,
                            value,
                            elem_size: 4,
                            count: n,
                        };
                        post(r, &Request::Memset { fill });
                        post(r, &launch(r.add, &add_params(q, p, p, n)));
                    }
                    2 => {
                        post(r, &launch(r.add, &add_params(p, q, p, n)));
                        post(r, &launch(r.add, &add_params(p, q, q, n)));
                    }
                    _ => {
                        // A memset of `value` elements: other work than any before it.
                        let fill = Fill {
                            dst: q,
                            value: 7,
                            elem_size: 4,
                            count: u64::from(value),
                        };
                        post(r, &Request::Memset { fill });
                    }
                }
            }
            r.sync();
        }
        let read = |r: &mut Rig, bufs: &[u64; 4]| {
            let mut all = Vec::new();
            for pair in bufs.chunks(2) {
                let (s, one, two) = (r.s, r.copy_out(pair[0], 0), r.copy_out(pair[1], r.n * 4));
                quiet(&mut r.c, &one, s);
                quiet(&mut r.c, &two, s);
                r.sync();
                all.extend(u32s(&r.output.1, 2 * r.n as usize));
            }
            all
        };
        let [batched, unbatched] = &mut rigs;
        let (got, want) = (read(batched, &bufs[0]), read(unbatched, &bufs[1]));
        if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
            panic!(
                "request {request} ({pieces:?}, cut at {cut}): buffer {}, element {}: {:#x}, \
                 not {:#x}",
                i / batched.n as usize,
                i % batched.n as usize,
                got[i],
                want[i]
            );
        }
    }
    let [hits, misses, graphs, _] = rigs[0].counters();
    assert!(
        hits > 100 && graphs > 1,
        "{hits} hits, {misses} not, {graphs} graphs"
    );
    assert!(
        rigs[0]
            .c
            .core
            .stats()
            .batch_diverged
            .load(Ordering::Relaxed)
            > 0
    );
    assert_eq!(rigs[1].counters(), [0, 0, 0, 0]);
}

/// A client that posts far more launches than a run holds before it synchronises has them
/// learned and launched a run's length at a time: the first piece is learned, the second makes
/// the graph, the third is launched from it, and what is left over goes on its own.
#[test]
fn a_long_stream_of_work_is_batched_in_pieces() {
    use crate::session::core::MAX_RUN;
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    let mut seqs = Vec::new();
    for _ in 0..3 * MAX_RUN + 10 {
        seqs.push(quiet(&mut c, &launch(f, &k_params(0)), s));
    }
    c.send(&Request::Mark, s, flags::MARK);
    let sent = server.backend.take();
    let launches: Vec<u64> = sent
        .iter()
        .filter(|s| s.op == Opcode::Launch)
        .map(|s| s.seq)
        .collect();
    // The first piece one by one, the second as the capture records it into the graph, the
    // last ten on their own (held as the start of the piece's shape, then let go at the mark).
    let mut want = seqs[..2 * MAX_RUN].to_vec();
    want.extend(&seqs[3 * MAX_RUN..]);
    assert_eq!(launches, want);
    assert_eq!(server.backend.captures.load(Ordering::Relaxed), 1);
    let graph_launches: Vec<u64> = sent
        .iter()
        .filter(|s| s.op == Opcode::GraphLaunch)
        .map(|s| s.seq)
        .collect();
    // Each under its piece's first command.
    assert_eq!(graph_launches, [seqs[MAX_RUN], seqs[2 * MAX_RUN]]);
    assert_eq!(counters(c.core.stats())[..3], [1, 2, 1]);
}

/// With a shorter run limit, a request longer than it goes to the device in pieces, each
/// launched from its graph as soon as it is whole: the device starts on the request while the
/// client is still posting the rest.
#[test]
fn a_shorter_run_limit_launches_a_requests_pieces_while_it_is_posted() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits {
        max_batch_run: 8,
        ..batching()
    });
    let (f, s) = kernel_and_stream(&mut c);
    let post = |c: &mut Client<Recorder>, n: usize| {
        for _ in 0..n {
            quiet(c, &launch(f, &k_params(0)), s);
        }
    };
    // Learned, graphs made, launched from them.
    for _ in 0..2 {
        post(&mut c, 20);
        c.send(&Request::Mark, s, flags::MARK);
    }
    server.backend.take();
    for piece in ["the first piece", "the second piece"] {
        post(&mut c, 8);
        let sent = server.backend.take();
        assert_eq!(launched_graphs(&sent), 1, "{piece} waits: {sent:?}");
    }
    post(&mut c, 4);
    c.send(&Request::Mark, s, flags::MARK);
    let sent = server.backend.take();
    assert_eq!(launched_graphs(&sent), 1, "the last piece goes at the mark");
    assert!(!sent.iter().any(|s| s.op == Opcode::Launch), "{sent:?}");
}

/// The run limit is checked where it is set: a run of one command gains nothing, and a shape's
/// graph holds at most `MAX_RUN` nodes.
#[test]
fn a_run_limit_outside_its_range_is_refused() {
    use crate::session::core::MAX_RUN;
    for bad in [0, 1, MAX_RUN + 1] {
        let limits = Limits {
            max_batch_run: bad,
            ..Limits::default()
        };
        let err = limits.check().unwrap_err();
        assert!(err.message.contains("--max-batch-run"), "{bad}: {err}");
    }
    for good in [2, MAX_RUN] {
        let limits = Limits {
            max_batch_run: good,
            ..Limits::default()
        };
        limits.check().unwrap();
    }
}

#[test]
fn what_ends_a_clients_runs_is_counted_for_the_log() {
    let server = sim();
    let mut r = Rig::new(&server, batching());
    let t = r.c.stream();
    let event = r.c.event();
    // Rig::new's fill was a run of one launch, ended by its synchronise's mark; so is the
    // first request's run. The second and third are launched whole as their shape's graph,
    // so the marks after them end no open run.
    for _ in 0..3 {
        r.infer(2);
    }
    let (s, copy_in) = (r.s, r.copy_in());
    quiet(&mut r.c, &copy_in, s);
    let params = fill_params(r.y, 1, 4);
    quiet(&mut r.c, &launch(r.fill, &params), t);
    r.c.send(&Request::EventRecord { event }, t, flags::MARK);
    // Nothing is open now: a second terminator in a row ends no run.
    r.c.send(&Request::EventRecord { event }, t, flags::MARK);
    assert_eq!(
        r.c.core.batch_enders(),
        "mark (marked) 2, work on another stream 1, event_record (marked) 1"
    );
}

/// A run of a plain launch, a launch in clusters of two blocks and a plain launch, with the last
/// one's parameters from `last`.
fn cluster_run(c: &mut Client<Recorder>, f: u64, s: u64, last: u8) -> Vec<u64> {
    let mut seqs = vec![quiet(c, &launch(f, &k_params(0)), s)];
    let pairs = mps_core::protocol::Cluster {
        dims: Dim3 { x: 2, y: 1, z: 1 },
        non_portable: false,
    };
    let p = k_params(1);
    seqs.push(quiet(c, &launch_in_clusters(f, &p, 2, Some(pairs)), s));
    seqs.push(quiet(c, &launch(f, &k_params(last)), s));
    c.send(&Request::Mark, s, flags::MARK);
    seqs
}

#[test]
fn a_cached_graph_is_given_the_parameters_that_changed_and_launches_in_clusters_join_runs() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    for _ in 0..3 {
        cluster_run(&mut c, f, s, 2);
    }
    assert_eq!(counters(c.core.stats()), [1, 1, 1, 1]);
    let b = &server.backend;
    assert!(b.updates.lock().unwrap().is_empty());
    // The third launch's parameters change: that node alone is updated, then the graph
    // launched; the same parameters again need no update.
    cluster_run(&mut c, f, s, 7);
    cluster_run(&mut c, f, s, 7);
    let want = Updated::Launch {
        grid: one(),
        params: k_params(7),
    };
    assert_eq!(*b.updates.lock().unwrap(), vec![(2, want)]);
    assert_eq!(counters(c.core.stats()), [3, 1, 1, 1]);
    let sent = b.take();
    assert_eq!(launched_graphs(&sent), 4);
    // An update the backend refuses: the run goes command by command, each under its own
    // number, and the shape's runs are not held any more.
    b.refuse_updates.store(true, Ordering::Relaxed);
    let seqs = cluster_run(&mut c, f, s, 2);
    let launched: Vec<u64> = b
        .take()
        .iter()
        .filter(|s| s.op == Opcode::Launch)
        .map(|s| s.seq)
        .collect();
    assert_eq!(launched, seqs);
    assert!(c.core.take_batch_errors().is_empty());
    quiet(&mut c, &launch(f, &k_params(0)), s);
    assert!(!c.core.holds_run());
    c.send(&Request::Mark, s, flags::MARK);
}

#[test]
fn a_cached_graph_is_given_the_geometry_and_the_memsets_that_changed() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(batching());
    let (f, s) = kernel_and_stream(&mut c);
    let (a, b) = (c.alloc(64), c.alloc(64));
    let fill = |dst, value, count| Fill {
        dst,
        value,
        elem_size: 4,
        count,
    };
    // A launch in a grid of `blocks`, then a memset.
    let run = |c: &mut Client<Recorder>, blocks: u32, memset: Fill| {
        quiet(c, &launch_in_clusters(f, &k_params(0), blocks, None), s);
        quiet(c, &Request::Memset { fill: memset }, s);
        c.send(&Request::Mark, s, flags::MARK);
    };
    for _ in 0..3 {
        run(&mut c, 1, fill(a, 0, 16));
    }
    assert_eq!(counters(c.core.stats()), [1, 1, 1, 1]);
    // Another grid, then another destination and value: the same shape, its nodes given the
    // run's work; the same work again needs no update.
    run(&mut c, 4, fill(a, 0, 16));
    run(&mut c, 4, fill(b, 5, 16));
    run(&mut c, 4, fill(b, 5, 16));
    let grid = Dim3 { x: 4, y: 1, z: 1 };
    let params = k_params(0);
    assert_eq!(
        *server.backend.updates.lock().unwrap(),
        vec![
            (0, Updated::Launch { grid, params }),
            (1, Updated::Memset(fill(b, 5, 16)))
        ]
    );
    assert_eq!(counters(c.core.stats()), [4, 1, 1, 1]);
    // A memset of another size is other work: the run leaves the shape.
    run(&mut c, 4, fill(b, 5, 8));
    assert_eq!(counters(c.core.stats())[0], 4);
    assert_eq!(c.core.stats().batch_diverged.load(Ordering::Relaxed), 1);
    // Memsets reached the backend on their own at the first run, in the capture at the
    // second, and at the last.
    let memsets = server.backend.take();
    assert_eq!(memsets.iter().filter(|s| s.op == Opcode::Memset).count(), 3);
}

/// Graph launches of 8 runs of 3 launches posted `gap` apart, by a client that sees the CPUs
/// `contended` or not, and what the log says pacing made of them.
fn runs_posted(contended: bool, gap: Duration) -> (usize, String) {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(paced(contended));
    let (f, s) = kernel_and_stream(&mut c);
    for _ in 0..8 {
        for i in 0..3 {
            if i > 0 {
                std::thread::sleep(gap);
            }
            quiet(&mut c, &launch(f, &k_params(i)), s);
        }
        c.send(&Request::Mark, s, flags::MARK);
    }
    let sent = server.backend.take();
    (launched_graphs(&sent), c.core.batch_paced())
}

/// A run whose commands the server waits for (`BURST_GAP` apart or more) is held for a graph
/// only while the CPUs are contended: while they are free, submitting each command as it comes
/// lets the device start on the run at once. A run posted in a burst is held either way.
#[test]
fn a_slowly_posted_run_is_held_only_while_the_cpus_are_contended() {
    let slow = Duration::from_micros(200);
    // Learned at the first run, its graph made at the second and launched again after.
    let (contended, paced) = runs_posted(true, slow);
    assert_eq!(contended, 7, "contended CPUs");
    // The log tells what pacing did: the second run is held for its graph, as are the rest.
    assert_eq!(
        paced,
        "7 held, 0 submitted as they came while the CPUs were free"
    );
    let (free, paced) = runs_posted(false, slow);
    assert_eq!(free, 0, "free CPUs");
    assert_eq!(
        paced,
        "0 held, 7 submitted as they came while the CPUs were free"
    );
    // A run that this thread lost its CPU in the middle of counts as slow: the next goes
    // command by command, and holding resumes after it.
    let (burst, _) = runs_posted(false, Duration::ZERO);
    assert!(
        burst >= 5,
        "a burst on free CPUs: {burst} of 7 runs from a graph"
    );
}

/// A slowly posted request held on contended CPUs goes in pieces of `SLOW_RUN` commands, each
/// launched from its graph once it is whole: the device starts on the request while the client
/// is still posting it, however long the run limit.
#[test]
fn a_slowly_posted_run_held_on_contended_cpus_goes_in_pieces() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(paced(true));
    let (f, s) = kernel_and_stream(&mut c);
    let post = |c: &mut Client<Recorder>, n: usize| {
        for i in 0..n {
            std::thread::sleep(Duration::from_micros(200));
            quiet(c, &launch(f, &k_params(i as u8)), s);
        }
    };
    // The first request, its client's pace not yet known, goes whole; the next are pieced:
    // learned, then their graphs made.
    for _ in 0..3 {
        post(&mut c, 40);
        c.send(&Request::Mark, s, flags::MARK);
    }
    server.backend.take();
    post(&mut c, 32);
    let sent = server.backend.take();
    assert_eq!(launched_graphs(&sent), 1, "the first piece waits: {sent:?}");
    post(&mut c, 8);
    c.send(&Request::Mark, s, flags::MARK);
    let sent = server.backend.take();
    assert_eq!(launched_graphs(&sent), 1, "the rest goes at the mark");
    assert!(!sent.iter().any(|s| s.op == Opcode::Launch), "{sent:?}");
    // A request that began slowly keeps its pieces when its pace turns: posted at once, it
    // still goes as the two pieces' graphs, and no run of another length is learned.
    let learned = |c: &Client<Recorder>| c.core.stats().batch_learned.load(Ordering::Relaxed);
    let before = learned(&c);
    for i in 0..40 {
        quiet(&mut c, &launch(f, &k_params(i)), s);
    }
    c.send(&Request::Mark, s, flags::MARK);
    assert_eq!(launched_graphs(&server.backend.take()), 2);
    assert_eq!(learned(&c), before, "shapes learned");
}

/// Graph launches of four slowly posted runs that each hold a burst (one library call's three
/// launches, posted at once) which the client first posted as runs of their own, by a client
/// that sees the CPUs `contended` or not.
fn bursts_in_slow_runs(contended: bool) -> usize {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(paced(contended));
    let s = c.stream();
    let k = kernels(&mut c, 2);
    let (slow, burst) = (k[0], [k[1]; 3]);
    // The burst alone, as while a program warms up: learned, its graph made, then launched
    // (more than once, though a descheduled test thread can make a run of it slow).
    for _ in 0..6 {
        run_of(&mut c, s, &burst);
    }
    assert!(
        launched_graphs(&server.backend.take()) > 0,
        "the burst alone"
    );
    let gap = Duration::from_micros(200);
    for _ in 0..4 {
        for i in 0..6 {
            std::thread::sleep(gap);
            quiet(&mut c, &launch(slow, &k_params(i)), s);
        }
        launches_of(&mut c, s, &burst);
        std::thread::sleep(gap);
        quiet(&mut c, &launch(slow, &k_params(9)), s);
        c.send(&Request::Mark, s, flags::MARK);
    }
    launched_graphs(&server.backend.take())
}

/// A slowly posted run holds nothing while the CPUs are free, not even a burst inside it that
/// is a shape of its own: holding the burst would keep the device waiting as holding the run
/// does. While they are contended, the burst and then the whole run go from graphs.
#[test]
fn a_burst_inside_a_slowly_posted_run_is_held_only_while_the_cpus_are_contended() {
    assert_eq!(bursts_in_slow_runs(false), 0, "free CPUs");
    let contended = bursts_in_slow_runs(true);
    assert!(contended >= 4, "contended CPUs: {contended} graph launches");
}

/// A client that posted one slow run and then posts in bursts has its runs held again on free
/// CPUs: a fast run ends what the slow one told of its pace, however short.
#[test]
fn a_client_that_turns_to_bursts_has_its_runs_held_again() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(paced(false));
    let (f, s) = kernel_and_stream(&mut c);
    for i in 0..6 {
        std::thread::sleep(Duration::from_micros(200));
        quiet(&mut c, &launch(f, &k_params(i)), s);
    }
    c.send(&Request::Mark, s, flags::MARK);
    let burst = [f; 3];
    for _ in 0..20 {
        run_of(&mut c, s, &burst);
    }
    let graphs = launched_graphs(&server.backend.take());
    assert!(graphs >= 10, "{graphs} of 20 bursts from a graph");
}
