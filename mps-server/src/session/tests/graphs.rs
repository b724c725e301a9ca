//! Graphs: a stream's work captured, replayed, refused where unsupported, owned per client,
//! bounded, and released when the client leaves.

use super::*;

#[test]
fn a_captured_stream_runs_nothing_and_each_launch_replays_it() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let add = c.function(m, "add_f32");
    let n = 64u64;
    let (acc, one_f) = (c.alloc(n * 4), c.alloc(n * 4));
    let (hb, seg) = host_buffer(&mut c, n * 4);
    let s = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let (s, slot) = (s[0], s[1] as u32);
    // acc = 0, one = 1.0 (run before the capture).
    c.ok(
        &Request::Memset {
            fill: Fill {
                dst: acc,
                value: 0,
                elem_size: 4,
                count: n,
            },
        },
        s,
    );
    let one_bits = 1.0f32.to_bits();
    c.ok(
        &Request::Memset {
            fill: Fill {
                dst: one_f,
                value: one_bits,
                elem_size: 4,
                count: n,
            },
        },
        s,
    );
    sync(&mut c, s, slot);

    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    let params = add_params(acc, one_f, acc, n);
    c.ok(&launch(add, &params), s);
    let to_host = Request::CopyDtoH {
        dst: HostRef::Buffer {
            handle: hb,
            offset: 0,
        },
        src: acc,
        len: n * 4,
    };
    c.ok(&to_host, s);
    let [graph, commands, ..] = c.ok(&Request::StreamEndCapture { stream: s }, 0);
    assert_eq!(commands, 2);
    // Nothing ran: the host buffer still holds zeros after the stream drained.
    sync(&mut c, s, slot);
    assert!(u32s(&seg, n as usize).iter().all(|&v| v == 0));

    let exec = c.ok(&Request::GraphInstantiate { graph }, 0)[0];
    // The graph is not needed once instantiated.
    c.ok(&Request::GraphDestroy { graph }, 0);
    for k in 1..=25u32 {
        c.ok(&Request::GraphLaunch { exec }, s);
        sync(&mut c, s, slot);
        let want = (k as f32).to_bits();
        assert!(
            u32s(&seg, n as usize).iter().all(|&v| v == want),
            "after replay {k}"
        );
    }
    // Into another stream too.
    let t = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    c.ok(&Request::GraphLaunch { exec }, t[0]);
    sync(&mut c, t[0], t[1] as u32);
    assert!(u32s(&seg, 1)[0] == 26.0f32.to_bits());
    c.ok(&Request::GraphExecDestroy { exec }, 0);
    assert!(c.faults.0.lock().unwrap().is_empty());
}

#[test]
fn a_replay_runs_on_the_clients_sm_share() {
    let server = sim(); // 4 SMs
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let spin = c.function(m, "spin_ns");
    let counter = c.alloc(4);
    let s = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let (s, slot) = (s[0], s[1] as u32);
    let ns = 20_000_000u64;
    let mut params = [0u8; 16];
    params[..8].copy_from_slice(&ns.to_le_bytes());
    params[8..].copy_from_slice(&counter.to_le_bytes());
    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    let four_blocks = Request::Launch {
        spec: LaunchSpec {
            function: spin,
            grid: Dim3 { x: 4, y: 1, z: 1 },
            block: one(),
            shared_mem: 0,
            cluster: None,
            params: &params,
        },
    };
    c.ok(&four_blocks, s);
    let graph = c.ok(&Request::StreamEndCapture { stream: s }, 0)[0];
    let exec = c.ok(&Request::GraphInstantiate { graph }, 0)[0];
    // The client's placement changes to one SM after the capture: the replay follows it, so
    // its four blocks run in four waves of `ns` each instead of one.
    c.core.context().sm.sms.store(1, Ordering::Relaxed);
    let started = Instant::now();
    c.ok(&Request::GraphLaunch { exec }, s);
    sync(&mut c, s, slot);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_nanos(4 * ns),
        "a replay on one SM took {took:?}, less than four waves of {ns} ns"
    );
    assert!(c.faults.0.lock().unwrap().is_empty());
}

