//! Whether the machine's CPUs are contended: threads that could run are waiting for a CPU.
//!
//! Launch batching asks this before it holds a run that its client posts slowly (see
//! `session/core/batch.rs`, "Holding must pay"): while CPUs are free, submitting each command
//! as it comes lets the device run it at once, and holding only delays the run; while threads
//! wait for CPUs, the server's time per command is taken from the clients, and one graph launch
//! per run gives it back.
//!
//! A thread samples the kernel's pressure stall information (`/proc/pressure/cpu`, the time at
//! least one runnable thread waited for a CPU) every 25 ms (`PERIOD`); where the kernel has
//! none, the threads running or runnable (`/proc/loadavg`) against the CPUs this process may
//! use. The answer covers the last 100 ms (`WINDOW` periods), so a moment's burst does not flip
//! it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the gauge samples.
const PERIOD: Duration = Duration::from_millis(25);
/// Samples the answer spans.
const WINDOW: usize = 4;
/// The share of time in which a runnable thread waited for a CPU above which CPUs count as
/// contended.
const CONTENDED_SHARE: f64 = 0.10;

/// Where the gauge reads the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// `/proc/pressure/cpu`'s `some` total: microseconds in which a runnable thread waited.
    Pressure,
    /// `/proc/loadavg`'s running and runnable threads, against the CPUs this process may use.
    LoadAvg,
}

/// The gauge's answer, once its thread runs; `None` where neither source can be read.
static CONTENDED: OnceLock<Option<AtomicBool>> = OnceLock::new();

/// Whether the machine's CPUs were contended over the last `WINDOW` samples. The first call
/// starts the sampling thread and answers `true` (the answer that holds runs, as batching did
/// without pacing) until the first window is full; where the load cannot be read, or the
/// thread cannot start, the answer is always `true`.
pub(crate) fn contended() -> bool {
    CONTENDED
        .get_or_init(start)
        .as_ref()
        .is_none_or(|c| c.load(Ordering::Relaxed))
}

fn start() -> Option<AtomicBool> {
    let source = [Source::Pressure, Source::LoadAvg]
        .into_iter()
        .find(|s| read(*s).is_some());
    let Some(source) = source else {
        tracing::info!(
            "neither /proc/pressure/cpu nor /proc/loadavg can be read: launch batching holds \
             runs whatever the CPUs' load"
        );
        return None;
    };
    let spawned = std::thread::Builder::new()
        .name("cpu-pressure".into())
        .spawn(move || sample(source));
    match spawned {
        Ok(_) => Some(AtomicBool::new(true)),
        Err(e) => {
            tracing::warn!(
                "cannot start the CPU-pressure thread ({e}): launch batching holds runs \
                 whatever the CPUs' load"
            );
            None
        }
    }
}

/// One reading: the pressure total in microseconds, or the running threads beyond the CPUs
/// this process may use.
fn read(source: Source) -> Option<f64> {
    match source {
        Source::Pressure => {
            let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
            pressure_total(&text).map(|t| t as f64)
        }
        Source::LoadAvg => {
            let text = std::fs::read_to_string("/proc/loadavg").ok()?;
            let running = loadavg_running(&text)?;
            // This thread is one of them.
            Some(running.saturating_sub(1) as f64 - usable_cpus() as f64)
        }
    }
}

/// The `total=` of the `some` line of a pressure file.
fn pressure_total(text: &str) -> Option<u64> {
    let some = text.lines().find(|l| l.starts_with("some "))?;
    some.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// The running and runnable threads of a `/proc/loadavg` ("0.00 0.01 0.05 3/110 3527").
fn loadavg_running(text: &str) -> Option<u64> {
    text.split_whitespace()
        .nth(3)?
        .split_once('/')?
        .0
        .parse()
        .ok()
}

fn usable_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether a window of readings shows contended CPUs: the share of the window's time in which a
/// thread waited, or the mean of the readings of runnable threads beyond the CPUs.
fn judge(source: Source, window: &[(Instant, f64)]) -> bool {
    let (Some(first), Some(last)) = (window.first(), window.last()) else {
        return true;
    };
    match source {
        Source::Pressure => {
            let waited_us = last.1 - first.1;
            let span_us = last.0.duration_since(first.0).as_secs_f64() * 1e6;
            span_us > 0.0 && waited_us / span_us > CONTENDED_SHARE
        }
        Source::LoadAvg => window.iter().map(|r| r.1).sum::<f64>() / window.len() as f64 > 0.0,
    }
}

fn sample(source: Source) {
    // A pressure total is judged by its growth over `WINDOW` periods, which takes a reading
    // more than the mean of `WINDOW` runnable counts.
    let readings = match source {
        Source::Pressure => WINDOW + 1,
        Source::LoadAvg => WINDOW,
    };
    let mut window: std::collections::VecDeque<(Instant, f64)> =
        std::collections::VecDeque::with_capacity(readings + 1);
    let mut was = true;
    loop {
        match read(source) {
            Some(r) => window.push_back((Instant::now(), r)),
            None => window.clear(),
        }
        while window.len() > readings {
            window.pop_front();
        }
        if window.len() == readings {
            let now = judge(source, window.make_contiguous());
            if now != was {
                tracing::debug!("CPUs {}", if now { "contended" } else { "free" });
                was = now;
            }
            if let Some(Some(c)) = CONTENDED.get() {
                c.store(now, Ordering::Relaxed);
            }
        }
        std::thread::sleep(PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_total_is_read_from_the_some_line() {
        let text = "some avg10=1.50 avg60=0.20 avg300=0.00 total=343613928\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n";
        assert_eq!(pressure_total(text), Some(343_613_928));
        assert_eq!(pressure_total("full total=3\n"), None);
        assert_eq!(pressure_total("some avg10=0.00\n"), None);
    }

    #[test]
    fn loadavg_running_is_the_fourth_field() {
        assert_eq!(loadavg_running("0.00 0.01 0.05 3/110 3527\n"), Some(3));
        assert_eq!(loadavg_running("0.00 0.01 0.05\n"), None);
    }

    #[test]
    fn a_window_is_contended_when_threads_waited_a_tenth_of_it() {
        let t0 = Instant::now();
        let at = |ms: u64, us: f64| (t0 + Duration::from_millis(ms), us);
        // 100 ms of window: 5 ms of waiting is free, 20 ms contended.
        assert!(!judge(Source::Pressure, &[at(0, 0.0), at(100, 5_000.0)]));
        assert!(judge(Source::Pressure, &[at(0, 0.0), at(100, 20_000.0)]));
        // More runnable threads than CPUs on average.
        assert!(!judge(Source::LoadAvg, &[at(0, -3.0), at(25, 1.0)]));
        assert!(judge(Source::LoadAvg, &[at(0, 2.0), at(25, 1.0)]));
    }
}
