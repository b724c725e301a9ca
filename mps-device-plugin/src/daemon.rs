//! What the plugin asks the mps daemon, over the sockets of its pipe directory: which devices
//! it serves (the device-list hello on `mps.sock`, which starts no server), how much memory
//! each has (a handshake in a group of the plugin's own, whose server it then stops), and
//! whether each device's servers are up (`get_server_list` on `control.sock`). Blocking calls,
//! each bounded by a timeout: the plugin runs them off its async threads.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mps_core::handshake::{DeviceList, Hello, Welcome};
use mps_ipc::socket;

use crate::shares::{GIB, Gpu};

/// The group the plugin's own handshakes use to learn a device's memory.
pub const PROBE_GROUP: &str = "k8s-device-plugin";
/// The daemon's operator socket.
const CONTROL_SOCKET: &str = "control.sock";
/// How long one question to the daemon may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon of one pipe directory.
#[derive(Clone, Debug)]
pub struct Daemon {
    pub pipe_dir: PathBuf,
}

/// What is known of one served device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    pub ordinal: u32,
    pub total_mem: u64,
    pub name: String,
}

impl Daemon {
    pub fn new(pipe_dir: &Path) -> Daemon {
        Daemon {
            pipe_dir: pipe_dir.to_path_buf(),
        }
    }

    fn connect(&self, name: &str) -> Result<UnixStream, String> {
        let path = self.pipe_dir.join(name);
        let s = UnixStream::connect(&path).map_err(|e| {
            format!(
                "cannot reach the mps daemon at {}: {e}; is mps-control running with this pipe \
                 directory?",
                path.display()
            )
        })?;
        s.set_read_timeout(Some(TIMEOUT))
            .and_then(|()| s.set_write_timeout(Some(TIMEOUT)))
            .map_err(|e| format!("cannot set a timeout on {}: {e}", path.display()))?;
        // Nothing is sent to a socket that neither this user nor root serves.
        socket::check_server(&s, &path).map_err(|e| e.message)?;
        Ok(s)
    }

    /// The device ordinals the daemon serves.
    pub fn served(&self) -> Result<Vec<u32>, String> {
        let path = self.pipe_dir.join(socket::SOCKET_NAME);
        let s = self.connect(socket::SOCKET_NAME)?;
        let hello = Hello::count_devices(PROBE_GROUP).map_err(|e| e.message)?;
        let io = |e: std::io::Error| format!("asking {} for its devices: {e}", path.display());
        socket::send(&s, bytemuck::bytes_of(&hello), &[]).map_err(io)?;
        let mut list: DeviceList = bytemuck::Zeroable::zeroed();
        socket::recv(&s, bytemuck::bytes_of_mut(&mut list), 0).map_err(io)?;
        DeviceList::decode(bytemuck::bytes_of(&list), &path.display())
            .map(|l| l.devices())
            .map_err(|e| e.message)
    }

    /// Device `ordinal`'s description, from the welcome of a handshake in [`PROBE_GROUP`]; the
    /// connection is closed at once (the server it started is stopped by
    /// [`Daemon::stop_probe_servers`]).
    pub fn facts(&self, ordinal: u32) -> Result<DeviceFacts, String> {
        let path = self.pipe_dir.join(socket::SOCKET_NAME);
        let s = self.connect(socket::SOCKET_NAME)?;
        let hello = Hello::for_device(PROBE_GROUP, ordinal).map_err(|e| e.message)?;
        let io = |e: std::io::Error| {
            format!(
                "handshake with {} for device {ordinal}: {e}",
                path.display()
            )
        };
        socket::send(&s, bytemuck::bytes_of(&hello), &[]).map_err(io)?;
        let mut welcome: Welcome = bytemuck::Zeroable::zeroed();
        // The two segments' descriptors come along; dropping them closes them.
        let _segments = socket::recv(&s, bytemuck::bytes_of_mut(&mut welcome), 2).map_err(io)?;
        welcome
            .check(&path.display())
            .map_err(|e| format!("device {ordinal}: {}", e.message))?;
        Ok(DeviceFacts {
            ordinal,
            total_mem: welcome.device.total_mem,
            name: welcome.device.name(),
        })
    }