#[test]
fn what_a_capture_cannot_hold_is_refused_by_name_and_spoils_it() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let s = c.stream();
    let e = c.event();
    let p = c.alloc(256);
    let (hb, _seg) = host_buffer(&mut c, 4096);
    let other = c.stream();
    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    c.refused(
        &Request::StreamBeginCapture { stream: s },
        0,
        Status::InvalidValue,
        "already capturing",
    );
    let unsupported = [
        (Request::EventRecord { event: e }, "recording an event"),
        (
            Request::StreamWaitEvent { event: e },
            "waiting for an event",
        ),
        (Request::GraphLaunch { exec: 1 }, "launching a graph"),
        (
            Request::CopyHtoD {
                dst: p,
                src: HostRef::Staging { offset: 0 },
                len: 4,
            },
            "pageable memory",
        ),
    ];
    for (req, says) in unsupported {
        c.refused(&req, s, Status::Unsupported, says);
    }
    c.refused(
        &Request::Mark,
        s,
        Status::InvalidValue,
        "cannot be waited for",
    );
    c.refused(
        &Request::StreamDestroy { stream: s },
        0,
        Status::InvalidValue,
        "end the capture before destroying it",
    );
    c.refused(
        &Request::MemFree { ptr: p },
        0,
        Status::InvalidValue,
        "captures a graph",
    );
    c.refused(
        &Request::HostFree { handle: hb },
        0,
        Status::InvalidValue,
        "captures a graph",
    );
    // Other streams run as usual.
    c.ok(
        &Request::Memset {
            fill: Fill {
                dst: p,
                value: 1,
                elem_size: 1,
                count: 4,
            },
        },
        other,
    );
    // The first refusal in the stream spoilt the capture, as in CUDA.
    let spoilt = c.refused(
        &Request::StreamEndCapture { stream: s },
        0,
        Status::InvalidValue,
        "was spoilt by command",
    );
    assert!(spoilt.message.contains("recording an event"), "{spoilt}");
    c.refused(
        &Request::StreamEndCapture { stream: s },
        0,
        Status::InvalidValue,
        "is not capturing",
    );
    // The stream runs work again, and memory can be freed.
    c.ok(
        &Request::Memset {
            fill: Fill {
                dst: p,
                value: 1,
                elem_size: 1,
                count: 4,
            },
        },
        s,
    );
    c.ok(&Request::MemFree { ptr: p }, 0);
}

#[test]
fn a_graph_keeps_its_host_buffers_and_rechecks_its_device_ranges() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let s = c.stream();
    let p = c.alloc(256);
    let (hb, _seg) = host_buffer(&mut c, 4096);
    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    let copy = Request::CopyHtoD {
        dst: p,
        src: HostRef::Buffer {
            handle: hb,
            offset: 0,
        },
        len: 256,
    };
    c.ok(&copy, s);
    let graph = c.ok(&Request::StreamEndCapture { stream: s }, 0)[0];
    let exec = c.ok(&Request::GraphInstantiate { graph }, 0)[0];
    let in_use = |c: &mut Client<SimBackend>| {
        c.refused(
            &Request::HostFree { handle: hb },
            0,
            Status::InvalidValue,
            "destroy the graphs that use it",
        )
    };
    in_use(&mut c);
    c.ok(&Request::GraphDestroy { graph }, 0);
    in_use(&mut c);
    // The destination goes away: the graph may no longer write there.
    c.ok(&Request::MemFree { ptr: p }, 0);
    c.refused(
        &Request::GraphLaunch { exec },
        s,
        Status::InvalidHandle,
        "can no longer run",
    );
    c.ok(&Request::GraphExecDestroy { exec }, 0);
    c.ok(&Request::HostFree { handle: hb }, 0);
}

