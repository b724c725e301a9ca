//! The C ABI (`libmpsclient`, declared in `include/mps.h`).
//!
//! Conventions, as in the CUDA driver API: every function returns an [`mps_status`]; results go
//! through out-pointers; `mps_last_error` gives the message of the calling thread's latest
//! failure. Every export catches panics (a panic becomes `MPS_ERROR_INTERNAL`), checks every
//! pointer it is given for NULL, and never dereferences an `mps_client *` it did not hand out:
//! client pointers are looked up in a registry, so a stale or foreign one is
//! `MPS_ERROR_INVALID_HANDLE`, not undefined behaviour.
//!
//! Past 600 lines: one exported function per entry of `include/mps.h`, each with its `# Safety`
//! section; splitting them would split the header's order.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, OnceLock, RwLock};

use mps_core::protocol::Dim3;
use mps_core::{Error, Status};

use ::mps_client::{Client, DevicePtr, Event, Function, Graph, GraphExec, Module, Stream};

/// Status of an mps call: the core's [`Status`] itself, whose values are stable across releases.
/// Its C declaration in `include/mps.h` is generated from the same list.
pub type mps_status = Status;

/// A connection to an mps server (opaque).
#[derive(Debug)]
pub struct mps_client {
    _private: u8,
}

/// A device address.
pub type mps_deviceptr = u64;
/// A stream; 0 is the client's default stream.
pub type mps_stream = u64;
/// An event.
pub type mps_event = u64;
/// A loaded module.
pub type mps_module = u64;
/// A kernel.
pub type mps_function = u64;
/// A graph captured from a stream.
pub type mps_graph = u64;
/// An executable graph, made from a captured one.
pub type mps_graph_exec = u64;

/// Launch geometry.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mps_dim3 {
    /// x extent.
    pub x: u32,
    /// y extent.
    pub y: u32,
    /// z extent.
    pub z: u32,
}

impl From<mps_dim3> for Dim3 {
    fn from(d: mps_dim3) -> Dim3 {
        Dim3 {
            x: d.x,
            y: d.y,
            z: d.z,
        }
    }
}

/// Which backend a server runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum mps_backend {
    /// The CPU simulator.
    MPS_BACKEND_SIM = 0,
    /// A CUDA GPU.
    MPS_BACKEND_CUDA = 1,
}

/// The device behind the server.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mps_device_info {
    /// NUL-terminated device name.
    pub name: [c_char; 64],
    /// Device memory in bytes.
    pub total_mem: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability, major.
    pub cc_major: u32,
    /// Compute capability, minor.
    pub cc_minor: u32,
    /// The server's backend.
    pub backend: mps_backend,
}

type Registry = RwLock<HashMap<usize, Arc<Client>>>;

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(Default::default)
}

thread_local! {
    /// The calling thread's latest failure: (client key, message); key 0 for mps_connect.
    static LAST_ERROR: RefCell<(usize, String)> = const { RefCell::new((0, String::new())) };
}

fn set_last_error(key: usize, message: &str) {
    LAST_ERROR.with(|l| {
        let mut l = l.borrow_mut();
        l.0 = key;
        l.1.clear();
        l.1.push_str(message);
    });
}

fn fail(key: usize, e: &Error) -> mps_status {
    set_last_error(key, &e.message);
    e.status
}

/// Runs `f` with a panic boundary, turning its result into a status.
fn guard(key: usize, f: impl FnOnce() -> Result<(), Error>) -> mps_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::Success,
        Ok(Err(e)) => fail(key, &e),
        Err(_) => fail(
            key,
            &Error::internal("a panic inside libmpsclient was caught at the API boundary"),
        ),
    }
}

/// Runs `f` on the client behind `c`, if `c` is a live client this library handed out.
fn with_client(c: *const mps_client, f: impl FnOnce(&Client) -> Result<(), Error>) -> mps_status {
    let key = c as usize;
    guard(key, || {
        if c.is_null() {
            return Err(Error::invalid_value("client is NULL"));
        }
        let client = registry()
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()
            .ok_or_else(|| {
                Error::invalid_handle(format!(
                    "{c:p} is not a connected mps_client (already disconnected, or not from mps_connect)"
                ))
            })?;
        f(&client)
    })
}

fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Error> {
    // SAFETY: non-null out-pointers are the caller's promise of a writable T (see each
    // function's Safety section).
    unsafe { p.as_mut() }.ok_or_else(|| Error::invalid_value(format!("{what} is NULL")))
}

/// The pipe directory a caller passed: NULL for the default.
///
/// # Safety
/// `pipe_dir` is NULL or a NUL-terminated string.
unsafe fn pipe_dir_arg(pipe_dir: *const c_char) -> Result<Option<String>, Error> {
    if pipe_dir.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(pipe_dir) };
    Ok(Some(
        s.to_str()
            .map_err(|_| Error::invalid_value("pipe_dir is not UTF-8"))?
            .to_owned(),
    ))
}

/// Connects to device 0 of those this process sees through the daemon or server in `pipe_dir`
/// (NULL: `$MPS_PIPE_DIRECTORY`, else `/tmp/mps`) and stores the new client in `*out`; see
/// `mps_connect_device`.
///
/// # Safety
/// `pipe_dir` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_connect(
    pipe_dir: *const c_char,
    out_client: *mut *mut mps_client,
) -> mps_status {
    // SAFETY: the caller's promises are this function's.
    unsafe { mps_connect_device(pipe_dir, 0, out_client) }
}

/// Stores in `*out_count` how many devices this process sees through the daemon or server in
/// `pipe_dir` (NULL: the default): those it serves, filtered and ordered by
/// `CUDA_VISIBLE_DEVICES` as CUDA does.
///
/// # Safety
/// `pipe_dir` is NULL or a NUL-terminated string; `out_count` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_device_count(
    pipe_dir: *const c_char,
    out_count: *mut u32,
) -> mps_status {
    guard(0, || {
        let slot = out(out_count, "out_count")?;
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let dir = unsafe { pipe_dir_arg(pipe_dir) }?;
        *slot = Client::device_count(dir.as_deref().map(Path::new))?;
        Ok(())
    })
}

/// Connects to device `device` (0 to the count of `mps_device_count` - 1) of those this process
/// sees through the daemon or server in `pipe_dir` (NULL: the default) and stores the new client
/// in `*out`. A program that uses two devices holds a client of each.
///
/// # Safety
/// `pipe_dir` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_connect_device(
    pipe_dir: *const c_char,
    device: u32,
    out_client: *mut *mut mps_client,
) -> mps_status {
    guard(0, || {
        let slot = out(out_client, "out")?;
        // SAFETY: the caller passes NULL or a NUL-terminated string.
        let dir = unsafe { pipe_dir_arg(pipe_dir) }?;
        let client = Client::connect_device(dir.as_deref().map(Path::new), device)?;
        // The key is the address of a heap token the caller never dereferences.
        let token = Box::into_raw(Box::new(mps_client { _private: 0 }));
        registry()
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token as usize, Arc::new(client));
        *slot = token;
        Ok(())
    })
}

/// Disconnects: the server releases everything the client held. Calls still running on other
/// threads finish first with the connection they had.
///
/// # Safety
/// `client` is NULL or a pointer from `mps_connect`; after this call it must not be used.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_disconnect(client: *mut mps_client) -> mps_status {
    let key = client as usize;
    guard(key, || {
        if client.is_null() {
            return Err(Error::invalid_value("client is NULL"));
        }
        let removed = registry()
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
        match removed {
            Some(_) => {
                // SAFETY: the token was created by Box::into_raw in mps_connect and is freed
                // only here, once, after leaving the registry.
                drop(unsafe { Box::from_raw(client) });
                Ok(())
            }
            None => Err(Error::invalid_handle(format!(
                "{client:p} is not a connected mps_client"
            ))),
        }
    })
}

/// The name of a status, e.g. "MPS_ERROR_INVALID_HANDLE"; never NULL. Takes any integer, so
/// that a value from a newer library is named "MPS_ERROR_UNKNOWN_STATUS" rather than trusted.
#[unsafe(no_mangle)]
pub extern "C" fn mps_status_string(status: u32) -> *const c_char {
    Status::from_u32(status)
        .map_or(c"MPS_ERROR_UNKNOWN_STATUS", Status::c_name)
        .as_ptr()
}

