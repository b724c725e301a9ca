//! `mps-device-plugin`: the Kubernetes device plugin of mps (docs/KUBERNETES.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mps_device_plugin::daemon::Daemon;
use mps_device_plugin::plugin::{self, Config, Node};
use mps_device_plugin::shares::{GroupMode, Handout};
use tokio::sync::watch;

/// Advertises shares of the GPUs that the node's mps daemon serves to the kubelet, as device
/// memory in GiB (<domain>/gpu-memory) and SM share in percent (<domain>/gpu-sm), and gives
/// every container that asks for them the daemon's pipe directory, mps's CUDA library and a
/// server group held to what it asked for.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The mps daemon's pipe directory on the node.
    #[arg(long, default_value = "/run/mps")]
    pipe_dir: PathBuf,
    /// Where containers see the pipe directory (their MPS_PIPE_DIRECTORY).
    #[arg(long, default_value = "/run/mps")]
    container_pipe_dir: PathBuf,
    /// The directory on the node that holds mps's libcuda.so.1 (of the mps-cuda crate).
    #[arg(long, default_value = "/usr/lib/mps")]
    cuda_lib_dir: PathBuf,
    /// Where containers see that directory (their LD_LIBRARY_PATH).
    #[arg(long, default_value = "/opt/mps/lib")]
    container_cuda_lib_dir: PathBuf,
    /// Directories (`:`-separated) that containers' LD_LIBRARY_PATH lists after mps's
    /// library: the plugin's value replaces an image's own, so name here what your images'
    /// LD_LIBRARY_PATH holds.
    #[arg(long, value_name = "DIRS")]
    library_path_after: Option<String>,
    /// Give containers no CUDA library (programs linked with libmpsclient need none).
    #[arg(long)]
    no_cuda_library: bool,
    /// Put every container in this one server group instead of a group of its own: their
    /// kernels then share one context and run concurrently, and share its faults.
    #[arg(long, value_name = "GROUP")]
    shared_group: Option<String>,
    /// The kubelet's device plugin directory.
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    kubelet_dir: PathBuf,
    /// The domain of the resource names.
    #[arg(long, default_value = "mps-rs.github.io")]
    resource_domain: String,
    /// GiB of each GPU not offered (each group's server holds a device context of its own,
    /// outside every client's limit).
    #[arg(long, default_value_t = 0)]
    reserve_gib: u32,
    /// GiB offered of each GPU, instead of its memory as the daemon reports it.
    #[arg(long)]
    memory_gib: Option<u32>,
    /// How often the daemon's health is asked, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    health_interval_ms: u64,
    /// Stop the server of a container's group once it has had no client for this many seconds
    /// (0: never); each holds a device context. Not for --shared-group.
    #[arg(long, default_value_t = 60)]
    reap_idle_s: u64,
    /// How often the kubelet's socket is looked at, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    watch_interval_ms: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MPS_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        // Nothing here reads it, but a plugin started with it was probably meant to offer
        // only some GPUs: the daemon's --devices says which it serves.
        tracing::warn!(
            "CUDA_VISIBLE_DEVICES is ignored: the plugin offers every GPU the daemon serves"
        );
    }
    let group = match &args.shared_group {
        None => GroupMode::Own,
        Some(g) => match mps_core::handshake::check_group(g) {
            Ok(()) => GroupMode::Shared(g.clone()),
            Err(e) => {
                eprintln!("mps-device-plugin: --shared-group: {}", e.message);
                return ExitCode::from(2);
            }
        },
    };
    let cuda_lib_dir = (!args.no_cuda_library).then(|| args.cuda_lib_dir.clone());
    if let Some(dir) = &cuda_lib_dir
        && !dir.join("libcuda.so.1").exists()
    {
        eprintln!(
            "mps-device-plugin: {} holds no libcuda.so.1 of mps; pass --cuda-lib-dir with the \
             directory that does, or --no-cuda-library for programs linked with libmpsclient",
            dir.display()
        );
        return ExitCode::from(2);
    }
    let daemon = Daemon::new(&args.pipe_dir);
    let gpus = match daemon.inventory(args.memory_gib, args.reserve_gib) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("mps-device-plugin: {e}");
            return ExitCode::FAILURE;
        }
    };
    for g in &gpus {
        tracing::info!(
            "GPU {}: offering {} GiB and 100% of its SMs",
            g.ordinal,
            g.memory_units
        );
    }
    let handout = Handout {
        pipe_dir: args.pipe_dir.clone(),
        container_pipe_dir: args.container_pipe_dir.clone(),
        cuda_lib_dir,
        container_cuda_lib_dir: args.container_cuda_lib_dir.clone(),
        library_path_after: args.library_path_after.clone(),
        group,
    };
    let config = Config {
        kubelet_dir: args.kubelet_dir.clone(),
        domain: args.resource_domain.clone(),
        watch_interval: Duration::from_millis(args.watch_interval_ms),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mps-device-plugin: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let (shutdown_tx, shutdown) = watch::channel(false);
        let (health_tx, health) = watch::channel(Vec::new());
        let ordinals = gpus.iter().map(|g| g.ordinal).collect();
        let node = Arc::new(Node::new(gpus, handout, health));
        let poll = tokio::spawn(plugin::poll_health(
            daemon.clone(),
            ordinals,
            Duration::from_millis(args.health_interval_ms),
            health_tx,
            shutdown.clone(),
        ));
        let reap = (args.reap_idle_s > 0 && args.shared_group.is_none()).then(|| {
            tokio::spawn(plugin::reap_idle_servers(
                daemon.clone(),
                mps_device_plugin::shares::GROUP_PREFIX.into(),
                Duration::from_secs(5),
                Duration::from_secs(args.reap_idle_s),
                shutdown.clone(),
            ))
        });
        let serve = tokio::spawn(plugin::run(config, node, shutdown));
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler can be installed");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("stopping");
        let _ = shutdown_tx.send(true);
        let _ = serve.await;
        let _ = poll.await;
        if let Some(reap) = reap {
            let _ = reap.await;
        }
    });
    ExitCode::SUCCESS
}
