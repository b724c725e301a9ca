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
use mps_core::units::{parse_device_limit, parse_size};
use mps_ipc::env;
use mps_ipc::trust::TrustedDir;
use mps_server::backend::cuda;
use mps_server::control::{
    CONTROL_SOCKET, Command, DEFAULT_MAX_SERVERS_PER_USER, DEFAULT_MAX_SM_RESERVATION, Daemon,
    DaemonConfig, HelloLimits, send_command,
};
use mps_server::intake::DEFAULT_LIMITS;
use mps_server::process::{
    DEFAULT_LOG_MAX_BYTES, RotatingLog, STOP, init_logging_to, install_signal_handlers,
};
use mps_server::registry::Defaults;

/// The mps control daemon, and its command client.
#[derive(Debug, Parser)]
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
    /// Backend of the servers: auto, cuda or sim.
    #[arg(long, default_value = "auto")]
    backend: String,
    /// The devices to serve, as ordinals (e.g. 0,1) [default: every device the driver sees, or
    /// those --sim-devices makes]. Each (user, group, device) gets a server of its own.
    #[arg(long, value_delimiter = ',')]
    devices: Option<Vec<u32>>,
    /// How many devices the simulator presents (simulator only; with --backend auto, where
    /// no GPU is found).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=mps_core::handshake::MAX_DEVICES as i64))]
    sim_devices: u32,
    /// Simulated device memory of each server (simulator only).
    #[arg(long)]
    sim_memory: Option<String>,
    /// What a faulting kernel ends in the simulator (simulator only): `client`, its work, or
    /// `context`, as on a GPU, every client of its server (which a fresh server then replaces).
    #[arg(long, value_parser = ["client", "context"])]
    sim_fault_scope: Option<String>,
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
    /// (set_max_sm_reservation default).
    #[arg(long, default_value_t = DEFAULT_MAX_SM_RESERVATION, value_parser = clap::value_parser!(u32).range(0..=100))]
    max_sm_reservation: u32,
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
    /// descriptor, never a thread).
    #[arg(long, default_value_t = DEFAULT_LIMITS.max_pending, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_pending_hellos: usize,
    /// Milliseconds a new connection has for its whole hello before it is dropped.
    #[arg(long, default_value_t = DEFAULT_LIMITS.hello_timeout.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    hello_timeout_ms: u64,
    /// Servers one user may have running at once (one per group and device); a client of that
    /// user that would need one more is refused with the reason.
    #[arg(long, default_value_t = DEFAULT_MAX_SERVERS_PER_USER, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_servers_per_user: usize,
    /// Bytes control.log, and each server's log, grows to before it is renamed NAME.1
    /// (replacing the one before) and started afresh, e.g. 16MiB.
    #[arg(long, default_value_t = DEFAULT_LOG_MAX_BYTES, value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    log_max_bytes: u64,
    /// A command for the running daemon (without -d or -f).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn run_daemon(args: &Args, pipe_dir: PathBuf, log_dir: PathBuf) -> Result<(), String> {
    // The log directory and control.log are checked and made as the pipe directory's files are
    // (owned by this user or root, written by no one else, never through a link); the log is
    // readable by this user only.
    let log_mode = if nix::unistd::geteuid().is_root() {
        0o711
    } else {
        0o700
    };
    let log = TrustedDir::open(&log_dir, log_mode)
        .and_then(|d| RotatingLog::open(d, "control.log", args.log_max_bytes))
        .map_err(|e| e.message)?;
    init_logging_to(log);
    install_signal_handlers()?;
    let server_bin = args.server.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .map(|p| p.with_file_name("mps-server"))
            .unwrap_or_else(|_| PathBuf::from("mps-server"))
    });
    let mut server_args = vec!["--backend".to_string(), args.backend.clone()];
    if let Some(m) = &args.sim_memory {
        server_args.extend(["--sim-memory".to_string(), m.clone()]);
    }
    if let Some(scope) = &args.sim_fault_scope {
        server_args.extend(["--sim-fault-scope".to_string(), scope.clone()]);
    }
    server_args.extend([
        "--log-max-bytes".to_string(),
        args.log_max_bytes.to_string(),
    ]);
    server_args.extend(args.server_args.iter().cloned());
    if !args.server_args.is_empty() {
        check_server_args(&server_bin, &server_args)?;
    }
    let devices = devices_to_serve(args)?;
    let from_env = EnvDefaults::read(&devices)?;
    let daemon = Daemon::bind(DaemonConfig {
        pipe_dir: pipe_dir.clone(),
        devices: devices.clone(),
        log_dir,
        server_bin,
        server_args,
        defaults: Defaults {
            mem_limit: args.device_pinned_mem_limit.unwrap_or(0),
            priority: args.client_priority.or(from_env.priority).unwrap_or(0),
            sm_share: args
                .active_thread_percentage
                .or(from_env.sm_share)
                .unwrap_or(100),
            max_sm_reserve: args.max_sm_reservation,
        },
        standby: args.standby,
        hellos: HelloLimits {
            max_pending: args.max_pending_hellos,
            timeout: Duration::from_millis(args.hello_timeout_ms),
        },
        max_servers_per_user: args.max_servers_per_user,
    })
    .map_err(|e| e.to_string())?;
    tracing::info!(
        "mps-control listening in {}, serving devices {devices:?}",
        pipe_dir.display()
    );
    // The environment's memory limits are per device; a flag sets every device's.
    if args.device_pinned_mem_limit.is_none() {
        for (device, bytes) in from_env.mem_limits {
            daemon
                .answer(Command::SetDefaultDevicePinnedMemLimit { device, bytes })
                .map_err(|e| e.message)?;
        }
    }
    let daemon = Arc::new(daemon);
    if let Some(addr) = &args.metrics_listen {
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

/// Client defaults from the daemon's own environment, as NVIDIA's control daemon takes them:
/// mps's `MPS_*` names, else NVIDIA's `CUDA_MPS_*` ones. A flag on the command line wins over
/// both; a value that does not parse stops the daemon with the variable's name.
struct EnvDefaults {
    sm_share: Option<u32>,
    priority: Option<u32>,
    /// Device memory per client, for each served device the variable gives a limit for.
    mem_limits: Vec<(u32, u64)>,
}

impl EnvDefaults {
    fn read(devices: &[u32]) -> Result<EnvDefaults, String> {
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
        let mut mem_limits = Vec::new();
        if let Some((spec, var)) = env::setting("MPS_PINNED_DEVICE_MEM_LIMIT") {
            for &device in devices {
                let limit = parse_device_limit(&spec, device)
                    .map_err(|e| format!("{var}={spec}: {}", e.message))?;
                mem_limits.extend(limit.map(|bytes| (device, bytes)));
            }
        }
        Ok(EnvDefaults {
            sm_share: percent("MPS_ACTIVE_THREAD_PERCENTAGE", 1, 100)?,
            priority: percent("MPS_CLIENT_PRIORITY", 0, 1)?,
            mem_limits,
        })
    }
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
fn devices_to_serve(args: &Args) -> Result<Vec<u32>, String> {
    let (count, what) = match args.backend.as_str() {
        "sim" => (args.sim_devices, "the simulator presents"),
        "cuda" => (
            mps_driver::device_count().map_err(|e| format!("counting CUDA devices: {e}"))?,
            "the CUDA driver sees",
        ),
        _ => match cuda::probe() {
            Ok(()) => (
                mps_driver::device_count().map_err(|e| format!("counting CUDA devices: {e}"))?,
                "the CUDA driver sees",
            ),
            Err(_) => (args.sim_devices, "the simulator presents (no usable GPU)"),
        },
    };
    let Some(asked) = &args.devices else {
        return Ok((0..count.min(mps_core::handshake::MAX_DEVICES)).collect());
    };
    let mut devices = asked.clone();
    devices.sort_unstable();
    devices.dedup();
    if devices.is_empty() {
        return Err("--devices names no device".into());
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
    let pipe_dir = args
        .pipe_dir
        .clone()
        .unwrap_or_else(mps_ipc::socket::default_pipe_dir);
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(mps_ipc::trust::default_log_dir);
    let result = if args.foreground {
        run_daemon(&args, pipe_dir, log_dir)
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
