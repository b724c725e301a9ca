//! Where a client's waits for its streams go, for an operator asking why a synchronise takes
//! long: with `MPS_CLIENT_WAIT_STATS=1` set, each process writes one line to standard error
//! after every [`EVERY`] waits, splitting them into the time until the server had taken every
//! command the client had posted (the server behind the client) and the time after (the
//! server's held commands and the device). Off, a wait pays one relaxed load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Waits summed in each line.
pub(crate) const EVERY: u64 = 1000;

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

/// One wait as it goes: made where it begins, told when the ring is seen empty, finished when
/// the wait ends.
pub(crate) struct WaitClock {
    began: Instant,
    slots: u32,
    emptied: Option<Duration>,
}

impl WaitClock {
    /// A wait that begins with `slots` of the ring not yet taken by the server.
    pub(crate) fn start(slots: u32) -> Self {
        WaitClock {
            began: Instant::now(),
            slots,
            emptied: (slots == 0).then_some(Duration::ZERO),
        }
    }

    /// Whether the clock still waits to see the ring empty.
    pub(crate) fn awaits_empty(&self) -> bool {
        self.emptied.is_none()
    }

    /// The ring was seen empty now.
    pub(crate) fn emptied(&mut self) {
        self.emptied.get_or_insert_with(|| self.began.elapsed());
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
            .fetch_add(ns(self.emptied.unwrap_or(total)), Ordering::Relaxed);
        s.total_ns.fetch_add(ns(total), Ordering::Relaxed);
        if s.waits.fetch_add(1, Ordering::Relaxed) + 1 >= EVERY {
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
    fn a_wait_that_began_with_an_empty_ring_spent_none_of_it_on_untaken_commands() {
        let c = WaitClock::start(0);
        assert!(!c.awaits_empty());
        let mut c = WaitClock::start(5);
        assert!(c.awaits_empty());
        std::thread::sleep(Duration::from_millis(2));
        c.emptied();
        let first = c.emptied.unwrap();
        c.emptied();
        assert_eq!(c.emptied, Some(first), "the first emptying counts");
        assert!(first >= Duration::from_millis(2));
    }
}
