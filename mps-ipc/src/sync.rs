//! The one place ring atomics come from, so that loom can stand in for them in `--cfg loom`
//! builds.

#[cfg(loom)]
pub use loom::sync::atomic::{AtomicU32, Ordering, fence};

#[cfg(not(loom))]
pub use std::sync::atomic::{AtomicU32, Ordering, fence};
