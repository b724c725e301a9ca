//! Plans of graphs built node by node: what an instantiation runs, and what the updates of an
//! executable graph edit.
//!
//! A plan is the graph's nodes in a topological order (the order they were added, where the
//! edges allow), built child graphs inlined. Its instantiation captures each run of its work
//! between captured child graphs, one node after another, in an internal stream of its device,
//! through the launches, memsets and copies other work takes, and instantiates the server's graph
//! of that capture; each captured child graph is instantiated as it is; a launch runs them one
//! after another in its stream. Each node so runs after every node before it in the order, its
//! dependencies among them, and a launch is ordered in its stream as a whole: CUDA's ordering
//! holds, but independent branches of a graph are serialised instead of running side by side.
//! While an instantiation's capture is open (two round trips to the server), another thread's
//! synchronisation of the whole device, or free or mapping of memory, waits for it to end
//! (`Connection::internal_capture`), since during a capture the server would refuse it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use crate::abi::{CUdevice, CUresult};
use crate::connection::{Connection, GraphExec, Res, Stream};
use crate::context::current;
use crate::driver::connection;
use crate::ffi::lock;
use crate::graph_build::{GraphKind, ServerGraph, graph, ordered};
use crate::graph_node::{Work, kept, same_kind, submit};
use crate::log;

/// Each device's internal stream, where plans are captured (one at a time).
static STAGES: LazyLock<Mutex<HashMap<CUdevice, Stream>>> = LazyLock::new(Mutex::default);

/// A graph's nodes in the order they are run, child graphs inlined: what an executable graph
/// is made from, and what its updates edit.
#[derive(Clone, Debug, Default)]
pub(crate) struct Plan {
    steps: Vec<Step>,
}

#[derive(Clone, Debug)]
struct Step {
    /// The node it is, of the graph the plan was made from (or of a child graph of it).
    node: usize,
    what: Planned,
}

#[derive(Clone, Debug)]
enum Planned {
    Work(Work),
    /// A built child graph, inlined.
    Child(Vec<Step>),
    /// A captured child graph: the server's, run as it is.
    Server(Arc<ServerGraph>),
}