    /// Sends one operator command and returns the answer; an `error: ...` answer is an error.
    pub fn command(&self, line: &str) -> Result<String, String> {
        let mut s = self.connect(CONTROL_SOCKET)?;
        let io = |e: std::io::Error| format!("mps-control command {line:?}: {e}");
        s.write_all(format!("{line}\n").as_bytes())
            .and_then(|()| s.shutdown(std::net::Shutdown::Write))
            .map_err(io)?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).map_err(io)?;
        match reply.strip_prefix("error: ") {
            Some(e) => Err(format!("mps-control command {line:?}: {}", e.trim())),
            None => Ok(reply),
        }
    }

    /// Stops the servers that [`Daemon::facts`] started (those of [`PROBE_GROUP`], found in
    /// `status`), so that they hold no device context; returns how many were stopped.
    pub fn stop_probe_servers(&self) -> Result<usize, String> {
        let status = self.command("status")?;
        let pids = servers_of_group(&status, PROBE_GROUP);
        for pid in &pids {
            self.command(&format!("shutdown_server {pid}"))?;
        }
        Ok(pids.len())
    }

    /// The GPUs the daemon serves and the memory units each offers: `memory_gib` if given,
    /// else its memory as its server reports it, less `reserve_gib`. Waits for the daemon to
    /// answer; stops the servers its probe started.
    pub fn inventory(&self, memory_gib: Option<u32>, reserve_gib: u32) -> Result<Vec<Gpu>, String> {
        let mut said = false;
        let served = loop {
            match self.served() {
                Ok(s) => break s,
                Err(e) if !said => {
                    tracing::warn!("{e}; waiting for it");
                    said = true;
                }
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_secs(1));
        };
        if served.is_empty() {
            return Err(format!(
                "the mps daemon at {} serves no GPU",
                self.pipe_dir.display()
            ));
        }
        let mut gpus = Vec::new();
        for &ordinal in &served {
            let gib = match memory_gib {
                Some(g) => g,
                None => {
                    let facts = self.facts(ordinal)?;
                    tracing::info!(
                        "GPU {ordinal}: {}, {} bytes of memory",
                        facts.name,
                        facts.total_mem
                    );
                    u32::try_from(facts.total_mem / GIB).unwrap_or(u32::MAX)
                }
            };
            let units = gib.saturating_sub(reserve_gib);
            if units == 0 {
                return Err(format!(
                    "GPU {ordinal}: {gib} GiB less --reserve-gib {reserve_gib} leaves nothing to \
                     offer"
                ));
            }
            gpus.push(Gpu {
                ordinal,
                memory_units: units,
            });
        }
        if memory_gib.is_none() {
            // The probe's servers would otherwise keep a device context each.
            self.stop_probe_servers()?;
        }
        Ok(gpus)
    }

    /// Whether each of `ordinals` is fit to be handed out: the daemon answers, serves it, and
    /// does not have only failed servers on it (after a fault it starts a fresh server at once;
    /// a device whose every server is `FAULT` is not serving).
    pub fn health(&self, ordinals: &[u32]) -> Vec<bool> {
        let Ok(served) = self.served() else {
            return vec![false; ordinals.len()];
        };
        ordinals
            .iter()
            .map(|&d| {
                served.contains(&d)
                    && self
                        .command(&format!("get_server_list {d}"))
                        .is_ok_and(|list| serving(&list))
            })
            .collect()
    }
}

/// Whether a `get_server_list` answer shows a device that serves: no server yet (one starts
/// with the first client), or at least one that is not `FAULT`.
pub fn serving(list: &str) -> bool {
    let lines: Vec<&str> = list.lines().filter(|l| !l.trim().is_empty()).collect();
    lines.is_empty() || lines.iter().any(|l| !l.contains("FAULT"))
}

/// The pids of the servers of `group` in a `status` answer's table of servers.
pub fn servers_of_group(status: &str, group: &str) -> Vec<u32> {
    let table = status.split("\n\n").next().unwrap_or_default();
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let (Some(pid), Some(g)) = (
        header.iter().position(|h| *h == "SERVER-PID"),
        header.iter().position(|h| *h == "GROUP"),
    ) else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.get(g) == Some(&group))
                .then(|| w.get(pid).and_then(|p| p.parse().ok()))
                .flatten()
        })
        .collect()
}

