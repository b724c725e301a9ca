//! The kernels this client looked up: each one's parameter layout, by function handle.

use std::sync::{Arc, RwLock};

use mps_core::handle_hash::HandleMap;
use mps_core::protocol::ParamInfo;
use mps_core::{Error, Result};

/// A kernel's parameter layout, as the server reported it.
#[derive(Debug)]
pub(crate) struct Kernel {
    pub(crate) handle: u64,
    pub(crate) params: Box<[ParamInfo]>,
    /// Bytes of the packed parameter buffer: the end of the last parameter.
    pub(crate) bytes: usize,
}

impl Kernel {
    /// Checks that the parameters follow one another without overlapping (as a compiler lays
    /// them out), which the launch's gathering relies on to find the ones a slot holds.
    pub(crate) fn new(handle: u64, params: Vec<ParamInfo>) -> Result<Kernel> {
        let mut end = 0u64;
        for (i, p) in params.iter().enumerate() {
            if (p.offset as u64) < end {
                return Err(Error::internal(format!(
                    "the server reported parameter {i} of kernel {handle:#x} at offset {}, \
                     inside the parameter before it",
                    p.offset
                )));
            }
            end = p.offset as u64 + p.size as u64;
        }
        Ok(Kernel {
            handle,
            params: params.into_boxed_slice(),
            bytes: end as usize,
        })
    }
}

/// Every kernel's layout, from `module_get_function`; read by every launch, written by a lookup.
#[derive(Debug, Default)]
pub(crate) struct Kernels(RwLock<HandleMap<u64, Arc<Kernel>>>);

impl Kernels {
    /// Keeps `kernel`'s layout.
    pub(crate) fn insert(&self, kernel: Kernel) {
        let mut all = self.0.write().unwrap_or_else(|p| p.into_inner());
        all.insert(kernel.handle, Arc::new(kernel));
    }

    /// The layout of the kernel `handle`, if this client looked it up.
    pub(crate) fn get(&self, handle: u64) -> Option<Arc<Kernel>> {
        let all = self.0.read().unwrap_or_else(|p| p.into_inner());
        all.get(&handle).cloned()
    }
}
