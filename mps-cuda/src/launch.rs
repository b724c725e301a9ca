//! Kernel launches (`cuLaunchKernel`, `cuLaunchKernelEx`), posted without waiting: a function's
//! parameter layout (`module`'s) packs `kernelParams`; an `extra` parameter buffer is already
//! packed that way. A launch attribute is served where a plain launch (or a cluster) does what
//! it asks, and refused otherwise.

use std::ffi::c_void;
use std::sync::Arc;

use mps_core::protocol::{Cluster, Dim3, ParamInfo};

use crate::abi::{
    CUfunction, CUlaunchConfig, CUresult, CUstream, LAUNCH_PARAM_BUFFER_POINTER,
    LAUNCH_PARAM_BUFFER_SIZE, LAUNCH_PARAM_END, launch_attribute,
};
use crate::connection::Res;
use crate::context::{current, require_current};
use crate::ffi::{check, exports};
use crate::kernel_queries::allows_non_portable_clusters;
use crate::log;
use crate::memo::{Memo, through};
use crate::module::function_obj;
use crate::objects::FunctionObj;
use crate::stream::for_work;

thread_local! {
    /// Functions this thread launched, by handle.
    static FUNCTIONS: Memo<usize, Arc<FunctionObj>> = Memo::default();
}

/// The parameter buffer an `extra` array names, as (pointer, size).
///
/// # Safety
/// `extra` must be a `CU_LAUNCH_PARAM_END`-terminated array of key/value pairs, and the size
/// value must point at a `size_t`.
pub(crate) unsafe fn extra_buffer(extra: *const *const c_void) -> Res<(*const u8, usize)> {
    let (mut buf, mut size) = (None, None);
    let mut i = 0;
    loop {
        // SAFETY: the caller guarantees the array runs to its END key.
        let key = unsafe { *extra.add(i) } as usize;
        match key {
            LAUNCH_PARAM_END => break,
            LAUNCH_PARAM_BUFFER_POINTER => {
                // SAFETY: each key but END is followed by its value.
                buf = Some(unsafe { *extra.add(i + 1) }.cast::<u8>());
            }
            LAUNCH_PARAM_BUFFER_SIZE => {
                // SAFETY: as above; the value points at a size_t.
                let p = unsafe { *extra.add(i + 1) }.cast::<usize>();
                check(!p.is_null())?;
                // SAFETY: non-null, and the caller guarantees it points at a size_t.
                size = Some(unsafe { p.read_unaligned() });
            }
            _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
        i += 2;
    }
    match (buf, size) {
        (Some(b), Some(n)) if !b.is_null() => Ok((b, n)),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// Launches, posted without waiting: a failure of the kernel surfaces at the next
/// synchronising call.
///
/// # Safety
/// `params` must be NULL or hold one pointer per kernel parameter, each readable for that
/// parameter's size; `extra` NULL or a valid `CU_LAUNCH_PARAM` array.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    f: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    cluster: Option<Cluster>,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> Res<()> {
    let h = f as usize;
    through(
        &FUNCTIONS,
        h,
        || function_obj(h),
        |f| {
            require_current()?;
            let (stream, conn) = for_work(stream, per_thread)?;
            let (_, kernel) = f.fetched(conn)?;
            // Pointers into an `extra` buffer: on the stack for up to this many parameters.
            const ON_STACK: usize = 32;
            let mut near = [std::ptr::null::<u8>(); ON_STACK];
            let far: Vec<*const u8>;
            let values: *const *const u8 = if extra.is_null() {
                params.cast()
            } else {
                check(params.is_null())?;
                // SAFETY: the caller guarantees `extra` is a valid CU_LAUNCH_PARAM array.
                let (buf, len) = unsafe { extra_buffer(extra.cast()) }?;
                let total = f.params.last().map_or(0, |p| (p.offset + p.size) as usize);
                check(len >= total)?;
                // The buffer is laid out as the kernel's parameters are: point at each one in it.
                // SAFETY: offsets within the first `total` <= `len` bytes of the caller's buffer.
                let at = |p: &ParamInfo| unsafe { buf.add(p.offset as usize) };
                if f.params.len() <= ON_STACK {
                    near.iter_mut().zip(&f.params).for_each(|(v, p)| *v = at(p));
                    near.as_ptr()
                } else {
                    far = f.params.iter().map(at).collect();
                    far.as_ptr()
                }
            };
            // SAFETY: one readable pointer per parameter: the caller's `params`, or into its
            // `extra` buffer (`near` and `far` outlive the call).
            unsafe { conn.launch(kernel, grid, block, shared, cluster, stream, values) }
        },
    )
}

/// What a launch attribute asks of a launch, as this library can serve it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AttributeAsks {
    /// Nothing a plain launch does not do: `IGNORE`, a cluster of one block, cooperation off.
    Nothing,
    /// Clusters of these blocks per axis.
    Clusters(Dim3),
    /// A hint or a permission that the plain launch satisfies: an L2 access-policy window, a
    /// synchronisation policy, a cluster-scheduling preference, programmatic dependent launch
    /// allowed (without it the kernel starts once the one before it has finished, and its
    /// `griddepcontrol.wait` returns at once, as CUDA documents), a priority, memory
    /// synchronisation domains, a shared-memory carveout. Dropped.
    Hint,
    /// A launch of another kind: a cooperative launch, an event the launch records, a cluster
    /// with a zero extent. Refused.
    Unsupported,
}

/// What attribute `a` asks.
///
/// # Safety
/// `a` must point at a readable `CUlaunchAttribute` (an id, padding, a 64-byte value).
pub(crate) unsafe fn asks(a: *const u32) -> AttributeAsks {
    // SAFETY: the caller guarantees a whole attribute: the id at word 0, the value from word 2.
    let (id, v) = unsafe {
        (
            a.read(),
            [a.add(2).read(), a.add(3).read(), a.add(4).read()],
        )
    };
    use launch_attribute as L;
    match id {
        L::IGNORE => AttributeAsks::Nothing,
        L::COOPERATIVE if v[0] == 0 => AttributeAsks::Nothing,
        L::CLUSTER_DIMENSION if v == [1, 1, 1] => AttributeAsks::Nothing,
        L::CLUSTER_DIMENSION if !v.contains(&0) => AttributeAsks::Clusters(Dim3 {
            x: v[0],
            y: v[1],
            z: v[2],
        }),
        L::ACCESS_POLICY_WINDOW
        | L::SYNCHRONIZATION_POLICY
        | L::CLUSTER_SCHEDULING_POLICY_PREFERENCE
        | L::PROGRAMMATIC_STREAM_SERIALIZATION
        | L::PRIORITY
        | L::MEM_SYNC_DOMAIN_MAP
        | L::MEM_SYNC_DOMAIN
        | L::PREFERRED_SHARED_MEMORY_CARVEOUT => AttributeAsks::Hint,
        _ => AttributeAsks::Unsupported,
    }
}

/// `cuLaunchKernelEx`. A launch attribute that would change how the server launches (a
/// cluster of several blocks, a cooperative launch, an event recorded by the launch, ...) is
/// not offered: a launch with one is refused, naming the attribute once; attributes that ask
/// for nothing beyond a plain launch, or only hint or permit, are accepted ([`AttributeAsks`]).
///
/// # Safety
/// `config` must be NULL or readable, its `attrs` readable for `numAttrs` attributes; the
/// parameters as for `cuLaunchKernel`.
unsafe fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> Res<()> {
    // SAFETY: the caller guarantees a non-null `config` is readable.
    let c = unsafe { config.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let mut cluster = None;
    if c.numAttrs > 0 {
        check(!c.attrs.is_null())?;
        let mut refused = false;
        for i in 0..c.numAttrs as usize {
            // The attribute is read as the integers it is in C, not as cudarc's enum, which
            // may lack its id. SAFETY: the caller guarantees `numAttrs` readable attributes.
            let a = unsafe { c.attrs.add(i) }.cast::<u32>();
            // SAFETY: as above; the id is the first 4 bytes.
            let id = unsafe { a.read() };
            // SAFETY: as above.
            match unsafe { asks(a) } {
                AttributeAsks::Nothing => {}
                // Past the portable 8 blocks only where the program allowed the kernel more
                // (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED).
                AttributeAsks::Clusters(dims) => {
                    let dev = current()?.device;
                    cluster = Some(Cluster {
                        dims,
                        non_portable: allows_non_portable_clusters(f as usize, dev)?,
                    });
                }
                AttributeAsks::Hint => log::detail_once(format_args!("launch hint {id}"), || {
                    format!("cuLaunchKernelEx: launch attribute {id} (a hint) is dropped")
                }),
                AttributeAsks::Unsupported => {
                    refused = true;
                    log::once(&format!("launch attribute {id}"), || {
                        format!(
                            "cuLaunchKernelEx: launch attribute {id} is not supported through \
                             mps; returning CUDA_ERROR_NOT_SUPPORTED"
                        )
                    });
                }
            }
        }
        if refused {
            return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
        }
    }
    let grid = [c.gridDimX, c.gridDimY, c.gridDimZ];
    let block = [c.blockDimX, c.blockDimY, c.blockDimZ];
    // SAFETY: the caller's guarantee is launch's precondition.
    unsafe {
        launch(
            f,
            grid,
            block,
            c.sharedMemBytes,
            cluster,
            c.hStream,
            params,
            extra,
            per_thread,
        )
    }
}

// ----- the exports -----

exports! {
    /// # Safety
    /// As `cuLaunchKernel` documents: `kernelParams` one pointer per parameter, or `extra` a
    /// `CU_LAUNCH_PARAM` array naming a packed parameter buffer.
    pub unsafe fn cuLaunchKernel(
        f: CUfunction,
        gx: u32,
        gy: u32,
        gz: u32,
        bx: u32,
        by: u32,
        bz: u32,
        shared: u32,
        h: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) ["cuLaunchKernel" 4000]
        per_thread cuLaunchKernel_ptsz = |per_thread| {
            // SAFETY: the caller's guarantee is launch's precondition.
            unsafe {
                launch(
                    f,
                    [gx, gy, gz],
                    [bx, by, bz],
                    shared,
                    None,
                    h,
                    params,
                    extra,
                    per_thread,
                )
            }
        };

    /// # Safety
    /// As `launch_ex`.
    pub unsafe fn cuLaunchKernelEx(
        config: *const CUlaunchConfig,
        f: CUfunction,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) ["cuLaunchKernelEx" 11060]
        per_thread cuLaunchKernelEx_ptsz = |per_thread|
            // SAFETY: the caller's guarantee is launch_ex's precondition.
            unsafe { launch_ex(config, f, params, extra, per_thread) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each id asks, by the numbers a C program passes (cuda.h 13.0's), so that naming them
    /// changed nothing.
    #[test]
    fn launch_attributes_by_their_ids_in_cuda_h() {
        let ask = |id: u32, v: [u32; 3]| {
            let mut a = [0u32; 18];
            a[0] = id;
            a[2..5].copy_from_slice(&v);
            // SAFETY: a whole attribute: an id, padding and a 64-byte value.
            unsafe { asks(a.as_ptr()) }
        };
        assert_eq!(ask(0, [0; 3]), AttributeAsks::Nothing);
        assert_eq!(ask(2, [0; 3]), AttributeAsks::Nothing);
        assert_eq!(ask(2, [1, 0, 0]), AttributeAsks::Unsupported);
        assert_eq!(ask(4, [1, 1, 1]), AttributeAsks::Nothing);
        assert_eq!(
            ask(4, [2, 1, 1]),
            AttributeAsks::Clusters(Dim3 { x: 2, y: 1, z: 1 })
        );
        assert_eq!(ask(4, [0, 1, 1]), AttributeAsks::Unsupported);
        for hint in [1, 3, 5, 6, 8, 9, 10, 14] {
            assert_eq!(ask(hint, [1, 1, 1]), AttributeAsks::Hint, "id {hint}");
        }
        for refused in [7, 11, 12, 13, 15, 16, 99] {
            assert_eq!(
                ask(refused, [1, 1, 1]),
                AttributeAsks::Unsupported,
                "id {refused}"
            );
        }
    }
}