/// The servers in a `status` answer whose group begins with `prefix` and that serve no client
/// now (standbys and failed servers aside: those go with their server, or by themselves).
pub fn idle_servers(status: &str, prefix: &str) -> Vec<u32> {
    let mut tables = status.split("\n\n");
    let servers = tables.next().unwrap_or_default();
    let clients = tables.next().unwrap_or_default();
    let busy: std::collections::HashSet<&str> = clients
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut lines = servers.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(pid), Some(group), Some(state)) = (col("SERVER-PID"), col("GROUP"), col("STATE"))
    else {
        return Vec::new();
    };
    lines
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let idle = w.get(group)?.starts_with(prefix)
                && *w.get(state)? == "ACTIVE"
                && !busy.contains(w.get(pid)?);
            idle.then(|| w[pid].parse().ok()).flatten()
        })
        .collect()
}

/// Which servers of `idle_now` have been idle for `grace` by `now`, given when each was first
/// seen idle (`since`, updated: a server seen busy or gone is forgotten).
pub fn due_for_reaping(
    since: &mut std::collections::HashMap<u32, std::time::Instant>,
    idle_now: &[u32],
    now: std::time::Instant,
    grace: Duration,
) -> Vec<u32> {
    since.retain(|pid, _| idle_now.contains(pid));
    let mut due = Vec::new();
    for &pid in idle_now {
        let first = *since.entry(pid).or_insert(now);
        if now.duration_since(first) >= grace {
            due.push(pid);
        }
    }
    due.sort_unstable();
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_serves_unless_every_server_failed() {
        assert!(serving(""));
        assert!(serving("123\n"));
        assert!(serving("123 FAULT\n456\n"));
        assert!(!serving("123 FAULT\n"));
        assert!(!serving("123 FAULT\n456 FAULT\n"));
    }

    #[test]
    fn the_probe_groups_servers_are_found_in_status() {
        let status = "SERVER-PID  UID     GROUP             ROUTED  UPTIME-S  STATE   DEVICE\n\
                      100         0       k8s-device-plugin 1       3         ACTIVE  0\n\
                      101         1000    k8s-0-mem0        1       3         ACTIVE  0\n\
                      102         0       k8s-device-plugin 1       3         ACTIVE  1\n\
                      \n\
                      SERVER-PID  CLIENT-PID  MEM-BYTES\n\
                      101         77          0\n";
        assert_eq!(servers_of_group(status, PROBE_GROUP), vec![100, 102]);
        assert_eq!(servers_of_group(status, "k8s-0-mem0"), vec![101]);
        assert!(servers_of_group("garbage", PROBE_GROUP).is_empty());
    }

    #[test]
    fn idle_servers_of_containers_groups_are_found_and_reaped_after_the_grace() {
        let status = "SERVER-PID  UID     GROUP             ROUTED  UPTIME-S  STATE   DEVICE\n\
                      100         1000    k8s-0-mem0        1       3         ACTIVE  0\n\
                      101         1000    k8s-0-mem4        1       3         ACTIVE  0\n\
                      102         1000    k8s-1-sm0         1       3         FAULT   1\n\
                      103         1000    k8s-1-sm0         0       3         STANDBY 1\n\
                      104         1000    batch             0       3         ACTIVE  0\n\
                      \n\
                      SERVER-PID  CLIENT-PID  MEM-BYTES\n\
                      101         77          0\n";
        assert_eq!(idle_servers(status, "k8s-"), vec![100]);
        assert_eq!(idle_servers(status, "batch"), vec![104]);

        let t0 = std::time::Instant::now();
        let grace = Duration::from_secs(60);
        let mut since = std::collections::HashMap::new();
        assert!(due_for_reaping(&mut since, &[100, 101], t0, grace).is_empty());
        // 101 got a client meanwhile: its clock starts again when it is idle again.
        let t1 = t0 + grace;
        assert_eq!(due_for_reaping(&mut since, &[100], t1, grace), vec![100]);
        assert!(due_for_reaping(&mut since, &[100, 101], t1, grace) == vec![100]);
        assert_eq!(
            due_for_reaping(&mut since, &[101], t1 + grace, grace),
            vec![101]
        );
    }
}
