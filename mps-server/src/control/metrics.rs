//! The daemon's Prometheus endpoint: every server's clients as metrics, in the Prometheus text
//! format as `prometheus-client` writes it (names, HELP and TYPE lines, label escaping).

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, prometheus_text};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Daemon;
use super::groups::GroupUse;
use super::routing::{ServerInfo, ServerState};
use crate::registry::ClientStats;

/// Who a client's samples are about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClientLabels {
    server_pid: u32,
    uid: u32,
    group: String,
    device: u32,
    client_pid: i32,
    client_id: u32,
}

type Value = fn(&ClientStats) -> u64;

/// Which group server a group's samples are about.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GroupLabels {
    group: String,
    uid: u32,
    device: u32,
    server_pid: u32,
}

type GroupValue = fn(&GroupUse) -> u64;

/// Gauges of a configured group's server: its use and its limits (a limit of 0: none).
const GROUP_GAUGES: [(&str, &str, GroupValue); 5] = [
    (
        "mps_group_device_memory_bytes",
        "Device memory a group's clients of one user on one device hold together",
        |g| g.device_bytes,
    ),
    (
        "mps_group_device_memory_limit_bytes",
        "The device-memory limit of a group's clients of one user on one device together (0: none)",
        |g| g.max_device_bytes,
    ),
    (
        "mps_group_clients",
        "Connections a group's server of one user on one device serves",
        |g| g.connections.into(),
    ),
    (
        "mps_group_max_clients",
        "Connections a group's server admits (0: the server's default)",
        |g| g.max_clients,
    ),
    (
        "mps_group_sms",
        "SMs a group's clients of one user on one device run within",
        |g| g.sms.into(),
    ),
];

/// Gauges of a client: name, help, value. The crate adds the final period of each help text.
const GAUGES: [(&str, &str, Value); 7] = [
    (
        "mps_client_device_memory_bytes",
        "Device memory a client holds",
        |c| c.mem,
    ),
    (
        "mps_client_device_memory_limit_bytes",
        "A client's device-memory limit (0: none)",
        |c| c.mem_limit,
    ),
    (
        "mps_client_priority",
        "A client's priority (0 normal, 1 below normal)",
        |c| c.priority.into(),
    ),
    ("mps_client_sms", "SMs a client's kernels may use", |c| {
        c.sms.into()
    }),
    (
        "mps_client_sm_reserved_percent",
        "Percent of the SMs reserved for a client alone",
        |c| c.sm_reserve.into(),
    ),
    (
        "mps_client_batch_cache_entries",
        "Run shapes the launch batching caches for a client",
        |c| c.batch_cache_entries,
    ),
    (
        "mps_client_batch_cache_bytes",
        "Bytes of run shapes the launch batching caches for a client in the server",
        |c| c.batch_cache_bytes,
    ),
];

/// Counters of a client: name without the `_total` the crate appends, help, value.
const COUNTERS: [(&str, &str, Value); 7] = [
    (
        "mps_client_gpu_busy_milliseconds",
        "Time the device had work of a client pending or running",
        |c| c.gpu_ms,
    ),
    ("mps_client_launches", "Kernels a client launched", |c| {
        c.launches
    }),
    ("mps_client_copies", "Copies a client made", |c| c.copies),
    ("mps_client_copied_bytes", "Bytes a client copied", |c| {
        c.bytes_copied
    }),
    (
        "mps_client_batch_hits",
        "Runs of a client's stream work launched from a cached graph (launch batching)",
        |c| c.batch_hits,
    ),
    (
        "mps_client_batch_misses",
        "Runs of a client's stream work held for batching but not launched from a cached graph",
        |c| c.batch_misses,
    ),
    (
        "mps_client_batch_graphs",
        "Graphs the launch batching made of a client's runs",
        |c| c.batch_graphs,
    ),
];

