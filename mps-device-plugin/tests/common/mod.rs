//! A fake kubelet that speaks the real device plugin API: a `Registration` server on
//! `kubelet.sock` in a temporary directory, which records each registration, and the client
//! side with which a test connects back to a plugin's socket, as the kubelet does.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use mps_device_plugin::api::device_plugin_client::DevicePluginClient;
use mps_device_plugin::api::registration_server::{Registration, RegistrationServer};
use mps_device_plugin::api::{Empty, ListAndWatchResponse, RegisterRequest};
use mps_device_plugin::plugin::{self, Config, KUBELET_SOCKET, Node};
use mps_device_plugin::shares::{Gpu, GroupMode, Handout};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// Bounds every wait of a test, so that a plugin that never answers fails the test instead of
/// hanging it.
pub const WAIT: Duration = Duration::from_secs(30);

/// Awaits `f`, failing the test with `what` if it takes longer than [`WAIT`].
pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A fresh empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "mps-plugin-test-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Recorder(mpsc::UnboundedSender<RegisterRequest>);

#[tonic::async_trait]
impl Registration for Recorder {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        // The kubelet refuses versions it does not speak.
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument(format!(
                "version {} is not supported",
                r.version
            )));
        }
        let _ = self.0.send(r);
        Ok(Response::new(Empty {}))
    }
}

/// A kubelet's device plugin directory with a registration server in it.
pub struct FakeKubelet {
    pub dir: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub registrations: mpsc::UnboundedReceiver<RegisterRequest>,
    sender: mpsc::UnboundedSender<RegisterRequest>,
}

impl FakeKubelet {
    pub fn start(dir: &Path) -> FakeKubelet {
        let (sender, registrations) = mpsc::unbounded_channel();
        let mut k = FakeKubelet {
            dir: dir.to_path_buf(),
            stop: None,
            task: None,
            registrations,
            sender,
        };
        k.listen();
        k
    }

    fn listen(&mut self) {
        let listener = tokio::net::UnixListener::bind(self.dir.join(KUBELET_SOCKET)).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let service = RegistrationServer::new(Recorder(self.sender.clone()));
        self.task = Some(tokio::spawn(async move {
            tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(
                    service,
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async move {
                        let _ = rx.await;
                    },
                )
                .await
                .unwrap();
        }));
        self.stop = Some(tx);
    }

    /// What a kubelet restart does to the directory: the old kubelet goes, the new one removes
    /// every socket in it (the plugins' too) and makes a new `kubelet.sock`.
    pub async fn restart(&mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        self.task.take().unwrap().await.unwrap();
        for entry in std::fs::read_dir(&self.dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "sock") {
                std::fs::remove_file(path).unwrap();
            }
        }
        self.listen();
    }

    /// A kubelet restart that leaves the plugins' sockets in place: only `kubelet.sock` is
    /// new.
    pub async fn restart_keeping_plugin_sockets(&mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        self.task.take().unwrap().await.unwrap();
        std::fs::remove_file(self.dir.join(KUBELET_SOCKET)).unwrap();
        self.listen();
    }

    /// The next registration.
    pub async fn next_registration(&mut self) -> RegisterRequest {
        within("a registration", self.registrations.recv())
            .await
            .expect("the fake kubelet is running")
    }

    /// The two registrations of a plugin's resources, by resource name.
    pub async fn both_registrations(&mut self) -> Vec<RegisterRequest> {
        let mut r = vec![
            self.next_registration().await,
            self.next_registration().await,
        ];
        r.sort_by(|a, b| a.resource_name.cmp(&b.resource_name));
        r
    }

    /// A client of the plugin endpoint a registration named, as the kubelet connects back.
    pub async fn connect(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        let channel = within(
            "the plugin's socket",
            plugin::connect_unix(&self.dir.join(endpoint)),
        )
        .await
        .unwrap();
        DevicePluginClient::new(channel)
    }
}

/// Opens `ListAndWatch` on `client`.
pub async fn list_and_watch(
    client: &mut DevicePluginClient<Channel>,
) -> Streaming<ListAndWatchResponse> {
    within("ListAndWatch", client.list_and_watch(Empty {}))
        .await
        .unwrap()
        .into_inner()
}

/// The next list of devices a `ListAndWatch` stream sends.
pub async fn next_list(stream: &mut Streaming<ListAndWatchResponse>) -> ListAndWatchResponse {
    within("a device list", stream.message())
        .await
        .unwrap()
        .expect("the stream goes on")
}

/// A plugin running in this process for the GPUs `gpus` against the kubelet directory `dir`,
/// with the GPUs' health in the test's hands; stopped on drop.
pub struct TestPlugin {
    pub health: watch::Sender<Vec<bool>>,
    pub shutdown: watch::Sender<bool>,
    pub config: Config,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestPlugin {
    pub fn start(dir: &Path, gpus: Vec<Gpu>, handout: Handout) -> TestPlugin {
        let (health, health_rx) = watch::channel(vec![true; gpus.len()]);
        Self::start_with(dir, gpus, handout, health, health_rx)
    }

    pub fn start_with(
        dir: &Path,
        gpus: Vec<Gpu>,
        handout: Handout,
        health: watch::Sender<Vec<bool>>,
        health_rx: watch::Receiver<Vec<bool>>,
    ) -> TestPlugin {
        let (shutdown, shutdown_rx) = watch::channel(false);
        let config = Config {
            kubelet_dir: dir.to_path_buf(),
            domain: "mps-rs.github.io".into(),
            watch_interval: Duration::from_millis(20),
        };
        let node = Arc::new(Node::new(gpus, handout, health_rx));
        let task = tokio::spawn(plugin::run(config.clone(), node, shutdown_rx));
        TestPlugin {
            health,
            shutdown,
            config,
            task: Some(task),
        }
    }

    /// Stops the plugin and waits until it has.
    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        within("the plugin to stop", self.task.take().unwrap())
            .await
            .unwrap();
    }
}

impl Drop for TestPlugin {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// What containers are given, with host paths of the test's own.
pub fn handout(pipe_dir: &Path, cuda_lib_dir: Option<&Path>) -> Handout {
    Handout {
        pipe_dir: pipe_dir.to_path_buf(),
        container_pipe_dir: "/run/mps".into(),
        cuda_lib_dir: cuda_lib_dir.map(Path::to_path_buf),
        container_cuda_lib_dir: "/opt/mps/lib".into(),
        library_path_after: None,
        group: GroupMode::Own,
    }
}
