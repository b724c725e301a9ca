//! What the core hands the backend and the shell: launches, progress, host buffers, and
//! what a departing client leaves behind.

use super::*;

#[test]
fn a_launch_hands_the_backend_its_parameters_borrowed_and_replies_only_when_asked() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let f = c.function(m, "k");
    let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let params: Vec<u8> = (0..12).collect();
    assert!(matches!(c.send(&launch(f, &params), s, 0), Output::Silent));
    let seq = c.seq;
    assert!(matches!(
        c.send(&launch(f, &params), s, flags::MARK),
        Output::Silent
    ));
    match c.send(&launch(f, &params), 0, flags::REPLY) {
        Output::Post(reply) => assert_eq!(reply.result().unwrap(), [0; 4]),
        other => panic!("{other:?}"),
    }
    let stream = server.backend.take();
    let sent = |seq, stream, publish| Submitted {
        stream,
        seq,
        op: Opcode::Launch,
        params: Some((params.clone(), true)),
        publish,
    };
    assert_eq!(
        stream,
        [
            sent(seq, 1, None),
            sent(seq + 1, 1, Some((slot as u32, seq + 1))),
            sent(seq + 2, 0, None),
        ]
    );
}

#[test]
fn a_failed_marked_command_still_publishes_its_stream_progress() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let bad = launch(0x0400_0000_0000_0001, &[]);
    match c.send(&bad, s, flags::MARK) {
        Output::Post(reply) => assert_eq!(reply.status, Status::InvalidHandle as u32),
        other => panic!("{other:?}"),
    }
    // Errors are always answered, asked or not; the stream's progress is published after
    // the work queued before it.
    assert_eq!(
        server.backend.take(),
        [Submitted {
            stream: 1,
            seq: c.seq,
            op: Opcode::Mark,
            params: None,
            publish: Some((slot as u32, c.seq)),
        }]
    );
    // A faulted client's failures publish nothing more.
    c.faults
        .fault(1, Error::new(Status::IllegalAddress, "a kernel fault"));
    c.send(&bad, s, flags::MARK);
    assert!(server.backend.take().is_empty());
}

#[test]
fn a_host_buffer_goes_out_with_its_reply_and_is_forgotten_if_it_cannot() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    let (h, len) = match c.send(&Request::HostAlloc { size: 100 }, 0, flags::REPLY) {
        Output::HostBuffer {
            segment,
            message,
            reply: Some(reply),
        } => {
            assert_eq!(message.size, segment.len() as u64);
            assert_eq!(message.size, 4096);
            // The recorder's device address of a buffer is its address in the server.
            let device = segment.as_ptr() as u64;
            assert_eq!(reply.result().unwrap(), [message.handle, 4096, device, 0]);
            (message.handle, message.size)
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(len, 4096);
    // Two channel segments and the buffer.
    assert_eq!(server.backend.registered.load(Ordering::Relaxed), 3);
    c.core.host_buffer_unsent(h);
    assert_eq!(server.backend.registered.load(Ordering::Relaxed), 2);
    c.refused(
        &Request::HostFree { handle: h },
        0,
        Status::InvalidHandle,
        "does not belong",
    );
    // Its bytes no longer count against the client.
    let limits = Limits {
        max_host_bytes: 4096,
        ..Limits::default()
    };
    let mut d = server.client(limits);
    match d.send(&Request::HostAlloc { size: 4096 }, 0, flags::REPLY) {
        Output::HostBuffer { message, .. } => d.core.host_buffer_unsent(message.handle),
        other => panic!("{other:?}"),
    }
    d.host_alloc(4096);
}

#[test]
fn a_departing_client_leaves_nothing_behind() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    for _ in 0..3 {
        c.stream();
    }
    c.event();
    c.load_module(PTX).unwrap();
    let p = c.alloc(1000);
    c.alloc(24);
    c.ok(&Request::MemFree { ptr: p }, 0);
    c.host_alloc(4096);
    // An upload never finished.
    c.ok(
        &Request::ModuleData {
            staging_offset: 0,
            len: 64,
            last: false,
        },
        0,
    );
    let released = c.core.release();
    assert_eq!(
        released,
        Released {
            allocations: 1,
            bytes: 24,
            streams: 4,
            events: 1,
            modules: 1,
            host_buffers: 1,
            graphs: 0,
        }
    );
    let b = &server.backend;
    assert_eq!(b.live_streams.load(Ordering::Relaxed), 0);
    assert_eq!(b.registered.load(Ordering::Relaxed), 0);
    assert_eq!(b.freed.load(Ordering::Relaxed), 1024);
}

#[test]
fn a_host_buffer_is_reached_at_its_device_address_until_it_is_freed() {
    let server = Server::new(Recorder::new(16));
    let mut c = server.client(Limits::default());
    let [h, len, device, _] = c.ok(&Request::HostAlloc { size: 4096 }, 0);
    assert_eq!(len, 4096);
    assert_ne!(device, 0);
    let fill = |dst, count| Request::Memset {
        fill: Fill {
            dst,
            value: 7,
            elem_size: 4,
            count,
        },
    };
    c.ok(&fill(device, 1024), 0);
    c.refused(&fill(device + 4, 1024), 0, Status::InvalidHandle, "");
    c.ok(&Request::HostFree { handle: h }, 0);
    c.refused(&fill(device, 1), 0, Status::InvalidHandle, "");
}
