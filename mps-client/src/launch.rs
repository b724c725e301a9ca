//! Modules and launches: loading a module image, finding its kernels and their parameter
//! layouts, and launching them.
//!
//! A launch is the hot path. Its parameters are read once, from the caller's memory straight
//! into the submission ring's slots (a [`Gather`] hands them to [`Slots`] slot by slot), under
//! one hold of the submission lock; nothing is allocated. The geometry is checked here against
//! the limits the device's compute capability implies, so that a bad one fails in the launch
//! call, as with CUDA; the server checks it again against its device, since a client may lie.

use std::sync::Arc;

use mps_core::limits::{DeviceLimits, check_clusters, check_geometry};
use mps_core::protocol::{self, Cluster, Dim3, LaunchSpec, ParamInfo, Request};
use mps_core::slots::{Payload, Slots};
use mps_core::{Error, Result};

use crate::connection::Client;
use crate::handles::{Function, Module, Stream};
use crate::kernels::Kernel;
use crate::submission::unknown;
use crate::transport::lock;

impl Client {
    /// Loads a module image (PTX text, cubin or fatbin; the simulator takes PTX).
    pub fn module_load(&self, image: &[u8]) -> Result<Module> {
        if image.is_empty() {
            return Err(Error::invalid_value("module image is empty"));
        }
        self.transport.check()?;
        let _g = lock(&self.host.staging);
        let (staging, staging_len) = self.transport.channel.staging();
        let mut module = 0;
        let chunks = image.len().div_ceil(staging_len);
        for (i, chunk) in image.chunks(staging_len).enumerate() {
            // SAFETY: chunk.len() <= staging_len, and we hold the staging lock.
            unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), staging, chunk.len()) };
            let req = Request::ModuleData {
                staging_offset: 0,
                len: chunk.len() as u64,
                last: i + 1 == chunks,
            };
            module = self.transport.call(&req)?.values[0];
        }
        Ok(Module(module))
    }

    /// Unloads a module; its functions become invalid.
    pub fn module_unload(&self, module: Module) -> Result<()> {
        self.transport
            .call(&Request::ModuleUnload { module: module.0 })?;
        // The server dropped the module's functions; forget their layouts lazily (a stale
        // handle fails on the server with INVALID_HANDLE).
        Ok(())
    }

    /// The kernel `name` of `module`.
    pub fn module_get_function(&self, module: Module, name: &str) -> Result<Function> {
        if name.is_empty() || name.len() > protocol::MAX_NAME_BYTES {
            return Err(Error::invalid_value(format!(
                "kernel name must be 1 to {} bytes",
                protocol::MAX_NAME_BYTES
            )));
        }
        let reply = self.transport.call(&Request::GetFunction {
            module: module.0,
            name: name.as_bytes(),
        })?;
        let [handle, count, ..] = reply.values;
        let mut params = Vec::with_capacity(count as usize);
        while (params.len() as u64) < count {
            let c = self.transport.call(&Request::ParamInfo {
                function: handle,
                first: params.len() as u32,
            })?;
            let page: &[ParamInfo] = bytemuck::try_cast_slice(c.data())
                .map_err(|_| Error::internal("malformed parameter info reply"))?;
            if page.is_empty() {
                return Err(Error::internal("server returned no parameter info"));
            }
            params.extend_from_slice(page);
        }
        self.kernels.insert(Kernel::new(handle, params)?);
        Ok(Function(handle))
    }

    /// Offset and size of parameter `index` of `function`.
    pub fn function_param_info(&self, function: Function, index: u32) -> Result<ParamInfo> {
        let kernel = self.kernel(function)?;
        let params = &kernel.params;
        params.get(index as usize).copied().ok_or_else(|| {
            Error::invalid_value(format!(
                "kernel has {} parameters; there is no parameter {index}",
                params.len()
            ))
        })
    }

    /// The parameter layout of `function`.
    fn kernel(&self, function: Function) -> Result<Arc<Kernel>> {
        self.kernels
            .get(function.0)
            .ok_or_else(|| unknown("function", function.0))
    }

    /// Launches `function` with one byte slice per parameter (each exactly the parameter's
    /// size), asynchronously in `stream`.
    pub fn launch(
        &self,
        function: Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Stream,
        args: &[&[u8]],
    ) -> Result<()> {
        let kernel = self.kernel(function)?;
        if args.len() != kernel.params.len() {
            return Err(Error::invalid_value(format!(
                "kernel takes {} parameters, {} given",
                kernel.params.len(),
                args.len()
            )));
        }
        for (i, (a, p)) in args.iter().zip(kernel.params.iter()).enumerate() {
            if a.len() != p.size as usize {
                return Err(Error::invalid_value(format!(
                    "parameter {i} is {} bytes, {} given",
                    p.size,
                    a.len()
                )));
            }
        }
        // SAFETY: each slice is exactly its parameter's size.
        let gather = unsafe { Gather::new(&kernel, Values::Slices(args)) };
        let spec = LaunchSpec {
            function: &*kernel,
            grid,
            block,
            shared_mem,
            cluster: None,
            params: gather,
        };
        self.post_launch(spec, stream)
    }

    /// Launches with parameters as cuLaunchKernel takes them: `params[i]` points at the value of
    /// parameter `i`.
    ///
    /// # Safety
    /// `params` must point at one pointer per kernel parameter, each valid for reading that
    /// parameter's size (it may be null for a kernel without parameters).
    pub unsafe fn launch_raw(
        &self,
        function: Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        stream: Stream,
        params: *const *const u8,
    ) -> Result<()> {
        // SAFETY: the caller's guarantee.
        unsafe { self.launch_raw_in(function, grid, block, shared_mem, None, stream, params) }
    }

    /// As [`Client::launch_raw`], the blocks grouped in clusters where `cluster` says so (as
    /// `cuLaunchKernelEx` with `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`).
    ///
    /// # Safety
    /// As [`Client::launch_raw`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw_in(
        &self,
        function: Function,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        cluster: Option<Cluster>,
        stream: Stream,
        params: *const *const u8,
    ) -> Result<()> {
        let kernel = self.kernel_layout(function)?;
        // SAFETY: the caller's guarantee.
        unsafe { self.launch_raw_kernel(&kernel, grid, block, shared_mem, cluster, stream, params) }
    }

    /// The parameter layout of `function`, to launch it with [`Client::launch_raw_kernel`]
    /// without finding it again: for a caller that launches one function many times and
    /// keeps what it learned of it (a driver library's function object).
    pub fn kernel_layout(&self, function: Function) -> Result<KernelLayout> {
        self.kernel(function).map(KernelLayout)
    }

    /// As [`Client::launch_raw_in`], for the function whose layout `kernel` is (from
    /// [`Client::kernel_layout`] of this client).
    ///
    /// # Safety
    /// As [`Client::launch_raw`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn launch_raw_kernel(
        &self,
        kernel: &KernelLayout,
        grid: Dim3,
        block: Dim3,
        shared_mem: u32,
        cluster: Option<Cluster>,
        stream: Stream,
        params: *const *const u8,
    ) -> Result<()> {
        let kernel = &*kernel.0;
        if !kernel.params.is_empty() && params.is_null() {
            return Err(Error::invalid_value(format!(
                "kernel takes {} parameters but params is NULL",
                kernel.params.len()
            )));
        }
        for i in 0..kernel.params.len() {
            // SAFETY: the caller guarantees params holds one pointer per parameter.
            if unsafe { *params.add(i) }.is_null() {
                return Err(Error::invalid_value(format!("params[{i}] is NULL")));
            }
        }
        // SAFETY: the caller guarantees one readable pointer per parameter, each for that
        // parameter's size; none is NULL (checked above).
        let gather = unsafe { Gather::new(kernel, Values::Pointers(params)) };
        let spec = LaunchSpec {
            function: kernel,
            grid,
            block,
            shared_mem,
            cluster,
            params: gather,
        };
        self.post_launch(spec, stream)
    }

    /// Puts a launch in the ring: one hold of the submission lock, the parameters gathered
    /// straight into the slots.
    fn post_launch(&self, spec: LaunchSpec<&Kernel, Gather<'_>>, stream: Stream) -> Result<()> {
        self.transport.check()?;
        let (grid, block) = (spec.grid, spec.block);
        check_geometry(
            grid,
            block,
            spec.shared_mem,
            &DeviceLimits::of_compute_capability(self.device_info().cc),
        )?;
        if let Some(c) = spec.cluster {
            // Checked here as well as by the server, so that the launch itself fails, as with
            // CUDA, not the next synchronising call.
            check_clusters(grid, &c, self.device_info().cc)?;
            // A cluster launch's header holds block.y and block.z in 16 bits and each cluster
            // extent in 8; CUDA allows far less (1024, 64 and 16).
            let d = c.dims;
            if block.y > 0xffff || block.z > 0xffff || d.x > 0xff || d.y > 0xff || d.z > 0xff {
                return Err(Error::invalid_value(format!(
                    "a cluster launch of blocks ({}, {}, {}) in clusters ({}, {}, {}) is past \
                     CUDA's limits",
                    block.x, block.y, block.z, d.x, d.y, d.z
                )));
            }
        }
        self.transport
            .submit(
                stream,
                0,
                spec.opcode(),
                |seq| Slots::launch(spec.map(|k| k.handle, |g| g), seq, stream.0, 0),
                |_, _, _| {},
            )
            .map(drop)
    }
}