/// One thing a plan runs, in order: work of this library's, or a graph of the server's.
enum Item<'a> {
    Work(&'a Work),
    Server(&'a Arc<ServerGraph>),
}

/// The plan of built graph `g` (a captured one is refused with `what`).
pub(crate) fn plan(g: usize, what: &str) -> Res<Plan> {
    Ok(Plan {
        steps: steps_of(g, what)?,
    })
}

fn steps_of(g: usize, what: &str) -> Res<Vec<Step>> {
    ordered(g, what)?
        .into_iter()
        .map(|(node, work)| {
            let what = match work {
                Work::Child(c) => match &graph(c)?.kind {
                    GraphKind::Captured(cap) => Planned::Server(cap.server.clone()),
                    GraphKind::Built(_) => Planned::Child(steps_of(c, what)?),
                },
                w => Planned::Work(w),
            };
            Ok(Step { node, what })
        })
        .collect()
}

/// Every step's work and server graphs, child graphs' inlined, in order.
fn each_item<'a>(steps: &'a [Step], f: &mut impl FnMut(Item<'a>) -> Res<()>) -> Res<()> {
    for s in steps {
        match &s.what {
            Planned::Work(w) => f(Item::Work(w))?,
            Planned::Child(c) => each_item(c, f)?,
            Planned::Server(g) => f(Item::Server(g))?,
        }
    }
    Ok(())
}

/// The step of `node`, child graphs' searched too.
fn find(steps: &mut [Step], node: usize) -> Option<&mut Step> {
    for s in steps {
        if s.node == node {
            return Some(s);
        }
        if let Planned::Child(c) = &mut s.what
            && let Some(found) = find(c, node)
        {
            return Some(found);
        }
    }
    None
}

/// Where two plans' steps differ in shape (a node of another type, or another number of
/// nodes): the `CUgraphExecUpdateResult` and the node of `old` it is about (0: none). A captured
/// child graph's shape is the server's, and not compared.
fn shape_differs(old: &[Step], new: &[Step]) -> Option<(u32, usize)> {
    use crate::abi::graph::{UPDATE_NODE_TYPE_CHANGED, UPDATE_TOPOLOGY_CHANGED};
    if old.len() != new.len() {
        return Some((UPDATE_TOPOLOGY_CHANGED, 0));
    }
    for (o, n) in old.iter().zip(new) {
        match (&o.what, &n.what) {
            (Planned::Work(a), Planned::Work(b)) if same_kind(a, b) => {}
            (Planned::Server(_), Planned::Server(_)) => {}
            (Planned::Child(a), Planned::Child(b)) => {
                if let Some(d) = shape_differs(a, b) {
                    return Some(d);
                }
            }
            _ => return Some((UPDATE_NODE_TYPE_CHANGED, o.node)),
        }
    }
    None
}

/// `new`'s work in `old`'s steps, which keep their node handles.
fn take_work(old: &mut [Step], new: Vec<Step>) {
    for (o, n) in old.iter_mut().zip(new) {
        match (&mut o.what, n.what) {
            (Planned::Child(a), Planned::Child(b)) => take_work(a, b),
            (what, w) => *what = w,
        }
    }
}

impl Plan {
    /// The device its work runs on; `CUDA_ERROR_NOT_SUPPORTED` for work on several.
    fn device(&self) -> Res<Option<CUdevice>> {
        let mut device = None;
        each_item(&self.steps, &mut |item| {
            let here = match item {
                Item::Work(w) => w.device(),
                Item::Server(g) => Some(g.conn.ordinal()),
            };
            match (device, here) {
                (_, None) => {}
                (None, d) => device = d,
                (Some(a), Some(b)) if a != b => {
                    log::once("graph on several devices", || {
                        "a graph whose nodes run on several devices is not supported through \
                         mps; returning CUDA_ERROR_NOT_SUPPORTED"
                            .into()
                    });
                    return Err(CUresult::CUDA_ERROR_NOT_SUPPORTED);
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(device)
    }

    /// Replaces the work of node `node` with `work`, of the same kind and device. Like every
    /// edit of a plan, it checks all it needs before it changes anything.
    pub(crate) fn set(&mut self, node: usize, work: Work) -> Res<()> {
        let step = find(&mut self.steps, node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        match &mut step.what {
            Planned::Work(old) if same_kind(old, &work) && old.device() == work.device() => {
                *old = kept(old, work);
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Replaces the work of child-graph node `node` with that of graph `child`, which must be
    /// of the same kind and, built, of the same shape.
    pub(crate) fn set_child(&mut self, node: usize, child: usize) -> Res<()> {
        let step = find(&mut self.steps, node).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        match (&mut step.what, &graph(child)?.kind) {
            (Planned::Server(old), GraphKind::Captured(c)) => {
                *old = c.server.clone();
                Ok(())
            }
            (Planned::Child(steps), GraphKind::Built(_)) => {
                let new = steps_of(child, "a child graph's update")?;
                if shape_differs(steps, &new).is_some() {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                }
                take_work(steps, new);
                Ok(())
            }
            _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
        }
    }

    /// Takes the work of `new`, a plan of the same shape, keeping this plan's node handles;
    /// where the shapes differ, the `CUgraphExecUpdateResult` and the node it is about.
    pub(crate) fn update_from(&mut self, new: Plan) -> Result<(), (u32, usize)> {
        if let Some(d) = shape_differs(&self.steps, &new.steps) {
            return Err(d);
        }
        take_work(&mut self.steps, new.steps);
        Ok(())
    }

    /// The server's executable graphs of this plan, on its device (the current context's where
    /// it has no work), which a launch runs one after another in its stream: each run of this
    /// library's work captured in order in the device's internal stream, and each captured child
    /// graph instantiated as it is.
    pub(crate) fn instantiate(&self) -> Res<(&'static Connection, Vec<GraphExec>)> {
        let device = match self.device()? {
            Some(d) => d,
            None => current()?.device,
        };
        let conn = connection(device)?;
        let mut execs = Vec::new();
        let mut run: Vec<&Work> = Vec::new();
        let mut made = each_item(&self.steps, &mut |item| match item {
            Item::Work(w) => {
                run.push(w);
                Ok(())
            }
            Item::Server(g) => {
                if !run.is_empty() {
                    execs.push(instantiate_run(conn, &std::mem::take(&mut run))?);
                }
                execs.push(conn.graph_instantiate(g.graph)?);
                Ok(())
            }
        });
        // The last run; an empty graph is one empty capture, so that a launch is one.
        if made.is_ok() && (!run.is_empty() || execs.is_empty()) {
            made = instantiate_run(conn, &run).map(|x| execs.push(x));
        }
        if let Err(e) = made {
            for x in execs {
                conn.graph_exec_destroy(x)?;
            }
            return Err(e);
        }
        Ok((conn, execs))
    }
}

/// The server's executable graph of `run`, captured in order in the internal stream of `conn`'s
/// device.
fn instantiate_run(conn: &'static Connection, run: &[&Work]) -> Res<GraphExec> {
    let graph = {
        let mut stages = lock(&STAGES);
        let device = conn.ordinal();
        let stream = match stages.get(&device) {
            Some(s) => *s,
            None => *stages.entry(device).or_insert(conn.stream_create(0)?),
        };
        let (submitted, ended) = conn.internal_capture(|| {
            conn.stream_begin_capture(stream)?;
            let submitted = run.iter().try_for_each(|w| submit(w, conn, stream));
            Ok((submitted, conn.stream_end_capture(stream)))
        })?;
        match (submitted, ended) {
            (Ok(()), Ok((g, _))) => g,
            (Err(e), Ok((g, _))) => {
                conn.graph_destroy(g)?;
                return Err(e);
            }
            // The server refused a node's command (its message is logged), or failed.
            (Err(e), Err(_)) | (Ok(()), Err(e)) => return Err(e),
        }
    };
    let exec = conn.graph_instantiate(graph);
    let destroyed = conn.graph_destroy(graph);
    let exec = exec?;
    if let Err(e) = destroyed {
        conn.graph_exec_destroy(exec)?;
        return Err(e);
    }
    Ok(exec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_of_another_shape_are_not_taken_by_an_update() {
        let step = |node, what| Step { node, what };
        let empty = || Planned::Work(Work::Empty);
        let old = vec![
            step(1, empty()),
            step(2, Planned::Child(vec![step(3, empty())])),
        ];
        let same = vec![
            step(7, empty()),
            step(8, Planned::Child(vec![step(9, empty())])),
        ];
        assert_eq!(shape_differs(&old, &same), None);
        let mut plan = Plan { steps: old.clone() };
        assert_eq!(plan.update_from(Plan { steps: same }), Ok(()));
        // The updated plan keeps its own node handles.
        assert_eq!(plan.steps[1].node, 2);
        let typed = vec![step(7, Planned::Child(vec![])), step(8, empty())];
        assert_eq!(
            shape_differs(&old, &typed),
            Some((crate::abi::graph::UPDATE_NODE_TYPE_CHANGED, 1))
        );
        assert_eq!(
            shape_differs(&old, &old[..1]),
            Some((crate::abi::graph::UPDATE_TOPOLOGY_CHANGED, 0))
        );
    }
}
