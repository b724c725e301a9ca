//! Streams and events: creating them, waiting for them, ordering one stream after another.

use std::time::Instant;

use mps_core::ordering::EventClock;
use mps_core::protocol::{Request, flags};
use mps_core::slots::Slots;
use mps_core::{Error, Result};

use crate::connection::Client;
use crate::handles::{Event, Stream};
use crate::submission::Target;
use crate::transport::{lock, spin};

impl Client {
    /// Creates a stream (lower `priority` numbers are more urgent, as in CUDA).
    pub fn stream_create(&self, priority: i32) -> Result<Stream> {
        let v = self
            .transport
            .call(&Request::StreamCreate { priority })?
            .values;
        let stream = Stream(v[0]);
        lock(&self.transport.submitter)
            .core
            .stream_created(stream, v[1] as u32);
        Ok(stream)
    }

    /// Destroys a stream; work already in it still completes.
    pub fn stream_destroy(&self, stream: Stream) -> Result<()> {
        if stream == Stream::DEFAULT {
            return Err(Error::invalid_value(
                "the default stream cannot be destroyed",
            ));
        }
        self.stream_slot(stream)?;
        self.transport
            .call(&Request::StreamDestroy { stream: stream.0 })?;
        lock(&self.transport.submitter)
            .core
            .stream_destroyed(stream);
        Ok(())
    }

    /// The progress slot of `stream`, if it is this client's.
    pub(crate) fn stream_slot(&self, stream: Stream) -> Result<u32> {
        lock(&self.transport.submitter).core.slot(stream)
    }

    /// The progress slot of `stream` and the sequence number its progress must reach for its
    /// work so far to be done, submitting a mark first if its latest command carries none (and
    /// then saying so).
    fn stream_target(&self, stream: Stream) -> Result<(u32, u64, bool)> {
        let target = lock(&self.transport.submitter).core.target(stream)?;
        match target {
            Target::Reached { slot, seq } => Ok((slot, seq, false)),
            Target::NeedsMark { slot } => {
                let seq = self
                    .transport
                    .submit_request(&Request::Mark, stream, flags::MARK)?;
                Ok((slot, seq, true))
            }
        }
    }

    /// Waits for all work submitted to `stream`.
    pub fn stream_synchronize(&self, stream: Stream) -> Result<()> {
        self.transport.check()?;
        self.refuse_capturing(stream, "synchronise")?;
        let (slot, target, _) = self.stream_target(stream)?;
        self.transport.wait_stream_seq(slot, target)?;
        self.transport.check()
    }

    /// `Ok(true)` when all work submitted to `stream` is done, `Ok(false)` while some is pending.
    ///
    /// When the stream's latest work carries no mark, the query submits one; the answer is then
    /// `true` only if the mark comes back within the spin phase of a wait (about 20 us), so a
    /// stream that has just gone idle may be reported busy once.
    pub fn stream_query(&self, stream: Stream) -> Result<bool> {
        self.transport.check()?;
        self.refuse_capturing(stream, "query")?;
        let (slot, target, marked_now) = self.stream_target(stream)?;
        let done = || self.transport.progress(slot) >= target;
        let deadline = Instant::now() + spin();
        while marked_now && !done() && Instant::now() < deadline {
            std::hint::spin_loop();
        }
        Ok(done())
    }

    /// Makes future work in `stream` wait for the latest record of `event`.
    pub fn stream_wait_event(&self, stream: Stream, event: Event) -> Result<()> {
        self.event_clock(event)?;
        self.refuse_capturing(stream, "make an event wait in")?;
        self.transport
            .enqueue(&Request::StreamWaitEvent { event: event.0 }, stream)
            .map(drop)
    }

    /// Waits for all of this client's streams.
    pub fn synchronize(&self) -> Result<()> {
        self.transport.check()?;
        self.refuse_any_capturing("synchronise")?;
        let streams = lock(&self.transport.submitter).core.streams();
        for s in streams {
            let (slot, target, _) = self.stream_target(s)?;
            self.transport.wait_stream_seq(slot, target)?;
        }
        self.transport.check()
    }

    /// Creates an event.
    pub fn event_create(&self) -> Result<Event> {
        let v = self.transport.call(&Request::EventCreate)?.values;
        let event = Event(v[0]);
        lock(&self.transport.submitter).core.event_created(event);
        Ok(event)
    }

    /// Destroys an event.
    pub fn event_destroy(&self, event: Event) -> Result<()> {
        self.event_clock(event)?;
        self.transport
            .call(&Request::EventDestroy { event: event.0 })?;
        lock(&self.transport.submitter).core.event_destroyed(event);
        Ok(())
    }

    fn event_clock(&self, event: Event) -> Result<EventClock> {
        lock(&self.transport.submitter).core.event(event)
    }

    /// Records `event` in `stream`.
    pub fn event_record(&self, event: Event, stream: Stream) -> Result<()> {
        self.transport.check()?;
        self.event_clock(event)?;
        self.refuse_capturing(stream, "record an event in")?;
        let req = Request::EventRecord { event: event.0 };
        self.transport
            .submit(
                stream,
                flags::MARK,
                req.opcode(),
                |seq| Ok(Slots::of(&req, seq, stream.0, flags::MARK)),
                |core, seq, slot| core.recorded(event, slot, seq),
            )
            .map(drop)
    }

    /// Waits for the latest record of `event`.
    pub fn event_synchronize(&self, event: Event) -> Result<()> {
        self.transport.check()?;
        let clock = self.event_clock(event)?;
        let complete = || clock.is_complete(|s| self.transport.progress(s));
        self.transport
            .wait_for(complete, |_| complete().then_some(Ok(())))?;
        self.transport.check()
    }

    /// `Ok(true)` once the latest record of `event` has completed.
    pub fn event_query(&self, event: Event) -> Result<bool> {
        self.transport.check()?;
        let clock = self.event_clock(event)?;
        Ok(clock.is_complete(|s| self.transport.progress(s)))
    }

    /// Milliseconds between the completions of the latest records of `start` and `end`.
    pub fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32> {
        self.event_clock(start)?;
        self.event_clock(end)?;
        let v = self.transport.call(&Request::EventElapsed {
            start: start.0,
            end: end.0,
        })?;
        Ok(f32::from_bits(v.values[0] as u32))
    }
}
