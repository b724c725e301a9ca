//! `libmpsclient`: the C ABI of the mps client ([`ffi`], declared in `include/mps.h`, generated
//! from this crate by cbindgen), over the Rust client [`mps_client`].
//!
//! Rust programs depend on `mps-client`. The Rust API is re-exported here as well, so that
//! crates that named it through this one still build.

pub mod ffi;

pub use mps_client::*;
