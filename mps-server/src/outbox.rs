//! The server's side of one client's completion ring, shared by the client's session thread
//! and the backend's stream workers (which report faults through it).

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mps_core::Error;
use mps_core::protocol::{Completion, CompletionKind};
use mps_ipc::channel::{Channel, ShmRing};
use mps_ipc::ring::Producer;

use crate::backend::{FaultSink, HostGates};

/// Posts completions to one client, and remembers why the client is being disconnected.
#[derive(Debug)]
pub(crate) struct Outbox {
    channel: Channel,
    producer: Mutex<Producer<Completion, ShmRing<Completion>>>,
    closing: Arc<AtomicBool>,
    /// Opened when the client is disconnected, so that no stream waits for it.
    gates: Arc<HostGates>,
    disconnect_reason: Mutex<Option<String>>,
    fault: Mutex<Option<Error>>,
    faulted: AtomicBool,
    socket: Arc<UnixStream>,
}

/// Free completion slots a session needs before it takes a command: one for the command's
/// answer and one for a fault report.
pub(crate) const ANSWER_ROOM: u32 = 2;

impl Outbox {
    pub(crate) fn new(
        channel: Channel,
        closing: Arc<AtomicBool>,
        gates: Arc<HostGates>,
        socket: Arc<UnixStream>,
    ) -> Self {
        Outbox {
            gates,
            producer: Mutex::new(channel.complete_producer()),
            channel,
            closing,
            disconnect_reason: Mutex::new(None),
            fault: Mutex::new(None),
            faulted: AtomicBool::new(false),
            socket,
        }
    }

