//! The operators' command language: a line of words becomes a typed [`Command`] (or a one-line
//! error naming the usage), and the daemon answers it in lines ending in `\n`.
//!
//! Past 600 lines because its tests list every command and a bad form of each.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mps_core::units::{parse_percent, parse_size};
use mps_core::{Error, Result};

use super::Daemon;
use super::routing::{ServerState, no_server, unexpected};
use super::wire::{ServerAnswer, ServerRequest};

/// Where a per-server setting applies: one running server, or the servers started from now on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The servers started from now on.
    Default,
    /// The running server with this pid.
    Server(u32),
}

/// One operator command, as parsed from its line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// The pids of the running servers, of one device ordinal or of all; one whose device
    /// context failed is marked `FAULT`.
    GetServerList {
        /// Only the servers of this device.
        device: Option<u32>,
    },
    /// `ACTIVE` if a server with this pid serves, `FAULT` if its device context failed and it
    /// drains its clients.
    GetServerStatus {
        /// The server's pid.
        server: u32,
    },
    /// Stops a server; without `force` its clients get 5 s to finish.
    ShutdownServer {
        /// The server's pid.
        server: u32,
        /// Stop it at once.
        force: bool,
    },
    /// Stops every server, each given `grace`, then the daemon.
    Quit {
        /// How long each server gets to finish.
        grace: Duration,
    },
    /// Servers and their clients, as two tables.
    Status,
    /// A server's client processes; `verbose`: one line per connection with its counters.
    GetClientList {
        /// The server's pid.
        server: u32,
        /// One line per connection with its counters.
        verbose: bool,
    },
    /// Disconnects every connection of a client process from a server.
    TerminateClient {
        /// The server's pid.
        server: u32,
        /// The client's pid.
        client: i32,
    },
    /// Priority of new clients, of running servers too (0 normal, 1 below normal).
    SetDefaultClientPriority(u32),
    /// Priority new clients get.
    GetDefaultClientPriority,
    /// SM share per client of new servers, percent.
    SetDefaultActiveThreadPercentage(u32),
    /// SM share per client new servers get.
    GetDefaultActiveThreadPercentage,
    /// SM share per client of a running server, percent.
    SetActiveThreadPercentage {
        /// The server's pid.
        server: u32,
        /// Percent of the SMs.
        percent: u32,
    },
    /// SM share per client of a running server.
    GetActiveThreadPercentage {
        /// The server's pid.
        server: u32,
    },
    /// Ceiling on the SMs a server's clients may reserve in all, percent.
    SetMaxSmReservation {
        /// The server, or new servers.
        target: Target,
        /// Percent of the SMs.
        percent: u32,
    },
    /// The reservation ceiling of a server or of new servers.
    GetMaxSmReservation(Target),
    /// Device memory per client of new servers of a device, bytes (0: no limit).
    SetDefaultDevicePinnedMemLimit {
        /// The device ordinal.
        device: u32,
        /// Bytes per client.
        bytes: u64,
    },
    /// Device memory per client new servers of a device get.
    GetDefaultDevicePinnedMemLimit {
        /// The device ordinal.
        device: u32,
    },
    /// Device memory per new client of a running server, bytes (0: no limit).
    SetDevicePinnedMemLimit {
        /// The server's pid.
        server: u32,
        /// The server's device ordinal.
        device: u32,
        /// Bytes per client.
        bytes: u64,
    },
    /// Writes the configuration in force, operators' changes of the defaults included, to the
    /// configuration file, so that a restart keeps them.
    SaveConfig,
}

