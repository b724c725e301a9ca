//! One client's session as a state machine without I/O: it owns the client's handle tables and
//! limits, checks each command against them, and turns it into backend work and an answer.
//!
//! It reads no ring, rings no bell and touches no socket: the shell (`super::Session`) copies each
//! command out of the submission ring, hands it to [`SessionCore::handle`] and carries out the
//! [`Output`] (posting a completion, sending a host buffer's descriptor). Of the client's channel
//! the core uses only the staging area (which copies name) and the stream progress words (which
//! the backend publishes to). Tests drive it in memory with the simulator or a recording backend.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use mps_core::alloc::AllocTable;
use mps_core::handle::{Handle, HandleKind, HandleTable};
use mps_core::limits::{check_clusters, check_geometry};
use mps_core::protocol::{
    ATTRIBUTES_PER_REPLY, Command, Completion, CompletionKind, DeviceAttribute, HostBufferFd,
    HostRef, Opcode, Request, flags,
};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::Channel;
use mps_ipc::segment::Segment;

use super::limits::{BatchPacing, Limits};
use super::tables::{FunctionEntry, HandleIssuer, Streams, ensure_room};
use crate::backend::{Backend, ClientContext, HostGates, Op, Publish};
use crate::quota::Charges;
use crate::registry::{Registry, Stats};

mod batch;
pub(crate) use batch::MAX_RUN;
mod graphs;
mod memory;
mod modules;
mod tensor_map;
mod vm;

/// What the shell does with a handled command.
#[derive(Debug)]
pub(crate) enum Output {
    /// Nothing: the command succeeded and asked for no reply.
    Silent,
    /// Post this completion.
    Post(Completion),
    /// Send `message` with the descriptor of `segment` on the client's socket, then post `reply`
    /// if there is one. If the descriptor cannot be sent, call
    /// [`SessionCore::host_buffer_unsent`] and tell the client.
    HostBuffer {
        segment: Arc<Segment>,
        message: HostBufferFd,
        reply: Option<Completion>,
    },
}

/// The answer of a command that succeeded: reply values, or a whole completion for replies
/// that carry data. A completion is built only if the client asked for one.
enum Answer {
    Values([u64; 4]),
    /// A reply with data (parameter info pages): rare, so kept out of line.
    Full(Box<Completion>),
    HostBuffer {
        segment: Arc<Segment>,
        handle: Handle,
        /// Its device address.
        device: u64,
    },
}

const DONE: Result<Answer> = Ok(Answer::Values([0; 4]));

/// What every session of a server shares.
pub(crate) struct Shared<B: Backend> {
    pub(crate) backend: Arc<B>,
    pub(crate) handles: Arc<HandleIssuer>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) limits: Limits,
    /// This client's charges on what its process and user hold in all.
    pub(crate) charges: Charges,
}

/// What a client held when it went away.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Released {
    pub(crate) allocations: usize,
    pub(crate) bytes: u64,
    pub(crate) streams: usize,
    pub(crate) events: usize,
    pub(crate) modules: usize,
    pub(crate) host_buffers: usize,
    /// Graphs and executable graphs.
    pub(crate) graphs: usize,
}

/// One client's state and the rules its commands are checked against.
pub(crate) struct SessionCore<B: Backend> {
    backend: Arc<B>,
    handles: Arc<HandleIssuer>,
    registry: Arc<Registry>,
    limits: Limits,
    channel: Channel,
    ctx: ClientContext,
    /// The client's allocations, for checking; `ctx.allocations` is the same table shared with
    /// the simulator's workers and the registry, written only here, so that checking a copy
    /// takes no lock.
    allocations: AllocTable,
    streams: Streams<B::Stream>,
    events: HandleTable<Arc<B::Event>>,
    modules: HandleTable<Arc<B::Module>>,
    /// Each module's kernel names as [`Request::ModuleFunctionNames`] pages them (their count,
    /// and each name followed by a NUL), read from the backend when first asked.
    function_names: std::collections::HashMap<u64, (u64, Arc<[u8]>)>,
    /// Each module's globals that copies and memsets may name, by their starts in
    /// `allocations` (as mappings), forgotten with the module.
    globals: std::collections::HashMap<u64, Vec<u64>>,
    functions: HandleTable<FunctionEntry<B>>,
    host: HandleTable<memory::HostBuffer>,
    /// Bytes of the host buffers in `host`.
    host_bytes: u64,
    /// The module image being uploaded, chunk by chunk.
    pending_image: Vec<u8>,
    stats: Arc<Stats>,
    /// Device-memory limit in bytes (0: none); the operator's registry sees it.
    mem_limit: Arc<AtomicU64>,
    /// Capturing streams and the client's graphs.
    graphs: graphs::Graphs<B>,
    /// Launch batching: the run being held and the shapes of earlier runs.
    batch: batch::Batching<B>,
    /// What this client charged to its process's and user's sums (given back on drop).
    charges: Charges,
    /// Reservations, physical allocations and mappings.
    vm: vm::Vm,
}

