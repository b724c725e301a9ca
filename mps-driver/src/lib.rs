//! The CUDA driver as mps uses it: its results as mps errors, what it says of a device, and
//! driver objects released when dropped.
//!
//! Every driver call whose failure matters goes through [`check`] (or [`check_on`], which names
//! the object only when the call failed, so that a successful call formats nothing). A failure
//! becomes a [`DriverError`] that keeps the driver's code, its name and the call and object that
//! failed; [`status_of`] is the one table from a `CUresult` to an mps [`Status`](mps_core::Status), and
//! [`is_sticky`] says which failures end the context. Releases whose failure leaves nothing to do
//! go through [`released`]. Calls that cudarc's result layer (`cudarc::driver::result`) wraps
//! are made through it, their results named with [`Call`]; the rest (the launch with its packed
//! parameters, green contexts, the attributes cudarc's enum lacks) call `sys` directly.
//!
//! The server's CUDA backend and other programs that drive CUDA themselves (the benchmark's
//! native workers) report failures the same way:
//!
//! ```no_run
//! use cudarc::driver::sys;
//! use mps_driver::{self as driver, DriverError, check, check_on};
//!
//! fn first_device() -> Result<sys::CUdevice, DriverError> {
//!     driver::init()?;
//!     let mut dev = 0;
//!     // SAFETY: writes one int.
//!     let r = unsafe { sys::cuDeviceGet(&mut dev, 0) };
//!     check_on(r, "cuDeviceGet", || "ordinal 0".into())?;
//!     Ok(dev)
//! }
//! ```

mod device;
mod error;
mod owned;

pub use device::{
    all_attributes, attribute, device_count, init, is_present, name, total_mem, uuid,
};
pub use error::{Call, DriverError, check, check_on, is_sticky, released, status_of};
pub use owned::{Event, Graph, GraphExec, Module};
