//! Opaque handles (CUcontext, CUstream, CUevent, CUmodule, CUfunction, ...) handed to programs.
//!
//! A handle is a number from one process-wide counter, never an address: a registry maps it to
//! its object, so a stale, foreign or wrong-kind handle is an error, never undefined behaviour.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use mps_core::handle_hash::HandleHashing;

use crate::memo;

/// Handles start well above the stream sentinels (`CU_STREAM_LEGACY` 1, `CU_STREAM_PER_THREAD`
/// 2) and step by 16, so that none of them is a valid sentinel or a small integer by mistake.
static NEXT: AtomicUsize = AtomicUsize::new(0x1000);

/// The objects of one kind, by handle.
#[derive(Debug)]
pub(crate) struct Registry<T> {
    map: RwLock<HashMap<usize, Arc<T>, HandleHashing>>,
    /// Threads' memos hold its objects: a removal makes them lapse (see [`memo`]).
    memoised: bool,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            map: RwLock::new(HashMap::default()),
            memoised: false,
        }
    }
}

impl<T> Registry<T> {
    /// A registry of objects that threads' memos hold (contexts, streams, events, functions,
    /// executable graphs).
    pub(crate) fn memoised() -> Self {
        Registry {
            memoised: true,
            ..Registry::default()
        }
    }

    /// Registers the object `make` builds for a fresh handle.
    pub(crate) fn insert_with(&self, make: impl FnOnce(usize) -> T) -> (usize, Arc<T>) {
        let handle = NEXT.fetch_add(16, Ordering::Relaxed);
        let obj = Arc::new(make(handle));
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, obj.clone());
        (handle, obj)
    }

    pub(crate) fn get(&self, handle: usize) -> Option<Arc<T>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&handle)
            .cloned()
    }

    /// Removes `handle`; in a memoised registry, what the threads' memos resolved lapses.
    /// The objects `pick` selects, at the time of the call.
    pub(crate) fn select(&self, pick: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|o| pick(o))
            .cloned()
            .collect()
    }

    pub(crate) fn remove(&self, handle: usize) -> Option<Arc<T>> {
        let removed = self
            .map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle);
        if self.memoised && removed.is_some() {
            memo::handles_changed();
        }
        removed
    }

    /// Removes every object `doomed` picks, returning them; as [`Registry::remove`].
    pub(crate) fn remove_where(&self, doomed: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        let removed: Vec<Arc<T>> = {
            let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
            let handles: Vec<usize> = map
                .iter()
                .filter(|(_, o)| doomed(o))
                .map(|(h, _)| *h)
                .collect();
            handles.iter().filter_map(|h| map.remove(h)).collect()
        };
        if self.memoised && !removed.is_empty() {
            memo::handles_changed();
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_found_by_their_handles_until_removed() {
        let r = Registry::default();
        let handles: Vec<usize> = (0..100).map(|i| r.insert_with(|_| i).0).collect();
        for (i, h) in handles.iter().enumerate() {
            assert_eq!(r.get(*h).as_deref(), Some(&i));
        }
        assert_eq!(r.select(|v| *v >= 98).len(), 2);
        assert_eq!(r.remove(handles[3]).as_deref(), Some(&3));
        assert!(r.get(handles[3]).is_none());
        assert_eq!(r.remove_where(|v| v % 2 == 1).len(), 49);
        for (i, h) in handles.iter().enumerate() {
            assert_eq!(r.get(*h).is_some(), i % 2 == 0, "handle of {i}");
        }
    }

    #[test]
    fn removing_from_a_memoised_registry_makes_memos_lapse() {
        // Only this test removes from a memoised registry; others may only leave the epoch be.
        let (plain, memoised) = (Registry::default(), Registry::memoised());
        let (p, m) = (plain.insert_with(|_| 1).0, memoised.insert_with(|_| 2).0);
        let before = memo::epoch();
        assert!(plain.remove(p).is_some());
        assert_eq!(plain.remove_where(|_| true).len(), 0);
        assert_eq!(
            memo::epoch(),
            before,
            "a plain registry's removal changed the epoch"
        );
        assert!(memoised.remove(m + 16).is_none());
        assert_eq!(memo::epoch(), before, "removing nothing changed the epoch");
        assert!(memoised.remove(m).is_some());
        assert_eq!(memo::epoch(), before + 1);
        memoised.insert_with(|_| 3);
        assert_eq!(memoised.remove_where(|v| *v == 3).len(), 1);
        assert_eq!(memo::epoch(), before + 2);
    }
}
