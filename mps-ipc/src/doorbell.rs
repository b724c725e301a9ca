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

    /// The futex word, for a waiter that sleeps on several bells at once ([`wait_any`]).
    pub fn word(&self) -> &'a AtomicU32 {
        self.word
    }

    /// The count of sleepers that a ringer reads to decide whether to wake anyone. A waiter
    /// that sleeps through [`wait_any`] raises it before it last looks at its condition and
    /// lowers it after; it is only a hint, so a peer that scribbles on it can only delay its
    /// own wake-ups or cause spurious ones.
    pub fn sleepers(&self) -> &'a AtomicU32 {
        self.sleepers
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

/// The most futex words [`wait_any`] sleeps on at once (the kernel's limit for `futex_waitv`).
pub const MAX_WAIT_ANY: usize = 128;

/// A yield that returns later than this gave the processor to another thread that was ready
/// to run; with nothing else to run, a yield returns within a microsecond or two.
const CONTENDED_YIELD: Duration = Duration::from_micros(20);

/// Yields the processor; whether another thread had it meanwhile (the yield came back late).
/// A waiter that sees so stops yielding and sleeps: every CPU is wanted, and each further
/// look would cost a thread with work a context switch.
pub fn yield_contended() -> bool {
    let before = Instant::now();
    std::thread::yield_now();
    before.elapsed() > CONTENDED_YIELD
}

/// Sleeps until one of `words` no longer holds the value paired with it, a wake-up arrives on
/// one of them, or `timeout` passes; returns early (with no error) on a signal. The words may be
/// in shared memory or private memory; ringers must wake them without `FUTEX_PRIVATE_FLAG` (as
/// [`Doorbell::ring`] does). Needs Linux 5.16 or later (`futex_waitv`); at most
/// [`MAX_WAIT_ANY`] words. [`Wake::Ready`] means a word moved or was rung (or a signal came):
/// the caller looks at its conditions again either way.
pub fn wait_any(words: &[(&AtomicU32, u32)], timeout: Duration) -> std::io::Result<Wake> {
    if words.len() > MAX_WAIT_ANY {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "asked to sleep on {} futex words at once, at most {MAX_WAIT_ANY} can be",
                words.len()
            ),
        ));
    }
    let mut waits = [futex::Wait::new(); MAX_WAIT_ANY];
    for (w, (word, seen)) in waits.iter_mut().zip(words) {
        w.val = u64::from(*seen);
        w.uaddr = futex::WaitPtr::new(word.as_ptr().cast());
        w.flags = futex::WaitFlags::SIZE_U32;
    }
    // futex_waitv takes an absolute deadline on the clock it is given.
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let end = Duration::new(now.tv_sec as u64, now.tv_nsec as u32).saturating_add(timeout);
    let deadline = futex::Timespec {
        tv_sec: end.as_secs() as i64,
        tv_nsec: end.subsec_nanos() as i64,
    };
    match futex::waitv(
        &waits[..words.len()],
        futex::WaitvFlags::empty(),
        Some(&deadline),
        rustix::thread::ClockId::Monotonic,
    ) {
        // A word that moved before the sleep (EAGAIN) is as good as a wake-up.
        Ok(_) => Ok(Wake::Ready),
        Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => Ok(Wake::Ready),
        Err(e) if e == rustix::io::Errno::TIMEDOUT => Ok(Wake::TimedOut),
        Err(e) => Err(e.into()),
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
    fn a_sleeper_on_many_bells_is_woken_by_any_of_them() {
        let words: Arc<Vec<(AtomicU32, AtomicU32)>> = Arc::new(
            (0..5)
                .map(|_| (AtomicU32::new(0), AtomicU32::new(0)))
                .collect(),
        );
        let w2 = words.clone();
        let t = std::thread::spawn(move || {
            let seen: Vec<_> = w2
                .iter()
                .map(|(w, _)| (w, w.load(Ordering::SeqCst)))
                .collect();
            for (_, s) in w2.iter() {
                s.fetch_add(1, Ordering::SeqCst);
            }
            wait_any(&seen, Duration::from_secs(30)).unwrap()
        });
        // Ringing before the sleeper reads the word would also end its wait (the word moved),
        // so whichever comes first, the wait ends long before its timeout.
        while words[3].1.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        Doorbell::new(&words[3].0, &words[3].1).ring();
        assert_eq!(t.join().unwrap(), Wake::Ready);
    }

    #[test]
    fn a_sleeper_on_many_bells_times_out_and_refuses_too_many() {
        let w = AtomicU32::new(7);
        let r = wait_any(&[(&w, 7)], Duration::from_millis(20)).unwrap();
        assert_eq!(r, Wake::TimedOut);
        // A word that already moved ends the wait at once.
        let r = wait_any(&[(&w, 6)], Duration::from_secs(30)).unwrap();
        assert_eq!(r, Wake::Ready);
        let many = vec![(&w, 7); MAX_WAIT_ANY + 1];
        let e = wait_any(&many, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("129 futex words"), "{e}");
    }

    #[test]
    fn a_wait_without_a_ring_times_out() {
        let (w, s) = (AtomicU32::new(0), AtomicU32::new(0));
        let r = Doorbell::new(&w, &s).wait(Duration::ZERO, Duration::from_millis(20), || false);
        assert_eq!(r, Wake::TimedOut);
    }
}
