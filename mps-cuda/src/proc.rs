//! `cuGetProcAddress`: the driver functions by (name, CUDA version, flags), as cudart and other
//! libraries obtain them; the error strings.
//!
//! A name's version picks its ABI: `cuMemAlloc` asked for at 3.2 or later is `cuMemAlloc_v2`
//! (64-bit sizes); asked for earlier it would be the 32-bit `cuMemAlloc`, which this library
//! does not have, so that is refused (`CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`). With
//! `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` a function that has a per-thread-default-
//! stream variant (`_ptsz`, `_ptds`) is handed out as that variant.
//!
//! A name that is not served, or not at the version asked for, leaves NULL and the reason in
//! `symbolStatus`: `cuGetProcAddress_v2` then returns `CUDA_SUCCESS`, as CUDA 12 and later
//! document and NVIDIA's driver does (measured with driver 580), and the first form, which has
//! no status to give, `CUDA_ERROR_NOT_FOUND`, as CUDA 11 documents.
//!
//! The table is not kept here: each module's `exports!` block defines its functions with the
//! names and versions they are handed out for (`ffi::exports`), and the table is made from those
//! lists and `unsupported`'s stubs.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;

use crate::abi::{CUdriverProcAddressQueryResult, CUresult, PROC_PER_THREAD_DEFAULT_STREAM};
use crate::ffi::{Export, check, exports, put};
use crate::unsupported::STUBS;
use crate::{
    context, context_wide, device, errors, export, graph, graph_build, kernel_queries, launch,
    memory, mempool, module, pointer, stream, tensor_map, unified, vmm,
};

/// One ABI of a name: the CUDA version that introduced it, its function, and its
/// per-thread-default-stream variant if it has one. Addresses, so the table can be shared.
#[derive(Clone, Copy, Debug)]
struct Abi {
    since: i32,
    legacy: usize,
    per_thread: Option<usize>,
}

/// Every module's exports, as its `exports!` block lists them. A module missing here leaves its
/// functions exported but not handed out: `tests/exports.rs` fails on that.
const MODULES: &[&[Export]] = &[
    context::EXPORTS,
    context_wide::EXPORTS,
    device::EXPORTS,
    export::EXPORTS,
    graph::EXPORTS,
    graph_build::EXPORTS,
    kernel_queries::EXPORTS,
    launch::EXPORTS,
    memory::EXPORTS,
    mempool::EXPORTS,
    module::EXPORTS,
    pointer::EXPORTS,
    stream::EXPORTS,
    tensor_map::EXPORTS,
    unified::EXPORTS,
    vmm::EXPORTS,
    EXPORTS,
];

/// Each (name, ABI) an export is handed out for.
fn implemented() -> impl Iterator<Item = (&'static str, Abi)> {
    MODULES.iter().flat_map(|m| m.iter()).flat_map(|e| {
        e.procs.iter().map(move |&(name, since)| {
            let abi = Abi {
                since,
                legacy: e.function as usize,
                per_thread: e.per_thread.map(|(_, f)| f as usize),
            };
            (name, abi)
        })
    })
}

/// Name → its ABIs, oldest first; an unsupported name has one stub for every version.
fn table() -> &'static HashMap<&'static str, Vec<Abi>> {
    static TABLE: OnceLock<HashMap<&'static str, Vec<Abi>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t: HashMap<&str, Vec<Abi>> = HashMap::new();
        for (name, abi) in implemented() {
            t.entry(name).or_default().push(abi);
        }
        for (name, stub) in STUBS {
            t.entry(name).or_default().push(Abi {
                since: 0,
                legacy: *stub as usize,
                per_thread: None,
            });
        }
        for abis in t.values_mut() {
            abis.sort_by_key(|a| a.since);
        }
        t
    })
}

/// The function for `name` asked for at CUDA version `version` with `flags`, or why not.
fn lookup(name: &str, version: i32, flags: u64) -> Result<usize, CUdriverProcAddressQueryResult> {
    let abis = table()
        .get(name)
        .ok_or(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)?;
    let abi = abis
        .iter()
        .rev()
        .find(|a| a.since <= version)
        .ok_or(CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)?;
    Ok(match abi.per_thread {
        Some(pt) if flags & PROC_PER_THREAD_DEFAULT_STREAM != 0 => pt,
        _ => abi.legacy,
    })
}

/// Which form of `cuGetProcAddress` was called (see the module's documentation).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    First,
    WithStatus,
}

