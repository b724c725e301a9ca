//! `libcuda.so.1` of mps: the CUDA driver API, served by an mps server.
//!
//! A program that loads this library instead of NVIDIA's (through `LD_LIBRARY_PATH`, which
//! `mps-run` sets) becomes a client of the mps server of `$MPS_PIPE_DIRECTORY` at `cuInit`, with
//! no change to the program. Queries (device attributes, names, contexts, function parameters)
//! are answered here from what the server reported at connect; work goes to the server, and
//! launches are posted without waiting, their errors surfacing at the next synchronising call,
//! as CUDA's asynchronous errors do. docs/TRANSPARENT.md lists what is implemented.
//!
//! The exports are CUDA's own names and ABIs (hence the non-snake-case names); the modules that
//! hold them are public so that they are reachable, but the library is meant only for C.

#![allow(non_snake_case)]

mod abi;
mod connection;
pub mod context;
pub mod device;
mod driver;
mod errors;
pub mod export;
pub mod graph;
mod handles;
mod image;
pub mod kernel_queries;
mod log;
mod memo;
pub mod memory;
pub mod module;
pub mod proc;
pub mod stream;
pub mod unsupported;
