//! Client graphs: capturing a stream's work, instantiating what was captured, launching and
//! destroying it.
//!
//! While a stream captures, its commands are checked as always and then recorded by the backend
//! instead of run. What a recording may hold is kept simple: copies (through host buffers, not
//! the staging area, whose bytes a replay could not see again), memsets and launches. Event
//! records and waits, graph launches and progress marks in a capturing stream are refused with
//! a message naming what is unsupported; so is waiting for the stream (as CUDA refuses it). A
//! command that fails during the capture spoils it, as in CUDA: ending the capture reports it.
//!
//! A graph keeps what its work names valid: host buffers it copies through cannot be freed
//! while it (or an executable graph made from it) exists, and the device ranges its copies and
//! memsets touch are checked again against the client's allocations at every launch.

use std::collections::HashMap;
use std::sync::Arc;

use mps_core::handle::HandleKind;
use mps_core::protocol::{Command, HostRef, Opcode, Request, flags};
use mps_core::{Error, Result, Status};

use super::{Answer, DONE, SessionCore};
use crate::backend::{Backend, Op};
use crate::session::limits::exceeded;
use crate::session::tables::ensure_room;

/// What a graph's work names besides kernels: host buffers and device ranges.
#[derive(Debug, Default)]
pub(super) struct Uses {
    host_buffers: Vec<u64>,
    /// (address, length, what) of each device range a copy or memset touches.
    device: Vec<(u64, u64, &'static str)>,
    commands: usize,
}

/// A stream that is capturing.
#[derive(Debug, Default)]
pub(super) struct Capture {
    uses: Uses,
    /// The first command that failed during the capture, and why.
    failed: Option<(u64, String)>,
}

/// A captured graph.
pub(super) struct GraphEntry<B: Backend> {
    graph: B::Graph,
    uses: Arc<Uses>,
}

/// An executable graph.
pub(super) struct ExecEntry<B: Backend> {
    exec: Arc<B::GraphExec>,
    uses: Arc<Uses>,
}

/// The client's captures and graphs.
pub(super) struct Graphs<B: Backend> {
    /// Capturing streams, by handle (0: the default stream).
    pub(super) captures: HashMap<u64, Capture>,
    pub(super) graphs: mps_core::handle::HandleTable<GraphEntry<B>>,
    pub(super) execs: mps_core::handle::HandleTable<ExecEntry<B>>,
}

impl<B: Backend> Graphs<B> {
    pub(super) fn new(limit: usize) -> Self {
        Graphs {
            captures: HashMap::new(),
            graphs: mps_core::handle::HandleTable::new(HandleKind::Graph, limit),
            execs: mps_core::handle::HandleTable::new(HandleKind::GraphExec, limit),
        }
    }

    /// Fails if a graph of the client copies through host buffer `handle`.
    pub(super) fn check_host_free(&self, handle: u64) -> Result<()> {
        let used = |u: &Uses| u.host_buffers.contains(&handle);
        let by_graph = self.graphs.iter().find(|(_, g)| used(&g.uses));
        let by_exec = self.execs.iter().find(|(_, e)| used(&e.uses));
        let by_capture = self.captures.iter().find(|(_, c)| used(&c.uses));
        let user = match (by_graph, by_exec, by_capture) {
            (Some((h, _)), _, _) => format!("graph {h}"),
            (_, Some((h, _)), _) => format!("executable graph {h}"),
            (_, _, Some((s, _))) => format!("the capture in stream {s:#x}"),
            _ => return Ok(()),
        };
        Err(Error::new(
            Status::InvalidValue,
            format!(
                "host buffer {handle:#x} is copied through by {user}; destroy the graphs that \
                 use it (and end the capture) before freeing it"
            ),
        ))
    }