/// A function's parameter layout as this client learned it ([`Client::kernel_layout`]).
#[derive(Clone, Debug)]
pub struct KernelLayout(Arc<Kernel>);

/// Where a launch's parameter values are.
#[derive(Clone, Copy, Debug)]
enum Values<'a> {
    /// One pointer per parameter, as `cuLaunchKernel` takes them.
    Pointers(*const *const u8),
    /// One slice per parameter.
    Slices(&'a [&'a [u8]]),
}

/// A launch's packed parameter buffer, gathered from the caller's values as each ring slot is
/// written: the bytes of slot `k` are those parameters that overlap it, copied at their offsets
/// (padding between them stays zero).
#[derive(Clone, Copy, Debug)]
struct Gather<'a> {
    params: &'a [ParamInfo],
    bytes: usize,
    values: Values<'a>,
}

impl<'a> Gather<'a> {
    /// # Safety
    /// `values` holds one value per parameter of `kernel`, each readable for that parameter's
    /// size for as long as the gather is used; pointers are not NULL.
    unsafe fn new(kernel: &'a Kernel, values: Values<'a>) -> Gather<'a> {
        Gather {
            params: &kernel.params,
            bytes: kernel.bytes,
            values,
        }
    }

    fn value(&self, i: usize) -> *const u8 {
        match self.values {
            // SAFETY: one pointer per parameter (see `new`), and i < the parameter count.
            Values::Pointers(p) => unsafe { *p.add(i) },
            Values::Slices(s) => s[i].as_ptr(),
        }
    }
}

