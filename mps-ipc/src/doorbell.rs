//! A doorbell between processes: a futex word in shared memory that the ringer bumps, and a
//! count of sleepers so that the ringer makes the wake-up system call only when someone sleeps.
//!
//! Waiting spins for a short while first: a peer that answers within microseconds (a server
//! thread on another core) is then seen without a system call on either side.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::thread::futex;

/// A doorbell over two words of shared memory.
#[derive(Clone, Copy, Debug)]
pub struct Doorbell<'a> {
    word: &'a AtomicU32,
    sleepers: &'a AtomicU32,
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// The condition became true.
    Ready,
    /// The timeout passed first.
    TimedOut,
}

impl<'a> Doorbell<'a> {
    /// The doorbell whose futex word is `word` and whose sleeper count is `sleepers`. The word
    /// may sit in memory the waiter maps read-only; the sleeper count must be writable by waiters
    /// and readable by ringers.
    pub fn new(word: &'a AtomicU32, sleepers: &'a AtomicU32) -> Self {
        Doorbell { word, sleepers }
    }

    /// The current value of the futex word: a waiter that reads it before checking its
    /// condition can wait for it to change (`wait(.., || bell.value() != seen)`).
    pub fn value(&self) -> u32 {
        self.word.load(Ordering::SeqCst)
    }

    /// Rings: call after publishing whatever the waiter's condition looks at.
    pub fn ring(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) != 0 {
            // A failed wake (EFAULT cannot happen on a mapped word) leaves the sleeper to its
            // timeout; nothing better can be done here.
            let _ = futex::wake(self.word, futex::Flags::empty(), u32::MAX);
        }
    }

    /// Waits until `ready()` holds: spins for `spin`, then sleeps on the futex, re-checking after
    /// every wake-up, until `timeout` has passed in all.
    pub fn wait(&self, spin: Duration, timeout: Duration, mut ready: impl FnMut() -> bool) -> Wake {
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            if ready() {
                return Wake::Ready;
            }
            i = i.wrapping_add(1);
            if i % 64 == 0 && start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        loop {
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return if ready() { Wake::Ready } else { Wake::TimedOut };
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let seen = self.word.load(Ordering::SeqCst);
            if ready() {
                self.sleepers.fetch_sub(1, Ordering::SeqCst);
                return Wake::Ready;
            }
            let left = timeout - elapsed;
            let ts = futex::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: left.subsec_nanos() as i64,
            };
            // EAGAIN (the word moved), EINTR and ETIMEDOUT all just mean: look again.
            let _ = futex::wait(self.word, futex::Flags::empty(), seen, Some(&ts));
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_sleeping_waiter_is_woken() {
        let words = Arc::new((AtomicU32::new(0), AtomicU32::new(0), AtomicBool::new(false)));
        let w2 = words.clone();
        let t = std::thread::spawn(move || {
            let bell = Doorbell::new(&w2.0, &w2.1);
            bell.wait(Duration::ZERO, Duration::from_secs(30), || {
                w2.2.load(Ordering::Acquire)
            })
        });
        // Wait until the waiter sleeps, so the wake path (not the spin) is what is tested.
        while words.1.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        words.2.store(true, Ordering::Release);
        Doorbell::new(&words.0, &words.1).ring();
        assert_eq!(t.join().unwrap(), Wake::Ready);
        assert_eq!(words.1.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_wait_without_a_ring_times_out() {
        let (w, s) = (AtomicU32::new(0), AtomicU32::new(0));
        let r = Doorbell::new(&w, &s).wait(Duration::ZERO, Duration::from_millis(20), || false);
        assert_eq!(r, Wake::TimedOut);
    }
}
