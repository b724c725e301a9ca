//! One client's session: its thread reads the client's submission ring under the hostile-client
//! rules, checks every command against the client's own tables, hands work to the backend and
//! posts completions. When the client goes away, everything it held is released here.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use mps_core::alloc::AllocTable;
use mps_core::handle::{Handle, HandleKind, HandleSource, HandleTable, SlotPool};
use mps_core::protocol::{
    self, Command, Completion, CompletionKind, HostBufferFd, HostRef, MAGIC, MAX_COMMAND_SLOTS,
    MAX_EVENTS, MAX_MODULE_BYTES, MAX_STREAMS, PARAMS_PER_REPLY, ParamInfo, Request, SLOT_BYTES,
    flags,
};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, ShmRing};
use mps_ipc::ring::Consumer;
use mps_ipc::segment::Segment;
use mps_ipc::socket::{self, Peer};

use crate::backend::{Backend, ClientContext, HostBytes, Op, Publish};
use crate::outbox::Outbox;
use crate::registry::{ClientEntry, Registry, Stats};

/// Limits on what one client may hold.
const MAX_MODULES: usize = 1024;
const MAX_FUNCTIONS: usize = 1 << 16;
const MAX_HOST_BUFFERS: usize = 4096;
/// The largest single host buffer.
const MAX_HOST_BUFFER_BYTES: u64 = 1 << 40;

/// How long it sleeps before looking at the closing flag again (a safety net only: the
/// watcher rings the bell when the client hangs up).
const NAP: Duration = Duration::from_millis(200);

struct StreamEntry<B: Backend> {
    slot: u32,
    stream: B::Stream,
}

struct FunctionEntry<B: Backend> {
    module: Handle,
    function: Arc<B::Function>,
    params: Vec<ParamInfo>,
}

/// What every session of a server shares.
pub(crate) struct ServerEnv<B: Backend> {
    pub(crate) backend: Arc<B>,
    pub(crate) handles: Arc<Mutex<HandleSource>>,
    pub(crate) registry: Arc<Registry>,
    /// How long the session thread spins, then yields, before it sleeps.
    pub(crate) waits: (Duration, Duration),
}

/// One connected client.
pub(crate) struct Session<B: Backend> {
    backend: Arc<B>,
    handles: Arc<Mutex<HandleSource>>,
    id: u32,
    peer: Peer,
    channel: Channel,
    socket: Arc<UnixStream>,
    commands: Consumer<Command, ShmRing<Command>>,
    outbox: Arc<Outbox>,
    ctx: ClientContext,
    default_stream: Option<StreamEntry<B>>,
    streams: HandleTable<StreamEntry<B>>,
    stream_slots: SlotPool,
    events: HandleTable<Arc<B::Event>>,
    modules: HandleTable<Arc<B::Module>>,
    functions: HandleTable<FunctionEntry<B>>,
    host: HandleTable<Arc<Segment>>,
    pending_image: Vec<u8>,
    payload: Vec<u8>,
    spin: Duration,
    yield_for: Duration,
    registry: Arc<Registry>,
    stats: Arc<Stats>,
    /// Device-memory limit in bytes (0: none).
    mem_limit: Arc<std::sync::atomic::AtomicU64>,
    /// Client priority (`PRIORITY_NORMAL` or `PRIORITY_BELOW_NORMAL`).
    priority: Arc<std::sync::atomic::AtomicU32>,
}

