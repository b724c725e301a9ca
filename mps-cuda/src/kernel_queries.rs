//! Questions about the context and its kernels: the stream priority range and limits
//! (`cuCtxGetStreamPriorityRange`, `cuCtxGetLimit`, `cuCtxSetLimit`), kernel attributes
//! (`cuFuncGetAttribute` and `cuKernelGetAttribute`, answered from what the server reported on
//! the first question, and their setters) and occupancy (`cuOccupancy*`, asked of the server,
//! once per kernel and question where the answer cannot change).
//!
//! The server's context is shared by every client, so a limit is the server's to set: setting
//! one to the value it has succeeds, any other value is refused. A kernel's dynamic shared
//! memory ceiling and preferred carveout are the program's own: they are kept here, and the
//! server lets every kernel use the device's opt-in shared memory at its first launch that
//! needs it, which honours any ceiling a program may set.

use mps_client::OccupancyQuery;
use mps_core::protocol::{CONTEXT_LIMITS, Dim3, FUNC_ATTRIBUTES};

use crate::abi::device_attribute::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
use crate::abi::function_attribute::{
    CLUSTER_SCHEDULING_POLICY_PREFERENCE as CLUSTER_SCHEDULING,
    MAX_DYNAMIC_SHARED_SIZE_BYTES as MAX_DYNAMIC_SHARED,
    NON_PORTABLE_CLUSTER_SIZE_ALLOWED as NON_PORTABLE_CLUSTER,
    PREFERRED_SHARED_MEMORY_CARVEOUT as CARVEOUT, SHARED_SIZE_BYTES as SHARED_SIZE,
};
use crate::abi::launch_attribute;
use crate::abi::{CUdevice, CUfunction, CUkernel, CUlaunchConfig, CUresult};
use crate::connection::{Connection, Res};
use crate::context::current;
use crate::driver::connection;
use crate::ffi::{check, exports, lock, put};
use crate::log;
use crate::module::function_obj;
use crate::objects::OCCUPANCY_MEMO;

/// `CUDA_ERROR_UNSUPPORTED_LIMIT`.
const UNSUPPORTED_LIMIT: CUresult = CUresult::CUDA_ERROR_UNSUPPORTED_LIMIT;

fn limits() -> Res<mps_client::ContextLimits> {
    current()?.conn()?.context_limits()
}

fn limit(which: u32) -> Res<u64> {
    let l = limits()?;
    if which as usize >= CONTEXT_LIMITS {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    l.limits[which as usize].ok_or(UNSUPPORTED_LIMIT)
}

/// Runs `with` on kernel `h`'s attributes on device `dev` (fetched from its server on the first
/// question there).
fn with_attributes<T>(
    h: usize,
    dev: CUdevice,
    with: impl FnOnce(&mut [Option<i32>; FUNC_ATTRIBUTES], &Connection) -> Res<T>,
) -> Res<T> {
    let f = function_obj(h)?;
    let conn = connection(dev)?;
    let slot = f
        .attributes
        .get(dev as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    let mut known = lock(slot);
    if known.is_none() {
        let function = f.on(conn)?;
        *known = Some(conn.function_attributes(function)?.0);
    }
    with(known.as_mut().expect("fetched above"), conn)
}

/// Whether the program allowed kernel `h` clusters past the portable size on device `dev`
/// (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED` set to 1).
pub(crate) fn allows_non_portable_clusters(h: usize, dev: CUdevice) -> Res<bool> {
    with_attributes(h, dev, |a, _| Ok(a[NON_PORTABLE_CLUSTER] == Some(1)))
}

fn get_attribute(out: *mut i32, attribute: i32, h: usize, dev: CUdevice) -> Res<()> {
    check(!out.is_null())?;
    let v = with_attributes(h, dev, |a, _| {
        let i = usize::try_from(attribute).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        a.get(i)
            .copied()
            .flatten()
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    })?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, v) }
}

fn set_attribute(attribute: i32, value: i32, h: usize, dev: CUdevice) -> Res<()> {
    with_attributes(h, dev, |a, conn| match attribute as usize {
        MAX_DYNAMIC_SHARED => {
            let optin = conn
                .reported_attribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
                .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
            let room = optin - a[SHARED_SIZE].unwrap_or(0);
            check((0..=room).contains(&value))?;
            a[MAX_DYNAMIC_SHARED] = Some(value);
            Ok(())
        }
        CARVEOUT => {
            check((-1..=100).contains(&value))?;
            a[CARVEOUT] = Some(value);
            Ok(())
        }
        // A permission and a preference for clusters, which a launch through mps never forms
        // beyond one block: kept and read back. cuBLAS allows non-portable cluster sizes in
        // `cublasCreate`, which fails if that is refused (measured on the H200).
        NON_PORTABLE_CLUSTER | CLUSTER_SCHEDULING => {
            let most = if attribute as usize == NON_PORTABLE_CLUSTER {
                1
            } else {
                2
            };
            check((0..=most).contains(&value))?;
            a[attribute as usize] = Some(value);
            Ok(())
        }
        _ => {
            log::once(&format!("kernel attribute {attribute}"), || {
                format!(
                    "setting kernel attribute {attribute} is not supported through mps; \
                     returning CUDA_ERROR_NOT_SUPPORTED"
                )
            });
            Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
        }
    })
}

