//! The deterministic core of mps.
//!
//! Everything here is free of I/O, threads and clocks, so that it can be tested exhaustively:
//! the status codes shared by server and clients ([`status`]), typed handles ([`handle`]), a
//! device's launch limits ([`limits`]), the handshake ([`handshake`]), the versioned wire
//! protocol ([`protocol`]) and a command's ring slots ([`slots`]), the per-client allocation
//! table and the device-memory range allocator ([`alloc`]), PTX entry parsing ([`ptx`]), and
//! per-stream ordering ([`ordering`]). Every enum that crosses the wire or the C ABI is declared
//! once, with [`wire_enum!`].

pub mod alloc;
mod command_table;
pub mod handle;
pub mod handle_hash;
pub mod handshake;
pub mod limits;
pub mod ordering;
pub mod protocol;
pub mod ptx;
pub mod slots;
pub mod status;
pub mod units;
mod wire_enum;

pub use status::{Error, Result, Status};
