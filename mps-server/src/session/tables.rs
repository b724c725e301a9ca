//! A client's objects, each kind in a table of its own keyed by handle, and where handles come
//! from.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use mps_core::handle::{Handle, HandleKind, HandleTable, SlotPool};
use mps_core::protocol::{MAX_STREAMS, ParamInfo};
use mps_core::{Error, Result};

use super::limits::exceeded;
use crate::backend::Backend;

/// Hands out handles; one per server, so that handles are unique across all of its clients and
/// never reused (a stale or foreign handle cannot name another object).
#[derive(Debug, Default)]
pub(crate) struct HandleIssuer {
    last: AtomicU64,
}

impl HandleIssuer {
    /// A fresh handle of `kind`; serial numbers start at 1, so no handle is 0.
    pub(crate) fn next(&self, kind: HandleKind) -> Handle {
        Handle::new(kind, self.last.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

/// Fails when `table` (of `kind`) already holds the `most` objects that `limit` allows.
pub(super) fn ensure_room<T>(
    table: &HandleTable<T>,
    kind: HandleKind,
    limit: &str,
    most: usize,
) -> Result<()> {
    table.ensure_room().map_err(|_| {
        exceeded(
            limit,
            format!(
                "this client already holds {most} {}s, the most it may hold; destroy some first",
                kind.noun()
            ),
        )
    })
}

/// A stream and its progress slot in the client's server segment.
pub(super) struct StreamEntry<S> {
    pub(super) slot: u32,
    pub(super) stream: S,
}

/// The client's streams: the default stream (handle 0, slot 0) and those it created.
pub(super) struct Streams<S> {
    default: StreamEntry<S>,
    created: HandleTable<StreamEntry<S>>,
    slots: SlotPool,
    limit: usize,
}

impl<S> Streams<S> {
    /// The default stream alone; at most `limit` more may be created.
    pub(super) fn new(default: S, limit: usize) -> Self {
        Streams {
            default: StreamEntry {
                slot: 0,
                stream: default,
            },
            created: HandleTable::new(HandleKind::Stream, limit),
            slots: SlotPool::new(1, MAX_STREAMS as u32),
            limit,
        }
    }

    /// The stream named by `handle` (0: the default stream).
    pub(super) fn get(&self, handle: u64) -> Result<&StreamEntry<S>> {
        if handle == 0 {
            return Ok(&self.default);
        }
        self.created.get(handle)
    }

    /// A progress slot for a new stream, if the client may create one.
    pub(super) fn take_slot(&mut self) -> Result<u32> {
        ensure_room(&self.created, HandleKind::Stream, "max_streams", self.limit)?;
        self.slots.take().ok_or_else(|| {
            Error::internal("no stream slot left although the stream table has room")
        })
    }

    /// Gives back a slot that [`Streams::take_slot`] gave, when its stream was not created.
    pub(super) fn give_back(&mut self, slot: u32) {
        self.slots.give_back(slot);
    }

    /// Adds a created stream in `slot`.
    pub(super) fn insert(&mut self, handle: Handle, slot: u32, stream: S) -> Result<()> {
        self.created.insert(handle, StreamEntry { slot, stream })
    }

    /// Removes a created stream; its slot is free once the caller destroyed the stream.
    pub(super) fn remove(&mut self, handle: u64) -> Result<StreamEntry<S>> {
        if handle == 0 {
            return Err(Error::invalid_value(
                "the default stream cannot be destroyed",
            ));
        }
        self.created.remove(handle)
    }

    /// Every stream, the default one first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &StreamEntry<S>> {
        std::iter::once(&self.default).chain(self.created.iter().map(|(_, s)| s))
    }

    /// Every stream, the default one last (when the client goes away).
    pub(super) fn into_streams(self) -> impl Iterator<Item = S> {
        let Streams {
            default,
            mut created,
            ..
        } = self;
        let created: Vec<S> = created.drain().map(|(_, s)| s.stream).collect();
        created.into_iter().chain(std::iter::once(default.stream))
    }

    /// How many streams, the default one included.
    pub(super) fn len(&self) -> usize {
        self.created.len() + 1
    }
}

/// A kernel handle: its module, the backend's function and its parameter layout.
pub(super) struct FunctionEntry<B: Backend> {
    pub(super) module: Handle,
    pub(super) function: Arc<B::Function>,
    pub(super) params: Vec<ParamInfo>,
    /// Bytes of the packed parameter buffer a launch must carry.
    pub(super) param_bytes: usize,
}