/// Every command and its usage, in the order the unknown-command error lists them.
const USAGES: &[(&str, &str)] = &[
    ("get_server_list", "get_server_list [device]"),
    ("get_server_status", "get_server_status <server-pid>"),
    ("get_client_list", "get_client_list <server-pid> [-v]"),
    (
        "terminate_client",
        "terminate_client <server-pid> <client-pid>",
    ),
    (
        "set_default_device_pinned_mem_limit",
        "set_default_device_pinned_mem_limit <device> <size>",
    ),
    (
        "get_default_device_pinned_mem_limit",
        "get_default_device_pinned_mem_limit <device>",
    ),
    (
        "set_device_pinned_mem_limit",
        "set_device_pinned_mem_limit <server-pid> <device> <size>",
    ),
    (
        "set_default_client_priority",
        "set_default_client_priority <0|1>",
    ),
    ("get_default_client_priority", "get_default_client_priority"),
    (
        "set_default_active_thread_percentage",
        "set_default_active_thread_percentage <1-100>",
    ),
    (
        "get_default_active_thread_percentage",
        "get_default_active_thread_percentage",
    ),
    (
        "set_active_thread_percentage",
        "set_active_thread_percentage <server-pid> <1-100>",
    ),
    (
        "get_active_thread_percentage",
        "get_active_thread_percentage <server-pid>",
    ),
    (
        "set_max_sm_reservation",
        "set_max_sm_reservation <server-pid|default> <0-100>",
    ),
    (
        "get_max_sm_reservation",
        "get_max_sm_reservation <server-pid|default>",
    ),
    ("shutdown_server", "shutdown_server <server-pid> [-f]"),
    ("status", "status"),
    ("save_config", "save_config"),
    ("quit", "quit [-t <seconds>]"),
];

impl std::str::FromStr for Command {
    type Err = Error;

    /// Parses one line; a bad one gets a one-line error with the command's usage.
    fn from_str(line: &str) -> Result<Command> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some((&name, args)) = words.split_first() else {
            return Err(Error::invalid_value("empty command"));
        };
        let Some(&(_, usage)) = USAGES.iter().find(|(n, _)| *n == name) else {
            let all: Vec<&str> = USAGES.iter().map(|(_, u)| *u).collect();
            return Err(Error::invalid_value(format!(
                "unknown command {name:?}; commands: {}",
                all.join(", ")
            )));
        };
        let bad = || Error::invalid_value(format!("usage: {usage}"));
        let pid = |w: &str| w.parse::<u32>().map_err(|_| bad());
        let percent = |w: &str, min| parse_percent(w.trim_end_matches('%'), min).ok_or_else(bad);
        let target = |w: &str| match w {
            "default" => Ok(Target::Default),
            _ => pid(w).map(Target::Server),
        };
        use Command::*;
        Ok(match (name, args) {
            ("get_server_list", []) => GetServerList { device: None },
            ("get_server_list", [device]) => GetServerList {
                device: Some(device.parse().map_err(|_| bad())?),
            },
            ("get_server_status", [server]) => GetServerStatus {
                server: pid(server)?,
            },
            ("shutdown_server", [server]) => ShutdownServer {
                server: pid(server)?,
                force: false,
            },
            ("shutdown_server", [server, "-f"]) => ShutdownServer {
                server: pid(server)?,
                force: true,
            },
            ("quit", []) => Quit {
                grace: Duration::from_secs(5),
            },
            ("quit", ["-t", secs]) => Quit {
                grace: Duration::from_secs(secs.parse().map_err(|_| bad())?),
            },
            ("status", []) => Status,
            ("save_config", []) => SaveConfig,
            ("get_client_list", [server]) => GetClientList {
                server: pid(server)?,
                verbose: false,
            },
            ("get_client_list", [server, "-v"]) => GetClientList {
                server: pid(server)?,
                verbose: true,
            },
            ("terminate_client", [server, client]) => TerminateClient {
                server: pid(server)?,
                client: client.parse().map_err(|_| bad())?,
            },
            ("set_default_client_priority", ["0"]) => SetDefaultClientPriority(0),
            ("set_default_client_priority", ["1"]) => SetDefaultClientPriority(1),
            ("get_default_client_priority", []) => GetDefaultClientPriority,
            ("set_default_active_thread_percentage", [p]) => {
                SetDefaultActiveThreadPercentage(percent(p, 1)?)
            }
            ("get_default_active_thread_percentage", []) => GetDefaultActiveThreadPercentage,
            ("set_active_thread_percentage", [server, p]) => SetActiveThreadPercentage {
                server: pid(server)?,
                percent: percent(p, 1)?,
            },
            ("get_active_thread_percentage", [server]) => GetActiveThreadPercentage {
                server: pid(server)?,
            },
            ("set_max_sm_reservation", [t, p]) => SetMaxSmReservation {
                target: target(t)?,
                percent: percent(p, 0)?,
            },
            ("get_max_sm_reservation", [t]) => GetMaxSmReservation(target(t)?),
            ("set_default_device_pinned_mem_limit", [dev, size]) => {
                SetDefaultDevicePinnedMemLimit {
                    device: dev.parse().map_err(|_| bad())?,
                    bytes: parse_size(size)?,
                }
            }
            ("get_default_device_pinned_mem_limit", [dev]) => GetDefaultDevicePinnedMemLimit {
                device: dev.parse().map_err(|_| bad())?,
            },
            ("set_device_pinned_mem_limit", [server, dev, size]) => SetDevicePinnedMemLimit {
                server: pid(server)?,
                device: dev.parse().map_err(|_| bad())?,
                bytes: parse_size(size)?,
            },
            _ => return Err(bad()),
        })
    }
}

