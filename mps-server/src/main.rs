//! `mps-server`: serves clients in the foreground.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clap::{Parser, ValueEnum};
use mps_core::units::parse_size;
use mps_ipc::channel::Layout;
use mps_ipc::trust;
use mps_server::backend::Backend;
use mps_server::backend::cuda::{self, CudaBackend};
use mps_server::backend::sim::{FaultScope, SimBackend, SimConfig};
use mps_server::intake::{DEFAULT_LIMITS, Limits};
use mps_server::process::{
    DEFAULT_LOG_MAX_BYTES, RotatingLog, STOP, init_logging_to, install_signal_handlers,
};
use mps_server::recovery::{self, Successor};
use mps_server::server::{Server, ServerConfig};
use mps_server::{BatchPacing, Limits as ClientLimits};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendChoice {
    /// CUDA where a device exists, else the simulator.
    Auto,
    /// A CUDA device.
    Cuda,
    /// The CPU simulator.
    Sim,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum FaultScopeChoice {
    /// The faulting client's work only.
    Client,
    /// Every client of the server, as on a GPU.
    Context,
}

/// Serves mps clients in the foreground: one device context shared by every client process.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Directory of the socket clients connect to, created with mode 0700 if missing; one that
    /// another user owns or can write is refused [default: $MPS_PIPE_DIRECTORY; else, except
    /// for root, $XDG_RUNTIME_DIR/mps when set; else /tmp/mps]
    #[arg(long)]
    pipe_dir: Option<PathBuf>,
    /// Directory of the log, under the same rules [default: $MPS_LOG_DIRECTORY; else, except
    /// for root, $XDG_RUNTIME_DIR/mps-log when set; else /tmp/mps-log]
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// Which device to serve.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendChoice,
    /// Simulated device memory (simulator only), e.g. 4GiB.
    #[arg(long, default_value = "4GiB", value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    sim_memory: u64,
    /// Simulated SMs (simulator only).
    #[arg(long, default_value_t = 16)]
    sim_sm_count: u32,
    /// What a faulting kernel ends in the simulator (simulator only): the faulting client's work,
    /// or, modelling a GPU, the whole context and so every client of the server, which is then
    /// replaced by a fresh one.
    #[arg(long, value_enum, default_value = "client")]
    sim_fault_scope: FaultScopeChoice,
    /// Microseconds each host-to-device copy takes before its bytes land (simulator only; 0
    /// by default): widens the window a copy is in flight, for tests of what waits for it.
    #[arg(long, default_value_t = 0)]
    sim_copy_latency_us: u64,
    /// Seconds a server whose device context failed waits for its clients to leave before it
    /// exits (a fresh server takes new clients meanwhile).
    #[arg(long, default_value_t = 60)]
    drain_timeout_s: u64,
    /// A listening socket handed over by a server whose context failed (set by that server).
    #[arg(long)]
    listen_fd: Option<i32>,
    /// Keeps a standby server beside this one, its device context made in advance, which
    /// takes the listening socket at once if this server's context fails (instead of a fresh
    /// server making its context then). It costs a second context on the device. Standalone
    /// servers only: under mps-control, the daemon's --standby does this.
    #[arg(long, conflicts_with = "handoff_fd")]
    standby: bool,
    /// The pipe a standby server waits on for its go (set by the server it stands by for, or
    /// by mps-control).
    #[arg(long)]
    standby_fd: Option<i32>,
    /// Session workers per client priority, each serving several clients' rings (default: four
    /// per CPU); 0 serves each client on a thread of its own.
    #[arg(long)]
    session_workers: Option<usize>,
    /// On a GPU, a client whose kernels may use the whole device gets a green context of its
    /// own over every SM for its streams, so that the driver's work for launches into one
    /// context does not serialise different clients' launches (off: the primary context's
    /// streams serve them all; see docs/OPERATE.md).
    #[arg(long, value_enum, default_value = "off")]
    context_per_client: Switch,
    /// On a GPU: once a stream capture's start or a graph's instantiation has waited 200 µs for
    /// the driver's lock, the server's other driver calls wait for it (1 ms at most each
    /// time), so that many busy clients cannot hold it off for seconds (see docs/OPERATE.md).
    #[arg(long, value_enum, default_value = "off")]
    driver_writer_priority: Switch,
    /// Microseconds a session worker spins for new commands before it yields.
    #[arg(long, default_value_t = 20)]
    spin_us: u64,
    /// Microseconds it then keeps looking between yields of the processor before it sleeps.
    #[arg(long, default_value_t = 500)]
    yield_us: u64,
    /// Device memory each client may hold, e.g. 2GiB (0: no limit). A client can lower its own
    /// limit with MPS_PINNED_DEVICE_MEM_LIMIT.
    #[arg(long, default_value = "0", value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    mem_limit: u64,
    /// Priority of new clients: 0 normal, 1 below normal. A client can lower its own with
    /// MPS_CLIENT_PRIORITY.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1))]
    client_priority: u32,
    /// Share of the device's SMs each client's kernels may use, percent (green contexts on a
    /// GPU). A client can lower its own with MPS_ACTIVE_THREAD_PERCENTAGE.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100))]
    active_thread_percentage: u32,
    /// Ceiling on the SMs this server's clients may reserve for themselves in all
    /// (MPS_SM_RESERVE), percent.
    #[arg(long, default_value_t = mps_server::control::DEFAULT_MAX_SM_RESERVATION, value_parser = clap::value_parser!(u32).range(0..=100))]
    max_sm_reservation: u32,
    /// Device memory all this server's clients may hold together, e.g. 40GiB (0: no limit);
    /// mps-control sets it to the group's device_mem_limit.
    #[arg(long, default_value = "0", value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    max_device_bytes: u64,
    /// The part of the device's SMs every client of this server runs within, as FROM-TO
    /// percent (e.g. 25-100; mps-control sets it for a group's share or reservation). Shares
    /// and reservations of clients are then percentages of that part.
    #[arg(long, default_value = "0-100", value_parser = parse_sm_range)]
    sm_range: (u32, u32),
    /// Name of the log file in the log directory (mode 0600, never opened through a link).
    #[arg(long, default_value = "server.log")]
    log_name: String,
    /// Bytes the log grows to before it is renamed NAME.1 (replacing the one before) and
    /// started afresh, e.g. 16MiB.
    #[arg(long, default_value_t = DEFAULT_LOG_MAX_BYTES, value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    log_max_bytes: u64,
    /// A socket inherited from mps-control, on which it hands over clients (set by the daemon).
    #[arg(long)]
    handoff_fd: Option<i32>,
    /// Device ordinal to serve (the simulator names its device after it); clients asking for
    /// another device are refused.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..mps_core::handshake::MAX_DEVICES as i64))]
    device: u32,
    /// Staging area per client for pageable copies and module images, e.g. 4MiB.
    #[arg(long, default_value = "4MiB", value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    staging: u64,
    /// Connections this server admits in all (waiting for their hello or served); more are
    /// refused with a message naming this limit.
    #[arg(long, default_value_t = DEFAULT_LIMITS.max_clients, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_clients: usize,
    /// Connections one user (uid) may hold, so that one user cannot take every place.
    #[arg(long, default_value_t = DEFAULT_LIMITS.max_clients_per_user, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_clients_per_user: usize,
    /// Connections that may wait for their hello at once; beyond it the one that has waited
    /// longest is dropped.
    #[arg(long, default_value_t = DEFAULT_LIMITS.max_pending, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_pending_hellos: usize,
    /// Milliseconds a new connection has for its whole hello before it is dropped.
    #[arg(long, default_value_t = DEFAULT_LIMITS.hello_timeout.as_millis() as u64, value_parser = clap::value_parser!(u64).range(1..))]
    hello_timeout_ms: u64,
    /// Checks the options (the limits against the protocol's ceilings included) and exits
    /// without serving: 0 when a server would start with them. mps-control checks its
    /// --server-arg words this way when it starts.
    #[arg(long)]
    check_options: bool,
    #[command(flatten)]
    client: ClientLimitArgs,
}

