//! One client's session: the shell that reads the client's submission ring under the
//! hostile-client rules, a bounded number of commands per call ([`Session::step`]); what each
//! command means (the client's tables, limits and checks) is the state machine in `core.rs`,
//! which this shell feeds and whose answers it posts. When the client goes away, everything it
//! held is released here. Which thread calls `step`, and how it sleeps, is `workers.rs`'s
//! business (or [`Session::run`]'s, for a thread per client); hang-ups are seen by `watch.rs`.

mod core;
mod limits;
mod stall;
mod tables;
#[cfg(test)]
mod tests;
mod watch;
mod workers;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use mps_core::alloc::AllocTable;
use mps_core::protocol::{
    self, Command, Completion, CompletionKind, MAX_COMMAND_SLOTS, Opcode, SLOT_BYTES,
};
use mps_core::{Error, Result, Status};
use mps_ipc::channel::{Channel, ShmRing};
use mps_ipc::doorbell::Doorbell;
use mps_ipc::ring::{Consumer, Producer, RingMemory};
use mps_ipc::socket::{self, Peer};

use self::core::{Output, SessionCore, Shared};
use crate::backend::{Backend, ClientContext};
use crate::outbox::Outbox;
use crate::registry::{ClientEntry, Registry};

pub use limits::{BatchPacing, Limits};
pub(crate) use tables::HandleIssuer;
pub(crate) use watch::Watcher;
pub(crate) use workers::Workers;

/// How long it sleeps before looking at its ring and closing flag again (a safety net only:
/// the client rings the bell when it submits to a sleeping session, and the watcher when the
/// client hangs up).
const NAP: Duration = Duration::from_secs(1);

/// How long sending on a client's socket may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

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
    /// A view of the completion ring, only to see whether it has room (the outbox posts).
    completions: Producer<Completion, ShmRing<Completion>>,
    outbox: Arc<Outbox>,
    closing: Arc<AtomicBool>,
    /// The continuation slots of the command being handled, copied out of the ring; a launch's
    /// parameters go to the backend from here (the CUDA backend makes no other copy).
    payload: Vec<u8>,
    /// A command taken from the ring but left for a thread that may wait ([`Step::Waits`]).
    held: Option<Command>,
    /// Since when the ring has been empty while the core holds a batched run.
    hold_since: Option<std::time::Instant>,
    /// How long held commands wait for the client's next command once its ring is empty
    /// (`Limits::batch_hold_us`). A client ends a run it waits for with a mark, which submits
    /// it at once; the hold bounds how long a pause inside a run (the program's own work
    /// between two launches, a descheduled thread) keeps the run together before its commands
    /// go one by one, and how long a client that stopped posting without a mark waits.
    hold: Duration,
    /// The client was told that it need not ring before the held run's last command
    /// ([`Channel::ring_from`]); cleared before the ring is next looked at.
    ring_from_set: bool,
    /// The sequence number of the last command taken, and how many were taken.
    last_seq: u64,
    taken: u64,
    /// What the session handles now, for the socket watcher's stall report.
    activity: Arc<stall::Activity>,
    spin: Duration,
    yield_for: Duration,
    registry: Arc<Registry>,
    /// The client's place under the server's connection limits, given back at teardown.
    admission: Option<crate::intake::Ticket>,
}

