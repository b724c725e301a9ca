//! Client graphs: a client stream's work captured with `cuStreamBeginCapture`, instantiated and
//! launched into one of the client's streams with `cuGraphLaunch`.
//!
//! Capture runs in relaxed mode: a session thread serves other clients while one of its client's
//! streams captures, and their calls must not be refused or swept into the capture. Capture
//! happens on the client's stream in its current SM partition, and a launch goes into the
//! client's own stream, so the graph's work runs with that stream's priority and on the
//! client's SMs, as the stream's other work does. Kernel nodes may keep the green context they
//! were captured in, so a graph keeps that partition alive as long as it lives.

use cudarc::driver::result;
use cudarc::driver::sys;
use mps_core::Result;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::CudaBackend;
use super::partition::Partition;
use super::stream::CudaStream;
use crate::backend::Op;
use mps_driver::{Call, Graph, GraphExec, check_on};

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
    raw: Graph,
    keep: Arc<Keep>,
}

/// An executable graph, with what its nodes refer to.
#[derive(Debug)]
pub struct CudaGraphExec {
    pub(super) raw: GraphExec,
    _keep: Arc<Keep>,
}

impl CudaBackend {
    pub(super) fn begin_capture(&self, stream: &CudaStream) -> Result<()> {
        self.ctx.enter()?;
        // Move to the client's current partition now: a capturing stream cannot be replaced.
        self.follow_client(stream)?;
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
        // SAFETY: a live stream that is capturing.
        let r = unsafe { result::stream::end_capture(stream.raw.get()) };
        stream.capturing.store(false, Ordering::Release);
        let raw = self.ctx.check(r.call_on("cuStreamEndCapture", || {
            format!("a stream of client {}", stream.client)
        }))?;
        Ok(CudaGraph {
            // SAFETY: the capture made this graph, which nothing else destroys.
            raw: unsafe { Graph::from_raw(raw) },
            keep: Arc::new(keep),
        })
    }

    pub(super) fn instantiate(&self, graph: &CudaGraph) -> Result<CudaGraphExec> {
        self.ctx.enter()?;
        let flags = sys::CUgraphInstantiate_flags(0);
        // SAFETY: a live captured graph.
        let r = unsafe { result::graph::instantiate(graph.raw.raw(), flags) };
        let raw = self
            .ctx
            .check(r.call_on("cuGraphInstantiateWithFlags", || {
                format!(
                    "a graph of {} kernel launches and host copies",
                    graph.keep.ops.len()
                )
            }))?;
        Ok(CudaGraphExec {
            // SAFETY: made here, destroyed by nothing else.
            raw: unsafe { GraphExec::from_raw(raw) },
            _keep: graph.keep.clone(),
        })
    }
}