impl<B: Backend> Session<B> {
    /// A session over a channel whose handshake has completed.
    pub(crate) fn new(
        env: ServerEnv<B>,
        id: u32,
        peer: Peer,
        channel: Channel,
        socket: Arc<UnixStream>,
    ) -> Result<Self> {
        let ServerEnv {
            backend,
            handles,
            registry,
            waits: (spin, yield_for),
        } = env;
        let closing = Arc::new(AtomicBool::new(false));
        let outbox = Arc::new(Outbox::new(
            channel.clone(),
            closing.clone(),
            socket.clone(),
        ));
        let ctx = ClientContext {
            id,
            allocations: Arc::new(RwLock::new(AllocTable::default())),
            closing,
            faults: outbox.clone(),
            sm: Arc::default(),
            busy_ns: Arc::default(),
        };
        // The GPU writes progress into the server segment and copies through the staging area
        // in the client segment: both must be registered with the device.
        backend.host_register(channel.server_segment())?;
        if let Err(e) = backend.host_register(channel.client_segment()) {
            backend.host_unregister(channel.server_segment());
            return Err(e);
        }
        let default_stream = match backend.stream_create(0, &ctx) {
            Ok(stream) => StreamEntry { slot: 0, stream },
            Err(e) => {
                backend.host_unregister(channel.client_segment());
                backend.host_unregister(channel.server_segment());
                return Err(e);
            }
        };
        Ok(Session {
            commands: channel.submit_consumer(),
            backend,
            handles,
            id,
            peer,
            socket,
            outbox,
            ctx,
            default_stream: Some(default_stream),
            streams: HandleTable::new(HandleKind::Stream, MAX_STREAMS - 1),
            stream_slots: SlotPool::new(1, MAX_STREAMS as u32),
            events: HandleTable::new(HandleKind::Event, MAX_EVENTS),
            modules: HandleTable::new(HandleKind::Module, MAX_MODULES),
            functions: HandleTable::new(HandleKind::Function, MAX_FUNCTIONS),
            host: HandleTable::new(HandleKind::HostBuffer, MAX_HOST_BUFFERS),
            pending_image: Vec::new(),
            payload: Vec::with_capacity(MAX_COMMAND_SLOTS * SLOT_BYTES),
            spin,
            yield_for,
            stats: Arc::new(Stats::default()),
            mem_limit: Arc::new(std::sync::atomic::AtomicU64::new(
                registry.default_mem_limit(),
            )),
            priority: Arc::new(std::sync::atomic::AtomicU32::new(
                registry.default_priority(),
            )),
            registry,
            channel,
        })
    }

    /// Watches the socket for the client's hang-up (or for bytes it must not send), on a thread
    /// of its own so that the session thread can sleep on the submission doorbell alone.
    pub(crate) fn spawn_watcher(&self) -> std::io::Result<()> {
        let sock = self.socket.clone();
        let outbox = self.outbox.clone();
        std::thread::Builder::new()
            .name(format!("watch-c{}", self.id))
            .spawn(move || {
                let mut buf = [0u8; 64];
                let reason = match std::io::Read::read(&mut &*sock, &mut buf) {
                    Ok(0) => "hung up".to_string(),
                    Ok(_) => "sent bytes on its socket after the handshake".to_string(),
                    Err(e) => format!("socket error: {e}"),
                };
                outbox.disconnect(reason);
            })
            .map(drop)
    }

    /// Serves the client until it goes away, then releases everything it held. A panic while
    /// serving (a bug) disconnects this client with a logged reason; other clients carry on.
    pub(crate) fn run(mut self) {
        self.registry.add(
            self.id,
            ClientEntry {
                pid: self.peer.pid,
                uid: self.peer.uid,
                outbox: self.outbox.clone(),
                stats: self.stats.clone(),
                allocations: self.ctx.allocations.clone(),
                mem_limit: self.mem_limit.clone(),
                priority: self.priority.clone(),
                sm: self.ctx.sm.clone(),
                busy_ns: self.ctx.busy_ns.clone(),
                sm_share: std::sync::atomic::AtomicU32::new(100),
                sm_reserve: std::sync::atomic::AtomicU32::new(0),
            },
        );
        self.apply_priority();
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        if served.is_err() {
            self.outbox
                .disconnect("an internal error in the server (a panic, logged above)".into());
        }
        self.teardown();
    }

