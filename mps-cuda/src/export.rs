//! `cuGetExportTable`: the driver's undocumented tables, as the CUDA runtime needs them (cudart,
//! static and shared, and the copies of it inside cuBLAS and cuBLASLt).
//!
//! A table is an array of pointer-sized words: the table's size in bytes, then functions (the
//! context-local-storage table has no size word). Each is served from a fixed address in this
//! library, the same for every caller, because the integrity check hashes the addresses handed
//! out. Entries the runtime is known to call do what NVIDIA's driver was measured to do; every
//! other slot NVIDIA fills holds a stub that fails with `CUDA_ERROR_NOT_SUPPORTED` and names
//! itself once. docs/TRANSPARENT.md says, table by table, what each entry is and how sure that is.
//!
//! Past 600 lines: one table per section, each with the facts it rests on; the export and the
//! tests are at the end.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Mutex, Once};

use hmac::{KeyInit, Mac, SimpleHmac};
use md2::Md2;

use crate::abi::{CUcontext, CUdevice, CUresult, CUuuid, DRIVER_VERSION};
use crate::context::{current_handle, handle_of, primary_of, to_cucontext};
use crate::device::{pci_location, uuid_of};
use crate::driver::{self, Stage, connection, driver};
use crate::ffi::{Res, check, entry, exports, lock, put};
use crate::log;
use crate::objects::Context;

type AnyFn = unsafe extern "C" fn();

/// One word of a table: its size, a function, or NULL (`None`).
#[derive(Clone, Copy)]
#[repr(C)]
union Word {
    size: usize,
    f: Option<AnyFn>,
}

#[repr(C)]
struct Table<const N: usize>([Word; N]);

const fn size(words: usize) -> Word {
    Word { size: words * 8 }
}

const NULL: Word = Word { f: None };

/// A function as a table word; the caller knows its real signature, given here.
macro_rules! word {
    ($f:path as $t:ty) => {
        Word {
            // SAFETY: a function pointer stored untyped; callers call it with its own ABI.
            f: Some(unsafe { std::mem::transmute::<$t, AnyFn>($f) }),
        }
    };
}

macro_rules! stub {
    ($table:literal, $slot:literal) => {
        word!(stub::<$table, $slot> as unsafe extern "C" fn() -> CUresult)
    };
}

/// The tables' UUIDs (`CUuuid.bytes` in order), and the index `stub` names them by.
const CUDART_INTERFACE: [u8; 16] = uuid_bytes(0x6bd5fb6c5bf4e74a8987d93912fd9df9);
const TOOLS_CALLBACK_HOOKS: [u8; 16] = uuid_bytes(0xa094798c2e742e7493f20800200c0a66);
const TOOLS_TLS: [u8; 16] = uuid_bytes(0x42d85a8123f6cb478298f6e78a3aecdc);
const CONTEXT_LOCAL_STORAGE: [u8; 16] = uuid_bytes(0xc693336e1121df11a8c368f355d89593);
const CONTEXT_CHECKS: [u8; 16] = uuid_bytes(0x263e88607cd2614392f6bbd5006dfa7e);
const INTEGRITY_CHECK: [u8; 16] = uuid_bytes(0xd4082055bde6704b8d34ba123c66e1f2);
const TOOLS_CONTEXT: [u8; 16] = uuid_bytes(0x21318c60971432488ca641ff7324c8f2);
/// cuBLASLt's: it offers the driver functions of its own through it.
const LIBRARY_CALLBACKS: [u8; 16] = uuid_bytes(0x1734dc26800d47458726c0f1e7dd8bca);
/// Asked for first by cudart and never called; refusing it changes nothing (measured).
const UNUSED_PROBE: [u8; 16] = uuid_bytes(0xf8cff95121468b4eb9e2fb469e7c0dd9);
/// NVRTC's (libnvrtc.so.13), 7 words: the driver's cache of compiled programs, as its calls
/// read natively (CuPy's kernels, traced with their arguments on the H200): [1] opens an entry
/// for a source (or PTX) and its options, writing a handle; [3] looks the entry up,
/// `CUDA_ERROR_NOT_FOUND` on a miss; [4] stores the PTX (or cubin) NVRTC made; [2] closes it.
/// Refused: NVRTC then compiles every time, as on a miss, and CuPy's kernels gave the same
/// results natively with the table refused. Said only with `MPS_CUDA_LOG`.
const COMPILE_CACHE: [u8; 16] = uuid_bytes(0xda9151d33ae6cc41a5c04f26d533e328);
/// `CU_ETID_ToolsModule` (the name in NVIDIA's cuxtra library), 99 words, asked by cuFFT
/// (libcufft.so.12), which calls only [7], once per plan: see [`module_functions`].
const TOOLS_MODULE: [u8; 16] = uuid_bytes(0x6e163fbeb958444d835ce182aff1991e);

