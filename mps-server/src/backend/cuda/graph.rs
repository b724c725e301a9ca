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

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use super::exclusive::exclusive;
use super::partition::Partition;
use super::stream::CudaStream;
use super::{CudaBackend, with_packed_params};
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
    raw: Arc<Graph>,
    keep: Arc<Keep>,
}

/// A node of a captured graph.
#[derive(Clone, Copy, Debug)]
struct Node(sys::CUgraphNode);

// SAFETY: a node handle is an identifier the driver accepts from any thread; it is used only
// while the graph that owns it is alive (the executable graph holds that graph).
unsafe impl Send for Node {}
// SAFETY: as above; nothing is reached through it but driver calls.
unsafe impl Sync for Node {}

/// A kernel node's launch as the graph holds it (kernel, geometry, context), read once: an
/// update changes only the parameters.
#[derive(Clone, Copy, Debug)]
struct KernelBase(sys::CUDA_KERNEL_NODE_PARAMS);

// SAFETY: plain data naming driver objects (the kernel, its context), which the driver accepts
// from any thread; the parameter pointers are cleared before it is used.
unsafe impl Send for KernelBase {}
// SAFETY: as above; it is only read once set.
unsafe impl Sync for KernelBase {}

/// An executable graph, with what its nodes refer to, the graph it was made from and that
/// graph's nodes in the order of the operations captured (empty where the capture was not one
/// chain of them): updating a node's parameters names the node of the graph. Each updated
/// kernel node's launch is read from the graph at its first update only.
#[derive(Debug)]
pub struct CudaGraphExec {
    pub(super) raw: GraphExec,
    _keep: Arc<Keep>,
    _graph: Arc<Graph>,
    nodes: Vec<(Node, OnceLock<KernelBase>)>,
}

impl CudaBackend {
    pub(super) fn begin_capture(&self, stream: &CudaStream) -> Result<()> {
        self.ctx.enter()?;
        // Move to the client's current partition now: a capturing stream cannot be replaced.
        self.follow_client(stream)?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // The busy sampler must not query the stream while it captures.
        let r = self
            .live
            .begin_capture(stream.raw.get(), &stream.capturing, || {
                // SAFETY: a live stream of the client that is not capturing (the session checks).
                exclusive(|| unsafe { sys::cuStreamBeginCapture_v2(stream.raw.get(), mode) })
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
            raw: Arc::new(unsafe { Graph::from_raw(raw) }),
            keep: Arc::new(keep),
        })
    }

    pub(super) fn instantiate(&self, graph: &CudaGraph) -> Result<CudaGraphExec> {
        self.ctx.enter()?;
        let flags = sys::CUgraphInstantiate_flags(0);
        // SAFETY: a live captured graph.
        let r = exclusive(|| unsafe { result::graph::instantiate(graph.raw.raw(), flags) });
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
            _graph: graph.raw.clone(),
            nodes: chain(graph.raw.raw(), graph.keep.ops.len())
                .unwrap_or_default()
                .into_iter()
                .map(|n| (n, OnceLock::new()))
                .collect(),
        })
    }

    pub(super) fn set_params(
        &self,
        exec: &CudaGraphExec,
        index: usize,
        params: &[u8],
    ) -> Result<()> {
        let (node, base) = exec.nodes.get(index).ok_or_else(|| {
            mps_core::Error::invalid_value(format!(
                "operation {index} of the graph is not a node of one captured chain"
            ))
        })?;
        self.ctx.enter()?;
        let mut p = match base.get() {
            Some(b) => b.0,
            None => {
                // SAFETY: a plain C struct, all zero is valid; filled in by the driver below.
                let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: a kernel node of `exec.graph`, which is alive; `p` is writable.
                let r = unsafe { sys::cuGraphKernelNodeGetParams_v2(node.0, &mut p) };
                self.ctx
                    .check(check_on(r, "cuGraphKernelNodeGetParams", || {
                        format!("operation {index} of a batched run's graph")
                    }))?;
                // The node keeps its kernel, geometry and context; only the parameters change,
                // passed packed as a launch passes them.
                p.kernelParams = std::ptr::null_mut();
                p.extra = std::ptr::null_mut();
                base.get_or_init(|| KernelBase(p)).0
            }
        };
        let r = with_packed_params(params, |extra| {
            p.extra = extra;
            // SAFETY: `exec` was instantiated from `exec.graph`, which holds `node`; the packed
            // buffer has the kernel's layout (the session checked it against the launch it
            // replaces) and is copied by the driver during the call, within `extra`'s life.
            unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec.raw.raw(), node.0, &p) }
        });
        self.ctx
            .check(check_on(r, "cuGraphExecKernelNodeSetParams", || {
                format!("operation {index} of a batched run's graph")
            }))
    }
}

/// The nodes of `graph` from its root on, if it is one chain of `ops` nodes, as a capture of
/// one stream's copies, memsets and launches is.
fn chain(graph: sys::CUgraph, ops: usize) -> Option<Vec<Node>> {
    let mut nodes = Vec::with_capacity(ops);
    let mut count = 1usize;
    let mut next: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: a live graph; room for the one root asked for.
    let r = unsafe { sys::cuGraphGetRootNodes(graph, &mut next, &mut count) };
    if r != sys::CUresult::CUDA_SUCCESS || count != 1 {
        return None;
    }
    loop {
        nodes.push(Node(next));
        if nodes.len() > ops {
            return None;
        }
        let mut count = 0usize;
        // SAFETY: a node of the live graph; a null array asks for the count alone.
        let r = unsafe {
            sys::cuGraphNodeGetDependentNodes_v2(
                next,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut count,
            )
        };
        match (r, count) {
            (sys::CUresult::CUDA_SUCCESS, 0) => break,
            (sys::CUresult::CUDA_SUCCESS, 1) => {}
            _ => return None,
        }
        let node = next;
        // SAFETY: as above, with room for its one dependent.
        let r = unsafe {
            sys::cuGraphNodeGetDependentNodes_v2(node, &mut next, std::ptr::null_mut(), &mut count)
        };
        if r != sys::CUresult::CUDA_SUCCESS || count != 1 {
            return None;
        }
    }
    (nodes.len() == ops).then_some(nodes)
}
