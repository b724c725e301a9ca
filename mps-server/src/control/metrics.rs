//! The daemon's Prometheus endpoint: every server's clients, as metrics.

use std::io::{BufRead, BufReader, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Daemon;
use crate::registry::ClientStats;

impl Daemon {
    /// The Prometheus text exposition of every server's clients.
    pub fn metrics(&self) -> String {
        let servers: Vec<(u32, u32, String)> = self
            .server_list()
            .into_iter()
            .map(|s| (s.pid, s.uid, s.group))
            .collect();
        // (value, name, type, help) of each family.
        type Family = (
            fn(&ClientStats) -> u64,
            &'static str,
            &'static str,
            &'static str,
        );
        let families: [Family; 9] = [
            (
                |c| c.mem,
                "mps_client_device_memory_bytes",
                "gauge",
                "Device memory a client holds.",
            ),
            (
                |c| c.mem_limit,
                "mps_client_device_memory_limit_bytes",
                "gauge",
                "A client's device-memory limit (0: none).",
            ),
            (
                |c| c.priority as u64,
                "mps_client_priority",
                "gauge",
                "A client's priority (0 normal, 1 below normal).",
            ),
            (
                |c| c.sms as u64,
                "mps_client_sms",
                "gauge",
                "SMs a client's kernels may use.",
            ),
            (
                |c| c.sm_reserve as u64,
                "mps_client_sm_reserved_percent",
                "gauge",
                "Percent of the SMs reserved for a client alone.",
            ),
            (
                |c| c.gpu_ms,
                "mps_client_gpu_busy_milliseconds_total",
                "counter",
                "Time the device had work of a client pending or running.",
            ),
            (
                |c| c.launches,
                "mps_client_launches_total",
                "counter",
                "Kernels a client launched.",
            ),
            (
                |c| c.copies,
                "mps_client_copies_total",
                "counter",
                "Copies a client made.",
            ),
            (
                |c| c.bytes_copied,
                "mps_client_copied_bytes_total",
                "counter",
                "Bytes a client copied.",
            ),
        ];
        let mut rows = Vec::new();
        for (pid, uid, group) in &servers {
            for c in self.clients_of(*pid).unwrap_or_default() {
                let labels = format!(
                    "server_pid=\"{pid}\",uid=\"{uid}\",group=\"{group}\",client_pid=\"{}\",client_id=\"{}\"",
                    c.pid, c.id,
                );
                rows.push((labels, c));
            }
        }
        let mut out = format!(
            "# HELP mps_servers Running servers.\n# TYPE mps_servers gauge\nmps_servers {}\n",
            servers.len()
        );
        for (value, name, kind, help) in families {
            out += &format!("# HELP {name} {help}\n# TYPE {name} {kind}\n");
            for (labels, c) in &rows {
                out += &format!("{name}{{{labels}}} {}\n", value(c));
            }
        }
        out
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
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    }
}
