//! How the client matches what the server sends back to what it submitted.
//!
//! [`Completions`] does no I/O: the transport feeds it every completion it takes from the ring
//! ([`Completions::accept`]). A command that asked for a reply ([`Completions::expect`]) gets
//! its completion, success or failure ([`Completions::take`]). A command that asked for none
//! (stream work) is answered only when it fails: the first such error is kept and reported by
//! the client's next call ([`Completions::check`]), naming the command. An asynchronous error (a
//! kernel fault) poisons the client: every later call fails with it.

use std::collections::{HashMap, HashSet};

use mps_core::protocol::{Completion, CompletionKind};
use mps_core::{Error, Result};

/// Replies owed, replies arrived, and errors not yet reported.
#[derive(Debug, Default)]
pub(crate) struct Completions {
    awaited: HashSet<u64>,
    replies: HashMap<u64, Completion>,
    fault: Option<Error>,
    deferred: Option<Error>,
}

impl Completions {
    /// Notes that command `seq` asked for a reply, before it is submitted (so that its reply,
    /// however soon it comes, is kept for it).
    pub(crate) fn expect(&mut self, seq: u64) {
        self.awaited.insert(seq);
    }

    /// Takes one completion from the server.
    pub(crate) fn accept(&mut self, c: Completion) {
        if c.kind == CompletionKind::AsyncError as u32 {
            if self.fault.is_none() {
                let e = c.result().err().unwrap_or_else(|| {
                    Error::internal("the server reported an asynchronous error without a status")
                });
                self.fault = Some(Error::new(
                    e.status,
                    format!("command #{} failed while running: {}", c.seq, e.message),
                ));
            }
        } else if self.awaited.remove(&c.seq) {
            self.replies.insert(c.seq, c);
        } else if let Err(e) = c.result()
            && self.deferred.is_none()
        {
            self.deferred = Some(Error::new(
                e.status,
                format!("command #{} failed: {}", c.seq, e.message),
            ));
        }
    }

    /// The answer to command `seq`, once it has arrived: its completion, or the error it carries.
    pub(crate) fn take(&mut self, seq: u64) -> Option<Result<Completion>> {
        self.replies.remove(&seq).map(|c| c.result().map(|_| c))
    }

    /// The fault that poisoned the client, if one did.
    pub(crate) fn fault(&self) -> Option<&Error> {
        self.fault.as_ref()
    }

    /// Fails with the client's fault, or (once) with the first error of earlier work that asked
    /// for no reply.
    pub(crate) fn check(&mut self) -> Result<()> {
        if let Some(f) = &self.fault {
            return Err(f.clone());
        }
        self.deferred.take().map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use mps_core::Status;

    use super::*;

    fn failed(seq: u64, kind: CompletionKind, status: Status, msg: &str) -> Completion {
        Completion::error(seq, kind, &Error::new(status, msg))
    }

    #[test]
    fn replies_are_matched_by_sequence_number_in_any_order() {
        let mut c = Completions::default();
        c.expect(1);
        c.expect(2);
        assert!(c.take(1).is_none(), "nothing has arrived");
        c.accept(Completion::reply(2, [20, 0, 0, 0]));
        c.accept(Completion::reply(1, [10, 0, 0, 0]));
        assert_eq!(c.take(1).unwrap().unwrap().values[0], 10);
        assert_eq!(c.take(2).unwrap().unwrap().values[0], 20);
        assert!(c.take(2).is_none(), "a reply is taken once");
        c.check().unwrap();
    }

    #[test]
    fn a_failed_call_gets_its_own_error_and_leaves_nothing_behind() {
        let mut c = Completions::default();
        c.expect(4);
        c.accept(failed(
            4,
            CompletionKind::Reply,
            Status::OutOfMemory,
            "1 TiB",
        ));
        let e = c.take(4).unwrap().unwrap_err();
        assert_eq!(
            (e.status, e.message.as_str()),
            (Status::OutOfMemory, "1 TiB")
        );
        c.check().unwrap();
    }

    #[test]
    fn an_error_of_work_without_a_reply_is_reported_once_by_the_next_check() {
        let mut c = Completions::default();
        c.accept(failed(
            7,
            CompletionKind::Reply,
            Status::InvalidValue,
            "zero extent",
        ));
        c.accept(failed(
            9,
            CompletionKind::Reply,
            Status::InvalidHandle,
            "later",
        ));
        // A call whose reply arrives meanwhile still gets it.
        c.expect(10);
        c.accept(Completion::reply(10, [1, 0, 0, 0]));
        assert!(c.take(10).unwrap().is_ok());
        let e = c.check().unwrap_err();
        assert_eq!(e.status, Status::InvalidValue);
        assert_eq!(e.message, "command #7 failed: zero extent");
        c.check().unwrap();
    }

    #[test]
    fn a_success_nobody_asked_for_is_dropped() {
        let mut c = Completions::default();
        c.accept(Completion::reply(3, [0; 4]));
        c.check().unwrap();
        assert!(c.take(3).is_none());
    }

    #[test]
    fn a_fault_poisons_every_later_check_and_the_first_fault_wins() {
        let mut c = Completions::default();
        c.accept(failed(
            5,
            CompletionKind::AsyncError,
            Status::IllegalAddress,
            "bad read",
        ));
        c.accept(failed(
            6,
            CompletionKind::AsyncError,
            Status::LaunchFailed,
            "other",
        ));
        for _ in 0..3 {
            let e = c.check().unwrap_err();
            assert_eq!(e.status, Status::IllegalAddress);
            assert_eq!(e.message, "command #5 failed while running: bad read");
        }
        assert_eq!(c.fault().unwrap().status, Status::IllegalAddress);
        // Replies still reach their calls, which report the fault through `check`.
        c.expect(8);
        c.accept(Completion::reply(8, [0; 4]));
        assert!(c.take(8).unwrap().is_ok());
    }

    #[test]
    fn an_asynchronous_error_without_a_status_is_still_a_fault() {
        let mut c = Completions::default();
        let mut odd = Completion::reply(2, [0; 4]);
        odd.kind = CompletionKind::AsyncError as u32;
        c.accept(odd);
        assert_eq!(c.check().unwrap_err().status, mps_core::Status::Internal);
    }
}