impl Daemon {
    /// Runs one operator command line and returns its answer (lines ending in `\n`).
    pub fn command(&self, line: &str) -> Result<String> {
        self.answer(line.parse()?)
    }

    /// Runs one operator command and returns its answer (lines ending in `\n`).
    pub fn answer(&self, command: Command) -> Result<String> {
        use Command::*;
        match command {
            GetServerList { device } => {
                // A server of a configured group says its group's use against its limits.
                let groups = self.group_use();
                Ok(self
                    .server_list()
                    .iter()
                    .filter(|s| device.is_none_or(|d| d == s.device))
                    .map(|s| match s.state {
                        ServerState::Active => {
                            match groups.iter().find(|g| g.server_pid == s.pid) {
                                Some(g) => format!("{} {}\n", s.pid, g.words()),
                                None => format!("{}\n", s.pid),
                            }
                        }
                        ServerState::Fault | ServerState::Standby => {
                            format!("{} {}\n", s.pid, s.state)
                        }
                    })
                    .collect())
            }
            GetServerStatus { server } => self
                .server_list()
                .iter()
                .chain(&self.standby_list())
                .find(|s| s.pid == server)
                .map(|s| format!("{}\n", s.state))
                .ok_or_else(|| no_server(server)),
            ShutdownServer { server, force } => {
                let grace = if force {
                    Duration::ZERO
                } else {
                    Duration::from_secs(5)
                };
                self.shutdown_server(server, grace)?;
                Ok(format!("server {server} stopped\n"))
            }
            Quit { grace } => {
                self.stop.store(true, Ordering::SeqCst);
                self.shutdown_all(grace);
                Ok("quitting\n".into())
            }
            Status => Ok(self.status()),
            SaveConfig => self.save_config(),
            GetClientList {
                server,
                verbose: true,
            } => Ok(self
                .clients_of(server)?
                .iter()
                .map(|c| {
                    format!(
                        "{} uid={} mem={} mem_limit={} priority={} sms={} sm_share={} \
                         sm_reserve={} launches={} copies={} bytes_copied={} gpu_ms={} \
                         batch_hits={} batch_misses={} batch_graphs={} batch_cache_entries={} \
                         batch_cache_bytes={}\n",
                        c.pid,
                        c.uid,
                        c.mem,
                        c.mem_limit,
                        c.priority,
                        c.sms,
                        c.sm_share,
                        c.sm_reserve,
                        c.launches,
                        c.copies,
                        c.bytes_copied,
                        c.gpu_ms,
                        c.batch_hits,
                        c.batch_misses,
                        c.batch_graphs,
                        c.batch_cache_entries,
                        c.batch_cache_bytes
                    )
                })
                .collect()),
            GetClientList {
                server,
                verbose: false,
            } => {
                // One line per client process, however many connections it has.
                let pids: BTreeSet<i32> = self.clients_of(server)?.iter().map(|c| c.pid).collect();
                Ok(pids.into_iter().map(|p| format!("{p}\n")).collect())
            }
            TerminateClient { server, client } => {
                match self.ask(server, &ServerRequest::Terminate { client_pid: client })? {
                    ServerAnswer::Terminated { connections } => Ok(format!(
                        "{connections} connection(s) of client {client} terminated\n"
                    )),
                    other => Err(unexpected(server, &other)),
                }
            }
            SetDefaultClientPriority(level) => {
                self.default_priority.store(level, Ordering::Relaxed);
                // Running servers take it for their new clients too, but for those of groups
                // with a priority of their own.
                for s in self.server_list() {
                    if !self.group_sets_priority(&s.group) {
                        self.ask(s.pid, &ServerRequest::SetPriority(level))?;
                    }
                }
                Ok(format!("new clients: priority {level}\n"))
            }
            GetDefaultClientPriority => Ok(format!(
                "{}\n",
                self.default_priority.load(Ordering::Relaxed)
            )),
            SetDefaultActiveThreadPercentage(p) => {
                self.default_share.store(p, Ordering::Relaxed);
                Ok(format!("new servers: {p}% of the SMs per client\n"))
            }
            GetDefaultActiveThreadPercentage => {
                Ok(format!("{}\n", self.default_share.load(Ordering::Relaxed)))
            }
            SetActiveThreadPercentage { server, percent } => {
                self.ask(server, &ServerRequest::SetShare(percent))?;
                Ok(format!(
                    "server {server}: {percent}% of the SMs per client\n"
                ))
            }
            GetActiveThreadPercentage { server } => {
                self.percent_of(server, ServerRequest::GetShare)
            }
            SetMaxSmReservation {
                target: Target::Default,
                percent,
            } => {
                self.default_max_reserve.store(percent, Ordering::Relaxed);
                Ok(format!(
                    "new servers: clients may reserve {percent}% of the SMs in all\n"
                ))
            }
            SetMaxSmReservation {
                target: Target::Server(server),
                percent,
            } => {
                self.ask(server, &ServerRequest::SetMaxReserve(percent))?;
                Ok(format!(
                    "server {server}: clients may reserve {percent}% of the SMs in all\n"
                ))
            }
            GetMaxSmReservation(Target::Default) => Ok(format!(
                "{}\n",
                self.default_max_reserve.load(Ordering::Relaxed)
            )),
            GetMaxSmReservation(Target::Server(server)) => {
                self.percent_of(server, ServerRequest::GetMaxReserve)
            }
            SetDefaultDevicePinnedMemLimit { device, bytes } => {
                self.check_served(device)?;
                self.set_default_mem_limit(device, bytes);
                Ok(format!(
                    "new servers of device {device}: {bytes} bytes of device memory per client\n"
                ))
            }
            GetDefaultDevicePinnedMemLimit { device } => {
                self.check_served(device)?;
                Ok(format!("{}\n", self.default_mem_limit(device)))
            }
            SetDevicePinnedMemLimit {
                server,
                device,
                bytes,
            } => {
                let serves = self
                    .server_list()
                    .iter()
                    .find(|s| s.pid == server)
                    .map(|s| s.device);
                if serves.is_some_and(|d| d != device) {
                    return Err(Error::invalid_value(format!(
                        "server {server} serves device {}, not device {device}",
                        serves.unwrap_or_default()
                    )));
                }
                self.ask(server, &ServerRequest::SetMemLimit(bytes))?;
                Ok(format!(
                    "server {server}: {bytes} bytes of device memory per new client\n"
                ))
            }
        }
    }

