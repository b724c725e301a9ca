//! Driver objects that release themselves: a module unloaded, an event or graph destroyed when
//! its owner drops it. Each wraps the raw handle it took, which it alone releases.

use cudarc::driver::result;
use cudarc::driver::sys::{CUevent, CUevent_flags, CUgraph, CUgraphExec, CUmodule};

use crate::error::{Call, DriverError, released};

macro_rules! owned {
    ($(#[$doc:meta])* $name:ident($raw:ty), $call:literal, |$h:ident| $release:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name($raw);

        impl $name {
            /// Takes ownership of `raw`.
            ///
            /// # Safety
            /// `raw` is a live handle of its kind that nothing else releases.
            pub unsafe fn from_raw(raw: $raw) -> $name {
                $name(raw)
            }

            /// The raw handle, for calls that use it (valid while `self` lives).
            pub fn raw(&self) -> $raw {
                self.0
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                let $h = self.0;
                // SAFETY: the handle is live and owned by this value alone (`from_raw`'s
                // contract), and released once, here.
                released(unsafe { $release }.call($call));
            }
        }

        // SAFETY: CUDA driver handles may be used from any thread once a context is current
        // there; the driver serialises what it must.
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}
    };
}

owned!(
    /// A loaded module, unloaded when dropped (its kernels' handles die with it).
    Module(CUmodule), "cuModuleUnload", |m| result::module::unload(m)
);
owned!(
    /// An event, destroyed when dropped; pending records keep working (the driver releases it
    /// when they complete).
    Event(CUevent), "cuEventDestroy", |e| result::event::destroy(e)
);
owned!(
    /// A graph captured from a stream, destroyed when dropped (executable graphs made from it
    /// do not need it).
    Graph(CUgraph), "cuGraphDestroy", |g| result::graph::destroy(g)
);
owned!(
    /// An executable graph, destroyed when dropped; a launch still in flight completes first
    /// (the driver frees it then).
    GraphExec(CUgraphExec), "cuGraphExecDestroy", |g| result::graph::exec_destroy(g)
);

impl Module {
    /// Loads a module image (PTX, cubin or fatbin) into the current context.
    ///
    /// # Safety
    /// `image` is a whole image: PTX text ends with a NUL, a cubin or fatbin is as long as its
    /// headers say (the driver reads as far as they say).
    pub unsafe fn load_data(image: &[u8]) -> Result<Module, DriverError> {
        // SAFETY: the caller's guarantee; a context is current.
        let raw = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .call_on("cuModuleLoadData", || {
                format!("an image of {} bytes", image.len())
            })?;
        Ok(Module(raw))
    }
}

impl Event {
    /// Creates an event in the current context.
    pub fn create(flags: CUevent_flags) -> Result<Event, DriverError> {
        result::event::create(flags)
            .call("cuEventCreate")
            .map(Event)
    }
}