const NAMES: [&str; 9] = [
    "6bd5fb6c (cudart interface)",
    "a094798c (tools callback hooks)",
    "42d85a81 (tools thread-local storage)",
    "c693336e (context-local storage)",
    "263e8860 (context checks)",
    "d4082055 (integrity check)",
    "21318c60 (tools context)",
    "1734dc26 (library callbacks)",
    "6e163fbe (tools module)",
];

const fn uuid_bytes(v: u128) -> [u8; 16] {
    v.to_be_bytes()
}

/// An entry nothing is known to call.
unsafe extern "C" fn stub<const TABLE: usize, const SLOT: usize>() -> CUresult {
    log::once(&format!("export {TABLE}[{SLOT}]"), || {
        format!(
            "entry {SLOT} of the driver's export table {} is not supported through mps; \
             returning CUDA_ERROR_NOT_SUPPORTED",
            NAMES[TABLE]
        )
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

// ----- 6bd5fb6c: the runtime's interface -----

static CUDART: Table<13> = Table([
    size(13),
    stub!(0, 1),
    word!(primary_context as unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult),
    stub!(0, 3),
    stub!(0, 4),
    stub!(0, 5),
    stub!(0, 6),
    word!(ignore_word as unsafe extern "C" fn(usize)),
    stub!(0, 8),
    stub!(0, 9),
    NULL,
    stub!(0, 11),
    word!(load_compilers as unsafe extern "C" fn() -> CUresult),
]);

/// Slot 2: the device's primary context, neither retained nor made active (NVIDIA's driver leaves
/// its state as it was; the runtime retains it itself).
unsafe extern "C" fn primary_context(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    entry("cudart interface: primary context", || {
        let handle = primary_of(dev)?.handle;
        // SAFETY: the caller passes a writable out-pointer (NULL is refused by `put`).
        unsafe { put(pctx, to_cucontext(handle)) }
    })
}

/// Slot 7: takes one word and does nothing that a client of mps needs.
unsafe extern "C" fn ignore_word(_: usize) {}

/// Slot 12: loads the PTX compiler libraries in NVIDIA's driver; the server's driver has its own.
unsafe extern "C" fn load_compilers() -> CUresult {
    CUresult::CUDA_SUCCESS
}

// ----- a094798c: tools' callback hooks -----

/// Zeroed memory handed to the runtime for tools' flags: all zero, no tool attached.
struct ToolsBuffer<const N: usize>(UnsafeCell<[u64; N]>);

// SAFETY: the library never touches the buffer after handing it out; the runtime owns it.
unsafe impl<const N: usize> Sync for ToolsBuffer<N> {}

/// NVIDIA's driver reports 1024 and 14 (units not known); each buffer holds that many u64s, so
/// it is large enough whatever the unit up to 8 bytes.
static HOOKS_BUFFER_2: ToolsBuffer<1024> = ToolsBuffer(UnsafeCell::new([0; 1024]));
static HOOKS_BUFFER_6: ToolsBuffer<14> = ToolsBuffer(UnsafeCell::new([0; 14]));

static HOOKS: Table<7> = Table([
    size(7),
    stub!(1, 1),
    word!(hooks_buffer_2 as unsafe extern "C" fn(*mut *mut c_void, *mut usize)),
    stub!(1, 3),
    stub!(1, 4),
    stub!(1, 5),
    word!(hooks_buffer_6 as unsafe extern "C" fn(*mut *mut c_void, *mut usize)),
]);

/// # Safety
/// `buf` and `len` NULL or writable.
unsafe fn hand_out<const N: usize>(
    b: &'static ToolsBuffer<N>,
    buf: *mut *mut c_void,
    len: *mut usize,
) {
    // SAFETY: the caller's out-pointers, written only where non-null.
    unsafe {
        if !buf.is_null() {
            buf.write(b.0.get().cast());
        }
        if !len.is_null() {
            len.write(N);
        }
    }
}

unsafe extern "C" fn hooks_buffer_2(buf: *mut *mut c_void, len: *mut usize) {
    // SAFETY: the runtime passes writable out-pointers.
    unsafe { hand_out(&HOOKS_BUFFER_2, buf, len) }
}

unsafe extern "C" fn hooks_buffer_6(buf: *mut *mut c_void, len: *mut usize) {
    // SAFETY: as above.
    unsafe { hand_out(&HOOKS_BUFFER_6, buf, len) }
}

// ----- 42d85a81: tools' thread-local storage -----

static TLS: Table<3> = Table([
    size(3),
    stub!(2, 1),
    word!(thread_context as unsafe extern "C" fn(*mut CUcontext) -> CUresult),
]);

/// Slot 2: the calling thread's current context, NULL if none (cuBLASLt, once per matmul).
unsafe extern "C" fn thread_context(out: *mut CUcontext) -> CUresult {
    entry("tools TLS: thread context", || {
        // SAFETY: the caller passes a writable out-pointer (NULL is refused by `put`).
        unsafe { put(out, to_cucontext(current_handle().unwrap_or(0))) }
    })
}

// ----- c693336e: context-local storage -----

/// Called with (context, key, value) when the context goes.
type Destructor = unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void);

/// What the runtime stores per context. The runtime reads it on nearly every call, so it lives
/// here, never in the server.
type Storage = HashMap<StorageKey, Stored>;
/// (context handle, key).
type StorageKey = (usize, usize);
/// (value, destructor).
type Stored = (usize, Option<Destructor>);

static STORAGE: Mutex<Option<Storage>> = Mutex::new(None);

static CLS: Table<4> = Table([
    word!(
        cls_put
            as unsafe extern "C" fn(
                CUcontext,
                *mut c_void,
                *mut c_void,
                Option<Destructor>,
            ) -> CUresult
    ),
    word!(cls_delete as unsafe extern "C" fn(CUcontext, *mut c_void) -> CUresult),
    word!(cls_get as unsafe extern "C" fn(*mut *mut c_void, CUcontext, *mut c_void) -> CUresult),
    NULL,
]);

/// `ctx`, or the current context where it is NULL; any context this library made, active or
/// not (the runtime may store for the primary context before retaining it).
fn storage_context(ctx: CUcontext) -> Result<usize, CUresult> {
    let handle = if ctx.is_null() {
        current_handle().ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?
    } else {
        handle_of(ctx)
    };
    driver()?
        .contexts
        .get(handle)
        .map(|_| handle)
        .ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)
}

unsafe extern "C" fn cls_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<Destructor>,
) -> CUresult {
    entry("context-local storage: put", || {
        let c = storage_context(ctx)?;
        static HOOKED: Once = Once::new();
        HOOKED.call_once(|| driver::on_release(Stage::Early, drop_context_storage));
        lock(&STORAGE)
            .get_or_insert_with(HashMap::new)
            .insert((c, key as usize), (value as usize, dtor));
        Ok(())
    })
}

