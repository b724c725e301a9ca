//! The control daemon in a temporary directory (its pipe and log directory both), as the tests of
//! the daemon, of recovery and of several devices start it, stopped on drop; and `status` read
//! back as rows.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

use mpsclient::Client;

use super::{WAIT, backend, control_bin, server_bin, temp_dir, wait_for};

/// A running `mps-control -f`.
pub struct TestDaemon {
    pub dir: PathBuf,
    /// The log directory: `dir` itself unless started by [`TestDaemon::start_apart`].
    pub logs: PathBuf,
    child: Child,
}

/// One row of the servers' table of `status`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerRow {
    pub pid: u32,
    pub group: String,
    pub routed: u64,
    /// `RUNNING`, or `FAULT` while a failed server drains.
    pub state: String,
    pub device: u32,
}

impl TestDaemon {
    /// Starts the daemon on the tests' backend with 256 MiB of simulated memory per server and
    /// `extra` arguments, serving with this build's mps-server.
    pub fn start(tag: &str, extra: &[&str]) -> TestDaemon {
        Self::launch(tag, &server_bin(), extra, |_| {})
    }

    /// [`TestDaemon::start`] with `server` as its servers' binary.
    pub fn start_serving(tag: &str, server: &Path, extra: &[&str]) -> TestDaemon {
        Self::launch(tag, server, extra, |_| {})
    }

