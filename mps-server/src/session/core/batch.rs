//! Launch batching: a run of stream-ordered commands on one stream that repeats an earlier run
//! command for command is launched as one cached graph instead of one backend call per command.
//!
//! * **What a run is.** Copies from and to host buffers (not the staging area, whose bytes
//!   change under a replay), device-to-device copies, memsets and kernel launches (in
//!   clusters too), on one stream, carrying neither `MARK` nor `REPLY`, in a stream that is
//!   not capturing a graph of the client's own. Any other command ends the run: an event record or wait, a mark (a
//!   synchronise or query), a free, a graph command, a command on another stream, a command
//!   that fails. The shell also ends the *holding* of a run when the ring has stayed empty for
//!   a moment (see `session/mod.rs`), so a client that stops posting is never kept waiting.
//! * **Learning.** Commands are submitted one by one as always while the run matches no known
//!   shape; when the run ends, its shape (every command's kind, kernel, geometry, shared
//!   memory, parameters, addresses and sizes) is remembered.
//! * **Holding.** A command that continues the prefix of a known shape is validated as always,
//!   then held instead of submitted. A command that diverges from every known shape has the
//!   held ones submitted first, one by one, in order (nothing is lost or reordered, and
//!   work that matches no shape is never held).
//! * **Launching.** When the held commands make up a whole known shape, the run goes to its
//!   stream as one graph launch: the shape's executable graph if it has one (a hit), else one
//!   made now by capturing the held commands in the stream, then kept (an instantiation). A
//!   run is therefore launched from a graph from its third appearance on. A shape launched
//!   before its run ends (no longer shape continues it) does not end the run: what follows
//!   begins new held commands, but the run is learned whole when it ends. Otherwise a short
//!   shape learned while a program warmed up (its runs cut short by module loads and
//!   allocations) would cut each later run into pieces of its length, one graph launch each,
//!   and the run as it now comes would never be learned. Held commands that must go before
//!   the shape they follow is whole (the run left it, or the client paused past the hold) go
//!   as the shapes with graphs that stretches of them make up, longest first from the front,
//!   and the others one by one, all in order.
//! * **Graphs must pay.** Making a graph costs far more than launching a run command by
//!   command, so a graph launched only for the run it was made for is a loss. A shape's graph
//!   is made at its second appearance. A graph that served no run but that one while the
//!   client went on to learn `PROBATION` new shapes, or that leaves the cache so, is judged
//!   made for nothing (its graph goes); if it was made under the current rule, the
//!   appearances a shape needs before its graph is made double (up to `BUILD_AT_MOST`). A
//!   client whose runs each repeat only a few times thus stops paying for graphs after a few
//!   of them per doubling, and its runs are then not held at all: only shapes with a graph, or
//!   due one at this appearance, hold commands. Holding must pay too: a held run that leaves
//!   the shape it followed was delayed for nothing, and `DEPARTURES` of them with no run
//!   launched from a graph in between double the appearances in the same way. A real model's
//!   runs can begin alike and then differ (a copy's address that moves from one request to
//!   the next), so without this every run of them was held and sent again command by command,
//!   while no graph was ever made to stop the holding. And a held run costs its client the
//!   time the run took to arrive: the device could have been running its first commands
//!   meanwhile. Where the client posts its commands in a burst, faster than the server could
//!   submit them one by one, that time is short and the graph wins; where it posts each
//!   command well after the last (a Python program's launches, `BURST_GAP` apart or more
//!   between them on average), command-by-command submission keeps up with it and holding only
//!   delays the run. With pacing on (`Limits::batch_pacing`), such a *slow* shape is held only
//!   while the machine's CPUs are contended (`crate::cpu_pressure`): then the server's time
//!   per command is taken from the clients, and one graph launch per run gives it back. How
//!   fast a run came is measured each time it appears, as the time the server waited for the
//!   client's next command (its own handling excluded). Holding of any shape begins on free
//!   CPUs only while the client posts in bursts (`Batching::posting_slowly`): a slowly posted
//!   request holds bursts (one library call's launches) that repeat as shapes of their own,
//!   and holding those keeps the device waiting as holding the request would.
//! * **Exactness.** Every command is checked when it arrives, so an invalid one is refused
//!   against its own sequence number, with the held commands before it submitted first. If a
//!   graph cannot be made or launched, the held commands are submitted one by one instead, so
//!   an error that the backend reports is again reported against the command that caused it
//!   (an asynchronous fault while a batched run executes names the run's first command). The
//!   graph launches into the client's own stream, so the stream's priority and the client's
//!   SMs apply to it; a shape's graph is made again after the client's SM placement changed,
//!   since kernel nodes keep the partition they were captured in.
//! * **Parameters are given anew.** A command continues a shape when it is the same work
//!   (`Desc::same_work`): a copy exactly; a memset of the same size, wherever and with whatever
//!   value; a launch of the same kernel in the same clusters with parameters of the same
//!   length, whatever its geometry, shared memory and parameters' values. Before a hit, each
//!   node whose work differs from the run's is given the run's (`Backend::graph_exec_update`);
//!   a launch of the graph already submitted keeps its own. A real model's runs differ in
//!   just this way from one request to the next: its activations and workspaces move, and
//!   reach its kernels as parameters and its libraries' memsets as destinations. A graph that
//!   refuses an update is dropped and its shape is not held again.
//! * **Long runs go in pieces.** A run ends after `Limits::max_batch_run` commands (at most
//!   `MAX_RUN`), as if a terminator followed: a client that posts thousands of launches before
//!   it synchronises has them learned and launched that many at a time, where one run of all
//!   of them would outgrow what a shape may hold and never repeat. Shorter pieces start the
//!   device on a long, slowly posted request before its last command comes, at a graph launch
//!   a piece: while a client posts slowly and its runs are held (contended CPUs), they end
//!   after `SLOW_RUN` commands if the limit is longer. Held whole, such a request reaches the
//!   device only after its last command, and the client's synchronise waits for all of it;
//!   in pieces, only its last piece is left to run by then. Whether a request goes in such
//!   pieces is decided at its first command (a request here: the commands between two ends of
//!   runs other than the length limit) and kept over its pieces, so that they begin where
//!   they began last time and repeat as shapes.
//! * **Bounds.** At most `max_batch_entries` shapes and `max_batch_bytes` of recorded shapes
//!   per client; the least recently used shape goes first. Freeing a host buffer or unloading a
//!   module forgets the shapes that name them; destroying a stream, the shapes learned in it
//!   (a shape's graph is launched only into the stream it was learned in: CUDA orders each
//!   launch of an executable graph after its previous ones, which across streams would order
//!   work the client left unordered).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mps_core::Result;
use mps_core::protocol::{
    Command, Completion, CompletionKind, DeviceCopy, Fill, HostRef, LaunchSpec, Opcode, Request,
    flags,
};

