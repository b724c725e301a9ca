//! How the kernel schedules the threads that serve clients: a nice value for the client's
//! priority, and optionally a short scheduler slice.
//!
//! When the clients' own processes fill every CPU, a session thread that a client's doorbell
//! wakes waits for a CPU like any other thread: under Linux's EEVDF scheduler (6.6 on) that can
//! be the rest of the running thread's slice, milliseconds, while the client's commands and the
//! GPU wait. A thread that asks for a shorter slice (`sched_attr::sched_runtime`, honoured for
//! normal threads from Linux 6.12) gets an earlier deadline, so a wake-up preempts the thread
//! it lands on; it gets no larger share of the CPU by it. The request needs no privilege; an
//! older kernel ignores it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The slice session threads ask for, in nanoseconds (0: the kernel's default).
static SLICE_NS: AtomicU64 = AtomicU64::new(0);

/// The kernel's bounds on a requested slice (0.1 ms to 100 ms); a request outside them is
/// clamped by the kernel, so these only keep what the log says honest.
const SLICE_BOUNDS_NS: (u64, u64) = (100_000, 100_000_000);

/// Sets the slice that session threads started or re-prioritised from now on ask for (`None`
/// or zero: the kernel's default).
pub(crate) fn set_session_slice(slice: Option<Duration>) {
    SLICE_NS.store(requested_ns(slice), Ordering::Relaxed);
}

/// The slice to ask for, in nanoseconds, within the kernel's bounds (0: none).
fn requested_ns(slice: Option<Duration>) -> u64 {
    match slice.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)) {
        0 => 0,
        ns => ns.clamp(SLICE_BOUNDS_NS.0, SLICE_BOUNDS_NS.1),
    }
}

/// Gives the calling thread the CPU priority of a client priority (a below-normal client's
/// commands are taken after normal clients' when the server's CPUs are busy), and the session
/// slice if one is set.
pub(crate) fn set_thread_nice(below_normal: bool) {
    let nice = if below_normal { 10 } else { 0 };
    let slice = SLICE_NS.load(Ordering::Relaxed);
    if slice > 0 {
        match set_attr(nice, slice) {
            Ok(()) => return,
            Err(e) => tracing::debug!("sched_setattr(nice {nice}, slice {slice} ns) failed: {e}"),
        }
    }
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority only reads its arguments; on Linux PRIO_PROCESS with a thread id
    // sets that thread's nice value. Lowering priority needs no privilege; a failure leaves the
    // thread as it was, which is only a missed preference (raising it back to 0 needs
    // CAP_SYS_NICE, which is why threads of the two priorities are kept apart).
    let r = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid as u32, nice) };
    if r != 0 {
        tracing::debug!("setpriority({nice}) failed");
    }
}

/// `struct sched_attr` as of Linux 3.14 (`SCHED_ATTR_SIZE_VER0`, 48 bytes): the fields a
/// normal thread's nice value and slice need.
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// Makes the calling thread a normal (`SCHED_OTHER`) thread of nice value `nice` asking for
/// slices of `slice_ns`.
fn set_attr(nice: i32, slice_ns: u64) -> std::io::Result<()> {
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: nix::libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: slice_ns,
        deadline: 0,
        period: 0,
    };
    // SAFETY: sched_setattr reads `size` bytes of the attribute, which is a live, initialised
    // struct of exactly that size; pid 0 names the calling thread; flags 0.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_sched_setattr,
            0,
            &attr as *const SchedAttr,
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice the kernel holds for the calling thread, if sched_getattr answers.
    fn slice_now() -> Option<(i32, u64)> {
        let mut attr = SchedAttr {
            size: 0,
            policy: 0,
            flags: 0,
            nice: 0,
            priority: 0,
            runtime: 0,
            deadline: 0,
            period: 0,
        };
        // SAFETY: sched_getattr writes at most `size` (its third argument) bytes into the
        // struct, which is exactly that large; pid 0 is the calling thread.
        let r = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_sched_getattr,
                0,
                &mut attr as *mut SchedAttr,
                std::mem::size_of::<SchedAttr>() as u32,
                0,
            )
        };
        (r == 0).then_some((attr.nice, attr.runtime))
    }

    #[test]
    fn a_thread_asks_for_a_slice_and_keeps_its_nice_value() {
        // A thread of its own: the test harness's threads are left as they were.
        std::thread::spawn(|| {
            if let Err(e) = set_attr(10, 200_000) {
                eprintln!("sched_setattr is refused here ({e}); nothing to check");
                return;
            }
            let Some((nice, runtime)) = slice_now() else {
                eprintln!("sched_getattr is refused here; the slice cannot be read back");
                return;
            };
            assert_eq!(nice, 10);
            // From Linux 6.12 the slice asked for is reported back; before, a normal thread
            // keeps none.
            let release = nix::sys::utsname::uname().unwrap();
            let release = release.release().to_string_lossy().into_owned();
            let mut v = release
                .split(['.', '-'])
                .map(|p| p.parse::<u32>().unwrap_or(0));
            let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
            if (major, minor) >= (6, 12) {
                assert_eq!(runtime, 200_000, "Linux {release}");
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_slice_is_held_within_the_kernels_bounds() {
        assert_eq!(
            requested_ns(Some(Duration::from_micros(1))),
            SLICE_BOUNDS_NS.0
        );
        assert_eq!(requested_ns(Some(Duration::from_micros(300))), 300_000);
        assert_eq!(
            requested_ns(Some(Duration::from_secs(1))),
            SLICE_BOUNDS_NS.1
        );
        assert_eq!(requested_ns(Some(Duration::ZERO)), 0);
        assert_eq!(requested_ns(None), 0);
    }
}
