//! The daemon's configuration file: TOML, `/etc/mps/mps.toml` unless `--config` or
//! `MPS_CONFIG` names another. Every key has the name of the daemon option it stands for
//! (`--max-sm-reservation` is `max_sm_reservation`), and an option given on the command line, or
//! its variable in the environment, wins over the file. A key or value the daemon does not know
//! is refused with the file, the line and what is wrong, at start and on reload alike.
//!
//! The file is trusted as the pipe directory is: it and the directory it is in must belong to
//! this user or root and be writable by no one else, since whoever writes it sets every
//! client's limits.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use mps_core::units::{parse_device_limit, parse_size};
use mps_core::{Error, Result, Status};
use mps_ipc::trust::TrustedDir;
use serde::{Deserialize, Serialize};

/// Where the daemon looks for its configuration unless told otherwise.
pub const DEFAULT_PATH: &str = "/etc/mps/mps.toml";

/// Bytes, written in the file as a number or as a size such as `"2GiB"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SizeText", into = "u64")]
pub struct Size(pub u64);

/// A size as the file may write it.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeText {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeText> for Size {
    type Error = String;
    fn try_from(v: SizeText) -> std::result::Result<Size, String> {
        match v {
            SizeText::Bytes(b) => Ok(Size(b)),
            SizeText::Text(s) => parse_size(&s).map(Size).map_err(|e| e.message),
        }
    }
}

impl From<Size> for u64 {
    fn from(s: Size) -> u64 {
        s.0
    }
}

/// Device memory per device, as `MPS_PINNED_DEVICE_MEM_LIMIT` writes it: a size for every
/// device (`"2GiB"`, or a number of bytes), or sizes by ordinal (`"0=1GiB,1=512MiB"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SizeText", into = "String")]
pub struct DeviceSizes(pub String);

impl TryFrom<SizeText> for DeviceSizes {
    type Error = String;
    fn try_from(v: SizeText) -> std::result::Result<DeviceSizes, String> {
        let spec = match v {
            SizeText::Bytes(b) => b.to_string(),
            SizeText::Text(s) => s,
        };
        // Device 0's answer checks every entry.
        parse_device_limit(&spec, 0).map_err(|e| e.message)?;
        Ok(DeviceSizes(spec))
    }
}

impl From<DeviceSizes> for String {
    fn from(d: DeviceSizes) -> String {
        d.0
    }
}

impl DeviceSizes {
    /// Checks `spec` (every entry a size).
    pub fn parse(spec: &str) -> std::result::Result<DeviceSizes, String> {
        DeviceSizes::try_from(SizeText::Text(spec.to_string()))
    }

    /// The limit for `device`, if the spec gives one.
    pub fn for_device(&self, device: u32) -> Option<u64> {
        parse_device_limit(&self.0, device).ok().flatten()
    }
}

/// A whole percentage with a lower bound `MIN` (the upper one is 100).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Percent<const MIN: u32>(pub u32);

impl<const MIN: u32> TryFrom<u32> for Percent<MIN> {
    type Error = String;
    fn try_from(v: u32) -> std::result::Result<Self, String> {
        if (MIN..=100).contains(&v) {
            Ok(Percent(v))
        } else {
            Err(format!("{v} is not a whole percentage from {MIN} to 100"))
        }
    }
}

impl<const MIN: u32> From<Percent<MIN>> for u32 {
    fn from(p: Percent<MIN>) -> u32 {
        p.0
    }
}

/// A client priority: 0 normal, 1 below normal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Priority(pub u32);

impl TryFrom<u32> for Priority {
    type Error = String;
    fn try_from(v: u32) -> std::result::Result<Priority, String> {
        if v <= 1 {
            Ok(Priority(v))
        } else {
            Err(format!("priority {v}: 0 (normal) or 1 (below normal)"))
        }
    }
}

impl From<Priority> for u32 {
    fn from(p: Priority) -> u32 {
        p.0
    }
}

/// A count of at least one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Count(pub u64);

impl TryFrom<u64> for Count {
    type Error = String;
    fn try_from(v: u64) -> std::result::Result<Count, String> {
        if v >= 1 {
            Ok(Count(v))
        } else {
            Err("0: it must be at least 1".into())
        }
    }
}

impl From<Count> for u64 {
    fn from(c: Count) -> u64 {
        c.0
    }
}

/// The servers' backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// CUDA where a device exists, else the simulator.
    Auto,
    /// A CUDA device.
    Cuda,
    /// The CPU simulator.
    Sim,
}