    /// Gives this session thread the CPU priority of the client's priority: a below-normal
    /// client's commands are taken after normal clients' when the server's CPUs are busy.
    fn apply_priority(&self) {
        let nice = if self.priority.load(Ordering::Relaxed) >= protocol::PRIORITY_BELOW_NORMAL {
            10
        } else {
            0
        };
        let tid = nix::unistd::gettid().as_raw();
        // SAFETY: setpriority only reads its arguments; on Linux PRIO_PROCESS with a thread id
        // sets that thread's nice value. Lowering priority needs no privilege; a failure leaves
        // the thread as it was, which is only a missed preference.
        let r = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid as u32, nice) };
        if r != 0 {
            tracing::debug!(client = self.id, "setpriority({nice}) failed");
        }
    }

    fn closing(&self) -> bool {
        self.ctx.closing.load(Ordering::Relaxed)
    }

    fn serve(&mut self) {
        loop {
            if self.closing() {
                return;
            }
            let avail = match self.commands.available() {
                Ok(n) => n,
                Err(e) => {
                    return self
                        .outbox
                        .disconnect(format!("corrupted its submission ring: {e}"));
                }
            };
            if avail == 0 {
                let commands = &self.commands;
                let closing = &self.ctx.closing;
                let ready = || closing.load(Ordering::Relaxed) || commands.available() != Ok(0);
                // Spin, then look again after each yield of the processor, then sleep: a client
                // waiting for its stream submits again the moment the wait ends, and a sleeping
                // session thread would add its wake-up to every such cycle.
                let bell = self.channel.submit_bell();
                bell.wait(self.spin, self.spin, ready);
                let until = std::time::Instant::now() + self.yield_for;
                while !ready() && std::time::Instant::now() < until {
                    std::thread::yield_now();
                }
                if !ready() {
                    bell.wait(Duration::ZERO, NAP, ready);
                }
                continue;
            }
            let cmd = self.commands.peek(0);
            let extra = cmd.extra_slots as u32;
            if extra as usize >= MAX_COMMAND_SLOTS {
                return self.outbox.disconnect(format!(
                    "sent command #{} claiming {extra} payload slots (at most {})",
                    cmd.seq,
                    MAX_COMMAND_SLOTS - 1
                ));
            }
            if avail < 1 + extra {
                // Clients publish a command and its payload together.
                return self.outbox.disconnect(format!(
                    "published command #{} without its {extra} payload slots",
                    cmd.seq
                ));
            }
            self.payload.clear();
            for i in 1..=extra {
                let slot = self.commands.peek(i);
                self.payload.extend_from_slice(bytemuck::bytes_of(&slot));
            }
            self.commands.advance(1 + extra);
            // A client that found no room for a command sleeps on the progress bell; it can only
            // be waiting while the ring is nearly full. Ringing for every command would bounce
            // the bell's cache line between this thread and a client spinning on it.
            if avail as usize + MAX_COMMAND_SLOTS > self.channel.layout().submit_slots as usize {
                self.channel.progress_bell().ring();
            }
            let payload = std::mem::take(&mut self.payload);
            self.handle(&cmd, &payload);
            self.payload = payload;
        }
    }

    fn handle(&mut self, cmd: &Command, payload: &[u8]) {
        let result = match self.outbox.fault() {
            Some(fault) => Err(fault),
            None => Request::decode(cmd, payload).and_then(|req| self.execute(cmd, req)),
        };
        match result {
            Ok(reply) => {
                if cmd.flags & flags::REPLY != 0 {
                    self.outbox.post(reply);
                }
            }
            Err(err) => {
                tracing::debug!(client = self.id, seq = cmd.seq, "command failed: {err}");
                self.outbox
                    .post(Completion::error(cmd.seq, CompletionKind::Reply, &err));
                // The client may be waiting for this command's stream progress: publish it in
                // stream order, so that the wait ends (and sees the error) without claiming
                // that earlier work is done.
                if cmd.flags & flags::MARK != 0
                    && self.outbox.fault().is_none()
                    && let Ok(publish) = self.stream_publish(cmd.stream, cmd.seq)
                    && let Ok(s) = self.stream(cmd.stream)
                {
                    let _ = self
                        .backend
                        .submit(&s.stream, cmd.seq, Op::Nop, Some(publish));
                }
            }
        }
    }

    fn next_handle(&self, kind: HandleKind) -> Handle {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next(kind)
    }

    fn stream(&self, handle: u64) -> Result<&StreamEntry<B>> {
        if handle == 0 {
            return self
                .default_stream
                .as_ref()
                .ok_or_else(|| Error::internal("default stream missing"));
        }
        self.streams.get(handle)
    }

    fn stream_publish(&self, stream: u64, seq: u64) -> Result<Publish> {
        Ok(Publish {
            channel: self.channel.clone(),
            slot: self.stream(stream)?.slot,
            seq,
        })
    }

    fn allocations(&self) -> std::sync::RwLockReadGuard<'_, AllocTable> {
        self.ctx
            .allocations
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn check_device(&self, addr: u64, len: u64, what: &str) -> Result<()> {
        self.allocations()
            .check_range(addr, len, what, Status::InvalidHandle)
    }

    /// Host bytes named by a copy. The staging area's bytes are taken now for a host-to-device
    /// copy (`take`), so the client may reuse the staging area as soon as the reply arrives.
    fn host_bytes(&self, r: HostRef, len: u64, take: bool) -> Result<HostBytes> {
        let (segment, base, limit, what) = match r {
            HostRef::Staging { offset } => {
                let (ptr, staging_len) = self.channel.staging();
                let seg = self.channel.client_segment();
                (
                    seg.clone(),
                    ptr as usize - seg.as_ptr() as usize,
                    staging_len,
                    offset,
                )
            }
            HostRef::Buffer { handle, offset } => {
                let seg = self.host.get(handle)?;
                (seg.clone(), 0, seg.len(), offset)
            }
        };
        let end = what.checked_add(len);
        if end.is_none_or(|e| e > limit as u64) {
            return Err(Error::invalid_value(format!(
                "host range {what}+{len} runs past the end of its {limit}-byte {}",
                match r {
                    HostRef::Staging { .. } => "staging area",
                    HostRef::Buffer { .. } => "host buffer",
                }
            )));
        }
        let offset = base + what as usize;
        if take {
            let mut copy = vec![0u8; len as usize].into_boxed_slice();
            // SAFETY: offset + len lies inside the segment (checked above); the client may be
            // writing these bytes concurrently, which can only change what we copy.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    segment.as_ptr().add(offset),
                    copy.as_mut_ptr(),
                    len as usize,
                )
            };
            return Ok(HostBytes::Owned(copy));
        }
        Ok(HostBytes::Shared {
            segment,
            offset,
            len: len as usize,
        })
    }

    /// Queues stream-ordered work, publishing the command's stream progress if it asks.
    fn enqueue(&self, cmd: &Command, op: Op<B>) -> Result<Completion> {
        let s = self.stream(cmd.stream)?;
        let publish = if cmd.flags & flags::MARK != 0 {
            Some(self.stream_publish(cmd.stream, cmd.seq)?)
        } else {
            None
        };
        self.backend.submit(&s.stream, cmd.seq, op, publish)?;
        Ok(Completion::reply(cmd.seq, [0; 4]))
    }

    /// Waits for all of this client's work (before freeing memory it may use, as cuMemFree
    /// does).
    fn synchronize_all(&self) -> Result<()> {
        let streams = self
            .default_stream
            .iter()
            .chain(self.streams.iter().map(|(_, s)| s));
        for s in streams {
            self.backend
                .stream_synchronize(&s.stream, &self.ctx.closing)?;
        }
        Ok(())
    }

    fn execute(&mut self, cmd: &Command, req: Request<'_>) -> Result<Completion> {
        let seq = cmd.seq;
        let ok = |values| Ok(Completion::reply(seq, values));
        if !matches!(req.opcode(), o if o.is_stream_ordered()) && cmd.stream != 0 {
            return Err(Error::invalid_value(format!(
                "{:?} is not stream-ordered but names stream {:#x}",
                req.opcode(),
                cmd.stream
            )));
        }
        match req {
            Request::MemAlloc { size } => {
                if size == 0 {
                    return Err(Error::invalid_value("cannot allocate 0 bytes"));
                }
                let limit = self.mem_limit.load(Ordering::Relaxed);
                let held = self.allocations().bytes();
                if limit != 0 && held.saturating_add(size) > limit {
                    return Err(Error::new(
                        Status::QuotaExceeded,
                        format!(
                            "allocating {size} bytes would take this client to {} bytes, past its \
                             device-memory limit of {limit} (MPS_PINNED_DEVICE_MEM_LIMIT, or the \
                             operator's set_device_pinned_mem_limit)",
                            held + size
                        ),
                    ));
                }
                let ptr = self.backend.mem_alloc(size)?;
                let mut table = self
                    .ctx
                    .allocations
                    .write()
                    .unwrap_or_else(|p| p.into_inner());
                if let Err(e) = table.insert(ptr, size) {
                    self.backend.mem_free(ptr, size);
                    return Err(e);
                }
                ok([ptr, 0, 0, 0])
            }
            Request::MemFree { ptr } => {
                // Fail early (before synchronising) on a pointer that is not ours.
                let found = self.allocations().find(ptr);
                let size = match found {
                    Some((start, size)) if start == ptr => size,
                    _ => {
                        let mut table = self
                            .ctx
                            .allocations
                            .write()
                            .unwrap_or_else(|p| p.into_inner());
                        return Err(table
                            .remove(ptr)
                            .expect_err("pointer was not found a moment ago"));
                    }
                };
                self.synchronize_all()?;
                self.ctx
                    .allocations
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(ptr)?;
                self.backend.mem_free(ptr, size);
                ok([0; 4])
            }
            Request::MemGetInfo => {
                let (free, total) = self.backend.mem_get_info();
                let limit = self.mem_limit.load(Ordering::Relaxed);
                if limit == 0 {
                    return ok([free, total, 0, 0]);
                }
                // Under a limit, the limit is the client's device.
                let held = self.allocations().bytes();
                ok([limit.saturating_sub(held).min(free), limit, 0, 0])
            }
            Request::SetPriority { level } => {
                // A client may only lower what the server set.
                let new = self.priority.fetch_max(level, Ordering::Relaxed).max(level);
                self.apply_priority();
                ok([new as u64, 0, 0, 0])
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
                ok([new, 0, 0, 0])
            }
            Request::SetSmShare { percent } => {
                self.registry.set_sm_share(self.id, percent)?;
                Ok(Completion::reply(seq, self.registry.sm_info(self.id)?))
            }
            Request::ReserveSms { percent } => {
                self.registry.reserve_sms(self.id, percent)?;
                Ok(Completion::reply(seq, self.registry.sm_info(self.id)?))
            }
            Request::SmInfo => Ok(Completion::reply(seq, self.registry.sm_info(self.id)?)),
            Request::HostAlloc { size } => self.host_alloc(seq, size),
            Request::HostFree { handle } => {
                self.host.get(handle)?;
                self.synchronize_all()?;
                let seg = self.host.remove(handle)?;
                self.backend.host_unregister(&seg);
                ok([0; 4])
            }
            Request::CopyHtoD { dst, src, len } => {
                self.check_device(dst, len, "copy destination")?;
                self.stats.copied(len);
                let src = self.host_bytes(src, len, matches!(src, HostRef::Staging { .. }))?;
                self.enqueue(cmd, Op::CopyHtoD { dst, src })
            }
            Request::CopyDtoH { dst, src, len } => {
                self.check_device(src, len, "copy source")?;
                self.stats.copied(len);
                let dst = self.host_bytes(dst, len, false)?;
                self.enqueue(cmd, Op::CopyDtoH { dst, src })
            }
            Request::CopyDtoD { dst, src, len } => {
                self.check_device(src, len, "copy source")?;
                self.check_device(dst, len, "copy destination")?;
                self.stats.copied(len);
                self.enqueue(cmd, Op::CopyDtoD { dst, src, len })
            }
            Request::Memset {
                dst,
                value,
                elem_size,
                count,
            } => {
                let len = count.checked_mul(elem_size as u64).ok_or_else(|| {
                    Error::invalid_value(format!("memset of {count} elements overflows"))
                })?;
                self.check_device(dst, len, "memset destination")?;
                self.enqueue(
                    cmd,
                    Op::Memset {
                        dst,
                        value,
                        elem_size,
                        count,
                    },
                )
            }
            Request::ModuleData {
                staging_offset,
                len,
                last,
            } => self.module_data(seq, staging_offset, len, last),
            Request::ModuleUnload { module } => {
                let m = self.modules.remove(module)?;
                self.functions.retain(|f| f.module != Handle(module));
                drop(m);
                ok([0; 4])
            }
            Request::GetFunction { module, name } => {
                let m = self.modules.get(module)?.clone();
                let name = std::str::from_utf8(name)
                    .map_err(|_| Error::invalid_value("kernel name is not UTF-8"))?;
                self.functions.ensure_room()?;
                let (function, params) = self.backend.module_function(&m, name)?;
                let h = self.next_handle(HandleKind::Function);
                let bytes = params.last().map_or(0, |p| p.offset + p.size);
                let count = params.len() as u64;
                self.functions.insert(
                    h,
                    FunctionEntry {
                        module: Handle(module),
                        function: Arc::new(function),
                        params,
                    },
                )?;
                ok([h.0, count, bytes as u64, 0])
            }
            Request::ParamInfo { function, first } => {
                let f = self.functions.get(function)?;
                let rest = f.params.get(first as usize..).unwrap_or(&[]);
                let page = &rest[..rest.len().min(PARAMS_PER_REPLY)];
                let mut c = Completion::reply(seq, [page.len() as u64, 0, 0, 0]);
                let bytes = bytemuck::cast_slice::<ParamInfo, u8>(page);
                c.data[..bytes.len()].copy_from_slice(bytes);
                c.data_len = bytes.len() as u32;
                Ok(c)
            }
            Request::Launch {
                function,
                grid,
                block,
                shared_mem,
                params,
            } => {
                let f = self.functions.get(function)?;
                protocol::check_geometry(grid, block, shared_mem)?;
                let expected = f.params.last().map_or(0, |p| p.offset + p.size) as usize;
                if params.len() != expected {
                    return Err(Error::invalid_value(format!(
                        "kernel takes {expected} bytes of parameters, the launch carries {}",
                        params.len()
                    )));
                }
                self.stats.launched();
                let op = Op::Launch {
                    function: f.function.clone(),
                    grid,
                    block,
                    shared_mem,
                    // Borrowed from this thread's copy of the command: the only copy.
                    params: std::borrow::Cow::Borrowed(params),
                };
                self.enqueue(cmd, op)
            }
            Request::StreamCreate { priority } => {
                self.streams.ensure_room()?;
                // The table holds as many streams as there are slots besides the default's.
                let slot = self.stream_slots.take().ok_or_else(|| {
                    Error::internal("no stream slot left although the stream table has room")
                })?;
                // A below-normal client's streams get the device's least urgent priority (the
                // backend clamps to its range).
                let priority =
                    if self.priority.load(Ordering::Relaxed) >= protocol::PRIORITY_BELOW_NORMAL {
                        i32::MAX
                    } else {
                        priority
                    };
                let stream = match self.backend.stream_create(priority, &self.ctx) {
                    Ok(s) => s,
                    Err(e) => {
                        self.stream_slots.give_back(slot);
                        return Err(e);
                    }
                };
                let h = self.next_handle(HandleKind::Stream);
                self.streams.insert(h, StreamEntry { slot, stream })?;
                ok([h.0, slot as u64, 0, 0])
            }
            Request::StreamDestroy { stream } => {
                if stream == 0 {
                    return Err(Error::invalid_value(
                        "the default stream cannot be destroyed",
                    ));
                }
                let s = self.streams.remove(stream)?;
                self.backend.stream_destroy(s.stream);
                self.stream_slots.give_back(s.slot);
                ok([0; 4])
            }
            Request::Mark => self.enqueue(cmd, Op::Nop),
            Request::EventCreate => {
                self.events.ensure_room()?;
                let event = Arc::new(self.backend.event_create()?);
                let h = self.next_handle(HandleKind::Event);
                self.events.insert(h, event)?;
                ok([h.0, 0, 0, 0])
            }
            Request::EventDestroy { event } => {
                self.events.remove(event)?;
                ok([0; 4])
            }
            Request::EventRecord { event } => {
                let e = self.events.get(event)?.clone();
                self.enqueue(cmd, Op::Record(e))
            }
            Request::StreamWaitEvent { event } => {
                let e = self.events.get(event)?.clone();
                self.enqueue(cmd, Op::Wait(e))
            }
            Request::EventElapsed { start, end } => {
                let s = self.events.get(start)?;
                let e = self.events.get(end)?;
                let ms = self.backend.event_elapsed_ms(s, e)?;
                ok([ms.to_bits() as u64, 0, 0, 0])
            }
        }
    }

    fn host_alloc(&mut self, seq: u64, size: u64) -> Result<Completion> {
        if size == 0 {
            return Err(Error::invalid_value("cannot allocate a 0-byte host buffer"));
        }
        if size > MAX_HOST_BUFFER_BYTES {
            return Err(Error::new(
                Status::OutOfMemory,
                format!(
                    "a host buffer of {size} bytes is larger than the {MAX_HOST_BUFFER_BYTES}-byte limit"
                ),
            ));
        }
        self.host.ensure_room()?;
        let seg = Segment::create("mps-host", size.next_multiple_of(4096) as usize)?;
        self.backend.host_register(&seg)?;
        let h = self.next_handle(HandleKind::HostBuffer);
        let msg = HostBufferFd {
            magic: MAGIC,
            reserved: 0,
            handle: h.0,
            size: seg.len() as u64,
        };
        if let Err(e) = socket::send(&self.socket, bytemuck::bytes_of(&msg), &[seg.fd().as_fd()]) {
            self.backend.host_unregister(&seg);
            return Err(Error::new(
                Status::Connection,
                format!("could not send the host buffer to the client: {e}"),
            ));
        }
        let len = seg.len() as u64;
        self.host.insert(h, Arc::new(seg))?;
        Ok(Completion::reply(seq, [h.0, len, 0, 0]))
    }

    fn module_data(&mut self, seq: u64, offset: u64, len: u64, last: bool) -> Result<Completion> {
        let (staging, staging_len) = self.channel.staging();
        if offset
            .checked_add(len)
            .is_none_or(|e| e > staging_len as u64)
        {
            self.pending_image.clear();
            return Err(Error::invalid_value(format!(
                "module data {offset}+{len} runs past the {staging_len}-byte staging area"
            )));
        }
        if self.pending_image.len() as u64 + len > MAX_MODULE_BYTES {
            self.pending_image.clear();
            return Err(Error::invalid_value(format!(
                "module image is larger than the {MAX_MODULE_BYTES}-byte limit"
            )));
        }
        let at = self.pending_image.len();
        self.pending_image.resize(at + len as usize, 0);
        // SAFETY: offset + len lies inside the staging area (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(
                staging.add(offset as usize),
                self.pending_image[at..].as_mut_ptr(),
                len as usize,
            )
        };
        if !last {
            return Ok(Completion::reply(seq, [0; 4]));
        }
        let image = std::mem::take(&mut self.pending_image);
        self.modules.ensure_room()?;
        let module = self.backend.module_load(&image)?;
        let h = self.next_handle(HandleKind::Module);
        self.modules.insert(h, Arc::new(module))?;
        Ok(Completion::reply(seq, [h.0, 0, 0, 0]))
    }

    fn teardown(mut self) {
        self.registry.remove(self.id);
        self.ctx.closing.store(true, Ordering::SeqCst);
        let reason = self
            .outbox
            .disconnect_reason()
            .unwrap_or_else(|| "server is stopping".into());
        let streams = self.streams.len() + 1;
        for (_, s) in self.streams.drain() {
            self.backend.stream_destroy(s.stream);
        }
        if let Some(s) = self.default_stream.take() {
            self.backend.stream_destroy(s.stream);
        }
        // No work of this client runs any more: its memory can go back.
        let mut table = self
            .ctx
            .allocations
            .write()
            .unwrap_or_else(|p| p.into_inner());
        let (count, bytes) = (table.len(), table.bytes());
        for (ptr, size) in table.iter() {
            self.backend.mem_free(ptr, size);
        }
        *table = AllocTable::default();
        drop(table);
        let host = self.host.len();
        for (_, seg) in self.host.drain() {
            self.backend.host_unregister(&seg);
        }
        self.backend.host_unregister(self.channel.client_segment());
        self.backend.host_unregister(self.channel.server_segment());
        tracing::info!(
            client = self.id,
            pid = self.peer.pid,
            uid = self.peer.uid,
            "client disconnected ({reason}); released {count} allocations ({bytes} bytes), \
             {streams} streams, {} events, {} modules, {host} host buffers",
            self.events.len(),
            self.modules.len(),
        );
    }
}

/// Reads the client's hello and checks it; returns the error to send back, if any.
pub(crate) fn check_hello(hello: &protocol::Hello) -> Result<()> {
    if hello.magic != MAGIC {
        return Err(Error::new(
            Status::ProtocolMismatch,
            "not an mps client (bad magic in hello)",
        ));
    }
    if hello.version != protocol::PROTOCOL_VERSION {
        return Err(Error::new(
            Status::ProtocolMismatch,
            format!(
                "client speaks protocol version {}, this server speaks {}; use a libmpsclient of the server's release",
                hello.version,
                protocol::PROTOCOL_VERSION
            ),
        ));
    }
    Ok(())
}

/// The group a checked hello asks for.
pub(crate) fn hello_group(hello: &protocol::Hello) -> Result<String> {
    let group = protocol::get_str(&hello.group);
    protocol::check_group(&group)?;
    Ok(group)
}
