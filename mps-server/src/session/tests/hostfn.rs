//! Host functions' gates: a stream waits at a host wait until the client raises its gate word,
//! after publishing that the work before it is done; a client that goes away opens its gates.

use super::*;
use crate::backend::HostGates;

/// The `i`th 8-byte word of `seg`.
fn word(seg: &Segment, i: usize) -> &AtomicU64 {
    assert!((i + 1) * 8 <= seg.len());
    // SAFETY: inside the segment (asserted), 8-aligned (segments are page-aligned).
    unsafe { &*(seg.as_ptr() as *const AtomicU64).add(i) }
}

fn host_wait(handle: u64, offset: u64, value: u64) -> Request<'static> {
    Request::HostWait {
        gate: HostRef::Buffer { handle, offset },
        value,
    }
}

#[test]
fn a_stream_waits_at_a_host_wait_until_the_gate_is_raised() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let fill = c.function(m, "fill_u32");
    let p = c.alloc(4096);
    let (h, out) = host_buffer(&mut c, 4096);
    let (gate_h, gate) = host_buffer(&mut c, 4096);
    let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let slot = slot as u32;
    let params = fill_params(p, 7, 1);
    assert!(matches!(
        c.send(&launch(fill, &params), s, 0),
        Output::Silent
    ));
    let out_ref = HostRef::Buffer {
        handle: h,
        offset: 0,
    };
    let back = Request::CopyDtoH {
        dst: out_ref,
        src: p,
        len: 4,
    };
    assert!(matches!(c.send(&back, s, 0), Output::Silent));
    let out_wait = c.send(&host_wait(gate_h, 8, 1), s, flags::MARK);
    assert!(matches!(out_wait, Output::Silent), "{out_wait:?}");
    let waited = c.seq;
    // The host wait's progress says the work before it is done.
    wait_progress(&c.channel, slot, waited);
    assert_eq!(
        u32s(&out, 1),
        [7],
        "the work before the host wait was not done"
    );
    let params = fill_params(p, 9, 1);
    assert!(matches!(
        c.send(&launch(fill, &params), s, 0),
        Output::Silent
    ));
    assert!(matches!(c.send(&back, s, 0), Output::Silent));
    assert!(matches!(
        c.send(&Request::Mark, s, flags::MARK),
        Output::Silent
    ));
    let after = c.seq;
    // However long we look, the gate is shut: nothing after the wait can have run.
    std::thread::sleep(Duration::from_millis(20));
    assert!(c.channel.stream_done(slot).load(Ordering::Acquire) < after);
    assert_eq!(u32s(&out, 1), [7], "work after a shut gate ran");
    word(&gate, 1).store(1, Ordering::Release);
    wait_progress(&c.channel, slot, after);
    assert_eq!(u32s(&out, 1), [9]);
    // A second function of the stream waits for the next value of the same word.
    assert!(matches!(
        c.send(&host_wait(gate_h, 8, 2), s, flags::MARK),
        Output::Silent
    ));
    word(&gate, 1).store(2, Ordering::Release);
    sync(&mut c, s, slot);
}

#[test]
fn a_client_that_goes_away_opens_its_gates() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let (gate_h, gate) = host_buffer(&mut c, 4096);
    let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    assert!(matches!(
        c.send(&host_wait(gate_h, 0, 1), s, flags::MARK),
        Output::Silent
    ));
    assert!(matches!(
        c.send(&host_wait(gate_h, 8, 1), 0, flags::MARK),
        Output::Silent
    ));
    wait_progress(&c.channel, slot as u32, c.seq - 1);
    // Both streams wait on shut gates; releasing the client destroys them without waiting
    // for a function that will never return.
    let released = c.core.release();
    assert_eq!(released.streams, 2, "the default stream and one more");
    assert_eq!(word(&gate, 0).load(Ordering::Acquire), HostGates::OPEN);
    assert_eq!(word(&gate, 1).load(Ordering::Acquire), HostGates::OPEN);
}

/// Sends `req` with a mark, as the client does, and checks that it is refused with `status`
/// and a message that says `says`.
fn refused_marked(
    c: &mut Client<SimBackend>,
    req: &Request<'_>,
    s: u64,
    status: Status,
    says: &str,
) {
    match c.send(req, s, flags::MARK | flags::REPLY) {
        Output::Post(p) => {
            let e = p.result().unwrap_err();
            assert_eq!(e.status, status, "{req:?}: {e}");
            assert!(e.message.contains(says), "{req:?}: {e}");
        }
        other => panic!("{req:?}: {other:?}"),
    }
}

#[test]
fn a_host_wait_names_one_aligned_word_of_a_host_buffer_and_carries_a_mark() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let (gate_h, gate) = host_buffer(&mut c, 4096);
    let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let staging = Request::HostWait {
        gate: HostRef::Staging { offset: 0 },
        value: 1,
    };
    let bad = Status::InvalidValue;
    refused_marked(&mut c, &staging, s, bad, "not of the staging area");
    c.refused(&host_wait(gate_h, 0, 1), s, bad, "must carry MARK");
    refused_marked(&mut c, &host_wait(gate_h, 4, 1), s, bad, "8-byte aligned");
    refused_marked(
        &mut c,
        &host_wait(gate_h, 4096, 1),
        s,
        bad,
        "runs past the end",
    );
    refused_marked(&mut c, &host_wait(gate_h, 0, u64::MAX), s, bad, "at most");
    refused_marked(&mut c, &host_wait(0x77, 0, 1), s, Status::InvalidHandle, "");
    let out = c.send(&host_wait(gate_h, 16, 1), s, flags::MARK | flags::REPLY);
    assert!(
        matches!(&out, Output::Post(p) if p.result().is_ok()),
        "{out:?}"
    );
    refused_marked(&mut c, &host_wait(gate_h, 24, 2), s, bad, "one gate word");
    word(&gate, 2).store(1, Ordering::Release);
    sync(&mut c, s, slot as u32);
}

#[test]
fn a_capturing_stream_refuses_a_host_function() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let (gate_h, _gate) = host_buffer(&mut c, 4096);
    let s = c.stream();
    c.ok(&Request::StreamBeginCapture { stream: s }, 0);
    let e = c.call(&host_wait(gate_h, 0, 1), s);
    let e = e.unwrap_err();
    assert_eq!(e.status, Status::Unsupported, "{e}");
    assert!(
        e.message.contains("host function in a capturing stream"),
        "{e}"
    );
}
