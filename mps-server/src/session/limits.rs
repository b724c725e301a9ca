//! What one client may hold. Every bound a session enforces is a field here, with a default that
//! keeps one client from exhausting the server (its threads, address space or memory), so that
//! the operator can set each one.

use mps_core::protocol::{MAX_EVENTS, MAX_MODULE_BYTES, MAX_STREAMS};
use mps_core::{Error, Result, Status};

use crate::session::core::MAX_RUN;

/// Bounds on one client. A request past one is refused with `MPS_ERROR_QUOTA_EXCEEDED` and a
/// message that names the limit by its field name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Streams besides the default one (each is a thread of the simulator, a driver stream on
    /// a GPU); at most `MAX_STREAMS - 1`, the progress slots of a channel.
    pub max_streams: usize,
    /// Events.
    pub max_events: usize,
    /// Loaded modules.
    pub max_modules: usize,
    /// Kernel handles.
    pub max_functions: usize,
    /// Host buffers.
    pub max_host_buffers: usize,
    /// Bytes of all of the client's host buffers together: each is that much of the machine's
    /// memory, taken when the buffer is made. By default a quarter of the machine's memory.
    pub max_host_bytes: u64,
    /// Bytes of the host buffers of all of one user's clients in the server together; by
    /// default half of the machine's memory, so that a user's clients cannot run the machine
    /// out of memory whatever their number.
    pub max_user_host_bytes: u64,
    /// Device memory of all of one user's clients in the server together, counted as
    /// allocations take it (0: none).
    pub max_user_device_bytes: u64,
    /// Device allocations one client may hold (each costs server memory to track, and takes at
    /// least [`mps_core::alloc::ALLOC_ALIGN`] bytes of the device).
    pub max_allocations: usize,
    /// Bytes of one module image, counted while it is uploaded (at most `MAX_MODULE_BYTES`).
    pub max_module_bytes: u64,
    /// Kernel entries of one PTX module (reading each costs server memory).
    pub max_module_entries: usize,
    /// Captured graphs, and executable graphs (each kind counted on its own).
    pub max_graphs: usize,
    /// Commands one capture may record (each a node of the graph, held by the server).
    pub max_graph_commands: usize,
    /// Launch batching: a repeated run of a client's stream work is launched as one cached
    /// graph (`session/core/batch.rs`).
    pub launch_batching: bool,
    /// Run shapes (each with its executable graph) the batching keeps per client.
    pub max_batch_entries: usize,
    /// Bytes of run shapes the batching keeps per client (also the most one run may hold).
    pub max_batch_bytes: u64,
    /// Commands after which a batched run ends as if a terminator followed (2 to `MAX_RUN`):
    /// a long request then goes to the device in pieces, each launched as soon as it is whole,
    /// instead of as one graph once its last command came.
    pub max_batch_run: usize,
    /// Microseconds commands held for a batched run wait for the client's next command once
    /// its ring is empty, before they are submitted one by one. Long enough for the pauses of
    /// a Python program between the launches of one request; the worker sleeps meanwhile.
    pub batch_hold_us: u64,
    /// Whether the batching holds a run that its client posts slowly only while the machine's
    /// CPUs are contended (see `session/core/batch.rs`, "Holding must pay"); on by default.
    pub batch_pacing: BatchPacing,
}

/// When launch batching holds the runs of a client that posts each command well after the last
/// (see `session/core/batch.rs`, "Holding must pay"). The runs of a client that posts in
/// bursts are held either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchPacing {
    /// Whatever the CPUs' load.
    Off,
    /// Only while threads wait for the machine's CPUs (`cpu_pressure.rs`).
    CpuLoad,
    /// As if the CPUs were, or were not, contended.
    #[cfg(test)]
    Assume { contended: bool },
}

impl BatchPacing {
    /// Whether a slowly posted run may be held now.
    pub(crate) fn holds_slow_runs(self) -> bool {
        match self {
            BatchPacing::Off => true,
            BatchPacing::CpuLoad => crate::cpu_pressure::contended(),
            #[cfg(test)]
            BatchPacing::Assume { contended } => contended,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 64,
            max_events: MAX_EVENTS,
            max_modules: 1024,
            max_functions: 1 << 16,
            max_host_buffers: 4096,
            max_host_bytes: machine_memory() / 4,
            max_user_host_bytes: machine_memory() / 2,
            max_user_device_bytes: 0,
            max_allocations: 1 << 16,
            max_module_bytes: MAX_MODULE_BYTES,
            max_module_entries: 1 << 14,
            max_graphs: 1024,
            max_graph_commands: 1 << 16,
            launch_batching: true,
            max_batch_entries: 32,
            max_batch_bytes: 1 << 20,
            max_batch_run: MAX_RUN,
            batch_hold_us: 200,
            batch_pacing: BatchPacing::CpuLoad,
        }
    }
}

impl Limits {
    /// Checks settings that the protocol bounds: streams by the channel's progress slots, module
    /// images by what a client may send. The message names the field and the mps-server flag
    /// that sets it.
    pub fn check(&self) -> Result<()> {
        if self.max_streams >= MAX_STREAMS {
            return Err(Error::invalid_value(format!(
                "max_streams (--max-streams) {} is more than the {} streams a client's channel \
                 has slots for; set it to {} or less",
                self.max_streams,
                MAX_STREAMS - 1,
                MAX_STREAMS - 1
            )));
        }
        if !(2..=MAX_RUN).contains(&self.max_batch_run) {
            return Err(Error::invalid_value(format!(
                "max_batch_run (--max-batch-run) {} is outside 2 to {MAX_RUN}: a run of one \
                 command gains nothing from a graph, and a shape's graph holds at most \
                 {MAX_RUN} nodes; set it within that range",
                self.max_batch_run
            )));
        }
        if self.max_module_bytes > MAX_MODULE_BYTES {
            return Err(Error::invalid_value(format!(
                "max_module_bytes (--max-module-bytes) {} is more than the {MAX_MODULE_BYTES} \
                 bytes the protocol lets a client send; set it to {MAX_MODULE_BYTES} or less",
                self.max_module_bytes
            )));
        }
        Ok(())
    }
}

/// The machine's memory as this process may use it: `MemTotal`, or its memory cgroup's limit if
/// lower (read once).
pub(crate) fn machine_memory() -> u64 {
    static MEMORY: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *MEMORY.get_or_init(|| mps_ipc::segment::machine_memory().unwrap_or(8 << 30))
}

/// The refusal of a request that would take a client past `limit` (a field of [`Limits`]),
/// naming the limit and the flag that sets it (a completion carries 200 bytes of message: the
/// suffix is kept short).
pub(crate) fn exceeded(limit: &str, what: String) -> Error {
    Error::new(
        Status::QuotaExceeded,
        format!(
            "{what} ({limit} per client, mps-server --{})",
            limit.replace('_', "-")
        ),
    )
}
