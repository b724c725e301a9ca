//! Driver calls that need the driver to themselves, and other threads' calls held back for them
//! once they have waited too long.
//!
//! Starting a stream capture (`cuStreamBeginCapture`) and instantiating a graph
//! (`cuGraphInstantiate`) wait on a read-write lock of the driver's for writing, which most
//! likely lets new readers in while a writer waits, as glibc's do unless asked otherwise. With
//! many session workers making driver calls the readers overlap without a gap, and a writer
//! waits for as long as the calls keep coming: on an H100 with 64 ResNet-18 clients starting at
//! once, 57 of 192 sampled stacks of the server's workers waited in those two calls while their
//! clients were held for seconds (docs/bench/h100-2026-12-07-stacks). So a thread about to make
//! such a call says so here, and a thread about to make any other driver call ([`hold_back`],
//! from `Context::bind`) waits once such a call has been pending for `PATIENCE` with none
//! ending, for `MOST_HELD` at most: the calls in flight end, the writer gets the lock, and the
//! others go on. This is `--driver-writer-priority on`; off, the default, leaves the driver's
//! lock as it is.
//!
//! Holding back at once, for every such call, ended that hold too but cost ResNet-18 11% and
//! BERT-base 21% of their requests at 16 clients (one round on an H100): the writer's wait for
//! the calls already in the driver became every thread's. Where no writer is pending a check
//! costs one load of a line that only writers write.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Whether writers are announced at all (`--driver-writer-priority`).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Threads in, or about to enter, a call that takes the driver's lock for writing. The driver's
/// lock is the process's, whatever the context (a green context per client was held the same
/// way), so the count is too.
static WRITERS: AtomicU32 = AtomicU32::new(0);

/// When a thread first found a writer pending since the last writer's call ended, in
/// nanoseconds since `epoch()` plus one; 0 when none is known to be pending.
static PENDING_SINCE: AtomicU64 = AtomicU64::new(0);

/// How long writers may be pending with none ending before other calls hold back. A writer
/// that is not starved gets the lock in microseconds.
const PATIENCE: Duration = Duration::from_micros(200);

/// The longest a call is held back for one pending writer.
const MOST_HELD: Duration = Duration::from_millis(1);

/// How long a held-back thread spins before it yields: most writers' calls take tens of
/// microseconds.
const SPIN: Duration = Duration::from_micros(20);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn stamp() -> u64 {
    epoch().elapsed().as_nanos() as u64 + 1
}

/// Runs `call`, a driver call that takes the driver's lock for writing, announced to other
/// threads' driver calls until it returns. `call` must make no other driver call through the
/// backend's entry points.
pub(super) fn exclusive<R>(call: impl FnOnce() -> R) -> R {
    if !ENABLED.load(Ordering::Relaxed) {
        return call();
    }
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            // A writer that ends restarts the others' clock: the lock is not starved.
            PENDING_SINCE.store(0, Ordering::Release);
            WRITERS.fetch_sub(1, Ordering::Release);
        }
    }
    if WRITERS.fetch_add(1, Ordering::SeqCst) == 0 {
        // A clock left by a look that raced the last writer's end is not this writer's.
        PENDING_SINCE.store(0, Ordering::Release);
    }
    let _done = Done;
    call()
}