/// Copies the message of the calling thread's latest failure on `client` (or, with a NULL
/// client, its latest failure of any call) into `buf` (at most `len` bytes, NUL-terminated) and
/// returns the message's full length, without the NUL; 0 if there is none.
///
/// # Safety
/// `buf` is NULL or writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_last_error(
    client: *const mps_client,
    buf: *mut c_char,
    len: usize,
) -> usize {
    catch_unwind(|| {
        LAST_ERROR.with(|l| {
            let l = l.borrow();
            if !client.is_null() && l.0 != client as usize {
                if !buf.is_null() && len > 0 {
                    // SAFETY: buf is writable for len >= 1 bytes.
                    unsafe { *buf = 0 };
                }
                return 0;
            }
            let msg = l.1.as_bytes();
            if !buf.is_null() && len > 0 {
                let n = msg.len().min(len - 1);
                // SAFETY: buf is writable for len bytes and n + 1 <= len.
                unsafe {
                    std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, n);
                    *buf.add(n) = 0;
                }
            }
            msg.len()
        })
    })
    .unwrap_or(0)
}

/// Describes the device behind the server.
///
/// # Safety
/// `info` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_device_get_info(
    client: *mut mps_client,
    info: *mut mps_device_info,
) -> mps_status {
    with_client(client, |c| {
        let info = out(info, "info")?;
        let d = c.device_info();
        let mut name = [0 as c_char; 64];
        for (dst, src) in name.iter_mut().zip(d.name.bytes().take(63)) {
            *dst = src as c_char;
        }
        *info = mps_device_info {
            name,
            total_mem: d.total_mem,
            sm_count: d.sm_count,
            cc_major: d.cc.0,
            cc_minor: d.cc.1,
            backend: match d.backend {
                mps_core::protocol::BackendKind::Sim => mps_backend::MPS_BACKEND_SIM,
                mps_core::protocol::BackendKind::Cuda => mps_backend::MPS_BACKEND_CUDA,
            },
        };
        Ok(())
    })
}

/// Allocates `size` bytes of device memory into `*dptr`.
///
/// # Safety
/// `dptr` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_mem_alloc(
    client: *mut mps_client,
    size: usize,
    dptr: *mut mps_deviceptr,
) -> mps_status {
    with_client(client, |c| {
        let dptr = out(dptr, "dptr")?;
        *dptr = c.mem_alloc(size as u64)?.0;
        Ok(())
    })
}

/// Frees device memory from `mps_mem_alloc` (after the client's pending work).
#[unsafe(no_mangle)]
pub extern "C" fn mps_mem_free(client: *mut mps_client, dptr: mps_deviceptr) -> mps_status {
    with_client(client, |c| c.mem_free(DevicePtr(dptr)))
}

/// Free and total device memory, in bytes.
///
/// # Safety
/// `free` and `total` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_mem_get_info(
    client: *mut mps_client,
    free: *mut usize,
    total: *mut usize,
) -> mps_status {
    with_client(client, |c| {
        let (f, t) = (out(free, "free")?, out(total, "total")?);
        let (fv, tv) = c.mem_get_info()?;
        *f = fv as usize;
        *t = tv as usize;
        Ok(())
    })
}

/// The allocation of this client that holds `dptr`: its base address and size in bytes (as
/// `cuMemGetAddressRange`). `MPS_ERROR_NOT_FOUND` where `dptr` lies in no allocation of the
/// client.
///
/// # Safety
/// `base` and `size` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_mem_get_address_range(
    client: *mut mps_client,
    dptr: mps_deviceptr,
    base: *mut mps_deviceptr,
    size: *mut usize,
) -> mps_status {
    with_client(client, |c| {
        let (b, s) = (out(base, "base")?, out(size, "size")?);
        let (bv, sv) = c.mem_get_address_range(DevicePtr(dptr))?;
        *b = bv.0;
        *s = sv as usize;
        Ok(())
    })
}

/// Where this client's kernels run: `*sms` SMs of the device's `*device_sms` (its share, set by
/// the operator and lowered by `MPS_ACTIVE_THREAD_PERCENTAGE`, or its reservation,
/// `MPS_SM_RESERVE`, rounded up to the device's partition size). It can change while the client
/// runs.
///
/// # Safety
/// `sms` and `device_sms` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_sm_get_info(
    client: *mut mps_client,
    sms: *mut u32,
    device_sms: *mut u32,
) -> mps_status {
    with_client(client, |c| {
        let (s, d) = (out(sms, "sms")?, out(device_sms, "device_sms")?);
        let info = c.sm_info()?;
        *s = info.sms;
        *d = info.device_sms;
        Ok(())
    })
}

