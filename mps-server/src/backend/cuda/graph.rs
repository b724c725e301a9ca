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

/// What a stream's capture has recorded so far: what its commands refer to, and how many
/// there were (each a node of a capture of copies, memsets and launches).
#[derive(Debug, Default)]
pub(super) struct Captured {
    pub(super) keep: Vec<Op<'static, CudaBackend>>,
    pub(super) ops: usize,
}

/// What a graph's nodes refer to: kernels (and so their modules), host buffers, and the SM
/// partition they were captured in; and the number of operations captured.
#[derive(Debug)]
struct Keep {
    _ops: Vec<Op<'static, CudaBackend>>,
    captured: usize,
    _partition: Option<Arc<Partition>>,
}

/// A captured graph, with what its nodes refer to.
#[derive(Debug)]
pub struct CudaGraph {
    raw: Arc<Graph>,
    keep: Arc<Keep>,
    ctx: CaptureCtx,
}

/// A node of a captured graph.
#[derive(Clone, Copy, Debug)]
struct Node(sys::CUgraphNode);

// SAFETY: a node handle is an identifier the driver accepts from any thread; it is used only
// while the graph that owns it is alive (the executable graph holds that graph).
unsafe impl Send for Node {}
// SAFETY: as above; nothing is reached through it but driver calls.
unsafe impl Sync for Node {}

/// A node as the graph holds it, read at its first update: a kernel node's launch (kernel,
/// context; an update gives it geometry and parameters), or a memset node's (an update gives it
/// destination and value).
#[derive(Clone, Copy, Debug)]
enum NodeBase {
    Kernel(sys::CUDA_KERNEL_NODE_PARAMS),
    Memset(sys::CUDA_MEMSET_NODE_PARAMS),
}

// SAFETY: plain data naming driver objects (the kernel, its context) and device addresses,
// which the driver accepts from any thread; a kernel's parameter pointers are cleared before
// it is used.
unsafe impl Send for NodeBase {}
// SAFETY: as above; it is only read once set.
unsafe impl Sync for NodeBase {}

/// The context a graph's work was captured in (the green context of the client's partition,
/// or the server's), which a memset node's update must name again.
#[derive(Clone, Copy, Debug)]
struct CaptureCtx(sys::CUcontext);

// SAFETY: a context handle the driver accepts from any thread; the graph keeps its partition,
// and so the context, alive.
unsafe impl Send for CaptureCtx {}
// SAFETY: as above.
unsafe impl Sync for CaptureCtx {}

