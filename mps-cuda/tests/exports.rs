//! The built library's exported symbols against `cuGetProcAddress`: every `cu*` function the
//! dynamic linker finds in `libmpscuda.so` is handed out by `cuGetProcAddress_v2` for its name
//! at some CUDA version (a per-thread-default-stream variant only with
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`, every other function only without), and
//! everything it hands out is one of those symbols. The versions of each ABI are the unit tests'
//! (`proc.rs`); this is what a program sees of the two lists, so that neither can lose a
//! function the other has.

#[allow(dead_code)] // this suite needs only the build of the library
mod common;

use std::collections::{BTreeSet, HashMap};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::process::Command;

use common::built;

unsafe extern "C" {
    fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}

const RTLD_NOW: c_int = 2;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`.
const PER_THREAD: u64 = 0x2;
/// `CU_GET_PROC_ADDRESS_SUCCESS`.
const FOUND: c_int = 0;

/// Exported for the dynamic linker only: the unversioned names of two functions whose `_v2`
/// `cuGetProcAddress` hands out (the same arguments; libraries `dlsym` them).
const LINKER_ONLY: [&str; 2] = ["cuCtxPopCurrent", "cuCtxPushCurrent"];

type GetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;

/// The functions the library exports whose names start with `cu`.
fn exported_functions(lib: &std::path::Path) -> Vec<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(lib)
        .output()
        .expect("run nm (binutils) on the library");
    assert!(out.status.success(), "nm {}: {:?}", lib.display(), out);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "T", name] if name.starts_with("cu") => Some(name.to_string()),
            _ => None,
        })
        .collect()
}

/// The names a symbol may be handed out for: itself, and without its per-thread suffix and
/// then its ABI version (`cuMemcpyHtoD_v2_ptds`: `cuMemcpyHtoD_v2`, `cuMemcpyHtoD`).
fn names_of(symbol: &str) -> Vec<String> {
    let mut names = vec![symbol.to_string()];
    let base = symbol
        .strip_suffix("_ptsz")
        .or(symbol.strip_suffix("_ptds"))
        .unwrap_or(symbol);
    names.push(base.to_string());
    if let Some((name, v)) = base.rsplit_once("_v")
        && v.parse::<u32>().is_ok()
    {
        names.push(name.to_string());
    }
    names.dedup();
    names
}

fn is_per_thread(symbol: &str) -> bool {
    symbol.ends_with("_ptsz") || symbol.ends_with("_ptds")
}

#[test]
fn every_exported_function_is_handed_out_by_get_proc_address_and_only_those() {
    let lib = built().join("libmpscuda.so");
    let symbols = exported_functions(&lib);
    assert!(
        symbols.len() > 400,
        "{} cu* functions in {}",
        symbols.len(),
        lib.display()
    );
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a path to a shared library; loading it runs nothing (it has no initialisers).
    let handle = unsafe { dlopen(path.as_ptr(), RTLD_NOW) };
    assert!(!handle.is_null(), "dlopen: {:?}", unsafe {
        // SAFETY: dlerror's message after the failed dlopen.
        CStr::from_ptr(dlerror())
    });
    let address = |name: &str| {
        let c = CString::new(name).unwrap();
        // SAFETY: a handle dlopen returned and a NUL-terminated name.
        unsafe { dlsym(handle, c.as_ptr()) as usize }
    };
    let by_address: HashMap<usize, &str> =
        symbols.iter().map(|s| (address(s), s.as_str())).collect();
    let get = address("cuGetProcAddress_v2");
    assert_ne!(get, 0);
    // SAFETY: cuGetProcAddress_v2's address, of this type in cuda.h.
    let get: GetProcAddress = unsafe { std::mem::transmute::<usize, GetProcAddress>(get) };
    // What `name` gives at `version` with `flags`, if anything.
    let ask = |name: &CStr, version: c_int, flags: u64| {
        let (mut f, mut status) = (std::ptr::null_mut(), -1);
        // SAFETY: a NUL-terminated name and two writable outputs.
        let r = unsafe { get(name.as_ptr(), &mut f, version, flags, &mut status) };
        assert_eq!(r, 0, "cuGetProcAddress_v2({name:?}, {version}, {flags})");
        (status == FOUND).then_some(f as usize)
    };
    // Every CUDA version, 2.0 to 13.0.
    let versions: Vec<c_int> = (2000..=13000).step_by(10).collect();
    let mut reached = BTreeSet::new();
    let names: BTreeSet<String> = symbols.iter().flat_map(|s| names_of(s)).collect();
    for name in &names {
        let c = CString::new(name.as_str()).unwrap();
        for &version in &versions {
            for flags in [0, PER_THREAD] {
                let Some(f) = ask(&c, version, flags) else {
                    continue;
                };
                let symbol = by_address.get(&f).unwrap_or_else(|| {
                    panic!("{name} at {version}, flags {flags}: {f:#x} is no exported function")
                });
                let wanted = flags == PER_THREAD || !is_per_thread(symbol);
                assert!(
                    wanted,
                    "{name} at {version} gives {symbol} without the flag"
                );
                if is_per_thread(symbol) == (flags == PER_THREAD) {
                    reached.insert(*symbol);
                }
            }
        }
    }
    let unreached: Vec<&str> = symbols
        .iter()
        .map(String::as_str)
        .filter(|s| !reached.contains(s))
        .collect();
    assert_eq!(
        unreached, LINKER_ONLY,
        "exported, but never handed out by cuGetProcAddress (as a per-thread variant only with \
         the flag, anything else only without): add it to its `exports!` row"
    );
}

#[test]
fn a_symbols_names_are_itself_its_base_and_its_unversioned_name() {
    assert_eq!(
        names_of("cuMemcpyHtoD_v2_ptds"),
        ["cuMemcpyHtoD_v2_ptds", "cuMemcpyHtoD_v2", "cuMemcpyHtoD"]
    );
    assert_eq!(names_of("cuInit"), ["cuInit"]);
    assert_eq!(
        names_of("cuLaunchKernel_ptsz"),
        ["cuLaunchKernel_ptsz", "cuLaunchKernel"]
    );
}