/// Allocates a host buffer shared with the server into `*ptr`: copies from and to it are fully
/// asynchronous.
///
/// # Safety
/// `ptr` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_host_alloc(
    client: *mut mps_client,
    size: usize,
    ptr: *mut *mut c_void,
) -> mps_status {
    with_client(client, |c| {
        let ptr = out(ptr, "ptr")?;
        *ptr = c.host_alloc(size)? as *mut c_void;
        Ok(())
    })
}

/// Frees a host buffer from `mps_host_alloc` (after the client's pending work).
///
/// # Safety
/// After this call the buffer's memory must not be used.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_host_free(client: *mut mps_client, ptr: *mut c_void) -> mps_status {
    with_client(client, |c| {
        if ptr.is_null() {
            return Err(Error::invalid_value("ptr is NULL"));
        }
        c.host_free(ptr as *mut u8)
    })
}

fn nonnull<T>(p: *const T, what: &str) -> Result<(), Error> {
    if p.is_null() {
        Err(Error::invalid_value(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

/// Copies `bytes` from host memory to the device, in `stream`. From `mps_host_alloc` memory the
/// copy is asynchronous; from other memory it returns once `src` has been read.
///
/// # Safety
/// `src` is NULL or readable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_memcpy_htod(
    client: *mut mps_client,
    dst: mps_deviceptr,
    src: *const c_void,
    bytes: usize,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| {
        nonnull(src, "src")?;
        // SAFETY: the caller guarantees src is readable for `bytes`.
        unsafe { c.memcpy_htod_raw(DevicePtr(dst), src as *const u8, bytes, Stream(stream)) }
    })
}

/// Copies `bytes` from the device to host memory, in `stream`. Into `mps_host_alloc` memory the
/// copy is asynchronous; into other memory it returns once the data has arrived.
///
/// # Safety
/// `dst` is NULL or writable for `bytes` bytes (until the copy completes, for host buffers).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_memcpy_dtoh(
    client: *mut mps_client,
    dst: *mut c_void,
    src: mps_deviceptr,
    bytes: usize,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| {
        nonnull(dst, "dst")?;
        // SAFETY: the caller guarantees dst is writable for `bytes`.
        unsafe { c.memcpy_dtoh_raw(dst as *mut u8, DevicePtr(src), bytes, Stream(stream)) }
    })
}

/// Copies `bytes` between device ranges, asynchronously in `stream`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_memcpy_dtod(
    client: *mut mps_client,
    dst: mps_deviceptr,
    src: mps_deviceptr,
    bytes: usize,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| {
        c.memcpy_dtod(DevicePtr(dst), DevicePtr(src), bytes as u64, Stream(stream))
    })
}

/// Sets `count` bytes at `dst` to `value`, asynchronously in `stream`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_memset_d8(
    client: *mut mps_client,
    dst: mps_deviceptr,
    value: u8,
    count: usize,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| {
        c.memset_d8(DevicePtr(dst), value, count as u64, Stream(stream))
    })
}

/// Sets `count` 32-bit words at `dst` to `value`, asynchronously in `stream`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_memset_d32(
    client: *mut mps_client,
    dst: mps_deviceptr,
    value: u32,
    count: usize,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| {
        c.memset_d32(DevicePtr(dst), value, count as u64, Stream(stream))
    })
}

/// Loads a module image (PTX, cubin or fatbin; the simulator takes PTX) of `len` bytes.
///
/// # Safety
/// `image` is NULL or readable for `len` bytes; `module` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_module_load(
    client: *mut mps_client,
    image: *const c_void,
    len: usize,
    module: *mut mps_module,
) -> mps_status {
    with_client(client, |c| {
        nonnull(image, "image")?;
        let module = out(module, "module")?;
        if len == 0 {
            return Err(Error::invalid_value("module image length is 0"));
        }
        // SAFETY: the caller guarantees image is readable for len bytes.
        let bytes = unsafe { std::slice::from_raw_parts(image as *const u8, len) };
        *module = c.module_load(bytes)?.0;
        Ok(())
    })
}