/// A missing key is `CUDA_ERROR_INVALID_HANDLE`, as a lookup's is.
unsafe extern "C" fn cls_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    entry("context-local storage: delete", || {
        let c = storage_context(ctx)?;
        lock(&STORAGE)
            .get_or_insert_with(HashMap::new)
            .remove(&(c, key as usize))
            .map(drop)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
    })
}

/// A missing key is `CUDA_ERROR_INVALID_HANDLE`, `*value` left as it was (as NVIDIA's driver
/// does, measured).
unsafe extern "C" fn cls_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    entry("context-local storage: get", || {
        let c = storage_context(ctx)?;
        let v = lock(&STORAGE)
            .get_or_insert_with(HashMap::new)
            .get(&(c, key as usize))
            .map(|(v, _)| *v)
            .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: the caller passes a writable out-pointer (NULL is refused by `put`).
        unsafe { put(value, std::ptr::without_provenance_mut(v)) }
    })
}

/// Context `ctx` is released: what was stored for it is forgotten, each value's destructor
/// called (outside the lock: a destructor may call back into the library).
fn drop_context_storage(ctx: &Context) -> Res<()> {
    let handle = ctx.handle;
    let gone: Vec<(StorageKey, Stored)> = {
        let mut s = lock(&STORAGE);
        let Some(map) = s.as_mut() else {
            return Ok(());
        };
        let keys: Vec<_> = map.keys().filter(|(c, _)| *c == handle).copied().collect();
        keys.into_iter()
            .filter_map(|k| map.remove(&k).map(|v| (k, v)))
            .collect()
    };
    for ((c, key), (value, dtor)) in gone {
        if let Some(d) = dtor {
            // SAFETY: the runtime registered this destructor for exactly these arguments.
            unsafe {
                d(
                    to_cucontext(c),
                    std::ptr::without_provenance_mut(key),
                    std::ptr::without_provenance_mut(value),
                )
            };
        }
    }
    Ok(())
}

