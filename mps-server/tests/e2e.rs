//! End-to-end: real client processes against a real server process.

mod common;

use common::*;
use mpsclient::{Client, DevicePtr, Dim3, Status, Stream};

fn grid(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

/// The whole path, checked element by element: allocate, copy in from pageable and from
/// `mps_host_alloc` memory, `add_f32` on one stream, an event joining it to a second stream,
/// `saxpy_f32` there, copy out both ways.
fn vector_work(c: &Client, n: usize, seed: f32) {
    let bytes = (n * 4) as u64;
    let m = c.module_load(&ptx()).unwrap();
    let add = c.module_get_function(m, "add_f32").unwrap();
    let saxpy = c.module_get_function(m, "saxpy_f32").unwrap();
    let s1 = c.stream_create(0).unwrap();
    let s2 = c.stream_create(0).unwrap();
    let ev = c.event_create().unwrap();
    let (a, b, out) = (
        c.mem_alloc(bytes).unwrap(),
        c.mem_alloc(bytes).unwrap(),
        c.mem_alloc(bytes).unwrap(),
    );
    let av: Vec<f32> = (0..n).map(|i| i as f32 + seed).collect();
    let bv: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    // a from pageable memory, b from a host buffer (asynchronous).
    c.memcpy_htod(a, f32_bytes(&av), s1).unwrap();
    let hb = c.host_alloc(n * 4).unwrap();
    // SAFETY: the host buffer is n * 4 bytes long and only this thread uses it.
    let host = unsafe { std::slice::from_raw_parts_mut(hb as *mut f32, n) };
    host.copy_from_slice(&bv);
    c.memcpy_htod(b, f32_bytes(host), s1).unwrap();
    let nn = n as u64;
    c.launch(
        add,
        grid(64),
        grid(128),
        0,
        s1,
        &[
            &a.0.to_le_bytes(),
            &b.0.to_le_bytes(),
            &out.0.to_le_bytes(),
            &nn.to_le_bytes(),
        ],
    )
    .unwrap();
    c.event_record(ev, s1).unwrap();
    c.stream_wait_event(s2, ev).unwrap();
    // out = 0.5 * a + out, on the second stream, after the add.
    c.launch(
        saxpy,
        grid(64),
        grid(128),
        0,
        s2,
        &[
            &0.5f32.to_le_bytes(),
            &a.0.to_le_bytes(),
            &out.0.to_le_bytes(),
            &nn.to_le_bytes(),
        ],
    )
    .unwrap();
    let mut got = vec![0f32; n];
    c.memcpy_dtoh(bytemuck::cast_slice_mut(&mut got), out, s2)
        .unwrap();
    for i in 0..n {
        let want = av[i] + bv[i] + 0.5 * av[i];
        assert_eq!(got[i], want, "element {i}");
    }
    // And into the host buffer, asynchronously, then synchronise.
    c.memcpy_dtoh(bytemuck::cast_slice_mut(host), out, s2)
        .unwrap();
    c.stream_synchronize(s2).unwrap();
    for i in 0..n {
        assert_eq!(host[i], got[i], "host buffer element {i}");
    }
    c.host_free(hb).unwrap();
    for p in [a, b, out] {
        c.mem_free(p).unwrap();
    }
    c.event_destroy(ev).unwrap();
    c.stream_destroy(s1).unwrap();
    c.stream_destroy(s2).unwrap();
    c.module_unload(m).unwrap();
}

#[test]
fn several_client_processes_get_correct_results() {
    if let Some(role) = role() {
        let seed: f32 = role.parse().unwrap();
        let c = Client::connect(None).unwrap();
        // Larger than the staging area, so pageable copies take several chunks.
        vector_work(&c, (3 << 20) + 17, seed);
        vector_work(&c, 1000, seed);
        println!("client {seed} ok");
        return;
    }
    let server = TestServer::start();
    let children: Vec<_> = (0..4)
        .map(|i| {
            spawn_role(
                "several_client_processes_get_correct_results",
                &format!("{}", i * 10),
                &server,
            )
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "client {i} failed:\n{}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            server.log()
        );
    }
}

#[test]
fn commands_in_one_stream_complete_in_order() {
    let server = TestServer::start();
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let n = 4096u64;
    let p = c.mem_alloc(n * 4).unwrap();
    let s = c.stream_create(0).unwrap();
    let mut snapshots = Vec::new();
    let hb = c.host_alloc(64 * 16).unwrap();
    for v in 1..=64u32 {
        c.launch(
            fill,
            grid(8),
            grid(128),
            0,
            s,
            &[&p.0.to_le_bytes(), &v.to_le_bytes(), &n.to_le_bytes()],
        )
        .unwrap();
        // An asynchronous copy of the last 16 bytes after each fill sees exactly that fill.
        // SAFETY: hb is 1024 bytes; each snapshot takes 16 of them.
        let dst = unsafe { std::slice::from_raw_parts_mut(hb.add((v as usize - 1) * 16), 16) };
        c.memcpy_dtoh(dst, p.offset(n * 4 - 16), s).unwrap();
        snapshots.push(v);
    }
    c.memset_d32(p, 0xabcd, 1, s).unwrap();
    c.stream_synchronize(s).unwrap();
    // SAFETY: hb is 1024 bytes of u32-aligned memory.
    let words = unsafe { std::slice::from_raw_parts(hb as *const u32, 256) };
    for (i, v) in snapshots.iter().enumerate() {
        assert_eq!(
            &words[i * 4..i * 4 + 4],
            &[*v; 4],
            "snapshot after fill {v}"
        );
    }
    let mut first = [0u8; 8];
    c.memcpy_dtoh(&mut first, p, s).unwrap();
    assert_eq!(first, [0xcd, 0xab, 0, 0, 64, 0, 0, 0]);
}

/// Records events around a long spin in each of two streams; with one stream per worker, the
/// two spins must overlap: each starts before the other ends.
#[test]
fn two_streams_of_one_client_overlap() {
    let server = TestServer::start();
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let spin = c.module_get_function(m, "spin_ns").unwrap();
    let ctr = c.mem_alloc(4).unwrap();
    c.memset_d32(ctr, 0, 1, Stream::DEFAULT).unwrap();
    c.stream_synchronize(Stream::DEFAULT).unwrap();
    let origin = c.event_create().unwrap();
    c.event_record(origin, Stream::DEFAULT).unwrap();
    c.event_synchronize(origin).unwrap();
    let mut spans = Vec::new();
    let streams = [c.stream_create(0).unwrap(), c.stream_create(0).unwrap()];
    let events: Vec<_> = (0..4).map(|_| c.event_create().unwrap()).collect();
    for (i, s) in streams.iter().enumerate() {
        c.event_record(events[2 * i], *s).unwrap();
        c.launch(
            spin,
            grid(1),
            grid(32),
            0,
            *s,
            &[&300_000_000u64.to_le_bytes(), &ctr.0.to_le_bytes()],
        )
        .unwrap();
        c.event_record(events[2 * i + 1], *s).unwrap();
    }
    c.synchronize().unwrap();
    for i in 0..2 {
        let start = c.event_elapsed_ms(origin, events[2 * i]).unwrap();
        let end = c.event_elapsed_ms(origin, events[2 * i + 1]).unwrap();
        assert!(end - start >= 299.0, "spin {i} lasted {} ms", end - start);
        spans.push((start, end));
    }
    assert!(
        spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1,
        "the two streams ran one after the other: {spans:?}"
    );
    let mut count = [0u8; 4];
    c.memcpy_dtoh(&mut count, ctr, Stream::DEFAULT).unwrap();
    assert_eq!(u32::from_le_bytes(count), 2);
}

/// Client A runs a long kernel; client B's short kernel must finish while A's is still running.
#[test]
fn streams_of_two_clients_overlap() {
    let server = TestServer::start();
    let a = server.client();
    let b = server.client();
    let setup = |c: &Client| {
        let m = c.module_load(&ptx()).unwrap();
        let spin = c.module_get_function(m, "spin_ns").unwrap();
        let ctr = c.mem_alloc(4).unwrap();
        c.memset_d32(ctr, 0, 1, Stream::DEFAULT).unwrap();
        (spin, ctr)
    };
    let (spin_a, ctr_a) = setup(&a);
    let (spin_b, ctr_b) = setup(&b);
    let done_a = a.event_create().unwrap();
    a.launch(
        spin_a,
        grid(1),
        grid(32),
        0,
        Stream::DEFAULT,
        &[&3_000_000_000u64.to_le_bytes(), &ctr_a.0.to_le_bytes()],
    )
    .unwrap();
    a.event_record(done_a, Stream::DEFAULT).unwrap();
    b.launch(
        spin_b,
        grid(1),
        grid(32),
        0,
        Stream::DEFAULT,
        &[&1_000_000u64.to_le_bytes(), &ctr_b.0.to_le_bytes()],
    )
    .unwrap();
    b.stream_synchronize(Stream::DEFAULT).unwrap();
    assert!(
        !a.event_query(done_a).unwrap(),
        "client B's kernel waited for client A's"
    );
    a.event_synchronize(done_a).unwrap();
    assert!(a.event_query(done_a).unwrap());
}

#[test]
fn a_client_cannot_touch_another_clients_objects() {
    let server = TestServer::start();
    let owner = server.client();
    let m = owner.module_load(&ptx()).unwrap();
    let fill = owner.module_get_function(m, "fill_u32").unwrap();
    let stream = owner.stream_create(0).unwrap();
    let event = owner.event_create().unwrap();
    let p = owner.mem_alloc(1024).unwrap();
    owner.memset_d32(p, 7, 256, stream).unwrap();
    owner.stream_synchronize(stream).unwrap();

    // Through the library.
    let other = server.client();
    let e = other.mem_free(p).unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
    let mut buf = [0u8; 16];
    assert_eq!(
        other
            .memcpy_dtoh(&mut buf, p, Stream::DEFAULT)
            .unwrap_err()
            .status,
        Status::InvalidHandle
    );
    assert_eq!(
        other
            .memcpy_htod(p, &[1; 16], Stream::DEFAULT)
            .unwrap_err()
            .status,
        Status::InvalidHandle
    );
    assert_eq!(
        other.stream_synchronize(stream).unwrap_err().status,
        Status::InvalidHandle
    );
    assert_eq!(
        other
            .event_record(event, Stream::DEFAULT)
            .unwrap_err()
            .status,
        Status::InvalidHandle
    );
    assert_eq!(
        other.module_get_function(m, "fill_u32").unwrap_err().status,
        Status::InvalidHandle
    );
    other.memset_d32(p, 9, 4, Stream::DEFAULT).unwrap();
    assert_eq!(
        other.synchronize().unwrap_err().status,
        Status::InvalidHandle,
        "deferred memset error"
    );

    // On the wire, past the library's own checks: every command naming the owner's objects.
    use mps_core::protocol::{DeviceCopy, Fill, HostRef, LaunchSpec, Request};
    let mut raw = RawClient::connect(&server);
    let attempts: Vec<(Request<'_>, u64)> = vec![
        (Request::MemFree { ptr: p.0 }, 0),
        (
            Request::CopyDtoH {
                dst: HostRef::Staging { offset: 0 },
                src: p.0,
                len: 4,
            },
            0,
        ),
        (
            Request::CopyHtoD {
                dst: p.0,
                src: HostRef::Staging { offset: 0 },
                len: 4,
            },
            0,
        ),
        (
            Request::CopyDtoD {
                copy: DeviceCopy {
                    dst: p.0,
                    src: p.0,
                    len: 4,
                },
            },
            0,
        ),
        (
            Request::Memset {
                fill: Fill {
                    dst: p.0,
                    value: 1,
                    elem_size: 4,
                    count: 1,
                },
            },
            0,
        ),
        (Request::StreamDestroy { stream: stream.0 }, 0),
        (Request::Mark, stream.0),
        (Request::EventRecord { event: event.0 }, 0),
        (Request::StreamWaitEvent { event: event.0 }, 0),
        (Request::EventDestroy { event: event.0 }, 0),
        (
            Request::EventElapsed {
                start: event.0,
                end: event.0,
            },
            0,
        ),
        (Request::ModuleUnload { module: m.0 }, 0),
        (
            Request::GetFunction {
                module: m.0,
                name: b"fill_u32",
            },
            0,
        ),
        (
            Request::ParamInfo {
                function: fill.0,
                first: 0,
            },
            0,
        ),
        (
            Request::Launch {
                spec: LaunchSpec {
                    function: fill.0,
                    grid: grid(1),
                    block: grid(1),
                    shared_mem: 0,
                    cluster: None,
                    params: &[0; 24],
                },
            },
            0,
        ),
    ];
    for (req, stream) in attempts {
        let what = format!("{req:?}");
        let c = raw.call(&req, stream);
        assert_eq!(
            c.status,
            Status::InvalidHandle as u32,
            "{what}: {}",
            c.message()
        );
    }
    // A launch of the attacker's own kernel at the owner's memory is an illegal address in the
    // simulator. On a GPU all clients of a server share one address space, and the kernel would
    // write there (docs/ARCHITECTURE.md says so); the check is the simulator's.
    if on_gpu() {
        println!("note: on a GPU a kernel can reach another client's memory; not checked here");
    } else {
        let mine = other.module_load(&ptx()).unwrap();
        let f = other.module_get_function(mine, "fill_u32").unwrap();
        other
            .launch(
                f,
                grid(1),
                grid(32),
                0,
                Stream::DEFAULT,
                &[
                    &p.0.to_le_bytes(),
                    &5u32.to_le_bytes(),
                    &256u64.to_le_bytes(),
                ],
            )
            .unwrap_err_or_sync(&other, Status::IllegalAddress);
    }

    // The owner's data and objects are untouched.
    let mut words = [0u8; 1024];
    owner.memcpy_dtoh(&mut words, p, stream).unwrap();
    assert!(
        words.chunks(4).all(|w| w == [7, 0, 0, 0]),
        "owner's data changed"
    );
    owner.event_record(event, stream).unwrap();
    owner.event_synchronize(event).unwrap();
    owner
        .launch(
            fill,
            grid(1),
            grid(32),
            0,
            stream,
            &[&p.0.to_le_bytes(), &3u32.to_le_bytes(), &1u64.to_le_bytes()],
        )
        .unwrap();
    owner.stream_synchronize(stream).unwrap();
    owner.mem_free(p).unwrap();
}

trait LaunchResult {
    fn unwrap_err_or_sync(self, c: &Client, status: Status);
}

impl LaunchResult for mpsclient::Result<()> {
    /// A launch's fault shows either at the launch or at the next synchronisation.
    fn unwrap_err_or_sync(self, c: &Client, status: Status) {
        let e = match self {
            Err(e) => e,
            Ok(()) => c.synchronize().unwrap_err(),
        };
        assert_eq!(e.status, status, "{e}");
    }
}

#[test]
fn a_kernel_fault_poisons_only_the_faulting_client() {
    let server = TestServer::start();
    let bad = server.client();
    let good = server.client();
    let m = bad.module_load(&ptx()).unwrap();
    let fault = bad.module_get_function(m, "fault_write").unwrap();
    bad.launch(
        fault,
        grid(1),
        grid(1),
        0,
        Stream::DEFAULT,
        &[&0x10u64.to_le_bytes()],
    )
    .unwrap();
    let e = bad.synchronize().unwrap_err();
    assert_eq!(e.status, Status::IllegalAddress, "{e}");
    // The simulator names the kernel; a GPU reports only that the context failed.
    let expected = if on_gpu() {
        "CUDA context failed"
    } else {
        "fault_write"
    };
    assert!(e.message.contains(expected), "{e}");
    // Sticky, as a CUDA context's fault is.
    assert_eq!(
        bad.mem_alloc(16).unwrap_err().status,
        Status::IllegalAddress
    );
    if on_gpu() {
        // On a GPU the fault ends the context for every client of the server: the other client
        // is told so on its next call.
        let e = good.synchronize().unwrap_err();
        assert_eq!(e.status, Status::IllegalAddress, "{e}");
        assert!(e.message.contains("CUDA context failed"), "{e}");
        println!("on the GPU, the other client of the server got: {e}");
    } else {
        vector_work(&good, 1000, 1.0);
    }
}

/// What the hog of the next test holds: most of the simulator's 64 MiB, 1 GiB of a GPU.
fn hog_bytes() -> u64 {
    if on_gpu() { 1 << 30 } else { 48 << 20 }
}

#[test]
fn a_killed_client_is_cleaned_up_and_others_carry_on() {
    if let Some(role) = role() {
        let c = Client::connect(None).unwrap();
        if role == "hog" {
            // Hold most of the device's memory (1 GiB on a GPU), a stream, an event, a module
            // and a host buffer, then launch forever.
            let _p = c.mem_alloc(hog_bytes()).unwrap();
            let m = c.module_load(&ptx()).unwrap();
            let spin = c.module_get_function(m, "spin_ns").unwrap();
            let ctr = c.mem_alloc(4).unwrap();
            let s = c.stream_create(0).unwrap();
            let ev = c.event_create().unwrap();
            c.event_record(ev, s).unwrap();
            let _host = c.host_alloc(1 << 16).unwrap();
            println!("ready");
            loop {
                for _ in 0..10 {
                    c.launch(
                        spin,
                        grid(1),
                        grid(32),
                        0,
                        s,
                        &[&200_000u64.to_le_bytes(), &ctr.0.to_le_bytes()],
                    )
                    .unwrap();
                }
                c.stream_synchronize(s).unwrap();
            }
        }
        for i in 0..5 {
            vector_work(&c, 10_000, i as f32);
        }
        return;
    }
    let server = TestServer::start_with(&["--sim-memory", "64MiB"]);
    let test = "a_killed_client_is_cleaned_up_and_others_carry_on";
    let mut hog = spawn_role(test, "hog", &server);
    let hog_pid = hog.id();
    // The child's test harness prints its own lines first.
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(hog.stdout.take().unwrap()));
    assert!(
        lines.any(|l| l.unwrap().ends_with("ready")),
        "the hog never got ready"
    );
    let other = spawn_role(test, "worker", &server);
    let probe = server.client();
    let (free_before, _) = probe.mem_get_info().unwrap();
    if !on_gpu() {
        let e = probe.mem_alloc(48 << 20).unwrap_err();
        assert_eq!(e.status, Status::OutOfMemory, "{e}");
    }
    hog.kill().unwrap();
    hog.wait().unwrap();
    // The server releases everything the hog held, and says so: its two allocations, its two
    // streams (the default one and its own), its event, its module and its host buffer.
    let log = server.wait_for_log(&format!("pid={hog_pid}"));
    let released = wait_until(
        "the server's account of the killed client",
        || {
            server
                .log()
                .lines()
                .find(|l| {
                    l.contains("client disconnected") && l.contains(&format!("pid={hog_pid}"))
                })
                .map(str::to_string)
        },
        Option::is_some,
    )
    .unwrap();
    let want = format!(
        "client disconnected (hung up); released 2 allocations ({} bytes), 2 streams, 1 \
         events, 1 modules, 1 host buffers",
        hog_bytes() + 4
    );
    assert!(
        released.contains(&want),
        "{released}\nwanted: {want}\n{log}"
    );
    println!("{released}");
    // And its memory is free again. (A GPU's free memory is the device's: the other client's
    // work moves it a little.)
    let slack = if on_gpu() { 64 << 20 } else { 0 };
    wait_until(
        "free device memory after the hog's death",
        || probe.mem_get_info().unwrap().0,
        |free| *free + slack >= free_before + hog_bytes(),
    );
    let p = probe.mem_alloc(hog_bytes()).unwrap();
    probe.mem_free(p).unwrap();
    let out = other.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the other client failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn hostile_rings_get_their_client_disconnected_and_nothing_else() {
    use mps_core::protocol::{Command, Request};
    let mut server = TestServer::start();
    let good = server.client();

    // A tail far past the ring's capacity.
    let raw = RawClient::connect(&server);
    {
        use mps_ipc::ring::RingMemory;
        raw.producer
            .memory()
            .tail()
            .store(1 << 20, std::sync::atomic::Ordering::Release);
    }
    raw.channel.submit_bell().ring();
    assert!(
        raw.wait_closed(),
        "server kept a client with a corrupt ring"
    );
    server.wait_for_log("corrupted its submission ring");

    // Random slots: every session either answers all of it in order (each error with a
    // message) or is ended for a named reason; none ends by a panic, and the server survives.
    let mut x: u64 = 0x2545f4914f6cdd1d;
    for round in 0..8u64 {
        let mut raw = RawClient::connect(&server);
        let mut pushed = 0;
        for _ in 0..50 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut bytes = [0u8; 64];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = (x.rotate_left(i as u32 * 5) >> 3) as u8;
            }
            let mut cmd: Command = bytemuck::cast(bytes);
            if round % 2 == 0 {
                // Plausible opcodes with garbage arguments, each asking for a reply.
                cmd.opcode = (x % 24) as u16;
                cmd.extra_slots = 0;
                cmd.flags = (cmd.flags & 3) | mps_core::protocol::flags::REPLY;
                cmd.reserved = 0;
            }
            // Room is checked first, so the push must succeed.
            if raw.producer.free().unwrap() < 2 {
                break;
            }
            assert_eq!(raw.producer.push(&[cmd]), Ok(true), "round {round}");
            raw.channel.submit_bell().ring();
            pushed += 1;
        }
        // A well-formed command last: its answer says the session read everything before it.
        let probe = 0x5052_4f42_4500_0000 + round;
        raw.send_with_seq(&Request::SmInfo, probe);
        let mut errors = 0;
        let outcome = wait_until(
            &format!("round {round}: an answer to the probe or a disconnect"),
            || loop {
                match raw.consumer.pop() {
                    Ok(Some(c)) if c.seq == probe => return Some(true),
                    Ok(Some(c)) => {
                        if c.status != 0 {
                            errors += 1;
                            assert!(!c.message().is_empty(), "an error without a message");
                        }
                    }
                    Ok(None) if raw.is_closed() => return Some(false),
                    Ok(None) => return None,
                    Err(e) => panic!("round {round}: the server wrote a corrupt ring: {e:?}"),
                }
            },
            Option::is_some,
        );
        println!("round {round}: {pushed} commands, {errors} errors, answered: {outcome:?}");
        if round % 2 == 0 {
            // Well-framed commands with bad arguments get errors, never a disconnect.
            assert_eq!(outcome, Some(true), "round {round}: disconnected");
            assert!(
                errors > 0,
                "round {round}: {pushed} garbage commands and not one error"
            );
        }
        drop(raw);
        assert!(
            server.is_alive(),
            "server died on garbage, log:\n{}",
            server.log()
        );
    }
    // Every session that ended, ended for a reason of the ring's, not by a panic.
    let log = server.wait_for_log("client disconnected");
    assert!(!log.contains("panic"), "{log}");
    for line in log.lines().filter(|l| l.contains("client disconnected (")) {
        assert!(
            ["hung up", "corrupted its submission ring", "payload slots"]
                .iter()
                .any(|r| line.contains(r)),
            "{line}"
        );
    }
    // A command that promises payload slots it never publishes.
    let mut raw = RawClient::connect(&server);
    let (mut cmd, _) = Request::Mark.encode(1, 0, 0);
    cmd.extra_slots = 3;
    raw.send_raw(cmd, &[]);
    assert!(raw.wait_closed());
    server.wait_for_log("without its 3 payload slots");

    assert!(server.is_alive());
    vector_work(&good, 5000, 2.0);
    vector_work(&server.client(), 5000, 3.0);
}

