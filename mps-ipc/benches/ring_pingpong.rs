//! Cross-process ring benchmark: round-trip latency and one-way messages per second through the
//! shared-memory rings and doorbells of a client channel, against a Unix-socket ping-pong of the
//! same 64-byte messages, measured in the same run.
//!
//! `cargo bench -p mps-ipc --bench ring_pingpong` (set RING_BENCH_ITERS to change the count).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use mps_core::protocol::{Command, Completion};
use mps_ipc::channel::{Channel, Layout};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, fork};

const SPIN: Duration = Duration::from_micros(50);
const NAP: Duration = Duration::from_secs(5);

fn iters() -> usize {
    std::env::var("RING_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000)
}

/// Runs `child` in a forked process (which exits when it returns) and `parent` here.
fn with_child<T>(child: impl FnOnce(), parent: impl FnOnce() -> T) -> T {
    // SAFETY: the benchmark is single-threaded when it forks, so the child may run arbitrary
    // code; it leaves through _exit without running the parent's destructors.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            child();
            // SAFETY: _exit ends the child at once, as a forked child should.
            unsafe { nix::libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            let r = parent();
            waitpid(child, None).expect("waitpid");
            r
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

struct Figures {
    median: Duration,
    p99: Duration,
    per_sec: f64,
}

fn ring_echo(ch: &Channel, n: usize) {
    let mut commands = ch.submit_consumer();
    let mut completions = ch.complete_producer();
    for _ in 0..n {
        ch.submit_bell()
            .wait(SPIN, NAP, || commands.available() != Ok(0));
        let cmd = commands.peek(0);
        commands.advance(1);
        let reply = Completion::reply(cmd.seq, [0; 4]);
        while !completions.push(&[reply]).unwrap() {}
        ch.progress_bell().ring();
    }
}

fn ring_rtt(n: usize) -> (Duration, Duration) {
    let ch = Channel::create(Layout::default()).unwrap();
    with_child(
        || ring_echo(&ch, n),
        || {
            let mut commands = ch.submit_producer();
            let mut completions = ch.complete_consumer();
            let mut samples = Vec::with_capacity(n);
            for i in 0..n {
                let t = Instant::now();
                let cmd = Command {
                    seq: i as u64,
                    ..Default::default()
                };
                assert!(commands.push(&[cmd]).unwrap());
                ch.submit_bell().ring();
                ch.progress_bell()
                    .wait(SPIN, NAP, || completions.available() != Ok(0));
                let c = completions.pop().unwrap().unwrap();
                assert_eq!(c.seq, i as u64);
                samples.push(t.elapsed());
            }
            samples.sort();
            (percentile(&samples, 0.5), percentile(&samples, 0.99))
        },
    )
}

fn ring_throughput(n: usize) -> f64 {
    let ch = Channel::create(Layout::default()).unwrap();
    with_child(
        || {
            // Consume everything, then acknowledge once.
            let mut commands = ch.submit_consumer();
            let mut got = 0;
            while got < n {
                ch.submit_bell()
                    .wait(SPIN, NAP, || commands.available() != Ok(0));
                let k = commands.available().unwrap();
                for i in 0..k {
                    std::hint::black_box(commands.peek(i));
                }
                commands.advance(k);
                got += k as usize;
                ch.progress_bell().ring();
            }
            let mut completions = ch.complete_producer();
            while !completions.push(&[Completion::default()]).unwrap() {}
            ch.progress_bell().ring();
        },
        || {
            let mut commands = ch.submit_producer();
            let mut completions = ch.complete_consumer();
            let batch = [Command::default(); 32];
            let t = Instant::now();
            let mut sent = 0;
            while sent < n {
                let k = batch.len().min(n - sent);
                if commands.push(&batch[..k]).unwrap() {
                    sent += k;
                    ch.submit_bell().ring();
                } else {
                    let seen = ch.progress_bell().value();
                    ch.progress_bell()
                        .wait(SPIN, NAP, || ch.progress_bell().value() != seen);
                }
            }
            ch.progress_bell()
                .wait(SPIN, NAP, || completions.available() != Ok(0));
            completions.pop().unwrap().unwrap();
            n as f64 / t.elapsed().as_secs_f64()
        },
    )
}

fn socket_rtt(n: usize) -> (Duration, Duration) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    with_child(
        || {
            let mut buf = [0u8; 64];
            for _ in 0..n {
                b.read_exact(&mut buf).unwrap();
                b.write_all(&buf).unwrap();
            }
        },
        || {
            let mut buf = [0u8; 64];
            let mut samples = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                a.write_all(&buf).unwrap();
                a.read_exact(&mut buf).unwrap();
                samples.push(t.elapsed());
            }
            samples.sort();
            (percentile(&samples, 0.5), percentile(&samples, 0.99))
        },
    )
}

fn socket_throughput(n: usize) -> f64 {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    with_child(
        || {
            let mut buf = vec![0u8; 64 * 32];
            let mut got = 0;
            while got < n * 64 {
                got += b.read(&mut buf).unwrap();
            }
            b.write_all(&[1]).unwrap();
        },
        || {
            let batch = vec![0u8; 64 * 32];
            let t = Instant::now();
            let mut sent = 0;
            while sent < n {
                let k = 32.min(n - sent);
                a.write_all(&batch[..k * 64]).unwrap();
                sent += k;
            }
            a.read_exact(&mut [0u8; 1]).unwrap();
            n as f64 / t.elapsed().as_secs_f64()
        },
    )
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs this once as a smoke test.
    let n = if std::env::args().any(|a| a == "--bench") {
        iters()
    } else {
        2_000
    };
    let (rm, rp) = ring_rtt(n);
    let ring = Figures {
        median: rm,
        p99: rp,
        per_sec: ring_throughput(n * 10),
    };
    let (sm, sp) = socket_rtt(n);
    let sock = Figures {
        median: sm,
        p99: sp,
        per_sec: socket_throughput(n * 10),
    };
    println!(
        "cross-process, 64-byte messages, {n} round trips, {} one-way",
        n * 10
    );
    println!("| transport | RTT median | RTT p99 | one-way msgs/s |");
    println!("| --- | --- | --- | --- |");
    for (name, f) in [("shm ring + futex doorbell", &ring), ("Unix socket", &sock)] {
        println!(
            "| {name} | {:.2} us | {:.2} us | {:.2} M |",
            f.median.as_secs_f64() * 1e6,
            f.p99.as_secs_f64() * 1e6,
            f.per_sec / 1e6
        );
    }
    println!(
        "ratios ring/socket: RTT median {:.2}x, msgs/s {:.1}x",
        ring.median.as_secs_f64() / sock.median.as_secs_f64(),
        ring.per_sec / sock.per_sec
    );
}