    /// Servers and their clients, with what each client holds and did.
    fn status(&self) -> String {
        let mut out = String::from(
            "SERVER-PID  UID     GROUP             ROUTED  UPTIME-S  STATE   DEVICE\n",
        );
        let mut clients = String::from(
            "SERVER-PID  CLIENT-PID  MEM-BYTES     MEM-LIMIT     PRIORITY  SMS  SHARE%  \
             RESERVED%  LAUNCHES    COPIES      BYTES-COPIED  GPU-MS\n",
        );
        let standbys = self.standby_list();
        for s in self.server_list().into_iter().chain(standbys) {
            let (pid, uid, group, routed) = (s.pid, s.uid, &s.group, s.routed);
            let up = s.uptime.as_secs();
            out += &format!(
                "{pid:<11} {uid:<7} {group:<17} {routed:<7} {up:<9} {:<7} {}\n",
                s.state, s.device
            );
            // A standby serves no client and is not asked (it reads nothing from the daemon
            // before its go); a server that does not answer still has its row above.
            if s.state == ServerState::Standby {
                continue;
            }
            for c in self.clients_of(pid).unwrap_or_default() {
                clients += &format!(
                    "{pid:<11} {:<11} {:<13} {:<13} {:<9} {:<4} {:<7} {:<10} {:<11} {:<11} \
                     {:<13} {}\n",
                    c.pid,
                    c.mem,
                    c.mem_limit,
                    c.priority,
                    c.sms,
                    c.sm_share,
                    c.sm_reserve,
                    c.launches,
                    c.copies,
                    c.bytes_copied,
                    c.gpu_ms
                );
            }
        }
        let groups = self.group_use();
        if groups.is_empty() {
            return format!("{out}\n{clients}");
        }
        let mut table = String::from(
            "GROUP             UID     DEVICE  SERVER-PID  CLIENTS  MAX-CLIENTS  MEM-BYTES     \
             MEM-LIMIT     SMS  SM-RANGE%  PRIORITY\n",
        );
        let limit = |n: u64| match n {
            0 => "none".to_string(),
            n => n.to_string(),
        };
        for g in groups {
            table += &format!(
                "{:<17} {:<7} {:<7} {:<11} {:<8} {:<12} {:<13} {:<13} {:<4} {:<10} {}\n",
                g.group,
                g.uid,
                g.device,
                g.server_pid,
                g.connections,
                limit(g.max_clients),
                g.device_bytes,
                limit(g.max_device_bytes),
                g.sms,
                format!("{}-{}", g.sm_range.0, g.sm_range.1),
                g.priority
            );
        }
        format!("{out}\n{clients}\n{table}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Command> {
        line.parse()
    }

    #[test]
    fn every_command_parses_to_its_value() {
        use Command::*;
        let five = Duration::from_secs(5);
        let cases = [
            ("get_server_list", GetServerList { device: None }),
            ("get_server_list 1", GetServerList { device: Some(1) }),
            ("get_server_status 12", GetServerStatus { server: 12 }),
            (
                "shutdown_server 12",
                ShutdownServer {
                    server: 12,
                    force: false,
                },
            ),
            (
                "shutdown_server 12 -f",
                ShutdownServer {
                    server: 12,
                    force: true,
                },
            ),
            ("quit", Quit { grace: five }),
            (
                "quit -t 0",
                Quit {
                    grace: Duration::ZERO,
                },
            ),
            ("status", Status),
            ("save_config", SaveConfig),
            (
                "get_client_list 12",
                GetClientList {
                    server: 12,
                    verbose: false,
                },
            ),
            (
                "get_client_list 12 -v",
                GetClientList {
                    server: 12,
                    verbose: true,
                },
            ),
            (
                "terminate_client 12 34",
                TerminateClient {
                    server: 12,
                    client: 34,
                },
            ),
            ("set_default_client_priority 1", SetDefaultClientPriority(1)),
            ("get_default_client_priority", GetDefaultClientPriority),
            (
                "set_default_active_thread_percentage 25%",
                SetDefaultActiveThreadPercentage(25),
            ),
            (
                "get_default_active_thread_percentage",
                GetDefaultActiveThreadPercentage,
            ),
            (
                "set_active_thread_percentage 12 100",
                SetActiveThreadPercentage {
                    server: 12,
                    percent: 100,
                },
            ),
            (
                "get_active_thread_percentage 12",
                GetActiveThreadPercentage { server: 12 },
            ),
            (
                "set_max_sm_reservation default 0",
                SetMaxSmReservation {
                    target: Target::Default,
                    percent: 0,
                },
            ),
            (
                "set_max_sm_reservation 12 60",
                SetMaxSmReservation {
                    target: Target::Server(12),
                    percent: 60,
                },
            ),
            (
                "get_max_sm_reservation default",
                GetMaxSmReservation(Target::Default),
            ),
            (
                "get_max_sm_reservation 12",
                GetMaxSmReservation(Target::Server(12)),
            ),
            (
                "set_default_device_pinned_mem_limit 1 2GiB",
                SetDefaultDevicePinnedMemLimit {
                    device: 1,
                    bytes: 2 << 30,
                },
            ),
            (
                "get_default_device_pinned_mem_limit 0",
                GetDefaultDevicePinnedMemLimit { device: 0 },
            ),
            (
                "set_device_pinned_mem_limit 12 1 1MiB",
                SetDevicePinnedMemLimit {
                    server: 12,
                    device: 1,
                    bytes: 1 << 20,
                },
            ),
            // Spaces around and between words do not matter.
            ("  status  ", Status),
        ];
        for (line, want) in &cases {
            assert_eq!(
                &parse(line).unwrap_or_else(|e| panic!("{line:?}: {e}")),
                want
            );
        }
        // Every command of the table has a case above.
        let covered: BTreeSet<&str> = cases
            .iter()
            .filter_map(|(line, _)| line.split_whitespace().next())
            .collect();
        for (name, _) in USAGES {
            assert!(covered.contains(name), "no parse case for {name}");
        }
    }

    #[test]
    fn bad_lines_get_a_one_line_error_with_the_usage() {
        let bad = [
            ("", "empty command"),
            (
                "frobnicate",
                "unknown command \"frobnicate\"; commands: get_server_list [device], ",
            ),
            ("get_server_list now", "usage: get_server_list [device]"),
            ("get_server_status", "usage: get_server_status <server-pid>"),
            (
                "get_server_status abc",
                "usage: get_server_status <server-pid>",
            ),
            (
                "get_server_status -1",
                "usage: get_server_status <server-pid>",
            ),
            (
                "shutdown_server",
                "usage: shutdown_server <server-pid> [-f]",
            ),
            (
                "shutdown_server 12 -x",
                "usage: shutdown_server <server-pid> [-f]",
            ),
            ("quit -t soon", "usage: quit [-t <seconds>]"),
            ("quit now", "usage: quit [-t <seconds>]"),
            ("status -v", "usage: status"),
            ("save_config now", "usage: save_config"),
            (
                "get_client_list",
                "usage: get_client_list <server-pid> [-v]",
            ),
            (
                "get_client_list 12 -x",
                "usage: get_client_list <server-pid> [-v]",
            ),
            (
                "terminate_client 12",
                "usage: terminate_client <server-pid> <client-pid>",
            ),
            (
                "terminate_client 12 me",
                "usage: terminate_client <server-pid> <client-pid>",
            ),
            (
                "set_default_client_priority 2",
                "usage: set_default_client_priority <0|1>",
            ),
            (
                "get_default_client_priority 0",
                "usage: get_default_client_priority",
            ),
            (
                "set_default_active_thread_percentage 0",
                "usage: set_default_active_thread_percentage <1-100>",
            ),
            (
                "set_default_active_thread_percentage 101",
                "usage: set_default_active_thread_percentage <1-100>",
            ),
            (
                "set_default_active_thread_percentage",
                "usage: set_default_active_thread_percentage <1-100>",
            ),
            (
                "get_default_active_thread_percentage 1",
                "usage: get_default_active_thread_percentage",
            ),
            (
                "set_active_thread_percentage 12",
                "usage: set_active_thread_percentage <server-pid> <1-100>",
            ),
            (
                "get_active_thread_percentage",
                "usage: get_active_thread_percentage <server-pid>",
            ),
            (
                "set_max_sm_reservation default 101",
                "usage: set_max_sm_reservation <server-pid|default> <0-100>",
            ),
            (
                "set_max_sm_reservation everyone 10",
                "usage: set_max_sm_reservation <server-pid|default> <0-100>",
            ),
            (
                "get_max_sm_reservation",
                "usage: get_max_sm_reservation <server-pid|default>",
            ),
            (
                "set_default_device_pinned_mem_limit x 2GiB",
                "usage: set_default_device_pinned_mem_limit <device> <size>",
            ),
            (
                "set_default_device_pinned_mem_limit 0",
                "usage: set_default_device_pinned_mem_limit <device> <size>",
            ),
            (
                "get_default_device_pinned_mem_limit",
                "usage: get_default_device_pinned_mem_limit <device>",
            ),
            (
                "set_device_pinned_mem_limit 12 0",
                "usage: set_device_pinned_mem_limit <server-pid> <device> <size>",
            ),
        ];
        for (line, start) in bad {
            let e = parse(line).expect_err(line);
            assert_eq!(e.status, mps_core::Status::InvalidValue, "{line:?}: {e}");
            assert!(e.message.starts_with(start), "{line:?}: {}", e.message);
            assert!(!e.message.contains('\n'), "{line:?}: {}", e.message);
        }
        // A size that does not parse says why, in one line.
        let e = parse("set_default_device_pinned_mem_limit 0 lots").unwrap_err();
        assert!(!e.message.is_empty() && !e.message.contains('\n'), "{e}");
    }
}