impl<B: Backend> SessionCore<B> {
    /// The state of a new client on `channel`: its segments registered with the device and its
    /// default stream created.
    pub(crate) fn new(shared: Shared<B>, channel: Channel, ctx: ClientContext) -> Result<Self> {
        let Shared {
            backend,
            handles,
            registry,
            limits,
            charges,
        } = shared;
        limits.check()?;
        // The GPU writes progress into the server segment and copies through the staging area
        // in the client segment: both must be registered with the device.
        backend.host_register(channel.server_segment())?;
        if let Err(e) = backend.host_register(channel.client_segment()) {
            backend.host_unregister(channel.server_segment());
            return Err(e);
        }
        let default_stream = match backend.stream_create(0, &ctx) {
            Ok(stream) => stream,
            Err(e) => {
                backend.host_unregister(channel.client_segment());
                backend.host_unregister(channel.server_segment());
                return Err(e);
            }
        };
        Ok(SessionCore {
            streams: Streams::new(default_stream, limits.max_streams),
            events: HandleTable::new(HandleKind::Event, limits.max_events),
            modules: HandleTable::new(HandleKind::Module, limits.max_modules),
            function_names: std::collections::HashMap::new(),
            globals: std::collections::HashMap::new(),
            functions: HandleTable::new(HandleKind::Function, limits.max_functions),
            host: HandleTable::new(HandleKind::HostBuffer, limits.max_host_buffers),
            host_bytes: 0,
            graphs: graphs::Graphs::new(limits.max_graphs),
            batch: batch::Batching::new(
                limits.launch_batching,
                limits.batch_pacing,
                limits.max_batch_entries,
                limits.max_batch_bytes,
                limits.max_batch_run,
            ),
            pending_image: Vec::new(),
            allocations: AllocTable::default(),
            vm: vm::Vm::new(limits.max_allocations),
            stats: Arc::default(),
            mem_limit: Arc::new(AtomicU64::new(registry.default_mem_limit())),
            backend,
            handles,
            registry,
            limits,
            channel,
            ctx,
            charges,
        })
    }

    /// What the backend knows of this client.
    pub(crate) fn context(&self) -> &ClientContext {
        &self.ctx
    }

    /// The client's counters.
    pub(crate) fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The client's device-memory limit (0: none), shared with the registry.
    pub(crate) fn mem_limit(&self) -> &Arc<AtomicU64> {
        &self.mem_limit
    }

    /// The client's priority, shared with the registry.
    pub(crate) fn priority(&self) -> &Arc<AtomicU32> {
        &self.ctx.priority
    }

    /// Bytes of a module upload not finished yet.
    #[cfg(test)]
    pub(crate) fn pending_module_bytes(&self) -> usize {
        self.pending_image.capacity()
    }

