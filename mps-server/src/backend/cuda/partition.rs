//! SM partitions on the GPU: green contexts built from the device's smallest SM groups.
//!
//! At start the device's SMs are split once into groups of the driver's minimum partition size
//! (8 SMs on Hopper) plus a remainder; these are the units [`crate::sm`] plans with. A placement
//! becomes a green context over its units (one per distinct unit set, shared by every client
//! placed there). Green contexts share the primary context's memory, modules and events, and
//! their streams take the same commands; only the SMs their kernels may use differ. A client
//! placed on the whole device keeps plain primary-context streams, or, with contexts of their
//! own (`--context-per-client on`), a green context over every SM to itself: graph launches
//! from 16 threads into primary-context streams ran at 0.56x of those into green contexts'
//! streams on an H200 (docs/bench/h200-2026-12-02-priority).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys::{self, CUdevResource, CUdevice, CUgreenCtx};
use mps_core::{Error, Result, Status};

use crate::sm::{Assignment, Placement};
use mps_driver::{check, check_on, released};

/// A green context: kernels of its streams run on its SMs only.
#[derive(Debug)]
pub(super) struct Partition {
    pub(super) green: CUgreenCtx,
}

impl Drop for Partition {
    fn drop(&mut self) {
        // SAFETY: created by cuGreenCtxCreate; the last owner is gone, and every stream made in
        // it was synchronised and destroyed before it let go (see `CudaStream`).
        released(check(
            unsafe { sys::cuGreenCtxDestroy(self.green) },
            "cuGreenCtxDestroy",
        ));
    }
}

// SAFETY: a green context handle may be used from any thread; creating streams in it is
// thread-safe in the driver.
unsafe impl Send for Partition {}
// SAFETY: as above.
unsafe impl Sync for Partition {}

/// The device's SM units and the partitions in use.
pub(super) struct Partitions {
    dev: CUdevice,
    /// The units, or why the device cannot be partitioned.
    units: std::result::Result<Vec<CUdevResource>, String>,
    /// Each partitioned client's partition (absent: the whole device).
    by_client: Mutex<HashMap<u32, Arc<Partition>>>,
    /// Live partitions by unit set, so that clients placed alike share one green context.
    by_units: Mutex<HashMap<Vec<usize>, Weak<Partition>>>,
    /// Whether a client on the whole device gets a green context of its own over every SM.
    own_whole: bool,
    /// Those contexts, by client, while a stream of the client holds one.
    whole_by_client: Mutex<HashMap<u32, Weak<Partition>>>,
}

// SAFETY: CUdevResource is plain data describing SMs; the maps are locked.
unsafe impl Send for Partitions {}
// SAFETY: as above.
unsafe impl Sync for Partitions {}

impl Partitions {
    /// Splits device `dev` into units. A driver without green contexts (before CUDA 12.4)
    /// leaves one unit, the whole device: shares and reservations are then refused.
    /// With `own_whole`, a client on the whole device is given a green context of its own over
    /// every SM (where the device can be partitioned).
    pub(super) fn discover(dev: CUdevice, own_whole: bool) -> Partitions {
        Partitions {
            dev,
            units: split(dev),
            by_client: Mutex::new(HashMap::new()),
            by_units: Mutex::new(HashMap::new()),
            own_whole,
            whole_by_client: Mutex::new(HashMap::new()),
        }
    }

    /// The SMs of each unit.
    pub(super) fn unit_sizes(&self, sm_count: u32) -> Vec<u32> {
        match &self.units {
            // SAFETY: the driver filled these resources as SM resources.
            Ok(units) => units
                .iter()
                .map(|u| unsafe { u.__bindgen_anon_1.sm.smCount })
                .collect(),
            Err(_) => vec![sm_count],
        }
    }

    /// Why SMs cannot be partitioned, if they cannot.
    pub(super) fn unsupported(&self) -> Option<&str> {
        self.units.as_ref().err().map(String::as_str)
    }