/// What one client may hold; a request past a limit is refused with MPS_ERROR_QUOTA_EXCEEDED
/// and a message naming the limit. The defaults are `session::Limits::default()`.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Limits per client")]
struct ClientLimitArgs {
    /// Streams a client may create besides its default stream (each a thread of the
    /// simulator, a driver stream on a GPU); at most 255.
    #[arg(long, default_value_t = ClientLimits::default().max_streams)]
    max_streams: usize,
    /// Events a client may hold.
    #[arg(long, default_value_t = ClientLimits::default().max_events)]
    max_events: usize,
    /// Modules a client may hold loaded.
    #[arg(long, default_value_t = ClientLimits::default().max_modules)]
    max_modules: usize,
    /// Kernel handles a client may hold.
    #[arg(long, default_value_t = ClientLimits::default().max_functions)]
    max_functions: usize,
    /// Host buffers (mps_host_alloc) a client may hold.
    #[arg(long, default_value_t = ClientLimits::default().max_host_buffers)]
    max_host_buffers: usize,
    /// Bytes of all of a client's host buffers together, e.g. 4GiB: each is that much of the
    /// machine's memory. Default: a quarter of the machine's memory (or its memory cgroup's).
    #[arg(long, default_value_t = ClientLimits::default().max_host_bytes, value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    max_host_bytes: u64,
    /// Bytes of the host buffers of all of one user's clients together. Default: half of the
    /// machine's memory (or its memory cgroup's).
    #[arg(long, default_value_t = ClientLimits::default().max_user_host_bytes, value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    max_user_host_bytes: u64,
    /// Device memory of all of one user's clients together, e.g. 8GiB, counted as allocations
    /// take it (0: none); each process is held to --mem-limit as well.
    #[arg(long, default_value = "0", value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    max_user_device_bytes: u64,
    /// Device allocations a client may hold.
    #[arg(long, default_value_t = ClientLimits::default().max_allocations)]
    max_allocations: usize,
    /// Bytes of one module image, e.g. 256MiB (held by the server while it is uploaded); at
    /// most 256MiB.
    #[arg(long, default_value = "256MiB", value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    max_module_bytes: u64,
    /// Kernel entries of one PTX module.
    #[arg(long, default_value_t = ClientLimits::default().max_module_entries)]
    max_module_entries: usize,
    /// Captured graphs a client may hold, and executable graphs (each counted on its own).
    #[arg(long, default_value_t = ClientLimits::default().max_graphs)]
    max_graphs: usize,
    /// Commands one stream capture may record (each a node of the graph).
    #[arg(long, default_value_t = ClientLimits::default().max_graph_commands)]
    max_graph_commands: usize,
    /// Launch batching: a client's run of copies, memsets and launches on one stream that
    /// repeats an earlier run's work is launched as one cached CUDA graph, its kernels given
    /// the run's own parameters (see docs/OPERATE.md).
    #[arg(long, value_enum, default_value = "on")]
    launch_batching: Switch,
    /// Run shapes the launch batching caches per client (each with its executable graph).
    #[arg(long, default_value_t = ClientLimits::default().max_batch_entries)]
    max_batch_entries: usize,
    /// Bytes of run shapes the launch batching caches per client, e.g. 1MiB (also the most one
    /// run may hold).
    #[arg(long, default_value = "1MiB", value_parser = |s: &str| parse_size(s).map_err(|e| e.message))]
    max_batch_bytes: u64,
    /// Commands after which a batched run ends as if a terminator followed, 2 to 256: a long
    /// request then goes to the device in pieces of this many, each launched as soon as it is
    /// whole (of 32 at most while a client posts slowly and its runs are held on contended
    /// CPUs).
    #[arg(long, default_value_t = ClientLimits::default().max_batch_run)]
    max_batch_run: usize,
    /// Microseconds commands held for a batched run wait for the client's next command once
    /// its ring is empty, before they are submitted one by one (a run the client waits for
    /// ends at once, with its synchronise; the session worker sleeps while it holds).
    #[arg(long, default_value_t = ClientLimits::default().batch_hold_us)]
    batch_hold_us: u64,
    /// On: launch batching holds the runs of a client that posts its commands slowly (a Python
    /// program's launches), the bursts inside them included, only while threads wait for the
    /// machine's CPUs; off: whatever the CPUs' load. The runs of a client that posts in bursts
    /// are held either way (see docs/OPERATE.md).
    #[arg(long, value_enum, default_value = "on")]
    batch_pacing: Switch,
}

