//! Every other function of the driver API that programs are known to look for (the union of
//! the names the traces in docs/TRANSPARENT.md show cudart, cuBLAS and PyTorch asking for, and
//! the versioned symbols of common ones, and the virtual-memory, multicast and green-context
//! functions that PyTorch's c10 looks up all at once, failing if any is missing, before it
//! uses any): each is exported under its own name and handed out by
//! `cuGetProcAddress`, and returns `CUDA_ERROR_NOT_SUPPORTED`, saying so once per name.
//!
//! A stub takes no parameters: under the C calling convention the caller's arguments are simply
//! left unread, so one signature serves every function.

use crate::abi::CUresult;
use crate::log;

fn unsupported(name: &str) -> CUresult {
    log::once(name, || {
        format!("{name} is not supported through mps; returning CUDA_ERROR_NOT_SUPPORTED")
    });
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// A stub's type.
pub(crate) type Stub = extern "C" fn() -> CUresult;

macro_rules! unsupported {
    ($($name:ident)*) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> CUresult {
                unsupported(stringify!($name))
            }
        )*
        /// Each stub by name.
        pub(crate) const STUBS: &[(&str, Stub)] = &[$((stringify!($name), $name as Stub),)*];
    };
}

unsupported! {
    cuArray3DCreate
    cuArray3DGetDescriptor
    cuArrayCreate
    cuArrayDestroy
    cuArrayGetDescriptor
    cuArrayGetMemoryRequirements
    cuArrayGetPlane
    cuArrayGetSparseProperties
    cuCtxDetach
    cuCtxFromGreenCtx
    cuCtxGetCacheConfig
    cuCtxGetSharedMemConfig
    cuCtxResetPersistingL2Cache
    cuCtxSetCacheConfig
    cuCtxSetSharedMemConfig
    cuDestroyExternalMemory
    cuDestroyExternalSemaphore
    cuDevResourceGenerateDesc
    cuDevSmResourceSplitByCount
    cuDeviceGetDevResource
    cuDeviceGetGraphMemAttribute
    cuDeviceGetHostAtomicCapabilities
    cuDeviceGetNvSciSyncAttributes
    cuDeviceGetP2PAtomicCapabilities
    cuDeviceGetP2PAttribute
    cuDeviceGetTexture1DLinearMaxWidth
    cuDeviceGraphMemTrim
    cuDeviceRegisterAsyncNotification
    cuDeviceSetGraphMemAttribute
    cuDeviceUnregisterAsyncNotification
    cuEGLStreamConsumerAcquireFrame
    cuEGLStreamConsumerConnect
    cuEGLStreamConsumerConnectWithFlags
    cuEGLStreamConsumerDisconnect
    cuEGLStreamConsumerReleaseFrame
    cuEGLStreamProducerConnect
    cuEGLStreamProducerDisconnect
    cuEGLStreamProducerPresentFrame
    cuEGLStreamProducerReturnFrame
    cuExternalMemoryGetMappedBuffer
    cuExternalMemoryGetMappedMipmappedArray
    cuFlushGPUDirectRDMAWrites
    cuGLCtxCreate
    cuGLGetDevices
    cuGLInit
    cuGLMapBufferObject
    cuGLMapBufferObjectAsync
    cuGLRegisterBufferObject
    cuGLSetBufferObjectMapFlags
    cuGLUnmapBufferObject
    cuGLUnmapBufferObjectAsync
    cuGLUnregisterBufferObject
    cuGraphAddEventRecordNode
    cuGraphAddEventWaitNode
    cuGraphAddExternalSemaphoresSignalNode
    cuGraphAddExternalSemaphoresWaitNode
    cuGraphAddHostNode
    cuGraphAddMemAllocNode
    cuGraphAddMemFreeNode
    cuGraphConditionalHandleCreate
    cuGraphDebugDotPrint
    cuGraphEventRecordNodeGetEvent
    cuGraphEventRecordNodeSetEvent
    cuGraphEventWaitNodeGetEvent
    cuGraphEventWaitNodeSetEvent
    cuGraphExecEventRecordNodeSetEvent
    cuGraphExecEventWaitNodeSetEvent
    cuGraphExecExternalSemaphoresSignalNodeSetParams
    cuGraphExecExternalSemaphoresWaitNodeSetParams
    cuGraphExecHostNodeSetParams
    cuGraphExternalSemaphoresSignalNodeGetParams
    cuGraphExternalSemaphoresSignalNodeSetParams
    cuGraphExternalSemaphoresWaitNodeGetParams
    cuGraphExternalSemaphoresWaitNodeSetParams
    cuGraphHostNodeGetParams
    cuGraphHostNodeSetParams
    cuGraphMemAllocNodeGetParams
    cuGraphMemFreeNodeGetParams
    cuGraphNodeGetEnabled
    cuGraphNodeSetEnabled
    cuGraphReleaseUserObject
    cuGraphRetainUserObject
    cuGraphicsEGLRegisterImage
    cuGraphicsGLRegisterBuffer
    cuGraphicsGLRegisterImage
    cuGraphicsMapResources
    cuGraphicsResourceGetMappedEglFrame
    cuGraphicsResourceGetMappedMipmappedArray
    cuGraphicsResourceGetMappedPointer
    cuGraphicsResourceSetMapFlags
    cuGraphicsSubResourceGetMappedArray
    cuGraphicsUnmapResources
    cuGraphicsUnregisterResource
    cuGraphicsVDPAURegisterOutputSurface
    cuGraphicsVDPAURegisterVideoSurface
    cuGreenCtxCreate
    cuGreenCtxDestroy
    cuGreenCtxStreamCreate
    cuImportExternalMemory
    cuImportExternalSemaphore
    cuIpcCloseMemHandle
    cuIpcGetEventHandle
    cuIpcGetMemHandle
    cuIpcOpenEventHandle
    cuIpcOpenMemHandle
    cuIpcOpenMemHandle_v2
    cuKernelGetLibrary
    cuKernelSetCacheConfig
    cuLaunchCooperativeKernel
    cuLibraryGetManaged
    cuLibraryGetModule
    cuLibraryGetUnifiedFunction
    cuLibraryLoadFromFile
    cuLinkAddData
    cuLinkAddData_v2
    cuLinkAddFile
    cuLinkAddFile_v2
    cuLinkComplete
    cuLinkCreate
    cuLinkCreate_v2
    cuLinkDestroy
    cuLogsCurrent
    cuLogsDumpToFile
    cuLogsDumpToMemory
    cuLogsRegisterCallback
    cuLogsUnregisterCallback
    cuMemAdvise
    cuMemAdvise_v2
    cuMemAllocManaged
    cuMemAllocPitch
    cuMemAllocPitch_v2
    cuMemDiscardAndPrefetchBatchAsync
    cuMemDiscardBatchAsync
    cuMemExportToShareableHandle
    cuMemGetAddressRange
    cuMemHostGetDevicePointer
    cuMemHostGetFlags
    cuMemHostRegister
    cuMemHostRegister_v2
    cuMemHostUnregister
    cuMemImportFromShareableHandle
    cuMemPoolExportPointer
    cuMemPoolExportToShareableHandle
    cuMemPoolImportFromShareableHandle
    cuMemPoolImportPointer
    cuMemPrefetchAsync
    cuMemPrefetchAsync_v2
    cuMemPrefetchBatchAsync
    cuMemRangeGetAttribute
    cuMemRangeGetAttributes
    cuMemcpy2DAsync
    cuMemcpy2DUnaligned
    cuMemcpy3D
    cuMemcpy3DAsync
    cuMemcpy3DAsync_v2
    cuMemcpy3DBatchAsync
    cuMemcpy3DPeer
    cuMemcpy3DPeerAsync
    cuMemcpy3D_v2
    cuMemcpyBatchAsync
    cuMemsetD16
    cuMemsetD16Async
    cuMemsetD16_v2
    cuMemsetD2D16
    cuMemsetD2D16Async
    cuMemsetD2D16_v2
    cuMemsetD2D32
    cuMemsetD2D32Async
    cuMemsetD2D32_v2
    cuMemsetD2D8
    cuMemsetD2D8Async
    cuMemsetD2D8_v2
    cuMipmappedArrayCreate
    cuMipmappedArrayDestroy
    cuMipmappedArrayGetLevel
    cuMipmappedArrayGetMemoryRequirements
    cuMipmappedArrayGetSparseProperties
    cuModuleGetGlobal
    cuModuleGetSurfRef
    cuModuleGetTexRef
    cuModuleLoadFatBinary
    cuMulticastAddDevice
    cuMulticastBindMem
    cuMulticastCreate
    cuMulticastUnbind
    cuOccupancyMaxPotentialBlockSize
    cuOccupancyMaxPotentialClusterSize
    cuProfilerInitialize
    cuProfilerStart
    cuProfilerStop
    cuSignalExternalSemaphoresAsync
    cuStreamAttachMemAsync
    cuStreamBatchMemOp
    cuStreamBatchMemOp_v2
    cuStreamCopyAttributes
    cuStreamGetAttribute
    cuStreamGetCtx
    cuStreamGetCtx_v2
    cuStreamGetDevice
    cuStreamGetId
    cuStreamSetAttribute
    cuStreamUpdateCaptureDependencies
    cuStreamWaitValue32
    cuStreamWaitValue32_v2
    cuStreamWaitValue64
    cuStreamWaitValue64_v2
    cuStreamWriteValue32
    cuStreamWriteValue32_v2
    cuStreamWriteValue64
    cuStreamWriteValue64_v2
    cuSurfObjectCreate
    cuSurfObjectDestroy
    cuSurfObjectGetResourceDesc
    cuTexObjectCreate
    cuTexObjectDestroy
    cuTexObjectGetResourceDesc
    cuTexObjectGetResourceViewDesc
    cuTexObjectGetTextureDesc
    cuUserObjectCreate
    cuUserObjectRelease
    cuUserObjectRetain
    cuVDPAUCtxCreate
    cuVDPAUGetDevice
    cuWaitExternalSemaphoresAsync
}