use super::{Answer, DONE, SessionCore};
use crate::backend::{Backend, Op};
use crate::session::limits::BatchPacing;

/// One command of a run, as a shape records it: everything that its graph node fixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Desc {
    /// A launch: its parameters are the one thing a cached graph's node is given anew per run.
    Launch(LaunchSpec<u64, Box<[u8]>>),
    CopyHtoD {
        dst: u64,
        host: u64,
        offset: u64,
        len: u64,
    },
    CopyDtoH {
        src: u64,
        host: u64,
        offset: u64,
        len: u64,
    },
    CopyDtoD(DeviceCopy),
    Memset(Fill),
}

impl Desc {
    /// What a stream-ordered request would be in a run, if it can be in one.
    fn of(req: &Request<'_>) -> Option<Desc> {
        Some(match *req {
            Request::Launch { spec } => Desc::Launch(spec.map(|f| f, Box::from)),
            Request::CopyHtoD {
                dst,
                src: HostRef::Buffer { handle, offset },
                len,
            } => Desc::CopyHtoD {
                dst,
                host: handle,
                offset,
                len,
            },
            Request::CopyDtoH {
                dst: HostRef::Buffer { handle, offset },
                src,
                len,
            } => Desc::CopyDtoH {
                src,
                host: handle,
                offset,
                len,
            },
            Request::CopyDtoD { copy } => Desc::CopyDtoD(copy),
            Request::Memset { fill } => Desc::Memset(fill),
            _ => return None,
        })
    }

    /// Whether `other` is the same work but for what a cached graph's node is given anew per
    /// run: a launch of the same kernel in the same clusters with parameters as long (its
    /// geometry, shared memory and parameter values may differ), a memset of the same size
    /// (anywhere, with any value), a copy exactly.
    fn same_work(&self, other: &Desc) -> bool {
        match (self, other) {
            (Desc::Launch(a), Desc::Launch(b)) => {
                (a.function, a.cluster, a.params.len()) == (b.function, b.cluster, b.params.len())
            }
            (Desc::Memset(a), Desc::Memset(b)) => (a.elem_size, a.count) == (b.elem_size, b.count),
            (a, b) => a == b,
        }
    }

    /// Whether a graph node made as this command would do other work than `op`, the same work
    /// (see [`Desc::same_work`]).
    fn differs<B: Backend>(&self, op: &Op<'_, B>) -> bool {
        match (self, op) {
            (Desc::Launch(a), Op::Launch(b)) => {
                (a.grid, a.block, a.shared_mem) != (b.grid, b.block, b.shared_mem)
                    || *a.params != *b.params
            }
            (Desc::Memset(a), Op::Memset(b)) => a != b,
            _ => false,
        }
    }

    /// Becomes `op`, the same work, as the graph node made of it or given it does.
    fn follow<B: Backend>(&mut self, op: &Op<'_, B>) {
        match (self, op) {
            (Desc::Launch(a), Op::Launch(b)) => {
                (a.grid, a.block, a.shared_mem) = (b.grid, b.block, b.shared_mem);
                a.params.copy_from_slice(&b.params);
            }
            (Desc::Memset(a), Op::Memset(b)) => *a = *b,
            _ => {}
        }
    }

    /// Bytes the server holds for it.
    fn bytes(&self) -> u64 {
        let params = match self {
            Desc::Launch(l) => l.params.len(),
            _ => 0,
        };
        (std::mem::size_of::<Desc>() + params) as u64
    }

    /// What kind of command it is, for the log.
    fn kind(&self) -> &'static str {
        match self {
            Desc::Launch(_) => "a launch",
            Desc::CopyHtoD { .. } => "a copy to the device",
            Desc::CopyDtoH { .. } => "a copy from the device",
            Desc::CopyDtoD(_) => "a device-to-device copy",
            Desc::Memset(_) => "a memset",
        }
    }

    fn host_buffer(&self) -> Option<u64> {
        match self {
            Desc::CopyHtoD { host, .. } | Desc::CopyDtoH { host, .. } => Some(*host),
            _ => None,
        }
    }
}

/// A command held back while its run may still match a shape: checked, ready to submit.
struct Held<B: Backend> {
    seq: u64,
    op: Op<'static, B>,
}

