//! One client's session. Its thread reads the client's submission ring under the hostile-client
//! rules and sleeps on the doorbell; what each command means (the client's tables, limits and
//! checks) is the state machine in `core.rs`, which this shell feeds and whose answers it posts.
//! When the client goes away, everything it held is released here.

mod core;
mod limits;
mod tables;
#[cfg(test)]
mod tests;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use mps_core::alloc::AllocTable;
use mps_core::protocol::{
    self, Command, Completion, CompletionKind, MAGIC, MAX_COMMAND_SLOTS, Opcode, SLOT_BYTES,
};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, ShmRing};
use mps_ipc::ring::Consumer;
use mps_ipc::socket::{self, Peer};

use self::core::{Output, SessionCore, Shared};
use crate::backend::{Backend, ClientContext};
use crate::outbox::Outbox;
use crate::registry::{ClientEntry, Registry};

pub use limits::Limits;
pub(crate) use tables::HandleIssuer;

/// How long it sleeps before looking at its ring and closing flag again (a safety net only:
/// the client rings the bell when it submits to a sleeping session, and the watcher when the
/// client hangs up).
const NAP: Duration = Duration::from_secs(1);

/// What every session of a server shares.
pub(crate) struct ServerEnv<B: Backend> {
    pub(crate) backend: Arc<B>,
    pub(crate) handles: Arc<HandleIssuer>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) limits: Limits,
    /// How long the session thread spins, then yields, before it sleeps.
    pub(crate) waits: (Duration, Duration),
}

/// One connected client: the I/O around its [`SessionCore`].
pub(crate) struct Session<B: Backend> {
    core: SessionCore<B>,
    id: u32,
    peer: Peer,
    channel: Channel,
    socket: Arc<UnixStream>,
    commands: Consumer<Command, ShmRing<Command>>,
    outbox: Arc<Outbox>,
    closing: Arc<AtomicBool>,
    /// The continuation slots of the command being handled, copied out of the ring; a launch's
    /// parameters go to the backend from here (the CUDA backend makes no other copy).
    payload: Vec<u8>,
    spin: Duration,
    yield_for: Duration,
    registry: Arc<Registry>,
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
            limits,
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
            closing: closing.clone(),
            faults: outbox.clone(),
            sm: Arc::default(),
            busy_ns: Arc::default(),
        };
        let shared = Shared {
            backend,
            handles,
            registry: registry.clone(),
            limits,
        };
        let core = SessionCore::new(shared, channel.clone(), ctx)?;
        Ok(Session {
            core,
            commands: channel.submit_consumer(),
            id,
            peer,
            socket,
            outbox,
            closing,
            payload: Vec::with_capacity(MAX_COMMAND_SLOTS * SLOT_BYTES),
            spin,
            yield_for,
            registry,
            channel,
        })
    }

    /// Watches the socket for the client's hang-up (or for bytes it must not send), on a thread
    /// of its own so that the session thread can sleep on the submission doorbell alone.
    fn spawn_watcher(&self) -> std::io::Result<()> {
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
        if let Err(e) = self.spawn_watcher() {
            // A hang-up would go unnoticed: the client is turned away, and what it was given
            // goes back.
            self.outbox.disconnect(format!(
                "the server could not start a thread to watch its socket: {e}"
            ));
            return self.teardown();
        }
        let ctx = self.core.context();
        self.registry.add(
            self.id,
            ClientEntry {
                pid: self.peer.pid,
                uid: self.peer.uid,
                outbox: self.outbox.clone(),
                stats: self.core.stats().clone(),
                allocations: ctx.allocations.clone(),
                mem_limit: self.core.mem_limit().clone(),
                priority: self.core.priority().clone(),
                sm: ctx.sm.clone(),
                busy_ns: ctx.busy_ns.clone(),
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
        let level = self.core.priority().load(Ordering::Relaxed);
        let nice = if level >= protocol::PRIORITY_BELOW_NORMAL {
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

    fn serve(&mut self) {
        loop {
            if self.closing.load(Ordering::Relaxed) {
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
                self.wait_for_commands();
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
            // Copied out before anything reads it, so that a client rewriting its slots cannot
            // change a command after it was checked.
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
            self.handle(&cmd);
        }
    }

    /// Spins, then looks again after each yield of the processor, then sleeps on the
    /// submission doorbell: a client waiting for its stream submits again the moment the wait
    /// ends, and a sleeping session thread would add its wake-up to every such cycle. Once
    /// asleep it stays asleep until there is work or the client is closing: an idle client
    /// costs one look per nap, not a spin and a round of yields.
    fn wait_for_commands(&self) {
        let commands = &self.commands;
        let closing = &self.closing;
        let ready = || closing.load(Ordering::Relaxed) || commands.available() != Ok(0);
        let bell = self.channel.submit_bell();
        bell.wait(self.spin, self.spin, ready);
        let until = std::time::Instant::now() + self.yield_for;
        while !ready() && std::time::Instant::now() < until {
            std::thread::yield_now();
        }
        while !ready() {
            bell.wait(Duration::ZERO, NAP, ready);
        }
    }

    fn handle(&mut self, cmd: &Command) {
        // Once accepted work failed, every later command fails the same way.
        let output = match self.outbox.fault() {
            Some(fault) => Output::Post(Completion::error(cmd.seq, CompletionKind::Reply, &fault)),
            None => self.core.handle(cmd, &self.payload),
        };
        match output {
            Output::Silent => {}
            Output::Post(c) => self.outbox.post(c),
            Output::HostBuffer {
                segment,
                message,
                reply,
            } => {
                let sent = socket::send(
                    &self.socket,
                    bytemuck::bytes_of(&message),
                    &[segment.fd().as_fd()],
                );
                match sent {
                    Ok(_) => {
                        if let Some(reply) = reply {
                            self.outbox.post(reply);
                        }
                    }
                    Err(e) => {
                        self.core.host_buffer_unsent(message.handle);
                        let err = Error::new(
                            Status::Connection,
                            format!("could not send the host buffer to the client: {e}"),
                        );
                        self.outbox
                            .post(Completion::error(cmd.seq, CompletionKind::Reply, &err));
                    }
                }
            }
        }
        if cmd.opcode == Opcode::SetPriority as u16 {
            self.apply_priority();
        }
    }

    fn teardown(self) {
        self.registry.remove(self.id);
        self.closing.store(true, Ordering::SeqCst);
        let reason = self
            .outbox
            .disconnect_reason()
            .unwrap_or_else(|| "server is stopping".into());
        let r = self.core.release();
        tracing::info!(
            client = self.id,
            pid = self.peer.pid,
            uid = self.peer.uid,
            "client disconnected ({reason}); released {} allocations ({} bytes), {} streams, \
             {} events, {} modules, {} host buffers",
            r.allocations,
            r.bytes,
            r.streams,
            r.events,
            r.modules,
            r.host_buffers,
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
