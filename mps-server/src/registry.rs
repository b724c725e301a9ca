//! What a server knows of its live clients, for the control daemon: who they are, what they hold,
//! what they did; and the server-wide settings new clients start from.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use mps_core::alloc::AllocTable;
use mps_core::{Error, Result, Status};

use crate::backend::SmSlot;
use crate::control::wire::{ServerAnswer, ServerRequest};
use crate::outbox::Outbox;
use crate::quota::Ledger;
use crate::sm::{self, Assignment, Placement, SmRequest};

/// Applies an SM placement to the device ([`crate::backend::Backend::place`]).
pub type Placer = Box<dyn Fn(&[Assignment]) -> Result<()> + Send + Sync>;

/// Counters of one client's work.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) launches: AtomicU64,
    pub(crate) copies: AtomicU64,
    pub(crate) bytes_copied: AtomicU64,
    /// Launch batching: runs launched from a cached graph.
    pub(crate) batch_hits: AtomicU64,
    /// Runs held for batching but not launched from a cached graph.
    pub(crate) batch_misses: AtomicU64,
    /// Graphs made of runs.
    pub(crate) batch_graphs: AtomicU64,
    /// Shapes learned, and held runs that left the shape they followed (the server's log says
    /// them when the client goes: why runs miss their graphs).
    pub(crate) batch_learned: AtomicU64,
    pub(crate) batch_diverged: AtomicU64,
    /// Shapes cached now, and the bytes they hold.
    pub(crate) batch_entries: AtomicU64,
    pub(crate) batch_bytes: AtomicU64,
    /// Launches that failed (refused by the server's checks or by the driver).
    pub(crate) launch_failures: AtomicU64,
}

