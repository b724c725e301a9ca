// mps-server/src/backend/cuda/exclusive.rs as the `mps` build of gate.sh's run (2026-12-07
// 08:13 UTC) had it: every other driver call held back at once while a capture's start or a
// graph's instantiation was pending. The tree's version waits 200 µs first and holds for 1 ms
// at most. Its callers (Context::bind, begin_capture, instantiate) were as in the tree.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static WRITERS: AtomicU32 = AtomicU32::new(0);

const SPIN: Duration = Duration::from_micros(20);

pub(super) fn exclusive<R>(call: impl FnOnce() -> R) -> R {
    struct Done;
    impl Drop for Done {
        fn drop(&mut self) {
            WRITERS.fetch_sub(1, Ordering::Release);
        }
    }
    WRITERS.fetch_add(1, Ordering::SeqCst);
    let _done = Done;
    call()
}

#[inline]
pub(super) fn hold_back() {
    if WRITERS.load(Ordering::Relaxed) != 0 {
        wait();
    }
}

#[cold]
fn wait() {
    let start = Instant::now();
    while WRITERS.load(Ordering::Acquire) != 0 {
        if start.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
