//! `mps-control`: the mps control daemon and its command-line client.
//!
//! `mps-control -d` starts the daemon in the background, `-f` in the foreground. Without either it
//! sends commands to a running daemon: the words after the options as one command, or, with no
//! words, each line of standard input (`echo get_server_list | mps-control`).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use mps_core::units::parse_size;
use mps_ipc::env;
use mps_ipc::trust::TrustedDir;
use mps_server::backend::cuda;
use mps_server::control::config::{
    self, Backend, Count, DeviceSizes, FaultScope, FileConfig, Percent, Priority, Size,
};
use mps_server::control::{
    CONTROL_SOCKET, DEFAULT_MAX_SERVER_LOGS, DEFAULT_MAX_SERVERS_PER_USER,
    DEFAULT_MAX_SM_RESERVATION, Daemon, DaemonConfig, HelloLimits, send_command,
};
use mps_server::intake::DEFAULT_LIMITS;
use mps_server::process::{
    DEFAULT_LOG_MAX_BYTES, RotatingLog, STOP, init_logging_to, install_reload_handler,
    install_signal_handlers,
};
use mps_server::registry::Defaults;

/// The mps control daemon, and its command client.
#[derive(Clone, Debug, Parser)]
#[command(
    version,
    about = "The mps control daemon (one server per user and group) and its command client"
)]
struct Args {
    /// Run the daemon in the background.
    #[arg(short = 'd', conflicts_with = "foreground")]
    daemon: bool,
    /// Run the daemon in the foreground.
    #[arg(short = 'f')]
    foreground: bool,
    /// The configuration file, whose keys are these options' names (docs/OPERATE.md); an
    /// option given here wins over it [default: $MPS_CONFIG; else /etc/mps/mps.toml, if it
    /// exists]
    #[arg(long)]
    config: Option<PathBuf>,
    /// Pipe directory [default: $MPS_PIPE_DIRECTORY; else, except for root, $XDG_RUNTIME_DIR/mps
    /// when set; else /tmp/mps: where clients look by default]
    #[arg(long)]
    pipe_dir: Option<PathBuf>,
    /// Log directory [default: $MPS_LOG_DIRECTORY; else, except for root,
    /// $XDG_RUNTIME_DIR/mps-log when set; else /tmp/mps-log]
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// The mps-server binary [default: next to this one]
    #[arg(long)]
    server: Option<PathBuf>,
    /// Backend of the servers [default: auto]
    #[arg(long, value_enum)]
    backend: Option<Backend>,
    /// The devices to serve, as ordinals (e.g. 0,1) [default: every device the driver sees, or
    /// those --sim-devices makes]. Each (user, group, device) gets a server of its own.
    #[arg(long, value_delimiter = ',')]
    devices: Option<Vec<u32>>,
    /// How many devices the simulator presents (simulator only; with --backend auto, where
    /// no GPU is found) [default: 1]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=mps_core::handshake::MAX_DEVICES as i64))]
    sim_devices: Option<u32>,
    /// Simulated device memory of each server (simulator only).
    #[arg(long, value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    sim_memory: Option<u64>,
    /// What a faulting kernel ends in the simulator (simulator only): `client`, its work, or
    /// `context`, as on a GPU, every client of its server (which a fresh server then replaces).
    #[arg(long, value_enum)]
    sim_fault_scope: Option<FaultScope>,
    /// Device memory each client may hold, e.g. 2GiB (0: no limit); the daemon's
    /// set_default_device_pinned_mem_limit changes it later [default: $MPS_PINNED_DEVICE_MEM_LIMIT,
    /// else $CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (a size, or per device: 0=1G,1=512M); else 0]
    #[arg(long, value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    device_pinned_mem_limit: Option<u64>,
    /// Priority of clients: 0 normal, 1 below normal (set_default_client_priority)
    /// [default: $MPS_CLIENT_PRIORITY, else $CUDA_MPS_CLIENT_PRIORITY; else 0]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=1))]
    client_priority: Option<u32>,
    /// Share of the SMs each client may use, percent (set_default_active_thread_percentage)
    /// [default: $MPS_ACTIVE_THREAD_PERCENTAGE, else $CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; else 100]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    active_thread_percentage: Option<u32>,
    /// Ceiling on the SMs a server's clients may reserve in all, percent
    /// (set_max_sm_reservation default) [default: 50]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100))]
    max_sm_reservation: Option<u32>,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9400); the address actually
    /// bound is written to metrics.addr in the pipe directory.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// A word for the command line of every server the daemon starts, repeatable, e.g.
    /// --server-arg=--max-streams --server-arg=16 for the limits per client of mps-server(1).
    /// The options the daemon sets itself (directories, device, defaults, backend) are refused
    /// by the server as given twice.
    #[arg(long = "server-arg", allow_hyphen_values = true, value_name = "ARG")]
    server_args: Vec<String>,
    /// Keeps a standby server, its device context made, beside each server, to take that
    /// user and group's clients at once if its context fails (instead of a fresh server making
    /// its context then). It costs a second context on the device per server.
    #[arg(long)]
    standby: bool,
    /// Connections that may wait for their hello at once; beyond it the one that has waited
    /// longest is dropped (every hello is read on one thread: a waiting connection costs a
    /// descriptor, never a thread) [default: 64]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_pending_hellos: Option<u64>,
    /// Milliseconds a new connection has for its whole hello before it is dropped
    /// [default: 5000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    hello_timeout_ms: Option<u64>,
    /// Servers one user may have running at once (one per group and device); a client of that
    /// user that would need one more is refused with the reason [default: 16]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_servers_per_user: Option<u64>,
    /// Bytes control.log, and each server's log, grows to before it is renamed NAME.1
    /// (replacing the one before) and started afresh, e.g. 16MiB [default: 16MiB]
    #[arg(long, value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    log_max_bytes: Option<u64>,
    /// Server logs kept in each user's log directory (a log and its NAME.1 count as one):
    /// before a server with a log of a new name starts, the logs of servers no longer running
    /// are removed, the least recently written first, down to this many with the new one; a
    /// running server's log is never removed [default: 32]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    max_server_logs: Option<u64>,
    /// Where clients' processes are read (their cgroup and groups), for tests that give a
    /// directory of their own.
    #[arg(long, hide = true, default_value = "/proc")]
    proc_root: PathBuf,
    /// A command for the running daemon (without -d or -f).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn run_daemon(args: &Args, file: FileConfig, config_path: PathBuf) -> Result<(), String> {
    let cfg = merge(args, file)?;
    let pipe_dir = cfg
        .pipe_dir
        .clone()
        .unwrap_or_else(mps_ipc::socket::default_pipe_dir);
    let log_dir = cfg
        .log_dir
        .clone()
        .unwrap_or_else(mps_ipc::trust::default_log_dir);
    let log_max_bytes = cfg.log_max_bytes.map_or(DEFAULT_LOG_MAX_BYTES, u64::from);
    // The log directory and control.log are checked and made as the pipe directory's files are
    // (owned by this user or root, written by no one else, never through a link); the log is
    // readable by this user only.
    let log_mode = if nix::unistd::geteuid().is_root() {
        0o711
    } else {
        0o700
    };
    let log = TrustedDir::open(&log_dir, log_mode)
        .and_then(|d| RotatingLog::open(d, "control.log", log_max_bytes))
        .map_err(|e| e.message)?;
    init_logging_to(log);
    install_signal_handlers()?;
    install_reload_handler()?;
    let server_bin = cfg.server.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .map(|p| p.with_file_name("mps-server"))
            .unwrap_or_else(|_| PathBuf::from("mps-server"))
    });
    let backend = cfg.backend.unwrap_or(Backend::Auto);
    let mut server_args = vec!["--backend".to_string(), backend.name().to_string()];
    if let Some(m) = cfg.sim_memory {
        server_args.extend(["--sim-memory".to_string(), m.0.to_string()]);
    }
    if let Some(scope) = cfg.sim_fault_scope {
        server_args.extend(["--sim-fault-scope".to_string(), scope.name().to_string()]);
    }
    server_args.extend(["--log-max-bytes".to_string(), log_max_bytes.to_string()]);
    let extra = cfg.server_args.clone().unwrap_or_default();
    server_args.extend(extra.iter().cloned());
    if !extra.is_empty() {
        check_server_args(&server_bin, &server_args)?;
    }
    let devices = devices_to_serve(&cfg)?;
    let daemon = Daemon::bind(DaemonConfig {
        pipe_dir: pipe_dir.clone(),
        devices: devices.clone(),
        log_dir,
        server_bin,
        server_args,
        defaults: Defaults {
            mem_limit: 0,
            priority: cfg.client_priority.map_or(0, |p| p.0),
            sm_share: cfg.active_thread_percentage.map_or(100, |p| p.0),
            max_sm_reserve: cfg
                .max_sm_reservation
                .map_or(DEFAULT_MAX_SM_RESERVATION, |p| p.0),
        },
        standby: cfg.standby.unwrap_or(false),
        hellos: HelloLimits {
            max_pending: cfg
                .max_pending_hellos
                .map_or(DEFAULT_LIMITS.max_pending, |c| c.0 as usize),
            timeout: cfg
                .hello_timeout_ms
                .map_or(DEFAULT_LIMITS.hello_timeout, |c| Duration::from_millis(c.0)),
        },
        max_servers_per_user: cfg
            .max_servers_per_user
            .map_or(DEFAULT_MAX_SERVERS_PER_USER, |c| c.0 as usize),
        max_server_logs: cfg.max_server_logs.map_or(DEFAULT_MAX_SERVER_LOGS, |c| {
            usize::try_from(c.0).unwrap_or(usize::MAX)
        }),
        config: cfg.clone(),
        config_path: config_path.clone(),
        proc_root: args.proc_root.clone(),
    })
    .map_err(|e| e.to_string())?;
    tracing::info!(
        "mps-control listening in {}, serving devices {devices:?}",
        pipe_dir.display()
    );
    // SIGHUP reads the file again, under the same options and environment.
    let (again, path) = (args.clone(), config_path);
    daemon.set_reloader(Box::new(move || {
        let file = FileConfig::read(&path, again.config.is_some() || env_config().is_some())
            .map_err(|e| e.message)?
            .unwrap_or_default();
        merge(&again, file)
    }));
    let daemon = Arc::new(daemon);
    if let Some(addr) = &cfg.metrics_listen {
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| format!("cannot listen for metrics on {addr}: {e}"))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        daemon
            .pipe_dir()
            .create_file("metrics.addr", 0o644)
            .map_err(|e| e.message)
            .and_then(|mut f| {
                writeln!(f, "{bound}").map_err(|e| format!("cannot write metrics.addr: {e}"))
            })?;
        tracing::info!("metrics on http://{bound}/metrics");
        let d = daemon.clone();
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || d.serve_metrics(listener))
            .map_err(|e| e.to_string())?;
    }
    daemon.run(&STOP);
    let _ = daemon.pipe_dir().remove("metrics.addr");
    Ok(())
}

