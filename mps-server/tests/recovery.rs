//! Back in service after a kernel fault ends a server's context: with the control daemon (a
//! fresh server for the faulted group, the other group untouched) and with a standalone server
//! (a fresh process on the same socket). On the simulator the servers run with
//! `--sim-fault-scope context`, which models a GPU's fault; `MPS_TEST_BACKEND=cuda` runs the
//! same on a GPU. Each test prints the time from the fault to the first fresh client served.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::TestDaemon;
use common::*;
use mpsclient::{Client, Dim3, Status, Stream};

/// How long recovery may take before a test fails (the figure itself is printed).
const DEADLINE: Duration = Duration::from_secs(20);

fn grid(x: u32) -> Dim3 {
    Dim3 { x, y: 1, z: 1 }
}

/// The simulator's fault model of a GPU (ignored by the CUDA backend).
const GPU_FAULTS: [&str; 2] = ["--sim-fault-scope", "context"];

/// Launches `fault_write` at an address no one holds and returns the error the client gets.
fn fault(c: &Client) -> mpsclient::Error {
    let m = c.module_load(&ptx()).unwrap();
    let f = c.module_get_function(m, "fault_write").unwrap();
    let launched = c.launch(
        f,
        grid(1),
        grid(1),
        0,
        Stream::DEFAULT,
        &[&0x10u64.to_le_bytes()],
    );
    match launched {
        Err(e) => e,
        Ok(()) => c.synchronize().unwrap_err(),
    }
}

/// Asserts that `e` is the context's failure, as every client of a failed context gets it.
fn assert_context_failed(e: &mpsclient::Error, who: &str) {
    assert_eq!(e.status, Status::IllegalAddress, "{who}: {e}");
    assert!(e.message.contains("context failed"), "{who}: {e}");
}

/// Real work with checked results, on one client.
struct Work<'c> {
    client: &'c Client,
    fill: mpsclient::Function,
}

impl<'c> Work<'c> {
    fn on(client: &'c Client) -> Work<'c> {
        let m = client.module_load(&ptx()).unwrap();
        let fill = client.module_get_function(m, "fill_u32").unwrap();
        Work { client, fill }
    }

    /// Fills 1024 words with `value` and reads them back.
    fn round(&self, value: u32) {
        let (c, n) = (self.client, 1024u64);
        let p = c.mem_alloc(n * 4).unwrap();
        c.launch(
            self.fill,
            grid(4),
            grid(256),
            0,
            Stream::DEFAULT,
            &[&p.0.to_le_bytes(), &value.to_le_bytes(), &n.to_le_bytes()],
        )
        .unwrap();
        let mut out = vec![0u8; (n * 4) as usize];
        c.memcpy_dtoh(&mut out, p, Stream::DEFAULT).unwrap();
        c.stream_synchronize(Stream::DEFAULT).unwrap();
        assert!(
            out.chunks(4)
                .all(|w| u32::from_le_bytes(w.try_into().unwrap()) == value),
            "fill_u32 wrote something else"
        );
        c.mem_free(p).unwrap();
    }
}

/// A client served: it loads a module, runs a kernel and reads back what it wrote.
fn served(c: &Client, value: u32) {
    Work::on(c).round(value);
}

/// A client process of group `group` that works, checking every result, until a line arrives on
/// its standard input; it then prints how many rounds it did and exits (non-zero on any error).
struct Bystander {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Bystander {
    fn start(test: &str, pipe_dir: &std::path::Path, group: &str) -> Bystander {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env("MPS_TEST_ROLE", "bystander")
            .env("MPS_PIPE_DIRECTORY", pipe_dir)
            .env("MPS_GROUP", group)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // The test harness may start the line with the test's name.
        lines
            .find(|l| l.as_ref().is_ok_and(|l| l.ends_with("working")))
            .expect("the bystander ended before it worked")
            .unwrap();
        Bystander { child, lines }
    }

