//! Admission of connections: the limits on connections per user and in all, and the intake of
//! hellos, where one thread watches every connection that has not finished its hello.
//!
//! A connection costs the server one descriptor and a slot in a list until its hello is
//! complete; no thread is started for it before then. Each has one deadline for its whole hello
//! (not one per read, which a client sending a byte now and then would renew forever), and the
//! list has a cap: when it is full, the connection that has waited longest is dropped to make
//! room, so that a flood of silent connections costs each of them its place quickly while a
//! client that sends its hello at once is served at once.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mps_core::protocol::{HELLO_PREFIX, Hello};
use mps_core::{Error, Result, Status};
use mps_ipc::socket::{self, Peer};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// How many connections a server admits, and how long a hello may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections (waiting for their hello or served) in all.
    pub max_clients: usize,
    /// Connections of one uid.
    pub max_clients_per_user: usize,
    /// Connections waiting for their hello at once.
    pub max_pending: usize,
    /// Time from accept to a complete hello.
    pub hello_timeout: Duration,
}

/// The defaults: a user's 256 clients cost the server about 800 threads (a session's threads
/// and the simulator's streams come on top), well inside a usual thread limit, and leave room
/// for root's; 64 hellos in flight are far more than clients starting together ever need.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_clients: 1024,
    max_clients_per_user: 256,
    max_pending: 64,
    hello_timeout: Duration::from_secs(5),
};

impl Default for Limits {
    fn default() -> Limits {
        DEFAULT_LIMITS
    }
}

/// Counts connections against [`Limits`].
#[derive(Debug)]
pub(crate) struct Gate {
    limits: Limits,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_uid: HashMap<u32, usize>,
}

/// One admitted connection; dropping it gives its place back.
#[derive(Debug)]
pub(crate) struct Ticket {
    gate: Arc<Gate>,
    uid: u32,
}

impl Gate {
    pub(crate) fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate {
            limits,
            counts: Mutex::new(Counts::default()),
        })
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection of `uid`, or says which limit it would pass.
    pub(crate) fn admit(self: &Arc<Self>, uid: u32) -> Result<Ticket> {
        let mut c = self.counts();
        let mine = c.per_uid.get(&uid).copied().unwrap_or(0);
        if mine >= self.limits.max_clients_per_user {
            return Err(Error::new(
                Status::PermissionDenied,
                format!(
                    "uid {uid} already has {mine} connections to this server, its limit \
                     (mps-server --max-clients-per-user); close some first"
                ),
            ));
        }
        if c.total >= self.limits.max_clients {
            return Err(Error::new(
                Status::PermissionDenied,
                format!(
                    "this server already has {} connections, its limit (mps-server \
                     --max-clients); try again when some have closed",
                    c.total
                ),
            ));
        }
        c.total += 1;
        *c.per_uid.entry(uid).or_insert(0) += 1;
        Ok(Ticket {
            gate: self.clone(),
            uid,
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut c = self.gate.counts();
        c.total -= 1;
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                c.per_uid.remove(&self.uid);
            }
        }
    }
}

/// A hello as far as it has arrived.
#[derive(Debug)]
pub(crate) struct HelloReader {
    hello: Hello,
    got: usize,
    /// The peer closed the connection.
    closed: bool,
}

impl HelloReader {
    pub(crate) fn new() -> HelloReader {
        HelloReader {
            hello: bytemuck::Zeroable::zeroed(),
            got: 0,
            closed: false,
        }
    }