/// The configuration in force: the file's, under the environment's `MPS_*` (or NVIDIA's
/// `CUDA_MPS_*`) variables, under the options on the command line. A variable whose value does
/// not parse stops the daemon with the variable's name.
fn merge(args: &Args, mut c: FileConfig) -> Result<FileConfig, String> {
    fn over<T>(slot: &mut Option<T>, value: Option<T>) {
        if value.is_some() {
            *slot = value;
        }
    }
    let from_env = EnvDefaults::read()?;
    over(
        &mut c.pipe_dir,
        args.pipe_dir
            .clone()
            .or_else(|| env::setting_os("MPS_PIPE_DIRECTORY").map(PathBuf::from)),
    );
    over(
        &mut c.log_dir,
        args.log_dir
            .clone()
            .or_else(|| env::setting_os("MPS_LOG_DIRECTORY").map(PathBuf::from)),
    );
    over(&mut c.server, args.server.clone());
    over(&mut c.backend, args.backend);
    over(&mut c.devices, args.devices.clone());
    over(
        &mut c.sim_devices,
        args.sim_devices.map(|n| Count(n.into())),
    );
    over(&mut c.sim_memory, args.sim_memory.map(Size));
    over(&mut c.sim_fault_scope, args.sim_fault_scope);
    over(
        &mut c.device_pinned_mem_limit,
        args.device_pinned_mem_limit
            .map(|b| DeviceSizes(b.to_string()))
            .or(from_env.mem_limit),
    );
    over(
        &mut c.client_priority,
        args.client_priority.or(from_env.priority).map(Priority),
    );
    over(
        &mut c.active_thread_percentage,
        args.active_thread_percentage
            .or(from_env.sm_share)
            .map(Percent),
    );
    over(
        &mut c.max_sm_reservation,
        args.max_sm_reservation.map(Percent),
    );
    over(&mut c.metrics_listen, args.metrics_listen.clone());
    if !args.server_args.is_empty() {
        c.server_args = Some(args.server_args.clone());
    }
    if args.standby {
        c.standby = Some(true);
    }
    over(
        &mut c.max_pending_hellos,
        args.max_pending_hellos.map(Count),
    );
    over(&mut c.hello_timeout_ms, args.hello_timeout_ms.map(Count));
    over(
        &mut c.max_servers_per_user,
        args.max_servers_per_user.map(Count),
    );
    over(&mut c.log_max_bytes, args.log_max_bytes.map(Size));
    over(&mut c.max_server_logs, args.max_server_logs.map(Count));
    c.check_groups()?;
    Ok(c)
}