/// Turns the priority of the driver's writers on or off for the whole process; set before the
/// server serves.
pub fn prioritise_driver_writers(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Waits while a call that takes the driver's lock for writing has been pending for longer
/// than `PATIENCE` with none ending.
#[inline]
pub(super) fn hold_back() {
    if WRITERS.load(Ordering::Relaxed) != 0 {
        pending();
    }
}

#[cold]
fn pending() {
    let since = PENDING_SINCE.load(Ordering::Acquire);
    if since == 0 {
        // The first to see this writer starts its clock.
        let _ = PENDING_SINCE.compare_exchange(0, stamp(), Ordering::AcqRel, Ordering::Relaxed);
        return;
    }
    if stamp().saturating_sub(since) < PATIENCE.as_nanos() as u64 {
        return;
    }
    // Starved: wait until a writer's call ends (which resets the clock), none is left, or
    // `MOST_HELD` passed. The bound keeps every call going where the writer waits for a reader
    // that waits for the device, whose work waits for a call held here; the clock then starts
    // again, so such a writer costs the others at most `MOST_HELD` in each `PATIENCE` more.
    let start = Instant::now();
    while WRITERS.load(Ordering::Acquire) != 0 && PENDING_SINCE.load(Ordering::Acquire) == since {
        let waited = start.elapsed();
        if waited >= MOST_HELD {
            let _ =
                PENDING_SINCE.compare_exchange(since, stamp(), Ordering::AcqRel, Ordering::Relaxed);
            return;
        }
        if waited < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock;
    use std::sync::Arc;
    use std::sync::Mutex;

    /// The counts are the process's: one test at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// A thread inside an exclusive call until `end`.
    struct Writer {
        release: Arc<AtomicBool>,
        thread: std::thread::JoinHandle<()>,
    }

    impl Writer {
        fn inside() -> Writer {
            let inside = Arc::new(AtomicBool::new(false));
            let release = Arc::new(AtomicBool::new(false));
            let thread = {
                let (inside, release) = (inside.clone(), release.clone());
                std::thread::spawn(move || {
                    exclusive(|| {
                        inside.store(true, Ordering::SeqCst);
                        while !release.load(Ordering::SeqCst) {
                            std::thread::yield_now();
                        }
                    })
                })
            };
            while !inside.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            Writer { release, thread }
        }

        fn end(self) {
            self.release.store(true, Ordering::SeqCst);
            self.thread.join().unwrap();
        }
    }

    #[test]
    fn a_writers_clock_starts_at_the_first_look_and_restarts_when_it_ends() {
        let _serial = lock(&SERIAL);
        prioritise_driver_writers(true);
        let writer = Writer::inside();
        assert_eq!(PENDING_SINCE.load(Ordering::SeqCst), 0, "no look yet");
        // The first look starts the clock and goes on at once.
        let t = Instant::now();
        hold_back();
        assert!(t.elapsed() < MOST_HELD);
        assert_ne!(PENDING_SINCE.load(Ordering::SeqCst), 0, "the clock started");
        writer.end();
        assert_eq!(
            PENDING_SINCE.load(Ordering::SeqCst),
            0,
            "the clock restarts"
        );
        assert_eq!(WRITERS.load(Ordering::SeqCst), 0);
        let t = Instant::now();
        hold_back();
        assert!(t.elapsed() < MOST_HELD, "nothing pending, yet held");
    }

    #[test]
    fn a_call_is_held_back_for_a_bounded_time_however_long_the_writer_waits() {
        let _serial = lock(&SERIAL);
        prioritise_driver_writers(true);
        let writer = Writer::inside();
        hold_back();
        let since = PENDING_SINCE.load(Ordering::SeqCst);
        std::thread::sleep(PATIENCE * 2);
        // Held for MOST_HELD, then on, with the clock started again.
        let t = Instant::now();
        hold_back();
        let held = t.elapsed();
        assert!(held >= MOST_HELD, "held {held:?}");
        let again = PENDING_SINCE.load(Ordering::SeqCst);
        assert!(again > since, "the clock did not start again");
        writer.end();
    }

    #[test]
    fn the_first_writer_after_none_starts_a_clock_of_its_own() {
        let _serial = lock(&SERIAL);
        prioritise_driver_writers(true);
        // A look that raced the last writer's end left its clock behind.
        PENDING_SINCE.store(1, Ordering::SeqCst);
        let writer = Writer::inside();
        assert_eq!(
            PENDING_SINCE.load(Ordering::SeqCst),
            0,
            "an old clock survived"
        );
        let t = Instant::now();
        hold_back();
        assert!(
            t.elapsed() < MOST_HELD,
            "held back for a writer just announced"
        );
        writer.end();
    }

    #[test]
    fn with_the_priority_off_nothing_is_announced_or_held() {
        let _serial = lock(&SERIAL);
        prioritise_driver_writers(false);
        let seen = exclusive(|| WRITERS.load(Ordering::SeqCst));
        prioritise_driver_writers(true);
        assert_eq!(seen, 0, "a writer was announced with the priority off");
    }

    #[test]
    fn an_exclusive_call_that_panics_releases_the_others() {
        let _serial = lock(&SERIAL);
        prioritise_driver_writers(true);
        let r =
            std::panic::catch_unwind(|| exclusive(|| panic!("a driver call's wrapper panicked")));
        assert!(r.is_err());
        hold_back();
    }
}