/// A run seen before, with its executable graph once one was made.
struct Shape<B: Backend> {
    /// The stream it ran in, the only one its graph is launched into: CUDA orders each launch
    /// of an executable graph after its previous launches, which across streams would order
    /// work the client left unordered (and could deadlock on a cross-stream wait).
    stream: u64,
    key: Vec<Desc>,
    bytes: u64,
    exec: Option<Arc<B::GraphExec>>,
    /// The client's SM placement generation the graph was made under.
    generation: u64,
    /// No graph could be made of it: its runs are not held any more.
    unbuildable: bool,
    /// Runs of it seen, learning included.
    seen: u32,
    /// Runs launched from its graph, the one it was made for included.
    launches: u64,
    /// The appearances needed for a graph when its graph was made.
    made_at: u32,
    /// Shapes the client had learned when its graph was made.
    learned_at: u64,
    last_used: u64,
    /// Its commands came `BURST_GAP` apart or more on average when it last appeared.
    slow: bool,
}

impl<B: Backend> Shape<B> {
    /// Whether its graph exists or is due at its next appearance, and it came in a burst when
    /// last seen or `hold_slow`: only then are its runs held.
    fn worth_holding(&self, build_at: u32, hold_slow: bool) -> bool {
        !self.unbuildable
            && (self.exec.is_some() || self.seen + 1 >= build_at)
            && (hold_slow || !self.slow)
    }

    /// Whether it has a graph that has served no run but the one it was made for.
    fn graph_unpaid(&self) -> bool {
        self.exec.is_some() && self.launches <= 1
    }
}

/// What batch pacing made of the client's slowly posted shapes.
#[derive(Clone, Copy, Debug, Default)]
struct Paced {
    /// Runs held for them.
    held: u64,
    /// Runs that began as one, submitted as they came since the CPUs were free.
    passed: u64,
}

/// The appearances of a shape after which its graph is made, at first: learned at the first,
/// made at the second.
const BUILD_AT_FIRST: u32 = 2;
/// The most appearances a shape may need before its graph is made.
const BUILD_AT_MOST: u32 = 64;
/// New shapes learned after a graph was made, without a second launch of it, that show it was
/// made for nothing.
const PROBATION: u64 = 4;
/// Held runs that left their shape, with no run launched from a graph since, after which
/// shapes need twice the appearances before their runs are held.
const DEPARTURES: u32 = 8;
/// The most commands a run may have (see "Long runs go in pieces"), and the default of
/// `Limits::max_batch_run`: enough that a request's work is one run, few enough that a graph
/// of them is made in about a millisecond.
pub(crate) const MAX_RUN: usize = 256;

/// The most commands a run may have while its client posts slowly and such runs are held (see
/// "Long runs go in pieces"): the device then starts on each piece of a request once the
/// piece has come, where a slowly posted request held whole reaches the device only after
/// its last command.
const SLOW_RUN: usize = 32;

/// The mean time the server waits for each next command of a run at or above which the run
/// counts as posted slowly: about what the driver takes to launch a kernel, so a client that
/// posts faster outruns the server's command-by-command submission.
const BURST_GAP: Duration = Duration::from_micros(2);

/// Waits for a run's next command after which the run's own pace tells whether the client is
/// posting slowly; before them, the client's last run's does.
const PACE_WAITS: u32 = 4;

/// Held runs of a client that left their shape whose divergence the log describes.
const DIVERGENCES_LOGGED: u64 = 3;

/// What ended a run, counted for the log: which commands keep a program's runs short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ender {
    /// A command that cannot join a run: its opcode, and whether it was marked or answered.
    Command { opcode: u16, flags: u16 },
    /// A command of the kind runs hold, on another stream.
    OtherStream,
    /// The most commands a run may have (`Limits::max_batch_run`).
    Length,
    /// A command that failed.
    Failure,
}

impl std::fmt::Display for Ender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Ender::Command { opcode, flags } => {
                let name = Opcode::from_u16(opcode).map_or("an unknown command", Opcode::name);
                let how = match (flags & flags::MARK != 0, flags & flags::REPLY != 0) {
                    (true, true) => " (marked, answered)",
                    (true, false) => " (marked)",
                    (false, true) => " (answered)",
                    (false, false) => "",
                };
                write!(f, "{name}{how}")
            }
            Ender::OtherStream => f.write_str("work on another stream"),
            Ender::Length => f.write_str("the run's length limit"),
            Ender::Failure => f.write_str("a failed command"),
        }
    }
}

/// Kinds of run ends the log names, the most frequent first.
const ENDERS_LOGGED: usize = 6;

/// How `got` differs from `want`, the command the shape had next.
fn divergence(want: Option<&Desc>, got: &Desc) -> String {
    let Some(want) = want else {
        return format!("{} past the shape's end", got.kind());
    };
    match (want, got) {
        (Desc::Launch(a), Desc::Launch(b)) if a.function != b.function => {
            "a launch of another kernel".into()
        }
        (Desc::Launch(a), Desc::Launch(b)) if a.cluster != b.cluster => format!(
            "the same kernel in clusters {:?}, not {:?}",
            b.cluster, a.cluster
        ),
        // Launches differ in their parameters' length alone, since their geometry and values
        // do not count.
        (Desc::Launch(a), Desc::Launch(b)) => format!(
            "the same kernel with {} bytes of parameters, not {}",
            b.params.len(),
            a.params.len()
        ),
        (Desc::Memset(a), Desc::Memset(b)) => format!(
            "a memset of {} elements of {} bytes, not {} of {}",
            b.count, b.elem_size, a.count, a.elem_size
        ),
        (a, b) if std::mem::discriminant(a) != std::mem::discriminant(b) => {
            format!("{} where the shape had {}", b.kind(), a.kind())
        }
        (_, b) => format!("{} with other addresses or sizes", b.kind()),
    }
}

