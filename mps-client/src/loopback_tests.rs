//! The whole client over an in-memory channel, with the test playing the server: it reads what
//! the client put in the submission ring and answers through the completion ring and the
//! progress words, as a server does, with no process or socket traffic in between.

use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mps_core::handshake::BackendKind;
use mps_core::protocol::{
    Command, Completion, CompletionKind, Dim3, LaunchSpec, ParamInfo, Request, SLOT_BYTES, flags,
};
use mps_core::{Error, Status};
use mps_ipc::channel::{Channel, Layout, ShmRing};
use mps_ipc::ring::{Consumer, Producer};

use crate::connection::Client;
use crate::handles::{DeviceInfo, DevicePtr, Function, Stream};
use crate::kernels::Kernel;

/// The server's side of the channel.
struct Server {
    channel: Channel,
    commands: Consumer<Command, ShmRing<Command>>,
    completions: Producer<Completion, ShmRing<Completion>>,
    /// Kept so that the client's liveness check sees a peer.
    _socket: UnixStream,
}

impl Server {
    /// The next command: its header and payload bytes (waiting up to 10 s for it).
    fn next(&mut self) -> (Command, Vec<u8>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let header = loop {
            if let Some(c) = self.commands.pop().unwrap() {
                break c;
            }
            assert!(Instant::now() < deadline, "the client submitted nothing");
            std::thread::yield_now();
        };
        let extra = header.extra_slots as u32;
        assert!(
            self.commands.available().unwrap() >= extra,
            "payload published with its header"
        );
        let payload = (0..extra)
            .flat_map(|i| bytemuck::bytes_of(&self.commands.peek(i)).to_vec())
            .collect();
        self.commands.advance(extra);
        (header, payload)
    }

    fn complete(&mut self, c: Completion) {
        assert!(self.completions.push(&[c]).unwrap());
        self.channel.progress_bell().ring();
    }

    /// Publishes that stream slot `slot` has completed command `seq`.
    fn progress(&self, slot: u32, seq: u64) {
        self.channel.stream_done(slot).store(seq, Ordering::Release);
        self.channel.progress_bell().ring();
    }
}

/// A client joined to a test server, knowing kernel 7: (ptr: u64, n: u32, big: [u8; 100]).
fn pair() -> (Client, Server) {
    let channel = Channel::create(Layout::default()).unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let device = DeviceInfo {
        name: "loopback".into(),
        total_mem: 1 << 30,
        sm_count: 1,
        cc: (9, 0),
        backend: BackendKind::Sim,
    };
    let client = Client::over(1, ours, channel.clone(), device);
    let params = vec![
        ParamInfo { offset: 0, size: 8 },
        ParamInfo { offset: 8, size: 4 },
        ParamInfo {
            offset: 16,
            size: 100,
        },
    ];
    client.kernels.insert(Kernel::new(7, params).unwrap());
    let server = Server {
        commands: channel.submit_consumer(),
        completions: channel.complete_producer(),
        channel,
        _socket: theirs,
    };
    (client, server)
}

const ONE: Dim3 = Dim3 { x: 1, y: 1, z: 1 };

/// Launches kernel 7 through the C-style entry point; returns the packed parameters expected.
fn launch(client: &Client, grid: Dim3) -> Vec<u8> {
    let ptr = 0xabcd_0000u64.to_le_bytes();
    let n = 77u32.to_le_bytes();
    let big: Vec<u8> = (100..200).collect();
    let values = [ptr.as_ptr(), n.as_ptr(), big.as_ptr()];
    // SAFETY: one pointer per parameter, each readable for its size.
    unsafe { client.launch_raw(Function(7), grid, ONE, 0, Stream::DEFAULT, values.as_ptr()) }
        .unwrap();
    let mut packed = vec![0; 116];
    packed[..8].copy_from_slice(&ptr);
    packed[8..12].copy_from_slice(&n);
    packed[16..].copy_from_slice(&big);
    packed
}

#[test]
fn a_launch_is_one_command_in_the_ring_with_its_parameters_in_place() {
    let (client, mut server) = pair();
    let packed = launch(&client, Dim3 { x: 4, y: 2, z: 1 });
    let (cmd, payload) = server.next();
    assert_eq!(
        (cmd.seq, cmd.stream, cmd.flags),
        (1, 0, 0),
        "no reply, no mark"
    );
    assert_eq!(payload.len(), 2 * SLOT_BYTES);
    match Request::decode(&cmd, &payload).unwrap() {
        Request::Launch {
            spec:
                LaunchSpec {
                    function,
                    grid,
                    block,
                    params,
                    ..
                },
        } => {
            assert_eq!((function, grid, block), (7, Dim3 { x: 4, y: 2, z: 1 }, ONE));
            assert_eq!(params, packed.as_slice());
        }
        other => panic!("the ring holds {other:?}"),
    }
    assert_eq!(server.commands.available().unwrap(), 0, "nothing else");
}