/// Unloads a module; its functions become invalid.
#[unsafe(no_mangle)]
pub extern "C" fn mps_module_unload(client: *mut mps_client, module: mps_module) -> mps_status {
    with_client(client, |c| c.module_unload(Module(module)))
}

/// Looks up the kernel `name` in `module`.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string; `function` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_module_get_function(
    client: *mut mps_client,
    module: mps_module,
    name: *const c_char,
    function: *mut mps_function,
) -> mps_status {
    with_client(client, |c| {
        nonnull(name, "name")?;
        let function = out(function, "function")?;
        // SAFETY: the caller passes a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| Error::invalid_value("kernel name is not UTF-8"))?;
        *function = c.module_get_function(Module(module), name)?.0;
        Ok(())
    })
}

/// Offset and size of parameter `index` of `function` in its packed parameter buffer.
///
/// # Safety
/// `offset` and `size` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_function_get_param_info(
    client: *mut mps_client,
    function: mps_function,
    index: u32,
    offset: *mut usize,
    size: *mut usize,
) -> mps_status {
    with_client(client, |c| {
        let (o, s) = (out(offset, "offset")?, out(size, "size")?);
        let p = c.function_param_info(Function(function), index)?;
        *o = p.offset as usize;
        *s = p.size as usize;
        Ok(())
    })
}

/// Launches `function` asynchronously in `stream`; `params[i]` points at the value of
/// parameter `i`, as for cuLaunchKernel. A geometry past the device's limits fails here with
/// `MPS_ERROR_INVALID_VALUE`, as with CUDA; any failure of the queued work is reported by the
/// next call that waits.
///
/// # Safety
/// `params` is NULL (for a kernel without parameters) or holds one readable pointer per
/// parameter, each to a value of that parameter's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_launch_kernel(
    client: *mut mps_client,
    function: mps_function,
    grid: mps_dim3,
    block: mps_dim3,
    shared_mem_bytes: u32,
    stream: mps_stream,
    params: *mut *mut c_void,
) -> mps_status {
    with_client(client, |c| {
        // SAFETY: the caller guarantees the parameter pointers (checked for NULL inside).
        unsafe {
            c.launch_raw(
                Function(function),
                grid.into(),
                block.into(),
                shared_mem_bytes,
                Stream(stream),
                params as *const *const u8,
            )
        }
    })
}

/// Creates a stream into `*stream` (lower priority numbers are more urgent).
///
/// # Safety
/// `stream` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_stream_create(
    client: *mut mps_client,
    priority: i32,
    stream: *mut mps_stream,
) -> mps_status {
    with_client(client, |c| {
        let stream = out(stream, "stream")?;
        *stream = c.stream_create(priority)?.0;
        Ok(())
    })
}

/// Destroys a stream; work already in it still completes.
#[unsafe(no_mangle)]
pub extern "C" fn mps_stream_destroy(client: *mut mps_client, stream: mps_stream) -> mps_status {
    with_client(client, |c| c.stream_destroy(Stream(stream)))
}

/// Waits for all work in `stream`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_stream_synchronize(
    client: *mut mps_client,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| c.stream_synchronize(Stream(stream)))
}

fn ready(done: Result<bool, Error>) -> Result<(), Error> {
    match done? {
        true => Ok(()),
        false => Err(Error::new(Status::NotReady, "work is still pending")),
    }
}

/// `MPS_SUCCESS` if all work in `stream` is done, `MPS_ERROR_NOT_READY` if not (a stream whose
/// work finished a moment ago may be reported busy once).
#[unsafe(no_mangle)]
pub extern "C" fn mps_stream_query(client: *mut mps_client, stream: mps_stream) -> mps_status {
    with_client(client, |c| ready(c.stream_query(Stream(stream))))
}

/// Makes later work in `stream` wait for the latest record of `event`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_stream_wait_event(
    client: *mut mps_client,
    stream: mps_stream,
    event: mps_event,
) -> mps_status {
    with_client(client, |c| {
        c.stream_wait_event(Stream(stream), Event(event))
    })
}

