//! What the library says on stderr: each unsupported function once, and, with `MPS_CUDA_LOG`
//! set (to anything but `0`), the message of every failed call. CUDA itself says nothing, but an
//! mps error's message names what went wrong and what to do, which a bare CUresult cannot.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

fn verbose() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("MPS_CUDA_LOG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// Says `message` once per `key` for the life of the process.
pub(crate) fn once(key: &str, message: impl FnOnce() -> String) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string())
    {
        eprintln!("mps-cuda: {}", message());
    }
}

/// Says why a call failed, when asked to (`MPS_CUDA_LOG`).
pub(crate) fn failure(message: &str) {
    if verbose() {
        eprintln!("mps-cuda: {message}");
    }
}

/// Says `message` once per `key`, when asked to (`MPS_CUDA_LOG`). The key is written out only
/// then: a call that fails or hints on every launch allocates nothing.
pub(crate) fn detail_once(key: impl std::fmt::Display, message: impl FnOnce() -> String) {
    if verbose() {
        once(&key.to_string(), message);
    }
}

/// Says something that always matters (the server cannot be reached, say).
pub(crate) fn always(message: &str) {
    eprintln!("mps-cuda: {message}");
}
