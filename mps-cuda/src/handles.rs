//! Opaque handles (CUcontext, CUstream, CUevent, CUmodule, CUfunction, ...) handed to programs.
//!
//! A handle is a number from one process-wide counter, never an address: a registry maps it to
//! its object, so a stale, foreign or wrong-kind handle is an error, never undefined behaviour.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Handles start well above the stream sentinels (`CU_STREAM_LEGACY` 1, `CU_STREAM_PER_THREAD`
/// 2) and step by 16, so that none of them is a valid sentinel or a small integer by mistake.
static NEXT: AtomicUsize = AtomicUsize::new(0x1000);

/// The objects of one kind, by handle.
#[derive(Debug)]
pub(crate) struct Registry<T> {
    map: RwLock<HashMap<usize, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry {
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl<T> Registry<T> {
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

    pub(crate) fn remove(&self, handle: usize) -> Option<Arc<T>> {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&handle)
    }

    /// Removes every object `doomed` picks, returning them.
    pub(crate) fn remove_where(&self, doomed: impl Fn(&T) -> bool) -> Vec<Arc<T>> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let handles: Vec<usize> = map
            .iter()
            .filter(|(_, o)| doomed(o))
            .map(|(h, _)| *h)
            .collect();
        handles.iter().filter_map(|h| map.remove(h)).collect()
    }
}