impl Backend {
    /// Its name, as `--backend` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Auto => "auto",
            Backend::Cuda => "cuda",
            Backend::Sim => "sim",
        }
    }
}

/// What a faulting kernel ends in the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FaultScope {
    /// The faulting client's work.
    Client,
    /// The context, so every client of the server.
    Context,
}

impl FaultScope {
    /// Its name, as `--sim-fault-scope` takes it.
    pub fn name(self) -> &'static str {
        match self {
            FaultScope::Client => "client",
            FaultScope::Context => "context",
        }
    }
}

/// The configuration file's contents; every key is optional (the option's default applies).
/// docs/OPERATE.md describes each.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `--pipe-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipe_dir: Option<PathBuf>,
    /// `--log-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_dir: Option<PathBuf>,
    /// `--server`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<PathBuf>,
    /// `--backend`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// `--devices`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<u32>>,
    /// `--sim-devices`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_devices: Option<Count>,
    /// `--sim-memory`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_memory: Option<Size>,
    /// `--sim-fault-scope`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_fault_scope: Option<FaultScope>,
    /// `--device-pinned-mem-limit` (or per device, as `MPS_PINNED_DEVICE_MEM_LIMIT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_pinned_mem_limit: Option<DeviceSizes>,
    /// `--client-priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_priority: Option<Priority>,
    /// `--active-thread-percentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<Percent<1>>,
    /// `--max-sm-reservation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sm_reservation: Option<Percent<0>>,
    /// `--metrics-listen`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// `--server-arg`, each word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_args: Option<Vec<String>>,
    /// `--standby`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<bool>,
    /// `--max-pending-hellos`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_hellos: Option<Count>,
    /// `--hello-timeout-ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hello_timeout_ms: Option<Count>,
    /// `--max-servers-per-user`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_servers_per_user: Option<Count>,
    /// `--log-max-bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_max_bytes: Option<Size>,
    /// `--max-server-logs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_server_logs: Option<Count>,
    /// Groups with limits, rules and routes of their own (`[groups.NAME]`), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, Group>,
}

/// A group of clients (`[groups.NAME]`): limits that hold for all its clients of one user on
/// one device together (one server), the limits of each client in it, who may join it, and the
/// cgroups whose processes it takes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    /// Device memory its clients may hold together, on each device (or by ordinal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_mem_limit: Option<DeviceSizes>,
    /// The share of each device's SMs its clients together run within (other groups' may run
    /// there too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_thread_percentage: Option<Percent<1>>,
    /// The share of each device's SMs reserved for its clients: no other group's run there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_reservation: Option<Percent<1>>,
    /// Priority of its clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_priority: Option<Priority>,
    /// Connections its server of one user and device admits at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_clients: Option<Count>,
    /// Device memory each of its clients may hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_device_mem_limit: Option<DeviceSizes>,
    /// SM share of each of its clients, percent of the group's SMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_active_thread_percentage: Option<Percent<1>>,
    /// Users who may join it (with `gids` and `cgroups`: no rule, everyone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uids: Vec<u32>,
    /// Groups of users (primary or supplementary) who may join it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gids: Vec<u32>,
    /// cgroups (v2 paths, each with everything under it) whose processes may join it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<String>,
    /// cgroups (v2 paths, each with everything under it) whose processes are placed in it,
    /// whatever group they ask for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route_cgroups: Vec<String>,
}

impl Group {
    /// Whether it says who may join.
    pub fn has_rules(&self) -> bool {
        !(self.uids.is_empty() && self.gids.is_empty() && self.cgroups.is_empty())
    }
}

/// Whether cgroup `path` is `prefix` or under it.
pub(crate) fn cgroup_within(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix
        || prefix.is_empty()
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Settings that a running daemon cannot change: they differ only after a restart.
pub(crate) fn restart_only(a: &FileConfig, b: &FileConfig) -> Vec<&'static str> {
    let mut differ = Vec::new();
    let mut check = |name, same: bool| {
        if !same {
            differ.push(name)
        }
    };
    check("pipe_dir", a.pipe_dir == b.pipe_dir);
    check("log_dir", a.log_dir == b.log_dir);
    check("server", a.server == b.server);
    check("backend", a.backend == b.backend);
    check("devices", a.devices == b.devices);
    check("sim_devices", a.sim_devices == b.sim_devices);
    check("sim_memory", a.sim_memory == b.sim_memory);
    check("sim_fault_scope", a.sim_fault_scope == b.sim_fault_scope);
    check("metrics_listen", a.metrics_listen == b.metrics_listen);
    check("server_args", a.server_args == b.server_args);
    check("standby", a.standby == b.standby);
    check(
        "max_pending_hellos",
        a.max_pending_hellos == b.max_pending_hellos,
    );
    check("hello_timeout_ms", a.hello_timeout_ms == b.hello_timeout_ms);
    check(
        "max_servers_per_user",
        a.max_servers_per_user == b.max_servers_per_user,
    );
    check("log_max_bytes", a.log_max_bytes == b.log_max_bytes);
    check("max_server_logs", a.max_server_logs == b.max_server_logs);
    differ
}