    /// Tells it to stop; returns the rounds it did.
    fn finish(mut self) -> u64 {
        writeln!(self.child.stdin.take().unwrap(), "stop").unwrap();
        let rounds = self
            .lines
            .find_map(|l| l.ok()?.split("rounds ").nth(1)?.trim().parse().ok())
            .expect("the bystander did not say how many rounds it did");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the bystander failed: {status}");
        rounds
    }

    /// The bystander's body, in the child process.
    fn play() {
        let c = Client::connect(None).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_line(&mut String::new());
            s.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        let work = Work::on(&c);
        work.round(1);
        println!("working");
        let mut rounds = 1u64;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            work.round(rounds as u32);
            rounds += 1;
        }
        println!("rounds {rounds}");
    }
}

/// (pid, state) of each server of `group`, from `status`.
fn of_group(d: &TestDaemon, group: &str) -> Vec<(u32, String)> {
    d.servers()
        .into_iter()
        .filter(|s| s.group == group)
        .map(|s| (s.pid, s.state))
        .collect()
}

#[test]
fn with_the_daemon_a_faulted_group_is_served_by_a_fresh_server_and_others_never_notice() {
    const TEST: &str =
        "with_the_daemon_a_faulted_group_is_served_by_a_fresh_server_and_others_never_notice";
    if role().is_some() {
        return Bystander::play();
    }
    let d = TestDaemon::start("recovery", &GPU_FAULTS);
    // Group a is this process's (the default group); group b's client is another process.
    let a = "default";
    let victim = d.client();
    served(&victim, 7);
    let bystander = Bystander::start(TEST, &d.dir, "b");
    let [(old, ref state)] = of_group(&d, a)[..] else {
        panic!("not one server for group a:\n{}", d.ctl_line("status"));
    };
    assert_eq!(state, "ACTIVE");
    let [(b_server, _)] = of_group(&d, "b")[..] else {
        panic!("not one server for group b:\n{}", d.ctl_line("status"));
    };

    let faulted = Instant::now();
    let e = fault(&victim);
    assert_context_failed(&e, "the client whose kernel faulted");
    let fresh = d.client();
    served(&fresh, 9);
    let took = faulted.elapsed();
    println!(
        "fault to first fresh client served ({} backend, with the daemon): {:.1} ms",
        backend(),
        took.as_secs_f64() * 1e3
    );
    assert!(took < DEADLINE, "recovery took {took:?}");

    // The victim keeps hearing what happened.
    assert_context_failed(&victim.mem_alloc(16).unwrap_err(), "the victim, later");
    // The old server is listed as faulted while it drains, beside the fresh one.
    let servers = of_group(&d, a);
    assert!(servers.contains(&(old, "FAULT".into())), "{servers:?}");
    assert!(
        servers.iter().any(|(p, s)| *p != old && s == "ACTIVE"),
        "{servers:?}"
    );
    let list = d.ctl_line("get_server_list");
    assert!(list.lines().any(|l| l == format!("{old} FAULT")), "{list}");
    assert_eq!(d.ctl_line(&format!("get_server_status {old}")), "FAULT\n");
    assert!(
        d.log("control.log").contains("device context failed"),
        "{}",
        d.log("control.log")
    );

    // Group b's client worked through all of it, on its own server.
    assert_eq!(of_group(&d, "b"), vec![(b_server, "ACTIVE".to_string())]);
    let rounds = bystander.finish();
    assert!(rounds > 1, "the bystander did {rounds} rounds");

    // Once its last client has gone, the faulted server exits and leaves the list.
    drop(victim);
    wait_for(
        "the faulted server's exit",
        || (!of_group(&d, a).iter().any(|(p, _)| *p == old)).then_some(()),
        || d.ctl_line("status"),
    );
    served(&fresh, 11);
}

#[test]
fn a_standalone_server_hands_its_socket_to_a_fresh_server_after_a_fault() {
    let mut server = TestServer::start_with(&GPU_FAULTS);
    let victim = server.client();
    let other = server.client();
    served(&victim, 3);
    served(&other, 4);

    let faulted = Instant::now();
    let e = fault(&victim);
    assert_context_failed(&e, "the client whose kernel faulted");
    let fresh = server.client();
    served(&fresh, 5);
    let took = faulted.elapsed();
    println!(
        "fault to first fresh client served ({} backend, standalone): {:.1} ms",
        backend(),
        took.as_secs_f64() * 1e3
    );
    assert!(took < DEADLINE, "recovery took {took:?}");

    let log = server.wait_for_log("a fresh server (pid ");
    assert!(
        !pids_after(&log, "a fresh server (pid ").is_empty(),
        "{log}"
    );
    assert!(log.contains("device context failed"), "{log}");

    // Every client of the failed context hears what happened, on every call.
    assert_context_failed(&other.synchronize().unwrap_err(), "the other client");
    assert_context_failed(&victim.mem_alloc(16).unwrap_err(), "the victim, later");
    // The old process takes no new client but stays for those of the failed context...
    assert!(server.is_alive(), "the old server left its clients");
    // ...and exits once they are gone; the fresh one serves on.
    drop(victim);
    drop(other);
    let log_dir = server.dir.clone();
    wait_for(
        "the old server's exit",
        || (!server.is_alive()).then_some(()),
        || std::fs::read_to_string(log_dir.join("server.log")).unwrap_or_default(),
    );
    served(&fresh, 6);
    served(&server.client(), 8);
    assert!(
        server
            .log()
            .contains("every client of the failed context has gone"),
        "{}",
        server.log()
    );
}

/// Whether process `pid` has ended (gone, or a zombie not yet reaped).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
    }
}

