//! How a session worker shares itself among its clients, driven turn by turn.

use super::*;
use crate::session::workers::{TURN, turn};
use crate::session::{ServerEnv, Session, Watcher};
use mps_core::protocol::{Completion, Request};
use mps_ipc::ring::RingMemory;

/// The client's ends of a session: its channel and its socket (whose drop is a hang-up).
type Ends = (Channel, std::os::unix::net::UnixStream);

/// A session of `server`'s, as a worker would hold it, and the client's ends.
fn session(server: &Server<SimBackend>, watcher: &Watcher, id: u32) -> (Session<SimBackend>, Ends) {
    let channel = Channel::create(Layout::default()).unwrap();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let env = ServerEnv {
        backend: server.backend.clone(),
        handles: server.handles.clone(),
        registry: server.registry.clone(),
        limits: Limits::default(),
        waits: (Duration::ZERO, Duration::ZERO),
    };
    let peer = mps_ipc::socket::Peer {
        pid: std::process::id() as i32,
        uid: 0,
        gid: 0,
    };
    let s = Session::new(env, id, peer, channel.clone(), Arc::new(ours)).unwrap();
    s.start(watcher);
    (s, (channel, theirs))
}

fn submit(channel: &Channel, req: &Request<'_>, seq: u64, flags: u16) {
    let (cmd, payload) = req.encode(seq, 0, flags);
    assert!(payload.is_empty());
    assert!(channel.submit_producer().push(&[cmd]).unwrap(), "ring full");
}

/// Commands the server has taken from `channel`'s ring.
fn taken(channel: &Channel) -> u32 {
    channel
        .submit_producer()
        .memory()
        .head()
        .load(Ordering::Acquire)
}

fn replies(channel: &Channel) -> Vec<Completion> {
    let mut c = channel.complete_consumer();
    std::iter::from_fn(|| c.pop().unwrap()).collect()
}

#[test]
fn a_flooding_client_delays_another_of_its_worker_by_at_most_one_turn() {
    let server = sim();
    let watcher = Watcher::start().unwrap();
    let (flood, (flood_ch, _flood_sock)) = session(&server, &watcher, 1);
    let (other, (other_ch, _other_sock)) = session(&server, &watcher, 2);
    const FLOOD: u32 = 300;
    for seq in 1..=FLOOD as u64 {
        submit(&flood_ch, &Request::Mark, seq, 0);
    }
    submit(&other_ch, &Request::Mark, 1, flags::REPLY);

    // The flooding client is first in the worker's order: the other still gets its command
    // taken in the same turn, after exactly one turn's worth of the flood.
    let mut clients = vec![flood, other];
    let t = turn(&mut clients);
    assert!(t.busy && t.closed.is_empty() && t.moved.is_empty());
    assert_eq!(taken(&flood_ch), TURN);
    assert_eq!(taken(&other_ch), 1);
    let answered = replies(&other_ch);
    assert_eq!(answered.len(), 1);
    assert_eq!((answered[0].seq, answered[0].result().is_ok()), (1, true));

    // The flood is served in later turns, a turn's worth at a time, and all of it.
    let mut turns = 1;
    loop {
        let busy = turn(&mut clients).busy;
        turns += 1;
        assert!(taken(&flood_ch) <= turns * TURN);
        if !busy {
            break;
        }
    }
    assert_eq!(taken(&flood_ch), FLOOD);
    assert_eq!(turns, FLOOD.div_ceil(TURN));
    assert!(
        replies(&flood_ch).is_empty(),
        "marks without REPLY are silent"
    );
}

#[test]
fn a_command_that_may_wait_leaves_the_worker_with_its_client() {
    let server = sim();
    let watcher = Watcher::start().unwrap();
    let (frees, (frees_ch, _frees_sock)) = session(&server, &watcher, 1);
    let (other, (other_ch, _other_sock)) = session(&server, &watcher, 2);
    submit(
        &frees_ch,
        &Request::MemAlloc { size: 4096 },
        1,
        flags::REPLY,
    );
    let mut clients = vec![frees, other];
    assert!(!turn(&mut clients).busy);
    let ptr = replies(&frees_ch)[0].result().unwrap()[0];
    submit(&frees_ch, &Request::MemFree { ptr }, 2, flags::REPLY);
    submit(&frees_ch, &Request::Mark, 3, flags::REPLY);
    submit(&other_ch, &Request::Mark, 1, flags::REPLY);

    let mut t = turn(&mut clients);
    // The free was taken but not handled, and nothing after it; the other client was served.
    assert_eq!(t.waiting.len(), 1);
    assert_eq!(clients.len(), 1);
    assert_eq!(taken(&frees_ch), 2);
    assert!(replies(&frees_ch).is_empty());
    assert_eq!(replies(&other_ch).len(), 1);
    // Whoever handles it answers it, and the client's next command follows in order.
    let mut frees = t.waiting.pop().unwrap();
    frees.handle_held();
    clients.push(frees);
    turn(&mut clients);
    let answered: Vec<_> = replies(&frees_ch)
        .iter()
        .map(|c| (c.seq, c.result().is_ok()))
        .collect();
    assert_eq!(answered, [(2, true), (3, true)]);
}

#[test]
fn a_client_that_lowers_its_priority_leaves_its_worker_and_one_that_corrupts_its_ring_is_closed() {
    let server = sim();
    let watcher = Watcher::start().unwrap();
    let (lowers, (lowers_ch, _lowers_sock)) = session(&server, &watcher, 1);
    let (corrupts, (corrupts_ch, _corrupts_sock)) = session(&server, &watcher, 2);
    let (stays, (stays_ch, _stays_sock)) = session(&server, &watcher, 3);
    submit(
        &lowers_ch,
        &Request::SetPriority {
            level: protocol::PRIORITY_BELOW_NORMAL,
        },
        1,
        flags::REPLY,
    );
    submit(&lowers_ch, &Request::Mark, 2, flags::REPLY);
    corrupts_ch
        .submit_producer()
        .memory()
        .tail()
        .store(1 << 20, Ordering::Release);
    submit(&stays_ch, &Request::Mark, 1, flags::REPLY);

    let mut clients = vec![lowers, corrupts, stays];
    let t = turn(&mut clients);
    assert_eq!(t.moved.len(), 1);
    assert!(t.moved[0].below_normal());
    // It moved right after the command that changed its tier; the rest waits for its new
    // worker.
    assert_eq!(taken(&lowers_ch), 1);
    assert_eq!(t.closed.len(), 1);
    assert_eq!(t.closed[0].id(), 2);
    assert_eq!(clients.len(), 1);
    assert_eq!(replies(&stays_ch).len(), 1);
    for s in t.closed.into_iter().chain(t.moved) {
        s.teardown();
    }
}
