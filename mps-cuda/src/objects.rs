//! The objects behind the handles a program holds (contexts, streams, events, modules and
//! their functions) and a stream argument resolved: the types the driver's registries keep,
//! below every area that makes or uses them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use mps_core::protocol::{FUNC_ATTRIBUTES, OccupancyQuery, ParamInfo};

use crate::abi::{CUdevice, CUresult};
use crate::connection::{Connection, Event, Function, KernelLayout, Module, Res, Stream};
use crate::ffi::lock;
use crate::order::LegacyOrder;

/// One context.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) handle: usize,
    pub(crate) primary: bool,
    /// The device it was made on: where everything made in it lives.
    pub(crate) device: CUdevice,
    pub(crate) state: Mutex<ContextState>,
}

#[derive(Debug)]
pub(crate) struct ContextState {
    /// A created context until destroyed; the primary context while retained.
    pub(crate) active: bool,
    pub(crate) retains: u32,
    pub(crate) flags: u32,
    /// The context's legacy default stream: the client's default stream for the primary
    /// context, a stream of its own for a created one.
    pub(crate) legacy: Stream,
    /// How work in the legacy default stream and the blocking streams is ordered.
    pub(crate) order: LegacyOrder,
}

impl Context {
    pub(crate) fn primary(handle: usize, device: CUdevice) -> Context {
        Context {
            handle,
            primary: true,
            device,
            state: Mutex::new(ContextState {
                active: false,
                retains: 0,
                flags: 0,
                legacy: Stream::DEFAULT,
                order: LegacyOrder::default(),
            }),
        }
    }

    pub(crate) fn legacy_stream(&self) -> Stream {
        lock(&self.state).legacy
    }
}

/// A stream the program created (or a thread's per-thread default stream).
#[derive(Debug)]
pub(crate) struct StreamObj {
    pub(crate) ctx: usize,
    pub(crate) device: CUdevice,
    pub(crate) stream: Stream,
    pub(crate) flags: u32,
    pub(crate) priority: i32,
}

/// An event the program created.
#[derive(Debug)]
pub(crate) struct EventObj {
    pub(crate) ctx: usize,
    pub(crate) device: CUdevice,
    pub(crate) event: Event,
    pub(crate) flags: u32,
}

/// How a stream orders with the others of its context.
pub(crate) enum Kind {
    Legacy,
    Blocking(usize),
    Independent,
}

/// A stream argument resolved: its context, its device's connection, its mps stream and how it
/// orders.
pub(crate) struct Target {
    pub(crate) ctx: Arc<Context>,
    pub(crate) conn: &'static Connection,
    pub(crate) stream: Stream,
    pub(crate) kind: Kind,
}

/// A loaded module or library.
#[derive(Debug)]
pub(crate) struct ModuleObj {
    pub(crate) handle: usize,
    /// The owning context; `None` for a library.
    pub(crate) ctx: Option<usize>,
    /// The mps module on each device it is loaded on, by device ordinal: a module's on its
    /// context's device only, a library's on each device that has used it.
    pub(crate) loaded: Vec<OnceLock<Module>>,
    /// A library's image, for the devices it is not loaded on yet (`None` for a module, or
    /// where the process sees one device).
    pub(crate) image: Option<Vec<u8>>,
    /// Held while loading on a device, so that it is loaded there once.
    pub(crate) loading: Mutex<()>,
    /// Its functions (kernels) handed out so far, by name.
    pub(crate) functions: Mutex<HashMap<String, usize>>,
}

impl ModuleObj {
    /// Its mps module on the device of `conn`, loaded there now if it is a library that was
    /// not yet; a module of another device's context is `CUDA_ERROR_INVALID_CONTEXT`, as CUDA
    /// says for a function used outside its context.
    pub(crate) fn on(&self, conn: &Connection) -> Res<Module> {
        let slot = self
            .loaded
            .get(conn.ordinal() as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        if let Some(m) = slot.get() {
            return Ok(*m);
        }
        let image = self
            .image
            .as_deref()
            .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
        let _one_at_a_time = lock(&self.loading);
        if let Some(m) = slot.get() {
            return Ok(*m);
        }
        let m = conn.module_load(image)?;
        Ok(*slot.get_or_init(|| m))
    }

    /// The devices it is loaded on, each with its mps module there.
    pub(crate) fn each_loaded(&self) -> impl Iterator<Item = (CUdevice, Module)> + '_ {
        self.loaded
            .iter()
            .enumerate()
            .filter_map(|(d, m)| m.get().map(|m| (d as CUdevice, *m)))
    }
}

/// A function (or kernel) of a module.
#[derive(Debug)]
pub(crate) struct FunctionObj {
    pub(crate) module: usize,
    pub(crate) name: String,
    /// The name as `cuFuncGetName` hands it out, alive as long as the function.
    pub(crate) c_name: std::ffi::CString,
    /// Its mps function on each device, by ordinal, with its parameter layout there, fetched
    /// on the first launch there.
    pub(crate) function: Vec<OnceLock<(Function, KernelLayout)>>,
    pub(crate) params: Vec<ParamInfo>,
    /// Its attributes on each device, by ordinal: the server's, fetched on the first question
    /// there, with what the program set since.
    pub(crate) attributes: Vec<Mutex<Option<[Option<i32>; FUNC_ATTRIBUTES]>>>,
    /// Its server's occupancy figures on each device, by ordinal, for the queries asked so far
    /// (at most `OCCUPANCY_MEMO`): the per-SM and per-block ones only, which the server's
    /// answer never changes for.
    pub(crate) occupancy: Vec<Mutex<Vec<(OccupancyQuery, u64)>>>,
}

/// The occupancy figures a function keeps per device: a program asks about a few launch
/// configurations of each kernel, rarely more.
pub(crate) const OCCUPANCY_MEMO: usize = 16;