/// An executable graph, with what its nodes refer to, the graph it was made from and that
/// graph's nodes in the order of the operations captured (empty where the capture was not one
/// chain of them): updating a node names the node of the graph. Each updated node is read from
/// the graph at its first update only.
#[derive(Debug)]
pub struct CudaGraphExec {
    pub(super) raw: GraphExec,
    _keep: Arc<Keep>,
    _graph: Arc<Graph>,
    ctx: CaptureCtx,
    nodes: Vec<(Node, OnceLock<NodeBase>)>,
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
        *stream.capture.borrow_mut() = Some(Captured::default());
        Ok(())
    }

    pub(super) fn end_capture(&self, stream: &CudaStream) -> Result<CudaGraph> {
        self.ctx.bind();
        let captured = stream.capture.borrow_mut().take().unwrap_or_default();
        let keep = Keep {
            _ops: captured.keep,
            captured: captured.ops,
            _partition: stream.partition.borrow().clone(),
        };
        let ctx = self.capture_ctx(stream);
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
            ctx,
        })
    }

    /// The context `stream`'s work runs in: its partition's green context, as a context, or
    /// the server's, from the partition the stream was made in. Null if the driver refuses the
    /// conversion: a memset node's update then fails with the driver's reason, and the graph is
    /// dropped.
    fn capture_ctx(&self, stream: &CudaStream) -> CaptureCtx {
        let Some(p) = stream.partition.borrow().clone() else {
            return CaptureCtx(self.ctx.raw());
        };
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: a live green context (the stream keeps its partition alive); `ctx` is
        // writable, and stays null on failure.
        let r = unsafe { sys::cuCtxFromGreenCtx(&mut ctx, p.green) };
        if r != sys::CUresult::CUDA_SUCCESS {
            ctx = std::ptr::null_mut();
        }
        CaptureCtx(ctx)
    }

    pub(super) fn instantiate(&self, graph: &CudaGraph) -> Result<CudaGraphExec> {
        self.ctx.enter()?;
        let flags = sys::CUgraphInstantiate_flags(0);
        // SAFETY: a live captured graph.
        let r = exclusive(|| unsafe { result::graph::instantiate(graph.raw.raw(), flags) });
        let raw = self
            .ctx
            .check(r.call_on("cuGraphInstantiateWithFlags", || {
                format!("a graph of {} captured operations", graph.keep.captured)
            }))?;
        Ok(CudaGraphExec {
            // SAFETY: made here, destroyed by nothing else.
            raw: unsafe { GraphExec::from_raw(raw) },
            _keep: graph.keep.clone(),
            _graph: graph.raw.clone(),
            ctx: graph.ctx,
            nodes: chain(graph.raw.raw(), graph.keep.captured)
                .unwrap_or_default()
                .into_iter()
                .map(|n| (n, OnceLock::new()))
                .collect(),
        })
    }

    pub(super) fn update(
        &self,
        exec: &CudaGraphExec,
        index: usize,
        op: &Op<'_, CudaBackend>,
    ) -> Result<()> {
        let what = || format!("operation {index} of a batched run's graph");
        let (node, base) = exec.nodes.get(index).ok_or_else(|| {
            mps_core::Error::invalid_value(format!(
                "operation {index} of the graph is not a node of one captured chain"
            ))
        })?;
        self.ctx.enter()?;
        let base = match base.get() {
            Some(b) => *b,
            None => {
                let read = self.read_node(*node, op, what)?;
                *base.get_or_init(|| read)
            }
        };
        let (r, call) = match (base, op) {
            (NodeBase::Kernel(mut p), Op::Launch(l)) => {
                // As a launch does: the capture may not have needed the kernel's opt-in.
                self.opt_in_for(&l.function, l.shared_mem)?;
                // The node keeps its kernel and context; geometry, shared memory and the
                // parameters (packed, as a launch passes them) are the run's.
                let (g, b) = (l.grid, l.block);
                (p.gridDimX, p.gridDimY, p.gridDimZ) = (g.x, g.y, g.z);
                (p.blockDimX, p.blockDimY, p.blockDimZ) = (b.x, b.y, b.z);
                p.sharedMemBytes = l.shared_mem;
                let r = with_packed_params(&l.params, |extra| {
                    p.extra = extra;
                    // SAFETY: `exec` was instantiated from the graph that holds `node`, a
                    // kernel node; the packed buffer has the kernel's layout (the session
                    // checked the launch against the one it replaces) and is copied by the
                    // driver during the call, within `extra`'s life.
                    unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec.raw.raw(), node.0, &p) }
                });
                (r, "cuGraphExecKernelNodeSetParams")
            }
            (NodeBase::Memset(mut p), Op::Memset(f))
                if (p.elementSize, p.width, p.height)
                    == (u32::from(f.elem_size), f.count as usize, 1) =>
            {
                // A 1-byte memset fills with the value's low byte, as the direct path passes it.
                let value = if f.elem_size == 1 {
                    f.value & 0xff
                } else {
                    f.value
                };
                (p.dst, p.value) = (f.dst, value);
                // SAFETY: as above, for a memset node of the same size; the destination was
                // checked against the client's allocations, all made in the server's context,
                // and the node is named the context its stream ran in. CUDA refuses a
                // destination of another kind of allocation than the node's (device memory
                // against a module's global or a mapping of the client's own): the update then
                // fails, and the graph is dropped.
                let r = unsafe {
                    sys::cuGraphExecMemsetNodeSetParams(exec.raw.raw(), node.0, &p, exec.ctx.0)
                };
                (r, "cuGraphExecMemsetNodeSetParams")
            }
            _ => {
                return Err(mps_core::Error::invalid_value(format!(
                    "{} cannot take the run's work: it is another kind of node",
                    what()
                )));
            }
        };
        self.ctx.check(check_on(r, call, what))
    }

    /// The node as the graph holds it, read as the kind of node `op` would update.
    fn read_node(
        &self,
        node: Node,
        op: &Op<'_, CudaBackend>,
        what: impl Fn() -> String,
    ) -> Result<NodeBase> {
        match op {
            Op::Launch(_) => {
                // SAFETY: a plain C struct, all zero is valid; filled in by the driver below.
                let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: a node of a live graph (the executable graph holds it); `p` is
                // writable. The driver refuses a node of another kind.
                let r = unsafe { sys::cuGraphKernelNodeGetParams_v2(node.0, &mut p) };
                self.ctx
                    .check(check_on(r, "cuGraphKernelNodeGetParams", what))?;
                // Updates pass parameters packed, as a launch does.
                p.kernelParams = std::ptr::null_mut();
                p.extra = std::ptr::null_mut();
                Ok(NodeBase::Kernel(p))
            }
            Op::Memset(_) => {
                // SAFETY: as above.
                let mut p: sys::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
                // SAFETY: as above.
                let r = unsafe { sys::cuGraphMemsetNodeGetParams(node.0, &mut p) };
                self.ctx
                    .check(check_on(r, "cuGraphMemsetNodeGetParams", what))?;
                Ok(NodeBase::Memset(p))
            }
            _ => Err(mps_core::Error::invalid_value(format!(
                "{}: only kernel launches and memsets are given new work",
                what()
            ))),
        }
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