#[test]
fn bad_input_gets_a_clear_status_and_message() {
    let server = TestServer::start();
    let c = server.client();
    let check = |r: mpsclient::Result<()>, status: Status, words: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.status, status, "{e}");
        assert!(
            e.message.contains(words),
            "message {:?} lacks {words:?}",
            e.message
        );
    };
    check(c.mem_alloc(0).map(drop), Status::InvalidValue, "0 bytes");
    check(c.mem_alloc(1 << 50).map(drop), Status::OutOfMemory, "bytes");
    check(
        c.mem_free(DevicePtr(0x1234)).map(drop),
        Status::InvalidHandle,
        "0x1234",
    );
    check(c.host_alloc(0).map(drop), Status::InvalidValue, "0-byte");
    check(
        c.memcpy_htod(DevicePtr(0), &[], Stream::DEFAULT),
        Status::InvalidValue,
        "0 bytes",
    );
    check(
        c.stream_synchronize(Stream(77)),
        Status::InvalidHandle,
        "0x4d",
    );
    check(
        c.module_load(b"this is not a module").map(drop),
        Status::InvalidImage,
        "not PTX",
    );
    check(c.module_load(&[]).map(drop), Status::InvalidValue, "empty");
    let m = c.module_load(&ptx()).unwrap();
    check(
        c.module_get_function(m, "no_such_kernel").map(drop),
        Status::NotFound,
        "no_such_kernel",
    );
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let p = c.mem_alloc(64).unwrap();
    let args: [&[u8]; 3] = [
        &p.0.to_le_bytes(),
        &1u32.to_le_bytes(),
        &16u64.to_le_bytes(),
    ];
    // A bad geometry fails in the launch call itself, as with CUDA (the server checks it again
    // against its device), and the stream carries on.
    check(
        c.launch(fill, grid(0), grid(32), 0, Stream::DEFAULT, &args),
        Status::InvalidValue,
        "zero extent",
    );
    check(
        c.launch(fill, grid(1), grid(2048), 0, Stream::DEFAULT, &args),
        Status::InvalidValue,
        "1024 threads",
    );
    c.stream_synchronize(Stream::DEFAULT).unwrap();
    check(
        c.launch(fill, grid(1), grid(32), 0, Stream::DEFAULT, &args[..2]),
        Status::InvalidValue,
        "3 parameters",
    );
    check(
        c.launch(
            fill,
            grid(1),
            grid(32),
            0,
            Stream::DEFAULT,
            &[&args[0][..4], args[1], args[2]],
        ),
        Status::InvalidValue,
        "parameter 0",
    );
    check(
        c.stream_destroy(Stream::DEFAULT),
        Status::InvalidValue,
        "default stream",
    );
    let e1 = c.event_create().unwrap();
    let e2 = c.event_create().unwrap();
    check(
        c.event_elapsed_ms(e1, e2).map(drop),
        Status::InvalidValue,
        "never recorded",
    );
    c.launch(fill, grid(1), grid(32), 0, Stream::DEFAULT, &args)
        .unwrap();
    c.synchronize().unwrap();
    let info = c.device_info();
    assert!(info.total_mem > 0 && info.sm_count > 0, "{info:?}");
    let (free, total) = c.mem_get_info().unwrap();
    assert!(free <= total && total == info.total_mem);
}

