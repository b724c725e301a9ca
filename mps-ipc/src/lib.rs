//! Inter-process plumbing of mps: shared-memory segments ([`segment`]), single-producer
//! single-consumer rings of fixed-size slots ([`ring`]), process-shared futex doorbells
//! ([`doorbell`]), the layout of one client's channel ([`channel`]), and the handshake over a Unix
//! socket ([`socket`]), the rules for trusting the directories and files they live in
//! ([`trust`]), and the settings read from the environment under mps's and NVIDIA's names
//! ([`env`](mod@env)).
//!
//! Built with `--cfg loom`, only the ring and its atomics facade are compiled, so that loom can
//! check the ring protocol exhaustively (`tests/loom_ring.rs`).

pub mod ring;
pub mod sync;

#[cfg(not(loom))]
pub mod channel;
#[cfg(not(loom))]
pub mod doorbell;
#[cfg(not(loom))]
pub mod env;
#[cfg(not(loom))]
pub mod segment;
#[cfg(not(loom))]
pub mod socket;
#[cfg(not(loom))]
pub mod trust;