/// One client's batching state.
pub(super) struct Batching<B: Backend> {
    enabled: bool,
    pacing: BatchPacing,
    max_entries: usize,
    max_bytes: u64,
    /// Commands after which a run ends (`Limits::check` keeps it within 2 to `MAX_RUN`).
    max_run: usize,
    /// The stream of the run being held and of `recent`.
    stream: u64,
    held: Vec<Held<B>>,
    /// Every command of the current run (held or not), to learn its shape when it ends.
    recent: Vec<Desc>,
    recent_bytes: u64,
    /// The run grew past what one shape may hold: it is not learned.
    recent_overflow: bool,
    /// Commands at the start of `recent` that one shape's graph launch made up: a run that is
    /// that shape and no more is known already.
    launched: usize,
    shapes: Vec<Shape<B>>,
    /// While commands are held: the shapes (indices into `shapes`) that begin with them.
    candidates: Vec<usize>,
    /// While commands are held: the longest shape that the first of them made up whole while a
    /// longer one still followed, and how many commands it has. If the run then leaves every
    /// longer shape, or stops before one is whole, those commands still go as its graph.
    prefix: Option<(usize, usize)>,
    /// A shape's graph is made at this appearance (see "Graphs must pay").
    build_at: u32,
    /// Held runs that left their shape since a run was last launched from a graph, or since
    /// `build_at` last rose for them.
    departures: u32,
    /// Shapes learned so far.
    learned: u64,
    /// Runs launched from graphs so far.
    graph_launches: u64,
    bytes: u64,
    tick: u64,
    /// Errors of held commands that were submitted one by one, for the shell to post (before
    /// the answer of the command being handled).
    errors: Vec<Completion>,
    /// The description of the command being handled, if it may join a run.
    pub(super) offered: Option<Desc>,
    /// What ended the client's runs that no shape made whole, and how often.
    enders: Vec<(Ender, u64)>,
    /// Runs of slowly posted shapes that were held, and runs that began as one but went as
    /// they came since pacing found the CPUs free: the log then tells what pacing decided.
    paced: Paced,
    /// When the server last finished with a command of the current run.
    last_offer: Option<Instant>,
    /// When the command being handled arrived, if it may join a run.
    arrival: Instant,
    /// The time the server waited for the current run's commands after its first, and the
    /// number of those waits.
    waited: (Duration, u32),
    /// The client's last run told of a slow pace: it came slowly, the server having waited for
    /// `PACE_WAITS` of its commands or more, and no run came fast since.
    last_run_slow: bool,
    /// Whether the runs of the request being posted end after `SLOW_RUN` commands: decided at
    /// its first, kept over the pieces that the run limit cuts, forgotten when a run ends
    /// otherwise. A request cut where its pace or the CPUs' load flipped would come in pieces
    /// that begin at a new offset each time, shapes that never repeat.
    pieced: Option<bool>,
}

impl<B: Backend> Batching<B> {
    pub(super) fn new(
        enabled: bool,
        pacing: BatchPacing,
        max_entries: usize,
        max_bytes: u64,
        max_run: usize,
    ) -> Self {
        Batching {
            enabled,
            pacing,
            max_entries,
            max_bytes,
            max_run,
            stream: 0,
            held: Vec::new(),
            recent: Vec::new(),
            recent_bytes: 0,
            recent_overflow: false,
            launched: 0,
            shapes: Vec::new(),
            candidates: Vec::new(),
            prefix: None,
            build_at: BUILD_AT_FIRST,
            departures: 0,
            learned: 0,
            graph_launches: 0,
            bytes: 0,
            tick: 0,
            errors: Vec::new(),
            offered: None,
            enders: Vec::new(),
            paced: Paced::default(),
            last_offer: None,
            arrival: Instant::now(),
            waited: (Duration::ZERO, 0),
            last_run_slow: false,
            pieced: None,
        }
    }

    /// Counts the time from the server's finishing with the run's last command to this one's
    /// arrival as a wait for it, or starts the count where this one begins a run.
    fn arrived(&mut self) {
        match self.last_offer {
            Some(last) if !self.recent.is_empty() || self.holds() => {
                self.waited.0 += self.arrival.saturating_duration_since(last);
                self.waited.1 += 1;
            }
            _ => self.waited = (Duration::ZERO, 0),
        }
    }

    /// Whether the current run's commands came `BURST_GAP` apart or more on average.
    fn run_was_slow(&self) -> bool {
        let (waited, waits) = self.waited;
        waits > 0 && waited >= BURST_GAP * waits
    }

    /// Whether the client is posting slowly now: by the current run's pace once the server
    /// has waited for `PACE_WAITS` of its commands, by `last_run_slow` before. A slowly
    /// posted run can contain bursts (one library call's few launches) that repeat as shapes
    /// of their own; holding those delays the device as much as holding the run.
    fn posting_slowly(&self) -> bool {
        if self.waited.1 >= PACE_WAITS {
            self.run_was_slow()
        } else {
            self.last_run_slow
        }
    }

    /// Commands after which the current run ends: `max_run`, or `SLOW_RUN` if that is shorter
    /// where the request began while the client posted slowly and pacing held slowly posted
    /// runs.
    fn run_limit(&mut self) -> usize {
        let pieced = match self.pieced {
            Some(pieced) => pieced,
            None => {
                let pieced = self.posting_slowly() && self.pacing.holds_slow_runs();
                self.pieced = Some(pieced);
                pieced
            }
        };
        if pieced {
            self.max_run.min(SLOW_RUN)
        } else {
            self.max_run
        }
    }

    /// Counts `why` as the end of the current run, if one is open.
    fn ended_by(&mut self, why: Ender) {
        // A run that one shape's graph made up whole, or will at once, was not cut short.
        let whole = self.recent.len() == self.launched
            || (self.held.len() == self.recent.len() && self.whole().0.is_some());
        if !self.enabled || (whole && !self.recent_overflow) {
            return;
        }
        match self.enders.iter_mut().find(|(e, _)| *e == why) {
            Some((_, n)) => *n += 1,
            None => self.enders.push((why, 1)),
        }
    }

