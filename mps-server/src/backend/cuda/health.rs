//! The health thread: it notices a dead context at once, and samples GPU busy time.
//!
//! A fault is reported by the next driver call of any thread, so a thread of our own queries a
//! stream of ours every few milliseconds and tells every client as soon as the context is gone
//! (clients waiting on GPU-written progress would otherwise wait forever).
//!
//! Busy time is sampled, not measured: every few milliseconds the thread asks each client stream
//! that was given work since it was last seen idle whether it has work pending, and credits the
//! interval to the clients whose streams do. (Timing every command with events would cost two
//! driver calls per launch.) An idle stream is not asked, so idle clients cost nothing. A
//! capturing stream is never asked either: `cuStreamQuery` on it would invalidate its client's
//! capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` at `cuStreamEndCapture`), whatever the
//! capture mode.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUresult, CUstream};
use mps_core::{Error, Result};

use super::context::Context;
use crate::lock;
use mps_driver::check_on;

/// How often the health thread samples which streams have work pending.
const BUSY_SAMPLE: Duration = Duration::from_millis(5);
/// How often it looks at the context.
const POLL: Duration = Duration::from_millis(2);

/// A stream sampled for busy time, and the client counter it credits.
struct Live {
    raw: CUstream,
    busy: Arc<AtomicU64>,
    /// Submissions to the stream so far (raised by the backend on each).
    submitted: Arc<AtomicU64>,
    /// Set while the stream captures a graph: it is not queried then.
    capturing: Arc<AtomicBool>,
    /// Held while the sampler queries the stream, while a capture of it begins and as it leaves
    /// the list, so that no query falls between the capture's flag and its start or after the
    /// stream is destroyed. It is the stream's own: a query waiting in a busy driver holds up
    /// no other stream's capture or destruction.
    gate: Mutex<Gate>,
}

struct Gate {
    /// `submitted` as it was when a query last found the stream idle.
    idle_at: u64,
    /// The stream left the list: it is never queried again.
    gone: bool,
}

/// Every client stream, for busy-time sampling. A stream leaves the list before it is
/// destroyed; the list's own lock is held only to add, find or remove an entry, or to copy the
/// list, never across a driver call.
#[derive(Default)]
pub(super) struct LiveStreams(Mutex<Vec<Arc<Live>>>);

// SAFETY: a stream handle may be used from any thread; an entry's changing state is atomic or
// under its lock.
unsafe impl Send for Live {}
// SAFETY: as above.
unsafe impl Sync for Live {}

impl LiveStreams {
    fn find(&self, raw: CUstream) -> Option<Arc<Live>> {
        lock(&self.0).iter().find(|l| l.raw == raw).cloned()
    }

    /// Samples `raw` from now on, crediting `busy`, whenever `submitted` has risen since the
    /// stream was last seen idle, and except while `capturing` is set.
    pub(super) fn add(
        &self,
        raw: CUstream,
        busy: &Arc<AtomicU64>,
        submitted: &Arc<AtomicU64>,
        capturing: &Arc<AtomicBool>,
    ) {
        let idle_at = submitted.load(Ordering::Acquire);
        lock(&self.0).push(Arc::new(Live {
            raw,
            busy: busy.clone(),
            submitted: submitted.clone(),
            capturing: capturing.clone(),
            gate: Mutex::new(Gate {
                idle_at,
                gone: false,
            }),
        }));
    }

    /// Stops sampling `raw`; call before destroying it. Returns once no query of it is under
    /// way.
    pub(super) fn remove(&self, raw: CUstream) {
        let left = {
            let mut live = lock(&self.0);
            let at = live.iter().position(|l| l.raw == raw);
            at.map(|i| live.swap_remove(i))
        };
        if let Some(l) = left {
            lock(&l.gate).gone = true;
        }
    }

    /// Runs `begin` (which starts a capture of stream `raw`) with `capturing` set, under the
    /// stream's own lock that its queries are made under, so that no query of the stream can
    /// fall between the sampler's look at the flag and the capture's start. The caller clears
    /// the flag once the capture ended.
    pub(super) fn begin_capture<R>(
        &self,
        raw: CUstream,
        capturing: &AtomicBool,
        begin: impl FnOnce() -> R,
    ) -> R {
        let entry = self.find(raw);
        let _gate = entry.as_ref().map(|l| lock(&l.gate));
        capturing.store(true, Ordering::Release);
        begin()
    }

    /// Credits `interval` to every client with work pending on one of its streams, asking each
    /// stream with `query` (`cuStreamQuery`).
    fn sample(&self, interval: Duration, mut query: impl FnMut(CUstream) -> CUresult) {
        let live = lock(&self.0).clone();
        let mut credited: Vec<*const AtomicU64> = Vec::new();
        for s in &live {
            // Read before the query: a submission after it is seen at the next sample.
            let submitted = s.submitted.load(Ordering::Acquire);
            let mut gate = lock(&s.gate);
            if gate.gone || submitted == gate.idle_at || s.capturing.load(Ordering::Acquire) {
                continue;
            }
            let r = query(s.raw);
            if r == CUresult::CUDA_SUCCESS {
                gate.idle_at = submitted;
            }
            drop(gate);
            // Only "work pending" counts; a failure is the context's, which the thread's own
            // stream reports.
            let ptr = Arc::as_ptr(&s.busy);
            if r == CUresult::CUDA_ERROR_NOT_READY && !credited.contains(&ptr) {
                s.busy
                    .fetch_add(interval.as_nanos() as u64, Ordering::Relaxed);
                credited.push(ptr);
            }
        }
    }
}