    /// Fails while a stream captures: freeing memory would have to wait for the capturing
    /// stream, which cannot be waited for.
    pub(super) fn check_no_capture(&self, what: &str) -> Result<()> {
        match self.captures.keys().next() {
            Some(s) => Err(Error::invalid_value(format!(
                "cannot {what} while stream {s:#x} captures a graph (a capturing stream cannot \
                 be waited for); end the capture first"
            ))),
            None => Ok(()),
        }
    }

    /// How many graphs and executable graphs the client holds.
    pub(super) fn len(&self) -> usize {
        self.graphs.len() + self.execs.len()
    }
}

impl<B: Backend> SessionCore<B> {
    /// Checks a stream-ordered command for a capturing stream and notes what it uses; `Ok` for
    /// a stream that is not capturing.
    pub(super) fn check_capture(&mut self, cmd: &Command, req: &Request<'_>) -> Result<()> {
        let Some(capture) = self.graphs.captures.get_mut(&cmd.stream) else {
            return Ok(());
        };
        let stream = cmd.stream;
        let op = req.opcode();
        if op == Opcode::HostWait {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "a host function in a capturing stream ({stream:#x}) is not supported: a \
                     capture records copies, memsets and kernel launches of one stream"
                ),
            ));
        }
        if cmd.flags & flags::MARK != 0 || op == Opcode::Mark {
            return Err(Error::invalid_value(format!(
                "stream {stream:#x} is capturing a graph: its work is recorded, not run, so it \
                 cannot be waited for or queried (as in CUDA); end the capture first"
            )));
        }
        let unsupported = |what: &str| {
            Err(Error::new(
                Status::Unsupported,
                format!(
                    "{what} in a capturing stream ({stream:#x}) is not supported: a capture \
                     records copies, memsets and kernel launches of one stream"
                ),
            ))
        };
        match *req {
            Request::EventRecord { .. } => return unsupported("recording an event"),
            Request::StreamWaitEvent { .. } => return unsupported("waiting for an event"),
            Request::GraphLaunch { .. } => return unsupported("launching a graph"),
            Request::CopyHtoD {
                src: HostRef::Staging { .. },
                ..
            }
            | Request::CopyDtoH {
                dst: HostRef::Staging { .. },
                ..
            } => {
                return unsupported(
                    "a copy through pageable memory (the staging area; copy through a host \
                     buffer from mps_host_alloc instead)",
                );
            }
            _ => {}
        }
        if capture.uses.commands >= self.limits.max_graph_commands {
            return Err(exceeded(
                "max_graph_commands",
                format!(
                    "stream {stream:#x} already captured {} commands, the most one graph may hold",
                    capture.uses.commands
                ),
            ));
        }
        let uses = &mut capture.uses;
        uses.commands += 1;
        let mut host = |h: HostRef| {
            if let HostRef::Buffer { handle, .. } = h
                && !uses.host_buffers.contains(&handle)
            {
                uses.host_buffers.push(handle);
            }
        };
        match *req {
            Request::CopyHtoD { dst, src, len } => {
                host(src);
                uses.device.push((dst, len, "copy destination"));
            }
            Request::CopyDtoH { dst, src, len } => {
                host(dst);
                uses.device.push((src, len, "copy source"));
            }
            Request::CopyDtoD { copy: c } => {
                uses.device.push((c.src, c.len, "copy source"));
                uses.device.push((c.dst, c.len, "copy destination"));
            }
            Request::Memset { fill } => uses.device.push((
                fill.dst,
                fill.bytes().unwrap_or(u64::MAX),
                "memset destination",
            )),
            _ => {}
        }
        Ok(())
    }

    /// Spoils the capture of `stream` (if it captures) after command `seq` failed in it.
    pub(super) fn capture_failed(&mut self, stream: u64, seq: u64, err: &Error) {
        if let Some(c) = self.graphs.captures.get_mut(&stream)
            && c.failed.is_none()
        {
            c.failed = Some((seq, err.message.clone()));
        }
    }

    /// Whether `stream` is capturing.
    pub(super) fn is_capturing(&self, stream: u64) -> bool {
        self.graphs.captures.contains_key(&stream)
    }

    pub(super) fn begin_capture(&mut self, stream: u64) -> Result<Answer> {
        let s = self.streams.get(stream)?;
        if self.graphs.captures.contains_key(&stream) {
            return Err(Error::invalid_value(format!(
                "stream {stream:#x} is already capturing a graph"
            )));
        }
        // Room for the graph it will give, so that ending the capture does not fail for it.
        ensure_room(
            &self.graphs.graphs,
            HandleKind::Graph,
            "max_graphs",
            self.limits.max_graphs,
        )?;
        self.backend.capture_begin(&s.stream)?;
        self.graphs.captures.insert(stream, Capture::default());
        DONE
    }

    pub(super) fn end_capture(&mut self, stream: u64) -> Result<Answer> {
        let s = self.streams.get(stream)?;
        let Some(capture) = self.graphs.captures.remove(&stream) else {
            return Err(Error::invalid_value(format!(
                "stream {stream:#x} is not capturing a graph (begin a capture first)"
            )));
        };
        // The stream runs its work again whatever happens next.
        let graph = self.backend.capture_end(&s.stream)?;
        if let Some((seq, why)) = capture.failed {
            return Err(Error::new(
                Status::InvalidValue,
                format!(
                    "the capture of stream {stream:#x} was spoilt by command {seq}, which failed: \
                     {why}; no graph was made"
                ),
            ));
        }
        ensure_room(
            &self.graphs.graphs,
            HandleKind::Graph,
            "max_graphs",
            self.limits.max_graphs,
        )?;
        let h = self.handles.next(HandleKind::Graph);
        let count = capture.uses.commands as u64;
        self.graphs.graphs.insert(
            h,
            GraphEntry {
                graph,
                uses: Arc::new(capture.uses),
            },
        )?;
        Ok(Answer::Values([h.0, count, 0, 0]))
    }

    pub(super) fn instantiate(&mut self, graph: u64) -> Result<Answer> {
        let g = self.graphs.graphs.get(graph)?;
        ensure_room(
            &self.graphs.execs,
            HandleKind::GraphExec,
            "max_graphs",
            self.limits.max_graphs,
        )?;
        let exec = ExecEntry {
            exec: Arc::new(self.backend.graph_instantiate(&g.graph)?),
            uses: g.uses.clone(),
        };
        let h = self.handles.next(HandleKind::GraphExec);
        self.graphs.execs.insert(h, exec)?;
        Ok(Answer::Values([h.0, 0, 0, 0]))
    }

    pub(super) fn graph_destroy(&mut self, graph: u64) -> Result<Answer> {
        self.graphs.graphs.remove(graph)?;
        DONE
    }

    pub(super) fn graph_exec_destroy(&mut self, exec: u64) -> Result<Answer> {
        // A launch still queued keeps its own reference.
        self.graphs.execs.remove(exec)?;
        DONE
    }

    pub(super) fn graph_launch(&mut self, cmd: &Command, exec: u64) -> Result<Answer> {
        let e = self.graphs.execs.get(exec)?;
        for &(addr, len, what) in &e.uses.device {
            self.check_device(addr, len, what).map_err(|err| {
                Error::new(
                    err.status,
                    format!(
                        "executable graph {exec:#x} can no longer run: {} (freed since the \
                         capture?)",
                        err.message
                    ),
                )
            })?;
        }
        let op = Op::GraphLaunch(e.exec.clone());
        self.stats.launched();
        self.enqueue(cmd, op)
    }

    /// Ends every capture (their graphs are dropped) and drops every graph, when the client
    /// goes away.
    pub(super) fn release_graphs(&mut self) -> usize {
        for (stream, _) in std::mem::take(&mut self.graphs.captures) {
            if let Ok(s) = self.streams.get(stream) {
                let _ = self.backend.capture_end(&s.stream);
            }
        }
        let n = self.graphs.len();
        self.graphs.graphs.drain().for_each(drop);
        self.graphs.execs.drain().for_each(drop);
        n
    }
}
