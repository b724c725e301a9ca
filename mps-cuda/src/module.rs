//! Modules, libraries and kernels.
//!
//! A module (`cuModuleLoadData`) belongs to the current context, and is one mps module on its
//! device's server. A library (`cuLibraryLoadData`) belongs to no context, as in CUDA: it is
//! loaded on the current context's device (device 0 without one) at once, so that a bad image
//! fails there, and on another device when a kernel of it is first launched there (the library
//! keeps its image for that); cudart loads its kernels once and launches them on every device.
//! Kernels and functions share one registry, and a kernel handle is also a function handle:
//! cudart launches a `CUkernel` through `cuLaunchKernel`. A function's parameter layout is
//! learnt once, when it is first asked for (the same image has the same layout on every device);
//! the launches that use it are `launch`'s.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex, Once, OnceLock};

use crate::abi::{
    CUdeviceptr, CUfunction, CUkernel, CUlibrary, CUmodule, CUresult, MODULE_EAGER_LOADING,
    MODULE_LAZY_LOADING,
};
use crate::connection::{Connection, Function, KernelLayout, Module, Res};
use crate::context::{current, current_handle};
use crate::driver::{self, Stage, connection, driver};
use crate::ffi::{check, exports, lock, put};
use crate::image::image;
use crate::log;
use crate::objects::{Context, FunctionObj, ModuleObj};

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
        let (f, _) = conn.get_function(m.on(conn)?, &self.name)?;
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
    if ctx.is_some() {
        static HOOKED: Once = Once::new();
        HOOKED.call_once(|| driver::on_release(Stage::Late, unload_modules_of));
    }
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
fn unload_everywhere(m: &ModuleObj) -> Res<()> {
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

/// Context `ctx` is released: its modules are unloaded ([`driver::on_release`]).
fn unload_modules_of(ctx: &Context) -> Res<()> {
    let mut first = Ok(());
    for m in driver()?
        .modules
        .remove_where(|m| m.ctx == Some(ctx.handle))
    {
        let r = unload_everywhere(&m);
        if first.is_ok() {
            first = r;
        }
    }
    first
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
    let f = function_of(&*module_obj(h, library)?, name)?;
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, std::ptr::without_provenance_mut(f)) }
}

/// The handle of module `m`'s function `name`: from the module's own list, else fetched once.
fn function_of(m: &ModuleObj, name: &str) -> Res<usize> {
    let d = driver()?;
    let mut known = lock(&m.functions);
    if let Some(f) = known.get(name) {
        return Ok(*f);
    }
    let c_name = CString::new(name).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
    // Fetched on a device the module is loaded on: its context's, or the library's first.
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
        c_name,
        function: slots,
        params,
        attributes: (0..d.devices.len()).map(|_| Mutex::new(None)).collect(),
        occupancy: (0..d.devices.len()).map(|_| Mutex::default()).collect(),
    });
    known.insert(name.to_string(), f);
    Ok(f)
}

/// The handles of every function of module `m`, in the order the server's driver lists them.
fn functions_of(m: &ModuleObj) -> Res<Vec<usize>> {
    let (dev, module) = m
        .each_loaded()
        .next()
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    let names = connection(dev)?.module_function_names(module)?;
    names.iter().map(|n| function_of(m, n)).collect()
}

/// The handles of every function of module or library `h`, whichever it is.
pub(crate) fn functions_of_handle(h: usize) -> Res<Vec<usize>> {
    let m = driver()?
        .modules
        .get(h)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    functions_of(&m)
}

/// How many functions module (or library) `h` has.
fn function_count(count: *mut u32, h: usize, library: bool) -> Res<()> {
    check(!count.is_null())?;
    let n = functions_of(&*module_obj(h, library)?)?.len();
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(count, n as u32) }
}

/// Up to `room` function handles of module (or library) `h` into `out`, as
/// `cuModuleEnumerateFunctions` hands them out.
fn enumerate(out: *mut *mut c_void, room: u32, h: usize, library: bool) -> Res<()> {
    check(!out.is_null() && room > 0)?;
    let all = functions_of(&*module_obj(h, library)?)?;
    for (i, f) in all.iter().take(room as usize).enumerate() {
        // SAFETY: the caller guarantees `out` has room for `room` handles; i < room.
        unsafe { out.add(i).write(std::ptr::without_provenance_mut(*f)) };
    }
    Ok(())
}