    /// [`TestDaemon::start_serving`], with `adjust` applied to the command before it is run (an
    /// environment of its own, say); waits until the daemon answers on its control socket.
    pub fn launch(
        tag: &str,
        server: &Path,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> TestDaemon {
        let dir = temp_dir(tag);
        Self::launch_in(
            dir.clone(),
            dir,
            server,
            "256MiB",
            &backend(),
            extra,
            adjust,
        )
    }

    /// A daemon laid out as the Debian package lays it out: the pipe directory (0755) apart
    /// from the log directory, which exists beforehand, root's with mode 0711
    /// (`LogsDirectoryMode=0711`), with `sim_memory` of simulated memory per server.
    pub fn start_apart(tag: &str, server: &Path, sim_memory: &str, extra: &[&str]) -> TestDaemon {
        Self::start_apart_on(&backend(), tag, server, sim_memory, extra)
    }

    /// [`TestDaemon::start_apart`] with servers of `backend`, whatever the tests run against.
    pub fn start_apart_on(
        backend: &str,
        tag: &str,
        server: &Path,
        sim_memory: &str,
        extra: &[&str],
    ) -> TestDaemon {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir(tag);
        let logs = temp_dir(&format!("{tag}-logs")).join("mps");
        std::fs::create_dir(&logs).unwrap();
        std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o711)).unwrap();
        Self::launch_in(dir, logs, server, sim_memory, backend, extra, |_| {})
    }

    fn launch_in(
        dir: PathBuf,
        logs: PathBuf,
        server: &Path,
        sim_memory: &str,
        backend: &str,
        extra: &[&str],
        adjust: impl FnOnce(&mut Command),
    ) -> TestDaemon {
        let mut cmd = Command::new(control_bin());
        cmd.arg("-f")
            .args(["--backend", backend, "--sim-memory", sim_memory])
            .args(extra)
            .arg("--server")
            .arg(server)
            .arg("--pipe-dir")
            .arg(&dir)
            .arg("--log-dir")
            .arg(&logs)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        adjust(&mut cmd);
        let child = cmd.spawn().unwrap();
        let d = TestDaemon { dir, logs, child };
        wait_for(
            "the daemon's start",
            || std::os::unix::net::UnixStream::connect(d.dir.join("control.sock")).ok(),
            || d.log("control.log"),
        );
        d
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the daemon process has exited.
    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// The log file `name` in the daemon's log directory (empty until it exists).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.join(name)).unwrap_or_default()
    }

    /// Waits until the log `name` contains `needle`; returns the log.
    pub fn wait_for_log(&self, name: &str, needle: &str) -> String {
        super::wait_until(
            &format!("{name} to say {needle:?}"),
            || self.log(name),
            |log| log.contains(needle),
        )
    }

    /// Runs `mps-control <words>` against this daemon.
    pub fn ctl(&self, words: &[&str]) -> Output {
        Command::new(control_bin())
            .arg("--pipe-dir")
            .arg(&self.dir)
            .args(words)
            .output()
            .unwrap()
    }

    /// Runs `mps-control <words>`, which must succeed, and returns what it printed.
    pub fn ctl_ok(&self, words: &[&str]) -> String {
        let out = self.ctl(words);
        assert!(
            out.status.success(),
            "{words:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs the `mps-control` command `line` (words split at white space), which must succeed.
    pub fn ctl_line(&self, line: &str) -> String {
        self.ctl_ok(&line.split_whitespace().collect::<Vec<_>>())
    }

    /// The pids `get_server_list` lists.
    pub fn server_pids(&self) -> Vec<u32> {
        self.ctl_ok(&["get_server_list"])
            .lines()
            // A line is a server's pid, and FAULT after it while a failed server drains.
            .map(|l| l.split_whitespace().next().unwrap_or("").parse().unwrap())
            .collect()
    }

    /// The servers' table of `status`, read by its column names.
    pub fn servers(&self) -> Vec<ServerRow> {
        let status = self.ctl_ok(&["status"]);
        let table = status.split("\n\n").next().unwrap_or_default();
        let mut lines = table.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let col = |name: &str| {
            header
                .iter()
                .position(|h| *h == name)
                .unwrap_or_else(|| panic!("no {name} column in status:\n{status}"))
        };
        let (pid, group, routed, state, device) = (
            col("SERVER-PID"),
            col("GROUP"),
            col("ROUTED"),
            col("STATE"),
            col("DEVICE"),
        );
        lines
            .map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                ServerRow {
                    pid: w[pid].parse().unwrap(),
                    group: w[group].to_string(),
                    routed: w[routed].parse().unwrap(),
                    state: w[state].to_string(),
                    device: w[device].parse().unwrap(),
                }
            })
            .collect()
    }

    /// The column `name` of the first row of client process `pid` in `status`.
    pub fn status_field(&self, pid: u32, name: &str) -> Option<String> {
        let status = self.ctl_ok(&["status"]);
        let header = status.lines().find(|l| l.contains(name))?;
        let column = header.split_whitespace().position(|h| h == name)?;
        status
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(pid.to_string().as_str()))
            .and_then(|l| l.split_whitespace().nth(column).map(str::to_string))
    }

    /// A client of this daemon, in this process.
    pub fn client(&self) -> Client {
        Client::connect(Some(&self.dir)).expect("connect through the daemon")
    }

    /// This test binary, run again as a client of this daemon to play `role` in `test`, with
    /// `env`.
    pub fn role(&self, test: &str, role: &str, env: &[(&str, &str)]) -> Command {
        self.role_of(&std::env::current_exe().unwrap(), test, role, env)
    }

    /// [`TestDaemon::role`], played by the test binary `exe` (a copy of this one).
    pub fn role_of(&self, exe: &Path, test: &str, role: &str, env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(exe);
        cmd.args([test, "--exact", "--nocapture"])
            .env("MPS_TEST_ROLE", role)
            .env("MPS_PIPE_DIRECTORY", &self.dir)
            .envs(env.iter().copied());
        cmd
    }

    /// Runs [`TestDaemon::role`] to its end; it must succeed.
    pub fn run_role(&self, test: &str, role: &str, env: &[(&str, &str)]) {
        let out = self.role(test, role, env).output().unwrap();
        assert!(
            out.status.success(),
            "{test} as {role} with {env:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for TestDaemon {
    /// Asks the daemon to quit (its servers get a second to drain), waits for it, and kills it
    /// only if it is still there after the deadline.
    fn drop(&mut self) {
        let _ = self.ctl(&["quit", "-t", "1"]);
        let until = Instant::now() + WAIT;
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.logs != self.dir {
            let _ = std::fs::remove_dir_all(self.logs.parent().unwrap_or(&self.logs));
        }
    }
}
