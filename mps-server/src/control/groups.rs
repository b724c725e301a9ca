//! Groups of the configuration file (`[groups.NAME]`): which group a client is placed in (the
//! group its cgroup is routed to, else the one it asks for), whether it may join it (the
//! group's uids, gids and cgroups), what the group's servers are started with (its limits, held
//! by each server for all its clients together), and each group's use against its limits.
//!
//! A server serves one user's clients of one group on one device, so a group's limits hold for
//! each of its servers: users are never put in one context, as NVIDIA's MPS runs one user's
//! server at a time on a device.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use mps_core::{Error, Result, Status};
use mps_ipc::socket::Peer;

use super::Daemon;
use super::config::{FileConfig, cgroup_within};
use super::routing::ServerState;
use super::wire::{ServerAnswer, ServerRequest};
use crate::registry::Defaults;

/// The group a client that names none asks for.
const DEFAULT_GROUP: &str = "default";

/// What the daemon reads of a client process in `/proc` (a directory of the tests' own in
/// tests).
#[derive(Clone, Debug)]
pub(crate) struct Proc {
    root: PathBuf,
}

impl Proc {
    pub(crate) fn new(root: &Path) -> Proc {
        Proc {
            root: root.to_path_buf(),
        }
    }

    /// Process `pid`'s cgroup v2 path (the `0::` line of its `cgroup` file), if it has one and
    /// the process there is still user `uid`'s: a client that exited after connecting leaves
    /// its pid to whatever process takes it next, and that process's cgroup is not its own.
    pub(crate) fn cgroup(&self, pid: i32, uid: u32) -> Option<String> {
        let dir = self.root.join(pid.to_string());
        if std::fs::metadata(&dir).ok()?.uid() != uid {
            return None;
        }
        let text = std::fs::read_to_string(dir.join("cgroup")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("0::"))
            .map(|p| p.trim().to_string())
    }

    /// Process `pid`'s supplementary groups (the `Groups:` line of its `status` file).
    pub(crate) fn gids(&self, pid: i32) -> Vec<u32> {
        let Ok(text) = std::fs::read_to_string(self.root.join(pid.to_string()).join("status"))
        else {
            return Vec::new();
        };
        text.lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .map(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The part of the device's SMs, from and to percent, that servers of group `name` run
/// within: a reservation of its own (the groups' reservations follow one another from 0% in the
/// order of their names), or a share of what the reservations leave.
pub(crate) fn sm_range(config: &FileConfig, name: &str) -> (u32, u32) {
    let reserved: u32 = config
        .groups
        .values()
        .filter_map(|g| g.sm_reservation)
        .map(|p| p.0)
        .sum();
    let group = config.groups.get(name);
    if let Some(r) = group.and_then(|g| g.sm_reservation) {
        let before: u32 = config
            .groups
            .iter()
            .take_while(|(n, _)| n.as_str() < name)
            .filter_map(|(_, g)| g.sm_reservation)
            .map(|p| p.0)
            .sum();
        return (before, before + r.0);
    }
    let share = group
        .and_then(|g| g.active_thread_percentage)
        .map_or(100, |p| p.0);
    (reserved, (reserved + share).min(100))
}

/// What a server of a group is started with beyond the daemon's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupLimits {
    /// Device memory of all its clients together (0: none).
    pub(crate) max_device_bytes: u64,
    /// Connections it admits (None: the server's default).
    pub(crate) max_clients: Option<u64>,
    /// The part of the device's SMs its clients run within.
    pub(crate) sm_range: (u32, u32),
}

impl GroupLimits {
    /// The server options that carry them.
    pub(crate) fn args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.max_device_bytes != 0 {
            args.extend([
                "--max-device-bytes".into(),
                self.max_device_bytes.to_string(),
            ]);
        }
        if let Some(n) = self.max_clients {
            args.extend(["--max-clients".into(), n.to_string()]);
        }
        if self.sm_range != (0, 100) {
            let (from, to) = self.sm_range;
            args.extend(["--sm-range".into(), format!("{from}-{to}")]);
        }
        args
    }
}

/// One group server's use against its limits, for `status`, `get_server_list` and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupUse {
    pub(crate) group: String,
    pub(crate) uid: u32,
    pub(crate) device: u32,
    pub(crate) server_pid: u32,
    pub(crate) connections: u32,
    /// 0: the server's default.
    pub(crate) max_clients: u64,
    pub(crate) device_bytes: u64,
    /// 0: none.
    pub(crate) max_device_bytes: u64,
    pub(crate) sms: u32,
    pub(crate) sm_range: (u32, u32),
    pub(crate) priority: u32,
}

