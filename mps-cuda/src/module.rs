//! Modules, libraries, kernels and launches.
//!
//! A module (`cuModuleLoadData`) belongs to the current context, and is one mps module on its
//! device's server. A library (`cuLibraryLoadData`) belongs to no context, as in CUDA: it is
//! loaded on the current context's device (device 0 without one) at once, so that a bad image
//! fails there, and on another device when a kernel of it is first launched there (the library
//! keeps its image for that); cudart loads its kernels once and launches them on every device.
//! Kernels and functions share one registry, and a kernel handle is also a function handle:
//! cudart launches a `CUkernel` through `cuLaunchKernel`. A function's parameter layout is
//! learnt once, when it is first asked for (the same image has the same layout on every device),
//! and packs `kernelParams`; an `extra` parameter buffer is already packed that way.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use mps_core::protocol::{Cluster, Dim3, FUNC_ATTRIBUTES, ParamInfo};

use crate::abi::{
    CUdevice, CUdeviceptr, CUfunction, CUkernel, CUlaunchConfig, CUlibrary, CUmodule, CUresult,
    CUstream, LAUNCH_PARAM_BUFFER_POINTER, LAUNCH_PARAM_BUFFER_SIZE, LAUNCH_PARAM_END,
    MODULE_EAGER_LOADING, MODULE_LAZY_LOADING, launch_attribute,
};
use crate::connection::{Connection, Function, KernelLayout, Module, Res};
use crate::context::{current, current_handle, require_current};
use crate::driver::{check, connection, driver, entry, lock, put};
use crate::image::image;
use crate::kernel_queries::allows_non_portable_clusters;
use crate::log;
use crate::memo::{Memo, through};
use crate::stream::for_work;

/// A loaded module or library.
#[derive(Debug)]
pub(crate) struct ModuleObj {
    pub(crate) handle: usize,
    /// The owning context; `None` for a library.
    pub(crate) ctx: Option<usize>,
    /// The mps module on each device it is loaded on, by device ordinal: a module's on its
    /// context's device only, a library's on each device that has used it.
    loaded: Vec<OnceLock<Module>>,
    /// A library's image, for the devices it is not loaded on yet (`None` for a module, or
    /// where the process sees one device).
    image: Option<Vec<u8>>,
    /// Held while loading on a device, so that it is loaded there once.
    loading: Mutex<()>,
    /// Its functions (kernels) handed out so far, by name.
    functions: Mutex<HashMap<String, usize>>,
}

impl ModuleObj {
    /// Its mps module on device `dev`, loaded there now if it is a library that was not yet;
    /// a module of another device's context is `CUDA_ERROR_INVALID_CONTEXT`, as CUDA says for a
    /// function used outside its context.
    fn on(&self, dev: CUdevice) -> Res<Module> {
        let slot = self
            .loaded
            .get(dev as usize)
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
        let m = connection(dev)?.module_load(image)?;
        Ok(*slot.get_or_init(|| m))
    }

    /// The devices it is loaded on, each with its mps module there.
    fn each_loaded(&self) -> impl Iterator<Item = (CUdevice, Module)> + '_ {
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
    name: String,
    /// Its mps function on each device, by ordinal, with its parameter layout there, fetched
    /// on the first launch there.
    function: Vec<OnceLock<(Function, KernelLayout)>>,
    params: Vec<ParamInfo>,
    /// Its attributes on each device, by ordinal: the server's, fetched on the first question
    /// there, with what the program set since.
    pub(crate) attributes: Vec<Mutex<Option<[Option<i32>; FUNC_ATTRIBUTES]>>>,
}

impl FunctionObj {
    /// Its mps function on the device of `conn`.
    pub(crate) fn on(&self, conn: &Connection) -> Res<Function> {
        self.fetched(conn).map(|(f, _)| *f)
    }