fn current_device() -> Res<CUdevice> {
    Ok(current()?.device)
}

/// Asks the current context's server for `query` of function `f`, once per figure that cannot
/// change: how many blocks fit on one SM and how much shared memory a block may use depend on
/// the kernel and the device alone (the server opts a kernel into more shared memory before it
/// answers, as before its launches, so its first answer is already the one it keeps giving).
/// Cluster figures, which count the whole device's SMs rather than one SM's, are asked each
/// time. A program that asks before each launch would otherwise wait for the server each time,
/// and each answer would end the client's batched run.
fn occupancy(f: CUfunction, query: OccupancyQuery) -> Res<u64> {
    let obj = function_obj(f as usize)?;
    let ctx = current()?;
    let conn = ctx.conn()?;
    let memo = match query {
        OccupancyQuery::ActiveBlocks { .. } | OccupancyQuery::DynamicSmem { .. } => {
            obj.occupancy.get(ctx.device as usize)
        }
        OccupancyQuery::ActiveClusters { .. } => None,
    };
    if let Some(memo) = memo
        && let Some((_, n)) = lock(memo).iter().find(|(q, _)| *q == query)
    {
        return Ok(*n);
    }
    let n = conn.occupancy(obj.on(conn)?, query)?;
    if let Some(memo) = memo {
        let mut memo = lock(memo);
        if memo.len() < OCCUPANCY_MEMO && !memo.iter().any(|(q, _)| *q == query) {
            memo.push((query, n));
        }
    }
    Ok(n)
}

fn active_blocks(out: *mut i32, f: CUfunction, block: i32, smem: usize, flags: u32) -> Res<()> {
    check(!out.is_null() && block > 0)?;
    let query = OccupancyQuery::ActiveBlocks {
        block_size: block as u32,
        dynamic_smem: u32::try_from(smem).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?,
        flags,
    };
    let n = occupancy(f, query)?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, n as i32) }
}

/// The cluster size a launch configuration asks for (0 x 0 x 0 where it names none: the
/// kernel's own). Any other attribute is for the launch, not the figure, and is left alone.
///
/// # Safety
/// `c.attrs` must be readable for `c.numAttrs` attributes.
unsafe fn cluster_of(c: &CUlaunchConfig) -> Res<Dim3> {
    let mut cluster = Dim3::default();
    if c.numAttrs > 0 {
        check(!c.attrs.is_null())?;
    }
    for i in 0..c.numAttrs as usize {
        // SAFETY: the caller guarantees `numAttrs` readable attributes: the id is the first
        // 4 bytes of each, a cluster's dimensions the three u32 of its value at offset 8.
        let (id, dims) = unsafe {
            let a = c.attrs.add(i).cast::<u32>();
            (
                a.read(),
                [a.add(2).read(), a.add(3).read(), a.add(4).read()],
            )
        };
        if id == launch_attribute::CLUSTER_DIMENSION {
            cluster = Dim3 {
                x: dims[0],
                y: dims[1],
                z: dims[2],
            };
        }
    }
    Ok(cluster)
}

// ----- the exports -----