#[test]
fn an_address_inside_an_allocation_finds_its_base_and_size() {
    let server = TestServer::start();
    let c = server.client();
    let a = c.mem_alloc(1000).unwrap();
    let b = c.mem_alloc(64).unwrap();
    for offset in [0, 1, 999] {
        let at = DevicePtr(a.0 + offset);
        assert_eq!(c.mem_get_address_range(at).unwrap(), (a, 1000), "{offset}");
    }
    assert_eq!(c.mem_get_address_range(b).unwrap(), (b, 64));
    // Past the end, freed, or another client's: none of this client's allocations.
    let other = server.client();
    let theirs = other.mem_alloc(128).unwrap();
    c.mem_free(b).unwrap();
    for (ptr, what) in [
        (a.0 + 1000, "past the end"),
        (b.0, "freed"),
        (theirs.0, "another's"),
    ] {
        let e = c.mem_get_address_range(DevicePtr(ptr)).unwrap_err();
        assert_eq!(e.status, Status::NotFound, "{what}: {e}");
        assert!(e.message.contains("in no allocation"), "{what}: {e}");
    }
}

#[test]
fn a_client_of_another_protocol_version_is_refused() {
    use mps_core::protocol::{Hello, MAGIC, Welcome, get_str};
    let server = TestServer::start();
    let sock = std::os::unix::net::UnixStream::connect(server.socket()).unwrap();
    let hello = Hello {
        magic: MAGIC,
        version: 999,
        device: 0,
        flags: 0,
        group: mps_core::protocol::put_str("default"),
    };
    mps_ipc::socket::send(&sock, bytemuck::bytes_of(&hello), &[]).unwrap();
    let mut w: Welcome = bytemuck::Zeroable::zeroed();
    let fds = mps_ipc::socket::recv(&sock, bytemuck::bytes_of_mut(&mut w), 2).unwrap();
    assert!(fds.is_empty());
    assert_eq!(w.status, Status::ProtocolMismatch as u32);
    assert!(
        get_str(&w.message).contains("version 999"),
        "{}",
        get_str(&w.message)
    );
}

