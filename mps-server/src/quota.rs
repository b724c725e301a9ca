//! What the clients of one process, and of one user, hold together in a server: device memory
//! and host-buffer bytes. A client's own limits are checked in its session; these sums are
//! what a user opening many connections, or many processes, would otherwise escape them by.
//!
//! Each session holds a `Charges` on the server's [`Ledger`]; what it charged goes back when
//! it is freed, and all of it when the session ends (the charges are dropped with it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mps_core::{Error, Result, Status};

/// Bytes one process or user holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Held {
    device: u64,
    host: u64,
    /// Sessions charging to it; the entry goes when the last one ends.
    sessions: usize,
}

#[derive(Debug, Default)]
struct Books {
    users: HashMap<u32, Held>,
    processes: HashMap<i32, Held>,
    /// Device memory of every client of the server together.
    device: u64,
}

/// The server's sums, by user, by process and of all its clients.
#[derive(Debug, Default)]
pub struct Ledger {
    books: Mutex<Books>,
    /// Device memory all the server's clients may hold together (0: no limit): the limit of
    /// its group under mps-control. Lowering it takes nothing a client holds; it refuses the
    /// allocations that would pass it.
    max_device: AtomicU64,
}

/// What a charge is counted against: a process's device memory (the client limit holds for
/// all of a process's connections together), a user's device memory and host-buffer bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// Device memory of one process (0: none): the client's limit.
    pub(crate) process_device: u64,
    /// Device memory of one user (0: none).
    pub(crate) user_device: u64,
    /// Host-buffer bytes of one user.
    pub(crate) user_host: u64,
}

impl Ledger {
    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A session's account: charges of client process `pid` of user `uid`.
    pub(crate) fn open(self: &Arc<Self>, uid: u32, pid: i32) -> Charges {
        let mut books = self.books();
        books.users.entry(uid).or_default().sessions += 1;
        books.processes.entry(pid).or_default().sessions += 1;
        Charges {
            ledger: self.clone(),
            uid,
            pid,
            device: 0,
            host: 0,
        }
    }

    /// Device memory every client of this server holds together.
    pub fn device_bytes(&self) -> u64 {
        self.books().device
    }

    /// The limit on [`Ledger::device_bytes`] (0: none).
    pub fn max_device_bytes(&self) -> u64 {
        self.max_device.load(Ordering::Relaxed)
    }

    /// Sets the limit on [`Ledger::device_bytes`] (0: none).
    pub fn set_max_device_bytes(&self, bytes: u64) {
        self.max_device.store(bytes, Ordering::Relaxed);
    }

    /// Device memory user `uid` holds in this server.
    pub fn user_device_bytes(&self, uid: u32) -> u64 {
        self.books().users.get(&uid).map_or(0, |h| h.device)
    }
}

/// One session's charges on the [`Ledger`].
#[derive(Debug)]
pub(crate) struct Charges {
    ledger: Arc<Ledger>,
    uid: u32,
    pid: i32,
    device: u64,
    host: u64,
}

fn past(limit: &str, flag: &str, what: String) -> Error {
    Error::new(
        Status::QuotaExceeded,
        format!("{what} ({limit}, mps-server {flag})"),
    )
}

impl Charges {
    /// Charges `bytes` of device memory (what an allocation takes, not what it asked), if the
    /// process and the user stay within `bounds`.
    pub(crate) fn device(&mut self, bytes: u64, bounds: &Bounds) -> Result<()> {
        let mut books = self.ledger.books();
        let process = books.processes.get(&self.pid).map_or(0, |h| h.device);
        let user = books.users.get(&self.uid).map_or(0, |h| h.device);
        let limit = bounds.process_device;
        if limit != 0 && process.checked_add(bytes).is_none_or(|t| t > limit) {
            return Err(Error::new(
                Status::QuotaExceeded,
                format!(
                    "allocating {bytes} bytes on top of the {process} that process {} holds \
                     through all its connections would pass its device-memory limit of {limit} \
                     bytes (MPS_PINNED_DEVICE_MEM_LIMIT, or the operator's \
                     set_device_pinned_mem_limit)",
                    self.pid
                ),
            ));
        }
        let limit = bounds.user_device;
        if limit != 0 && user.checked_add(bytes).is_none_or(|t| t > limit) {
            return Err(past(
                "per user",
                "--max-user-device-bytes",
                format!(
                    "allocating {bytes} bytes on top of the {user} that uid {} holds in this \
                     server would pass its device-memory limit of {limit} bytes",
                    self.uid
                ),
            ));
        }
        let (all, limit) = (books.device, self.ledger.max_device_bytes());
        if limit != 0 && all.checked_add(bytes).is_none_or(|t| t > limit) {
            return Err(past(
                "for all its clients together: its group's device_mem_limit under mps-control",
                "--max-device-bytes",
                format!(
                    "allocating {bytes} bytes on top of the {all} that all the clients of this \
                     server hold would pass their device-memory limit of {limit} bytes"
                ),
            ));
        }
        Self::add(&mut books, self.uid, self.pid, bytes, 0);
        self.device += bytes;
        Ok(())
    }