fn refused(what: String) -> Error {
    Error::new(Status::InvalidValue, what)
}

impl FileConfig {
    /// Parses `text`, the contents of `path`; an error names the file, the line and the reason.
    pub fn parse(text: &str, path: &Path) -> Result<FileConfig> {
        let c: FileConfig = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let what = e.message().trim().replace('\n', "; ");
            refused(match line {
                Some(line) => format!(
                    "{}, line {line}: {what}; fix it (docs/OPERATE.md lists every key)",
                    path.display()
                ),
                None => format!("{}: {what}", path.display()),
            })
        })?;
        c.check_groups()
            .map_err(|what| refused(format!("{}: {what}; fix it", path.display())))?;
        Ok(c)
    }

    /// Refuses groups that cannot all be served: a bad name, a share and a reservation both,
    /// reservations that leave no SMs to the other groups, a cgroup that is not a path, a
    /// cgroup routed to two groups, and server arguments that the groups' servers are given.
    pub fn check_groups(&self) -> std::result::Result<(), String> {
        let mut reserved = 0;
        let mut routes: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, g) in &self.groups {
            mps_core::handshake::check_group(name)
                .map_err(|e| format!("[groups.{name}]: {}", e.message))?;
            if g.sm_reservation.is_some() && g.active_thread_percentage.is_some() {
                return Err(format!(
                    "[groups.{name}] has both sm_reservation and active_thread_percentage; a \
                     group has one or the other"
                ));
            }
            reserved += g.sm_reservation.map_or(0, |p| p.0);
            for cg in g.cgroups.iter().chain(&g.route_cgroups) {
                if !cg.starts_with('/') {
                    return Err(format!(
                        "[groups.{name}]: cgroup {cg:?} is not a cgroup v2 path (as \
                         /proc/PID/cgroup writes it after \"0::\", starting with /)"
                    ));
                }
            }
            for cg in &g.route_cgroups {
                let cg = cg.trim_end_matches('/');
                if let Some(other) = routes.insert(cg, name) {
                    return Err(format!(
                        "cgroup {cg} is routed to both [groups.{other}] and [groups.{name}]"
                    ));
                }
            }
        }
        // The options a group's server is started with cannot be given twice.
        let given = self.server_args.iter().flatten();
        for word in given.filter(|w| {
            ["--max-clients", "--max-device-bytes", "--sm-range"]
                .iter()
                .any(|o| w.split('=').next() == Some(o))
        }) {
            if !self.groups.is_empty() {
                return Err(format!(
                    "server_args (or --server-arg) gives {word}, which the daemon sets for the \
                     servers of groups; set it in [groups.NAME] instead"
                ));
            }
        }
        if reserved >= 100 {
            return Err(format!(
                "the groups' sm_reservation add up to {reserved}%, which leaves no SMs to other \
                 groups; keep them below 100%"
            ));
        }
        Ok(())
    }

    /// Reads `path`: `Ok(None)` if it does not exist and `required` is false. Refused: a file
    /// or a directory above it that another user owns or can write, a file that is not a regular
    /// file, and contents [`FileConfig::parse`] refuses.
    pub fn read(path: &Path, required: bool) -> Result<Option<FileConfig>> {
        let real = match std::fs::canonicalize(path) {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => return Ok(None),
            Err(e) => {
                return Err(refused(format!(
                    "cannot read the configuration {}: {e}",
                    path.display()
                )));
            }
        };
        // The directories it is in are checked as the pipe directory's are (the link it may be,
        // as a Kubernetes ConfigMap's files are, is followed first).
        if let Some(dir) = real.parent() {
            TrustedDir::open(dir, 0o755).map_err(|e| {
                refused(format!(
                    "the configuration {} is refused: {}",
                    path.display(),
                    e.message
                ))
            })?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&real)
            .map_err(|e| refused(format!("cannot open {}: {e}", real.display())))?;
        let meta = file
            .metadata()
            .map_err(|e| refused(format!("cannot stat {}: {e}", real.display())))?;
        check_trusted(&meta, &real)?;
        let mut text = String::new();
        file.read_to_string(&mut text)
            .map_err(|e| refused(format!("cannot read {}: {e}", real.display())))?;
        Self::parse(&text, path).map(Some)
    }

    /// The file's text, as [`FileConfig::save`] writes it.
    pub fn to_text(&self) -> Result<String> {
        toml::to_string(self)
            .map_err(|e| Error::internal(format!("cannot write the configuration as TOML: {e}")))
    }

    /// Writes the configuration to `path`, replacing the file whole (a new file beside it,
    /// made without following links, then renamed over it), mode 0644.
    pub fn save(&self, path: &Path) -> Result<()> {
        let text = self.to_text()?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| refused(format!("{} names no file", path.display())))?;
        let dir = TrustedDir::open(path.parent().unwrap_or(Path::new("/")), 0o755)?;
        let partial = format!(".{name}.new");
        let mut f = dir.create_file(&partial, 0o644)?;
        let header = "# The running configuration of mps-control, written by its save_config \
                      command.\n# Every key is described in docs/OPERATE.md.\n\n";
        f.write_all(header.as_bytes())
            .and_then(|()| f.write_all(text.as_bytes()))
            .and_then(|()| f.sync_all())
            .map_err(|e| {
                Error::new(
                    Status::PermissionDenied,
                    format!("cannot write {}: {e}", dir.path().join(&partial).display()),
                )
            })?;
        dir.rename(&partial, name)
    }
}