    /// What ended the client's runs most often, for the log ("" if no run ended).
    pub(super) fn enders(&self) -> String {
        let mut by_count = self.enders.clone();
        by_count.sort_by_key(|e| std::cmp::Reverse(e.1));
        let mut out: Vec<String> = by_count
            .iter()
            .take(ENDERS_LOGGED)
            .map(|(e, n)| format!("{e} {n}"))
            .collect();
        let rest: u64 = by_count.iter().skip(ENDERS_LOGGED).map(|(_, n)| n).sum();
        if rest > 0 {
            out.push(format!("others {rest}"));
        }
        out.join(", ")
    }

    /// What pacing made of the client's slowly posted shapes, for the log ("" if nothing).
    pub(super) fn paced(&self) -> String {
        let Paced { held, passed } = self.paced;
        if held + passed == 0 {
            return String::new();
        }
        format!("{held} held, {passed} submitted as they came while the CPUs were free")
    }

    /// Counts what pacing made of `desc` where nothing is held: a slowly posted run held if
    /// `next`, the shapes it begins holding for, are some and one of them is slow or the
    /// client posts slowly; a run passed if `desc` begins the run, holds for no shape, and
    /// pacing alone kept out a shape whose work it begins.
    fn count_paced(&mut self, desc: &Desc, next: &[usize]) {
        if self.holds() {
            return;
        }
        let slowly = self.posting_slowly();
        if !next.is_empty() && (slowly || next.iter().any(|i| self.shapes[*i].slow)) {
            self.paced.held += 1;
        } else if next.is_empty() && self.recent.is_empty() && !self.pacing.holds_slow_runs() {
            let kept_out = self
                .shapes
                .iter()
                .any(|s| (slowly || s.slow) && self.continues(s, 0, desc, true));
            self.paced.passed += u64::from(kept_out);
        }
    }

    /// What `req` is in a run, if batching is on and it may join one; notes when such a
    /// command arrived, so that the server's own checks of it do not count as a wait.
    pub(super) fn describe(&mut self, cmd: &Command, req: &Request<'_>) -> Option<Desc> {
        if !self.enabled || cmd.flags & (flags::MARK | flags::REPLY) != 0 {
            return None;
        }
        let desc = Desc::of(req)?;
        self.arrival = Instant::now();
        Some(desc)
    }

    /// Whether commands are held.
    pub(super) fn holds(&self) -> bool {
        !self.held.is_empty()
    }