/// With `--standby`, a standalone server keeps a server beside it whose context is made
/// already: after a fault that one serves the socket (no new process, no new context), starts
/// a standby of its own, and so recovers from a second fault too. A standby never outlives the
/// server it stands by for.
#[test]
fn with_a_standby_a_standalone_server_is_replaced_at_once_and_again() {
    let server = TestServer::start_with(&[GPU_FAULTS[0], GPU_FAULTS[1], "--standby"]);
    let mut serving = server.pid() as i32;
    for round in 0..2 {
        // This round's standby has made its context.
        let log = wait_for(
            "the standby's context",
            || {
                let log = server.log();
                (log.matches("standing by, the device context made").count() > round).then_some(log)
            },
            || server.log(),
        );
        let standby = *pids_after(&log, "a standby server (pid ")
            .get(round)
            .unwrap_or_else(|| panic!("round {round}: no standby was started:\n{log}"));
        let victim = server.client();
        served(&victim, 3);
        let faulted = Instant::now();
        assert_context_failed(&fault(&victim), "the client whose kernel faulted");
        let fresh = server.client();
        served(&fresh, 5);
        let took = faulted.elapsed();
        println!(
            "fault to first fresh client served ({} backend, standalone with a standby, fault \
             {}): {:.1} ms",
            backend(),
            round + 1,
            took.as_secs_f64() * 1e3
        );
        assert!(took < DEADLINE, "recovery took {took:?}");
        let log = server.wait_for_log(&format!("the standby server (pid {standby}) serves"));
        assert!(
            !log.contains("a fresh server (pid "),
            "a fresh server was started although a standby stood by:\n{log}"
        );
        // The server that failed exits once its client is gone.
        drop(victim);
        wait_for(
            "the failed server's exit",
            || ended(serving).then_some(()),
            || server.log(),
        );
        served(&fresh, 6);
        serving = standby;
        // The promoted standby starts a standby of its own (its "standing by" is the next
        // round's wait, past this round's).
        wait_for(
            "the next standby",
            || {
                (pids_after(&server.log(), "a standby server (pid ").len() > round + 1)
                    .then_some(())
            },
            || server.log(),
        );
    }
    // Stopping the server that serves stops its standby too.
    let log = server.log();
    let last = *pids_after(&log, "a standby server (pid ").last().unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serving),
        nix::sys::signal::Signal::SIGTERM,
    );
    wait_for(
        "the standby's exit after its server stopped",
        || ended(last).then_some(()),
        || server.log(),
    );
    assert!(
        server
            .log()
            .contains("the server this one stood by for stopped"),
        "{}",
        server.log()
    );
}

