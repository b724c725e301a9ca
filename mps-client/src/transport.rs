//! The shared-memory transport around the client's core: one lock around the submission ring
//! and what has been submitted, another around the completion ring and what has come back, and
//! the waiting (spin, yield, then nap on the progress doorbell, checking that the server is
//! still there). It is the client's submission and completion state; the `Client` owns it and
//! its calls go through it.

use std::cell::RefCell;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use mps_core::protocol::{Completion, Opcode, Request, flags};
use mps_core::slots::{Payload, Slots};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, ShmRing};
use mps_ipc::doorbell::{Wake, yield_contended};
use mps_ipc::ring::{Consumer, Producer, RingMemory};

use crate::completions::Completions;
use crate::handles::Stream;
use crate::submission::Submissions;
use crate::wait_stats::{self, WaitClock};

/// How long a waiting thread spins before anything else (`MPS_CLIENT_SPIN_US` overrides it).
const DEFAULT_SPIN: Duration = Duration::from_micros(20);
/// After spinning, how long it keeps looking while yielding the processor between looks (as
/// CUDA's own synchronisation does): a busy machine runs other threads meanwhile, an idle one
/// answers at once. Only then does it nap. (`MPS_CLIENT_YIELD_US` overrides it.)
const DEFAULT_YIELD: Duration = Duration::from_millis(2);
/// Its first nap; naps double up to `MAX_NAP`, and to a sixteenth of the wait so far, so that
/// oversleeping costs a long wait at most about 6%. A GPU writes stream progress without ringing
/// the doorbell (no host thread is on that path), so a sleeping waiter must look again by
/// itself.
const FIRST_NAP: Duration = Duration::from_micros(20);
const MAX_NAP: Duration = Duration::from_millis(2);
/// How often a waiter checks that the server is still there.
const LIVENESS: Duration = Duration::from_millis(100);

/// The variables that set a wait's spin and yield phases.
const WAIT_VARIABLES: [&str; 2] = ["MPS_CLIENT_SPIN_US", "MPS_CLIENT_YIELD_US"];

/// Microseconds from environment variable `var`: `Ok(None)` when unset or blank, an error naming
/// the variable when it is not a whole number.
fn micros_var(var: &str) -> mps_core::Result<Option<Duration>> {
    parse_micros(var, std::env::var(var).ok())
}

/// [`micros_var`] of `value`, the variable `var`'s value if set.
fn parse_micros(var: &str, value: Option<String>) -> mps_core::Result<Option<Duration>> {
    match value.filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse()
            .map(|us| Some(Duration::from_micros(us)))
            .map_err(|_| {
                mps_core::Error::invalid_value(format!(
                    "{var} is {v:?}; it must be a whole number of microseconds"
                ))
            }),
    }
}

/// Refuses a wait variable that is set to something other than microseconds (checked when a
/// client connects, so that a typo is an error and not a silent default).
pub(crate) fn check_wait_variables() -> mps_core::Result<()> {
    WAIT_VARIABLES
        .iter()
        .try_for_each(|v| micros_var(v).map(drop))
}

/// The spin and yield phases of a wait, read once from the environment.
fn wait_phases() -> (Duration, Duration) {
    static PHASES: OnceLock<(Duration, Duration)> = OnceLock::new();
    *PHASES.get_or_init(|| {
        // Checked at connect; a value changed to junk since keeps the default.
        let micros =
            |var: &str, default: Duration| micros_var(var).ok().flatten().unwrap_or(default);
        (
            micros(WAIT_VARIABLES[0], DEFAULT_SPIN),
            micros(WAIT_VARIABLES[1], DEFAULT_YIELD),
        )
    })
}

/// How long a waiter spins.
pub(crate) fn spin() -> Duration {
    wait_phases().0
}

/// The submission ring and the record of what went into it, under one lock.
pub(crate) struct Submitter {
    producer: Producer<mps_core::protocol::Command, ShmRing<mps_core::protocol::Command>>,
    pub(crate) core: Submissions,
}