/// Refuses a configuration file that is not a regular file, or that a user other than this one
/// or root owns or that its group or others can write.
fn check_trusted(meta: &std::fs::Metadata, path: &Path) -> Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_file() {
        return Err(refused(format!("{} is not a regular file", path.display())));
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(refused(format!(
            "the configuration {} belongs to uid {}, neither root nor this daemon's uid {me}; \
             whoever writes it sets every client's limits: chown it",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(refused(format!(
            "the configuration {} can be written by its group or others (mode {:o}); whoever \
             writes it sets every client's limits: chmod go-w it",
            path.display(),
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Default memory limits per device of `spec` for `devices`.
pub(crate) fn device_limits(spec: &DeviceSizes, devices: &[u32]) -> BTreeMap<u32, u64> {
    devices
        .iter()
        .filter_map(|&d| spec.for_device(d).map(|b| (d, b)))
        .collect()
}

impl super::Daemon {
    /// Reads the configuration anew (SIGHUP) and applies it; a configuration that cannot be read
    /// is logged with the reason, and the one in force stays.
    pub(super) fn reload(&self) {
        let Some(read) = self.reloader.get() else {
            tracing::warn!("SIGHUP: this daemon has no configuration to read again");
            return;
        };
        match read() {
            Ok(new) => {
                self.apply_config(new);
                tracing::info!(
                    "SIGHUP: configuration read again from {}",
                    self.cfg.config_path.display()
                );
            }
            Err(why) => tracing::error!(
                "SIGHUP: the configuration is refused and the one in force stays: {why}"
            ),
        }
    }

    /// How SIGHUP reads the configuration; set once, before [`super::Daemon::run`].
    pub fn set_reloader(&self, reloader: super::Reloader) {
        let _ = self.reloader.set(reloader);
    }

    /// Puts configuration `new` in force: the defaults of new servers (priority for the new
    /// clients of running servers too, as `set_default_client_priority` does); settings that need
    /// a restart are logged as such.
    pub(super) fn apply_config(&self, new: FileConfig) {
        use std::sync::atomic::Ordering::Relaxed;
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for key in restart_only(&running, &new) {
            tracing::warn!(
                "{key} changed in the configuration; it takes effect when the daemon restarts"
            );
        }
        let priority = new.client_priority.map_or(0, |p| p.0);
        if self.default_priority.swap(priority, Relaxed) != priority {
            for s in self.server_list() {
                if new
                    .groups
                    .get(&s.group)
                    .is_some_and(|g| g.client_priority.is_some())
                {
                    continue;
                }
                if let Err(e) = self.ask(s.pid, &super::wire::ServerRequest::SetPriority(priority))
                {
                    tracing::warn!(
                        "cannot give server {} the new priority: {}",
                        s.pid,
                        e.message
                    );
                }
            }
        }
        self.default_share
            .store(new.active_thread_percentage.map_or(100, |p| p.0), Relaxed);
        self.default_max_reserve.store(
            new.max_sm_reservation
                .map_or(super::DEFAULT_MAX_SM_RESERVATION, |p| p.0),
            Relaxed,
        );
        self.default_mem_limit.store(0, Relaxed);
        *self
            .device_mem_limits
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = new
            .device_pinned_mem_limit
            .as_ref()
            .map(|spec| device_limits(spec, &self.cfg.devices))
            .unwrap_or_default();
        let groups_changed = running.groups != new.groups;
        *running = new;
        drop(running);
        if groups_changed {
            let running = self
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            self.push_group_limits(&running);
            tracing::info!(
                "groups changed: their device_mem_limit holds for running servers at once; their \
                 other limits, SM shares and reservations for servers started from now on \
                 (shutdown_server a running one to restart it under them)"
            );
        }
    }

    /// The configuration in force, with the defaults as operators have set them since.
    pub(super) fn running_config(&self) -> FileConfig {
        use std::sync::atomic::Ordering::Relaxed;
        let mut c = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        c.client_priority = Some(Priority(self.default_priority.load(Relaxed)));
        c.active_thread_percentage = Some(Percent(self.default_share.load(Relaxed)));
        c.max_sm_reservation = Some(Percent(self.default_max_reserve.load(Relaxed)));
        let limits: Vec<(u32, u64)> = self
            .cfg
            .devices
            .iter()
            .map(|&d| (d, self.default_mem_limit(d)))
            .collect();
        let spec = if limits.windows(2).all(|w| w[0].1 == w[1].1) {
            limits.first().map_or(0, |l| l.1).to_string()
        } else {
            let each: Vec<String> = limits.iter().map(|(d, b)| format!("{d}={b}")).collect();
            each.join(",")
        };
        c.device_pinned_mem_limit = Some(DeviceSizes(spec));
        c
    }

    /// Writes the configuration in force to the configuration file (`save_config`).
    pub(super) fn save_config(&self) -> Result<String> {
        let path = &self.cfg.config_path;
        self.running_config().save(path)?;
        tracing::info!("configuration written to {}", path.display());
        Ok(format!("configuration written to {}\n", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<FileConfig> {
        FileConfig::parse(text, Path::new("/etc/mps/mps.toml"))
    }

    #[test]
    fn every_key_reads_and_writes_back_the_same() {
        let text = r#"
pipe_dir = "/run/mps"
log_dir = "/var/log/mps"
server = "/usr/bin/mps-server"
backend = "sim"
devices = [0, 1]
sim_devices = 2
sim_memory = "1GiB"
sim_fault_scope = "context"
device_pinned_mem_limit = "0=1GiB,1=512MiB"
client_priority = 1
active_thread_percentage = 50
max_sm_reservation = 0
metrics_listen = "127.0.0.1:9400"
server_args = ["--max-streams", "16"]
standby = true
max_pending_hellos = 8
hello_timeout_ms = 500
max_servers_per_user = 4
log_max_bytes = 1048576
max_server_logs = 8
"#;
        let c = parse(text).unwrap();
        assert_eq!(c.sim_memory, Some(Size(1 << 30)));
        assert_eq!(c.backend, Some(Backend::Sim));
        let limits = device_limits(c.device_pinned_mem_limit.as_ref().unwrap(), &[0, 1, 2]);
        assert_eq!(limits, BTreeMap::from([(0, 1 << 30), (1, 512 << 20)]));
        let again = parse(&c.to_text().unwrap()).unwrap();
        assert_eq!(again, c);
        assert_eq!(parse("").unwrap(), FileConfig::default());
    }

    #[test]
    fn a_bad_file_is_refused_with_its_line_and_reason() {
        let cases = [
            (
                "client_priority = 0\nactive_thread_percentage = 101\n",
                2,
                "from 1 to 100",
            ),
            ("\n\nsim_memory = \"lots\"\n", 3, "lots"),
            (
                "devices = [0]\nmax_sm_reservaton = 10\n",
                2,
                "max_sm_reservaton",
            ),
            ("backend = \"gpu\"\n", 1, "gpu"),
            ("client_priority = 2\n", 1, "below normal"),
            ("device_pinned_mem_limit = \"0=1G,1=x\"\n", 1, "x"),
            ("max_servers_per_user = 0\n", 1, "at least 1"),
            ("\nmax_server_logs = 0\n", 2, "at least 1"),
            ("standby = yes\n", 1, ""),
        ];
        for (text, line, why) in cases {
            let e = parse(text).expect_err(text);
            let m = &e.message;
            assert!(
                m.starts_with(&format!("/etc/mps/mps.toml, line {line}: ")),
                "{text:?}: {m}"
            );
            assert!(m.contains(why), "{text:?}: {m}");
            assert!(!m.contains('\n'), "{m}");
        }
    }
}
