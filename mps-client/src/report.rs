//! What this client knows of its device: the handshake's description and the device's index,
//! and what the server reports on the first question that needs it (the device's attributes
//! and UUID, the context's priorities and limits), kept from then on.

use std::collections::HashMap;
use std::sync::OnceLock;

use mps_core::protocol::CONTEXT_LIMITS;

use crate::handles::DeviceInfo;

/// The device's attributes and UUID, as the server reported them.
#[derive(Debug)]
pub(crate) struct Attributes {
    pub(crate) values: HashMap<i32, i32>,
    pub(crate) uuid: Option<[u8; 16]>,
}

/// The server context's stream priorities and limits, as its device reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextLimits {
    /// The least urgent stream priority (CUDA's numbers: lower is more urgent).
    pub least_priority: i32,
    /// The most urgent stream priority.
    pub greatest_priority: i32,
    /// Each `CUlimit` from 0, `None` where the device has no such limit.
    pub limits: [Option<u64>; CONTEXT_LIMITS],
}

/// The client's device.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) info: DeviceInfo,
    /// The device's index among those this process sees (see `Client::connect_device`).
    pub(crate) ordinal: u32,
    /// Fetched on the first question (see `attributes`).
    pub(crate) attributes: OnceLock<Attributes>,
    /// Fetched on the first question (see `queries`).
    pub(crate) context: OnceLock<ContextLimits>,
}

impl Report {
    /// The device of the handshake, nothing fetched yet.
    pub(crate) fn new(info: DeviceInfo, ordinal: u32) -> Report {
        Report {
            info,
            ordinal,
            attributes: OnceLock::new(),
            context: OnceLock::new(),
        }
    }
}