// ----- 263e8860: context checks -----

static CHECKS: Table<15> = Table([
    size(15),
    stub!(4, 1),
    word!(context_wrapped as unsafe extern "C" fn(CUcontext, *mut u32, *mut CUcontext) -> CUresult),
    word!(no_flags as unsafe extern "C" fn() -> u32),
    stub!(4, 4),
    stub!(4, 5),
    stub!(4, 6),
    stub!(4, 7),
    stub!(4, 8),
    stub!(4, 9),
    stub!(4, 10),
    stub!(4, 11),
    stub!(4, 12),
    stub!(4, 13),
    stub!(4, 14),
]);

/// Slot 2: whether a context wraps another (in NVIDIA's driver only some interop contexts do):
/// never here, so `*wrapped = 0` and `*inner` is left alone, as the driver does for ordinary
/// contexts (measured).
unsafe extern "C" fn context_wrapped(
    _ctx: CUcontext,
    wrapped: *mut u32,
    _inner: *mut CUcontext,
) -> CUresult {
    entry("context checks: wrapped", || {
        // SAFETY: the caller passes a writable out-pointer (NULL is refused by `put`).
        unsafe { put(wrapped, 0) }
    })
}

/// Slot 3: 0, what NVIDIA's driver returns (measured); called once per runtime at start.
unsafe extern "C" fn no_flags() -> u32 {
    0
}

// ----- d4082055: the integrity check -----

static INTEGRITY: Table<3> = Table([
    size(3),
    word!(integrity_check as unsafe extern "C" fn(u32, u64, *mut [u8; 16]) -> CUresult),
    stub!(5, 2),
]);

/// Slot 1: the digest the runtime compares with its own computation of it (see `digest`).
unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    result: *mut [u8; 16],
) -> CUresult {
    entry("integrity check", || {
        check(!result.is_null())?;
        let d = digest(version, unix_seconds, &Identity::of_this_process());
        // SAFETY: checked non-null; the runtime passes 16 writable bytes.
        unsafe { result.write_unaligned(d) };
        Ok(())
    })
}

/// What the integrity digest covers besides its arguments.
struct Identity {
    pid: u32,
    tid: u32,
    cudart_table: u64,
    integrity_table: u64,
    integrity_entry: u64,
    /// Each device's UUID and PCI domain, bus and device numbers, as the public API reports them.
    devices: Vec<([u8; 16], [i32; 3])>,
}

unsafe extern "C" {
    /// `pthread_t` is an unsigned long on Linux.
    fn pthread_self() -> usize;
}

impl Identity {
    fn of_this_process() -> Identity {
        // SAFETY: reading a word of the static table; slot 1 holds a function.
        let entry = unsafe { INTEGRITY.0[1].f }.map_or(0, |f| f as usize as u64);
        // Every device, as the runtime learnt them through the public API (which connects each).
        let count = driver().map_or(0, |d| d.devices.len() as CUdevice);
        let devices = (0..count)
            .filter_map(|dev| connection(dev).ok())
            .map(|c| {
                let pci = pci_location(c).map(|v| v.unwrap_or(0));
                (uuid_of(c), pci)
            })
            .collect();
        Identity {
            pid: std::process::id(),
            // SAFETY: pthread_self has no preconditions. The digest takes its low 32 bits.
            tid: unsafe { pthread_self() } as u32,
            cudart_table: &CUDART as *const _ as u64,
            integrity_table: &INTEGRITY as *const _ as u64,
            integrity_entry: entry,
            devices,
        }
    }
}

/// NVIDIA's driver answers versions ending in 0 and 1 with constants (measured).
const DIGEST_0: [u8; 16] = [
    0x5c, 0x67, 0xcb, 0x03, 0x1c, 0x18, 0x41, 0x33, 0xe8, 0xd1, 0x4c, 0x1f, 0xaa, 0x83, 0xd3, 0x8e,
];