    /// Its mps function on the device of `conn`, with the function's parameter layout there.
    pub(crate) fn fetched(&self, conn: &Connection) -> Res<&(Function, KernelLayout)> {
        let dev = conn.ordinal();
        let slot = self
            .function
            .get(dev as usize)
            .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
        if let Some(f) = slot.get() {
            return Ok(f);
        }
        let m = driver()?
            .modules
            .get(self.module)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        let (f, _) = conn.get_function(m.on(dev)?, &self.name)?;
        let layout = conn.kernel_layout(f)?;
        // Two threads may fetch it at once: the server hands out the same function twice.
        Ok(slot.get_or_init(|| (f, layout)))
    }
}

fn load(out: *mut *mut c_void, data: *const c_void, ctx: Option<usize>) -> Res<()> {
    check(!out.is_null())?;
    // SAFETY: the caller of the load function guarantees `data` is a complete module image.
    let bytes = unsafe { image(data.cast()) }.ok_or(CUresult::CUDA_ERROR_INVALID_IMAGE)?;
    let d = driver()?;
    // A module loads on its context's device; a library on the current context's, if any.
    let owner = ctx.or_else(current_handle).and_then(|h| d.contexts.get(h));
    let dev = owner.map_or(0, |c| c.device);
    let module = connection(dev)?.module_load(bytes)?;
    let loaded: Vec<OnceLock<Module>> = (0..d.devices.len()).map(|_| OnceLock::new()).collect();
    let _ = loaded[dev as usize].set(module);
    let keep_image = ctx.is_none() && d.devices.len() > 1;
    let (h, _) = d.modules.insert_with(|handle| ModuleObj {
        handle,
        ctx,
        loaded,
        image: keep_image.then(|| bytes.to_vec()),
        loading: Mutex::new(()),
        functions: Mutex::new(HashMap::new()),
    });
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, std::ptr::without_provenance_mut(h)) }
}

/// Unloads module (or library) `m` from every device it is loaded on; the first failure is
/// returned once every device has been tried.
pub(crate) fn unload_everywhere(m: &ModuleObj) -> Res<()> {
    let d = driver()?;
    d.functions.remove_where(|f| f.module == m.handle);
    let mut result = Ok(());
    for (dev, module) in m.each_loaded() {
        let r = connection(dev).and_then(|c| c.module_unload(module));
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// Module (or, with `library`, library) `h`; `CUDA_ERROR_INVALID_HANDLE` for neither, or for one
/// of the other kind.
fn module_obj(h: usize, library: bool) -> Res<Arc<ModuleObj>> {
    driver()?
        .modules
        .get(h)
        .filter(|m| m.ctx.is_none() == library)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// A symbol name a program passed, as UTF-8.
///
/// # Safety
/// `name` must be a NUL-terminated string.
unsafe fn name_str<'a>(name: *const c_char) -> Res<&'a str> {
    // SAFETY: as the caller guarantees.
    unsafe { CStr::from_ptr(name) }
        .to_str()
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)
}

fn unload(h: usize, library: bool) -> Res<()> {
    let d = driver()?;
    let m = module_obj(h, library)?;
    d.modules.remove(h);
    unload_everywhere(&m)
}

/// The function `name` of module `h`: from the module's own list, else fetched once.
fn function(out: *mut *mut c_void, h: usize, name: *const c_char, library: bool) -> Res<()> {
    check(!out.is_null() && !name.is_null())?;
    // SAFETY: the caller guarantees a non-null `name` is a NUL-terminated string.
    let name = unsafe { name_str(name) }?;
    let d = driver()?;
    let m = module_obj(h, library)?;
    let mut known = lock(&m.functions);
    let f = match known.get(name) {
        Some(f) => *f,
        None => {
            // Fetched on a device the module is loaded on: its context's, or the library's
            // first.
            let (dev, module) = m
                .each_loaded()
                .next()
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            let conn = connection(dev)?;
            let (function, params) = conn.get_function(module, name)?;
            let layout = conn.kernel_layout(function)?;
            let slots: Vec<OnceLock<(Function, KernelLayout)>> =
                (0..d.devices.len()).map(|_| OnceLock::new()).collect();
            let _ = slots[dev as usize].set((function, layout));
            let (f, _) = d.functions.insert_with(|_| FunctionObj {
                module: m.handle,
                name: name.to_string(),
                function: slots,
                params,
                attributes: (0..d.devices.len()).map(|_| Mutex::new(None)).collect(),
            });
            known.insert(name.to_string(), f);
            f
        }
    };
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, std::ptr::without_provenance_mut(f)) }
}