/// The name of function (or kernel) `h`, alive as long as it is.
fn function_name(out: *mut *const c_char, h: usize) -> Res<()> {
    check(!out.is_null())?;
    let f = function_obj(h)?;
    // The registry keeps the object, and so its name, until its module is unloaded.
    let p = f.c_name.as_ptr();
    // SAFETY: checked non-null; the caller guarantees it is writable.
    unsafe { put(out, p) }
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
    let conn = connection(dev)?;
    let (p, size) = conn.module_global(m.on(conn)?, name)?;
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

pub(crate) fn function_obj(h: usize) -> Res<Arc<FunctionObj>> {
    driver()?
        .functions
        .get(h)
        .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
}

/// `cuModuleLoad`: the image in file `fname`, loaded into the current context.
fn load_file(module: *mut CUmodule, fname: *const c_char) -> Res<()> {
    check(!fname.is_null())?;
    // SAFETY: checked non-null; the caller of cuModuleLoad guarantees a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(fname) };
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
    let mut bytes = std::fs::read(path).map_err(|e| {
        log::failure(&format!(
            "cuModuleLoad: cannot read {}: {e}",
            path.display()
        ));
        CUresult::CUDA_ERROR_FILE_NOT_FOUND
    })?;
    // PTX text ends at its NUL, as in memory; a cubin or fatbin is sized by its header.
    bytes.push(0);
    load(
        module.cast(),
        bytes.as_ptr().cast(),
        Some(current()?.handle),
    )
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

// ----- the exports -----

exports! {
    /// A module's global variable. Kernels may be given its address, and copies and memsets may
    /// name it (the server adds it to the client's ranges until the module is unloaded).
    ///
    /// # Safety
    /// `dptr` and `bytes` must be NULL or writable; `name` NULL or a NUL-terminated string.
    pub unsafe fn cuModuleGetGlobal_v2(
        dptr: *mut CUdeviceptr,
        bytes: *mut usize,
        module: CUmodule,
        name: *const c_char,
    ) ["cuModuleGetGlobal" 3020] =
        global(dptr, bytes, module as usize, name, false);

    /// As `cuModuleGetGlobal_v2`, for a library, on the current context's device.
    ///
    /// # Safety
    /// As `cuModuleGetGlobal_v2`.
    pub unsafe fn cuLibraryGetGlobal(
        dptr: *mut CUdeviceptr,
        bytes: *mut usize,
        library: CUlibrary,
        name: *const c_char,
    ) ["cuLibraryGetGlobal" 12000] =
        global(dptr, bytes, library as usize, name, true);

    /// Loads a module (PTX, cubin or fatbin) into the current context.
    ///
    /// # Safety
    /// `module` must be NULL or writable; `image` a complete module image.
    pub unsafe fn cuModuleLoadData(
        module: *mut CUmodule,
        image: *const c_void,
    ) ["cuModuleLoadData" 2000] =
        load(module.cast(), image, Some(current()?.handle));

    /// Loads the module image in file `fname` (PTX, cubin or fatbin) as `cuModuleLoadData`
    /// loads one in memory: Triton's and Inductor's kernels come as files. A file that cannot be
    /// read is CUDA_ERROR_FILE_NOT_FOUND, as the driver says for it.
    ///
    /// # Safety
    /// `module` must be NULL or writable; `fname` NULL or a NUL-terminated path.
    pub unsafe fn cuModuleLoad(module: *mut CUmodule, fname: *const c_char) ["cuModuleLoad" 2000] =
        load_file(module, fname);

    /// As `cuModuleLoadData`. JIT options are not passed on: the server's driver loads the image
    /// with its own defaults, and option outputs (logs, wall time) are left as they were.
    ///
    /// # Safety
    /// As `cuModuleLoadData`.
    pub unsafe fn cuModuleLoadDataEx(
        module: *mut CUmodule,
        image: *const c_void,
        _num_options: u32,
        _options: *mut c_void,
        _option_values: *mut *mut c_void,
    ) ["cuModuleLoadDataEx" 2010] =
        load(module.cast(), image, Some(current()?.handle));

    pub fn cuModuleUnload(module: CUmodule) ["cuModuleUnload" 2000] =
        unload(module as usize, false);

    /// # Safety
    /// `f` must be NULL or writable; `name` NULL or a NUL-terminated string.
    pub unsafe fn cuModuleGetFunction(
        f: *mut CUfunction,
        module: CUmodule,
        name: *const c_char,
    ) ["cuModuleGetFunction" 2000] =
        function(f.cast(), module as usize, name, false);

    /// The mode NVIDIA's driver reports: eager where `CUDA_MODULE_LOADING=EAGER` asks for it, lazy
    /// otherwise (the driver's default since CUDA 12.2). The CUDA runtime acts on it: lazily it
    /// loads each image a library registered (cuBLAS registers 193) when a kernel of it is first
    /// used; eagerly it loads them all at start, and one built only for other GPUs then fails it
    /// (measured: `cublasCreate` fails). A module loaded through mps is loaded when asked either
    /// way, so a bad image fails at its load, not at its first launch.
    ///
    /// # Safety
    /// `mode` must be NULL or writable.
    pub unsafe fn cuModuleGetLoadingMode(mode: *mut i32) ["cuModuleGetLoadingMode" 11070] = {
        driver()?;
        let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|v| v == "EAGER");
        let reported = if eager {
            MODULE_EAGER_LOADING
        } else {
            MODULE_LAZY_LOADING
        };
        // SAFETY: the caller guarantees a non-null `mode` is writable.
        unsafe { put(mode, reported) }
    };

    /// Loads a library. JIT and library options are not passed on (see `cuModuleLoadDataEx`).
    ///
    /// # Safety
    /// `library` must be NULL or writable; `code` a complete module image.
    pub unsafe fn cuLibraryLoadData(
        library: *mut CUlibrary,
        code: *const c_void,
        _jit_options: *mut c_void,
        _jit_values: *mut *mut c_void,
        _num_jit: u32,
        _lib_options: *mut c_void,
        _lib_values: *mut *mut c_void,
        _num_lib: u32,
    ) ["cuLibraryLoadData" 12000] =
        load(library.cast(), code, None);

    pub fn cuLibraryUnload(library: CUlibrary) ["cuLibraryUnload" 12000] =
        unload(library as usize, true);

    /// # Safety
    /// `kernel` must be NULL or writable; `name` NULL or a NUL-terminated string.
    pub unsafe fn cuLibraryGetKernel(
        kernel: *mut CUkernel,
        library: CUlibrary,
        name: *const c_char,
    ) ["cuLibraryGetKernel" 12000] =
        function(kernel.cast(), library as usize, name, true);

    /// The kernel's function in the current context: the kernel's own handle, which a launch
    /// resolves on the device of its stream.
    ///
    /// # Safety
    /// `f` must be NULL or writable.
    pub unsafe fn cuKernelGetFunction(
        f: *mut CUfunction,
        kernel: CUkernel,
    ) ["cuKernelGetFunction" 12000] = {
        current()?;
        function_obj(kernel as usize)?;
        // SAFETY: the caller guarantees a non-null `f` is writable.
        unsafe { put(f, kernel.cast()) }
    };

    /// # Safety
    /// `count` must be NULL or writable.
    pub unsafe fn cuModuleGetFunctionCount(
        count: *mut u32,
        module: CUmodule,
    ) ["cuModuleGetFunctionCount" 12040] =
        function_count(count, module as usize, false);

    /// # Safety
    /// `functions` must be NULL or have room for `count` handles.
    pub unsafe fn cuModuleEnumerateFunctions(
        functions: *mut CUfunction,
        count: u32,
        module: CUmodule,
    ) ["cuModuleEnumerateFunctions" 12040] =
        enumerate(functions.cast(), count, module as usize, false);

    /// # Safety
    /// `count` must be NULL or writable.
    pub unsafe fn cuLibraryGetKernelCount(
        count: *mut u32,
        library: CUlibrary,
    ) ["cuLibraryGetKernelCount" 12040] =
        function_count(count, library as usize, true);

    /// # Safety
    /// `kernels` must be NULL or have room for `count` handles.
    pub unsafe fn cuLibraryEnumerateKernels(
        kernels: *mut CUkernel,
        count: u32,
        library: CUlibrary,
    ) ["cuLibraryEnumerateKernels" 12040] =
        enumerate(kernels.cast(), count, library as usize, true);

    /// # Safety
    /// `name` must be NULL or writable.
    pub unsafe fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) ["cuFuncGetName" 12030] =
        function_name(name, f as usize);

    /// # Safety
    /// `name` must be NULL or writable.
    pub unsafe fn cuKernelGetName(
        name: *mut *const c_char,
        kernel: CUkernel,
    ) ["cuKernelGetName" 12030] =
        function_name(name, kernel as usize);

    /// # Safety
    /// `offset` and `size` must be NULL or writable.
    pub unsafe fn cuFuncGetParamInfo(
        f: CUfunction,
        index: usize,
        offset: *mut usize,
        size: *mut usize,
    ) ["cuFuncGetParamInfo" 12040] =
        param_info(f as usize, index, offset, size);

    /// # Safety
    /// `offset` and `size` must be NULL or writable.
    pub unsafe fn cuKernelGetParamInfo(
        k: CUkernel,
        index: usize,
        offset: *mut usize,
        size: *mut usize,
    ) ["cuKernelGetParamInfo" 12040] =
        param_info(k as usize, index, offset, size);
}