#[test]
fn connecting_without_a_server_is_a_connection_error() {
    let dir = temp_dir("nobody");
    let e = Client::connect(Some(&dir)).unwrap_err();
    assert_eq!(e.status, Status::Connection);
    assert!(e.message.contains("mps.sock"), "{e}");
}

#[test]
fn one_client_may_be_used_from_several_threads() {
    let server = TestServer::start();
    let c = server.client();
    std::thread::scope(|s| {
        for t in 0..4 {
            let c = &c;
            s.spawn(move || {
                for round in 0..3 {
                    vector_work(c, 20_000 + t * 1000, (t * 10 + round) as f32);
                }
            });
        }
    });
    c.synchronize().unwrap();
}

/// SM requests from a client that speaks the protocol itself: out-of-range percentages are
/// refused, a share can only go down, and a reservation is made once (every change of
/// reservations moves the other clients' streams).
#[test]
fn sm_requests_are_checked() {
    use mps_core::protocol::Request;
    // The checks are the server's, whatever the device: the simulator's 16 SMs make the
    // expected counts exact.
    let server = TestServer::start_with(&["--backend", "sim", "--sim-sm-count", "16"]);
    let mut raw = RawClient::connect(&server);
    for bad in [
        Request::SetSmShare { percent: 0 },
        Request::SetSmShare { percent: 101 },
        Request::ReserveSms { percent: 0 },
    ] {
        let c = raw.call(&bad, 0);
        assert_eq!(
            c.status,
            Status::InvalidValue as u32,
            "{bad:?}: {}",
            c.message()
        );
    }
    let c = raw.call(&Request::SetSmShare { percent: 50 }, 0);
    assert_eq!(c.values, [8, 16, 50, 0], "{}", c.message());
    let c = raw.call(&Request::SetSmShare { percent: 75 }, 0);
    assert_eq!(
        c.values[..3],
        [8, 16, 50],
        "a share cannot rise: {}",
        c.message()
    );
    let c = raw.call(&Request::ReserveSms { percent: 60 }, 0);
    assert_eq!(c.status, Status::QuotaExceeded as u32, "{}", c.message());
    assert!(c.message().contains("50%"), "{}", c.message());
    let c = raw.call(&Request::ReserveSms { percent: 25 }, 0);
    assert_eq!(c.values, [4, 16, 50, 25], "{}", c.message());
    let c = raw.call(&Request::ReserveSms { percent: 10 }, 0);
    assert_eq!(c.status, Status::InvalidValue as u32, "{}", c.message());
    assert!(c.message().contains("once"), "{}", c.message());
    let c = raw.call(&Request::SmInfo, 0);
    assert_eq!(c.values, [4, 16, 50, 25]);
}