    /// Errors of commands submitted since the last call, in order.
    fn take_errors(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.errors)
    }

    /// Forgets the shapes that `gone` picks (their graphs go when no launch uses them).
    fn forget(&mut self, gone: impl Fn(&Shape<B>) -> bool) {
        self.shapes.retain(|s| {
            if gone(s) {
                self.bytes -= s.bytes;
                return false;
            }
            true
        });
    }

    /// Forgets the shapes of `stream`, which is going away.
    pub(super) fn forget_stream(&mut self, stream: u64) {
        self.forget(|s| s.stream == stream);
    }

    /// Forgets the shapes that copy through host buffer `handle`.
    pub(super) fn forget_host_buffer(&mut self, handle: u64) {
        self.forget(|s| s.key.iter().any(|d| d.host_buffer() == Some(handle)));
    }

    /// Forgets the shapes that launch any of `functions`.
    pub(super) fn forget_functions(&mut self, functions: &[u64]) {
        let launches = |d: &Desc| matches!(d, Desc::Launch(l) if functions.contains(&l.function));
        self.forget(|s| s.key.iter().any(launches));
    }

    /// Shapes cached and the bytes they hold.
    pub(super) fn cached(&self) -> (usize, u64) {
        (self.shapes.len(), self.bytes)
    }

    /// The shapes that continue the held commands with `desc`: among those the held ones
    /// matched (shapes do not change while commands are held: whatever changes them ends the
    /// run first), or among the stream's shapes when nothing is held. Only the next command of
    /// each is compared, so a long run costs one comparison per command and candidate.
    fn matching(&self, desc: &Desc) -> Vec<usize> {
        let n = self.held.len();
        let hold_slow = self.pacing.holds_slow_runs();
        let fits = |i: &usize| self.continues(&self.shapes[*i], n, desc, hold_slow);
        if n == 0 {
            (0..self.shapes.len()).filter(fits).collect()
        } else {
            self.candidates.iter().copied().filter(fits).collect()
        }
    }

    /// Whether `desc`, after `n` held commands, continues shape `s` of the run's stream, as one
    /// whose runs are held (`hold_slow`: a slowly posted shape's may be, and holding may begin
    /// while the client posts slowly; once begun, a hold runs its course).
    fn continues(&self, s: &Shape<B>, n: usize, desc: &Desc, hold_slow: bool) -> bool {
        s.worth_holding(self.build_at, hold_slow)
            && (hold_slow || n > 0 || !self.posting_slowly())
            && s.stream == self.stream
            && s.key.get(n).is_some_and(|k| k.same_work(desc))
    }

    /// The shape the held commands make up whole, if any, and whether a longer one may still
    /// follow.
    fn whole(&self) -> (Option<usize>, bool) {
        let n = self.held.len();
        let len = |i: &usize| self.shapes[*i].key.len();
        let whole = self.candidates.iter().copied().find(|i| len(i) == n);
        (whole, self.candidates.iter().any(|i| len(i) > n))
    }

    /// The longest shape of the run's stream with a graph made under SM placement
    /// `generation` that the `room` commands of `recent` from `at` on begin with, and its length.
    fn ready_at(&self, at: usize, room: usize, generation: u64) -> Option<(usize, usize)> {
        let commands = &self.recent[at..at + room];
        let ready = |s: &Shape<B>| {
            s.stream == self.stream
                && s.exec.is_some()
                && s.generation == generation
                && (2..=room).contains(&s.key.len())
        };
        self.shapes
            .iter()
            .enumerate()
            .filter(|(_, s)| ready(s) && s.key.iter().zip(commands).all(|(k, c)| k.same_work(c)))
            .map(|(i, s)| (i, s.key.len()))
            .max_by_key(|&(_, len)| len)
    }

    /// How many more commands the held run needs to make up a shape (the nearest of those it
    /// may still become): 0 when it is not holding or makes one up already.
    fn to_complete(&self) -> usize {
        let n = self.held.len();
        if n == 0 {
            return 0;
        }
        self.candidates
            .iter()
            .map(|i| self.shapes[*i].key.len())
            .filter(|len| *len > n)
            .min()
            .map_or(0, |len| len - n)
    }

    /// Notes a command of the current run for learning.
    fn note(&mut self, desc: Desc) {
        if self.recent_overflow {
            return;
        }
        self.recent_bytes += desc.bytes();
        if self.recent_bytes > self.max_bytes {
            self.recent_overflow = true;
            self.recent.clear();
            return;
        }
        self.recent.push(desc);
    }

    /// Remembers the current run's shape (a run of one command gains nothing), or counts its
    /// appearance where it is known, and starts a new run.
    fn learn(&mut self) {
        // A short run says little of a slow pace (one descheduling makes it slow), but that it
        // came fast at all ends a slow one.
        let slow = self.run_was_slow();
        if self.waited.1 >= PACE_WAITS || (self.waited.1 > 0 && !slow) {
            self.last_run_slow = slow;
        }
        let bytes = std::mem::replace(&mut self.recent_bytes, 0);
        let overflow = std::mem::replace(&mut self.recent_overflow, false);
        let launched = std::mem::replace(&mut self.launched, 0);
        let stream = self.stream;
        if overflow || self.recent.len() < 2 || self.recent.len() == launched {
            // `recent` keeps its room for the next run: most runs teach nothing new.
            self.recent.clear();
            return;
        }
        self.tick += 1;
        let recent = &self.recent;
        let same = |key: &[Desc]| {
            key.len() == recent.len() && key.iter().zip(recent).all(|(k, r)| k.same_work(r))
        };
        if let Some(known) = self
            .shapes
            .iter_mut()
            .find(|s| s.stream == stream && same(&s.key))
        {
            // A run not held (its shape not yet worth a graph), or held and left unlaunched.
            known.seen = known.seen.saturating_add(1);
            known.last_used = self.tick;
            known.slow = slow;
            self.recent.clear();
            return;
        }
        let mut key = std::mem::take(&mut self.recent);
        // Kept for as long as the shape is: no room beyond what its bytes count.
        key.shrink_to_fit();
        self.learned += 1;
        // A graph made under the current rule that several new shapes have followed without a
        // second launch was made for nothing.
        let learned = self.learned;
        let unpaid = |s: &Shape<B>| s.graph_unpaid() && learned - s.learned_at >= PROBATION;
        if let Some(i) = self.shapes.iter().position(unpaid) {
            // Judged once: its graph goes (a later appearance makes it again if it pays).
            self.shapes[i].exec = None;
            self.graph_wasted(self.shapes[i].made_at);
        }
        self.shapes.push(Shape {
            stream,
            key,
            bytes,
            exec: None,
            generation: 0,
            unbuildable: false,
            seen: 1,
            launches: 0,
            made_at: 0,
            learned_at: 0,
            last_used: self.tick,
            slow,
        });
        self.bytes += bytes;
        self.bound();
    }

    /// Drops the least recently used shapes until the cache is within its bounds.
    fn bound(&mut self) {
        while self.shapes.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some(oldest) = (0..self.shapes.len()).min_by_key(|&i| self.shapes[i].last_used)
            else {
                return;
            };
            let s = self.shapes.swap_remove(oldest);
            self.bytes -= s.bytes;
            if s.graph_unpaid() {
                self.graph_wasted(s.made_at);
            }
        }
    }

    /// A held run left the shape it followed: after `DEPARTURES` of them with no run launched
    /// from a graph, shapes need twice the appearances before their runs are held.
    fn held_in_vain(&mut self) {
        self.departures += 1;
        if self.departures >= DEPARTURES {
            self.departures = 0;
            self.raise_build_at(format_args!(
                "{DEPARTURES} held runs left their shapes without a graph launched"
            ));
        }
    }

    /// A graph made when shapes needed `made_at` appearances served only the run it was made
    /// for: shapes need twice the appearances, if that was the current rule. The graphs made
    /// before the rule was raised do not raise it again.
    fn graph_wasted(&mut self, made_at: u32) {
        if made_at == self.build_at {
            self.raise_build_at(format_args!("a graph served only the run it was made for"));
        }
    }

    /// Doubles the appearances a shape needs before its runs are held and its graph made, up to
    /// `BUILD_AT_MOST`, for the reason `why`.
    fn raise_build_at(&mut self, why: std::fmt::Arguments<'_>) {
        if self.build_at < BUILD_AT_MOST {
            self.build_at *= 2;
            tracing::debug!(
                "{why}: shapes now need {} appearances before their runs are held",
                self.build_at
            );
        }
    }
}