/// Client defaults from the daemon's own environment, as NVIDIA's control daemon takes them:
/// mps's `MPS_*` names, else NVIDIA's `CUDA_MPS_*` ones. A flag on the command line wins over
/// both, and both win over the configuration file; a value that does not parse stops the daemon
/// with the variable's name.
struct EnvDefaults {
    sm_share: Option<u32>,
    priority: Option<u32>,
    /// Device memory per client, for every device or by ordinal.
    mem_limit: Option<DeviceSizes>,
}

impl EnvDefaults {
    fn read() -> Result<EnvDefaults, String> {
        let percent = |name: &'static str, min: u32, max: u32| {
            match env::setting(name) {
            None => Ok(None),
            Some((value, var)) => value
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|v| (min..=max).contains(v))
                .map(Some)
                .ok_or_else(|| {
                    format!("{var}={value} is not a whole number from {min} to {max}; unset it or fix it")
                }),
        }
        };
        let mem_limit = match env::setting("MPS_PINNED_DEVICE_MEM_LIMIT") {
            Some((spec, var)) => {
                Some(DeviceSizes::parse(&spec).map_err(|e| format!("{var}={spec}: {e}"))?)
            }
            None => None,
        };
        Ok(EnvDefaults {
            sm_share: percent("MPS_ACTIVE_THREAD_PERCENTAGE", 1, 100)?,
            priority: percent("MPS_CLIENT_PRIORITY", 0, 1)?,
            mem_limit,
        })
    }
}