#[test]
fn a_bad_geometry_fails_in_the_launch_call_and_nothing_is_submitted() {
    let (client, mut server) = pair();
    let ptr = 0u64.to_le_bytes();
    let n = 0u32.to_le_bytes();
    let big = [0u8; 100];
    let values = [ptr.as_ptr(), n.as_ptr(), big.as_ptr()];
    let cases = [
        (Dim3 { x: 0, y: 1, z: 1 }, ONE, 0, "zero extent"),
        (
            ONE,
            Dim3 {
                x: 2048,
                y: 1,
                z: 1,
            },
            0,
            "threads per block",
        ),
        (
            ONE,
            Dim3 { x: 1, y: 1, z: 65 },
            0,
            "exceeds the device's limits",
        ),
        (
            Dim3 {
                x: 1,
                y: 65536,
                z: 1,
            },
            ONE,
            0,
            "exceeds the device's limits",
        ),
        (ONE, ONE, 228 << 10, "shared memory"),
    ];
    for (grid, block, shared, what) in cases {
        // SAFETY: one pointer per parameter, each readable for its size.
        let e = unsafe {
            client.launch_raw(
                Function(7),
                grid,
                block,
                shared,
                Stream::DEFAULT,
                values.as_ptr(),
            )
        }
        .unwrap_err();
        assert_eq!(e.status, Status::InvalidValue, "{e}");
        assert!(e.message.contains(what), "{e}");
    }
    assert!(
        server.commands.pop().unwrap().is_none(),
        "nothing submitted"
    );
    // The client carries on.
    launch(&client, ONE);
    assert_eq!(server.next().0.seq, 1);
}

#[test]
fn a_stream_wait_marks_the_stream_and_ends_when_its_progress_arrives() {
    let (client, mut server) = pair();
    launch(&client, ONE);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| client.stream_synchronize(Stream::DEFAULT));
        let (launch, _) = server.next();
        let (mark, _) = server.next();
        assert_eq!(launch.seq, 1);
        assert_eq!(Request::decode(&mark, &[]).unwrap(), Request::Mark);
        assert_eq!((mark.seq, mark.flags), (2, flags::MARK));
        assert!(
            !waiter.is_finished(),
            "the wait ended before the mark's progress"
        );
        server.progress(0, 2);
        waiter.join().unwrap().unwrap();
    });
    // Nothing new in the stream: the next wait needs no mark.
    client.stream_synchronize(Stream::DEFAULT).unwrap();
    assert_eq!(server.commands.available().unwrap(), 0);
}

#[test]
fn a_call_gets_the_reply_with_its_sequence_number() {
    let (client, mut server) = pair();
    launch(&client, ONE);
    std::thread::scope(|s| {
        let call = s.spawn(|| client.mem_alloc(4096));
        assert_eq!(server.next().0.seq, 1, "the launch");
        let (cmd, _) = server.next();
        assert_eq!(
            Request::decode(&cmd, &[]).unwrap(),
            Request::MemAlloc { size: 4096 }
        );
        assert_eq!((cmd.seq, cmd.flags), (2, flags::REPLY));
        // A success nobody asked for, then the reply.
        server.complete(Completion::reply(1, [0xdead, 0, 0, 0]));
        server.complete(Completion::reply(2, [0x7000_0000, 0, 0, 0]));
        assert_eq!(call.join().unwrap().unwrap(), DevicePtr(0x7000_0000));
    });
}

#[test]
fn a_fault_poisons_every_later_call() {
    let (client, mut server) = pair();
    launch(&client, ONE);
    let (cmd, _) = server.next();
    server.complete(Completion::error(
        cmd.seq,
        CompletionKind::AsyncError,
        &Error::new(Status::IllegalAddress, "kernel read 0x10"),
    ));
    for _ in 0..2 {
        let e = client.mem_get_info().unwrap_err();
        assert_eq!(e.status, Status::IllegalAddress);
        assert!(
            e.message.starts_with("command #1 failed while running"),
            "{e}"
        );
    }
    let args: [&[u8]; 3] = [&[0; 8], &[0; 4], &[0; 100]];
    let e = client
        .launch(Function(7), ONE, ONE, 0, Stream::DEFAULT, &args)
        .unwrap_err();
    assert_eq!(e.status, Status::IllegalAddress);
    let e = client.synchronize().unwrap_err();
    assert_eq!(e.status, Status::IllegalAddress);
    assert_eq!(
        server.commands.available().unwrap(),
        0,
        "nothing submitted after the fault"
    );
}

#[test]
fn a_stream_of_another_client_is_refused_before_anything_is_submitted() {
    let (client, server) = pair();
    let args: [&[u8]; 3] = [&[0; 8], &[0; 4], &[0; 100]];
    let e = client
        .launch(Function(7), ONE, ONE, 0, Stream(0x77), &args)
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle);
    assert!(e.message.contains("stream 0x77"), "{e}");
    let e = client
        .launch(Function(8), ONE, ONE, 0, Stream::DEFAULT, &args)
        .unwrap_err();
    assert!(e.message.contains("function 0x8"), "{e}");
    assert_eq!(server.commands.available().unwrap(), 0);
}

