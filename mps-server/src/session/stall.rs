//! Reports a client whose commands stay where they are for a second or more: one command in
//! the server's hands (a driver call that does not return, or a wait for the device), or
//! commands in its ring that no session thread takes. A client kept waiting for its stream
//! while neither is reported waits for the device to run work the server already submitted.
//!
//! The session publishes what it handles in one word ([`Activity`]) with a single relaxed
//! store per step and no clock read; the socket watcher looks at every client a few times a
//! second ([`Watch::look`]) and does the timing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mps_core::protocol::Opcode;

/// How long commands stay in place before the watcher reports them.
const STALL: Duration = Duration::from_secs(1);

/// After a report, the least time before the next one of the same client: a client's own
/// commands can make it stall at will, and its reports must not fill the server's log.
const QUIET: Duration = Duration::from_secs(10);

/// Set in [`Activity`]'s word while a command is in the server's hands.
const IN_HAND: u64 = 1 << 16;

/// The opcode field while the session submits a batched run it held (no command's opcode).
const HELD_RUN: u16 = u16::MAX;

/// What one client's session is doing: `taken << 17 | IN_HAND | opcode` while it handles its
/// `taken`-th command, `taken << 17` between commands.
#[derive(Debug, Default)]
pub(crate) struct Activity(AtomicU64);

impl Activity {
    /// The session took command number `taken` (counting from 1), of kind `opcode`.
    pub(crate) fn taking(&self, taken: u64, opcode: u16) {
        self.0
            .store(taken << 17 | IN_HAND | u64::from(opcode), Ordering::Relaxed);
    }

    /// The session submits the batched run it held, whose last command is number `taken`.
    pub(crate) fn flushing(&self, taken: u64) {
        self.taking(taken, HELD_RUN);
    }

    /// The session is done with command number `taken`.
    pub(crate) fn done(&self, taken: u64) {
        self.0.store(taken << 17, Ordering::Relaxed);
    }
}

/// What the watcher last saw of one client.
#[derive(Debug)]
pub(crate) struct Watch {
    word: u64,
    /// When `word` last changed.
    changed: Instant,
    /// Since when the client's ring has held commands while `word` stood still.
    untaken_since: Option<Instant>,
    /// The word last reported, so that one stall is reported once.
    reported: Option<u64>,
    quiet_until: Instant,
}

impl Watch {
    pub(crate) fn new(now: Instant) -> Watch {
        Watch {
            word: 0,
            changed: now,
            untaken_since: None,
            reported: None,
            quiet_until: now,
        }
    }

