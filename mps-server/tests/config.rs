//! The daemon's configuration file against the real daemon, on the simulator: read at start
//! under the options given, refused with its line when bad, read again on SIGHUP (a bad one
//! leaving the running configuration in force), and written back by `save_config`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::daemon::TestDaemon;
use common::*;

/// Writes `text` as `mps.toml` in a directory of its own, mode 0644; returns its path.
fn config_file(tag: &str, text: &str) -> PathBuf {
    let path = temp_dir(tag).join("mps.toml");
    write(&path, text);
    path
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Starts `mps-control -f` with `args`, which must fail at once; returns what it said.
fn refused_at_start(args: &[&str]) -> String {
    let dir = temp_dir("config-refused");
    let out = Command::new(control_bin())
        .arg("-f")
        .args(["--backend", "sim", "--pipe-dir"])
        .arg(&dir)
        .arg("--log-dir")
        .arg(&dir)
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the daemon started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn sighup(d: &TestDaemon) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
}

#[test]
fn the_file_sets_the_defaults_and_an_option_wins_over_it() {
    let path = config_file(
        "config-start",
        "client_priority = 1\nactive_thread_percentage = 40\nmax_sm_reservation = 30\n\
         device_pinned_mem_limit = \"64MiB\"\n",
    );
    let path = path.to_str().unwrap();
    let d = TestDaemon::start("config", &["--config", path, "--max-sm-reservation", "20"]);
    assert_eq!(d.ctl_line("get_default_client_priority"), "1\n");
    assert_eq!(d.ctl_line("get_default_active_thread_percentage"), "40\n");
    assert_eq!(d.ctl_line("get_max_sm_reservation default"), "20\n");
    assert_eq!(
        d.ctl_line("get_default_device_pinned_mem_limit 0"),
        format!("{}\n", 64 << 20)
    );
    // A client of a new server is held to the file's limit.
    let c = d.client();
    let e = c.mem_alloc(65 << 20).unwrap_err();
    assert_eq!(e.status, mpsclient::Status::QuotaExceeded, "{e}");
}

#[test]
fn a_bad_file_is_refused_at_start_with_its_line() {
    let path = config_file(
        "config-bad",
        "# mps\nclient_priority = 0\nactive_thread_percentage = 250\n",
    );
    let said = refused_at_start(&["--config", path.to_str().unwrap()]);
    assert!(
        said.contains(&format!("{}, line 3:", path.display())) && said.contains("250"),
        "{said}"
    );
    let said = refused_at_start(&["--config", "/nonexistent/mps.toml"]);
    assert!(said.contains("/nonexistent/mps.toml"), "{said}");
}

#[test]
fn a_file_others_can_write_is_refused() {
    let path = config_file("config-writable", "client_priority = 1\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let said = refused_at_start(&["--config", path.to_str().unwrap()]);
    assert!(said.contains("chmod go-w"), "{said}");
}

#[test]
fn sighup_reads_the_file_again_and_a_bad_one_is_refused_keeping_the_running_one() {
    let path = config_file("config-reload", "active_thread_percentage = 40\n");
    let d = TestDaemon::start("config", &["--config", path.to_str().unwrap()]);
    assert_eq!(d.ctl_line("get_default_active_thread_percentage"), "40\n");
    write(
        &path,
        "active_thread_percentage = 60\nclient_priority = 1\n",
    );
    sighup(&d);
    wait_until(
        "the reload",
        || d.ctl_line("get_default_active_thread_percentage"),
        |s| s == "60\n",
    );
    assert_eq!(d.ctl_line("get_default_client_priority"), "1\n");
    write(
        &path,
        "active_thread_percentage = 10\nclient_priority = [\n",
    );
    sighup(&d);
    let log = d.wait_for_log("control.log", "the configuration is refused");
    assert!(
        log.contains(&format!("{}, line 2", path.display())),
        "{log}"
    );
    assert_eq!(d.ctl_line("get_default_active_thread_percentage"), "60\n");
    assert_eq!(d.ctl_line("get_default_client_priority"), "1\n");
    // The daemon still serves.
    let c = d.client();
    c.mem_alloc(4096).unwrap();
}

#[test]
fn save_config_keeps_operators_changes_across_a_restart() {
    let path = config_file(
        "config-save",
        "# the operators' file\nclient_priority = 1\n[groups.team]\nmax_clients = 2\n",
    );
    let config = path.to_str().unwrap();
    {
        let d = TestDaemon::start("config", &["--config", config]);
        d.ctl_line("set_default_active_thread_percentage 25");
        d.ctl_line("set_default_device_pinned_mem_limit 0 32MiB");
        d.ctl_line("set_default_client_priority 0");
        let said = d.ctl_line("save_config");
        assert_eq!(said, format!("configuration written to {config}\n"));
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("active_thread_percentage = 25"), "{text}");
    assert!(text.contains("[groups.team]\nmax_clients = 2"), "{text}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    let d = TestDaemon::start("config", &["--config", config]);
    assert_eq!(d.ctl_line("get_default_active_thread_percentage"), "25\n");
    assert_eq!(d.ctl_line("get_default_client_priority"), "0\n");
    assert_eq!(
        d.ctl_line("get_default_device_pinned_mem_limit 0"),
        format!("{}\n", 32 << 20)
    );
}