    /// Reads what has arrived on `sock`, without waiting: the hello once it is complete. The
    /// part every protocol version shares is checked as soon as it is in, so that a client of
    /// another version is refused with a clear answer rather than left waiting.
    pub(crate) fn advance(&mut self, sock: &UnixStream) -> Result<Option<Hello>> {
        let whole = size_of::<Hello>();
        while self.got < whole {
            let buf = &mut bytemuck::bytes_of_mut(&mut self.hello)[self.got..];
            match socket::recv_available(sock, buf) {
                Ok(0) => {
                    self.closed = true;
                    return Err(Error::new(
                        Status::Connection,
                        format!(
                            "the client closed the connection after {} of the hello's {whole} \
                             bytes",
                            self.got
                        ),
                    ));
                }
                Ok(n) => {
                    let before = self.got;
                    self.got += n;
                    if before < HELLO_PREFIX && self.got >= HELLO_PREFIX {
                        self.hello.check_version()?;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(Error::new(
                        Status::Connection,
                        format!("reading the hello: {e}"),
                    ));
                }
            }
        }
        self.hello.check_flags()?;
        Ok(Some(self.hello))
    }
}

/// The error of a hello that did not arrive in time.
pub(crate) fn too_slow(timeout: Duration, got: usize) -> Error {
    Error::new(
        Status::Connection,
        format!(
            "the hello was not complete {} ms after connecting ({got} of {} bytes came); \
             connection dropped",
            timeout.as_millis(),
            size_of::<Hello>()
        ),
    )
}

/// Reads a hello on `stream`, waiting at most `timeout` for the whole of it; a hello that fails
/// its check is answered with a refusal.
pub(crate) fn read_hello_within(stream: &UnixStream, timeout: Duration) -> Result<Hello> {
    let deadline = Instant::now() + timeout;
    let mut reader = HelloReader::new();
    loop {
        match reader.advance(stream) {
            Ok(Some(h)) => return Ok(h),
            Ok(None) => {}
            Err(e) => {
                crate::server::refuse(stream, &e);
                return Err(e);
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let e = too_slow(timeout, reader.got);
            crate::server::refuse(stream, &e);
            return Err(e);
        }
        let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, poll_timeout(left)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(Error::new(Status::Connection, format!("poll: {e}"))),
        }
    }
}

/// `d` as a poll timeout, rounded up to a whole millisecond (so a wait never ends just short of
/// a deadline and spins).
pub(crate) fn poll_timeout(d: Duration) -> PollTimeout {
    let ms = d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

/// A connection waiting for its hello.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) stream: UnixStream,
    pub(crate) peer: Peer,
    pub(crate) ticket: Ticket,
    reader: HelloReader,
    deadline: Instant,
}

/// What became of a connection the intake looked at.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Its hello is complete: serve it.
    Ready(Pending, Hello),
    /// Refused (already answered with the reason where the client can still read it).
    Refused(Peer, Error),
    /// Closed by the client before it sent a byte (a probe of whether the server is up).
    Left(Peer),
}

/// The connections waiting for their hello, oldest first.
#[derive(Debug)]
pub(crate) struct Intake {
    gate: Arc<Gate>,
    pending: Vec<Pending>,
}

impl Intake {
    pub(crate) fn new(gate: Arc<Gate>) -> Intake {
        Intake {
            gate,
            pending: Vec::new(),
        }
    }

    /// Connections waiting.
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    /// Takes a connection just accepted: admits it, reads what of its hello has arrived, and
    /// keeps it waiting for the rest (dropping the oldest waiting one when the list is full).
    pub(crate) fn take(&mut self, stream: UnixStream, now: Instant, out: &mut Vec<Outcome>) {
        let peer = match socket::peer(&stream) {
            Ok(p) => p,
            Err(e) => {
                let e = Error::new(Status::Connection, format!("SO_PEERCRED failed: {e}"));
                let unknown = Peer {
                    pid: 0,
                    uid: u32::MAX,
                    gid: u32::MAX,
                };
                return out.push(Outcome::Refused(unknown, e));
            }
        };
        let ticket = match self.gate.admit(peer.uid) {
            Ok(t) => t,
            Err(e) => {
                crate::server::refuse(&stream, &e);
                return out.push(Outcome::Refused(peer, e));
            }
        };
        let p = Pending {
            stream,
            peer,
            ticket,
            reader: HelloReader::new(),
            deadline: now + self.gate.limits().hello_timeout,
        };
        if let Some(p) = Self::advance(p, out) {
            if self.pending.len() >= self.gate.limits().max_pending {
                let oldest = self.pending.remove(0);
                let e = Error::new(
                    Status::Connection,
                    format!(
                        "{} connections were waiting for their hello, the limit \
                         (--max-pending-hellos); this one had waited longest and was dropped",
                        self.gate.limits().max_pending
                    ),
                );
                crate::server::refuse(&oldest.stream, &e);
                out.push(Outcome::Refused(oldest.peer, e));
            }
            self.pending.push(p);
        }
    }