/// The key of the HMAC (measured: with it our digests equal NVIDIA's byte for byte).
const KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// The digest for runtime version `version` at time `unix_seconds`: HMAC-MD2 over a record of
/// the driver version, `version`, the process and thread, the two tables' addresses, the check's
/// own address and the time, then each device's UUID and PCI location.
fn digest(version: u32, unix_seconds: u64, id: &Identity) -> [u8; 16] {
    match version % 10 {
        0 => return DIGEST_0,
        1 => {
            let mut d = DIGEST_0;
            d[7] = 0x18;
            return d;
        }
        _ => {}
    }
    let mut m = Vec::with_capacity(48 + 28 * id.devices.len());
    m.extend_from_slice(&(DRIVER_VERSION as u32).to_le_bytes());
    m.extend_from_slice(&version.to_le_bytes());
    m.extend_from_slice(&id.pid.to_le_bytes());
    m.extend_from_slice(&id.tid.to_le_bytes());
    m.extend_from_slice(&id.cudart_table.to_le_bytes());
    m.extend_from_slice(&id.integrity_table.to_le_bytes());
    m.extend_from_slice(&id.integrity_entry.to_le_bytes());
    m.extend_from_slice(&unix_seconds.to_le_bytes());
    for (u, pci) in &id.devices {
        m.extend_from_slice(u);
        for p in pci {
            m.extend_from_slice(&p.to_le_bytes());
        }
    }
    hmac_md2(&KEY, &m)
}

/// RFC 2104's HMAC over RFC 1319's MD2 (block 16 bytes), for a key of one block.
fn hmac_md2(key: &[u8; 16], message: &[u8]) -> [u8; 16] {
    let mut mac = SimpleHmac::<Md2>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

// ----- 21318c60: tools' view of contexts (cuBLASLt, cuBLAS, cuFFT) -----
//
// `CU_ETID_ToolsContext` in NVIDIA's cuxtra library. Served: [4], the context's ID (cuBLASLt
// once per matmul, cuFFT once per plan). [3] is `getDevice` and [4] `getContextNumber` in a
// published table of names (by byte offset); nothing traced calls [3]. [51] is called by cuBLAS
// through mps but not natively (CuPy's suite with it refused natively ran the same: it was never
// reached), so what it must answer is not known: a stub.

static TOOLS_CTX: Table<93> = Table([
    size(93),
    stub!(6, 1),
    stub!(6, 2),
    stub!(6, 3),
    word!(context_id as unsafe extern "C" fn(CUcontext, *mut u64) -> CUresult),
    stub!(6, 5),
    stub!(6, 6),
    stub!(6, 7),
    stub!(6, 8),
    stub!(6, 9),
    stub!(6, 10),
    stub!(6, 11),
    stub!(6, 12),
    stub!(6, 13),
    stub!(6, 14),
    stub!(6, 15),
    stub!(6, 16),
    stub!(6, 17),
    stub!(6, 18),
    stub!(6, 19),
    stub!(6, 20),
    stub!(6, 21),
    stub!(6, 22),
    stub!(6, 23),
    stub!(6, 24),
    stub!(6, 25),
    stub!(6, 26),
    stub!(6, 27),
    stub!(6, 28),
    stub!(6, 29),
    stub!(6, 30),
    stub!(6, 31),
    stub!(6, 32),
    stub!(6, 33),
    stub!(6, 34),
    stub!(6, 35),
    stub!(6, 36),
    stub!(6, 37),
    stub!(6, 38),
    stub!(6, 39),
    stub!(6, 40),
    stub!(6, 41),
    stub!(6, 42),
    stub!(6, 43),
    stub!(6, 44),
    stub!(6, 45),
    stub!(6, 46),
    stub!(6, 47),
    stub!(6, 48),
    stub!(6, 49),
    stub!(6, 50),
    stub!(6, 51),
    stub!(6, 52),
    stub!(6, 53),
    stub!(6, 54),
    stub!(6, 55),
    stub!(6, 56),
    stub!(6, 57),
    stub!(6, 58),
    stub!(6, 59),
    stub!(6, 60),
    stub!(6, 61),
    stub!(6, 62),
    stub!(6, 63),
    stub!(6, 64),
    stub!(6, 65),
    stub!(6, 66),
    stub!(6, 67),
    stub!(6, 68),
    stub!(6, 69),
    stub!(6, 70),
    stub!(6, 71),
    stub!(6, 72),
    stub!(6, 73),
    stub!(6, 74),
    stub!(6, 75),
    stub!(6, 76),
    stub!(6, 77),
    stub!(6, 78),
    stub!(6, 79),
    stub!(6, 80),
    stub!(6, 81),
    stub!(6, 82),
    stub!(6, 83),
    stub!(6, 84),
    stub!(6, 85),
    stub!(6, 86),
    stub!(6, 87),
    stub!(6, 88),
    stub!(6, 89),
    stub!(6, 90),
    NULL,
    stub!(6, 92),
]);

/// Slot 4: the context's unique ID, as `cuCtxGetId` would report it (its handle here, unique for
/// the life of the process); a NULL context has ID 0, not the current one's (measured).
unsafe extern "C" fn context_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    entry("tools context: id", || {
        // SAFETY: the caller passes a writable out-pointer (NULL is refused by `put`).
        unsafe { put(id, handle_of(ctx) as u64) }
    })
}