/// 64 client processes connected to one server at once, each with its own streams, memory and
/// module, all get correct results.
#[test]
fn sixty_four_client_processes_are_served_at_once() {
    const TEST: &str = "sixty_four_client_processes_are_served_at_once";
    const CLIENTS: usize = 64;
    if let Some(role) = role() {
        let seed: f32 = role.parse().unwrap();
        let c = Client::connect(None).unwrap();
        vector_work(&c, 1000, seed);
        // Connected and served; hold the connection until every client is.
        println!("ready");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line).unwrap();
        vector_work(&c, 1000, seed + 0.5);
        return;
    }
    let server = TestServer::start();
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env("MPS_TEST_ROLE", i.to_string())
                .env("MPS_PIPE_DIRECTORY", &server.dir)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a client")
        })
        .collect();
    // Each says "ready" once served; the rest of its output is drained on a thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let mut outputs = Vec::new();
    for (i, child) in clients.iter_mut().enumerate() {
        let stdout = child.stdout.take().unwrap();
        let tx = tx.clone();
        outputs.push(std::thread::spawn(move || {
            let mut said = Vec::new();
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let line = line.unwrap_or_default();
                if line.ends_with("ready") {
                    let _ = tx.send(i);
                }
                said.push(line);
            }
            said.join("\n")
        }));
    }
    drop(tx);
    let mut ready = [false; CLIENTS];
    for _ in 0..CLIENTS {
        match rx.recv_timeout(WAIT) {
            Ok(i) => ready[i] = true,
            Err(e) => panic!(
                "clients {:?} never got ready ({e}); server log:\n{}",
                (0..CLIENTS).filter(|i| !ready[*i]).collect::<Vec<_>>(),
                server.log()
            ),
        }
    }
    // All 64 hold a connection now; let them finish.
    for child in &mut clients {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    for (i, (child, said)) in clients.into_iter().zip(outputs).enumerate() {
        let out = child.wait_with_output().unwrap();
        let said = said.join().unwrap();
        assert!(
            out.status.success(),
            "client {i} failed:\n{said}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Kernel parameters reach the kernel at the offsets it declares: `fill_u32(u32 *p, u32 value,
/// u64 n)` has a 4-byte parameter between two 8-byte ones, so a packed buffer that ignored the
/// padding would shift `n`. On a GPU the server passes them as one packed buffer laid out by
/// `cuFuncGetParamInfo`.
#[test]
fn kernel_parameters_reach_the_kernel_at_their_offsets() {
    let server = TestServer::start();
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let layout: Vec<(u32, u32)> = (0..3)
        .map(|i| {
            let p = c.function_param_info(fill, i).unwrap();
            (p.offset, p.size)
        })
        .collect();
    assert_eq!(layout, [(0, 8), (8, 4), (16, 8)]);
    assert_eq!(
        c.function_param_info(fill, 3).unwrap_err().status,
        Status::InvalidValue
    );
    // Fill all but the last element: the last keeps the memset's value only if n arrived.
    let n = 1000u64;
    let p = c.mem_alloc(n * 4).unwrap();
    c.memset_d32(p, 7, n, Stream::DEFAULT).unwrap();
    c.launch(
        fill,
        grid(3),
        grid(64),
        0,
        Stream::DEFAULT,
        &[
            &p.0.to_le_bytes(),
            &0xa5a5_0001u32.to_le_bytes(),
            &(n - 1).to_le_bytes(),
        ],
    )
    .unwrap();
    let mut out = vec![0u32; n as usize];
    c.memcpy_dtoh(bytemuck::cast_slice_mut(&mut out), p, Stream::DEFAULT)
        .unwrap();
    assert!(out[..n as usize - 1].iter().all(|v| *v == 0xa5a5_0001));
    assert_eq!(out[n as usize - 1], 7);
    c.mem_free(p).unwrap();
}

/// A copy from a host buffer (`host_alloc`) reads the client's own pages when the stream
/// reaches it, not when it was queued: no copy of them is taken on the way (on a GPU, the
/// buffer is registered with the driver and the copy is DMA straight from it).
#[test]
fn copies_from_host_buffers_read_the_clients_pages_when_they_run() {
    let server = TestServer::start();
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let spin = c.module_get_function(m, "spin_ns").unwrap();
    let ctr = c.mem_alloc(4).unwrap();
    let n = 1 << 16;
    let dst = c.mem_alloc(n as u64 * 4).unwrap();
    let hb = c.host_alloc(n * 4).unwrap();
    // SAFETY: the host buffer is n * 4 bytes, u32-aligned (page-aligned), and only this thread
    // writes it; the device reads it only after the spin, when the writes below are done.
    let host = unsafe { std::slice::from_raw_parts_mut(hb as *mut u32, n) };
    host.fill(1);
    let s = c.stream_create(0).unwrap();
    let copied = c.event_create().unwrap();
    // A kernel of one second holds the stream; the copy waits behind it.
    c.launch(
        spin,
        grid(1),
        grid(32),
        0,
        s,
        &[&1_000_000_000u64.to_le_bytes(), &ctr.0.to_le_bytes()],
    )
    .unwrap();
    c.memcpy_htod(dst, bytemuck::cast_slice(host), s).unwrap();
    c.event_record(copied, s).unwrap();
    host.fill(2);
    assert!(
        !c.event_query(copied).unwrap(),
        "the copy ran before the buffer was rewritten: nothing shown"
    );
    c.event_synchronize(copied).unwrap();
    let mut out = vec![0u32; n];
    c.memcpy_dtoh(bytemuck::cast_slice_mut(&mut out), dst, s)
        .unwrap();
    assert!(
        out.iter().all(|v| *v == 2),
        "the device got the buffer as it was when the copy was queued"
    );
    c.host_free(hb).unwrap();
}

/// A command that stays in the server's hands for a second is logged with its kind and the
/// client's pid, so that a client held in the server can be told from one whose work waits for
/// the device.
#[test]
fn a_command_held_in_the_server_for_a_second_is_logged_with_its_kind() {
    let server = TestServer::start();
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let spin = c.module_get_function(m, "spin_ns").unwrap();
    let ctr = c.mem_alloc(4).unwrap();
    let s = c.stream_create(0).unwrap();
    let stall = "(mem_free) has been in the server's hands for";
    // A free waits for the client's streams first: behind a kernel of 3 s, so does it (the
    // watcher reports after 1 to 1.25 s, well before the free returns).
    c.launch(
        spin,
        grid(1),
        grid(32),
        0,
        s,
        &[&3_000_000_000u64.to_le_bytes(), &ctr.0.to_le_bytes()],
    )
    .unwrap();
    assert!(!server.log().contains(stall), "{}", server.log());
    c.mem_free(ctr).unwrap();
    let log = server.wait_for_log(stall);
    let line = log.lines().find(|l| l.contains(stall)).unwrap();
    assert!(
        line.contains(&format!("pid={}", std::process::id())),
        "{line}"
    );
}

/// Completion is written by the GPU itself into a page the client maps: with every thread of
/// the server stopped (SIGSTOP), an event recorded behind a running kernel still completes.
/// (The simulator's stream threads are the server's, so there it would not.)
#[test]
fn the_gpu_writes_completion_while_the_server_is_stopped() {
    const TEST: &str = "the_gpu_writes_completion_while_the_server_is_stopped";
    if !on_gpu() {
        skip(
            TEST,
            "the simulator completes work on the server's own threads; needs a GPU (MPS_TEST_BACKEND=cuda)",
        );
        return;
    }
    use nix::sys::signal::{Signal, kill};
    let server = TestServer::start();
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let spin = c.module_get_function(m, "spin_ns").unwrap();
    let ctr = c.mem_alloc(4).unwrap();
    let done = c.event_create().unwrap();
    c.launch(
        spin,
        grid(1),
        grid(32),
        0,
        Stream::DEFAULT,
        &[&2_000_000_000u64.to_le_bytes(), &ctr.0.to_le_bytes()],
    )
    .unwrap();
    c.event_record(done, Stream::DEFAULT).unwrap();
    // A call the server answers in order: the launch and the record are with the driver now.
    c.mem_get_info().unwrap();
    let pid = nix::unistd::Pid::from_raw(server.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    /// Lets the server go on however the test ends.
    struct Resume(nix::unistd::Pid);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = kill(self.0, Signal::SIGCONT);
        }
    }
    let _resume = Resume(pid);
    let still_running = !c.event_query(done).unwrap();
    c.event_synchronize(done).unwrap();
    assert!(
        still_running,
        "the two-second kernel ended before the server was stopped: nothing shown"
    );
}

/// A client whose environment holds a bad value for one of mps's variables is refused at
/// connect, with `MPS_ERROR_INVALID_VALUE` naming the variable, rather than running with a
/// default it did not ask for. Each case runs in a child process of its own (the environment
/// is the process's).
#[test]
fn a_bad_value_of_a_client_variable_fails_the_connection_naming_it() {
    const TEST: &str = "a_bad_value_of_a_client_variable_fails_the_connection_naming_it";
    if let Some(var) = role() {
        let e = match Client::connect(None) {
            Ok(_) => panic!("connected with a bad {var}"),
            Err(e) => e,
        };
        assert_eq!(e.status, Status::InvalidValue, "{var}: {e}");
        assert!(e.message.contains(&var), "{var}: {e}");
        return;
    }
    let server = TestServer::start();
    for (var, value) in [
        ("MPS_CLIENT_PRIORITY", "2"),
        ("MPS_PINNED_DEVICE_MEM_LIMIT", "lots"),
        ("MPS_ACTIVE_THREAD_PERCENTAGE", "101"),
        ("MPS_SM_RESERVE", "abc"),
        ("MPS_CLIENT_SPIN_US", "20us"),
        ("MPS_CLIENT_YIELD_US", "-1"),
        ("MPS_GROUP", "a b"),
    ] {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--nocapture"])
            .env("MPS_TEST_ROLE", var)
            .env("MPS_PIPE_DIRECTORY", &server.dir)
            .env(var, value)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{var}={value}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Server arguments for tests of batched runs: batching on, and a hold so long that how fast
/// the client posts cannot split a run (each ends with its synchronise).
const HELD_RUNS: [&str; 6] = [
    "--launch-batching",
    "on",
    "--batch-hold-us",
    "10000000",
    "--batch-pacing",
    "off",
];

/// Host buffers of `n` f32 each, for a request's input (`i % 7` at element `i`) and output.
// Each call allocates the buffers it hands out, so no two calls' slices alias.
#[allow(clippy::mut_from_ref)]
fn host_inputs_and_outputs(c: &Client, n: usize) -> (&mut [f32], &mut [f32]) {
    let (input, output) = (c.host_alloc(n * 4).unwrap(), c.host_alloc(n * 4).unwrap());
    // SAFETY: both host buffers are n * 4 bytes of f32-aligned memory, mapped while the client
    // lives, that the caller uses from one thread and reads once the stream is synchronised.
    let (inputs, outputs) = unsafe {
        (
            std::slice::from_raw_parts_mut(input as *mut f32, n),
            std::slice::from_raw_parts_mut(output as *mut f32, n),
        )
    };
    for (i, v) in inputs.iter_mut().enumerate() {
        *v = (i % 7) as f32;
    }
    (inputs, outputs)
}

/// A small inference server's loop, `requests` times, the output checked after each: a memset
/// of a scratch buffer (one of two, taking turns, to the request's number), 4 KiB in from a host
/// buffer, 12 dependent `saxpy_f32` (y += x; every third request in half the blocks of twice
/// the threads), one more adding the scratch buffer, 4 KiB out to a host buffer, synchronise;
/// the tenth request scales by 2 instead of 1. A cached graph of the requests' run must be given
/// each memset's buffer and value and each launch's geometry. Returns when the client has left.
fn infer_requests(server: &TestServer, requests: u32) {
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let saxpy = c.module_get_function(m, "saxpy_f32").unwrap();
    let n = 1024usize;
    let bytes = n as u64 * 4;
    let (x, y) = (c.mem_alloc(bytes).unwrap(), c.mem_alloc(bytes).unwrap());
    let scratch = [c.mem_alloc(bytes).unwrap(), c.mem_alloc(bytes).unwrap()];
    let (inputs, outputs) = host_inputs_and_outputs(&c, n);
    let s = c.stream_create(0).unwrap();
    // In bytes, so that it is not the same work as the requests' memsets.
    c.memset_d8(y, 0, bytes, s).unwrap();
    let saxpy_on = |alpha: f32, x: u64, blocks: u32, threads: u32| {
        let args: [&[u8]; 4] = [
            &alpha.to_le_bytes(),
            &x.to_le_bytes(),
            &y.0.to_le_bytes(),
            &(n as u64).to_le_bytes(),
        ];
        c.launch(saxpy, grid(blocks), grid(threads), 0, s, &args)
            .unwrap();
    };
    let (mut total, mut added) = (0.0f32, 0.0f32);
    for request in 1..=requests {
        let alpha = if request == 10 { 2.0f32 } else { 1.0 };
        let z = scratch[request as usize % 2];
        c.memset_d32(z, (request as f32).to_bits(), n as u64, s)
            .unwrap();
        c.memcpy_htod(x, f32_bytes(inputs), s).unwrap();
        let (blocks, threads) = if request % 3 == 0 { (2, 512) } else { (4, 256) };
        for _ in 0..12 {
            saxpy_on(alpha, x.0, blocks, threads);
        }
        saxpy_on(1.0, z.0, 4, 256);
        c.memcpy_dtoh(bytemuck::cast_slice_mut(outputs), y, s)
            .unwrap();
        c.stream_synchronize(s).unwrap();
        total += 12.0 * alpha;
        added += request as f32;
        for (i, v) in outputs.iter().enumerate() {
            let want = (i % 7) as f32 * total + added;
            assert_eq!(*v, want, "request {request}, element {i}");
        }
    }
}

/// With `--launch-batching on`, a request repeated command for command is launched from one
/// cached graph, with every output exact, and so is a request whose kernels take another
/// parameter or geometry, or whose memset fills another buffer with another value: the graph's
/// nodes are given them for that launch, and the next request's output shows the old ones
/// back. The hold is long so that how fast this client posts cannot split a run (each ends with
/// its synchronise).
#[test]
fn launch_batching_serves_repeated_requests_from_one_graph_with_exact_results() {
    let server = TestServer::start_with(&HELD_RUNS);
    infer_requests(&server, 30);
    // Request 1's run, with the memset before it, is a shape of its own; request 2 taught the
    // requests' shape and 3 made its graph (a miss); the other 27, request 10 with its other
    // scale among them, were launched from the graph.
    let log = server.wait_for_log(
        "launch batching: 27 runs launched from cached graphs, 1 not (graphs made: 1; shapes \
         learned: 2; held runs that left their shape: 0;",
    );
    assert!(!log.contains("left the shape"), "{log}");
}

/// A program whose first runs are short (as a real one's are while it warms up: lazy module
/// loads and first allocations end them) and whose later runs begin with one of them is served
/// one graph launch per later run, not the short run's graph and the rest command by command:
/// a run that goes on past a shorter shape's graph is learned whole.
#[test]
fn launch_batching_learns_a_run_whole_past_a_shorter_shape_of_the_warm_up() {
    let server = TestServer::start_with(&HELD_RUNS);
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let saxpy = c.module_get_function(m, "saxpy_f32").unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let n = 1024usize;
    let bytes = n as u64 * 4;
    let (x, y, z) = (
        c.mem_alloc(bytes).unwrap(),
        c.mem_alloc(bytes).unwrap(),
        c.mem_alloc(bytes).unwrap(),
    );
    let (inputs, outputs) = host_inputs_and_outputs(&c, n);
    let s = c.stream_create(0).unwrap();
    c.memcpy_htod(x, f32_bytes(inputs), s).unwrap();
    c.memset_d8(y, 0, bytes, s).unwrap();
    c.stream_synchronize(s).unwrap();
    let n64 = n as u64;
    let twice = || {
        for _ in 0..2 {
            let args: [&[u8]; 4] = [
                &1.0f32.to_le_bytes(),
                &x.0.to_le_bytes(),
                &y.0.to_le_bytes(),
                &n64.to_le_bytes(),
            ];
            c.launch(saxpy, grid(4), grid(256), 0, s, &args).unwrap();
        }
    };
    // The warm-up: three runs of two launches, the third launched from their graph.
    for _ in 0..3 {
        twice();
        c.stream_synchronize(s).unwrap();
    }
    for request in 1..=10u32 {
        twice();
        let args: [&[u8]; 3] = [
            &z.0.to_le_bytes(),
            &request.to_le_bytes(),
            &n64.to_le_bytes(),
        ];
        c.launch(fill, grid(4), grid(256), 0, s, &args).unwrap();
        c.memcpy_dtoh(bytemuck::cast_slice_mut(outputs), y, s)
            .unwrap();
        c.stream_synchronize(s).unwrap();
        let times = (6 + 2 * request) as f32;
        for (i, v) in outputs.iter().enumerate() {
            assert_eq!(*v, (i % 7) as f32 * times, "request {request}, element {i}");
        }
    }
    drop(c);
    // The input's copy and the memset made a shape of their own. The warm-up's shape served
    // its third run and the first request's first two launches; the first request taught the
    // whole run, the second made its graph (held past the short shape), and the other eight
    // were launched from it.
    let log = server.wait_for_log(
        "launch batching: 10 runs launched from cached graphs, 2 not (graphs made: 2; shapes \
         learned: 3; held runs that left their shape: 0;",
    );
    assert!(!log.contains("left the shape"), "{log}");
}

/// Launch batching is on by default (the same work is served from a graph), and
/// `--launch-batching off` turns it off (never batched).
#[test]
fn launch_batching_is_on_by_default_and_off_turns_it_off() {
    let server = TestServer::start_with(&["--batch-hold-us", "10000000", "--batch-pacing", "off"]);
    infer_requests(&server, 12);
    let log = server.wait_for_log("client disconnected");
    assert!(log.contains("runs launched from cached graphs"), "{log}");

    let server = TestServer::start_with(&["--launch-batching", "off"]);
    infer_requests(&server, 12);
    let log = server.wait_for_log("client disconnected");
    assert!(!log.contains("launch batching:"), "{log}");
}

/// Work held for a batched run is not kept waiting when the client stops posting without a
/// synchronise: once its ring has been empty for the hold, the server submits it.
#[test]
fn launch_batching_submits_a_held_run_when_the_client_stops_posting() {
    // A hold long enough that how fast this client posts cannot split a run it completes.
    let server = TestServer::start_with(&[
        "--launch-batching",
        "on",
        "--batch-hold-us",
        "200000",
        "--batch-pacing",
        "off",
    ]);
    let c = server.client();
    let m = c.module_load(&ptx()).unwrap();
    let fill = c.module_get_function(m, "fill_u32").unwrap();
    let n = 256u64;
    let (x, y) = (c.mem_alloc(n * 4).unwrap(), c.mem_alloc(n * 4).unwrap());
    let out = c.host_alloc(n as usize * 8).unwrap();
    // The host buffer's 2n words, read once no copy into it is pending.
    let words = || {
        // SAFETY: the buffer holds 2n u32s (page-aligned); no copy into it is pending.
        unsafe { std::slice::from_raw_parts(out as *const u32, 2 * n as usize) }.to_vec()
    };
    let s = c.stream_create(0).unwrap();
    let fill_args = |p: DevicePtr, v: u32| {
        [
            p.0.to_le_bytes().to_vec(),
            v.to_le_bytes().to_vec(),
            n.to_le_bytes().to_vec(),
        ]
    };
    let post = |p: DevicePtr, v: u32, half: usize| {
        let args = fill_args(p, v);
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        c.launch(fill, grid(1), grid(256), 0, s, &refs).unwrap();
        // SAFETY: the host buffer holds 2n u32s; this half is n of them.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(out.add(half * n as usize * 4), n as usize * 4)
        };
        c.memcpy_dtoh(dst, p, s).unwrap();
    };
    // The shape: x filled and copied out, then y; learned, then made a graph.
    for _ in 0..2 {
        post(x, 7, 0);
        post(y, 7, 1);
        c.stream_synchronize(s).unwrap();
    }
    assert!(words().iter().all(|w| *w == 7));
    // SAFETY: 8n bytes of the host buffer; no copy into it is pending.
    unsafe { std::ptr::write_bytes(out, 0, n as usize * 8) };
    // Half of the run, then nothing: the server holds it, then submits it.
    post(x, 7, 0);
    wait_for_value(
        "the first word of the held half's copy",
        // SAFETY: the buffer's first word, which the pending copy writes.
        || unsafe { std::ptr::read_volatile(out as *const u32) },
        7,
    );
    post(y, 7, 1);
    c.stream_synchronize(s).unwrap();
    assert!(words().iter().all(|w| *w == 7), "{:?}", words());
    drop(c);
    // The second run made the graph; the held half went command by command. The rest began a
    // run whose kernel is the shape's first (the same work, another address) and whose copy
    // is not its second, so it left the shape there and went command by command too.
    server.wait_for_log(
        "a run left the shape it followed at command 2 of 4: a copy from the device with other \
         addresses or sizes",
    );
    server.wait_for_log(
        "launch batching: 0 runs launched from cached graphs, 3 not (graphs made: 1; shapes \
         learned: 1; held runs that left their shape: 1;",
    );
}
