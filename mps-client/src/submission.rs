//! What the client submits, apart from the ring it goes into: sequence numbers, the streams and
//! events of this client, and what a wait on a stream must wait for.
//!
//! [`Submissions`] does no I/O. The transport asks it for the next command's number and stream
//! slot ([`Submissions::begin`], which refuses a stream the client does not hold before anything
//! is written), puts the command's slots in the ring, and then notes it
//! ([`Submissions::commit`]). Work in a stream carries no `MARK` unless someone waits: publishing
//! progress costs the server a device operation per command, so [`Submissions::target`] says
//! when a wait must first submit a mark.

use mps_core::handle_hash::HandleMap;
use mps_core::ordering::{EventClock, StreamClock};
use mps_core::protocol::{Opcode, flags};
use mps_core::{Error, Result};

use crate::handles::{Event, Stream};

/// The stream slot of the default stream (its progress word in the server's status page).
const DEFAULT_SLOT: u32 = 0;

/// What a wait for a stream's work so far must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// Wait until the progress of stream slot `slot` reaches `seq`.
    Reached {
        /// The stream's progress slot.
        slot: u32,
        /// The sequence number to wait for.
        seq: u64,
    },
    /// The stream's latest command carries no mark: submit one, then wait for it.
    NeedsMark {
        /// The stream's progress slot.
        slot: u32,
    },
}

/// The client's record of what it has submitted.
#[derive(Debug)]
pub(crate) struct Submissions {
    next_seq: u64,
    // Keyed by the server's handles, looked up on every submission.
    streams: HandleMap<u64, (u32, StreamClock)>,
    events: HandleMap<u64, EventClock>,
}

impl Submissions {
    /// A new client's: sequence numbers from 1, the default stream only.
    pub(crate) fn new() -> Submissions {
        Submissions {
            next_seq: 1,
            streams: HandleMap::from_iter([(
                Stream::DEFAULT.0,
                (DEFAULT_SLOT, StreamClock::default()),
            )]),
            events: HandleMap::default(),
        }
    }

    /// The sequence number the next command gets, and the progress slot of `stream`; fails when
    /// `stream` is not this client's.
    pub(crate) fn begin(&self, stream: Stream) -> Result<(u64, u32)> {
        Ok((self.next_seq, self.slot(stream)?))
    }

    /// Notes that command `seq` (from [`Submissions::begin`]) of kind `opcode` is in the ring,
    /// in `stream`, with `fl`.
    pub(crate) fn commit(&mut self, seq: u64, opcode: Opcode, stream: Stream, fl: u16) {
        debug_assert_eq!(seq, self.next_seq, "commands are committed in order");
        self.next_seq = seq + 1;
        if opcode.is_stream_ordered()
            && let Some((_, clock)) = self.streams.get_mut(&stream.0)
        {
            // A host wait's mark says that the work before it is done, not the function: a
            // wait for the stream marks it again.
            let marked = fl & flags::MARK != 0 && opcode != Opcode::HostWait;
            clock.submitted(seq, marked);
        }
    }

    /// The progress slot of `stream`.
    pub(crate) fn slot(&self, stream: Stream) -> Result<u32> {
        self.streams
            .get(&stream.0)
            .map(|(slot, _)| *slot)
            .ok_or_else(|| unknown("stream", stream.0))
    }

    /// What a wait for all work submitted to `stream` so far must wait for.
    pub(crate) fn target(&self, stream: Stream) -> Result<Target> {
        let (slot, clock) = self
            .streams
            .get(&stream.0)
            .ok_or_else(|| unknown("stream", stream.0))?;
        Ok(if clock.needs_mark() {
            Target::NeedsMark { slot: *slot }
        } else {
            Target::Reached {
                slot: *slot,
                seq: clock.target(),
            }
        })
    }

    /// The client's streams, the default one included.
    pub(crate) fn streams(&self) -> Vec<Stream> {
        self.streams.keys().map(|s| Stream(*s)).collect()
    }

    /// Notes a stream the server created, with its progress slot.
    pub(crate) fn stream_created(&mut self, stream: Stream, slot: u32) {
        self.streams
            .insert(stream.0, (slot, StreamClock::default()));
    }

    /// Forgets a destroyed stream.
    pub(crate) fn stream_destroyed(&mut self, stream: Stream) {
        self.streams.remove(&stream.0);
    }

    /// Notes an event the server created.
    pub(crate) fn event_created(&mut self, event: Event) {
        self.events.insert(event.0, EventClock::default());
    }

    /// Forgets a destroyed event.
    pub(crate) fn event_destroyed(&mut self, event: Event) {
        self.events.remove(&event.0);
    }