/// The completion ring and the matching of what comes out of it, under one lock.
pub(crate) struct Receiver {
    consumer: Consumer<Completion, ShmRing<Completion>>,
    pub(crate) core: Completions,
}

/// Locks `m`, whether or not another thread panicked holding it (every critical section leaves
/// its state consistent between statements).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The error of a lost connection.
pub(crate) fn lost(what: impl std::fmt::Display) -> Error {
    Error::new(
        Status::Connection,
        format!("connection to the mps server lost: {what}"),
    )
}

/// A client's connection to its server: the socket (host buffers' descriptors arrive there, and
/// its hang-up says the server is gone), the channel, and the two rings under their locks.
pub(crate) struct Transport {
    pub(crate) socket: UnixStream,
    pub(crate) channel: Channel,
    pub(crate) submitter: Mutex<Submitter>,
    receiver: Mutex<Receiver>,
    /// Set once the server is known to be gone.
    lost: AtomicBool,
    /// A command was left unrung because the server said it needs no ring for it yet
    /// ([`Channel::ring_from`]); the next wait rings first.
    unrung: AtomicBool,
}

impl Transport {
    /// The transport over a channel whose handshake is done.
    pub(crate) fn new(socket: UnixStream, channel: Channel) -> Transport {
        let submitter = Submitter {
            producer: channel.submit_producer(),
            core: Submissions::new(),
        };
        let receiver = Receiver {
            consumer: channel.complete_consumer(),
            core: Completions::default(),
        };
        Transport {
            socket,
            submitter: Mutex::new(submitter),
            receiver: Mutex::new(receiver),
            channel,
            lost: AtomicBool::new(false),
            unrung: AtomicBool::new(false),
        }
    }

    /// Rings the submission doorbell for the commands in the ring.
    fn ring(&self) {
        self.unrung.store(false, Ordering::Relaxed);
        self.channel.submit_bell().ring();
    }

    /// Rings for commands left unrung, before waiting for anything: the server may sleep until
    /// its hold runs out otherwise.
    fn hurry(&self) {
        if self.unrung.load(Ordering::Relaxed) {
            self.ring();
        }
    }

    /// Marks the server gone and gives the error of `what`.
    pub(crate) fn lose(&self, what: impl std::fmt::Display) -> Error {
        self.lost.store(true, Ordering::Relaxed);
        lost(what)
    }

    /// Fails with the client's fault, a deferred error of earlier asynchronous work, or a lost
    /// connection.
    pub(crate) fn check(&self) -> Result<()> {
        self.check_alive()?;
        let mut r = lock(&self.receiver);
        self.drain(&mut r)?;
        r.core.check()
    }