impl<B: Backend> SessionCore<B> {
    /// Queues `op` of a command that may join a run (see the module's documentation).
    pub(super) fn offer(&mut self, cmd: &Command, op: Op<'_, B>, desc: Desc) -> Result<Answer> {
        if self.batch.stream != cmd.stream {
            self.end_run(Ender::OtherStream);
            self.batch.stream = cmd.stream;
        }
        self.batch.arrived();
        let mut next = self.batch.matching(&desc);
        if next.is_empty() && self.batch.holds() {
            // The run left every shape it followed: what was held goes now, as a graph if it
            // makes up a shape (or begins with one), else as it came.
            let left = self.batch.whole().0.is_none();
            if left {
                self.report_divergence(&desc);
            }
            let graphs = self.batch.graph_launches;
            self.flush_held();
            // Held in vain unless shorter shapes' graphs still took some of it.
            if left && self.batch.graph_launches == graphs {
                self.batch.held_in_vain();
            }
            next = self.batch.matching(&desc);
        }
        self.batch.count_paced(&desc, &next);
        // Noted after the flush, which tells a launch of the whole run so far from one of its
        // beginning by comparing what it launches with the run noted so far.
        self.batch.note(desc);
        if next.is_empty() {
            self.submit_now(cmd.stream, cmd.seq, op)?;
        } else {
            self.batch.candidates = next;
            self.batch.held.push(Held {
                seq: cmd.seq,
                op: op.into_owned(),
            });
            // A shape made up whole goes at once, unless a longer one may still follow (it then
            // goes when the run ends or leaves the longer shape).
            match self.batch.whole() {
                (Some(shape), false) => self.launch_run(shape),
                (Some(shape), true) => self.batch.prefix = Some((shape, self.batch.held.len())),
                (None, _) => {}
            }
        }
        if self.batch.recent.len() >= self.batch.run_limit() {
            self.end_run(Ender::Length);
        }
        self.batch.last_offer = Some(Instant::now());
        DONE
    }

    /// Counts a held run that left the shape it followed with `got`, and says where and how
    /// for the client's first few: the log then tells why a program's runs miss their graphs.
    fn report_divergence(&self, got: &Desc) {
        let count = self.stats.batch_diverged();
        let n = self.batch.held.len();
        let Some(shape) = self
            .batch
            .candidates
            .first()
            .map(|i| &self.batch.shapes[*i])
        else {
            return;
        };
        if count <= DIVERGENCES_LOGGED {
            tracing::info!(
                client = self.ctx.id,
                "launch batching: a run left the shape it followed at command {} of {}: {}",
                n + 1,
                shape.key.len(),
                divergence(shape.key.get(n), got)
            );
        }
    }

    fn submit_now(&self, stream: u64, seq: u64, op: Op<'_, B>) -> Result<Answer> {
        let s = self.streams.get(stream)?;
        self.backend.submit(&s.stream, seq, op, None)?;
        DONE
    }

    /// Submits the held commands: as a graph if they make up a shape, else one by one, in
    /// order, an error going to the command that caused it. The run goes on (its shape is
    /// learned when it ends).
    pub(crate) fn flush_held(&mut self) {
        if !self.batch.holds() {
            return;
        }
        if let (Some(shape), _) = self.batch.whole() {
            self.launch_run(shape);
            return;
        }
        if let Some((shape, len)) = self.batch.prefix.take() {
            // The first `len` make up a shape: they go as its graph, the rest after them.
            let rest = self.batch.held.split_off(len);
            self.launch_run(shape);
            self.submit_pieces(rest);
            return;
        }
        let held = std::mem::take(&mut self.batch.held);
        self.stats.batch_missed();
        self.submit_pieces(held);
    }

    /// Submits `held`, the last commands of the run so far, in order: each stretch of them that
    /// makes up a shape whose graph is ready goes as that graph (a run held for a long shape
    /// that the client paused in, or left, still gets the shorter shapes its pieces make up),
    /// the others one by one.
    fn submit_pieces(&mut self, mut rest: Vec<Held<B>>) {
        let generation = self.ctx.sm.generation.load(Ordering::Acquire);
        let start = self.batch.recent.len().checked_sub(rest.len());
        let Some(mut at) = start.filter(|_| !self.batch.recent_overflow) else {
            self.submit_each(rest);
            return;
        };
        loop {
            let found = (0..rest.len()).find_map(|p| {
                let ready = self.batch.ready_at(at + p, rest.len() - p, generation);
                ready.map(|(shape, len)| (p, shape, len))
            });
            let Some((p, shape, len)) = found else {
                self.submit_each(rest);
                return;
            };
            let mut piece = rest.split_off(p);
            let after = piece.split_off(len);
            self.submit_each(rest);
            debug_assert!(self.batch.held.is_empty(), "held commands overwritten");
            self.batch.held = piece;
            self.launch_run(shape);
            rest = after;
            at += p + len;
        }
    }

    /// Submits `held` one by one, in order.
    ///
    /// Only the first failure is reported (against its own command): the shell reserves room
    /// for a completion or two before it takes a command, and a run of thousands of commands
    /// on a dead context would otherwise post thousands at once and hold the session worker
    /// until the client drained them. The client learns of the failure at its next wait, as
    /// CUDA reports an asynchronous error; the others are logged.
    fn submit_each(&mut self, held: Vec<Held<B>>) {
        let mut failed = 0usize;
        for h in held {
            let launch = matches!(h.op, Op::Launch { .. });
            if let Err(err) = self.submit_now(self.batch.stream, h.seq, h.op) {
                self.log_failure(h.seq, &err, launch);
                // One error per handling: a run's beginning and its rest may go separately.
                if failed == 0 && self.batch.errors.is_empty() {
                    self.batch
                        .errors
                        .push(Completion::error(h.seq, CompletionKind::Reply, &err));
                }
                failed += 1;
            }
        }
        if failed > 1 {
            tracing::debug!(
                client = self.ctx.id,
                "{} more commands of the held run failed after the first, which is reported",
                failed - 1
            );
        }
    }

