//! The kubelet's side of the plugin: a `DevicePlugin` service per resource, each on a socket
//! of its own in the kubelet's device plugin directory, registered through the kubelet's
//! `kubelet.sock`; and the watch that serves and registers again when the kubelet restarts
//! (a new kubelet removes the plugins' sockets and makes a new `kubelet.sock`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

use crate::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::api::registration_client::RegistrationClient;
use crate::api::{
    AllocateRequest, AllocateResponse, ContainerPreferredAllocationResponse, DevicePluginOptions,
    Empty, ListAndWatchResponse, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use crate::shares::{self, Gpu, Handout, Resource};

/// The API version the plugin speaks.
pub const API_VERSION: &str = "v1beta1";
/// How long a server's connections are given to end when it stops.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The kubelet's registration socket, in its device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// How the plugin meets the kubelet.
#[derive(Clone, Debug)]
pub struct Config {
    /// The kubelet's device plugin directory (`/var/lib/kubelet/device-plugins`).
    pub kubelet_dir: PathBuf,
    /// The domain of the resource names (`<domain>/gpu-memory`, `<domain>/gpu-sm`).
    pub domain: String,
    /// How often `kubelet.sock` and the plugin's sockets are looked at.
    pub watch_interval: Duration,
}

impl Config {
    /// The name the kubelet schedules `resource` by.
    pub fn resource_name(&self, resource: Resource) -> String {
        format!("{}/{}", self.domain, resource.name())
    }
}

/// What every resource's service shares: the GPUs, what a container gets, their health, and
/// the GPU of the latest allocation (where a container's units of the other resource are
/// preferred, so that both land on one GPU).
#[derive(Debug)]
pub struct Node {
    pub gpus: Vec<Gpu>,
    pub handout: Handout,
    pub health: watch::Receiver<Vec<bool>>,
    last_gpu: Mutex<Option<u32>>,
}

impl Node {
    /// `health` holds one entry per GPU of `gpus`, in order.
    pub fn new(gpus: Vec<Gpu>, handout: Handout, health: watch::Receiver<Vec<bool>>) -> Node {
        Node {
            gpus,
            handout,
            health,
            last_gpu: Mutex::new(None),
        }
    }
}

/// The `DevicePlugin` service of one resource.
#[derive(Debug)]
struct Service {
    resource: Resource,
    node: Arc<Node>,
    /// Set when this generation of servers stops (the kubelet restarted, or the plugin stops):
    /// the `ListAndWatch` streams then end, so that the server can shut down.
    stop: watch::Receiver<bool>,
}

type DeviceStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = DeviceStream;

    /// The devices at once, then again at every change of a GPU's health.
    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let (resource, node) = (self.resource, self.node.clone());
        let mut health = node.health.clone();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let list = {
                    let h = health.borrow_and_update();
                    shares::devices(resource, &node.gpus, &h)
                };
                if tx
                    .send(Ok(ListAndWatchResponse { devices: list }))
                    .await
                    .is_err()
                {
                    return; // the kubelet hung up
                }
                tokio::select! {
                    changed = health.changed() => if changed.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let hint = *self.node.last_gpu.lock().unwrap_or_else(|p| p.into_inner());
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| ContainerPreferredAllocationResponse {
                device_i_ds: shares::preferred(
                    self.resource,
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    usize::try_from(c.allocation_size).unwrap_or(0),
                    hint,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in &request.get_ref().container_requests {
            let a = shares::check(self.resource, &c.devices_ids, &self.node.gpus)
                .map_err(Status::invalid_argument)?;
            let response = self.node.handout.respond(&a);
            tracing::info!(
                "allocated {} {} of GPU {} (units {:?}): group {}",
                a.units.len(),
                self.resource.name(),
                a.gpu,
                a.units,
                response.envs["MPS_GROUP"]
            );
            *self.node.last_gpu.lock().unwrap_or_else(|p| p.into_inner()) = Some(a.gpu);
            container_responses.push(response);
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// A gRPC channel over the Unix socket at `path` (the kubelet's, or a plugin's).
pub async fn connect_unix(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    // The URI is required by the API and unused: the connector below makes every connection.
    Endpoint::from_static("http://[::]:0")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
}

/// Identity of a socket file, to tell a re-created one apart: its device and inode, and its
/// change time, since a file system may give a new file the inode of one just removed.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Serves every resource and registers it with the kubelet, again whenever the kubelet
/// restarts, until `shutdown` is set.
pub async fn run(config: Config, node: Arc<Node>, mut shutdown: watch::Receiver<bool>) {
    let kubelet = config.kubelet_dir.join(KUBELET_SOCKET);
    while !*shutdown.borrow() {
        // Wait for a kubelet.
        let Some(seen) = identity(&kubelet) else {
            tokio::select! {
                _ = tokio::time::sleep(config.watch_interval) => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
            continue;
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut servers = Vec::new();
        let mut ours = Vec::new();
        for resource in Resource::ALL {
            match serve(&config, resource, node.clone(), stop_rx.clone()) {
                Ok((path, task)) => {
                    ours.push(path);
                    servers.push(task);
                }
                Err(e) => tracing::error!("{e}"),
            }
        }
        let mut registered = ours.len() == Resource::ALL.len();
        for resource in Resource::ALL {
            if let Err(e) = register(&config, resource).await {
                tracing::error!("{e}");
                registered = false;
            }
        }
        if registered {
            tracing::info!(
                "registered {} and {} with the kubelet at {}",
                config.resource_name(Resource::Memory),
                config.resource_name(Resource::Sm),
                kubelet.display()
            );
        }
        // Watch: a new kubelet.sock is a restarted kubelet, which has removed our sockets
        // (or will not know them); a socket of ours gone is the same. Either way, serve anew.
        // A failed registration is tried again after a while.
        let mut tries = 0u32;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(config.watch_interval) => {}
                _ = shutdown.wait_for(|s| *s) => break,
            }
            if identity(&kubelet) != Some(seen) {
                tracing::info!(
                    "the kubelet restarted ({} is new): registering again",
                    kubelet.display()
                );
                break;
            }
            if ours.iter().any(|p| !p.exists()) {
                tracing::info!("a socket of the plugin was removed: serving and registering again");
                break;
            }
            tries += 1;
            if !registered && tries >= 10 {
                break;
            }
        }
        let _ = stop_tx.send(true);
        for mut task in servers {
            // A server ends once its connections have: a kubelet that keeps one open is not
            // waited for long.
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
        for path in &ours {
            // Only a socket that is still ours: a new kubelet may have cleaned the directory.
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds `resource`'s socket (replacing a stale one) and serves it until `stop` is set.
fn serve(
    config: &Config,
    resource: Resource,
    node: Arc<Node>,
    mut stop: watch::Receiver<bool>,
) -> Result<(PathBuf, tokio::task::JoinHandle<()>), String> {
    let path = config.kubelet_dir.join(resource.socket());
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    let service = Service {
        resource,
        node,
        stop: stop.clone(),
    };
    let shown = path.display().to_string();
    let task = tokio::spawn(async move {
        let served = Server::builder()
            .serve_with_incoming_shutdown(
                DevicePluginServer::new(service),
                UnixListenerStream::new(listener),
                async move {
                    let _ = stop.wait_for(|s| *s).await;
                },
            )
            .await;
        if let Err(e) = served {
            tracing::error!("serving {shown}: {e}");
        }
    });
    Ok((path, task))
}

/// Registers `resource` with the kubelet.
async fn register(config: &Config, resource: Resource) -> Result<(), String> {
    let kubelet = config.kubelet_dir.join(KUBELET_SOCKET);
    let name = config.resource_name(resource);
    let fail = |e: &dyn std::fmt::Display| {
        format!(
            "registering {name} with the kubelet at {}: {e}",
            kubelet.display()
        )
    };
    let channel = connect_unix(&kubelet).await.map_err(|e| fail(&e))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: resource.socket(),
            resource_name: name.clone(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|e| fail(&e.message()))?;
    Ok(())
}

/// Polls the daemon's health of `gpus` every `interval` into `health`, logging each change,
/// until `shutdown` is set.
pub async fn poll_health(
    daemon: crate::daemon::Daemon,
    gpus: Vec<u32>,
    interval: Duration,
    health: watch::Sender<Vec<bool>>,
    mut shutdown: watch::Receiver<bool>,
) {
    while !*shutdown.borrow() {
        let (d, g) = (daemon.clone(), gpus.clone());
        let now = tokio::task::spawn_blocking(move || d.health(&g))
            .await
            .unwrap_or_else(|_| vec![false; gpus.len()]);
        health.send_if_modified(|old| {
            if *old == now {
                return false;
            }
            for (i, (&gpu, &up)) in gpus.iter().zip(&now).enumerate() {
                if old.get(i) != Some(&up) {
                    if up {
                        tracing::info!("GPU {gpu}: the mps daemon serves it: healthy");
                    } else {
                        tracing::warn!(
                            "GPU {gpu}: the mps daemon does not answer, does not serve it, or \
                             has only failed servers on it: unhealthy"
                        );
                    }
                }
            }
            *old = now;
            true
        });
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
    }
}

/// Stops the servers of containers' groups (`prefix`) that have served no client for `grace`,
/// looking every `interval`, until `shutdown` is set: each holds a device context, and the
/// groups of departed containers are never used again but by a later container that happens
/// to hold the same unit (which then gets a fresh server, as any first client does).
pub async fn reap_idle_servers(
    daemon: crate::daemon::Daemon,
    prefix: String,
    interval: Duration,
    grace: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut since = std::collections::HashMap::new();
    while !*shutdown.borrow() {
        let (d, p) = (daemon.clone(), prefix.clone());
        let idle = tokio::task::spawn_blocking(move || {
            d.command("status")
                .map(|s| crate::daemon::idle_servers(&s, &p))
        })
        .await;
        if let Ok(Ok(idle)) = idle {
            let now = std::time::Instant::now();
            for pid in crate::daemon::due_for_reaping(&mut since, &idle, now, grace) {
                let d = daemon.clone();
                let done = tokio::task::spawn_blocking(move || {
                    d.command(&format!("shutdown_server {pid}"))
                })
                .await;
                match done {
                    Ok(Ok(_)) => tracing::info!(
                        "stopped server {pid}: its container's group has had no client for {} s",
                        grace.as_secs()
                    ),
                    Ok(Err(e)) => tracing::warn!("{e}"),
                    Err(e) => tracing::warn!("stopping server {pid}: {e}"),
                }
                since.remove(&pid);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait_for(|s| *s) => {}
        }
    }
}