    /// Reads on `p`: `Some(p)` while its hello is incomplete.
    fn advance(mut p: Pending, out: &mut Vec<Outcome>) -> Option<Pending> {
        match p.reader.advance(&p.stream) {
            Ok(None) => Some(p),
            Ok(Some(hello)) => {
                out.push(Outcome::Ready(p, hello));
                None
            }
            Err(_) if p.reader.got == 0 && p.reader.closed => {
                out.push(Outcome::Left(p.peer));
                None
            }
            Err(e) => {
                crate::server::refuse(&p.stream, &e);
                out.push(Outcome::Refused(p.peer, e));
                None
            }
        }
    }

    /// Waits up to `wait` for any of `extra` or a waiting connection to become readable,
    /// reads what arrived, and drops connections past their deadline. Returns which of `extra`
    /// are readable.
    pub(crate) fn poll(
        &mut self,
        extra: &[std::os::fd::BorrowedFd<'_>],
        wait: Duration,
        out: &mut Vec<Outcome>,
    ) -> nix::Result<Vec<bool>> {
        let now = Instant::now();
        let next_deadline = self.pending.iter().map(|p| p.deadline).min();
        let wait = next_deadline.map_or(wait, |d| wait.min(d.saturating_duration_since(now)));
        let mut fds: Vec<PollFd<'_>> = extra
            .iter()
            .map(|f| PollFd::new(*f, PollFlags::POLLIN))
            .chain(
                self.pending
                    .iter()
                    .map(|p| PollFd::new(p.stream.as_fd(), PollFlags::POLLIN)),
            )
            .collect();
        let ready: Vec<bool> = match poll(&mut fds, poll_timeout(wait)) {
            Ok(_) => fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect(),
            Err(nix::errno::Errno::EINTR) => vec![false; fds.len()],
            Err(e) => return Err(e),
        };
        drop(fds);
        let (extra_ready, pending_ready) = ready.split_at(extra.len());
        let now = Instant::now();
        let pending = std::mem::take(&mut self.pending);
        for (p, &readable) in pending.into_iter().zip(pending_ready) {
            let p = if readable {
                match Self::advance(p, out) {
                    Some(p) => p,
                    None => continue,
                }
            } else {
                p
            };
            if now >= p.deadline {
                let e = too_slow(self.gate.limits().hello_timeout, p.reader.got);
                crate::server::refuse(&p.stream, &e);
                out.push(Outcome::Refused(p.peer, e));
            } else {
                self.pending.push(p);
            }
        }
        Ok(extra_ready.to_vec())
    }
}

/// How long the accept loop sleeps at most between looks at whether it should go on.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// How often failed accepts are logged at most.
const LOG_PERIOD: Duration = Duration::from_secs(10);

/// Accepts connections on `listener` while `open()` holds, admitting each through `gate` and
/// reading every hello on this one thread ([`Intake`]); `settle` is given what became of them
/// (a complete hello to serve, a refusal to log). When `accept` fails for want of descriptors
/// or memory, the listener is left out of the poll for a while (10 ms, doubling to 1 s) instead
/// of being retried at once, and the failure is logged at most once per 10 s.
pub(crate) fn accept_loop(
    listener: &UnixListener,
    gate: &Arc<Gate>,
    open: impl Fn() -> bool,
    mut settle: impl FnMut(&mut Vec<Outcome>),
) -> Result<()> {
    let mut intake = Intake::new(gate.clone());
    let mut backoff = Backoff::default();
    let mut accept_errors = Throttle::new(LOG_PERIOD);
    let mut outcomes = Vec::new();
    while open() {
        let now = Instant::now();
        // While accept fails, the listener stays readable: leave it out of the poll.
        let listen = backoff.until.is_none_or(|t| now >= t);
        let wait = backoff
            .until
            .filter(|_| !listen)
            .map_or(STOP_CHECK, |t| STOP_CHECK.min(t - now));
        let fds = [listener.as_fd()];
        let extra: &[_] = if listen { &fds } else { &[] };
        let ready = intake
            .poll(extra, wait, &mut outcomes)
            .map_err(|e| Error::internal(format!("poll on the listener: {e}")))?;
        settle(&mut outcomes);
        if !ready.first().copied().unwrap_or(false) || !open() {
            continue;
        }
        // Accept everything waiting, so a burst of connections costs one wake-up.
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    backoff.reset();
                    intake.take(stream, Instant::now(), &mut outcomes);
                    settle(&mut outcomes);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let pause = backoff.fail(Instant::now());
                    if let Some(left_out) = accept_errors.admit(Instant::now()) {
                        tracing::warn!(
                            "accept failed: {e}; pausing accepts for {} ms ({left_out} more \
                             failures since the last report; {} connections wait for their \
                             hello)",
                            pause.as_millis(),
                            intake.len()
                        );
                    }
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Pauses after failed accepts: 10 ms after the first, doubling to 1 s.
#[derive(Debug, Default)]
struct Backoff {
    pause: Option<Duration>,
    until: Option<Instant>,
}

impl Backoff {
    fn fail(&mut self, now: Instant) -> Duration {
        let pause = self.pause.map_or(Duration::from_millis(10), |p| {
            (p * 2).min(Duration::from_secs(1))
        });
        self.pause = Some(pause);
        self.until = Some(now + pause);
        pause
    }

    fn reset(&mut self) {
        self.pause = None;
        self.until = None;
    }
}

/// Logs a recurring event at most once per period, with a count of those left out.
#[derive(Debug)]
pub(crate) struct Throttle {
    period: Duration,
    last: Option<Instant>,
    left_out: u64,
}

impl Throttle {
    pub(crate) fn new(period: Duration) -> Throttle {
        Throttle {
            period,
            last: None,
            left_out: 0,
        }
    }

    /// `Some(n)` when this occurrence should be logged (`n`: how many were left out since the
    /// last one logged); `None` when it should not.
    pub(crate) fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.duration_since(t) < self.period => {
                self.left_out += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.left_out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_counts_per_user_and_in_all() {
        let gate = Gate::new(Limits {
            max_clients: 3,
            max_clients_per_user: 2,
            ..DEFAULT_LIMITS
        });
        let a1 = gate.admit(1).unwrap();
        let _a2 = gate.admit(1).unwrap();
        let e = gate.admit(1).unwrap_err();
        assert!(
            e.message.contains("--max-clients-per-user"),
            "{}",
            e.message
        );
        let _b1 = gate.admit(2).unwrap();
        let e = gate.admit(3).unwrap_err();
        assert!(e.message.contains("--max-clients)"), "{}", e.message);
        drop(a1);
        let _c1 = gate.admit(3).unwrap();
    }

    #[test]
    fn a_throttle_logs_once_per_period_and_counts_the_rest() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.admit(t0), Some(0));
        for i in 1..1000 {
            assert_eq!(t.admit(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(t.admit(t0 + Duration::from_secs(10)), Some(999));
    }

    #[test]
    fn a_hello_is_assembled_from_pieces_and_checked_early() {
        let (a, b) = UnixStream::pair().unwrap();
        let hello = Hello::new("default").unwrap();
        let bytes = bytemuck::bytes_of(&hello);
        let mut r = HelloReader::new();
        assert!(r.advance(&b).unwrap().is_none());
        for chunk in bytes.chunks(5) {
            socket::send(&a, chunk, &[]).unwrap();
            if let Some(h) = r.advance(&b).unwrap() {
                assert_eq!(h, hello);
                break;
            }
        }
        assert_eq!(r.got, bytes.len());
        // The wrong magic is refused as soon as the prefix is in.
        let (a, b) = UnixStream::pair().unwrap();
        socket::send(&a, &[0u8; HELLO_PREFIX], &[]).unwrap();
        assert!(HelloReader::new().advance(&b).is_err());
    }
}