    /// Ends the current run for `why` (counted for the log): what is held is submitted and the
    /// run's shape learned.
    pub(super) fn end_run(&mut self, why: Ender) {
        self.batch.ended_by(why);
        if !self.batch.enabled {
            return;
        }
        // A request cut by the length limit goes on in pieces of the same length.
        if why != Ender::Length {
            self.batch.pieced = None;
        }
        self.flush_held();
        if !self.batch.recent.is_empty() || self.batch.recent_overflow {
            let before = self.batch.learned;
            self.batch.learn();
            if self.batch.learned > before {
                self.stats.batch_learned();
            }
            self.batch_cache_changed();
        }
    }

    /// What ended the client's runs most often, for the log.
    pub(crate) fn batch_enders(&self) -> String {
        self.batch.enders()
    }

    /// What batch pacing decided for the client's slowly posted runs, for the log.
    pub(crate) fn batch_paced(&self) -> String {
        self.batch.paced()
    }

    /// Publishes the cache's size in the client's counters.
    pub(super) fn batch_cache_changed(&self) {
        let (entries, bytes) = self.batch.cached();
        self.stats.batch_cache(entries as u64, bytes);
    }

    /// Whether commands are held back for a run (the shell submits them with
    /// [`SessionCore::flush_held`] when the client stops posting).
    pub(crate) fn holds_run(&self) -> bool {
        self.batch.holds()
    }

    /// The stream of the held run and how many more commands would make up a shape of it, if
    /// commands are held and some shape is still to be made up.
    pub(crate) fn run_to_complete(&self) -> Option<(u64, usize)> {
        let left = self.batch.to_complete();
        (left > 0).then_some((self.batch.stream, left))
    }

    /// Errors of held commands submitted since the last call, in order: the shell posts them
    /// before the answer of the command it handles.
    pub(crate) fn take_batch_errors(&mut self) -> Vec<Completion> {
        self.batch.take_errors()
    }

    /// Launches the held commands, which make up shape `i`, as its graph.
    fn launch_run(&mut self, i: usize) {
        let held = std::mem::take(&mut self.batch.held);
        self.batch.prefix = None;
        // What follows begins new held commands; the run goes on, to be learned whole.
        if held.len() == self.batch.recent.len() {
            self.batch.launched = held.len();
        }
        self.batch.tick += 1;
        let generation = self.ctx.sm.generation.load(Ordering::Acquire);
        let slow = self.batch.run_was_slow();
        let shape = &mut self.batch.shapes[i];
        shape.last_used = self.batch.tick;
        shape.seen = shape.seen.saturating_add(1);
        shape.slow = slow;
        let cached = shape
            .exec
            .clone()
            .filter(|_| shape.generation == generation);
        let exec = match cached {
            Some(exec) => match self.give_work(i, &exec, &held) {
                Ok(()) => {
                    self.stats.batch_hit();
                    exec
                }
                Err(err) => {
                    tracing::debug!(
                        client = self.ctx.id,
                        "a batched run's graph cannot take the run's work ({err}); its \
                         runs are submitted command by command"
                    );
                    let shape = &mut self.batch.shapes[i];
                    shape.exec = None;
                    shape.unbuildable = true;
                    self.stats.batch_missed();
                    self.submit_each(held);
                    return;
                }
            },
            None => {
                self.stats.batch_missed();
                match self.build(&held) {
                    Ok(exec) => {
                        self.stats.batch_instantiated();
                        let shape = &mut self.batch.shapes[i];
                        // The graph holds this run's work.
                        for (d, h) in shape.key.iter_mut().zip(&held) {
                            d.follow(&h.op);
                        }
                        shape.exec = Some(exec.clone());
                        shape.generation = generation;
                        shape.made_at = self.batch.build_at;
                        shape.learned_at = self.batch.learned;
                        exec
                    }
                    Err(err) => {
                        tracing::debug!(
                            client = self.ctx.id,
                            "a run of {} commands cannot be made a graph ({err}); its runs are \
                             submitted command by command",
                            held.len()
                        );
                        self.batch.shapes[i].unbuildable = true;
                        self.submit_each(held);
                        return;
                    }
                }
            }
        };
        let first = held[0].seq;
        let launched = self.streams.get(self.batch.stream).and_then(|s| {
            self.backend
                .submit(&s.stream, first, Op::GraphLaunch(exec), None)
        });
        match launched {
            Ok(()) => {
                self.batch.shapes[i].launches += 1;
                self.batch.graph_launches += 1;
                self.batch.departures = 0;
            }
            Err(err) => {
                // Nothing was queued: the commands go one by one, each answering for itself.
                tracing::debug!(client = self.ctx.id, "a batched run's launch failed: {err}");
                self.submit_each(held);
            }
        }
    }

    /// Gives the nodes of shape `i`'s graph `exec` the work of the held run where it differs
    /// from theirs (launches of the graph already submitted keep theirs), and records it as the
    /// graph's. A failure leaves the graph part updated: the caller drops it.
    fn give_work(&mut self, i: usize, exec: &B::GraphExec, held: &[Held<B>]) -> Result<()> {
        let shape = &mut self.batch.shapes[i];
        for (k, (d, h)) in shape.key.iter_mut().zip(held).enumerate() {
            if d.differs(&h.op) {
                self.backend.graph_exec_update(exec, k, &h.op)?;
                d.follow(&h.op);
            }
        }
        Ok(())
    }

    /// An executable graph of `held`, captured in the run's stream (which runs nothing
    /// meanwhile).
    fn build(&self, held: &[Held<B>]) -> Result<Arc<B::GraphExec>> {
        let s = self.streams.get(self.batch.stream)?;
        self.backend.capture_begin(&s.stream)?;
        let recorded = held.iter().try_for_each(|h| {
            self.backend
                .submit(&s.stream, h.seq, h.op.duplicate(), None)
        });
        // The stream runs its work again whatever happened.
        let graph = self.backend.capture_end(&s.stream);
        recorded?;
        let exec = self.backend.graph_instantiate(&graph?)?;
        Ok(Arc::new(exec))
    }
}