/// `MPS_CONFIG`, the configuration file the environment names.
fn env_config() -> Option<PathBuf> {
    env::setting_os("MPS_CONFIG").map(PathBuf::from)
}

/// Refuses to start on server options that every server would refuse (a misspelt option, a
/// limit past the protocol's ceiling), instead of failing each client later: the server checks
/// them itself (`--check-options`).
fn check_server_args(server_bin: &std::path::Path, server_args: &[String]) -> Result<(), String> {
    let out = std::process::Command::new(server_bin)
        .args(server_args)
        .arg("--check-options")
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} to check its options: {e}",
                server_bin.display()
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} refuses the options {server_args:?} (from --server-arg): {}",
        server_bin.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// The device ordinals the daemon serves: those asked for (`--devices`), each of which must
/// exist, or every device of the backend: what the CUDA driver sees (after
/// `CUDA_VISIBLE_DEVICES`, which the servers inherit), or the simulator's `--sim-devices`.
fn devices_to_serve(cfg: &FileConfig) -> Result<Vec<u32>, String> {
    let sim_devices = cfg
        .sim_devices
        .map_or(1, |c| c.0.min(u32::MAX as u64) as u32);
    let (count, what) = match cfg.backend.unwrap_or(Backend::Auto) {
        Backend::Sim => (sim_devices, "the simulator presents"),
        Backend::Cuda => (
            mps_driver::device_count().map_err(|e| format!("counting CUDA devices: {e}"))?,
            "the CUDA driver sees",
        ),
        Backend::Auto => match cuda::probe() {
            Ok(()) => (
                mps_driver::device_count().map_err(|e| format!("counting CUDA devices: {e}"))?,
                "the CUDA driver sees",
            ),
            Err(_) => (sim_devices, "the simulator presents (no usable GPU)"),
        },
    };
    let Some(asked) = &cfg.devices else {
        return Ok((0..count.min(mps_core::handshake::MAX_DEVICES)).collect());
    };
    let mut devices = asked.clone();
    devices.sort_unstable();
    devices.dedup();
    if devices.is_empty() {
        return Err("--devices (devices in the configuration) names no device".into());
    }
    if let Some(d) = devices.iter().find(|d| **d >= count) {
        return Err(format!(
            "--devices names device {d}, but {what} {count} device(s) (ordinals 0 to {})",
            count.saturating_sub(1)
        ));
    }
    Ok(devices)
}

