//! Typed handles.
//!
//! Every object a client creates is named by a 64-bit handle that the server hands out. The kind
//! of object is kept in the top byte, so that a handle of the wrong kind (an event passed where a
//! stream is expected) is told apart from an unknown one in error messages, and handles are never
//! reused within one server's lifetime, so a stale handle cannot name a newer object.

use std::fmt;

use crate::handle_hash::HandleMap;
use crate::status::{Error, Result};

crate::wire_enum! {
    /// What a handle names; the value is the tag in the handle's top byte, the name the noun
    /// used in messages.
    pub enum HandleKind: u8, from_tag {
        /// A stream (`mps_stream`).
        Stream = 1 => "stream",
        /// An event (`mps_event`).
        Event = 2 => "event",
        /// A loaded module (`mps_module`).
        Module = 3 => "module",
        /// A kernel in a module (`mps_function`).
        Function = 4 => "function",
        /// A host buffer from `mps_host_alloc`.
        HostBuffer = 5 => "host buffer",
        /// A captured graph (`mps_graph`).
        Graph = 6 => "graph",
        /// An executable graph (`mps_graph_exec`).
        GraphExec = 7 => "executable graph",
        /// A physical allocation of device memory (`CUmemGenericAllocationHandle`).
        Physical = 8 => "physical allocation",
    }
}

impl HandleKind {
    /// The lower-case name used in messages.
    pub fn noun(self) -> &'static str {
        self.name()
    }

    /// The noun with its indefinite article ("an event").
    pub fn a_noun(self) -> String {
        let article = if self.name().starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        format!("{article} {}", self.name())
    }
}

const KIND_SHIFT: u32 = 56;
const SERIAL_MASK: u64 = (1 << KIND_SHIFT) - 1;

/// A raw handle value with its kind in the top byte.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct Handle(pub u64);

impl Handle {
    /// The handle of `kind` with this serial number.
    pub fn new(kind: HandleKind, serial: u64) -> Handle {
        Handle(((kind as u64) << KIND_SHIFT) | (serial & SERIAL_MASK))
    }

    /// The kind recorded in the handle, if it is one mps hands out.
    pub fn kind(self) -> Option<HandleKind> {
        HandleKind::from_tag((self.0 >> KIND_SHIFT) as u8)
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Hands out handles; one per server, so handles are unique across all of its clients.
#[derive(Debug, Default)]
pub struct HandleSource {
    next: u64,
}

impl HandleSource {
    /// A fresh handle of `kind`. Serial numbers start at 1, so no handle is ever 0.
    pub fn next(&mut self, kind: HandleKind) -> Handle {
        self.next += 1;
        Handle::new(kind, self.next)
    }
}

/// A client's objects of one kind, keyed by handle. Lookups of handles this client does not own
/// fail with `MPS_ERROR_INVALID_HANDLE` and a message that names the handle and what it is.
#[derive(Debug)]
pub struct HandleTable<T> {
    kind: HandleKind,
    /// Keyed by handles the server handed out, so SipHash's guard against chosen keys buys
    /// nothing, and every command looks up one or more of them.
    entries: HandleMap<Handle, T>,
    limit: usize,
}

impl<T> HandleTable<T> {
    /// An empty table of `kind` holding at most `limit` entries.
    pub fn new(kind: HandleKind, limit: usize) -> Self {
        HandleTable {
            kind,
            entries: HandleMap::default(),
            limit,
        }
    }

    /// Adds an object; fails with `MPS_ERROR_QUOTA_EXCEEDED` when the table is full.
    pub fn insert(&mut self, handle: Handle, value: T) -> Result<()> {
        self.ensure_room()?;
        self.entries.insert(handle, value);
        Ok(())
    }

    /// Fails with `MPS_ERROR_QUOTA_EXCEEDED` when no other object fits (check before creating
    /// what would go in).
    pub fn ensure_room(&self) -> Result<()> {
        if self.entries.len() >= self.limit {
            return Err(Error::new(
                crate::Status::QuotaExceeded,
                format!(
                    "this client already holds {} {}s, the most one client may hold; destroy some first",
                    self.limit,
                    self.kind.noun()
                ),
            ));
        }
        Ok(())
    }

    /// The object named by `handle`.
    pub fn get(&self, handle: u64) -> Result<&T> {
        self.entries
            .get(&Handle(handle))
            .ok_or_else(|| self.unknown(handle))
    }

    /// The object named by `handle`, mutably.
    pub fn get_mut(&mut self, handle: u64) -> Result<&mut T> {
        if !self.entries.contains_key(&Handle(handle)) {
            return Err(self.unknown(handle));
        }
        Ok(self
            .entries
            .get_mut(&Handle(handle))
            .expect("presence checked above"))
    }

    /// Removes and returns the object named by `handle`.
    pub fn remove(&mut self, handle: u64) -> Result<T> {
        match self.entries.remove(&Handle(handle)) {
            Some(v) => Ok(v),
            None => Err(self.unknown(handle)),
        }
    }

    /// Removes every object, returning them (used when a client goes away).
    pub fn drain(&mut self) -> impl Iterator<Item = (Handle, T)> + '_ {
        self.entries.drain()
    }

    /// Keeps only the objects for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.entries.retain(|_, v| keep(v));
    }

