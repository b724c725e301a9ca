//! The mps server: one device context shared by many client processes.
//!
//! [`server::Server`] listens on the pipe directory's socket and runs one session thread per
//! client (`session`); sessions execute on a [`backend::Backend`].

pub mod backend;
pub mod control;
mod cpu_pressure;
pub mod intake;
mod outbox;
pub mod process;
pub mod quota;
pub mod recovery;
pub mod registry;
pub mod server;
mod session;
pub mod sm;

pub use session::{BatchPacing, Limits};

/// Locks `m`, taking its data even where a panic poisoned it: a panic while serving one client
/// disconnects only that client, and the state it left locked stays usable for the others.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