    /// Handles one command: `payload` holds the bytes of its continuation slots, already copied
    /// out of shared memory.
    pub(crate) fn handle(&mut self, cmd: &Command, payload: &[u8]) -> Output {
        let wants_reply = cmd.flags & flags::REPLY != 0;
        let result = Request::decode(cmd, payload).and_then(|req| {
            // Work that may join a run is offered to it from `enqueue`, once checked; anything
            // else ends the run first, so that it sees the run's work queued.
            self.batch.offered = match self.is_capturing(cmd.stream) {
                false => self.batch.describe(cmd, &req),
                true => None,
            };
            if self.batch.offered.is_none() {
                self.end_run(batch::Ender::Command {
                    opcode: cmd.opcode,
                    flags: cmd.flags & flags::ALL,
                });
            }
            self.execute(cmd, req)
        });
        match result {
            Ok(Answer::Values(_) | Answer::Full(_)) if !wants_reply => Output::Silent,
            Ok(Answer::Values(values)) => Output::Post(Completion::reply(cmd.seq, values)),
            Ok(Answer::Full(c)) => Output::Post(*c),
            Ok(Answer::HostBuffer {
                segment,
                handle,
                device,
            }) => {
                let len = segment.len() as u64;
                let values = [handle.0, len, device, 0];
                Output::HostBuffer {
                    message: HostBufferFd::new(handle.0, len),
                    segment,
                    reply: wants_reply.then(|| Completion::reply(cmd.seq, values)),
                }
            }
            Err(err) => {
                let launch = matches!(
                    Opcode::from_u16(cmd.opcode),
                    Some(Opcode::Launch | Opcode::LaunchCluster)
                );
                self.log_failure(cmd.seq, &err, launch);
                // A command that fails ends the run: the work before it is queued first.
                self.batch.offered = None;
                self.end_run(batch::Ender::Failure);
                if Opcode::from_u16(cmd.opcode).is_some_and(Opcode::is_stream_ordered) {
                    self.capture_failed(cmd.stream, cmd.seq, &err);
                }
                self.publish_failed(cmd);
                Output::Post(Completion::error(cmd.seq, CompletionKind::Reply, &err))
            }
        }
    }

    /// Logs a failed command: a launch as a warning (the message names the kernel, its
    /// geometry and the driver's result), within the bound [`Stats::launch_failed`] keeps;
    /// anything else at debug level.
    fn log_failure(&self, seq: u64, err: &Error, launch: bool) {
        if !launch {
            tracing::debug!(client = self.ctx.id, seq, "command failed: {err}");
        } else if let Some(n) = self.stats.launch_failed() {
            tracing::warn!(
                client = self.ctx.id,
                seq,
                failed_launches = n,
                "a launch failed: {err}"
            );
        }
    }

    /// The client may be waiting for a failed command's stream progress: publish it in stream
    /// order, so that the wait ends (and sees the error) without claiming that earlier work is
    /// done.
    fn publish_failed(&self, cmd: &Command) {
        // A capturing stream records instead of running: nothing there can publish.
        if cmd.flags & flags::MARK == 0
            || self.ctx.faults.has_faulted()
            || self.is_capturing(cmd.stream)
        {
            return;
        }
        if let Ok(s) = self.streams.get(cmd.stream) {
            let publish = self.publish(s.slot, cmd.seq);
            let _ = self
                .backend
                .submit(&s.stream, cmd.seq, Op::Nop, Some(publish));
        }
    }

    fn publish(&self, slot: u32, seq: u64) -> Publish {
        Publish {
            channel: self.channel.clone(),
            slot,
            seq,
        }
    }