/// The exposition of `servers` and their clients.
fn exposition(servers: &[(ServerInfo, Vec<ClientStats>)], groups: &[GroupUse]) -> String {
    let mut registry = Registry::default();
    if !groups.is_empty() {
        for (name, help, value) in GROUP_GAUGES {
            let family = Family::<GroupLabels, Gauge<u64, AtomicU64>>::default();
            for g in groups {
                let labels = GroupLabels {
                    group: g.group.clone(),
                    uid: g.uid,
                    device: g.device,
                    server_pid: g.server_pid,
                };
                family.get_or_create(&labels).set(value(g));
            }
            registry.register(name, help, family);
        }
    }
    let running: Gauge<u64, AtomicU64> = Gauge::default();
    running.set(servers.len() as u64);
    registry.register("mps_servers", "Running servers", running);
    let faulted: Gauge<u64, AtomicU64> = Gauge::default();
    faulted.set(
        servers
            .iter()
            .filter(|(s, _)| s.state == ServerState::Fault)
            .count() as u64,
    );
    registry.register(
        "mps_servers_faulted",
        "Running servers whose device context failed, draining their clients",
        faulted,
    );
    let samples = || {
        servers.iter().flat_map(|(s, clients)| {
            clients.iter().map(move |c| {
                let labels = ClientLabels {
                    server_pid: s.pid,
                    uid: s.uid,
                    group: s.group.clone(),
                    device: s.device,
                    client_pid: c.pid,
                    client_id: c.id,
                };
                (labels, c)
            })
        })
    };
    for (name, help, value) in GAUGES {
        let family = Family::<ClientLabels, Gauge<u64, AtomicU64>>::default();
        for (labels, c) in samples() {
            family.get_or_create(&labels).set(value(c));
        }
        registry.register(name, help, family);
    }
    for (name, help, value) in COUNTERS {
        let family = Family::<ClientLabels, Counter>::default();
        for (labels, c) in samples() {
            family.get_or_create(&labels).inc_by(value(c));
        }
        registry.register(name, help, family);
    }
    let mut out = String::new();
    // Writing into a String cannot fail, and the registry holds only what was built above.
    prometheus_text::encode(&mut out, &registry).expect("the exposition encodes into a String");
    out
}

impl Daemon {
    /// The Prometheus text exposition of every server's clients.
    pub fn metrics(&self) -> String {
        let servers: Vec<(ServerInfo, Vec<ClientStats>)> = self
            .server_list()
            .into_iter()
            .map(|s| {
                // A server that does not answer still counts as running.
                let clients = self.clients_of(s.pid).unwrap_or_default();
                (s, clients)
            })
            .collect();
        exposition(&servers, &self.group_use())
    }