/// Starts the daemon in the background (this binary again with -f, in a session of its own)
/// and waits until it answers.
fn spawn_background(pipe_dir: &std::path::Path) -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).filter(|a| a != "-d").collect();
    args.insert(0, "-f".into());
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        // Read only if it exits at start: its reason may come before it has a log (a directory
        // it refuses). Later, with no reader, its stderr writes fail and its log carries on.
        .stderr(std::process::Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let sock = pipe_dir.join(CONTROL_SOCKET);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut said = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut err, &mut said);
            }
            return Err(match said.trim().trim_start_matches("mps-control: ") {
                "" => format!("the daemon exited at start ({status}); see control.log"),
                said => format!("the daemon exited at start ({status}): {said}"),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err("the daemon did not start within 10 s; see control.log".into())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (config_path, required) = match args.config.clone().or_else(env_config) {
        Some(path) => (path, true),
        None => (PathBuf::from(config::DEFAULT_PATH), false),
    };
    // The daemon refuses a configuration it cannot read; the command client only looks in it
    // for the pipe directory, and goes on without it.
    let file = match FileConfig::read(&config_path, required) {
        Ok(file) => file.unwrap_or_default(),
        Err(e) if args.foreground || args.daemon => {
            eprintln!("mps-control: {}", e.message);
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("mps-control: {} (going on without it)", e.message);
            FileConfig::default()
        }
    };
    let pipe_dir = args
        .pipe_dir
        .clone()
        .or_else(|| env::setting_os("MPS_PIPE_DIRECTORY").map(PathBuf::from))
        .or_else(|| file.pipe_dir.clone())
        .unwrap_or_else(mps_ipc::socket::default_pipe_dir);
    let result = if args.foreground {
        run_daemon(&args, file, config_path)
    } else if args.daemon {
        spawn_background(&pipe_dir)
    } else {
        let lines: Vec<String> = if args.command.is_empty() {
            std::io::stdin()
                .lock()
                .lines()
                .map_while(|l| l.ok())
                .collect()
        } else {
            vec![args.command.join(" ")]
        };
        let mut failed = false;
        for line in lines.iter().filter(|l| !l.trim().is_empty()) {
            match send_command(&pipe_dir, line) {
                Ok(reply) => {
                    failed |= reply.starts_with("error:");
                    print!("{reply}");
                }
                Err(e) => {
                    eprintln!("mps-control: {}", e.message);
                    failed = true;
                }
            }
        }
        if failed { Err(String::new()) } else { Ok(()) }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("mps-control: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