/// Creates an event into `*event`.
///
/// # Safety
/// `event` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_event_create(
    client: *mut mps_client,
    event: *mut mps_event,
) -> mps_status {
    with_client(client, |c| {
        let event = out(event, "event")?;
        *event = c.event_create()?.0;
        Ok(())
    })
}

/// Destroys an event.
#[unsafe(no_mangle)]
pub extern "C" fn mps_event_destroy(client: *mut mps_client, event: mps_event) -> mps_status {
    with_client(client, |c| c.event_destroy(Event(event)))
}

/// Records `event` in `stream`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_event_record(
    client: *mut mps_client,
    event: mps_event,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| c.event_record(Event(event), Stream(stream)))
}

/// Waits for the latest record of `event`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_event_synchronize(client: *mut mps_client, event: mps_event) -> mps_status {
    with_client(client, |c| c.event_synchronize(Event(event)))
}

/// `MPS_SUCCESS` once the latest record of `event` completed, `MPS_ERROR_NOT_READY` before.
#[unsafe(no_mangle)]
pub extern "C" fn mps_event_query(client: *mut mps_client, event: mps_event) -> mps_status {
    with_client(client, |c| ready(c.event_query(Event(event))))
}

/// Milliseconds between the latest records of `start` and `end`, into `*ms`.
///
/// # Safety
/// `ms` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_event_elapsed_ms(
    client: *mut mps_client,
    ms: *mut f32,
    start: mps_event,
    end: mps_event,
) -> mps_status {
    with_client(client, |c| {
        let ms = out(ms, "ms")?;
        *ms = c.event_elapsed_ms(Event(start), Event(end))?;
        Ok(())
    })
}

/// Waits for all of this client's streams.
#[unsafe(no_mangle)]
pub extern "C" fn mps_synchronize(client: *mut mps_client) -> mps_status {
    with_client(client, |c| c.synchronize())
}

/// From now on, the work submitted to `stream` is recorded into a graph instead of run. While it
/// captures, `stream` cannot be synchronised or queried (nor can the client as a whole), device
/// memory and host buffers cannot be freed, and only copies, memsets and kernel launches may go
/// into it; copies must go through host buffers from `mps_host_alloc`.
#[unsafe(no_mangle)]
pub extern "C" fn mps_stream_begin_capture(
    client: *mut mps_client,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| c.stream_begin_capture(Stream(stream)))
}

/// Ends the capture of `stream`, putting the graph of what it recorded in `*graph`. Fails (and
/// makes no graph) if a command failed during the capture; the stream runs its work again
/// either way.
///
/// # Safety
/// `graph` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_stream_end_capture(
    client: *mut mps_client,
    stream: mps_stream,
    graph: *mut mps_graph,
) -> mps_status {
    with_client(client, |c| {
        let graph = out(graph, "graph")?;
        *graph = c.stream_end_capture(Stream(stream))?.0;
        Ok(())
    })
}

/// Makes an executable graph of `graph` into `*exec`; `graph` may then be destroyed.
///
/// # Safety
/// `exec` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mps_graph_instantiate(
    client: *mut mps_client,
    graph: mps_graph,
    exec: *mut mps_graph_exec,
) -> mps_status {
    with_client(client, |c| {
        let exec = out(exec, "exec")?;
        *exec = c.graph_instantiate(Graph(graph))?.0;
        Ok(())
    })
}

/// Runs `exec` in `stream`, asynchronously, with the stream's priority and on the client's SMs.
#[unsafe(no_mangle)]
pub extern "C" fn mps_graph_launch(
    client: *mut mps_client,
    exec: mps_graph_exec,
    stream: mps_stream,
) -> mps_status {
    with_client(client, |c| c.graph_launch(GraphExec(exec), Stream(stream)))
}

/// Destroys a captured graph; executable graphs made from it still run.
#[unsafe(no_mangle)]
pub extern "C" fn mps_graph_destroy(client: *mut mps_client, graph: mps_graph) -> mps_status {
    with_client(client, |c| c.graph_destroy(Graph(graph)))
}

/// Destroys an executable graph; launches already submitted still run.
#[unsafe(no_mangle)]
pub extern "C" fn mps_graph_exec_destroy(
    client: *mut mps_client,
    exec: mps_graph_exec,
) -> mps_status {
    with_client(client, |c| c.graph_exec_destroy(GraphExec(exec)))
}