/// The address and size of global `name` of module (or library) `h` on the current context's
/// device (device 0 without one), where a library is loaded now if it was not yet.
fn global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    h: usize,
    name: *const c_char,
    library: bool,
) -> Res<()> {
    check(!name.is_null())?;
    // SAFETY: the caller guarantees a non-null `name` is a NUL-terminated string.
    let name = unsafe { name_str(name) }?;
    let d = driver()?;
    let m = module_obj(h, library)?;
    let dev = match m.ctx {
        Some(ctx) => d.contexts.get(ctx).map_or(0, |c| c.device),
        None => current_handle()
            .and_then(|c| d.contexts.get(c))
            .map_or(0, |c| c.device),
    };
    let (p, size) = connection(dev)?.module_global(m.on(dev)?, name)?;
    // SAFETY: the caller guarantees non-null pointers are writable; NULL ones are skipped, as
    // the driver skips them.
    unsafe {
        if !dptr.is_null() {
            put(dptr, p)?;
        }
        if !bytes.is_null() {
            put(bytes, size as usize)?;
        }
    }
    Ok(())
}

/// A module's global variable. Kernels may be given its address; copies to and from it are
/// refused by the server (they reach allocations only).
///
/// # Safety
/// `dptr` and `bytes` must be NULL or writable; `name` NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetGlobal_v2", || {
        global(dptr, bytes, module as usize, name, false)
    })
}

/// As `cuModuleGetGlobal_v2`, for a library, on the current context's device.
///
/// # Safety
/// As `cuModuleGetGlobal_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    entry("cuLibraryGetGlobal", || {
        global(dptr, bytes, library as usize, name, true)
    })
}

thread_local! {
    /// Functions this thread launched, by handle.
    static FUNCTIONS: Memo<usize, Arc<FunctionObj>> = Memo::default();
}

pub(crate) fn function_obj(h: usize) -> Res<Arc<FunctionObj>> {
    driver()?
        .functions
        .get(h)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// Loads a module (PTX, cubin or fatbin) into the current context.
///
/// # Safety
/// `module` must be NULL or writable; `image` a complete module image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    entry("cuModuleLoadData", || {
        load(module.cast(), image, Some(current()?.handle))
    })
}

/// As `cuModuleLoadData`. JIT options are not passed on: the server's driver loads the image
/// with its own defaults, and option outputs (logs, wall time) are left as they were.
///
/// # Safety
/// As `cuModuleLoadData`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut CUmodule,
    image: *const c_void,
    _num_options: u32,
    _options: *mut c_void,
    _option_values: *mut *mut c_void,
) -> CUresult {
    entry("cuModuleLoadDataEx", || {
        load(module.cast(), image, Some(current()?.handle))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    entry("cuModuleUnload", || unload(module as usize, false))
}

/// # Safety
/// `f` must be NULL or writable; `name` NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    module: CUmodule,
    name: *const c_char,
) -> CUresult {
    entry("cuModuleGetFunction", || {
        function(f.cast(), module as usize, name, false)
    })
}

/// The mode NVIDIA's driver reports: eager where `CUDA_MODULE_LOADING=EAGER` asks for it, lazy
/// otherwise (the driver's default since CUDA 12.2). The CUDA runtime acts on it: lazily it
/// loads each image a library registered (cuBLAS registers 193) when a kernel of it is first
/// used; eagerly it loads them all at start, and one built only for other GPUs then fails it
/// (measured: `cublasCreate` fails). A module loaded through mps is loaded when asked either
/// way, so a bad image fails at its load, not at its first launch.
///
/// # Safety
/// `mode` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut i32) -> CUresult {
    entry("cuModuleGetLoadingMode", || {
        driver()?;
        let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v == "EAGER");
        let reported = if eager {
            MODULE_EAGER_LOADING
        } else {
            MODULE_LAZY_LOADING
        };
        // SAFETY: the caller guarantees a non-null `mode` is writable.
        unsafe { put(mode, reported) }
    })
}