    /// Serves `GET /metrics` on `listener` until the daemon stops.
    pub fn serve_metrics(self: &Arc<Self>, listener: std::net::TcpListener) {
        let _ = listener.set_nonblocking(true);
        while !self.stop.load(Ordering::Relaxed) {
            let (mut conn, _) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(e) => {
                    tracing::warn!("metrics accept failed: {e}");
                    continue;
                }
            };
            let _ = conn.set_nonblocking(false);
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut request = String::new();
            let _ = BufReader::new(&conn).read_line(&mut request);
            let (status, body) = match request.split_whitespace().collect::<Vec<_>>()[..] {
                ["GET", "/metrics", ..] => ("200 OK", self.metrics()),
                _ => (
                    "404 Not Found",
                    "only GET /metrics is served here\n".to_string(),
                ),
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: \
                 close\r\n\r\n{body}",
                prometheus_text::CONTENT_TYPE,
                body.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(id: u32, pid: i32) -> ClientStats {
        ClientStats {
            id,
            pid,
            uid: 1000,
            mem: 4096,
            mem_limit: 0,
            priority: 1,
            sms: 16,
            sm_share: 100,
            sm_reserve: 25,
            launches: 7,
            copies: 2,
            bytes_copied: 8,
            gpu_ms: 3,
            batch_hits: 9,
            batch_misses: 2,
            batch_graphs: 1,
            batch_cache_entries: 1,
            batch_cache_bytes: 640,
        }
    }

    fn server(pid: u32, group: &str) -> ServerInfo {
        ServerInfo {
            pid,
            uid: 1000,
            group: group.into(),
            device: 0,
            routed: 1,
            uptime: Duration::ZERO,
            state: ServerState::Active,
            limits: Default::default(),
            priority: 0,
        }
    }

    #[test]
    fn every_family_has_help_type_and_one_sample_per_client() {
        let text = exposition(
            &[
                (server(10, "default"), vec![client(1, 500), client(2, 501)]),
                (
                    ServerInfo {
                        device: 1,
                        ..server(11, "critical")
                    },
                    vec![client(1, 600)],
                ),
            ],
            &[],
        );
        assert!(
            text.contains("# HELP mps_servers Running servers.\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE mps_servers gauge\nmps_servers 2\n"),
            "{text}"
        );
        assert!(text.contains("mps_servers_faulted 0\n"), "{text}");
        for (name, help, _) in GAUGES {
            assert!(text.contains(&format!("# HELP {name} {help}.\n")), "{text}");
            assert!(text.contains(&format!("# TYPE {name} gauge\n")), "{text}");
        }
        for (name, help, _) in COUNTERS {
            let name = format!("{name}_total");
            assert!(text.contains(&format!("# HELP {name} {help}.\n")), "{text}");
            assert!(text.contains(&format!("# TYPE {name} counter\n")), "{text}");
        }
        let sample = "mps_client_launches_total{server_pid=\"11\",uid=\"1000\",\
                      group=\"critical\",device=\"1\",client_pid=\"600\",client_id=\"1\"} 7\n";
        assert!(text.contains(sample), "{text}");
        let hits = "mps_client_batch_hits_total{server_pid=\"10\",uid=\"1000\",\
                    group=\"default\",device=\"0\",client_pid=\"501\",client_id=\"2\"} 9\n";
        assert!(text.contains(hits), "{text}");
        let samples = |name: &str| {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .count()
        };
        assert_eq!(samples("mps_client_sm_reserved_percent"), 3, "{text}");
        assert_eq!(samples("mps_client_copied_bytes_total"), 3, "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let text = exposition(&[(server(10, "a\"b\\c\nd"), vec![client(1, 500)])], &[]);
        assert!(
            text.contains("group=\"a\\\"b\\\\c\\nd\""),
            "the group's quote, backslash and newline must be escaped:\n{text}"
        );
        // No sample line is broken by the newline in the group name.
        assert!(
            text.lines()
                .all(|l| l.starts_with('#') || l.starts_with("mps_")),
            "{text}"
        );
    }

    #[test]
    fn a_server_whose_context_failed_counts_as_faulted_while_it_drains() {
        let mut failed = server(10, "default");
        failed.state = ServerState::Fault;
        let text = exposition(
            &[
                (failed, vec![client(1, 500)]),
                (server(11, "default"), vec![client(1, 501)]),
            ],
            &[],
        );
        assert!(text.contains("mps_servers 2\n"), "{text}");
        assert!(text.contains("mps_servers_faulted 1\n"), "{text}");
    }

    #[test]
    fn a_groups_use_and_limits_are_gauges_of_its_server() {
        let group = GroupUse {
            group: "train".into(),
            uid: 1000,
            device: 1,
            server_pid: 12,
            connections: 3,
            max_clients: 8,
            device_bytes: 4096,
            max_device_bytes: 1 << 30,
            sms: 66,
            sm_range: (0, 50),
            priority: 1,
        };
        let text = exposition(&[(server(12, "train"), vec![])], &[group]);
        let labels = "{group=\"train\",uid=\"1000\",device=\"1\",server_pid=\"12\"}";
        for (name, value) in [
            ("mps_group_device_memory_bytes", 4096),
            ("mps_group_device_memory_limit_bytes", 1 << 30),
            ("mps_group_clients", 3),
            ("mps_group_max_clients", 8),
            ("mps_group_sms", 66),
        ] {
            assert!(
                text.contains(&format!("{name}{labels} {value}\n")),
                "{text}"
            );
        }
        assert!(!exposition(&[], &[]).contains("mps_group_"));
    }

    #[test]
    fn no_servers_is_a_valid_exposition() {
        let text = exposition(&[], &[]);
        assert!(text.contains("mps_servers 0\n"), "{text}");
        assert!(
            !text.lines().any(|l| l.starts_with("mps_client_")),
            "{text}"
        );
    }
}