    fn execute(&mut self, cmd: &Command, req: Request<'_>) -> Result<Answer> {
        let seq = cmd.seq;
        if !req.opcode().is_stream_ordered() && cmd.stream != 0 {
            return Err(Error::invalid_value(format!(
                "{:?} is not stream-ordered but names stream {:#x}",
                req.opcode(),
                cmd.stream
            )));
        }
        if req.opcode().is_stream_ordered() {
            self.check_capture(cmd, &req)?;
        }
        match req {
            Request::Launch { spec } => {
                let f = self.functions.get(spec.function)?;
                let info = self.backend.info();
                check_geometry(spec.grid, spec.block, spec.shared_mem, &info.limits)?;
                if let Some(c) = &spec.cluster {
                    check_clusters(spec.grid, c, info.cc)?;
                }
                if spec.params.len() != f.param_bytes {
                    return Err(Error::invalid_value(format!(
                        "kernel takes {} bytes of parameters, the launch carries {}",
                        f.param_bytes,
                        spec.params.len()
                    )));
                }
                self.stats.launched();
                // The parameters stay where the shell copied the command to; a backend that
                // runs the launch later copies them (`Op::into_owned`).
                let op = Op::Launch(spec.map(|_| f.function.clone(), Cow::Borrowed));
                self.enqueue(cmd, op)
            }
            Request::Mark => self.enqueue(cmd, Op::Nop),
            Request::HostWait { gate, value } => self.host_wait(cmd, gate, value),
            Request::CopyHtoD { dst, src, len } => {
                self.check_device(dst, len, "copy destination")?;
                let take = matches!(src, HostRef::Staging { .. });
                let src = self.host_bytes(src, len, take)?;
                self.stats.copied(len);
                self.enqueue(cmd, Op::CopyHtoD { dst, src })
            }
            Request::CopyDtoH { dst, src, len } => {
                self.check_device(src, len, "copy source")?;
                let dst = self.host_bytes(dst, len, false)?;
                self.stats.copied(len);
                self.enqueue(cmd, Op::CopyDtoH { dst, src })
            }
            Request::CopyDtoD { copy } => {
                self.check_device(copy.src, copy.len, "copy source")?;
                self.check_device(copy.dst, copy.len, "copy destination")?;
                self.stats.copied(copy.len);
                self.enqueue(cmd, Op::CopyDtoD(copy))
            }
            Request::Memset { fill } => {
                let len = fill.bytes().ok_or_else(|| {
                    Error::invalid_value(format!("memset of {} elements overflows", fill.count))
                })?;
                self.check_device(fill.dst, len, "memset destination")?;
                self.enqueue(cmd, Op::Memset(fill))
            }
            Request::EventRecord { event } => {
                let e = self.events.get(event)?.clone();
                self.enqueue(cmd, Op::Record(e))
            }
            Request::StreamWaitEvent { event } => {
                let e = self.events.get(event)?.clone();
                self.enqueue(cmd, Op::Wait(e))
            }
            Request::MemAlloc { size } => self.mem_alloc(size),
            Request::MemFree { ptr } => {
                self.graphs.check_no_capture("free device memory")?;
                self.mem_free(ptr)
            }
            Request::MemGetInfo => {
                let (free, total) = self.backend.mem_get_info();
                let limit = self.mem_limit.load(Ordering::Relaxed);
                if limit == 0 {
                    return Ok(Answer::Values([free, total, 0, 0]));
                }
                // Under a limit, the limit is the client's device.
                let held = self.allocations.bytes() + self.vm.bytes();
                Ok(Answer::Values([
                    limit.saturating_sub(held).min(free),
                    limit,
                    0,
                    0,
                ]))
            }
            Request::MemGetAddressRange { ptr } => match self.allocations.find(ptr) {
                Some((base, size)) => Ok(Answer::Values([base, size, 0, 0])),
                None => Err(Error::new(
                    Status::NotFound,
                    format!("{ptr:#x} lies in no allocation of this client"),
                )),
            },
            Request::VmGranularity => self.vm_granularity(),
            Request::VmReserve { size, align } => self.vm_reserve(size, align),
            Request::VmFree { va } => self.vm_free(va),
            Request::VmCreate { size } => self.vm_create(size),
            Request::VmRelease { handle } => self.vm_release(handle),
            Request::VmMap {
                va,
                size,
                handle,
                offset,
            } => {
                self.graphs.check_no_capture("map memory")?;
                self.vm_map(va, size, handle, offset)
            }
            Request::VmUnmap { va, size } => {
                self.graphs.check_no_capture("unmap memory")?;
                self.vm_unmap(va, size)
            }
            Request::VmSetAccess { va, size } => self.vm_set_access(va, size),
            Request::VmHandleAt { va } => self.vm_handle_at(va),
            Request::SetPriority { level } => {
                // A client may only lower what the server set.
                // The backend moves the client's streams to their new device priority at their
                // next submission.
                let new = self
                    .ctx
                    .priority
                    .fetch_max(level, Ordering::Relaxed)
                    .max(level);
                Ok(Answer::Values([new as u64, 0, 0, 0]))
            }
            Request::SetMemLimit { bytes } => {
                if bytes == 0 {
                    return Err(Error::invalid_value("a device-memory limit of 0 bytes"));
                }
                // A client may only lower what the server set.
                let current = self.mem_limit.load(Ordering::Relaxed);
                let new = if current == 0 {
                    bytes
                } else {
                    current.min(bytes)
                };
                self.mem_limit.store(new, Ordering::Relaxed);
                Ok(Answer::Values([new, 0, 0, 0]))
            }
            Request::SetSmShare { percent } => {
                self.registry.set_sm_share(self.ctx.id, percent)?;
                Ok(Answer::Values(self.registry.sm_info(self.ctx.id)?))
            }
            Request::ReserveSms { percent } => {
                self.registry.reserve_sms(self.ctx.id, percent)?;
                Ok(Answer::Values(self.registry.sm_info(self.ctx.id)?))
            }
            Request::SmInfo => Ok(Answer::Values(self.registry.sm_info(self.ctx.id)?)),
            Request::HostAlloc { size } => self.host_alloc(size),
            Request::HostFree { handle } => {
                self.graphs.check_no_capture("free a host buffer")?;
                self.graphs.check_host_free(handle)?;
                let freed = self.host_free(handle)?;
                self.batch.forget_host_buffer(handle);
                self.batch_cache_changed();
                Ok(freed)
            }
            Request::ModuleData {
                staging_offset,
                len,
                last,
            } => self.module_data(staging_offset, len, last),
            Request::ModuleUnload { module } => self.module_unload(module),
            Request::GetFunction { module, name } => self.get_function(module, name),
            Request::ParamInfo { function, first } => self.param_info(seq, function, first),
            Request::DeviceAttributes { first } => Ok(self.device_attributes(seq, first)),
            Request::ContextLimits => Ok(self.context_limits(seq)),
            Request::ModuleGlobal { module, name } => self.module_global(module, name),
            Request::ModuleFunctionNames { module, offset } => {
                self.module_function_names(seq, module, offset)
            }
            Request::TensorMapEncodeTiled { map } => self.tensor_map_encode_tiled(seq, &map),
            Request::TensorMapReplaceAddress { address, map } => {
                self.tensor_map_replace_address(seq, address, map)
            }
            Request::FuncAttributes { function } => self.func_attributes(seq, function),
            Request::Occupancy { function, query } => self.occupancy(function, query),
            Request::StreamCreate { priority } => {
                let slot = self.streams.take_slot()?;
                // The backend sets the device priority from this and the client's level.
                // A backend that cannot create the stream (the simulator out of threads)
                // refuses this request; the session carries on.
                let stream = match self.backend.stream_create(priority, &self.ctx) {
                    Ok(s) => s,
                    Err(e) => {
                        self.streams.give_back(slot);
                        return Err(e);
                    }
                };
                let h = self.handles.next(HandleKind::Stream);
                self.streams.insert(h, slot, stream)?;
                Ok(Answer::Values([h.0, slot as u64, 0, 0]))
            }
            Request::StreamDestroy { stream } => {
                if self.is_capturing(stream) {
                    return Err(Error::invalid_value(format!(
                        "stream {stream:#x} is capturing a graph; end the capture before \
                         destroying it"
                    )));
                }
                let s = self.streams.remove(stream)?;
                self.batch.forget_stream(stream);
                self.batch_cache_changed();
                self.backend.stream_destroy(s.stream);
                self.ctx.gates.forget(stream);
                self.streams.give_back(s.slot);
                DONE
            }
            Request::EventCreate => {
                ensure_room(
                    &self.events,
                    HandleKind::Event,
                    "max_events",
                    self.limits.max_events,
                )?;
                let event = Arc::new(self.backend.event_create()?);
                let h = self.handles.next(HandleKind::Event);
                self.events.insert(h, event)?;
                Ok(Answer::Values([h.0, 0, 0, 0]))
            }
            Request::EventDestroy { event } => {
                self.events.remove(event)?;
                DONE
            }
            Request::StreamBeginCapture { stream } => self.begin_capture(stream),
            Request::StreamEndCapture { stream } => self.end_capture(stream),
            Request::GraphInstantiate { graph } => self.instantiate(graph),
            Request::GraphDestroy { graph } => self.graph_destroy(graph),
            Request::GraphExecDestroy { exec } => self.graph_exec_destroy(exec),
            Request::GraphLaunch { exec } => self.graph_launch(cmd, exec),
            Request::EventElapsed { start, end } => {
                let s = self.events.get(start)?;
                let e = self.events.get(end)?;
                let ms = self.backend.event_elapsed_ms(s, e)?;
                Ok(Answer::Values([ms.to_bits() as u64, 0, 0, 0]))
            }
        }
    }

