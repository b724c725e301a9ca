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

/// One event's latest record, as the client tracks it: the stream slot it was recorded in and
/// the record's sequence number. The record has completed once that stream's published progress
/// reaches the sequence number. (A server hands a stream's slot to a new stream only after the
/// old stream's work completed, so a reused slot never vouches for a record that is pending.)
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventClock {
    last_record: Option<(u32, u64)>,
}

impl EventClock {
    /// Notes a record made by command `seq` in the stream of slot `slot`. Threads racing to record
    /// one event may note their records out of order; the latest in the ring wins.
    pub fn recorded(&mut self, slot: u32, seq: u64) {
        if self.last_record.is_none_or(|(_, s)| s < seq) {
            self.last_record = Some((slot, seq));
        }
    }

    /// Whether the event was ever recorded.
    pub fn was_recorded(&self) -> bool {
        self.last_record.is_some()
    }

    /// Whether the latest record has completed (an event never recorded is complete, as in
    /// CUDA), given a way to read a stream slot's published progress.
    pub fn is_complete(&self, progress: impl Fn(u32) -> u64) -> bool {
        self.last_record
            .is_none_or(|(slot, seq)| progress(slot) >= seq)
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
        assert!(e.is_complete(|_| 0));
        assert!(!e.was_recorded());
        e.recorded(2, 11);
        assert!(e.was_recorded());
        assert!(!e.is_complete(|s| if s == 2 { 10 } else { 100 }));
        assert!(e.is_complete(|s| if s == 2 { 11 } else { 0 }));
        // A later record in another stream supersedes; an older one noted late does not.
        e.recorded(5, 12);
        e.recorded(2, 9);
        assert!(!e.is_complete(|s| if s == 5 { 11 } else { 100 }));
        assert!(e.is_complete(|s| if s == 5 { 12 } else { 0 }));
    }
}
