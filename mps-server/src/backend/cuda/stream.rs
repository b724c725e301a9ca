//! Client streams: each a CUDA stream of its own (non-blocking) in the client's current SM
//! partition, at a device priority set by the priority it asked for and its client's level;
//! replaced by a new one when the placement or the client's level changes.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUstream};
use mps_core::Result;
use mps_core::protocol::PRIORITY_BELOW_NORMAL;

use super::CudaBackend;
use super::partition::Partition;
use crate::backend::{ClientContext, Publish, SmSlot};
use mps_driver::{Call, check_on, released};

/// A stream: a CUDA stream in the client's current partition (or the primary context).
#[derive(Debug)]
pub struct CudaStream {
    pub(super) raw: Cell<CUstream>,
    /// The CUDA priority the client asked for.
    asked: i32,
    /// The device priority `raw` was made with ([`device_priority`]).
    priority: Cell<i32>,
    /// The client's level, which `priority` follows.
    level: Arc<AtomicU32>,
    pub(super) client: u32,
    busy: Arc<AtomicU64>,
    /// Submissions so far, for the busy sampler (which asks only streams given work since it
    /// last saw them idle).
    pub(super) submitted: Arc<AtomicU64>,
    sm: Arc<SmSlot>,
    /// The placement generation `raw` was made for.
    seen: Cell<u64>,
    /// Keeps the green context alive while `raw` lives in it.
    pub(super) partition: RefCell<Option<Arc<Partition>>>,
    /// The host and device addresses of the progress word this stream's marked commands last
    /// published to (0, 0: none yet), so that a marked command looks nothing up.
    progress: Cell<(usize, u64)>,
    /// While the stream captures: what it has recorded (see `graph`).
    pub(super) capture: RefCell<Option<super::graph::Captured>>,
    /// Set while the stream captures, so that the busy sampler does not query it (a query of a
    /// capturing stream invalidates the capture).
    pub(super) capturing: Arc<AtomicBool>,
}

// SAFETY: CUDA driver handles may be used from any thread once the context is current there
// (every entry point binds it first); the session moves a stream between threads but uses it
// from one at a time (it is not Sync).
unsafe impl Send for CudaStream {}

impl CudaBackend {
    /// A stream of `client` that asked for CUDA priority `asked`, in the client's current
    /// partition.
    pub(super) fn new_stream(&self, asked: i32, client: &ClientContext) -> Result<CudaStream> {
        // The generation and the level are read before the partition and the priority are
        // made, so a change in between is followed at the first submission.
        let seen = client.sm.generation.load(Ordering::Acquire);
        let priority = device_priority(
            asked,
            client.priority.load(Ordering::Relaxed),
            self.priorities,
        );
        let partition = self.partitions.of(client.id);
        let submitted = Arc::new(AtomicU64::new(0));
        let capturing = Arc::new(AtomicBool::new(false));
        let raw = self.raw_stream(
            partition.as_deref(),
            priority,
            &client.busy_ns,
            &submitted,
            &capturing,
        )?;
        self.ctx.watch(&client.faults);
        Ok(CudaStream {
            raw: Cell::new(raw),
            asked,
            priority: Cell::new(priority),
            level: client.priority.clone(),
            client: client.id,
            busy: client.busy_ns.clone(),
            submitted,
            sm: client.sm.clone(),
            seen: Cell::new(seen),
            partition: RefCell::new(partition),
            progress: Cell::new((0, 0)),
            capture: RefCell::new(None),
            capturing,
        })
    }

    /// The device address of the progress word `publish` raises. The registrations, shared by
    /// every session, are looked up once per stream: a stream publishes to one slot of its
    /// client's server segment, which stays registered (at the same address) until the session
    /// ends, after its streams.
    pub(super) fn progress_address(&self, stream: &CudaStream, publish: &Publish) -> Result<u64> {
        let word = publish.channel.stream_done(publish.slot) as *const AtomicU64 as usize;
        let (host, dev) = stream.progress.get();
        if host == word {
            return Ok(dev);
        }
        let dev = self.host.device_address(word as *const u8)?;
        stream.progress.set((word, dev));
        Ok(dev)
    }