#[test]
fn one_clients_graphs_are_unknown_to_another() {
    let server = sim();
    let mut a = server.client(Limits::default());
    let mut b = server.client(Limits::default());
    let s = a.stream();
    a.ok(&Request::StreamBeginCapture { stream: s }, 0);
    let graph = a.ok(&Request::StreamEndCapture { stream: s }, 0)[0];
    let exec = a.ok(&Request::GraphInstantiate { graph }, 0)[0];
    let theirs = "does not belong to this client";
    b.refused(
        &Request::GraphInstantiate { graph },
        0,
        Status::InvalidHandle,
        theirs,
    );
    b.refused(
        &Request::GraphDestroy { graph },
        0,
        Status::InvalidHandle,
        theirs,
    );
    b.refused(
        &Request::GraphExecDestroy { exec },
        0,
        Status::InvalidHandle,
        theirs,
    );
    b.refused(
        &Request::GraphLaunch { exec },
        0,
        Status::InvalidHandle,
        theirs,
    );
    b.refused(
        &Request::StreamBeginCapture { stream: s },
        0,
        Status::InvalidHandle,
        theirs,
    );
    // A handle of the wrong kind is named as such.
    a.refused(
        &Request::GraphLaunch { exec: graph },
        0,
        Status::InvalidHandle,
        "names a graph where an executable graph was expected",
    );
    a.refused(
        &Request::GraphInstantiate { graph: s },
        0,
        Status::InvalidHandle,
        "names a stream where a graph was expected",
    );
    // A's objects still work.
    a.ok(&Request::GraphLaunch { exec }, s);
}

#[test]
fn graphs_and_captured_commands_are_bounded() {
    let server = sim();
    let limits = Limits {
        max_graphs: 1,
        max_graph_commands: 2,
        ..Limits::default()
    };
    let mut c = server.client(limits);
    let p = c.alloc(16);
    let fill = Request::Memset {
        fill: Fill {
            dst: p,
            value: 0,
            elem_size: 1,
            count: 16,
        },
    };
    c.ok(&Request::StreamBeginCapture { stream: 0 }, 0);
    c.ok(&fill, 0);
    c.ok(&fill, 0);
    c.refused(&fill, 0, Status::QuotaExceeded, "max_graph_commands");
    c.refused(
        &Request::StreamEndCapture { stream: 0 },
        0,
        Status::InvalidValue,
        "spoilt",
    );
    c.ok(&Request::StreamBeginCapture { stream: 0 }, 0);
    c.ok(&fill, 0);
    let graph = c.ok(&Request::StreamEndCapture { stream: 0 }, 0)[0];
    c.refused(
        &Request::StreamBeginCapture { stream: 0 },
        0,
        Status::QuotaExceeded,
        "max_graphs",
    );
    let exec = c.ok(&Request::GraphInstantiate { graph }, 0)[0];
    c.refused(
        &Request::GraphInstantiate { graph },
        0,
        Status::QuotaExceeded,
        "max_graphs",
    );
    c.ok(&Request::GraphExecDestroy { exec }, 0);
    c.ok(&Request::GraphInstantiate { graph }, 0);
}

#[test]
fn a_departing_client_ends_its_captures_and_drops_its_graphs() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    let s = c.stream();
    let t = c.stream();
    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    let graph = c.ok(&Request::StreamEndCapture { stream: s }, 0)[0];
    c.ok(&Request::GraphInstantiate { graph }, 0);
    c.ok(&Request::StreamBeginCapture { stream: t }, 0);
    let released = c.core.release();
    assert_eq!(released.graphs, 2);
    assert_eq!(released.streams, 3);
    assert_eq!(server.backend.live_graphs.load(Ordering::Relaxed), 0);
    assert_eq!(server.backend.capturing.load(Ordering::Relaxed), 0);
    assert_eq!(server.backend.live_streams.load(Ordering::Relaxed), 0);
}

#[test]
fn a_graph_launch_goes_into_the_stream_it_names_and_may_carry_a_mark() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    let s = c.stream();
    let t = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    let graph = c.ok(&Request::StreamEndCapture { stream: s }, 0)[0];
    let exec = c.ok(&Request::GraphInstantiate { graph }, 0)[0];
    server.backend.take();
    c.send(&Request::GraphLaunch { exec }, t[0], flags::MARK);
    // Streams 0 (the default), 1 (s) and 2 (t) of the recorder.
    assert_eq!(
        server.backend.take(),
        [Submitted {
            stream: 2,
            seq: c.seq,
            op: Opcode::GraphLaunch,
            params: None,
            publish: Some((t[1] as u32, c.seq)),
        }]
    );
}