    /// A page of the device's attributes from the `first`th, and its UUID when known (the
    /// layout [`Request::DeviceAttributes`] documents).
    fn device_attributes(&self, seq: u64, first: u32) -> Answer {
        let info = self.backend.info();
        let all = &info.attributes;
        let rest = all.get(first as usize..).unwrap_or(&[]);
        let page = &rest[..rest.len().min(ATTRIBUTES_PER_REPLY)];
        let mut c = Completion::reply(
            seq,
            [
                page.len() as u64,
                all.len() as u64,
                info.uuid.is_some() as u64,
                0,
            ],
        );
        let bytes = bytemuck::cast_slice::<DeviceAttribute, u8>(page);
        c.data[..bytes.len()].copy_from_slice(bytes);
        let mut len = bytes.len();
        if let Some(uuid) = info.uuid {
            c.data[len..len + 16].copy_from_slice(&uuid);
            len += 16;
        }
        c.data_len = len as u32;
        Answer::Full(Box::new(c))
    }

    /// Queues stream-ordered work, publishing the command's stream progress if it asks; work
    /// that may join a run goes to the batching first.
    fn enqueue(&mut self, cmd: &Command, op: Op<'_, B>) -> Result<Answer> {
        if let Some(desc) = self.batch.offered.take() {
            return self.offer(cmd, op, desc);
        }
        let s = self.streams.get(cmd.stream)?;
        let publish = (cmd.flags & flags::MARK != 0).then(|| self.publish(s.slot, cmd.seq));
        self.backend.submit(&s.stream, cmd.seq, op, publish)?;
        DONE
    }