/// Loads a library. JIT and library options are not passed on (see `cuModuleLoadDataEx`).
///
/// # Safety
/// `library` must be NULL or writable; `code` a complete module image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut CUlibrary,
    code: *const c_void,
    _jit_options: *mut c_void,
    _jit_values: *mut *mut c_void,
    _num_jit: u32,
    _lib_options: *mut c_void,
    _lib_values: *mut *mut c_void,
    _num_lib: u32,
) -> CUresult {
    entry("cuLibraryLoadData", || load(library.cast(), code, None))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLibraryUnload(library: CUlibrary) -> CUresult {
    entry("cuLibraryUnload", || unload(library as usize, true))
}

/// # Safety
/// `kernel` must be NULL or writable; `name` NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut CUkernel,
    library: CUlibrary,
    name: *const c_char,
) -> CUresult {
    entry("cuLibraryGetKernel", || {
        function(kernel.cast(), library as usize, name, true)
    })
}

/// The kernel's function in the current context: the kernel's own handle, which a launch
/// resolves on the device of its stream.
///
/// # Safety
/// `f` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(f: *mut CUfunction, kernel: CUkernel) -> CUresult {
    entry("cuKernelGetFunction", || {
        current()?;
        function_obj(kernel as usize)?;
        // SAFETY: the caller guarantees a non-null `f` is writable.
        unsafe { put(f, kernel.cast()) }
    })
}

fn param_info(h: usize, index: usize, offset: *mut usize, size: *mut usize) -> Res<()> {
    let f = function_obj(h)?;
    let p = f
        .params
        .get(index)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: the caller guarantees non-null pointers are writable; NULL ones are skipped.
    unsafe {
        if !offset.is_null() {
            put(offset, p.offset as usize)?;
        }
        if !size.is_null() {
            put(size, p.size as usize)?;
        }
    }
    Ok(())
}

/// # Safety
/// `offset` and `size` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetParamInfo(
    f: CUfunction,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry("cuFuncGetParamInfo", || {
        param_info(f as usize, index, offset, size)
    })
}

/// # Safety
/// `offset` and `size` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetParamInfo(
    k: CUkernel,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CUresult {
    entry("cuKernelGetParamInfo", || {
        param_info(k as usize, index, offset, size)
    })
}

/// The parameter buffer an `extra` array names, as (pointer, size).
///
/// # Safety
/// `extra` must be a `CU_LAUNCH_PARAM_END`-terminated array of key/value pairs, and the size
/// value must point at a `size_t`.
unsafe fn extra_buffer(extra: *const *const c_void) -> Res<(*const u8, usize)> {
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

/// # Safety
/// As `cuLaunchKernel` documents: `kernelParams` one pointer per parameter, or `extra` a
/// `CU_LAUNCH_PARAM` array naming a packed parameter buffer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
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
) -> CUresult {
    entry("cuLaunchKernel", || {
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
                false,
            )
        }
    })
}

/// # Safety
/// As `cuLaunchKernel`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
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
) -> CUresult {
    entry("cuLaunchKernel_ptsz", || {
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
                true,
            )
        }
    })
}

/// What a launch attribute asks of a launch, as this library can serve it.
#[derive(Debug, PartialEq, Eq)]
enum AttributeAsks {
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
unsafe fn asks(a: *const u32) -> AttributeAsks {
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

/// # Safety
/// As `launch_ex`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's guarantee is launch_ex's precondition.
    entry("cuLaunchKernelEx", || unsafe {
        launch_ex(config, f, params, extra, false)
    })
}

/// # Safety
/// As `launch_ex`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's guarantee is launch_ex's precondition.
    entry("cuLaunchKernelEx_ptsz", || unsafe {
        launch_ex(config, f, params, extra, true)
    })
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
