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

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};
use std::sync::OnceLock;

use crate::abi::{CUdriverProcAddressQueryResult, CUresult, PROC_PER_THREAD_DEFAULT_STREAM};
use crate::context::*;
use crate::device::*;
use crate::errors;
use crate::export::cuGetExportTable;
use crate::ffi::{check, entry, put};
use crate::graph::*;
use crate::kernel_queries::*;
use crate::launch::*;
use crate::memory::*;
use crate::module::*;
use crate::stream::*;
use crate::unsupported::STUBS;

/// One ABI of a name: the CUDA version that introduced it, its function, and its
/// per-thread-default-stream variant if it has one. Addresses, so the table can be shared.
#[derive(Clone, Copy, Debug)]
struct Abi {
    since: i32,
    legacy: usize,
    per_thread: Option<usize>,
}

macro_rules! abis {
    ($($name:literal $since:literal $f:ident $(| $pt:ident)?;)*) => {
        fn implemented() -> Vec<(&'static str, Abi)> {
            vec![$(($name, Abi {
                since: $since,
                legacy: $f as *const () as usize,
                per_thread: None$(.or(Some($pt as *const () as usize)))?,
            }),)*]
        }
    };
}

abis! {
    "cuInit" 2000 cuInit;
    "cuDriverGetVersion" 2020 cuDriverGetVersion;
    "cuDeviceGet" 2000 cuDeviceGet;
    "cuDeviceGetCount" 2000 cuDeviceGetCount;
    "cuDeviceGetName" 2000 cuDeviceGetName;
    "cuDeviceGetUuid" 9020 cuDeviceGetUuid;
    "cuDeviceGetUuid" 11040 cuDeviceGetUuid_v2;
    "cuDeviceTotalMem" 3020 cuDeviceTotalMem_v2;
    "cuDeviceGetAttribute" 2000 cuDeviceGetAttribute;
    "cuDevicePrimaryCtxRetain" 7000 cuDevicePrimaryCtxRetain;
    "cuDevicePrimaryCtxRelease" 7000 cuDevicePrimaryCtxRelease;
    "cuDevicePrimaryCtxRelease" 11000 cuDevicePrimaryCtxRelease_v2;
    "cuDevicePrimaryCtxSetFlags" 7000 cuDevicePrimaryCtxSetFlags;
    "cuDevicePrimaryCtxSetFlags" 11000 cuDevicePrimaryCtxSetFlags_v2;
    "cuDevicePrimaryCtxGetState" 7000 cuDevicePrimaryCtxGetState;
    "cuDevicePrimaryCtxReset" 7000 cuDevicePrimaryCtxReset;
    "cuDevicePrimaryCtxReset" 11000 cuDevicePrimaryCtxReset_v2;
    "cuCtxCreate" 3020 cuCtxCreate_v2;
    "cuCtxCreate" 11040 cuCtxCreate_v3;
    "cuCtxCreate" 12050 cuCtxCreate_v4;
    "cuCtxDestroy" 4000 cuCtxDestroy_v2;
    "cuCtxPushCurrent" 4000 cuCtxPushCurrent_v2;
    "cuCtxPopCurrent" 4000 cuCtxPopCurrent_v2;
    "cuCtxGetCurrent" 4000 cuCtxGetCurrent;
    "cuCtxSetCurrent" 4000 cuCtxSetCurrent;
    "cuCtxGetDevice" 2000 cuCtxGetDevice;
    "cuCtxGetDevice" 13000 cuCtxGetDevice_v2;
    "cuCtxGetFlags" 7000 cuCtxGetFlags;
    "cuCtxGetApiVersion" 3020 cuCtxGetApiVersion;
    "cuCtxSynchronize" 2000 cuCtxSynchronize;
    "cuCtxSynchronize" 13000 cuCtxSynchronize_v2;
    "cuCtxEnablePeerAccess" 4000 cuCtxEnablePeerAccess;
    "cuCtxDisablePeerAccess" 4000 cuCtxDisablePeerAccess;
    "cuDeviceCanAccessPeer" 4000 cuDeviceCanAccessPeer;
    "cuMemAlloc" 3020 cuMemAlloc_v2;
    "cuMemFree" 3020 cuMemFree_v2;
    "cuMemGetInfo" 3020 cuMemGetInfo_v2;
    "cuMemAllocHost" 3020 cuMemAllocHost_v2;
    "cuMemHostAlloc" 2020 cuMemHostAlloc;
    "cuMemFreeHost" 2000 cuMemFreeHost;
    "cuMemcpyHtoD" 3020 cuMemcpyHtoD_v2 | cuMemcpyHtoD_v2_ptds;
    "cuMemcpyDtoH" 3020 cuMemcpyDtoH_v2 | cuMemcpyDtoH_v2_ptds;
    "cuMemcpyDtoD" 3020 cuMemcpyDtoD_v2 | cuMemcpyDtoD_v2_ptds;
    "cuMemcpyHtoDAsync" 3020 cuMemcpyHtoDAsync_v2 | cuMemcpyHtoDAsync_v2_ptsz;
    "cuMemcpyDtoHAsync" 3020 cuMemcpyDtoHAsync_v2 | cuMemcpyDtoHAsync_v2_ptsz;
    "cuMemcpyDtoDAsync" 3020 cuMemcpyDtoDAsync_v2 | cuMemcpyDtoDAsync_v2_ptsz;
    "cuMemcpyPeer" 4000 cuMemcpyPeer | cuMemcpyPeer_ptds;
    "cuMemcpyPeerAsync" 4000 cuMemcpyPeerAsync | cuMemcpyPeerAsync_ptsz;
    "cuMemsetD8" 3020 cuMemsetD8_v2 | cuMemsetD8_v2_ptds;
    "cuMemsetD32" 3020 cuMemsetD32_v2 | cuMemsetD32_v2_ptds;
    "cuMemsetD8Async" 3020 cuMemsetD8Async | cuMemsetD8Async_ptsz;
    "cuMemsetD32Async" 3020 cuMemsetD32Async | cuMemsetD32Async_ptsz;
    "cuModuleLoadData" 2000 cuModuleLoadData;
    "cuModuleLoadDataEx" 2010 cuModuleLoadDataEx;
    "cuModuleUnload" 2000 cuModuleUnload;
    "cuModuleGetFunction" 2000 cuModuleGetFunction;
    "cuModuleGetLoadingMode" 11070 cuModuleGetLoadingMode;
    "cuLibraryLoadData" 12000 cuLibraryLoadData;
    "cuLibraryUnload" 12000 cuLibraryUnload;
    "cuLibraryGetKernel" 12000 cuLibraryGetKernel;
    "cuModuleGetGlobal" 3020 cuModuleGetGlobal_v2;
    "cuLibraryGetGlobal" 12000 cuLibraryGetGlobal;
    "cuKernelGetFunction" 12000 cuKernelGetFunction;
    "cuFuncGetParamInfo" 12040 cuFuncGetParamInfo;
    "cuKernelGetParamInfo" 12040 cuKernelGetParamInfo;
    "cuCtxGetStreamPriorityRange" 5050 cuCtxGetStreamPriorityRange;
    "cuCtxGetLimit" 3010 cuCtxGetLimit;
    "cuCtxSetLimit" 3010 cuCtxSetLimit;
    "cuFuncGetAttribute" 2020 cuFuncGetAttribute;
    "cuFuncSetAttribute" 9000 cuFuncSetAttribute;
    "cuKernelGetAttribute" 12000 cuKernelGetAttribute;
    "cuKernelSetAttribute" 12000 cuKernelSetAttribute;
    "cuOccupancyMaxActiveBlocksPerMultiprocessor" 6050 cuOccupancyMaxActiveBlocksPerMultiprocessor;
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" 7000 cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags;
    "cuOccupancyAvailableDynamicSMemPerBlock" 10020 cuOccupancyAvailableDynamicSMemPerBlock;
    "cuOccupancyMaxActiveClusters" 11070 cuOccupancyMaxActiveClusters;
    "cuLaunchKernel" 4000 cuLaunchKernel | cuLaunchKernel_ptsz;
    "cuLaunchKernelEx" 11060 cuLaunchKernelEx | cuLaunchKernelEx_ptsz;
    "cuStreamCreate" 2000 cuStreamCreate;
    "cuStreamCreateWithPriority" 5050 cuStreamCreateWithPriority;
    "cuStreamDestroy" 4000 cuStreamDestroy_v2;
    "cuStreamSynchronize" 2000 cuStreamSynchronize | cuStreamSynchronize_ptsz;
    "cuStreamQuery" 2000 cuStreamQuery | cuStreamQuery_ptsz;
    "cuStreamWaitEvent" 3020 cuStreamWaitEvent | cuStreamWaitEvent_ptsz;
    "cuStreamGetFlags" 5050 cuStreamGetFlags | cuStreamGetFlags_ptsz;
    "cuStreamGetPriority" 5050 cuStreamGetPriority | cuStreamGetPriority_ptsz;
    "cuStreamBeginCapture" 10000 cuStreamBeginCapture | cuStreamBeginCapture_ptsz;
    "cuStreamBeginCapture" 10010 cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz;
    "cuStreamEndCapture" 10000 cuStreamEndCapture | cuStreamEndCapture_ptsz;
    "cuStreamIsCapturing" 10000 cuStreamIsCapturing | cuStreamIsCapturing_ptsz;
    "cuStreamGetCaptureInfo" 10010 cuStreamGetCaptureInfo | cuStreamGetCaptureInfo_ptsz;
    "cuStreamGetCaptureInfo" 11030 cuStreamGetCaptureInfo_v2 | cuStreamGetCaptureInfo_v2_ptsz;
    "cuStreamGetCaptureInfo" 12030 cuStreamGetCaptureInfo_v3 | cuStreamGetCaptureInfo_v3_ptsz;
    "cuThreadExchangeStreamCaptureMode" 10010 cuThreadExchangeStreamCaptureMode;
    "cuGraphInstantiate" 10000 cuGraphInstantiate;
    "cuGraphInstantiate" 11000 cuGraphInstantiate_v2;
    "cuGraphInstantiate" 12000 cuGraphInstantiateWithFlags;
    "cuGraphInstantiateWithFlags" 11040 cuGraphInstantiateWithFlags;
    "cuGraphInstantiateWithParams" 12000 cuGraphInstantiateWithParams | cuGraphInstantiateWithParams_ptsz;
    "cuGraphUpload" 11010 cuGraphUpload | cuGraphUpload_ptsz;
    "cuGraphLaunch" 10000 cuGraphLaunch | cuGraphLaunch_ptsz;
    "cuGraphGetNodes" 10000 cuGraphGetNodes;
    "cuGraphDestroy" 10000 cuGraphDestroy;
    "cuGraphExecDestroy" 10000 cuGraphExecDestroy;
    "cuEventCreate" 2000 cuEventCreate;
    "cuEventRecord" 2000 cuEventRecord | cuEventRecord_ptsz;
    "cuEventRecordWithFlags" 11010 cuEventRecordWithFlags | cuEventRecordWithFlags_ptsz;
    "cuEventSynchronize" 2000 cuEventSynchronize;
    "cuEventQuery" 2000 cuEventQuery;
    "cuEventElapsedTime" 2000 cuEventElapsedTime;
    "cuEventElapsedTime" 12080 cuEventElapsedTime_v2;
    "cuEventDestroy" 4000 cuEventDestroy_v2;
    "cuGetErrorName" 6000 cuGetErrorName;
    "cuGetErrorString" 6000 cuGetErrorString;
    "cuGetProcAddress" 11030 cuGetProcAddress;
    "cuGetProcAddress" 12000 cuGetProcAddress_v2;
    "cuGetExportTable" 3000 cuGetExportTable;
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

/// # Safety
/// `symbol` must be NULL or a NUL-terminated string; `pfn` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    entry("cuGetProcAddress", || {
        get_proc_address(
            symbol,
            pfn,
            version,
            flags,
            std::ptr::null_mut(),
            Form::First,
        )
    })
}

/// # Safety
/// As `cuGetProcAddress`; `status` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    entry("cuGetProcAddress_v2", || {
        get_proc_address(symbol, pfn, version, flags, status, Form::WithStatus)
    })
}

/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: u32, out: *mut *const c_char) -> CUresult {
    entry("cuGetErrorName", || {
        let s = errors::name(error);
        // SAFETY: the caller guarantees a non-null `out` is writable.
        unsafe { put(out, s.unwrap_or(std::ptr::null())) }?;
        s.map(drop).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    })
}

/// # Safety
/// `out` must be NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: u32, out: *mut *const c_char) -> CUresult {
    entry("cuGetErrorString", || {
        let s = errors::description(error);
        // SAFETY: the caller guarantees a non-null `out` is writable.
        unsafe { put(out, s.unwrap_or(std::ptr::null())) }?;
        s.map(drop).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