impl GroupUse {
    /// Its words for `get_server_list`.
    pub(crate) fn words(&self) -> String {
        let limit = |n: u64| match n {
            0 => "none".to_string(),
            n => n.to_string(),
        };
        format!(
            "group={} clients={}/{} mem={}/{} sms={} sm_range={}-{}%",
            self.group,
            self.connections,
            limit(self.max_clients),
            self.device_bytes,
            limit(self.max_device_bytes),
            self.sms,
            self.sm_range.0,
            self.sm_range.1
        )
    }
}

impl Daemon {
    /// Whether group `name` of the configuration in force has a priority of its own.
    pub(super) fn group_sets_priority(&self, name: &str) -> bool {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .groups
            .get(name)
            .is_some_and(|g| g.client_priority.is_some())
    }

    /// The group client `peer`, which asked for group `asked`, is placed in: the group its
    /// cgroup is routed to (one asked for by name must be that one), else the one it asked for,
    /// which it must be allowed to join.
    pub(super) fn place(&self, peer: &Peer, asked: &str) -> Result<String> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let groups = &running.groups;
        let needs_cgroup = groups
            .values()
            .any(|g| !g.cgroups.is_empty() || !g.route_cgroups.is_empty());
        let cgroup = if needs_cgroup {
            self.proc.cgroup(peer.pid, peer.uid)
        } else {
            None
        };
        let config = self.cfg.config_path.display();
        // The longest route that holds the client's cgroup places it.
        let route = cgroup.as_deref().and_then(|cg| {
            groups
                .iter()
                .flat_map(|(name, g)| g.route_cgroups.iter().map(move |r| (name, r)))
                .filter(|(_, r)| cgroup_within(cg, r))
                .max_by_key(|(_, r)| r.trim_end_matches('/').len())
        });
        if let Some((name, prefix)) = route {
            if asked != DEFAULT_GROUP && asked != name {
                return Err(Error::new(
                    Status::PermissionDenied,
                    format!(
                        "this process's cgroup {} is routed to group {name} (route_cgroups \
                         {prefix:?} of [groups.{name}] in {config}), so it cannot join group \
                         {asked}; unset MPS_GROUP",
                        cgroup.as_deref().unwrap_or_default()
                    ),
                ));
            }
            return Ok(name.clone());
        }
        let Some(group) = groups.get(asked).filter(|g| g.has_rules()) else {
            return Ok(asked.to_string());
        };
        let mut gids = self.proc.gids(peer.pid);
        gids.push(peer.gid);
        let by_uid = group.uids.contains(&peer.uid);
        let by_gid = gids.iter().any(|g| group.gids.contains(g));
        let by_cgroup = cgroup
            .as_deref()
            .is_some_and(|cg| group.cgroups.iter().any(|r| cgroup_within(cg, r)));
        if by_uid || by_gid || by_cgroup {
            return Ok(asked.to_string());
        }
        gids.sort_unstable();
        gids.dedup();
        Err(Error::new(
            Status::PermissionDenied,
            format!(
                "group {asked} admits uids {:?}, gids {:?} and cgroups {:?} ([groups.{asked}] in \
                 {config}); this client (uid {}, gids {gids:?}, cgroup {}) is none of them",
                group.uids,
                group.gids,
                group.cgroups,
                peer.uid,
                cgroup.as_deref().unwrap_or("unknown")
            ),
        ))
    }

    /// What a server of group `name` on `device` started now gives its clients, and its
    /// group's limits.
    pub(super) fn group_server(&self, name: &str, device: u32) -> (Defaults, GroupLimits) {
        let mut defaults = self.server_defaults(device);
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let Some(g) = running.groups.get(name) else {
            let limits = GroupLimits {
                sm_range: sm_range(&running, name),
                ..GroupLimits::default()
            };
            return (defaults, limits);
        };
        if let Some(bytes) = g
            .client_device_mem_limit
            .as_ref()
            .and_then(|l| l.for_device(device))
        {
            defaults.mem_limit = bytes;
        }
        if let Some(p) = g.client_priority {
            defaults.priority = p.0;
        }
        if let Some(p) = g.client_active_thread_percentage {
            defaults.sm_share = p.0;
        }
        let limits = GroupLimits {
            max_device_bytes: g
                .device_mem_limit
                .as_ref()
                .and_then(|l| l.for_device(device))
                .unwrap_or(0),
            max_clients: g.max_clients.map(|c| c.0),
            sm_range: sm_range(&running, name),
        };
        (defaults, limits)
    }

    /// Each active server of a configured group, with its use against its limits; a server
    /// that does not answer is left out.
    pub(super) fn group_use(&self) -> Vec<GroupUse> {
        let configured: Vec<String> = {
            let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            running.groups.keys().cloned().collect()
        };
        self.server_list()
            .into_iter()
            .filter(|s| s.state == ServerState::Active && configured.contains(&s.group))
            .filter_map(|s| {
                let ServerAnswer::Totals {
                    device_bytes,
                    max_device_bytes,
                    connections,
                    sms,
                } = self.ask(s.pid, &ServerRequest::Totals).ok()?
                else {
                    return None;
                };
                Some(GroupUse {
                    group: s.group,
                    uid: s.uid,
                    device: s.device,
                    server_pid: s.pid,
                    connections,
                    max_clients: s.limits.max_clients.unwrap_or(0),
                    device_bytes,
                    max_device_bytes,
                    sms,
                    sm_range: s.limits.sm_range,
                    priority: s.priority,
                })
            })
            .collect()
    }

    /// Gives the running servers of each group the group's device-memory limit of `config`
    /// (a lower one takes nothing a client holds: it refuses the allocations past it).
    pub(super) fn push_group_limits(&self, config: &FileConfig) {
        for s in self.server_list() {
            let Some(g) = config.groups.get(&s.group) else {
                continue;
            };
            let bytes = g
                .device_mem_limit
                .as_ref()
                .and_then(|l| l.for_device(s.device))
                .unwrap_or(0);
            if let Err(e) = self.ask(s.pid, &ServerRequest::SetMaxDeviceBytes(bytes)) {
                tracing::warn!(
                    "cannot give server {} group {}'s device_mem_limit: {}",
                    s.pid,
                    s.group,
                    e.message
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> FileConfig {
        FileConfig::parse(text, Path::new("mps.toml")).unwrap()
    }

    #[test]
    fn reservations_follow_one_another_and_shares_take_from_what_they_leave() {
        let c = config(
            "[groups.b]\nsm_reservation = 20\n[groups.a]\nsm_reservation = 30\n\
             [groups.c]\nactive_thread_percentage = 50\n[groups.d]\nclient_priority = 1\n",
        );
        assert_eq!(sm_range(&c, "a"), (0, 30));
        assert_eq!(sm_range(&c, "b"), (30, 50));
        assert_eq!(sm_range(&c, "c"), (50, 100));
        assert_eq!(sm_range(&c, "d"), (50, 100));
        assert_eq!(sm_range(&c, "not-configured"), (50, 100));
        let c = config("[groups.c]\nactive_thread_percentage = 40\n");
        assert_eq!(sm_range(&c, "c"), (0, 40));
        assert_eq!(sm_range(&c, "default"), (0, 100));
    }

    #[test]
    fn groups_that_cannot_be_served_are_refused() {
        for (text, why) in [
            (
                "[groups.a]\nsm_reservation = 60\n[groups.b]\nsm_reservation = 40\n",
                "100%",
            ),
            (
                "[groups.a]\nsm_reservation = 10\nactive_thread_percentage = 10\n",
                "one or the other",
            ),
            ("[groups.\"../x\"]\n", "group name"),
            (
                "[groups.a]\ncgroups = [\"system.slice\"]\n",
                "not a cgroup v2 path",
            ),
            (
                "[groups.a]\nroute_cgroups = [\"/a\"]\n[groups.b]\nroute_cgroups = [\"/a/\"]\n",
                "routed to both",
            ),
            ("[groups.a]\nmax_client = 3\n", "max_client"),
            (
                "server_args = [\"--max-clients\", \"4\"]\n[groups.a]\nmax_clients = 3\n",
                "set it in [groups.NAME]",
            ),
        ] {
            let e = FileConfig::parse(text, Path::new("mps.toml")).unwrap_err();
            assert!(e.message.contains(why), "{text:?}: {}", e.message);
        }
    }

    #[test]
    fn a_cgroup_is_within_itself_and_what_is_under_it_only() {
        assert!(cgroup_within("/kubepods/pod1", "/kubepods"));
        assert!(cgroup_within("/kubepods", "/kubepods/"));
        assert!(!cgroup_within("/kubepods2", "/kubepods"));
        assert!(cgroup_within("/anything", "/"));
    }

    #[test]
    fn the_cgroup_and_groups_are_read_from_proc() {
        let root = std::env::temp_dir().join(format!("mps-proc-{}", std::process::id()));
        std::fs::create_dir_all(root.join("42")).unwrap();
        std::fs::write(
            root.join("42/cgroup"),
            "1:name=systemd:/x\n0::/system.slice/a.service\n",
        )
        .unwrap();
        std::fs::write(
            root.join("42/status"),
            "Name:\tx\nGroups:\t4 27 100 \nUid:\t0\n",
        )
        .unwrap();
        let p = Proc::new(&root);
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(p.cgroup(42, me).as_deref(), Some("/system.slice/a.service"));
        assert_eq!(p.cgroup(42, me + 1), None, "another user's process now");
        assert_eq!(p.gids(42), vec![4, 27, 100]);
        assert_eq!(p.cgroup(43, me), None);
        assert!(p.gids(43).is_empty());
        std::fs::remove_dir_all(root).unwrap();
    }
}