    fn check_alive(&self) -> Result<()> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(lost("an earlier call saw the server go away"));
        }
        Ok(())
    }

    /// Feeds every completion in the ring to the core. A drain that took half a ring's worth
    /// or more rings the submission doorbell: the ring may have been full, and the server, which
    /// takes no command while it has no room for its answer, then sleeps until it hears from us
    /// (a server that ran out of room left the ring all but full, and a drain empties it).
    fn drain(&self, r: &mut Receiver) -> Result<()> {
        let mut taken = 0u32;
        loop {
            match r.consumer.pop() {
                Ok(Some(c)) => {
                    r.core.accept(c);
                    taken = taken.saturating_add(1);
                }
                Ok(None) => {
                    if taken >= r.consumer.memory().capacity() / 2 {
                        self.ring();
                    }
                    return Ok(());
                }
                Err(e) => {
                    return Err(self.lose(e));
                }
            }
        }
    }

    fn server_gone(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLHUP)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => false,
            Ok(_) => fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
            Err(_) => true,
        }
    }

    /// Waits until `ready` returns something, draining completions between looks; fails on a
    /// fault or a lost connection. `poll` is a cheap lock-free look (a progress word) that ends
    /// the spinning or napping early.
    pub(crate) fn wait_for<T>(
        &self,
        poll: impl Fn() -> bool,
        mut ready: impl FnMut(&mut Completions) -> Option<Result<T>>,
    ) -> Result<T> {
        self.hurry();
        let bell = self.channel.progress_bell();
        // Spin until `spin()` has passed since the wait began, whatever wakes us meanwhile (the
        // server rings the bell for every command it consumes); then yield between looks for a
        // while, unless a yield shows the machine's CPUs taken; then nap, doubling.
        let started = Instant::now();
        let spin_until = started + spin();
        let mut yield_until = spin_until + wait_phases().1;
        let mut nap = FIRST_NAP;
        let mut checked = Instant::now();
        loop {
            let seen = bell.value();
            {
                let mut r = lock(&self.receiver);
                self.drain(&mut r)?;
                if let Some(x) = ready(&mut r.core) {
                    return x;
                }
                if let Some(f) = r.core.fault() {
                    return Err(f.clone());
                }
            }
            let now = Instant::now();
            if now >= spin_until && now < yield_until {
                // Look again after a yield, without sleeping.
                let until = now + Duration::from_micros(50);
                while bell.value() == seen && !poll() && Instant::now() < until {
                    // A late yield: the machine's CPUs are all taken; nap from now on.
                    if yield_contended() {
                        yield_until = now;
                        break;
                    }
                }
                continue;
            }
            let cond = || bell.value() != seen || poll();
            if now < spin_until {
                let spin = spin_until - now;
                bell.wait(spin, spin, cond);
                continue;
            }
            let woke = bell.wait(Duration::ZERO, nap, cond);
            if woke == Wake::TimedOut {
                nap = (nap * 2)
                    .min(MAX_NAP)
                    .min(started.elapsed() / 16)
                    .max(FIRST_NAP);
                if checked.elapsed() >= LIVENESS {
                    checked = Instant::now();
                    if self.server_gone() {
                        return Err(self.lose("the server closed the connection"));
                    }
                }
            }
        }
    }

    /// Puts one command in the ring under one hold of the submission lock: checks `stream`,
    /// numbers the command, has `make` lay it out as slots (written straight into the ring),
    /// and notes it, with `committed` seeing the record, the number and the stream's progress
    /// slot. Returns the command's sequence number.
    pub(crate) fn submit<P: Payload>(
        &self,
        stream: Stream,
        fl: u16,
        opcode: Opcode,
        make: impl FnOnce(u64) -> Result<Slots<P>>,
        committed: impl FnOnce(&mut Submissions, u64, u32),
    ) -> Result<u64> {
        let mut s = lock(&self.submitter);
        self.check_alive()?;
        let (seq, slot) = s.core.begin(stream)?;
        let slots = make(seq)?;
        if fl & flags::REPLY != 0 {
            lock(&self.receiver).core.expect(seq);
        }
        loop {
            match s.producer.push_with(slots.len(), |i| slots.slot(i)) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    return Err(self.lose(e));
                }
            }
            // The ring is full: drain completions (the server may be waiting for room there)
            // and wait for the server to consume.
            self.hurry();
            let bell = self.channel.progress_bell();
            let seen = bell.value();
            self.drain(&mut lock(&self.receiver))?;
            if s.producer.free().is_ok_and(|f| f as usize >= slots.len()) {
                continue;
            }
            if bell.wait(spin(), LIVENESS, || bell.value() != seen) == Wake::TimedOut
                && self.server_gone()
            {
                return Err(self.lose("the server closed the connection"));
            }
        }
        s.core.commit(seq, opcode, stream, fl);
        committed(&mut s.core, seq, slot);
        drop(s);
        // The ring's tail is published before the server's word is read, as the server clears
        // the word before it reads the tail: one of the two sees the other.
        std::sync::atomic::fence(Ordering::SeqCst);
        let held_anyway = fl & (flags::MARK | flags::REPLY) == 0
            && opcode.may_join_run()
            && seq < self.channel.ring_from().load(Ordering::SeqCst)
            && stream.0 == self.channel.ring_stream().load(Ordering::SeqCst);
        if held_anyway {
            // The server holds a run this command may continue, and asked for no ring before
            // the command that would complete it.
            self.unrung.store(true, Ordering::Relaxed);
        } else {
            self.ring();
        }
        Ok(seq)
    }

    /// Submits `req` in `stream` with `fl`; returns its sequence number.
    pub(crate) fn submit_request(&self, req: &Request<'_>, stream: Stream, fl: u16) -> Result<u64> {
        self.submit(
            stream,
            fl,
            req.opcode(),
            |seq| Ok(Slots::of(req, seq, stream.0, fl)),
            |_, _, _| {},
        )
    }

    /// Waits for the reply to command `seq`.
    pub(crate) fn wait_reply(&self, seq: u64) -> Result<Completion> {
        self.wait_for(|| false, |c| c.take(seq))
    }

    /// Submits a command that expects a reply and waits for it.
    pub(crate) fn call(&self, req: &Request<'_>) -> Result<Completion> {
        self.check()?;
        let seq = self.submit_request(req, Stream::DEFAULT, flags::REPLY)?;
        self.wait_reply(seq)
    }

    /// As [`Transport::call`], but the error of earlier work that asked for no reply is left
    /// for the next call to report: a free is made even after such a failure, which is not its
    /// own (a program told that its free failed keeps, and so leaks, what it freed).
    pub(crate) fn call_leaving_deferred(&self, req: &Request<'_>) -> Result<Completion> {
        self.check_alive()?;
        {
            let mut r = lock(&self.receiver);
            self.drain(&mut r)?;
            if let Some(f) = r.core.fault() {
                return Err(f.clone());
            }
        }
        let seq = self.submit_request(req, Stream::DEFAULT, flags::REPLY)?;
        self.wait_reply(seq)
    }

    /// Submits stream-ordered work. It carries no `MARK`: publishing progress costs the server
    /// a device operation per command, so a stream is marked only when someone waits for it.
    pub(crate) fn enqueue(&self, req: &Request<'_>, stream: Stream) -> Result<u64> {
        self.check()?;
        self.submit_request(req, stream, 0)
    }

    /// The published progress of stream slot `slot`.
    pub(crate) fn progress(&self, slot: u32) -> u64 {
        self.channel.stream_done(slot).load(Ordering::Acquire)
    }

    /// Waits until the progress of stream slot `slot` reaches `seq`.
    pub(crate) fn wait_stream_seq(&self, slot: u32, seq: u64) -> Result<()> {
        let done = self.channel.stream_done(slot);
        let reached = || done.load(Ordering::Acquire) >= seq;
        if !wait_stats::enabled() || reached() {
            return self.wait_for(reached, |_| reached().then_some(Ok(())));
        }
        // Lock-free looks at the ring's indices: the waiter may hold the receiver's lock, and a
        // submitter holds the submitter's while it takes the receiver's.
        let (tail, head) = self.channel.submit_indices();
        let clock = RefCell::new(WaitClock::start(tail, head));
        let look = || {
            let mut c = clock.borrow_mut();
            if c.awaits_taking() {
                c.taken_up_to(self.channel.submit_indices().1);
            }
            reached()
        };
        let r = self.wait_for(look, |_| reached().then_some(Ok(())));
        let mut c = clock.into_inner();
        c.taken_up_to(self.channel.submit_indices().1);
        c.finish();
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_variable_is_microseconds_or_an_error_naming_it() {
        let us = |v: &str| parse_micros("MPS_CLIENT_SPIN_US", Some(v.to_string()));
        assert_eq!(us("50").unwrap(), Some(Duration::from_micros(50)));
        assert_eq!(us(" 7 ").unwrap(), Some(Duration::from_micros(7)));
        assert_eq!(us("").unwrap(), None);
        assert_eq!(parse_micros("MPS_CLIENT_SPIN_US", None).unwrap(), None);
        for bad in ["20us", "-1", "1.5"] {
            let e = us(bad).unwrap_err();
            assert_eq!(e.status, mps_core::Status::InvalidValue);
            assert!(e.message.starts_with("MPS_CLIENT_SPIN_US is"), "{e}");
        }
    }
}
