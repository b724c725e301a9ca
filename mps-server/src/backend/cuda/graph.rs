//! Client graphs: a client stream's work captured with `cuStreamBeginCapture`, instantiated and
//! launched into one of the client's streams with `cuGraphLaunch`.
//!
//! Capture runs in relaxed mode: a session thread serves other clients while one of its client's
//! streams captures, and their calls must not be refused or swept into the capture. Capture
//! happens on the client's stream in its current SM partition, and a launch goes into the
//! client's own stream, so the graph's work runs with that stream's priority and on the
//! client's SMs, as the stream's other work does. Kernel nodes may keep the green context they
//! were captured in, so a graph keeps that partition alive as long as it lives.

use cudarc::driver::sys::{self, CUgraph, CUgraphExec};
use mps_core::Result;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::CudaBackend;
use super::partition::Partition;
use super::stream::CudaStream;
use crate::backend::Op;
use mps_driver::{check_on, released};

/// What a graph's nodes refer to: kernels (and so their modules), host buffers, and the SM
/// partition they were captured in.
#[derive(Debug)]
struct Keep {
    ops: Vec<Op<'static, CudaBackend>>,
    _partition: Option<Arc<Partition>>,
}

/// A captured graph, with what its nodes refer to.
#[derive(Debug)]
pub struct CudaGraph {
    raw: CUgraph,
    keep: Arc<Keep>,
}

/// An executable graph, with what its nodes refer to.
#[derive(Debug)]
pub struct CudaGraphExec {
    pub(super) raw: CUgraphExec,
    _keep: Arc<Keep>,
}

// SAFETY: driver graph handles may be used from any thread once the context is current there
// (every entry point binds it first); the session keeps a graph in its table and uses it from
// one thread at a time.
unsafe impl Send for CudaGraph {}
// SAFETY: as above; an executable graph is only launched (cuGraphLaunch is thread-safe for
// launches into different streams) and destroyed once, when its last reference goes.
unsafe impl Send for CudaGraphExec {}
// SAFETY: see `Send`.
unsafe impl Sync for CudaGraphExec {}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: made by cuStreamEndCapture and destroyed once; executable graphs made from it
        // do not need it.
        released(unsafe { sys::cuGraphDestroy(self.raw) }, "cuGraphDestroy");
    }
}

impl Drop for CudaGraphExec {
    fn drop(&mut self) {
        // SAFETY: made by cuGraphInstantiateWithFlags and destroyed once; a launch still in
        // flight completes first (the driver frees it then).
        released(
            unsafe { sys::cuGraphExecDestroy(self.raw) },
            "cuGraphExecDestroy",
        );
    }
}

impl CudaBackend {
    pub(super) fn begin_capture(&self, stream: &CudaStream) -> Result<()> {
        self.ctx.bind();
        self.ctx.alive()?;
        // Move to the client's current partition now: a capturing stream cannot be replaced.
        self.follow_placement(stream)?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // The busy sampler must not query the stream while it captures.
        let r = self.live.begin_capture(&stream.capturing, || {
            // SAFETY: a live stream of the client that is not capturing (the session checks).
            unsafe { sys::cuStreamBeginCapture_v2(stream.raw.get(), mode) }
        });
        if r != sys::CUresult::CUDA_SUCCESS {
            stream.capturing.store(false, Ordering::Release);
        }
        self.ctx.check(check_on(r, "cuStreamBeginCapture", || {
            format!("a stream of client {}", stream.client)
        }))?;
        *stream.capture.borrow_mut() = Some(Vec::new());
        Ok(())
    }

    pub(super) fn end_capture(&self, stream: &CudaStream) -> Result<CudaGraph> {
        self.ctx.bind();
        let keep = Keep {
            ops: stream.capture.borrow_mut().take().unwrap_or_default(),
            _partition: stream.partition.borrow().clone(),
        };
        let mut raw: CUgraph = std::ptr::null_mut();
        // SAFETY: a live stream that is capturing; writes one graph handle.
        let r = unsafe { sys::cuStreamEndCapture(stream.raw.get(), &mut raw) };
        stream.capturing.store(false, Ordering::Release);
        self.ctx.check(check_on(r, "cuStreamEndCapture", || {
            format!("a stream of client {}", stream.client)
        }))?;
        Ok(CudaGraph {
            raw,
            keep: Arc::new(keep),
        })
    }

    pub(super) fn instantiate(&self, graph: &CudaGraph) -> Result<CudaGraphExec> {
        self.ctx.bind();
        self.ctx.alive()?;
        let mut raw: CUgraphExec = std::ptr::null_mut();
        // SAFETY: a live captured graph; writes one executable graph handle.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, graph.raw, 0) };
        self.ctx
            .check(check_on(r, "cuGraphInstantiateWithFlags", || {
                format!(
                    "a graph of {} kernel launches and host copies",
                    graph.keep.ops.len()
                )
            }))?;
        Ok(CudaGraphExec {
            raw,
            _keep: graph.keep.clone(),
        })
    }
}