/// Reads `--sm-range`: FROM-TO, whole percentages with FROM below TO.
fn parse_sm_range(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{s:?}: give FROM-TO, percentages of the device's SMs, e.g. 25-100");
    let (from, to) = s.split_once('-').ok_or_else(bad)?;
    let (from, to): (u32, u32) = (
        from.trim().parse().map_err(|_| bad())?,
        to.trim().parse().map_err(|_| bad())?,
    );
    if from >= to || to > 100 {
        return Err(bad());
    }
    Ok((from, to))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

impl ClientLimitArgs {
    fn limits(&self) -> ClientLimits {
        ClientLimits {
            max_streams: self.max_streams,
            max_events: self.max_events,
            max_modules: self.max_modules,
            max_functions: self.max_functions,
            max_host_buffers: self.max_host_buffers,
            max_host_bytes: self.max_host_bytes,
            max_user_host_bytes: self.max_user_host_bytes,
            max_user_device_bytes: self.max_user_device_bytes,
            max_allocations: self.max_allocations,
            max_module_bytes: self.max_module_bytes,
            max_module_entries: self.max_module_entries,
            max_graphs: self.max_graphs,
            max_graph_commands: self.max_graph_commands,
            launch_batching: self.launch_batching == Switch::On,
            max_batch_entries: self.max_batch_entries,
            max_batch_bytes: self.max_batch_bytes,
            max_batch_run: self.max_batch_run,
            batch_hold_us: self.batch_hold_us,
            batch_pacing: match self.batch_pacing {
                Switch::On => BatchPacing::CpuLoad,
                Switch::Off => BatchPacing::Off,
            },
        }
    }
}

fn serve<B: Backend>(
    backend: B,
    cfg: ServerConfig,
    args: &Args,
    handoff: Option<&UnixStream>,
) -> Result<(), String> {
    if let Some(fd) = args.standby_fd {
        if args.listen_fd.is_none() && args.handoff_fd.is_none() {
            return Err(
                "--standby-fd is given by the server a standby stands by for (with --listen-fd) \
                 or by mps-control (with --handoff-fd); do not pass it by hand"
                    .into(),
            );
        }
        tracing::info!("standing by, the device context made, until the server before fails");
        match recovery::wait_for_go(fd, &STOP).map_err(|e| e.to_string())? {
            recovery::Go::Serve => tracing::info!("the server before failed; serving"),
            recovery::Go::Exit => {
                tracing::info!("the server this one stood by for stopped; stopping");
                return Ok(());
            }
        }
    }
    let backend = Arc::new(backend);
    let server = match args.listen_fd {
        Some(fd) => recovery::inherited_listener(fd).and_then(|l| Server::adopt(backend, cfg, l)),
        None => Server::bind(backend, cfg),
    }
    .map_err(|e| e.to_string())?;
    match args.listen_fd {
        Some(_) => tracing::info!(
            "listening on {} (handed over by the server whose context failed)",
            server.socket_path().display()
        ),
        None => tracing::info!("listening on {}", server.socket_path().display()),
    }
    let handoff = handoff
        .map(UnixStream::try_clone)
        .transpose()
        .map_err(|e| format!("cannot keep the daemon's socket: {e}"))?;
    // After a fault, the daemon starts the fresh server; without one, this program does.
    let successor = match &handoff {
        Some(h) => h
            .try_clone()
            .map(Successor::Daemon)
            .map_err(|e| format!("cannot keep the daemon's socket: {e}"))?,
        None => Successor::this_process(args.standby).map_err(|e| e.to_string())?,
    };
    server
        .recovery()
        .start(successor)
        .map_err(|e| e.to_string())?;
    std::thread::scope(|s| {
        let mut unblock = None;
        if let Some(h) = handoff {
            unblock = h.try_clone().ok();
            let server = &server;
            std::thread::Builder::new()
                .name("handoff".into())
                .spawn_scoped(s, move || {
                    server.serve_handoffs(h, &STOP);
                    // Without its daemon, a server stops: the daemon's quit ends every server.
                    STOP.store(true, Ordering::SeqCst);
                })
                .map_err(|e| format!("cannot start the thread that serves the daemon: {e}"))?;
        }
        let result = server.run(&STOP).map_err(|e| e.to_string());
        // After a fault: the clients of the failed context are told until they leave.
        server
            .recovery()
            .drain(&STOP, std::time::Duration::from_secs(args.drain_timeout_s));
        // Stopped by a signal: wake the handoff thread from its read.
        if let Some(u) = unblock {
            let _ = u.shutdown(std::net::Shutdown::Both);
        }
        result
    })?;
    tracing::info!("stopping");
    Ok(())
}

fn start_cuda(args: &Args, cfg: ServerConfig, handoff: Option<&UnixStream>) -> Result<(), String> {
    let backend = CudaBackend::new(args.device as i32, args.context_per_client == Switch::On)
        .map_err(|e| e.to_string())?;
    let info = backend.info();
    tracing::info!(
        "backend: CUDA device {} ({}, {} SMs, compute capability {}.{}, {} bytes)",
        args.device,
        info.name,
        info.sm_count,
        info.cc.0,
        info.cc.1,
        info.total_mem
    );
    cuda::prioritise_driver_writers(args.driver_writer_priority == Switch::On);
    if args.context_per_client == Switch::On {
        tracing::info!(
            "each client on the whole device gets a green context of its own over every SM \
             (--context-per-client on)"
        );
    }
    serve(backend, cfg, args, handoff)
}

fn start_sim(args: &Args, cfg: ServerConfig, handoff: Option<&UnixStream>) -> Result<(), String> {
    let sim = SimConfig {
        memory_bytes: args.sim_memory,
        sm_count: args.sim_sm_count,
        fault_scope: match args.sim_fault_scope {
            FaultScopeChoice::Client => FaultScope::Client,
            FaultScopeChoice::Context => FaultScope::Context,
        },
        copy_latency: std::time::Duration::from_micros(args.sim_copy_latency_us),
    };
    let backend = SimBackend::new(sim)
        .map_err(|e| e.to_string())?
        .as_device(args.device);
    tracing::info!(
        "backend: simulator device {}, {} bytes of device memory, {} SMs, a kernel fault ends {}",
        args.device,
        sim.memory_bytes,
        sim.sm_count,
        match sim.fault_scope {
            FaultScope::Client => "the faulting client's work",
            FaultScope::Context => "the context (as on a GPU)",
        }
    );
    serve(backend, cfg, args, handoff)
}

/// Logs to stderr and appends to `dir/name`, at the level `MPS_LOG` names (default info). The
/// directory is created with mode 0700 (or refused if another user owns or can write it); the
/// file is opened without following a link, must be this user's, and is kept at mode 0600:
/// the log names every client's pid and uid.
fn init_logging(dir: &Path, name: &str, max_bytes: u64) -> Result<(), String> {
    let dir = trust::TrustedDir::open(dir, 0o700)
        .map_err(|e| format!("the log directory: {}", e.message))?;
    init_logging_to(RotatingLog::open(dir, name, max_bytes).map_err(|e| e.message)?);
    Ok(())
}

/// Streams share CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by default); with fewer queues
/// than busy streams, independent streams falsely serialise. It must be set before the context
/// is created.
const MAX_CONNECTIONS: &str = "32";

fn main() -> std::process::ExitCode {
    if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
        // SAFETY: nothing else runs yet: main has started no thread.
        unsafe { std::env::set_var("CUDA_DEVICE_MAX_CONNECTIONS", MAX_CONNECTIONS) };
    }
    let args = Args::parse();
    let client_limits = args.client.limits();
    if let Err(e) = client_limits.check() {
        eprintln!("mps-server: {}", e.message);
        return std::process::ExitCode::FAILURE;
    }
    if args.check_options {
        return std::process::ExitCode::SUCCESS;
    }
    let handoff = args.handoff_fd.map(|fd| {
        use std::os::fd::FromRawFd;
        // SAFETY: the control daemon started us with this descriptor open for us alone (see
        // mps-control); nothing else in this process owns it.
        unsafe { UnixStream::from_raw_fd(fd) }
    });
    // A server the daemon started tells it, and the clients it was handed, why it stops.
    let cannot_start = |why: &str| {
        if let Some(h) = &handoff {
            mps_server::control::refuse_handoffs(h, why);
        }
        std::process::ExitCode::FAILURE
    };
    let log_dir = args.log_dir.clone().unwrap_or_else(trust::default_log_dir);
    if let Err(e) = init_logging(&log_dir, &args.log_name, args.log_max_bytes) {
        eprintln!("mps-server: {e}");
        return cannot_start(&e);
    }
    if let Err(e) = install_signal_handlers() {
        tracing::error!("cannot install signal handlers: {e}");
        return cannot_start(&e);
    }
    let layout = Layout {
        staging_bytes: args.staging as usize,
        ..Layout::default()
    };
    let cfg = ServerConfig {
        pipe_dir: args
            .pipe_dir
            .clone()
            .unwrap_or_else(mps_ipc::socket::default_pipe_dir),
        layout,
        session_workers: args
            .session_workers
            .unwrap_or_else(ServerConfig::default_session_workers),
        spin: std::time::Duration::from_micros(args.spin_us),
        yield_for: std::time::Duration::from_micros(args.yield_us),
        mem_limit: args.mem_limit,
        client_priority: args.client_priority,
        sm_share: args.active_thread_percentage,
        max_sm_reserve: args.max_sm_reservation,
        limits: Limits {
            max_clients: args.max_clients,
            max_clients_per_user: args.max_clients_per_user,
            max_pending: args.max_pending_hellos,
            hello_timeout: std::time::Duration::from_millis(args.hello_timeout_ms),
        },
        client_limits,
        device: args.device,
        max_device_bytes: args.max_device_bytes,
        sm_range: args.sm_range,
    };
    let result = match args.backend {
        BackendChoice::Cuda => start_cuda(&args, cfg, handoff.as_ref()),
        BackendChoice::Sim => start_sim(&args, cfg, handoff.as_ref()),
        BackendChoice::Auto => match cuda::probe() {
            Ok(()) => start_cuda(&args, cfg, handoff.as_ref()),
            Err(why) => {
                tracing::info!("backend auto: no usable GPU ({why}); using the simulator");
                start_sim(&args, cfg, handoff.as_ref())
            }
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            cannot_start(&e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size flags' defaults are written as text: they must be the session's defaults.
    #[test]
    fn client_limit_flags_default_to_the_session_defaults() {
        let args = Args::try_parse_from(["mps-server"]).unwrap();
        assert_eq!(args.client.limits(), ClientLimits::default());
    }

    #[test]
    fn client_limit_flags_reach_the_limits() {
        let args = Args::try_parse_from([
            "mps-server",
            "--max-streams",
            "2",
            "--max-host-bytes",
            "1GiB",
        ])
        .unwrap();
        let limits = args.client.limits();
        assert_eq!((limits.max_streams, limits.max_host_bytes), (2, 1 << 30));
    }
}
