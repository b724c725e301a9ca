//! The kubelet's device plugin API, v1beta1, generated from `proto/api.proto` (see
//! `tests/codegen.rs`).
#![allow(missing_debug_implementations, unreachable_pub, clippy::all)]

include!("v1beta1.rs");
