//! Where a client's waits for its streams go, for an operator asking why a synchronise takes
//! long: with `MPS_CLIENT_WAIT_STATS=1` set, each process writes one line to standard error
//! after every [`EVERY`] waits, splitting them into the time until the server had taken every
//! command posted before the wait (the server behind the client) and the time after (the
//! server's held commands and the device). Off, a wait pays one look at a set-once flag.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Waits summed in each line.
pub(crate) const EVERY: u64 = 200;

/// The variable that turns the lines on.
const VARIABLE: &str = "MPS_CLIENT_WAIT_STATS";

/// Sums over the waits since the last line.
#[derive(Default)]
struct Sums {
    waits: AtomicU64,
    /// Waits that began with commands still in the ring.
    behind: AtomicU64,
    /// Ring slots not yet taken when the waits began.
    slots: AtomicU64,
    /// Nanoseconds until the ring was empty, and in all.
    untaken_ns: AtomicU64,
    total_ns: AtomicU64,
}

static SUMS: OnceLock<Sums> = OnceLock::new();

/// Whether the lines were asked for (read once).
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(VARIABLE).is_ok_and(|v| v.trim() == "1"))
}

/// One wait as it goes: made where it begins, with the submission ring's tail and head then,
/// told the head as it moves, finished when the wait ends.
pub(crate) struct WaitClock {
    began: Instant,
    /// The ring's head when the wait began, and the slots posted beyond it then: the commands
    /// this wait may wait for, not those other threads post meanwhile.
    head: u32,
    slots: u32,
    /// When the server had taken those slots.
    taken: Option<Duration>,
}

impl WaitClock {
    /// A wait that begins with the ring's published `tail` and `head`.
    pub(crate) fn start(tail: u32, head: u32) -> Self {
        let slots = tail.wrapping_sub(head);
        WaitClock {
            began: Instant::now(),
            head,
            slots,
            taken: (slots == 0).then_some(Duration::ZERO),
        }
    }

    /// Whether the server had not yet taken every slot posted before the wait, when last told.
    pub(crate) fn awaits_taking(&self) -> bool {
        self.taken.is_none()
    }

    /// The ring's head is now `head`.
    pub(crate) fn taken_up_to(&mut self, head: u32) {
        if self.taken.is_none() && head.wrapping_sub(self.head) >= self.slots {
            self.taken = Some(self.began.elapsed());
        }
    }

    /// The wait is over: adds it to the sums, and writes the line every [`EVERY`] waits.
    pub(crate) fn finish(self) {
        let total = self.began.elapsed();
        let s = SUMS.get_or_init(Sums::default);
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        s.behind
            .fetch_add(u64::from(self.slots > 0), Ordering::Relaxed);
        s.slots.fetch_add(u64::from(self.slots), Ordering::Relaxed);
        s.untaken_ns
            .fetch_add(ns(self.taken.unwrap_or(total)), Ordering::Relaxed);
        s.total_ns.fetch_add(ns(total), Ordering::Relaxed);
        if s.waits.fetch_add(1, Ordering::Relaxed) + 1 == EVERY {
            eprintln!("{}", line(s));
        }
    }
}

/// The line of the sums so far, which it resets (concurrent waits may land on either side).
fn line(s: &Sums) -> String {
    let take = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
    let waits = take(&s.waits).max(1);
    let (behind, slots) = (take(&s.behind), take(&s.slots));
    let (untaken, total) = (take(&s.untaken_ns), take(&s.total_ns));
    let us = |ns: u64| ns as f64 / waits as f64 / 1000.0;
    format!(
        "mps client {}: {waits} stream waits, mean {:.1} us; {behind} began with commands the \
         server had not taken (mean {:.1} ring slots a wait); until the server had taken them \
         all: mean {:.1} us, after: {:.1} us",
        std::process::id(),
        us(total),
        slots as f64 / waits as f64,
        us(untaken),
        us(total.saturating_sub(untaken)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_splits_the_waits_at_the_ring_emptying_and_starts_the_next_sums_afresh() {
        let s = Sums::default();
        s.waits.store(4, Ordering::Relaxed);
        s.behind.store(3, Ordering::Relaxed);
        s.slots.store(10, Ordering::Relaxed);
        s.untaken_ns.store(2_000_000, Ordering::Relaxed);
        s.total_ns.store(3_000_000, Ordering::Relaxed);
        let l = line(&s);
        assert!(
            l.contains(": 4 stream waits, mean 750.0 us; 3 began"),
            "{l}"
        );
        assert!(l.contains("(mean 2.5 ring slots a wait)"), "{l}");
        assert!(
            l.ends_with("them all: mean 500.0 us, after: 250.0 us"),
            "{l}"
        );
        assert_eq!(s.waits.load(Ordering::Relaxed), 0);
        assert_eq!(s.total_ns.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_wait_counts_the_slots_posted_before_it_even_across_the_rings_wrap() {
        let c = WaitClock::start(7, 7);
        assert!(!c.awaits_taking(), "nothing was in the ring");
        // Three slots posted, the indices about to wrap.
        let mut c = WaitClock::start(1, u32::MAX - 1);
        assert_eq!(c.slots, 3);
        c.taken_up_to(u32::MAX);
        assert!(c.awaits_taking(), "one of three taken");
        std::thread::sleep(Duration::from_millis(2));
        c.taken_up_to(1);
        let first = c.taken.expect("all three taken");
        c.taken_up_to(5);
        assert_eq!(
            c.taken,
            Some(first),
            "the first look that saw them taken counts"
        );
        assert!(first >= Duration::from_millis(2));
    }
}