    /// Posts one completion and wakes the client. A client that does not drain its completion
    /// ring stalls only its own session; one that corrupts the ring is disconnected.
    pub(crate) fn post(&self, c: Completion) {
        let mut producer = self.producer.lock().unwrap_or_else(|p| p.into_inner());
        let mut backoff = Duration::from_micros(20);
        loop {
            match producer.push(std::slice::from_ref(&c)) {
                Ok(true) => break,
                Ok(false) => {
                    if self.closing.load(Ordering::Relaxed) {
                        return;
                    }
                    // The client rings no bell when it frees completion slots; a full
                    // completion ring means a client that is not listening, so poll gently.
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(5));
                }
                Err(e) => {
                    drop(producer);
                    self.disconnect(format!("corrupted its completion ring: {e}"));
                    return;
                }
            }
        }
        drop(producer);
        self.channel.progress_bell().ring();
    }

    /// Whether the client is being disconnected.
    pub(crate) fn closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Commands the client has published that its session has not taken and could take now
    /// (its completion ring has [`ANSWER_ROOM`]). Read from the rings' shared words,
    /// for the stall report (`session/stall.rs`), which skips closing clients: it takes no
    /// lock a posting thread may hold while it waits for room.
    pub(crate) fn untaken(&self) -> u32 {
        if !self
            .channel
            .complete_producer()
            .free()
            .is_ok_and(|f| f >= ANSWER_ROOM)
        {
            return 0;
        }
        self.channel.submit_consumer().available().unwrap_or(0)
    }

    /// Ends the session: records why (the first reason wins), stops the session thread and
    /// the stream workers, and shuts the socket so the client sees the hang-up at once.
    pub(crate) fn disconnect(&self, reason: String) {
        let mut r = self
            .disconnect_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if r.is_none() {
            *r = Some(reason);
        }
        drop(r);
        self.closing.store(true, Ordering::SeqCst);
        // A stream waiting for a host function of a client that is gone (on the device, where
        // nothing else ends the wait) goes on.
        self.gates.open_all();
        let _ = self.socket.shutdown(std::net::Shutdown::Both);
        self.channel.submit_bell().ring();
    }

    /// Why the session ended, if it was ended on purpose.
    pub(crate) fn disconnect_reason(&self) -> Option<String> {
        self.disconnect_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The fault that poisoned this client, if any.
    pub(crate) fn fault(&self) -> Option<Error> {
        if !self.faulted.load(Ordering::Acquire) {
            return None;
        }
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl FaultSink for Outbox {
    fn fault(&self, seq: u64, err: Error) {
        let mut f = self.fault.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_some() {
            return;
        }
        tracing::warn!(seq, "client work failed: {err}");
        *f = Some(Error::new(
            err.status,
            format!("an earlier command (#{seq}) failed: {}", err.message),
        ));
        self.faulted.store(true, Ordering::Release);
        drop(f);
        self.post(Completion::error(seq, CompletionKind::AsyncError, &err));
    }

    fn has_faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use mps_core::Status;
    use mps_ipc::channel::Layout;

    use super::*;

    fn outbox() -> (Outbox, Channel, UnixStream) {
        let channel = Channel::create(Layout::default()).unwrap();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let closing = Arc::new(AtomicBool::new(false));
        let outbox = Outbox::new(channel.clone(), closing, Arc::default(), Arc::new(ours));
        (outbox, channel, theirs)
    }

    #[test]
    fn a_posted_completion_reaches_the_client_and_rings_its_bell() {
        let (outbox, channel, _peer) = outbox();
        let mut completions = channel.complete_consumer();
        let before = channel.progress_bell().value();
        outbox.post(Completion::reply(7, [1, 2, 3, 4]));
        assert_eq!(
            completions.pop().unwrap(),
            Some(Completion::reply(7, [1, 2, 3, 4]))
        );
        assert_ne!(channel.progress_bell().value(), before);
    }

    #[test]
    fn the_first_fault_is_posted_once_and_fails_every_later_command() {
        let (outbox, channel, _peer) = outbox();
        let mut completions = channel.complete_consumer();
        assert!(outbox.fault().is_none() && !outbox.has_faulted());
        FaultSink::fault(
            &outbox,
            3,
            Error::new(Status::IllegalAddress, "kernel wrote out of bounds"),
        );
        FaultSink::fault(&outbox, 4, Error::new(Status::Internal, "a second failure"));
        let posted = completions.pop().unwrap().unwrap();
        assert_eq!(
            (posted.seq, posted.kind),
            (3, CompletionKind::AsyncError as u32)
        );
        assert_eq!(posted.status, Status::IllegalAddress as u32);
        assert_eq!(
            completions.pop().unwrap(),
            None,
            "one fault, one completion"
        );
        let later = outbox.fault().unwrap();
        assert_eq!(later.status, Status::IllegalAddress);
        assert!(
            later.message.contains("#3") && later.message.contains("out of bounds"),
            "{later}"
        );
    }

    #[test]
    fn a_disconnect_keeps_its_first_reason_and_hangs_up() {
        let (outbox, _channel, mut peer) = outbox();
        outbox.disconnect("terminated by the operator".into());
        outbox.disconnect("hung up".into());
        assert_eq!(
            outbox.disconnect_reason().as_deref(),
            Some("terminated by the operator")
        );
        assert!(outbox.closing.load(Ordering::Relaxed));
        let mut buf = [0u8; 1];
        assert_eq!(peer.read(&mut buf).unwrap(), 0, "the socket is shut down");
    }

    #[test]
    fn posting_to_a_full_ring_of_a_closing_client_gives_up() {
        let (outbox, channel, _peer) = outbox();
        for seq in 0..channel.layout().complete_slots as u64 {
            outbox.post(Completion::reply(seq, [0; 4]));
        }
        outbox.disconnect("hung up".into());
        // The ring is full and nobody drains it: this returns rather than waits.
        outbox.post(Completion::reply(u64::MAX, [0; 4]));
        let mut completions = channel.complete_consumer();
        let mut n = 0;
        while let Some(c) = completions.pop().unwrap() {
            assert_ne!(c.seq, u64::MAX);
            n += 1;
        }
        assert_eq!(n, channel.layout().complete_slots);
    }
}
