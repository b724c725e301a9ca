//! What a server knows of its live clients, for the control daemon: who they are, what they hold,
//! what they did; and the server-wide settings new clients start from.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use mps_core::alloc::AllocTable;
use mps_core::{Error, Result, Status};

use crate::outbox::Outbox;

/// Counters of one client's work.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) launches: AtomicU64,
    pub(crate) copies: AtomicU64,
    pub(crate) bytes_copied: AtomicU64,
}

impl Stats {
    pub(crate) fn launched(&self) {
        self.launches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn copied(&self, bytes: u64) {
        self.copies.fetch_add(1, Ordering::Relaxed);
        self.bytes_copied.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// One live client, as the registry sees it.
#[derive(Debug)]
pub(crate) struct ClientEntry {
    pub(crate) pid: i32,
    pub(crate) uid: u32,
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) allocations: Arc<RwLock<AllocTable>>,
    /// Device-memory limit in bytes (0: none).
    pub(crate) mem_limit: Arc<AtomicU64>,
    /// Client priority (`PRIORITY_NORMAL` or `PRIORITY_BELOW_NORMAL`).
    pub(crate) priority: Arc<AtomicU32>,
}

/// Every live client of a server, by client id, and the limit new clients get.
#[derive(Debug, Default)]
pub struct Registry {
    clients: Mutex<BTreeMap<u32, ClientEntry>>,
    default_mem_limit: AtomicU64,
    default_priority: AtomicU32,
}

impl Registry {
    /// A registry whose new clients get `mem_limit` bytes of device memory (0: no limit) and
    /// priority `priority`.
    pub fn new(mem_limit: u64, priority: u32) -> Registry {
        Registry {
            clients: Mutex::new(BTreeMap::new()),
            default_mem_limit: AtomicU64::new(mem_limit),
            default_priority: AtomicU32::new(priority),
        }
    }

    pub(crate) fn default_priority(&self) -> u32 {
        self.default_priority.load(Ordering::Relaxed)
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, ClientEntry>> {
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn default_mem_limit(&self) -> u64 {
        self.default_mem_limit.load(Ordering::Relaxed)
    }

    pub(crate) fn add(&self, id: u32, entry: ClientEntry) {
        self.clients().insert(id, entry);
    }

    pub(crate) fn remove(&self, id: u32) {
        self.clients().remove(&id);
    }

    /// Answers a command of the control daemon (one line; the answer's lines end in `\n`).
    pub fn command(&self, line: &str) -> Result<String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["clients"] => Ok(self
                .clients()
                .iter()
                .map(|(id, c)| {
                    let mem = c
                        .allocations
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .bytes();
                    format!(
                        "id={id} pid={} uid={} mem={} mem_limit={} priority={} launches={} \
                         copies={} bytes_copied={}\n",
                        c.pid,
                        c.uid,
                        mem,
                        c.mem_limit.load(Ordering::Relaxed),
                        c.priority.load(Ordering::Relaxed),
                        c.stats.launches.load(Ordering::Relaxed),
                        c.stats.copies.load(Ordering::Relaxed),
                        c.stats.bytes_copied.load(Ordering::Relaxed),
                    )
                })
                .collect()),
            ["terminate", pid] => {
                let pid: i32 = pid
                    .parse()
                    .map_err(|_| Error::invalid_value("usage: terminate <client-pid>"))?;
                let clients = self.clients();
                let matching: Vec<_> = clients.values().filter(|c| c.pid == pid).collect();
                if matching.is_empty() {
                    return Err(Error::new(
                        Status::NotFound,
                        format!("no client with pid {pid} on this server"),
                    ));
                }
                for c in &matching {
                    c.outbox.disconnect("terminated by the operator".into());
                }
                Ok(format!(
                    "{} connection(s) of client {pid} terminated\n",
                    matching.len()
                ))
            }
            ["set_priority", level] => {
                let level: u32 = level
                    .parse()
                    .ok()
                    .filter(|l| *l <= mps_core::protocol::PRIORITY_BELOW_NORMAL)
                    .ok_or_else(|| Error::invalid_value("usage: set_priority <0|1>"))?;
                self.default_priority.store(level, Ordering::Relaxed);
                Ok("ok\n".into())
            }
            ["set_mem_limit", bytes] => {
                let bytes: u64 = bytes
                    .parse()
                    .map_err(|_| Error::invalid_value("usage: set_mem_limit <bytes>"))?;
                self.default_mem_limit.store(bytes, Ordering::Relaxed);
                Ok("ok\n".into())
            }
            _ => Err(Error::invalid_value(format!(
                "unknown server command {line:?}"
            ))),
        }
    }
}