    /// Charges `bytes` of host buffers, if the user stays within `bounds`.
    pub(crate) fn host(&mut self, bytes: u64, bounds: &Bounds) -> Result<()> {
        let mut books = self.ledger.books();
        let user = books.users.get(&self.uid).map_or(0, |h| h.host);
        let limit = bounds.user_host;
        if user.checked_add(bytes).is_none_or(|t| t > limit) {
            return Err(past(
                "max_user_host_bytes per user",
                "--max-user-host-bytes",
                format!(
                    "a host buffer of {bytes} bytes on top of the {user} that uid {} holds in \
                     this server would pass its limit of {limit} bytes",
                    self.uid
                ),
            ));
        }
        Self::add(&mut books, self.uid, self.pid, 0, bytes);
        self.host += bytes;
        Ok(())
    }

    /// Gives back `bytes` of device memory charged before.
    pub(crate) fn free_device(&mut self, bytes: u64) {
        let bytes = bytes.min(self.device);
        self.device -= bytes;
        Self::sub(&mut self.ledger.books(), self.uid, self.pid, bytes, 0);
    }

    /// Gives back `bytes` of host buffers charged before.
    pub(crate) fn free_host(&mut self, bytes: u64) {
        let bytes = bytes.min(self.host);
        self.host -= bytes;
        Self::sub(&mut self.ledger.books(), self.uid, self.pid, 0, bytes);
    }

    fn add(books: &mut Books, uid: u32, pid: i32, device: u64, host: u64) {
        books.device += device;
        for h in [
            books.users.entry(uid).or_default(),
            books.processes.entry(pid).or_default(),
        ] {
            h.device += device;
            h.host += host;
        }
    }

    fn sub(books: &mut Books, uid: u32, pid: i32, device: u64, host: u64) {
        books.device = books.device.saturating_sub(device);
        for h in [books.users.get_mut(&uid), books.processes.get_mut(&pid)]
            .into_iter()
            .flatten()
        {
            h.device = h.device.saturating_sub(device);
            h.host = h.host.saturating_sub(host);
        }
    }
}

impl Drop for Charges {
    /// The session has ended: all it held is given back.
    fn drop(&mut self) {
        let mut books = self.ledger.books();
        Self::sub(&mut books, self.uid, self.pid, self.device, self.host);
        if let Some(h) = books.users.get_mut(&self.uid) {
            h.sessions -= 1;
            if h.sessions == 0 {
                books.users.remove(&self.uid);
            }
        }
        if let Some(h) = books.processes.get_mut(&self.pid) {
            h.sessions -= 1;
            if h.sessions == 0 {
                books.processes.remove(&self.pid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        process_device: 1000,
        user_device: 1500,
        user_host: 4096,
    };

    #[test]
    fn a_processs_connections_share_its_limit_and_a_users_processes_share_theirs() {
        let ledger = Arc::new(Ledger::default());
        let (mut a1, mut a2) = (ledger.open(7, 100), ledger.open(7, 100));
        a1.device(600, &BOUNDS).unwrap();
        let e = a2.device(600, &BOUNDS).unwrap_err();
        assert!(e.message.contains("process 100"), "{}", e.message);
        let mut b = ledger.open(7, 200);
        b.device(800, &BOUNDS).unwrap();
        let e = b.device(200, &BOUNDS).unwrap_err();
        assert!(e.message.contains("uid 7"), "{}", e.message);
        // Another user is not counted with them.
        ledger.open(8, 300).device(1000, &BOUNDS).unwrap();
        // Freed bytes, and an ended session's, come back.
        b.free_device(800);
        a2.device(400, &BOUNDS).unwrap();
        drop(a1);
        assert_eq!(ledger.user_device_bytes(7), 400);
        drop(a2);
        drop(b);
        assert!(ledger.books().users.is_empty() && ledger.books().processes.is_empty());
    }

    #[test]
    fn every_client_together_is_held_to_the_servers_limit() {
        let ledger = Arc::new(Ledger::default());
        ledger.set_max_device_bytes(1200);
        let (mut a, mut b) = (ledger.open(7, 1), ledger.open(8, 2));
        a.device(700, &BOUNDS).unwrap();
        let e = b.device(600, &BOUNDS).unwrap_err();
        assert_eq!(e.status, Status::QuotaExceeded);
        assert!(e.message.contains("all the clients of this server"), "{e}");
        b.device(500, &BOUNDS).unwrap();
        assert_eq!(ledger.device_bytes(), 1200);
        // A lower limit takes nothing held; it refuses what would pass it.
        ledger.set_max_device_bytes(100);
        assert!(a.device(1, &BOUNDS).is_err());
        drop(a);
        a = ledger.open(7, 1);
        assert!(a.device(1, &BOUNDS).is_err(), "500 held is still past 100");
        drop(b);
        a.device(100, &BOUNDS).unwrap();
    }

    #[test]
    fn host_bytes_are_bounded_per_user() {
        let ledger = Arc::new(Ledger::default());
        let (mut a, mut b) = (ledger.open(7, 1), ledger.open(7, 2));
        a.host(4096, &BOUNDS).unwrap();
        assert!(b.host(1, &BOUNDS).is_err());
        a.free_host(4096);
        b.host(4096, &BOUNDS).unwrap();
    }
}