// ----- 1734dc26: a library's callbacks (cuBLASLt) -----

static CALLBACKS: Table<17> = Table([
    size(17),
    stub!(7, 1),
    stub!(7, 2),
    stub!(7, 3),
    word!(
        declined_callbacks as unsafe extern "C" fn(*mut u64, *mut u64, *const c_void) -> CUresult
    ),
    stub!(7, 5),
    stub!(7, 6),
    stub!(7, 7),
    stub!(7, 8),
    stub!(7, 9),
    stub!(7, 10),
    stub!(7, 11),
    stub!(7, 12),
    stub!(7, 13),
    stub!(7, 14),
    stub!(7, 15),
    stub!(7, 16),
]);

/// Slot 4 `(u64 *a, u64 *b, const table *callbacks)`: cuBLASLt hands the driver a table of 16
/// functions of its own (a size word of 136 first) and gets two objects back, which it then
/// passes to slot 13, once per process (measured on NVIDIA's driver). Declined here, the outputs
/// left as they are: cuBLASLt then skips slot 13 and goes on, and its matmuls are exact (measured
/// with this answer given in place of NVIDIA's driver's; refusing the whole table ends the
/// process). Said only with `MPS_CUDA_LOG`, since every cuBLASLt program asks.
unsafe extern "C" fn declined_callbacks(_a: *mut u64, _b: *mut u64, _t: *const c_void) -> CUresult {
    log::detail_once("export 7[4]", || {
        "cuBLASLt's callbacks (export table 1734dc26, entry 4) are declined through mps; \
         returning CUDA_ERROR_NOT_SUPPORTED, which cuBLASLt does without"
            .to_string()
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

// ----- the lookup -----

/// The table for `id`, or `None` for one this library does not serve.
fn table(id: &[u8; 16]) -> Option<*const c_void> {
    let t: *const c_void = match *id {
        CUDART_INTERFACE => (&CUDART as *const Table<13>).cast(),
        TOOLS_CALLBACK_HOOKS => (&HOOKS as *const Table<7>).cast(),
        TOOLS_TLS => (&TLS as *const Table<3>).cast(),
        CONTEXT_LOCAL_STORAGE => (&CLS as *const Table<4>).cast(),
        CONTEXT_CHECKS => (&CHECKS as *const Table<15>).cast(),
        INTEGRITY_CHECK => (&INTEGRITY as *const Table<3>).cast(),
        TOOLS_CONTEXT => (&TOOLS_CTX as *const Table<93>).cast(),
        LIBRARY_CALLBACKS => (&CALLBACKS as *const Table<17>).cast(),
        TOOLS_MODULE => (&TOOLS_MOD as *const Table<99>).cast(),
        _ => return None,
    };
    Some(t)
}

// ----- 6e163fbe: a module's functions (cuFFT) -----

static TOOLS_MOD: Table<99> = Table([
    size(99),
    stub!(8, 1),
    stub!(8, 2),
    stub!(8, 3),
    stub!(8, 4),
    stub!(8, 5),
    stub!(8, 6),
    word!(
        module_functions
            as unsafe extern "C" fn(
                CUcontext,
                usize,
                Option<FunctionVisitor>,
                *mut c_void,
                usize,
                usize,
            ) -> u32
    ),
    stub!(8, 8),
    stub!(8, 9),
    stub!(8, 10),
    stub!(8, 11),
    stub!(8, 12),
    stub!(8, 13),
    stub!(8, 14),
    stub!(8, 15),
    stub!(8, 16),
    stub!(8, 17),
    stub!(8, 18),
    stub!(8, 19),
    stub!(8, 20),
    stub!(8, 21),
    stub!(8, 22),
    stub!(8, 23),
    stub!(8, 24),
    stub!(8, 25),
    stub!(8, 26),
    stub!(8, 27),
    stub!(8, 28),
    stub!(8, 29),
    stub!(8, 30),
    stub!(8, 31),
    stub!(8, 32),
    stub!(8, 33),
    stub!(8, 34),
    stub!(8, 35),
    stub!(8, 36),
    stub!(8, 37),
    stub!(8, 38),
    stub!(8, 39),
    stub!(8, 40),
    stub!(8, 41),
    stub!(8, 42),
    stub!(8, 43),
    stub!(8, 44),
    stub!(8, 45),
    stub!(8, 46),
    stub!(8, 47),
    stub!(8, 48),
    stub!(8, 49),
    stub!(8, 50),
    stub!(8, 51),
    stub!(8, 52),
    stub!(8, 53),
    stub!(8, 54),
    stub!(8, 55),
    stub!(8, 56),
    stub!(8, 57),
    stub!(8, 58),
    stub!(8, 59),
    stub!(8, 60),
    stub!(8, 61),
    stub!(8, 62),
    stub!(8, 63),
    stub!(8, 64),
    stub!(8, 65),
    stub!(8, 66),
    stub!(8, 67),
    stub!(8, 68),
    stub!(8, 69),
    stub!(8, 70),
    stub!(8, 71),
    stub!(8, 72),
    stub!(8, 73),
    stub!(8, 74),
    stub!(8, 75),
    stub!(8, 76),
    stub!(8, 77),
    stub!(8, 78),
    stub!(8, 79),
    stub!(8, 80),
    stub!(8, 81),
    stub!(8, 82),
    stub!(8, 83),
    stub!(8, 84),
    stub!(8, 85),
    stub!(8, 86),
    stub!(8, 87),
    stub!(8, 88),
    stub!(8, 89),
    stub!(8, 90),
    stub!(8, 91),
    stub!(8, 92),
    stub!(8, 93),
    stub!(8, 94),
    stub!(8, 95),
    stub!(8, 96),
    stub!(8, 97),
    stub!(8, 98),
]);

/// What [7] calls for each function: `(user, function, its name)`, as NVIDIA's driver was seen
/// calling it (the words after those differ from call to call: a visitor reads three; mps passes
/// 0, 0 and the module, as the driver happened to for cuFFT). 0 goes on.
type FunctionVisitor =
    unsafe extern "C" fn(*mut c_void, usize, *const c_char, usize, usize, usize) -> u64;

/// Slot 7 `(context, module, visit, user, module, _)`: walks the module's functions, calling
/// `visit(user, function, name)` for each, and returns how many it visited, as
/// NVIDIA's driver was measured doing on an H200: 1 for a cuFFT plan's module of one function
/// (whose visitor kept the function it wanted in `user[0]` and answered 0), 7 for the test
/// kernels' seven (docs/bench/h200-2026-12-01-suite). What a visitor's other answers mean was
/// not seen; one is taken to end the walk. A module this library does not know visits nothing.
/// cuFFT refuses a plan without the walk (`CUFFT_INTERNAL_ERROR`, measured natively with the
/// table refused).
unsafe extern "C" fn module_functions(
    _ctx: CUcontext,
    module: usize,
    visit: Option<FunctionVisitor>,
    user: *mut c_void,
    module_again: usize,
    _unknown: usize,
) -> u32 {
    let mut visited = 0;
    entry("tools module: functions", || {
        let visit = visit.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        for f in crate::module::functions_of_handle(module)? {
            let name = crate::module::function_obj(f)?.c_name.as_ptr();
            visited += 1;
            // SAFETY: the caller hands a visitor of this signature with its own `user`; the
            // name lives as long as the function, which outlives the call.
            if unsafe { visit(user, f, name, 0, 0, module_again) } != 0 {
                break;
            }
        }
        Ok(())
    });
    visited
}

// ----- the exports -----

exports! {
    /// Hands out the table `id` names; one this library does not serve is refused with
    /// `CUDA_ERROR_NOT_SUPPORTED`, its UUID said once (except the probe the runtime does without).
    ///
    /// # Safety
    /// `out` must be NULL or writable; `id` NULL or readable.
    pub unsafe fn cuGetExportTable(
        out: *mut *const c_void,
        id: *const CUuuid,
    ) ["cuGetExportTable" 3000] = {
        check(!out.is_null() && !id.is_null())?;
        // SAFETY: checked non-null; the caller guarantees a readable UUID.
        let bytes = unsafe { (*id).bytes }.map(|b| b as u8);
        let found = table(&bytes);
        // SAFETY: checked non-null; the caller guarantees it is writable.
        unsafe { out.write(found.unwrap_or(std::ptr::null())) };
        if found.is_some() {
            return Ok(());
        }
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        if bytes == COMPILE_CACHE {
            log::detail_once(format_args!("export table {hex}"), || {
                format!(
                    "cuGetExportTable({hex}), NVRTC's compile cache, is not served through \
                     mps; returning CUDA_ERROR_NOT_SUPPORTED (NVRTC compiles without it)"
                )
            });
        } else if bytes != UNUSED_PROBE {
            log::once(&format!("export table {hex}"), || {
                format!(
                    "cuGetExportTable({hex}) is not supported through mps; \
                     returning CUDA_ERROR_NOT_SUPPORTED"
                )
            });
        }
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn md2(data: &[u8]) -> [u8; 16] {
        use md2::Digest;
        Md2::digest(data).into()
    }

    #[test]
    fn md2_matches_rfc_1319() {
        assert_eq!(hex(&md2(b"")), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(hex(&md2(b"abc")), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(
            hex(&md2(b"abcdefghijklmnopqrstuvwxyz")),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
    }

    #[test]
    fn hmac_is_two_md2_passes_over_the_padded_key() {
        let key = [7u8; 16];
        let inner = md2(&[&[7 ^ 0x36; 16][..], b"message"].concat());
        let outer = md2(&[&[7 ^ 0x5c; 16][..], &inner[..]].concat());
        assert_eq!(hmac_md2(&key, b"message"), outer);
    }

    fn identity() -> Identity {
        Identity {
            pid: 4242,
            tid: 0x1234_5678,
            cudart_table: 0x7f00_0000_1000,
            integrity_table: 0x7f00_0000_2000,
            integrity_entry: 0x7f00_0000_3000,
            devices: vec![([0xab; 16], [0, 0x19, 0])],
        }
    }

    #[test]
    fn the_digest_is_constant_for_versions_ending_in_0_and_1_and_covers_everything_else() {
        let id = identity();
        assert_eq!(
            hex(&digest(13000, 99, &id)),
            "5c67cb031c184133e8d14c1faa83d38e"
        );
        assert_eq!(
            hex(&digest(13001, 99, &id)),
            "5c67cb031c184118e8d14c1faa83d38e"
        );
        let d = digest(13002, 1_700_000_000, &id);
        // The record's digest as this library's own MD2 and HMAC gave it when its digests were
        // measured equal to NVIDIA's.
        assert_eq!(hex(&d), "668ed3e6ea6cefa340e4c46c3f30bc33");
        assert_ne!(d, digest(13002, 1_700_000_001, &id), "the time");
        assert_ne!(d, digest(13012, 1_700_000_000, &id), "the version");
        for change in [
            |i: &mut Identity| i.pid += 1,
            |i: &mut Identity| i.tid += 1,
            |i: &mut Identity| i.cudart_table += 8,
            |i: &mut Identity| i.integrity_table += 8,
            |i: &mut Identity| i.integrity_entry += 8,
            |i: &mut Identity| i.devices[0].0[15] ^= 1,
            |i: &mut Identity| i.devices[0].1[1] += 1,
            |i: &mut Identity| i.devices.clear(),
        ] {
            let mut other = identity();
            change(&mut other);
            assert_ne!(d, digest(13002, 1_700_000_000, &other));
        }
    }

    #[test]
    fn tables_have_nvidias_sizes_and_stable_addresses() {
        let word0 = |id: &[u8; 16]| {
            // SAFETY: every table served has at least one word.
            unsafe { table(id).unwrap().cast::<usize>().read() }
        };
        assert_eq!(word0(&CUDART_INTERFACE), 104);
        assert_eq!(word0(&TOOLS_CALLBACK_HOOKS), 56);
        assert_eq!(word0(&TOOLS_TLS), 24);
        assert_eq!(word0(&CONTEXT_CHECKS), 120);
        assert_eq!(word0(&INTEGRITY_CHECK), 24);
        assert_eq!(word0(&TOOLS_CONTEXT), 744);
        assert_ne!(
            word0(&CONTEXT_LOCAL_STORAGE),
            0,
            "the storage table starts with a function"
        );
        assert_eq!(table(&CUDART_INTERFACE), table(&CUDART_INTERFACE));
        assert_eq!(table(&UNUSED_PROBE), None);
        // SAFETY: reading words of the static tables.
        unsafe {
            assert!(
                CUDART.0[10].f.is_none() && CLS.0[3].f.is_none() && TOOLS_CTX.0[91].f.is_none()
            );
        }
    }

    #[test]
    fn the_uuids_are_the_bytes_as_traced() {
        assert_eq!(INTEGRITY_CHECK[0], 0xd4);
        assert_eq!(INTEGRITY_CHECK[15], 0xf2);
    }
}