    /// Creates a raw stream in `partition` (None: the primary context) and lists it for busy
    /// sampling.
    fn raw_stream(
        &self,
        partition: Option<&Partition>,
        priority: i32,
        busy: &Arc<AtomicU64>,
        submitted: &Arc<AtomicU64>,
        capturing: &Arc<AtomicBool>,
    ) -> Result<CUstream> {
        let flags = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: creates a stream in the bound primary context or in a live green context.
        let r = unsafe {
            match partition {
                Some(p) => sys::cuGreenCtxStreamCreate(&mut s, p.green, flags, priority),
                None => sys::cuStreamCreateWithPriority(&mut s, flags, priority),
            }
        };
        self.ctx
            .check(check_on(r, "creating a stream", || match partition {
                Some(_) => format!("priority {priority}, in an SM partition"),
                None => format!("priority {priority}"),
            }))?;
        self.live.add(s, busy, submitted, capturing);
        Ok(s)
    }

    /// Waits for a raw stream's work (queued work cannot be cancelled on a GPU) and destroys
    /// it.
    pub(super) fn retire(&self, raw: CUstream) {
        self.live.remove(raw);
        // SAFETY: a live stream, destroyed once, after its work is done.
        unsafe {
            released(result::stream::synchronize(raw).call("cuStreamSynchronize"));
            released(result::stream::destroy(raw).call("cuStreamDestroy"));
        }
    }

    /// Replaces a stream by one in its client's current partition and at its current device
    /// priority if either changed since the stream was made (a CUDA stream's priority is
    /// fixed): the old stream's work completes before any later work starts on the new one, so
    /// stream order holds.
    pub(super) fn follow_client(&self, stream: &CudaStream) -> Result<()> {
        let generation = stream.sm.generation.load(Ordering::Acquire);
        let priority = device_priority(
            stream.asked,
            stream.level.load(Ordering::Relaxed),
            self.priorities,
        );
        if generation == stream.seen.get() && priority == stream.priority.get() {
            return Ok(());
        }
        let next = self.partitions.of(stream.client);
        let same = match (&next, &*stream.partition.borrow()) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if !same || priority != stream.priority.get() {
            let raw = self.raw_stream(
                next.as_deref(),
                priority,
                &stream.busy,
                &stream.submitted,
                &stream.capturing,
            )?;
            self.retire(stream.raw.replace(raw));
            *stream.partition.borrow_mut() = next;
            stream.priority.set(priority);
        }
        stream.seen.set(generation);
        Ok(())
    }
}

/// The device priority of a stream whose client asked for CUDA priority `asked` (lower is
/// more urgent, `least` >= `greatest` the device's range) at client level `level`. A
/// below-normal client's streams run at the least urgent priority; a normal client's one step
/// more urgent than asked where the range allows, so that a normal client's default streams
/// (CUDA's 0, itself the least urgent) go before every below-normal client's work when the
/// device has blocks of both to start. The two most urgent priorities of a normal client are
/// one on the device.
pub(super) fn device_priority(asked: i32, level: u32, (least, greatest): (i32, i32)) -> i32 {
    if level >= PRIORITY_BELOW_NORMAL {
        return least;
    }
    asked.clamp(greatest, least).saturating_sub(1).max(greatest)
}

#[cfg(test)]
mod tests {
    use super::device_priority;
    use mps_core::protocol::{PRIORITY_BELOW_NORMAL, PRIORITY_NORMAL};

    /// An H200's range: 0 the least urgent (and CUDA's default), -5 the most.
    const RANGE: (i32, i32) = (0, -5);

    #[test]
    fn normal_clients_default_streams_go_before_below_normal_clients_streams() {
        let normal = |asked| device_priority(asked, PRIORITY_NORMAL, RANGE);
        let below = |asked| device_priority(asked, PRIORITY_BELOW_NORMAL, RANGE);
        assert_eq!(normal(0), -1);
        assert_eq!(below(0), 0);
        // Whatever a below-normal client asks for, a normal client's default is more urgent.
        for asked in [-100, -5, -1, 0, 7] {
            assert_eq!(below(asked), 0, "asked {asked}");
        }
        // A normal client keeps its order of priorities but for the two most urgent.
        assert_eq!(
            [0, -1, -2, -3, -4, -5].map(normal),
            [-1, -2, -3, -4, -5, -5]
        );
        // Out of range, clamped as CUDA clamps.
        assert_eq!(normal(9), -1);
        assert_eq!(normal(-9), -5);
    }

    #[test]
    fn a_device_without_priorities_gives_every_stream_the_one_it_has() {
        for level in [PRIORITY_NORMAL, PRIORITY_BELOW_NORMAL] {
            for asked in [-3, 0, 3] {
                assert_eq!(device_priority(asked, level, (0, 0)), 0);
            }
        }
    }
}
