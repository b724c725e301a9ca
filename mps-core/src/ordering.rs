//! Stream ordering as a client sees it.
//!
//! Commands get strictly increasing sequence numbers per client. Within a stream they complete in
//! submission order, so one published number per stream (the sequence number of the latest
//! completed command that carried `MARK`) tells which of the stream's commands are done. Events
//! count their records: an event is complete when the generation the server published for it has
//! reached the generation of its latest record.

/// One stream's position, as the client tracks it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamClock {
    last_submitted: u64,
    last_marked: u64,
}

impl StreamClock {
    /// Notes that command `seq` was submitted to this stream, with or without `MARK`.
    pub fn submitted(&mut self, seq: u64, marked: bool) {
        debug_assert!(seq > self.last_submitted);
        self.last_submitted = seq;
        if marked {
            self.last_marked = seq;
        }
    }

    /// Whether the latest command carries no `MARK`, so that waiting for the stream first needs a
    /// marked command behind it.
    pub fn needs_mark(&self) -> bool {
        self.last_marked < self.last_submitted
    }

    /// The sequence number the stream's published progress must reach for all of its submitted
    /// work to be complete.
    pub fn target(&self) -> u64 {
        self.last_marked
    }

    /// Whether everything submitted so far has completed, given the published progress.
    pub fn is_idle(&self, published: u64) -> bool {
        !self.needs_mark() && published >= self.last_marked
    }
}

/// One event's records, as the client tracks them. A record's generation is the sequence number
/// of the command that made it, so generations only grow, even across events that reuse a slot
/// (the server publishes them with a maximum, never a plain store).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventClock {
    last_record: u64,
}

impl EventClock {
    /// Notes a record made by command `seq` (threads racing to record one event may note their
    /// records out of order; the latest in the ring wins).
    pub fn recorded(&mut self, seq: u64) {
        self.last_record = self.last_record.max(seq);
    }

    /// Whether the event was ever recorded.
    pub fn was_recorded(&self) -> bool {
        self.last_record != 0
    }

    /// Whether the latest record has completed (an event never recorded is complete, as in CUDA).
    pub fn is_complete(&self, published: u64) -> bool {
        published >= self.last_record
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_clock_tracks_marks() {
        let mut c = StreamClock::default();
        assert!(c.is_idle(0));
        c.submitted(3, true);
        assert!(!c.is_idle(2));
        assert!(c.is_idle(3));
        c.submitted(5, false);
        assert!(c.needs_mark());
        assert!(!c.is_idle(3));
        assert!(!c.is_idle(100), "unmarked work is never known to be done");
        c.submitted(6, true);
        assert!(!c.needs_mark());
        assert_eq!(c.target(), 6);
        assert!(c.is_idle(6));
    }

    #[test]
    fn event_clock_follows_its_latest_record() {
        let mut e = EventClock::default();
        assert!(e.is_complete(0));
        assert!(!e.was_recorded());
        e.recorded(11);
        assert!(e.was_recorded());
        assert!(!e.is_complete(10));
        assert!(e.is_complete(11));
        e.recorded(12);
        assert!(!e.is_complete(11));
        assert!(e.is_complete(40));
    }
}