    /// The partition client `client` is placed on (None: the primary context's whole device,
    /// also where a context of its own was due but could not be made).
    pub(super) fn of(&self, client: u32) -> Option<Arc<Partition>> {
        let placed = self
            .by_client
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&client)
            .cloned();
        if placed.is_some() || !self.own_whole || self.units.is_err() {
            return placed;
        }
        let mut own = self
            .whole_by_client
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(p) = own.get(&client).and_then(Weak::upgrade) {
            return Some(p);
        }
        let all: Vec<usize> = (0..self.units.as_ref().map_or(0, Vec::len)).collect();
        let (p, sms) = match self.create(&all) {
            Ok(made) => made,
            // A context of its own only speeds the client's launches up: without one (the
            // device's memory is full, say) it is served in the primary context as before.
            Err(e) => {
                tracing::warn!(
                    "client {client} is served in the primary context: no context of its own \
                     could be made ({e})"
                );
                return None;
            }
        };
        tracing::debug!("a context of its own over every SM ({sms}) for client {client}");
        let p = Arc::new(p);
        own.retain(|_, w| w.strong_count() > 0);
        own.insert(client, Arc::downgrade(&p));
        Some(p)
    }

    /// Makes `assignments` current, creating the green contexts they need first (so that a
    /// failure changes nothing).
    pub(super) fn place(&self, assignments: &[Assignment]) -> Result<()> {
        let mut by_units = self.by_units.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = HashMap::new();
        for a in assignments {
            let Placement::Units(set) = &a.placement else {
                continue;
            };
            let p = match by_units.get(set).and_then(Weak::upgrade) {
                Some(p) => p,
                None => {
                    let (p, sms) = self.create(set)?;
                    let p = Arc::new(p);
                    tracing::info!("SM partition of {sms} SMs (units {set:?}) created");
                    by_units.insert(set.clone(), Arc::downgrade(&p));
                    p
                }
            };
            next.insert(a.client, p);
        }
        *self.by_client.lock().unwrap_or_else(|p| p.into_inner()) = next;
        by_units.retain(|_, w| w.strong_count() > 0);
        Ok(())
    }

    /// A green context over units `set`, and its SMs.
    fn create(&self, set: &[usize]) -> Result<(Partition, u32)> {
        let units = self.units.as_ref().map_err(|why| {
            Error::new(
                Status::Unsupported,
                format!("this device's SMs cannot be partitioned: {why}"),
            )
        })?;
        let mut resources: Vec<CUdevResource> = set.iter().map(|&u| units[u]).collect();
        // SAFETY: the SM counts were filled by the driver's split.
        let sms: u32 = resources
            .iter()
            .map(|r| unsafe { r.__bindgen_anon_1.sm.smCount })
            .sum();
        let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
        let mut green: CUgreenCtx = std::ptr::null_mut();
        // SAFETY: the resources all come from one split of this device, as
        // cuDevResourceGenerateDesc requires to combine them; both calls write one handle.
        unsafe {
            check_on(
                sys::cuDevResourceGenerateDesc(
                    &mut desc,
                    resources.as_mut_ptr(),
                    resources.len() as u32,
                ),
                "cuDevResourceGenerateDesc",
                || format!("SM units {set:?}"),
            )?;
            check_on(
                sys::cuGreenCtxCreate(
                    &mut green,
                    desc,
                    self.dev,
                    sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
                ),
                "cuGreenCtxCreate",
                || format!("{sms} SMs"),
            )?;
        }
        Ok((Partition { green }, sms))
    }
}

/// The device's SMs in groups of the driver's minimum partition size, and the remainder.
fn split(dev: CUdevice) -> std::result::Result<Vec<CUdevResource>, String> {
    // SAFETY: CUdevResource is plain data for which all-zero is a valid (empty) value.
    let mut all: CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: writes one resource description.
    let r = unsafe {
        sys::cuDeviceGetDevResource(
            dev,
            &mut all,
            sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM,
        )
    };
    check(r, "cuDeviceGetDevResource").map_err(|e| {
        format!("the driver has no green contexts ({e}); CUDA 12.4 or later is needed")
    })?;
    // SAFETY: the driver filled `all` as an SM resource.
    let min = unsafe { all.__bindgen_anon_1.sm.minSmPartitionSize }.max(1);
    let mut n = 0u32;
    // SAFETY: with a null result array the driver only counts the groups.
    let r = unsafe {
        sys::cuDevSmResourceSplitByCount(
            std::ptr::null_mut(),
            &mut n,
            &all,
            std::ptr::null_mut(),
            0,
            min,
        )
    };
    let cannot = |e: String| format!("cannot split the device's SMs into groups of {min}: {e}");
    check(r, "cuDevSmResourceSplitByCount").map_err(|e| cannot(e.to_string()))?;
    if n == 0 {
        return Err(cannot("the driver counted no group".into()));
    }
    // SAFETY: zeroed resources are valid placeholders for the driver to fill.
    let mut groups: Vec<CUdevResource> = vec![unsafe { std::mem::zeroed() }; n as usize];
    // SAFETY: as above.
    let mut rest: CUdevResource = unsafe { std::mem::zeroed() };
    // SAFETY: `groups` has room for `n` results, `rest` for the remainder.
    let r = unsafe {
        sys::cuDevSmResourceSplitByCount(groups.as_mut_ptr(), &mut n, &all, &mut rest, 0, min)
    };
    check(r, "cuDevSmResourceSplitByCount").map_err(|e| cannot(e.to_string()))?;
    groups.truncate(n as usize);
    // SAFETY: the driver filled `rest` as an SM resource.
    if unsafe { rest.__bindgen_anon_1.sm.smCount } > 0 {
        groups.push(rest);
    }
    Ok(groups)
}