impl Payload for Gather<'_> {
    fn len(&self) -> usize {
        self.bytes
    }

    fn copy_to(&self, start: usize, out: &mut [u8]) {
        let end = start + out.len();
        // Parameters are in offset order (checked in `Kernel::new`): skip those that end before
        // this slot, copy until one starts after it.
        let first = self
            .params
            .partition_point(|p| p.offset as usize + p.size as usize <= start);
        for (i, p) in self.params.iter().enumerate().skip(first) {
            let (o, n) = (p.offset as usize, p.size as usize);
            if o >= end {
                break;
            }
            let (lo, hi) = (o.max(start), (o + n).min(end));
            // SAFETY: the value is readable for n bytes (see `new`) and lo - o + (hi - lo) <= n;
            // the destination lo - start .. hi - start lies inside `out` (start <= lo, hi <=
            // end); the caller's memory and the slot do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.value(i).add(lo - o),
                    out.as_mut_ptr().add(lo - start),
                    hi - lo,
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use mps_core::protocol::{Command, Request};

    use super::*;

    fn param(offset: u32, size: u32) -> ParamInfo {
        ParamInfo { offset, size }
    }

    /// The launch's slots decoded back as the server does.
    fn decoded_params(slots: &Slots<Gather<'_>>) -> Vec<u8> {
        let all: Vec<Command> = slots.iter().collect();
        let payload: Vec<u8> = all[1..]
            .iter()
            .flat_map(|s| bytemuck::bytes_of(s).to_vec())
            .collect();
        match Request::decode(&all[0], &payload).unwrap() {
            Request::Launch { spec } => spec.params.to_vec(),
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn parameters_are_gathered_at_their_offsets_across_slots() {
        // A pointer, a 4-byte value (then 4 bytes of padding), a 100-byte struct spanning two
        // slots, and a 2-byte value at the end.
        let kernel = Kernel::new(
            7,
            vec![param(0, 8), param(8, 4), param(16, 100), param(116, 2)],
        )
        .unwrap();
        let ptr = 0x7f00_1234_5678_9abcu64.to_le_bytes();
        let n = 0xdead_beefu32.to_le_bytes();
        let big: Vec<u8> = (0..100).collect();
        let tail = [0xa1u8, 0xa2];
        let values: [*const u8; 4] = [ptr.as_ptr(), n.as_ptr(), big.as_ptr(), tail.as_ptr()];
        let mut expected = vec![0u8; 118];
        expected[0..8].copy_from_slice(&ptr);
        expected[8..12].copy_from_slice(&n);
        expected[16..116].copy_from_slice(&big);
        expected[116..118].copy_from_slice(&tail);

        // SAFETY: each pointer is readable for its parameter's size, for the whole test.
        let raw = unsafe { Gather::new(&kernel, Values::Pointers(values.as_ptr())) };
        let grid = Dim3 { x: 2, y: 1, z: 1 };
        let slots = Slots::launch(
            LaunchSpec {
                function: 7,
                grid,
                block: grid,
                shared_mem: 0,
                cluster: None,
                params: raw,
            },
            3,
            0,
            0,
        )
        .unwrap();
        assert_eq!(slots.len(), 3, "118 bytes take two payload slots");
        assert_eq!(decoded_params(&slots), expected);

        let args: [&[u8]; 4] = [&ptr, &n, &big, &tail];
        // SAFETY: each slice is its parameter's size.
        let slices = unsafe { Gather::new(&kernel, Values::Slices(&args)) };
        let slots = Slots::launch(
            LaunchSpec {
                function: 7,
                grid,
                block: grid,
                shared_mem: 0,
                cluster: None,
                params: slices,
            },
            3,
            0,
            0,
        )
        .unwrap();
        assert_eq!(decoded_params(&slots), expected);
    }

    #[test]
    fn a_kernel_without_parameters_takes_one_slot() {
        let kernel = Kernel::new(1, vec![]).unwrap();
        // SAFETY: there are no parameters to read.
        let g = unsafe { Gather::new(&kernel, Values::Pointers(std::ptr::null())) };
        let one = Dim3 { x: 1, y: 1, z: 1 };
        let slots = Slots::launch(
            LaunchSpec {
                function: 1,
                grid: one,
                block: one,
                shared_mem: 0,
                cluster: None,
                params: g,
            },
            1,
            0,
            0,
        )
        .unwrap();
        assert_eq!(slots.len(), 1);
        assert!(decoded_params(&slots).is_empty());
    }

    #[test]
    fn a_layout_with_overlapping_parameters_is_refused() {
        let e = Kernel::new(9, vec![param(0, 8), param(4, 4)]).unwrap_err();
        assert!(e.message.contains("parameter 1 of kernel 0x9"), "{e}");
    }
}