    /// A host function's place in its stream: the command's progress is published once the
    /// work before it is done, and the stream then waits for the client to raise the gate word
    /// to `value` (its function has returned).
    fn host_wait(&mut self, cmd: &Command, gate: HostRef, value: u64) -> Result<Answer> {
        let HostRef::Buffer { handle, offset } = gate else {
            return Err(Error::invalid_value(
                "a host function's gate must be a word of a host buffer, not of the staging area",
            ));
        };
        if cmd.flags & flags::MARK == 0 {
            return Err(Error::invalid_value(
                "a host wait must carry MARK: the client runs its function once the command's \
                 progress is published",
            ));
        }
        if offset % 8 != 0 || value > HostGates::OPEN / 2 {
            return Err(Error::invalid_value(format!(
                "a host function's gate must be an 8-byte aligned word (byte {offset}) and its \
                 value at most {} ({value})",
                HostGates::OPEN / 2
            )));
        }
        let word = self.host_bytes(gate, 8, false)?;
        let device = self.host.get(handle)?.device + offset;
        let s = self.streams.get(cmd.stream)?;
        self.ctx.gates.fix(cmd.stream, handle, offset, &word)?;
        let publish = self.publish(s.slot, cmd.seq);
        self.backend
            .submit(&s.stream, cmd.seq, Op::Nop, Some(publish))?;
        let wait = Op::HostWait {
            word,
            device,
            value,
        };
        self.backend.submit(&s.stream, cmd.seq, wait, None)?;
        DONE
    }

    /// Waits for all of this client's work (before freeing memory it may use, as cuMemFree
    /// does).
    fn synchronize_all(&self) -> Result<()> {
        for s in self.streams.iter() {
            self.backend
                .stream_synchronize(&s.stream, &self.ctx.closing)?;
        }
        Ok(())
    }

    /// Releases everything the client held; call once it is closing (its queued work is then
    /// dropped rather than run).
    pub(crate) fn release(mut self) -> Released {
        // No stream may wait for a host function of a client that is gone.
        self.ctx.gates.open_all();
        let graphs = self.release_graphs();
        // Held work is dropped with the client; cached graphs go before its streams.
        self.batch = batch::Batching::new(false, BatchPacing::Off, 0, 0, MAX_RUN);
        let SessionCore {
            backend,
            channel,
            ctx,
            streams,
            events,
            modules,
            functions,
            mut host,
            pending_image,
            mut vm,
            ..
        } = self;
        drop(pending_image);
        let mut released = Released {
            streams: streams.len(),
            events: events.len(),
            modules: modules.len(),
            host_buffers: host.len(),
            graphs,
            ..Released::default()
        };
        for s in streams.into_streams() {
            backend.stream_destroy(s);
        }
        // No work of this client runs any more: its memory can go back.
        let mut table = memory::write(&ctx.allocations);
        // Mappings (of physical memory, of host buffers) are not allocations.
        released.allocations = table.iter().count();
        released.bytes = table.bytes();
        for (ptr, size) in table.iter() {
            backend.mem_free(ptr, size);
        }
        *table = AllocTable::default();
        drop(table);
        vm.release(&*backend);
        drop(functions);
        for (_, b) in host.drain() {
            b.release(&*backend);
        }
        backend.host_unregister(channel.client_segment());
        backend.host_unregister(channel.server_segment());
        released
    }
}