impl<B: Backend> Session<B> {
    /// Keeps the client's place under the connection limits until its session ends.
    pub(crate) fn hold(&mut self, ticket: crate::intake::Ticket) {
        self.admission = Some(ticket);
    }

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
        // A client that never reads its socket cannot hold the thread sending it a host
        // buffer for longer than this: the send fails and the client gets an error.
        socket.set_write_timeout(Some(SEND_TIMEOUT)).map_err(|e| {
            Error::new(
                Status::Connection,
                format!("cannot set up the client's socket: {e}"),
            )
        })?;
        let closing = Arc::new(AtomicBool::new(false));
        let gates = Arc::new(crate::backend::HostGates::default());
        let outbox = Arc::new(Outbox::new(
            channel.clone(),
            closing.clone(),
            gates.clone(),
            socket.clone(),
        ));
        let ctx = ClientContext {
            id,
            allocations: Arc::new(RwLock::new(AllocTable::default())),
            closing: closing.clone(),
            faults: outbox.clone(),
            sm: Arc::default(),
            busy_ns: Arc::default(),
            gates,
            priority: Arc::new(AtomicU32::new(registry.default_priority())),
        };
        let shared = Shared {
            backend,
            handles,
            charges: registry.ledger().open(peer.uid, peer.pid),
            registry: registry.clone(),
            limits,
        };
        let core = SessionCore::new(shared, channel.clone(), ctx)?;
        Ok(Session {
            core,
            commands: channel.submit_consumer(),
            completions: channel.complete_producer(),
            id,
            peer,
            socket,
            outbox,
            closing,
            payload: Vec::with_capacity(MAX_COMMAND_SLOTS * SLOT_BYTES),
            held: None,
            hold_since: None,
            hold: Duration::from_micros(limits.batch_hold_us),
            ring_from_set: false,
            last_seq: 0,
            taken: 0,
            activity: Arc::default(),
            spin,
            yield_for,
            registry,
            admission: None,
            channel,
        })
    }

    /// Makes the client known to the registry and its socket watched: called once, on the
    /// thread that will serve it, before its first command.
    pub(crate) fn start(&self, watcher: &Watcher) {
        watcher.watch(watch::Watched {
            socket: self.socket.clone(),
            outbox: self.outbox.clone(),
            activity: self.activity.clone(),
            client: self.id,
            pid: self.peer.pid,
        });
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
                told_sms: std::sync::atomic::AtomicU32::new(0),
            },
        );
    }

    /// The client's id.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// Whether the client asked for below-normal priority.
    pub(crate) fn below_normal(&self) -> bool {
        self.core.priority().load(Ordering::Relaxed) >= protocol::PRIORITY_BELOW_NORMAL
    }

    /// Serves the client on a thread of its own until it goes away, then releases everything
    /// it held (one thread per client: `--session-workers 0`). [`Session::start`] came first.
    pub(crate) fn run(mut self) {
        set_thread_nice(self.below_normal());
        loop {
            match self.step(u32::MAX) {
                Step::Closed => break,
                Step::Idle => self.wait_for_commands(),
                Step::Retier => set_thread_nice(self.below_normal()),
                // A client not draining its completions: look again gently, as posting would.
                Step::Blocked => std::thread::sleep(Duration::from_millis(1)),
                Step::Waits => self.handle_held(),
                Step::Holds { due, unrung } => {
                    let left = due.saturating_duration_since(std::time::Instant::now());
                    let spin = if unrung { Duration::ZERO } else { self.spin };
                    let ready = || self.has_work();
                    self.channel.submit_bell().wait(spin.min(left), left, ready);
                }
                Step::More => {}
            }
        }
        self.teardown();
    }

    /// Handles at most `budget` of the client's commands. A panic while serving (a bug)
    /// disconnects this client with a logged reason; other clients carry on.
    pub(crate) fn step(&mut self, budget: u32) -> Step {
        let tier = self.below_normal();
        let stepped =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.take(budget, tier)));
        stepped.unwrap_or_else(|_| {
            self.outbox
                .disconnect("an internal error in the server (a panic, logged above)".into());
            Step::Closed
        })
    }

    fn take(&mut self, budget: u32, tier: bool) -> Step {
        if self.ring_from_set {
            // Cleared before the ring is read, as the client publishes its tail before it
            // reads this: a command it left unrung is seen below, or it rings.
            self.ring_from_set = false;
            self.channel.ring_from().store(0, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        for _ in 0..budget {
            if self.closing.load(Ordering::Relaxed) {
                return Step::Closed;
            }
            // Taking a command whose answer could not be posted would hold the thread (and
            // every other client it serves) until this client drains its completions.
            if !self.completion_room() {
                self.flush_run();
                return Step::Blocked;
            }
            let cmd = self.take_one();
            if let Some(cmd) = &cmd {
                self.activity.taking(self.taken + 1, cmd.opcode);
            }
            match cmd {
                Some(cmd) if may_wait(cmd.opcode) => {
                    self.held = Some(cmd);
                    return Step::Waits;
                }
                Some(cmd) => {
                    self.handle(&cmd);
                    self.activity.done(self.taken);
                    if cmd.opcode == Opcode::SetPriority as u16 && self.below_normal() != tier {
                        return Step::Retier;
                    }
                }
                None if self.closing.load(Ordering::Relaxed) => return Step::Closed,
                None if self.core.holds_run() => {
                    // Held work waits a moment for the rest of its run, never longer.
                    let now = std::time::Instant::now();
                    let since = *self.hold_since.get_or_insert(now);
                    if now.duration_since(since) < self.hold {
                        let unrung = self.leave_unrung();
                        return Step::Holds {
                            due: since + self.hold,
                            unrung,
                        };
                    }
                    self.flush_run();
                    return Step::Idle;
                }
                None => return Step::Idle,
            }
        }
        Step::More
    }

    /// Tells the client that commands that continue the held run need no ring before the one
    /// that would complete a shape ([`Channel::ring_from`]), where that is two commands or
    /// more away; whether it did. The worker then sleeps at once where all its clients hold such
    /// runs: what it holds does not go before that command comes, a mark ends the run, or the
    /// hold runs out (unrung commands taken then start a new hold).
    fn leave_unrung(&mut self) -> bool {
        let Some((stream, left)) = self.core.run_to_complete() else {
            return false;
        };
        if left < 2 {
            return false;
        }
        self.channel.ring_stream().store(stream, Ordering::SeqCst);
        let from = self.last_seq.saturating_add(left as u64);
        self.channel.ring_from().store(from, Ordering::SeqCst);
        self.ring_from_set = true;
        // Published before the worker's last look at the ring before it sleeps.
        std::sync::atomic::fence(Ordering::SeqCst);
        true
    }

    /// Submits the commands the core holds for a batched run, posting their errors.
    fn flush_run(&mut self) {
        self.hold_since = None;
        if self.core.holds_run() {
            self.activity.flushing(self.taken);
            self.core.flush_held();
            self.activity.done(self.taken);
            for c in self.core.take_batch_errors() {
                self.outbox.post(c);
            }
        }
    }

    /// Handles the command that [`Step::Waits`] held back (its payload is still in
    /// `payload`). A panic disconnects the client, as in [`Session::step`].
    pub(crate) fn handle_held(&mut self) {
        let Some(cmd) = self.held.take() else { return };
        let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.handle(&cmd)));
        self.activity.done(self.taken);
        if handled.is_err() {
            self.outbox
                .disconnect("an internal error in the server (a panic, logged above)".into());
        }
    }

    /// Whether the completion ring has [`ANSWER_ROOM`](crate::outbox::ANSWER_ROOM).
    /// A corrupt ring reads as room: posting then finds the corruption and disconnects.
    fn completion_room(&self) -> bool {
        let ring = self.completions.memory();
        let tail = ring.tail().load(Ordering::Relaxed);
        let head = ring.head().load(Ordering::Acquire);
        ring.capacity().wrapping_sub(tail.wrapping_sub(head)) >= crate::outbox::ANSWER_ROOM
    }

    /// Whether the client has something for its session to look at: a command, or its end.
    /// A client with commands but no room for their answers has none: it is served again once
    /// it drains its completions (its library then rings its doorbell), so that a client that
    /// stops reading them costs its worker nothing.
    pub(crate) fn has_work(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
            || (self.commands.available() != Ok(0) && self.completion_room())
    }

    /// The doorbell the client rings after submitting.
    pub(crate) fn bell(&self) -> Doorbell<'_> {
        self.channel.submit_bell()
    }

    /// Takes the next command and its payload out of the ring, under the hostile-client rules;
    /// `None` when there is none, or when the client was disconnected for what it wrote.
    fn take_one(&mut self) -> Option<Command> {
        let avail = match self.commands.available() {
            Ok(0) => return None,
            Ok(n) => n,
            Err(e) => {
                self.outbox
                    .disconnect(format!("corrupted its submission ring: {e}"));
                return None;
            }
        };
        let cmd = self.commands.peek(0);
        let extra = cmd.extra_slots as u32;
        if extra as usize >= MAX_COMMAND_SLOTS {
            self.outbox.disconnect(format!(
                "sent command #{} claiming {extra} payload slots (at most {})",
                cmd.seq,
                MAX_COMMAND_SLOTS - 1
            ));
            return None;
        }
        if avail < 1 + extra {
            // Clients publish a command and its payload together.
            self.outbox.disconnect(format!(
                "published command #{} without its {extra} payload slots",
                cmd.seq
            ));
            return None;
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
        Some(cmd)
    }

    /// Spins, then looks again after each yield of the processor, then sleeps on the
    /// submission doorbell: a client waiting for its stream submits again the moment the wait
    /// ends, and a sleeping session thread would add its wake-up to every such cycle. Once
    /// asleep it stays asleep until there is work or the client is closing: an idle client
    /// costs one look per nap, not a spin and a round of yields.
    fn wait_for_commands(&self) {
        let ready = || self.has_work();
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
        self.hold_since = None;
        self.last_seq = cmd.seq;
        self.taken += 1;
        // Once accepted work failed, every later command fails the same way.
        let output = match self.outbox.fault() {
            Some(fault) => Output::Post(Completion::error(cmd.seq, CompletionKind::Reply, &fault)),
            None => self.core.handle(cmd, &self.payload),
        };
        // Errors of held commands this command made the core submit come first: they are
        // earlier commands'.
        for c in self.core.take_batch_errors() {
            self.outbox.post(c);
        }
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
    }

    /// Releases everything the client held and forgets it.
    pub(crate) fn teardown(self) {
        self.registry.remove(self.id);
        self.closing.store(true, Ordering::SeqCst);
        let reason = self
            .outbox
            .disconnect_reason()
            .unwrap_or_else(|| "server is stopping".into());
        let stats = self.core.stats().clone();
        let enders = self.core.batch_enders();
        let paced = self.core.batch_paced();
        let r = self.core.release();
        let [hits, misses, graphs, learned, diverged] = [
            &stats.batch_hits,
            &stats.batch_misses,
            &stats.batch_graphs,
            &stats.batch_learned,
            &stats.batch_diverged,
        ]
        .map(|c| c.load(Ordering::Relaxed));
        if hits + misses > 0 {
            // The client bumps its doorbell's word once per ring.
            let rings = self.channel.submit_bell().value();
            tracing::info!(
                client = self.id,
                "launch batching: {hits} runs launched from cached graphs, {misses} not \
                 (graphs made: {graphs}; shapes learned: {learned}; held runs that left \
                 their shape: {diverged}; doorbell rings: {rings} for {} commands)",
                self.taken
            );
        }
        if !enders.is_empty() {
            tracing::info!(client = self.id, "launch batching: runs ended by {enders}");
        }
        if !paced.is_empty() {
            tracing::info!(
                client = self.id,
                "launch batching: slowly posted runs: {paced}"
            );
        }
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

/// What one [`Session::step`] left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The ring is empty.
    Idle,
    /// The budget ran out with commands possibly left.
    More,
    /// The ring is empty while the core holds a batched run: nothing is due before `due`
    /// unless the client posts. The worker waits as an idle one does, sleeping after its spin,
    /// rather than spinning throughout (a held run is not waited for; a mark ends it at once);
    /// the client's next command wakes it as a sleeping worker's would. Where `unrung`, the
    /// client was told to leave the run's commands unrung until the one that completes it
    /// ([`Channel::ring_from`]): spinning or yielding would only see them early, so the worker
    /// sleeps at once.
    Holds {
        due: std::time::Instant,
        unrung: bool,
    },
    /// The client's completion ring is full: nothing is taken until it drains some.
    Blocked,
    /// The client changed its priority: it belongs with threads of the other priority.
    Retier,
    /// The next command may wait for the device (see [`may_wait`]); it was taken but not
    /// handled: [`Session::handle_held`] handles it, on a thread that may wait.
    Waits,
    /// The client is gone: tear the session down.
    Closed,
}

/// Whether a command can wait for the device (for the client's streams to drain, or for a
/// module to load) rather than only queue work: frees synchronise first, a stream's destruction
/// waits for its running work, the last chunk of a module loads it, an unload may wait. A host
/// buffer's descriptor goes out on the client's socket, which a client that never reads it can
/// fill. The command table marks these `waits` ([`Opcode::may_wait`]).
fn may_wait(opcode: u16) -> bool {
    Opcode::from_u16(opcode).is_some_and(Opcode::may_wait)
}

/// Gives the calling thread the CPU priority of a client priority: a below-normal client's
/// commands are taken after normal clients' when the server's CPUs are busy.
pub(crate) fn set_thread_nice(below_normal: bool) {
    let nice = if below_normal { 10 } else { 0 };
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority only reads its arguments; on Linux PRIO_PROCESS with a thread id
    // sets that thread's nice value. Lowering priority needs no privilege; a failure leaves the
    // thread as it was, which is only a missed preference (raising it back to 0 needs
    // CAP_SYS_NICE, which is why threads of the two priorities are kept apart).
    let r = unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, tid as u32, nice) };
    if r != 0 {
        tracing::debug!("setpriority({nice}) failed");
    }
}