/// With `mps-control --standby`, each group's server has a standby beside it (listed as
/// `STANDBY`, its context made); after a fault the daemon tells the standby to go, and it takes
/// the group's new clients at once; a new standby is started, and `quit` stops every one.
#[test]
fn with_standbys_the_daemon_hands_a_faulted_group_to_its_standby_at_once() {
    let d = TestDaemon::start(
        "recovery-standby",
        &[GPU_FAULTS[0], GPU_FAULTS[1], "--standby"],
    );
    let server_log = format!("server-{}-default.log", nix::unistd::geteuid().as_raw());
    let victim = d.client();
    served(&victim, 3);
    let standby_of = |d: &TestDaemon| {
        d.servers()
            .into_iter()
            .find(|s| s.state == "STANDBY")
            .map(|s| s.pid)
    };
    let standby = wait_for(
        "the group's standby",
        || standby_of(&d),
        || d.ctl_line("status"),
    );
    wait_for(
        "the standby's context",
        || {
            d.log(&server_log)
                .contains("standing by, the device context made")
                .then_some(())
        },
        || d.log(&server_log),
    );
    let active = |d: &TestDaemon| -> Vec<u32> {
        let rows = of_group(d, "default").into_iter();
        rows.filter(|(_, state)| state == "ACTIVE")
            .map(|(p, _)| p)
            .collect()
    };
    let [old] = active(&d)[..] else {
        panic!("not one active server:\n{}", d.ctl_line("status"));
    };

    let faulted = Instant::now();
    assert_context_failed(&fault(&victim), "the client whose kernel faulted");
    let fresh = d.client();
    served(&fresh, 5);
    let took = faulted.elapsed();
    println!(
        "fault to first fresh client served ({} backend, with the daemon and a standby): {:.1} ms",
        backend(),
        took.as_secs_f64() * 1e3
    );
    assert!(took < DEADLINE, "recovery took {took:?}");
    let log = d.wait_for_log("control.log", "the standby server takes the new clients");
    assert!(log.contains(&format!("pid={standby}")), "{log}");
    assert!(
        !log.contains("cannot start a fresh server"),
        "a fresh server was started although a standby stood by:\n{log}"
    );
    // The standby is the group's active server now, and a new standby stands beside it.
    let rows = of_group(&d, "default");
    assert!(
        rows.contains(&(standby, "ACTIVE".to_string())) && rows.contains(&(old, "FAULT".into())),
        "{}",
        d.ctl_line("status")
    );
    let next = wait_for(
        "a new standby",
        || standby_of(&d).filter(|p| *p != standby),
        || d.ctl_line("status"),
    );
    drop(victim);
    wait_for(
        "the failed server's exit",
        || (!of_group(&d, "default").iter().any(|(p, _)| *p == old)).then_some(()),
        || d.ctl_line("status"),
    );
    served(&fresh, 6);
    drop(fresh);
    // Stopping the group's server stops its standby with it.
    d.ctl_ok(&["shutdown_server", &standby.to_string(), "-f"]);
    wait_for(
        "the standby's exit with its server",
        || ended(next as i32).then_some(()),
        || d.ctl_line("status"),
    );
    // A new client gets a new server, and a new standby beside it, which quit stops.
    served(&d.client(), 7);
    let last = wait_for(
        "the new server's standby",
        || standby_of(&d).filter(|p| *p != next),
        || d.ctl_line("status"),
    );
    drop(d);
    assert!(
        ended(last as i32),
        "the standby {last} outlived the daemon's quit"
    );
}