/// The health thread's own stream.
struct HealthStream(CUstream);

// SAFETY: a stream handle may be used from any thread.
unsafe impl Send for HealthStream {}

/// Starts the health thread, which runs until the context dies.
pub(super) fn spawn(ctx: Arc<Context>, live: Arc<LiveStreams>) -> Result<()> {
    let mut stream: CUstream = std::ptr::null_mut();
    let flags = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: creates a stream in the current (bound) context.
    let r = unsafe { sys::cuStreamCreate(&mut stream, flags) };
    ctx.check(check_on(r, "cuStreamCreate", || {
        "the health thread's stream".into()
    }))?;
    let stream = HealthStream(stream);
    std::thread::Builder::new()
        .name("cuda-health".into())
        .spawn(move || {
            // Capture the whole stream (Send), not its raw field.
            let stream = stream;
            ctx.bind();
            let mut sampled = Instant::now();
            loop {
                std::thread::sleep(POLL);
                let now = Instant::now();
                if now - sampled >= BUSY_SAMPLE {
                    // SAFETY: the sampler asks only streams in its list, which leave it (under
                    // the lock it holds while asking) before they are destroyed.
                    live.sample(now - sampled, |raw| unsafe { sys::cuStreamQuery(raw) });
                    sampled = now;
                }
                // SAFETY: queries our own stream.
                let r = unsafe { sys::cuStreamQuery(stream.0) };
                if r == CUresult::CUDA_ERROR_NOT_READY {
                    continue;
                }
                let failed = check_on(r, "cuStreamQuery", || {
                    "the health thread's idle stream, which sees any kernel's fault".into()
                });
                // Only a failure that ends the context matters here: it is told to every client.
                if let Err(e) = failed
                    && e.is_sticky()
                {
                    ctx.fail(e);
                    return;
                }
            }
        })
        .map(drop)
        .map_err(|e| Error::internal(format!("cannot start the health thread: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(n: usize) -> CUstream {
        std::ptr::without_provenance_mut(n)
    }

    #[test]
    fn a_capturing_stream_is_never_queried_and_others_are_credited() {
        let live = LiveStreams::default();
        let (busy_a, busy_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (sub_a, sub_b) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (cap_a, cap_b) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        live.add(raw(1), &busy_a, &sub_a, &cap_a);
        live.add(raw(2), &busy_b, &sub_b, &cap_b);
        sub_a.fetch_add(1, Ordering::Release);
        sub_b.fetch_add(1, Ordering::Release);
        live.begin_capture(raw(1), &cap_a, || ());
        let mut asked = Vec::new();
        let tick = Duration::from_millis(5);
        live.sample(tick, |s| {
            asked.push(s as usize);
            CUresult::CUDA_ERROR_NOT_READY
        });
        assert_eq!(asked, [2], "the capturing stream was queried");
        assert_eq!(busy_a.load(Ordering::Relaxed), 0);
        assert_eq!(busy_b.load(Ordering::Relaxed), tick.as_nanos() as u64);
        // Once the capture ends, the stream is asked again.
        cap_a.store(false, Ordering::Release);
        asked.clear();
        live.sample(tick, |s| {
            asked.push(s as usize);
            CUresult::CUDA_SUCCESS
        });
        assert_eq!(asked, [1, 2]);
        // Idle streams (nothing submitted since) are not asked at all.
        asked.clear();
        live.sample(tick, |s| {
            asked.push(s as usize);
            CUresult::CUDA_SUCCESS
        });
        assert!(asked.is_empty(), "{asked:?}");
    }

    #[test]
    fn a_query_waiting_in_the_driver_holds_up_no_other_streams_capture_or_destruction() {
        let live = Arc::new(LiveStreams::default());
        let busy = Arc::new(AtomicU64::new(0));
        let caps: Vec<_> = (0..3).map(|_| Arc::new(AtomicBool::new(false))).collect();
        for (i, cap) in caps.iter().enumerate() {
            let submitted = Arc::new(AtomicU64::new(0));
            live.add(raw(i + 1), &busy, &submitted, cap);
            submitted.fetch_add(1, Ordering::Release);
        }
        let (entered, in_query) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let sampler = {
            let live = live.clone();
            std::thread::spawn(move || {
                let mut asked = Vec::new();
                live.sample(Duration::from_millis(5), |s| {
                    asked.push(s as usize);
                    if s == raw(1) {
                        entered.send(()).unwrap();
                        released.recv().unwrap();
                    }
                    CUresult::CUDA_ERROR_NOT_READY
                });
                asked
            })
        };
        in_query.recv().unwrap();
        // While stream 1's query waits, stream 2 begins a capture and stream 3 leaves.
        let (done, finished) = std::sync::mpsc::channel();
        {
            let (live, cap) = (live.clone(), caps[1].clone());
            std::thread::spawn(move || {
                live.begin_capture(raw(2), &cap, || ());
                live.remove(raw(3));
                done.send(()).unwrap();
            });
        }
        let others = finished.recv_timeout(Duration::from_secs(10));
        release.send(()).unwrap();
        let asked = sampler.join().unwrap();
        assert!(
            others.is_ok(),
            "another stream's query held up a capture and a removal"
        );
        assert_eq!(asked, [1], "a capturing or removed stream was queried");
    }
}
