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

use crate::backend::FaultSink;

/// Posts completions to one client, and remembers why the client is being disconnected.
#[derive(Debug)]
pub(crate) struct Outbox {
    channel: Channel,
    producer: Mutex<Producer<Completion, ShmRing<Completion>>>,
    closing: Arc<AtomicBool>,
    disconnect_reason: Mutex<Option<String>>,
    fault: Mutex<Option<Error>>,
    faulted: AtomicBool,
    socket: Arc<UnixStream>,
}

impl Outbox {
    pub(crate) fn new(channel: Channel, closing: Arc<AtomicBool>, socket: Arc<UnixStream>) -> Self {
        Outbox {
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
