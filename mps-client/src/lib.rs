//! The mps client in Rust.
//!
//! A [`Client`] is one connection to an mps server; through it a program allocates device
//! memory, copies, loads modules, launches kernels and orders work in streams and events, with
//! the semantics of the CUDA driver API. Every call returns a [`Result`] whose [`Error`] carries
//! a [`Status`] and a message that says what happened.
//!
//! ```no_run
//! use mps_client::{Client, Dim3, Stream};
//!
//! # fn main() -> Result<(), mps_client::Error> {
//! let client = Client::connect(None)?; // $MPS_PIPE_DIRECTORY, else /tmp/mps
//! let module = client.module_load(&std::fs::read("kernels/test_kernels.ptx").unwrap())?;
//! let fill = client.module_get_function(module, "fill_u32")?;
//! let out = client.mem_alloc(4 * 256)?;
//! let one = Dim3 { x: 1, y: 1, z: 1 };
//! let block = Dim3 { x: 256, y: 1, z: 1 };
//! let args: [&[u8]; 3] = [&out.0.to_le_bytes(), &7u32.to_le_bytes(), &256u64.to_le_bytes()];
//! client.launch(fill, one, block, 0, Stream::DEFAULT, &args)?;
//! let mut host = [0u8; 4 * 256];
//! client.memcpy_dtoh(&mut host, out, Stream::DEFAULT)?;
//! # Ok(())
//! # }
//! ```
//!
//! Inside, the client is a core without I/O — what it submits (`submission` in this crate's
//! source) and how it matches what comes back (`completions`) — driven by a thin transport over
//! the shared-memory rings (`transport`). The C ABI (`libmpsclient`, `include/mps.h`) is the
//! crate `mps-client-c`, built on this one.

mod attributes;
mod completions;
mod connection;
mod copies;
mod devices;
mod graphs;
mod handles;
mod host;
mod hostfn;
mod kernels;
mod launch;
#[cfg(test)]
mod loopback_tests;
mod memory;
mod queries;
mod report;
mod streams;
mod submission;
mod transport;
mod vm;
mod wait_stats;

pub use connection::Client;
pub use handles::{
    DeviceInfo, DevicePtr, Event, Function, Graph, GraphExec, Module, SmInfo, Stream,
};
pub use hostfn::HostFn;
pub use launch::KernelLayout;
pub use mps_core::handshake::BackendKind;
pub use mps_core::protocol::{
    Cluster, Dim3, OccupancyQuery, ParamInfo, TENSOR_MAP_BYTES, TensorMapTiled, TensorShape,
};
pub use mps_core::{Error, Result, Status};
pub use queries::{ContextLimits, FunctionAttributes};
pub use vm::PhysicalMem;