    /// Iterates over the objects.
    pub fn iter(&self) -> impl Iterator<Item = (&Handle, &T)> {
        self.entries.iter()
    }

    /// How many objects the table holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn unknown(&self, handle: u64) -> Error {
        let noun = self.kind.noun();
        let h = Handle(handle);
        let message = match h.kind() {
            Some(k) if k != self.kind => {
                format!(
                    "{h} names {} where {} was expected",
                    k.a_noun(),
                    self.kind.a_noun()
                )
            }
            Some(_) => format!(
                "{noun} {h} does not belong to this client (destroyed, or created by another client)"
            ),
            None => format!("{h} is not {} handle", self.kind.a_noun()),
        };
        Error::invalid_handle(message)
    }
}

/// Small integer slots (indices into the server's status page) handed out and taken back.
#[derive(Debug)]
pub struct SlotPool {
    free: Vec<u32>,
    next: u32,
    capacity: u32,
}

impl SlotPool {
    /// A pool of slots `first..capacity`.
    pub fn new(first: u32, capacity: u32) -> SlotPool {
        SlotPool {
            free: Vec::new(),
            next: first,
            capacity,
        }
    }

    /// A free slot, if any is left.
    pub fn take(&mut self) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.next < self.capacity {
            self.next += 1;
            return Some(self.next - 1);
        }
        None
    }

    /// Returns a slot to the pool.
    pub fn give_back(&mut self, slot: u32) {
        debug_assert!(slot < self.next && !self.free.contains(&slot));
        self.free.push(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    #[test]
    fn handles_carry_their_kind_and_are_never_zero_or_reused() {
        let mut src = HandleSource::default();
        let a = src.next(HandleKind::Stream);
        let b = src.next(HandleKind::Stream);
        let e = src.next(HandleKind::Event);
        assert_ne!(a.0, 0);
        assert_ne!(a, b);
        assert_eq!(a.kind(), Some(HandleKind::Stream));
        assert_eq!(e.kind(), Some(HandleKind::Event));
        assert_eq!(Handle(0).kind(), None);
        assert_eq!(Handle(u64::MAX).kind(), None);
    }

    #[test]
    fn table_lookups_explain_what_is_wrong() {
        let mut src = HandleSource::default();
        let mut t = HandleTable::new(HandleKind::Stream, 2);
        let s = src.next(HandleKind::Stream);
        t.insert(s, "mine").unwrap();
        assert_eq!(*t.get(s.0).unwrap(), "mine");

        let foreign = src.next(HandleKind::Stream);
        let err = t.get(foreign.0).unwrap_err();
        assert_eq!(err.status, Status::InvalidHandle);
        assert!(
            err.message.contains("does not belong to this client"),
            "{err}"
        );

        let ev = src.next(HandleKind::Event);
        let err = t.get(ev.0).unwrap_err();
        assert!(
            err.message
                .contains("names an event where a stream was expected"),
            "{err}"
        );

        let err = t.get(12345).unwrap_err();
        assert!(err.message.contains("is not a stream handle"), "{err}");

        t.insert(src.next(HandleKind::Stream), "second").unwrap();
        let err = t.insert(src.next(HandleKind::Stream), "third").unwrap_err();
        assert_eq!(err.status, Status::QuotaExceeded);

        assert_eq!(t.remove(s.0).unwrap(), "mine");
        assert_eq!(t.remove(s.0).unwrap_err().status, Status::InvalidHandle);
    }

    #[test]
    fn slot_pool_reuses_and_runs_out() {
        let mut p = SlotPool::new(1, 4);
        assert_eq!(p.take(), Some(1));
        assert_eq!(p.take(), Some(2));
        assert_eq!(p.take(), Some(3));
        assert_eq!(p.take(), None);
        p.give_back(2);
        assert_eq!(p.take(), Some(2));
        assert_eq!(p.take(), None);
    }
}