exports! {
    /// # Safety
    /// `least` and `greatest` must each be NULL or writable.
    pub unsafe fn cuCtxGetStreamPriorityRange(
        least: *mut i32,
        greatest: *mut i32,
    ) ["cuCtxGetStreamPriorityRange" 5050] = {
        let l = limits()?;
        // SAFETY: the caller guarantees non-null pointers are writable; NULL ones are skipped.
        unsafe {
            if !least.is_null() {
                put(least, l.least_priority)?;
            }
            if !greatest.is_null() {
                put(greatest, l.greatest_priority)?;
            }
        }
        Ok(())
    };

    /// # Safety
    /// `value` must be NULL or writable.
    pub unsafe fn cuCtxGetLimit(value: *mut usize, which: u32) ["cuCtxGetLimit" 3010] = {
        let v = limit(which)?;
        // SAFETY: the caller guarantees a non-null `value` is writable.
        unsafe { put(value, v as usize) }
    };

    /// Succeeds where the limit already has `value`; the server's context is every client's, so a
    /// change is refused, saying so once per limit.
    pub fn cuCtxSetLimit(which: u32, value: usize) ["cuCtxSetLimit" 3010] = {
        if limit(which)? == value as u64 {
            return Ok(());
        }
        log::once(&format!("cuCtxSetLimit {which}"), || {
            format!(
                "cuCtxSetLimit: limit {which} of the mps server's context is shared by every \
                 client and is not changed; returning CUDA_ERROR_NOT_SUPPORTED"
            )
        });
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    };

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuFuncGetAttribute(
        out: *mut i32,
        attribute: i32,
        f: CUfunction,
    ) ["cuFuncGetAttribute" 2020] =
        get_attribute(out, attribute, f as usize, current_device()?);

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuKernelGetAttribute(
        out: *mut i32,
        attribute: i32,
        k: CUkernel,
        dev: CUdevice,
    ) ["cuKernelGetAttribute" 12000] =
        get_attribute(out, attribute, k as usize, dev);

    pub fn cuFuncSetAttribute(
        f: CUfunction,
        attribute: i32,
        value: i32,
    ) ["cuFuncSetAttribute" 9000] =
        set_attribute(attribute, value, f as usize, current_device()?);

    /// A kernel's preference between L1 cache and shared memory (`CU_FUNC_CACHE_PREFER_*`, 0 to
    /// 3): accepted for a function this library knows and not passed on. CUDA makes it a
    /// preference the driver may ignore, and on devices since Volta the carveout attribute
    /// (`cuFuncSetAttribute`, kept) is what sizes shared memory.
    pub fn cuFuncSetCacheConfig(f: CUfunction, config: i32) ["cuFuncSetCacheConfig" 3000] = {
        crate::module::function_obj(f as usize)?;
        check((0..=3).contains(&config))
    };

    /// A kernel's shared-memory bank size (`CU_SHARED_MEM_CONFIG_*`, 0 to 2), which CUDA 13
    /// deprecates and devices since Volta do not have: accepted for a known function, as a
    /// no-op, as NVIDIA's driver takes it.
    pub fn cuFuncSetSharedMemConfig(
        f: CUfunction,
        config: i32,
    ) ["cuFuncSetSharedMemConfig" 4020] = {
        crate::module::function_obj(f as usize)?;
        check((0..=2).contains(&config))
    };

    pub fn cuKernelSetAttribute(
        attribute: i32,
        value: i32,
        k: CUkernel,
        dev: CUdevice,
    ) ["cuKernelSetAttribute" 12000] =
        set_attribute(attribute, value, k as usize, dev);

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
        out: *mut i32,
        f: CUfunction,
        block: i32,
        smem: usize,
    ) ["cuOccupancyMaxActiveBlocksPerMultiprocessor" 6050] =
        active_blocks(out, f, block, smem, 0);

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        out: *mut i32,
        f: CUfunction,
        block: i32,
        smem: usize,
        flags: u32,
    ) ["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" 7000] =
        active_blocks(out, f, block, smem, flags);

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuOccupancyAvailableDynamicSMemPerBlock(
        out: *mut usize,
        f: CUfunction,
        blocks: i32,
        block: i32,
    ) ["cuOccupancyAvailableDynamicSMemPerBlock" 10020] = {
        check(!out.is_null() && blocks > 0 && block > 0)?;
        let query = OccupancyQuery::DynamicSmem {
            blocks: blocks as u32,
            block_size: block as u32,
        };
        let n = occupancy(f, query)?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, n as usize) }
    };

    /// # Safety
    /// `out` must be NULL or writable; `config` NULL or readable, its attributes as for
    /// `cuLaunchKernelEx`.
    pub unsafe fn cuOccupancyMaxActiveClusters(
        out: *mut i32,
        f: CUfunction,
        config: *const CUlaunchConfig,
    ) ["cuOccupancyMaxActiveClusters" 11070] = {
        check(!out.is_null())?;
        // SAFETY: the caller guarantees a non-null `config` is readable.
        let c = unsafe { config.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller guarantees its attributes are readable.
        let cluster = unsafe { cluster_of(c) }?;
        let query = OccupancyQuery::ActiveClusters {
            block: Dim3 {
                x: c.blockDimX,
                y: c.blockDimY,
                z: c.blockDimZ,
            },
            cluster,
            dynamic_smem: c.sharedMemBytes,
            non_portable: allows_non_portable_clusters(f as usize, current_device()?)?,
        };
        let n = occupancy(f, query)?;
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { put(out, n as i32) }
    };
}