    /// The latest record of `event`; fails when `event` is not this client's.
    pub(crate) fn event(&self, event: Event) -> Result<EventClock> {
        self.events
            .get(&event.0)
            .copied()
            .ok_or_else(|| unknown("event", event.0))
    }

    /// Notes that command `seq`, in the stream of progress slot `slot`, records `event`.
    pub(crate) fn recorded(&mut self, event: Event, slot: u32, seq: u64) {
        if let Some(clock) = self.events.get_mut(&event.0) {
            clock.recorded(slot, seq);
        }
    }
}

/// The error for a handle this client does not hold.
pub(crate) fn unknown(what: &str, h: u64) -> Error {
    Error::invalid_handle(format!("{what} {h:#x} is not a {what} of this client"))
}

#[cfg(test)]
mod tests {
    use mps_core::Status;

    use super::*;

    /// Submits one command the way the transport does.
    fn submit(s: &mut Submissions, opcode: Opcode, stream: Stream, fl: u16) -> Result<u64> {
        let (seq, _) = s.begin(stream)?;
        s.commit(seq, opcode, stream, fl);
        Ok(seq)
    }

    #[test]
    fn sequence_numbers_rise_by_one_from_one() {
        let mut s = Submissions::new();
        let seqs: Vec<u64> = (0..4)
            .map(|_| submit(&mut s, Opcode::MemAlloc, Stream::DEFAULT, flags::REPLY).unwrap())
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
    }

    #[test]
    fn a_foreign_stream_is_refused_before_it_takes_a_number() {
        let mut s = Submissions::new();
        let e = submit(&mut s, Opcode::Launch, Stream(0x4d), 0).unwrap_err();
        assert_eq!(e.status, Status::InvalidHandle);
        assert!(e.message.contains("stream 0x4d"), "{e}");
        assert_eq!(s.begin(Stream::DEFAULT).unwrap(), (1, DEFAULT_SLOT));
        assert!(s.target(Stream(0x4d)).is_err());
    }

    #[test]
    fn a_wait_marks_a_stream_only_when_its_latest_work_is_unmarked() {
        let mut s = Submissions::new();
        let st = Stream(0x2000);
        s.stream_created(st, 3);
        assert_eq!(s.target(st).unwrap(), Target::Reached { slot: 3, seq: 0 });
        submit(&mut s, Opcode::Launch, st, 0).unwrap();
        assert_eq!(s.target(st).unwrap(), Target::NeedsMark { slot: 3 });
        let mark = submit(&mut s, Opcode::Mark, st, flags::MARK).unwrap();
        assert_eq!(
            s.target(st).unwrap(),
            Target::Reached { slot: 3, seq: mark }
        );
        // Calls (not stream-ordered) leave every stream's progress alone.
        submit(&mut s, Opcode::MemAlloc, Stream::DEFAULT, flags::REPLY).unwrap();
        assert_eq!(
            s.target(st).unwrap(),
            Target::Reached { slot: 3, seq: mark }
        );
        // Work in one stream does not make another need a mark.
        submit(&mut s, Opcode::Launch, Stream::DEFAULT, 0).unwrap();
        assert_eq!(
            s.target(st).unwrap(),
            Target::Reached { slot: 3, seq: mark }
        );
        assert_eq!(
            s.target(Stream::DEFAULT).unwrap(),
            Target::NeedsMark { slot: 0 }
        );
        s.stream_destroyed(st);
        assert_eq!(s.target(st).unwrap_err().status, Status::InvalidHandle);
    }

    #[test]
    fn a_wait_after_a_host_function_marks_the_stream_again() {
        let mut s = Submissions::new();
        let st = Stream(0x2000);
        s.stream_created(st, 3);
        // The host wait's mark is published before its function runs: waiting for the
        // stream must wait past the function, for a mark after it.
        submit(&mut s, Opcode::HostWait, st, flags::MARK).unwrap();
        assert_eq!(s.target(st).unwrap(), Target::NeedsMark { slot: 3 });
    }

    #[test]
    fn an_event_follows_its_latest_record() {
        let mut s = Submissions::new();
        let ev = Event(0x3001);
        assert_eq!(s.event(ev).unwrap_err().status, Status::InvalidHandle);
        s.event_created(ev);
        assert!(!s.event(ev).unwrap().was_recorded());
        let (seq, slot) = s.begin(Stream::DEFAULT).unwrap();
        s.commit(seq, Opcode::EventRecord, Stream::DEFAULT, flags::MARK);
        s.recorded(ev, slot, seq);
        let clock = s.event(ev).unwrap();
        assert!(!clock.is_complete(|_| seq - 1));
        assert!(clock.is_complete(|_| seq));
        assert_eq!(
            s.target(Stream::DEFAULT).unwrap(),
            Target::Reached { slot, seq }
        );
        s.event_destroyed(ev);
        assert!(s.event(ev).is_err());
    }
}