    /// Looks at `activity` at `now`, with `untaken` commands published in the client's ring
    /// that its session could take (its completion ring has room); the report to log, if
    /// this look finds a stall not yet reported.
    pub(crate) fn look(
        &mut self,
        activity: &Activity,
        untaken: u32,
        now: Instant,
    ) -> Option<String> {
        let word = activity.0.load(Ordering::Relaxed);
        if word != self.word {
            self.word = word;
            self.changed = now;
            self.untaken_since = None;
        }
        let in_hand = word & IN_HAND != 0;
        if in_hand || untaken == 0 {
            self.untaken_since = None;
        } else {
            self.untaken_since.get_or_insert(now);
        }
        if self.reported == Some(word) || now < self.quiet_until {
            return None;
        }
        let taken = word >> 17;
        let held = now.duration_since(self.changed);
        let report = if in_hand && held >= STALL {
            let held = held.as_secs_f64();
            if word as u16 == HELD_RUN {
                format!(
                    "the held batched run that ends at command #{taken} of the client has been \
                     in the server's hands for {held:.1} s: a driver call that has not \
                     returned; the client's later commands wait behind it"
                )
            } else {
                let kind = Opcode::from_u16(word as u16).map_or("an unknown command", Opcode::name);
                format!(
                    "command #{taken} of the client ({kind}) has been in the server's hands \
                     for {held:.1} s: a driver call that has not returned, or a wait for the \
                     device; the client's later commands wait behind it"
                )
            }
        } else if let Some(since) = self
            .untaken_since
            .filter(|s| now.duration_since(*s) >= STALL)
        {
            format!(
                "{untaken} commands of the client have waited {:.1} s in its ring untaken, \
                 after its command #{taken}: the thread that serves it has not come back to it (it \
                 is in a driver call, or serving other clients)",
                now.duration_since(since).as_secs_f64()
            )
        } else {
            return None;
        };
        self.reported = Some(word);
        self.quiet_until = now + QUIET;
        Some(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_command_kept_a_second_is_reported_once_with_its_kind() {
        let t0 = Instant::now();
        let (a, mut w) = (Activity::default(), Watch::new(t0));
        a.taking(7, Opcode::MemFree as u16);
        assert_eq!(w.look(&a, 0, t0), None);
        assert_eq!(w.look(&a, 3, t0 + 900 * MS), None);
        let r = w.look(&a, 3, t0 + 1200 * MS).expect("a report");
        assert!(r.starts_with("command #7 of the client (mem_free)"), "{r}");
        assert!(r.contains("for 1.2 s"), "{r}");
        assert_eq!(w.look(&a, 3, t0 + 5000 * MS), None, "reported once");
    }

    #[test]
    fn a_held_run_kept_in_submission_is_named_as_such() {
        let t0 = Instant::now();
        let (a, mut w) = (Activity::default(), Watch::new(t0));
        a.flushing(9);
        assert_eq!(w.look(&a, 0, t0), None);
        let r = w.look(&a, 0, t0 + 1500 * MS).expect("a report");
        assert!(
            r.starts_with("the held batched run that ends at command #9"),
            "{r}"
        );
        assert!(r.contains("for 1.5 s"), "{r}");
    }

    #[test]
    fn commands_left_in_the_ring_are_timed_from_when_they_were_seen() {
        let t0 = Instant::now();
        let (a, mut w) = (Activity::default(), Watch::new(t0));
        a.done(4);
        // Idle for a long time, then commands arrive: the idle time does not count.
        assert_eq!(w.look(&a, 0, t0), None);
        assert_eq!(w.look(&a, 2, t0 + 5000 * MS), None);
        assert_eq!(w.look(&a, 2, t0 + 5900 * MS), None);
        let r = w.look(&a, 2, t0 + 6100 * MS).expect("a report");
        assert!(
            r.starts_with("2 commands of the client have waited 1.1 s"),
            "{r}"
        );
        assert!(r.contains("command #4:"), "{r}");
    }

    #[test]
    fn a_client_served_steadily_is_never_reported() {
        let t0 = Instant::now();
        let (a, mut w) = (Activity::default(), Watch::new(t0));
        for i in 1..200u64 {
            // Its ring always holds commands, but each look finds a later one taken.
            if i % 2 == 0 {
                a.taking(i, Opcode::Launch as u16);
            } else {
                a.done(i);
            }
            assert_eq!(w.look(&a, 5, t0 + i as u32 * 250 * MS), None, "look {i}");
        }
    }

    #[test]
    fn reports_of_one_client_are_spaced_out() {
        let t0 = Instant::now();
        let (a, mut w) = (Activity::default(), Watch::new(t0));
        a.taking(1, Opcode::Launch as u16);
        assert_eq!(w.look(&a, 0, t0), None);
        assert!(w.look(&a, 0, t0 + 1100 * MS).is_some());
        // A new stall at once is held back until the quiet time has passed.
        a.taking(2, Opcode::Launch as u16);
        assert_eq!(w.look(&a, 0, t0 + 1200 * MS), None);
        assert_eq!(w.look(&a, 0, t0 + 3000 * MS), None);
        assert!(w.look(&a, 0, t0 + 11_200 * MS).is_some());
    }
}