/// A page of device attributes as the server sends it: `attrs`, of `total`, then `uuid`.
fn attribute_page(
    seq: u64,
    attrs: &[(i32, i32)],
    total: u64,
    uuid: Option<[u8; 16]>,
) -> Completion {
    let mut c = Completion::reply(seq, [attrs.len() as u64, total, uuid.is_some() as u64, 0]);
    let mut data = Vec::new();
    for &(attribute, value) in attrs {
        data.extend_from_slice(bytemuck::bytes_of(&mps_core::protocol::DeviceAttribute {
            attribute,
            value,
        }));
    }
    data.extend(uuid.iter().flatten());
    c.data[..data.len()].copy_from_slice(&data);
    c.data_len = data.len() as u32;
    c
}

#[test]
fn device_attributes_are_fetched_in_pages_once_then_answered_here() {
    let (client, mut server) = pair();
    let uuid = *b"0123456789abcdef";
    std::thread::scope(|s| {
        let first = s.spawn(|| client.device_attribute(13));
        let (cmd, _) = server.next();
        assert_eq!(
            Request::decode(&cmd, &[]).unwrap(),
            Request::DeviceAttributes { first: 0 }
        );
        server.complete(attribute_page(
            cmd.seq,
            &[(13, 1_980_000), (16, 132)],
            3,
            Some(uuid),
        ));
        let (cmd, _) = server.next();
        assert_eq!(
            Request::decode(&cmd, &[]).unwrap(),
            Request::DeviceAttributes { first: 2 }
        );
        server.complete(attribute_page(cmd.seq, &[(75, 9)], 3, Some(uuid)));
        assert_eq!(first.join().unwrap().unwrap(), 1_980_000);
    });
    // From the cache: nothing more is submitted (a submission would wait for a reply forever).
    assert_eq!(client.device_attribute(16).unwrap(), 132);
    assert_eq!(client.device_attribute(75).unwrap(), 9);
    assert_eq!(client.device_uuid().unwrap(), Some(uuid));
    let missing = client.device_attribute(14).unwrap_err();
    assert_eq!(missing.status, Status::InvalidValue, "{missing}");
    assert!(
        missing.message.contains("attribute 14 of loopback"),
        "{missing}"
    );
    assert!(server.commands.pop().unwrap().is_none());
}

#[test]
fn a_server_that_stops_short_of_its_attribute_count_is_an_error() {
    let (client, mut server) = pair();
    std::thread::scope(|s| {
        let first = s.spawn(|| client.device_attribute(13));
        let (cmd, _) = server.next();
        server.complete(attribute_page(cmd.seq, &[(13, 1)], 2, None));
        let (cmd, _) = server.next();
        server.complete(attribute_page(cmd.seq, &[], 2, None));
        let e = first.join().unwrap().unwrap_err();
        assert!(e.message.contains("reported 1 of its 2"), "{e}");
    });
}

#[test]
fn commands_that_continue_a_held_run_go_unrung_until_the_one_that_completes_it() {
    let (client, mut server) = pair();
    let channel = server.channel.clone();
    let bell = channel.submit_bell();
    let rang = |before: u32| bell.value() != before;
    // The server holds a run of the default stream and needs a ring from command 3 on.
    channel.ring_stream().store(0, Ordering::SeqCst);
    channel.ring_from().store(3, Ordering::SeqCst);
    for seq in 1..=3u64 {
        let before = bell.value();
        launch(&client, ONE);
        assert_eq!(server.next().0.seq, seq);
        assert_eq!(rang(before), seq == 3, "launch {seq}");
    }
    // A command of another stream, and one that is waited for, ring whatever the word says.
    channel.ring_from().store(100, Ordering::SeqCst);
    let other = std::thread::scope(|s| {
        let creating = s.spawn(|| client.stream_create(0));
        let (create, _) = server.next();
        server.complete(Completion::reply(create.seq, [5, 1, 0, 0]));
        creating.join().unwrap().unwrap()
    });
    let before = bell.value();
    let ptr = 0u64.to_le_bytes();
    let n = 1u32.to_le_bytes();
    let big = [0u8; 100];
    let values = [ptr.as_ptr(), n.as_ptr(), big.as_ptr()];
    // SAFETY: one pointer per parameter, each readable for its size.
    unsafe { client.launch_raw(Function(7), ONE, ONE, 0, other, values.as_ptr()) }.unwrap();
    assert!(
        rang(before),
        "a launch in another stream than the held run's"
    );
    server.next();
    std::thread::scope(|s| {
        let before = bell.value();
        let waiter = s.spawn(|| client.stream_synchronize(Stream::DEFAULT));
        let (mark, _) = server.next();
        server.progress(0, mark.seq);
        waiter.join().unwrap().unwrap();
        // The waiter rang after it put the mark in the ring, before it waited.
        assert!(rang(before), "a mark");
    });
}
