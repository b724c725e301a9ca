//! Graphs: a stream's work captured once and launched again and again, each launch one command
//! for the server and one driver call on a GPU.
//!
//! While a stream captures, the work submitted to it is recorded, not run. As in CUDA, such a
//! stream cannot be waited for or queried; this client refuses that at once (it would
//! otherwise wait for work that never runs). The server refuses what a capture cannot hold:
//! event records and waits, graph launches, and copies through pageable memory (copy through a
//! host buffer from [`Client::host_alloc`], whose contents each launch reads again).

use mps_core::protocol::{Request, flags};
use mps_core::{Error, Result};

use crate::connection::Client;
use crate::handles::{Graph, GraphExec, Stream};

impl Client {
    /// From now on, the work submitted to `stream` is recorded into a graph instead of run,
    /// until [`Client::stream_end_capture`].
    pub fn stream_begin_capture(&self, stream: Stream) -> Result<()> {
        self.stream_slot(stream)?;
        self.transport
            .call(&Request::StreamBeginCapture { stream: stream.0 })?;
        self.captures().insert(stream.0);
        Ok(())
    }

    /// Ends the capture of `stream` and returns the graph of what it recorded; `stream` runs
    /// its work again. Fails (and makes no graph) if a command failed during the capture, or
    /// if an earlier command left an error to report.
    pub fn stream_end_capture(&self, stream: Stream) -> Result<Graph> {
        self.stream_end_capture_counted(stream)
            .map(|(graph, _)| graph)
    }

    /// As [`Client::stream_end_capture`], with the number of commands the graph holds (each a
    /// node of the server's graph: a copy, a memset or a kernel launch).
    pub fn stream_end_capture_counted(&self, stream: Stream) -> Result<(Graph, u64)> {
        self.stream_slot(stream)?;
        // The capture ends whatever an earlier command left to report (the usual check before a
        // call would return that and leave the server capturing, its stream never to run again).
        let pending = self.transport.check();
        let reply = self
            .transport
            .submit_request(
                &Request::StreamEndCapture { stream: stream.0 },
                Stream::DEFAULT,
                flags::REPLY,
            )
            .and_then(|seq| self.transport.wait_reply(seq));
        // Whatever the answer, the server ended the capture.
        self.captures().remove(&stream.0);
        // The errors of commands recorded in the capture arrived before the reply: they are
        // the capture's (its reply names the first), not the next synchronisation's.
        let recorded = self.transport.check();
        let values = reply?.values;
        let graph = Graph(values[0]);
        match pending.and(recorded) {
            Ok(()) => Ok((graph, values[1])),
            Err(e) => {
                // The error is the answer; a graph is not (it may lack the failed command).
                let _ = self.graph_destroy(graph);
                Err(e)
            }
        }
    }

    /// Whether `stream` is capturing.
    pub fn stream_is_capturing(&self, stream: Stream) -> bool {
        self.captures().contains(&stream.0)
    }

    /// An executable graph made from `graph` (which may then be destroyed).
    pub fn graph_instantiate(&self, graph: Graph) -> Result<GraphExec> {
        let v = self
            .transport
            .call(&Request::GraphInstantiate { graph: graph.0 })?
            .values;
        Ok(GraphExec(v[0]))
    }

    /// Runs `exec` in `stream`, asynchronously, ordered with the stream's other work; its work
    /// runs with the stream's priority and on the client's SMs.
    pub fn graph_launch(&self, exec: GraphExec, stream: Stream) -> Result<()> {
        self.refuse_capturing(stream, "launch a graph into")?;
        self.transport
            .enqueue(&Request::GraphLaunch { exec: exec.0 }, stream)
            .map(drop)
    }

    /// Destroys a captured graph; executable graphs made from it still run.
    pub fn graph_destroy(&self, graph: Graph) -> Result<()> {
        self.transport
            .call(&Request::GraphDestroy { graph: graph.0 })
            .map(drop)
    }

    /// Destroys an executable graph; launches already submitted still run.
    pub fn graph_exec_destroy(&self, exec: GraphExec) -> Result<()> {
        self.transport
            .call(&Request::GraphExecDestroy { exec: exec.0 })
            .map(drop)
    }

    /// Fails if `stream` is capturing: what it has been given is recorded, not run, so it
    /// cannot be waited for (nor given what a capture cannot hold).
    pub(crate) fn refuse_capturing(&self, stream: Stream, what: &str) -> Result<()> {
        if self.stream_is_capturing(stream) {
            return Err(Error::invalid_value(format!(
                "cannot {what} stream {:#x} while it captures a graph (its work is recorded, \
                 not run); end the capture first",
                stream.0
            )));
        }
        Ok(())
    }

    /// Fails if any stream of this client is capturing.
    pub(crate) fn refuse_any_capturing(&self, what: &str) -> Result<()> {
        let capturing = self.captures().iter().next().copied();
        match capturing {
            Some(s) => self.refuse_capturing(Stream(s), what),
            None => Ok(()),
        }
    }

    fn captures(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<u64>> {
        self.capturing.lock().unwrap_or_else(|p| p.into_inner())
    }
}