impl Stats {
    pub(crate) fn launched(&self) {
        self.launches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn copied(&self, bytes: u64) {
        self.copies.fetch_add(1, Ordering::Relaxed);
        self.bytes_copied.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn batch_hit(&self) {
        self.batch_hits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn batch_missed(&self) {
        self.batch_misses.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn batch_learned(&self) {
        self.batch_learned.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a held run that left its shape; returns how many did so far.
    pub(crate) fn batch_diverged(&self) -> u64 {
        self.batch_diverged.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn batch_instantiated(&self) {
        self.batch_graphs.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a failed launch; says whether to log it: a client's first eight, then every
    /// power of two, so that a client that fails launches on purpose cannot fill the log.
    pub(crate) fn launch_failed(&self) -> Option<u64> {
        let n = self.launch_failures.fetch_add(1, Ordering::Relaxed) + 1;
        (n <= 8 || n.is_power_of_two()).then_some(n)
    }

    pub(crate) fn batch_cache(&self, entries: u64, bytes: u64) {
        self.batch_entries.store(entries, Ordering::Relaxed);
        self.batch_bytes.store(bytes, Ordering::Relaxed);
    }
}

/// What one client holds and did, as the control daemon sees it: a server's answer to its
/// `Clients` request has one per connection.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientStats {
    /// The server's id of the connection.
    pub id: u32,
    /// The client's process id.
    pub pid: i32,
    /// The client's user id.
    pub uid: u32,
    /// Device memory it holds, in bytes.
    pub mem: u64,
    /// Its device-memory limit in bytes (0: none).
    pub mem_limit: u64,
    /// Its priority (0 normal, 1 below normal).
    pub priority: u32,
    /// SMs its kernels may use.
    pub sms: u32,
    /// The SM share in force for it, percent.
    pub sm_share: u32,
    /// The SMs reserved for it alone, percent (0: none).
    pub sm_reserve: u32,
    /// Kernels it launched.
    pub launches: u64,
    /// Copies it made.
    pub copies: u64,
    /// Bytes it copied.
    pub bytes_copied: u64,
    /// Time the device had its work pending or running, in milliseconds.
    pub gpu_ms: u64,
    /// Launch batching: runs launched from a cached graph.
    #[serde(default)]
    pub batch_hits: u64,
    /// Runs held for batching but not launched from a cached graph (a graph was made for
    /// them, or they diverged from every cached shape and ran command by command).
    #[serde(default)]
    pub batch_misses: u64,
    /// Graphs made of runs (instantiations).
    #[serde(default)]
    pub batch_graphs: u64,
    /// Run shapes cached now.
    #[serde(default)]
    pub batch_cache_entries: u64,
    /// Bytes the cached shapes hold in the server (the driver's memory for their graphs is
    /// not seen).
    #[serde(default)]
    pub batch_cache_bytes: u64,
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
    /// Where its kernels run.
    pub(crate) sm: Arc<SmSlot>,
    /// GPU busy time, in nanoseconds.
    pub(crate) busy_ns: Arc<AtomicU64>,
    /// The SM share it asked for, in percent (100 unless it lowered it).
    pub(crate) sm_share: AtomicU32,
    /// The SMs reserved for it, in percent (0: none).
    pub(crate) sm_reserve: AtomicU32,
    /// The SMs it was last told it runs on (0: never told). The CUDA library reports them to
    /// the program as the device's multiprocessor count, and libraries size kernels by that
    /// count (cuDNN's training kernels fail or never finish on fewer SMs), so another client's
    /// reservation may not take its SMs below it.
    pub(crate) told_sms: AtomicU32,
}

/// What a server's clients start from: the operator's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// Device memory per client in bytes (0: no limit).
    pub mem_limit: u64,
    /// Client priority.
    pub priority: u32,
    /// Share of the SMs per client, percent.
    pub sm_share: u32,
    /// Ceiling on the SMs the server's clients may reserve in all, percent.
    pub max_sm_reserve: u32,
}

/// The server's SM policy: the device's units and what the operator allows.
struct SmPolicy {
    /// The units the clients are placed on: the device's, or those of the part of it the
    /// server is confined to.
    units: Vec<u32>,
    /// For a confined server, the device's index of each of `units`.
    confined: Option<Vec<usize>>,
    /// SMs of the whole device.
    device_sms: u32,
    share: AtomicU32,
    max_reserve: AtomicU32,
    placer: Placer,
}

impl std::fmt::Debug for SmPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmPolicy")
            .field("units", &self.units)
            .field("share", &self.share)
            .field("max_reserve", &self.max_reserve)
            .finish()
    }
}

/// Every live client of a server, by client id, the settings new clients get, and where each
/// client's kernels run.
#[derive(Debug)]
pub struct Registry {
    clients: Mutex<BTreeMap<u32, ClientEntry>>,
    default_mem_limit: AtomicU64,
    default_priority: AtomicU32,
    sm: SmPolicy,
    /// The units each reservation held in the last plan, so that the next keeps them.
    reserved: Mutex<BTreeMap<u32, Placement>>,
    /// What each user and process holds, all its clients together.
    ledger: Arc<Ledger>,
}

impl Registry {
    /// A registry for a device cut into SM `units` (see [`crate::sm`]), whose placements
    /// `placer` applies.
    pub fn new(defaults: Defaults, units: Vec<u32>, placer: Placer) -> Registry {
        Registry {
            clients: Mutex::new(BTreeMap::new()),
            default_mem_limit: AtomicU64::new(defaults.mem_limit),
            default_priority: AtomicU32::new(defaults.priority),
            sm: SmPolicy {
                device_sms: units.iter().sum(),
                units,
                confined: None,
                share: AtomicU32::new(defaults.sm_share),
                max_reserve: AtomicU32::new(defaults.max_sm_reserve),
                placer,
            },
            reserved: Mutex::new(BTreeMap::new()),
            ledger: Arc::default(),
        }
    }

    /// Confines every client to the part of the device from `from` to `to` percent of its SMs
    /// (its group's share or reservation); shares and reservations are then of that part.
    /// A device whose SMs cannot be partitioned runs every client on all of them, as it runs
    /// every share there (the server's log says so).
    pub fn confined(mut self, from: u32, to: u32) -> Result<Registry> {
        if (from, to) == (0, 100) {
            return Ok(self);
        }
        if self.sm.units.len() == 1 {
            tracing::warn!(
                "this device's SMs cannot be partitioned, so its clients run on all of them, not \
                 on the {from}-{to}% their group is given"
            );
            return Ok(self);
        }
        let set = sm::range(&self.sm.units, from, to)?;
        self.sm.units = set.iter().map(|&u| self.sm.units[u]).collect();
        self.sm.confined = Some(set);
        Ok(self)
    }

    /// `placement` on the server's units as the device's.
    fn on_device(&self, placement: &Placement) -> Placement {
        match (&self.sm.confined, placement) {
            (None, p) => p.clone(),
            (Some(set), Placement::Whole) => Placement::Units(set.clone()),
            (Some(set), Placement::Units(u)) => {
                Placement::Units(u.iter().map(|&i| set[i]).collect())
            }
        }
    }

    /// What each user and process holds in this server, all its clients together.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Places every client anew and tells each where it runs. On failure nothing changes.
    fn replan(&self, clients: &BTreeMap<u32, ClientEntry>) -> Result<()> {
        self.replan_for(clients, None)
    }

    /// As [`Registry::replan`], for a reservation of client `reserver` (if any): the plan is
    /// refused if it leaves another client fewer SMs than it was told.
    fn replan_for(
        &self,
        clients: &BTreeMap<u32, ClientEntry>,
        reserver: Option<u32>,
    ) -> Result<()> {
        let mut reserved = self.reserved.lock().unwrap_or_else(|p| p.into_inner());
        let requests: Vec<SmRequest> = clients
            .iter()
            .map(|(id, c)| SmRequest {
                client: *id,
                share: self.share_of(c),
                reserve: c.sm_reserve.load(Ordering::Relaxed),
                current: reserved.get(id).cloned(),
            })
            .collect();
        let plan = sm::plan(&self.sm.units, &requests)?;
        if let Some(reserver) = reserver {
            check_told(clients, &plan, reserver)?;
        }
        let placed: Vec<Assignment> = plan
            .iter()
            .map(|a| Assignment {
                placement: self.on_device(&a.placement),
                ..a.clone()
            })
            .collect();
        (self.sm.placer)(&placed)?;
        reserved.clear();
        for (a, on_device) in plan.iter().zip(&placed) {
            if let Some(c) = clients.get(&a.client) {
                c.sm.set(&on_device.placement, a.sms);
                if c.sm_reserve.load(Ordering::Relaxed) > 0 {
                    reserved.insert(a.client, a.placement.clone());
                }
            }
        }
        Ok(())
    }

    fn replan_or_log(&self, clients: &BTreeMap<u32, ClientEntry>) {
        if let Err(e) = self.replan(clients) {
            tracing::error!("cannot place clients on SMs: {}", e.message);
        }
    }

    /// Lowers client `id`'s SM share to `percent`.
    pub(crate) fn set_sm_share(&self, id: u32, percent: u32) -> Result<()> {
        let clients = self.clients();
        let c = clients.get(&id).ok_or_else(|| unknown_client(id))?;
        c.sm_share.fetch_min(percent, Ordering::Relaxed);
        self.replan(&clients)
    }

    /// Reserves `percent` of the SMs for client `id`, within the operator's ceiling.
    pub(crate) fn reserve_sms(&self, id: u32, percent: u32) -> Result<()> {
        let clients = self.clients();
        let c = clients.get(&id).ok_or_else(|| unknown_client(id))?;
        // Every change of reservations moves other clients' streams (each move waits for their
        // queued work), so a client reserves once, when it connects.
        if c.sm_reserve.load(Ordering::Relaxed) > 0 {
            return Err(Error::invalid_value(
                "this client already reserved SMs; a reservation is made once, when the client \
                 connects (MPS_SM_RESERVE)",
            ));
        }
        let others: u32 = clients
            .iter()
            .filter(|(other, _)| **other != id)
            .map(|(_, c)| c.sm_reserve.load(Ordering::Relaxed))
            .sum();
        let max = self.sm.max_reserve.load(Ordering::Relaxed);
        if others + percent > max {
            return Err(Error::new(
                Status::QuotaExceeded,
                format!(
                    "reserving {percent}% of the SMs would bring this server's reservations to \
                     {}%, above the {max}% the operator allows (set_max_sm_reservation)",
                    others + percent
                ),
            ));
        }
        let before = c.sm_reserve.swap(percent, Ordering::Relaxed);
        self.replan_for(&clients, Some(id)).inspect_err(|_| {
            c.sm_reserve.store(before, Ordering::Relaxed);
        })
    }

    /// `[sms, device sms, share percent, reserved percent]` of client `id`.
    pub(crate) fn sm_info(&self, id: u32) -> Result<[u64; 4]> {
        let clients = self.clients();
        let c = clients.get(&id).ok_or_else(|| unknown_client(id))?;
        let info = self.sm_of(c);
        c.told_sms.store(info[0] as u32, Ordering::Relaxed);
        Ok(info)
    }

    /// The SM share in force for `c`: the lower of its own and the server's.
    fn share_of(&self, c: &ClientEntry) -> u32 {
        c.sm_share
            .load(Ordering::Relaxed)
            .min(self.sm.share.load(Ordering::Relaxed))
    }

    /// `[sms, device sms, share percent, reserved percent]` of `c`.
    fn sm_of(&self, c: &ClientEntry) -> [u64; 4] {
        let total: u32 = self.sm.units.iter().sum();
        let sms = match c.sm.sms.load(Ordering::Relaxed) {
            0 => total,
            n => n,
        };
        [
            sms as u64,
            self.sm.device_sms as u64,
            self.share_of(c) as u64,
            c.sm_reserve.load(Ordering::Relaxed) as u64,
        ]
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

    /// How many clients are connected.
    pub(crate) fn connected(&self) -> usize {
        self.clients().len()
    }

    pub(crate) fn add(&self, id: u32, entry: ClientEntry) {
        let mut clients = self.clients();
        clients.insert(id, entry);
        self.replan_or_log(&clients);
    }

    pub(crate) fn remove(&self, id: u32) {
        let mut clients = self.clients();
        if clients.remove(&id).is_some_and(|c| {
            c.sm_reserve.load(Ordering::Relaxed) > 0 || c.sm.sms.load(Ordering::Relaxed) > 0
        }) {
            // Its SMs go back to the others.
            self.replan_or_log(&clients);
        }
    }

    /// What every live client holds and did, by client id.
    pub(crate) fn client_stats(&self) -> Vec<ClientStats> {
        self.clients()
            .iter()
            .map(|(id, c)| {
                let [sms, _, share, reserve] = self.sm_of(c);
                ClientStats {
                    id: *id,
                    pid: c.pid,
                    uid: c.uid,
                    mem: c
                        .allocations
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .bytes(),
                    mem_limit: c.mem_limit.load(Ordering::Relaxed),
                    priority: c.priority.load(Ordering::Relaxed),
                    sms: sms as u32,
                    sm_share: share as u32,
                    sm_reserve: reserve as u32,
                    launches: c.stats.launches.load(Ordering::Relaxed),
                    copies: c.stats.copies.load(Ordering::Relaxed),
                    bytes_copied: c.stats.bytes_copied.load(Ordering::Relaxed),
                    gpu_ms: c.busy_ns.load(Ordering::Relaxed) / 1_000_000,
                    batch_hits: c.stats.batch_hits.load(Ordering::Relaxed),
                    batch_misses: c.stats.batch_misses.load(Ordering::Relaxed),
                    batch_graphs: c.stats.batch_graphs.load(Ordering::Relaxed),
                    batch_cache_entries: c.stats.batch_entries.load(Ordering::Relaxed),
                    batch_cache_bytes: c.stats.batch_bytes.load(Ordering::Relaxed),
                }
            })
            .collect()
    }

    /// Answers a request of the control daemon.
    pub(crate) fn answer(&self, request: ServerRequest) -> Result<ServerAnswer> {
        match request {
            ServerRequest::Clients => Ok(ServerAnswer::Clients(self.client_stats())),
            ServerRequest::Terminate { client_pid } => {
                let clients = self.clients();
                let matching: Vec<_> = clients.values().filter(|c| c.pid == client_pid).collect();
                if matching.is_empty() {
                    return Err(Error::new(
                        Status::NotFound,
                        format!("no client with pid {client_pid} on this server"),
                    ));
                }
                for c in &matching {
                    c.outbox.disconnect("terminated by the operator".into());
                }
                Ok(ServerAnswer::Terminated {
                    connections: matching.len() as u32,
                })
            }
            ServerRequest::SetPriority(level) => {
                if level > mps_core::protocol::PRIORITY_BELOW_NORMAL {
                    return Err(Error::invalid_value(format!(
                        "priority {level}: 0 (normal) or 1 (below normal)"
                    )));
                }
                self.default_priority.store(level, Ordering::Relaxed);
                Ok(ServerAnswer::Done)
            }
            ServerRequest::SetShare(percent) => {
                check_percent(percent, 1, "an SM share")?;
                let clients = self.clients();
                let before = self.sm.share.swap(percent, Ordering::Relaxed);
                if let Err(e) = self.replan(&clients) {
                    self.sm.share.store(before, Ordering::Relaxed);
                    return Err(e);
                }
                Ok(ServerAnswer::Done)
            }
            ServerRequest::GetShare => {
                Ok(ServerAnswer::Percent(self.sm.share.load(Ordering::Relaxed)))
            }
            ServerRequest::SetMaxReserve(percent) => {
                check_percent(percent, 0, "an SM reservation ceiling")?;
                // Reservations already made stay; the ceiling applies to new ones.
                self.sm.max_reserve.store(percent, Ordering::Relaxed);
                Ok(ServerAnswer::Done)
            }
            ServerRequest::GetMaxReserve => Ok(ServerAnswer::Percent(
                self.sm.max_reserve.load(Ordering::Relaxed),
            )),
            ServerRequest::SetMemLimit(bytes) => {
                self.default_mem_limit.store(bytes, Ordering::Relaxed);
                Ok(ServerAnswer::Done)
            }
            ServerRequest::SetMaxDeviceBytes(bytes) => {
                self.ledger.set_max_device_bytes(bytes);
                Ok(ServerAnswer::Done)
            }
            ServerRequest::Totals => Ok(ServerAnswer::Totals {
                device_bytes: self.ledger.device_bytes(),
                max_device_bytes: self.ledger.max_device_bytes(),
                connections: self.connected() as u32,
                sms: self.sm.units.iter().sum(),
            }),
        }
    }
}

/// Refuses a percentage outside `min..=100` (the daemon checks too; a server does not rely on it).
fn check_percent(percent: u32, min: u32, what: &str) -> Result<()> {
    if (min..=100).contains(&percent) {
        Ok(())
    } else {
        Err(Error::invalid_value(format!(
            "{what} of {percent}% is outside {min}-100%"
        )))
    }
}

/// Refuses `plan`, made for a reservation of client `reserver`, where it gives another client
/// fewer SMs than that client was told.
fn check_told(
    clients: &BTreeMap<u32, ClientEntry>,
    plan: &[Assignment],
    reserver: u32,
) -> Result<()> {
    for a in plan.iter().filter(|a| a.client != reserver) {
        let Some(c) = clients.get(&a.client) else {
            continue;
        };
        let told = c.told_sms.load(Ordering::Relaxed);
        if told > a.sms {
            let reserve = clients
                .get(&reserver)
                .map_or(0, |r| r.sm_reserve.load(Ordering::Relaxed));
            return Err(Error::new(
                Status::QuotaExceeded,
                format!(
                    "reserving {reserve}% of the SMs would leave client {} (pid {}) {} SMs, \
                     fewer than the {told} it was told when it connected, and kernels sized for \
                     those (cuDNN's are) fail or never finish on fewer; start the reserving \
                     program before the others, or run it in a group of its own (MPS_GROUP)",
                    a.client, c.pid, a.sms
                ),
            ));
        }
    }
    Ok(())
}

fn unknown_client(id: u32) -> Error {
    Error::internal(format!("client {id} is not registered"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confined_server_places_its_clients_on_its_part_of_the_device_only() {
        let defaults = Defaults {
            mem_limit: 0,
            priority: 0,
            sm_share: 100,
            max_sm_reserve: 50,
        };
        let r = Registry::new(defaults, vec![1; 16], Box::new(|_| Ok(())))
            .confined(25, 75)
            .unwrap();
        assert_eq!(r.sm.units, vec![1; 8]);
        assert_eq!(
            r.on_device(&Placement::Whole),
            Placement::Units((4..12).collect())
        );
        assert_eq!(
            r.on_device(&Placement::Units(vec![0, 7])),
            Placement::Units(vec![4, 11])
        );
        let whole = Registry::new(defaults, vec![1; 16], Box::new(|_| Ok(())))
            .confined(0, 100)
            .unwrap();
        assert_eq!(whole.on_device(&Placement::Whole), Placement::Whole);
        assert!(
            Registry::new(defaults, vec![8, 8], Box::new(|_| Ok(())))
                .confined(60, 100)
                .is_err(),
            "a part holding no whole unit is refused"
        );
        let one = Registry::new(defaults, vec![16], Box::new(|_| Ok(())))
            .confined(50, 100)
            .unwrap();
        assert_eq!(
            one.on_device(&Placement::Whole),
            Placement::Whole,
            "a device that cannot be partitioned is not confined"
        );
    }

    #[test]
    fn failed_launches_are_logged_first_eight_then_at_powers_of_two() {
        let s = Stats::default();
        let logged: Vec<u64> = (0..1000).filter_map(|_| s.launch_failed()).collect();
        assert_eq!(logged, [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128, 256, 512]);
        assert_eq!(s.launch_failures.load(Ordering::Relaxed), 1000);
    }
}
