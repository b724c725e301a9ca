//! The mps client library.
//!
//! Rust programs use [`Client`]; C and C++ programs use the C ABI in [`ffi`], declared in
//! `include/mps.h` (generated from this crate by cbindgen).

pub mod client;
pub mod ffi;

pub use client::{Client, DeviceInfo, DevicePtr, Event, Function, Module, SmInfo, Stream};
pub use mps_core::protocol::{BackendKind, Dim3, ParamInfo};
pub use mps_core::{Error, Result, Status};