fn get_proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
    form: Form,
) -> Res {
    check(!symbol.is_null() && !pfn.is_null() && flags & !0x3 == 0)?;
    // SAFETY: the caller guarantees a non-null symbol is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let found = lookup(name, version, flags);
    let (f, s) = match found {
        Ok(f) => (
            f,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS,
        ),
        Err(s) => (0, s),
    };
    // SAFETY: pfn checked non-null; the caller guarantees it and a non-null status writable.
    unsafe {
        put(pfn, f as *mut c_void)?;
        if !status.is_null() {
            put(status, s)?;
        }
    }
    match found {
        Ok(_) => Ok(()),
        Err(why) => {
            crate::log::detail_once(format_args!("cuGetProcAddress {name}"), || {
                format!("cuGetProcAddress({name}, {version}): not served ({why:?})")
            });
            match form {
                Form::First => Err(CUresult::CUDA_ERROR_NOT_FOUND),
                Form::WithStatus => Ok(()),
            }
        }
    }
}

type Res = Result<(), CUresult>;

// ----- the exports -----

exports! {
    /// # Safety
    /// `symbol` must be NULL or a NUL-terminated string; `pfn` NULL or writable.
    pub unsafe fn cuGetProcAddress(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: i32,
        flags: u64,
    ) ["cuGetProcAddress" 11030] =
        get_proc_address(symbol, pfn, version, flags, std::ptr::null_mut(), Form::First);

    /// # Safety
    /// As `cuGetProcAddress`; `status` NULL or writable.
    pub unsafe fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: i32,
        flags: u64,
        status: *mut CUdriverProcAddressQueryResult,
    ) ["cuGetProcAddress" 12000] =
        get_proc_address(symbol, pfn, version, flags, status, Form::WithStatus);

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuGetErrorName(error: u32, out: *mut *const c_char) ["cuGetErrorName" 6000] = {
        let s = errors::name(error);
        // SAFETY: the caller guarantees a non-null `out` is writable.
        unsafe { put(out, s.unwrap_or(std::ptr::null())) }?;
        s.map(drop).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    };

    /// # Safety
    /// `out` must be NULL or writable.
    pub unsafe fn cuGetErrorString(
        error: u32,
        out: *mut *const c_char,
    ) ["cuGetErrorString" 6000] = {
        let s = errors::description(error);
        // SAFETY: the caller guarantees a non-null `out` is writable.
        unsafe { put(out, s.unwrap_or(std::ptr::null())) }?;
        s.map(drop).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::*;
    use crate::graph::*;
    use crate::launch::*;
    use crate::memory::*;
    use CUdriverProcAddressQueryResult as Q;

    #[test]
    fn a_version_picks_its_abi() {
        assert_eq!(
            lookup("cuMemAlloc", 3020, 0),
            Ok(cuMemAlloc_v2 as *const () as usize)
        );
        assert_eq!(
            lookup("cuMemAlloc", 13000, 0),
            Ok(cuMemAlloc_v2 as *const () as usize)
        );
        assert_eq!(
            lookup("cuMemAlloc", 2000, 0),
            Err(Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        );
        assert_eq!(
            lookup("cuCtxGetDevice", 12080, 0),
            Ok(cuCtxGetDevice as *const () as usize)
        );
        assert_eq!(
            lookup("cuCtxGetDevice", 13000, 0),
            Ok(cuCtxGetDevice_v2 as *const () as usize)
        );
        assert_eq!(
            lookup("cuCtxCreate", 13000, 0),
            Ok(cuCtxCreate_v4 as *const () as usize)
        );
        assert_eq!(
            lookup("cuNoSuchThing", 13000, 0),
            Err(Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
        );
    }

    #[test]
    fn the_per_thread_flag_picks_the_per_thread_variant_where_there_is_one() {
        let pt = PROC_PER_THREAD_DEFAULT_STREAM;
        assert_eq!(
            lookup("cuLaunchKernel", 7000, pt),
            Ok(cuLaunchKernel_ptsz as *const () as usize)
        );
        assert_eq!(
            lookup("cuMemcpyHtoD", 7000, pt),
            Ok(cuMemcpyHtoD_v2_ptds as *const () as usize)
        );
        assert_eq!(
            lookup("cuMemcpyHtoD", 7000, 0),
            Ok(cuMemcpyHtoD_v2 as *const () as usize)
        );
        assert_eq!(
            lookup("cuMemAlloc", 3020, pt),
            Ok(cuMemAlloc_v2 as *const () as usize)
        );
    }

    /// The graph-building functions whose ABI changed: each version its symbol (CUDA 13's
    /// `cuda.h` maps the names to the newest).
    #[test]
    fn graph_building_functions_by_version() {
        use crate::graph_build::*;
        let at = |name, version| lookup(name, version, 0);
        let f = |f: usize| Ok(f);
        assert_eq!(
            at("cuGraphAddKernelNode", 11080),
            f(cuGraphAddKernelNode as *const () as usize)
        );
        assert_eq!(
            at("cuGraphAddKernelNode", 13000),
            f(cuGraphAddKernelNode_v2 as *const () as usize)
        );
        assert_eq!(
            at("cuGraphAddNode", 12020),
            f(cuGraphAddNode as *const () as usize)
        );
        assert_eq!(
            at("cuGraphAddNode", 13000),
            f(cuGraphAddNode_v2 as *const () as usize)
        );
        assert_eq!(
            at("cuGraphExecUpdate", 11080),
            f(cuGraphExecUpdate as *const () as usize)
        );
        assert_eq!(
            at("cuGraphExecUpdate", 13000),
            f(cuGraphExecUpdate_v2 as *const () as usize)
        );
        assert_eq!(
            at("cuGraphGetEdges", 13000),
            f(cuGraphGetEdges_v2 as *const () as usize)
        );
    }

    /// The capture and graph functions at the versions cudart 13 asks for them (the H200 trace
    /// of PyTorch, `mlp.txt`): each version its ABI.
    #[test]
    fn capture_and_graph_functions_by_the_versions_cudart_asks_for() {
        let at = |name, version, flags| lookup(name, version, flags);
        let f = |f: usize| Ok(f);
        let pt = PROC_PER_THREAD_DEFAULT_STREAM;
        assert_eq!(
            at("cuStreamBeginCapture", 10000, 0),
            f(cuStreamBeginCapture as *const () as usize)
        );
        assert_eq!(
            at("cuStreamBeginCapture", 10010, pt),
            f(cuStreamBeginCapture_v2_ptsz as *const () as usize)
        );
        assert_eq!(
            at("cuStreamGetCaptureInfo", 10010, 0),
            f(cuStreamGetCaptureInfo as *const () as usize)
        );
        assert_eq!(
            at("cuStreamGetCaptureInfo", 11030, pt),
            f(cuStreamGetCaptureInfo_v2_ptsz as *const () as usize)
        );
        assert_eq!(
            at("cuStreamGetCaptureInfo", 12030, 0),
            f(cuStreamGetCaptureInfo_v3 as *const () as usize)
        );
        assert_eq!(
            at("cuGraphInstantiate", 10000, 0),
            f(cuGraphInstantiate as *const () as usize)
        );
        assert_eq!(
            at("cuGraphInstantiate", 11000, 0),
            f(cuGraphInstantiate_v2 as *const () as usize)
        );
        assert_eq!(
            at("cuGraphInstantiate", 12000, 0),
            f(cuGraphInstantiateWithFlags as *const () as usize)
        );
        assert_eq!(
            at("cuGraphInstantiateWithParams", 12000, pt),
            f(cuGraphInstantiateWithParams_ptsz as *const () as usize)
        );
        assert_eq!(
            at("cuGraphLaunch", 10000, pt),
            f(cuGraphLaunch_ptsz as *const () as usize)
        );
        assert_eq!(
            at("cuGraphUpload", 11010, 0),
            f(cuGraphUpload as *const () as usize)
        );
        assert_eq!(
            at("cuThreadExchangeStreamCaptureMode", 10010, 0),
            f(cuThreadExchangeStreamCaptureMode as *const () as usize)
        );
    }

    fn exports() -> impl Iterator<Item = &'static Export> {
        MODULES.iter().flat_map(|m| m.iter())
    }

    /// Each export is what its names give at each version it lists, its per-thread variant
    /// with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; no two exports claim one (name,
    /// version), and every version is a CUDA version this library may be asked at.
    #[test]
    fn every_export_is_handed_out_for_its_names_at_its_versions() {
        let mut claimed = std::collections::HashSet::new();
        let mut rows = 0;
        for e in exports() {
            for &(name, since) in e.procs {
                assert!(claimed.insert((name, since)), "{name} at {since} twice");
                assert!(
                    (2000..=crate::abi::DRIVER_VERSION).contains(&since),
                    "{name} {since}"
                );
                let legacy = e.function as usize;
                assert_eq!(lookup(name, since, 0), Ok(legacy), "{} as {name}", e.symbol);
                let pt = e.per_thread.map_or(legacy, |(_, f)| f as usize);
                let per_thread = lookup(name, since, PROC_PER_THREAD_DEFAULT_STREAM);
                assert_eq!(per_thread, Ok(pt), "{} as {name}, per thread", e.symbol);
                rows += 1;
            }
            if let Some((symbol, _)) = e.per_thread {
                let base = symbol
                    .strip_suffix("_ptsz")
                    .or(symbol.strip_suffix("_ptds"));
                assert_eq!(
                    base,
                    Some(e.symbol),
                    "{symbol}: a per-thread variant's name"
                );
            }
        }
        assert!(rows >= 117, "{rows} rows");
    }

    /// What the table hands out is an export (or its per-thread variant) or a stub of
    /// `unsupported`, nothing else.
    #[test]
    fn everything_handed_out_is_an_export_or_a_stub() {
        let exported: std::collections::HashSet<usize> = exports()
            .flat_map(|e| [Some(e.function), e.per_thread.map(|(_, f)| f)])
            .flatten()
            .map(|f| f as usize)
            .chain(STUBS.iter().map(|(_, f)| *f as usize))
            .collect();
        for (name, abis) in table() {
            for a in abis {
                assert!(exported.contains(&a.legacy), "{name} at {}", a.since);
                if let Some(pt) = a.per_thread {
                    assert!(exported.contains(&pt), "{name} at {}, per thread", a.since);
                }
            }
        }
    }

    /// The memory functions (`cuMem*`, `cuPointer*`) that JAX's suite, PyTorch's expandable
    /// segments and `torch.compile` called in their H200 traces (a count above 0, by `dlsym`
    /// at version -1 or through `cuGetProcAddress` at the version asked) are implemented,
    /// not stubs.
    #[test]
    fn every_memory_function_the_traced_real_programs_called_is_implemented() {
        let traces = [
            include_str!("../../docs/bench/h200-2026-12-01-real-programs/traces/jax_suite.txt"),
            include_str!(
                "../../docs/bench/h200-2026-12-01-real-programs/traces/torch_expandable.txt"
            ),
            include_str!("../../docs/bench/h200-2026-12-01-real-programs/traces/torch_compile.txt"),
        ];
        let stubs: std::collections::HashSet<usize> =
            STUBS.iter().map(|(_, f)| *f as usize).collect();
        let mut checked = 0;
        for line in traces.iter().flat_map(|t| t.lines()) {
            // `[R ]COUNT CALLER|NAME[vVERSION,fFLAGS]`.
            let line = line
                .trim_start()
                .strip_prefix("R ")
                .unwrap_or(line.trim_start());
            let Some((count, call)) = line.split_once(' ') else {
                continue;
            };
            let Some((_, call)) = call.split_once('|') else {
                continue;
            };
            let Some((name, rest)) = call.split_once("[v") else {
                continue;
            };
            if count.parse::<u64>().unwrap_or(0) == 0
                || !(name.starts_with("cuMem") || name.starts_with("cuPointer"))
            {
                continue;
            }
            let (version, flags) = rest.trim_end_matches(']').split_once(",f").unwrap();
            let (version, flags): (i32, u64) = (version.parse().unwrap(), flags.parse().unwrap());
            if version < 0 {
                assert!(
                    exports().any(|e| e.symbol == name),
                    "{name}, taken by dlsym, is not implemented"
                );
            } else {
                let f = lookup(name, version, flags).unwrap_or_else(|e| panic!("{name}: {e:?}"));
                assert!(!stubs.contains(&f), "{name} at {version} is a stub");
            }
            checked += 1;
        }
        assert!(checked >= 29, "{checked} calls checked");
    }

    /// `tests/data/vadd_requested.txt` holds the (name, version) pairs that cudart 13 asked
    /// `cuGetProcAddress` for in the H200 trace of a vector add (`vadd_static.txt`).
    #[test]
    fn every_name_the_traced_vector_add_asked_for_is_known() {
        let trace = include_str!("../tests/data/vadd_requested.txt");
        for line in trace.lines().filter(|l| !l.is_empty()) {
            let (name, version) = line.split_once(' ').unwrap();
            let version: i32 = version.parse().unwrap();
            assert!(lookup(name, version, 0).is_ok(), "{name} at {version}");
        }
    }
}
