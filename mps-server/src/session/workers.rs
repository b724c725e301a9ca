//! The threads that serve the clients' rings: a bounded set of workers, each serving several
//! clients, instead of a spinning thread per client.
//!
//! * **Tiers.** Normal and below-normal clients are served by different workers; a
//!   below-normal worker runs at nice 10, so its clients' commands are taken after normal
//!   clients' when the server's CPUs are busy. There are at most `count` workers per tier
//!   (more only when every one already serves [`PER_WORKER`] clients, the most one can sleep
//!   on), and a worker exists only while it has clients. Workers and waiting threads are
//!   started by one thread at the server's own nice value, as a thread inherits its starter's.
//! * **Assignment.** A new client goes to the least-loaded worker of its tier; a client that
//!   lowers its priority moves to the other tier; a client leaving frees its place.
//! * **Turns.** A worker visits its clients in turn and takes at most [`TURN`] commands from
//!   each, so a client flooding its ring delays another by at most a turn's worth of commands.
//! * **Sleep.** When none of its clients has a command, a worker spins, yields (until a yield
//!   comes back late, showing another thread wanted the CPU), then sleeps on every client's
//!   own submission doorbell at once (`futex_waitv`), having raised each one's sleeper count
//!   so that the client's library rings it exactly as it would ring a thread of its own. The
//!   client library knows nothing of workers. Each client's words are in its own segment, so
//!   a hostile client can only make its worker wake for nothing (or leave itself unwoken); a
//!   new client is announced on a word in server-private memory. A worker holding a client's
//!   batched run while the client pauses sleeps the same way, until the hold runs out.
//! * **Commands that wait.** A command that can wait for the device (a free, which synchronises
//!   the client's streams first; a stream's destruction; a module load) is not handled by the
//!   worker: the client leaves the worker with it for a waiting thread, which handles it and
//!   hands the client back to the least-loaded worker. The worker's other clients never wait
//!   for it; the client's own later commands wait, as stream order requires. Each waiting
//!   client has a waiting thread to itself ([`WAITERS`] are kept, more are started while every
//!   one is taken and end once idle), so clients whose loads or frees take long (a huge module,
//!   a free behind a long kernel) never hold up another client's. Releasing a departed client's
//!   resources, which can wait for all its work, runs on a thread of its own.
//!
//! `count` 0 keeps one thread per client (the behaviour before workers), for comparison.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::{Duration, Instant};

use mps_ipc::doorbell::{Doorbell, MAX_WAIT_ANY, Wake, wait_any, yield_contended};

use super::{NAP, Session, Step, Watcher, set_thread_nice};
use crate::backend::Backend;
use crate::lock;

/// Commands a worker takes from one client before it moves to the next.
pub(crate) const TURN: u32 = 32;

/// Clients one worker serves at most: its sleep covers each client's doorbell and its own.
pub(crate) const PER_WORKER: usize = MAX_WAIT_ANY - 1;

/// Default workers per tier for each CPU. A worker is in the driver for most of each launch
/// (about nine tenths of its time, measured on an H200), so workers beyond the CPUs overlap
/// their launches: on 16 cores, 64 clients ran 1.24x (tiny) and 1.29x (infer) faster with 64
/// workers than with 16, as fast as a thread per client (docs/BENCHMARKS.md). Idle workers
/// sleep, and a worker exists only while it has clients.
pub(crate) const PER_CPU: usize = 4;

/// Threads that handle commands that may wait for the device kept for every worker to use; one
/// more is started for each client that waits while these are taken.
pub(crate) const WAITERS: usize = 4;

/// How long a waiting thread beyond [`WAITERS`] stays idle before it ends.
const WAITER_IDLE: Duration = Duration::from_secs(10);

/// How often a worker looks again at a client whose completion ring was full, in case its
/// library does not ring after draining it (one that does wakes the worker at once).
const FULL_POLL: Duration = Duration::from_millis(100);

/// The session workers of one server.
pub(crate) struct Workers<B: Backend> {
    pool: Arc<Pool<B>>,
}

impl<B: Backend> std::fmt::Debug for Workers<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("per_tier", &self.pool.count)
            .finish()
    }
}

impl<B: Backend> Clone for Workers<B> {
    fn clone(&self) -> Self {
        Workers {
            pool: self.pool.clone(),
        }
    }
}

struct Pool<B: Backend> {
    /// Workers per tier (0: a thread per client).
    count: usize,
    /// Normal, then below-normal.
    tiers: [Mutex<Vec<Arc<Worker<B>>>>; 2],
    watcher: Watcher,
    /// To the threads that handle commands that may wait.
    waiting: crossbeam_channel::Sender<Session<B>>,
    /// What those threads take clients from: each waits on it with a timeout of its own, so
    /// that spare threads idle together end together.
    queue: crossbeam_channel::Receiver<Session<B>>,
    /// Waiting threads idle now and not yet promised to a client.
    idle_waiters: AtomicUsize,
    /// Waiting threads running.
    waiters: AtomicUsize,
    /// Spin, then yield, before sleeping.
    waits: (Duration, Duration),
    /// Starts the workers and waiting threads.
    spawner: Spawner,
}

struct Worker<B: Backend> {
    name: String,
    below_normal: bool,
    state: Mutex<WorkerState<B>>,
    /// Rung when a client is handed to this worker.
    bell: AtomicU32,
    sleepers: AtomicU32,
}

impl<B: Backend> Worker<B> {
    fn bell(&self) -> Doorbell<'_> {
        Doorbell::new(&self.bell, &self.sleepers)
    }
}

struct WorkerState<B: Backend> {
    /// Clients handed over but not yet taken by the worker thread.
    inbox: Vec<Session<B>>,
    /// Clients in the inbox and being served.
    load: usize,
    /// Whether the worker's thread is running.
    running: bool,
}

impl<B: Backend> Workers<B> {
    /// Workers for a server: `count` per tier, or a thread per client if `count` is 0 or the
    /// kernel cannot sleep on several futexes at once (before Linux 5.16).
    pub(crate) fn new(count: usize, waits: (Duration, Duration)) -> std::io::Result<Self> {
        let probe = AtomicU32::new(0);
        let count = match wait_any(&[(&probe, 1)], Duration::ZERO) {
            Ok(_) => count,
            Err(e) if count > 0 => {
                tracing::warn!(
                    "this kernel cannot sleep on several futexes at once ({e}); serving each \
                     client on a thread of its own instead of {count} session workers"
                );
                0
            }
            Err(_) => 0,
        };
        let (waiting, queue) = crossbeam_channel::unbounded();
        let pool = Arc::new(Pool {
            count,
            tiers: Default::default(),
            watcher: Watcher::start()?,
            waiting,
            queue,
            idle_waiters: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            waits,
            spawner: Spawner::start()?,
        });
        if count > 0 {
            for _ in 0..WAITERS {
                pool.start_waiter()?;
                pool.idle_waiters.fetch_add(1, Ordering::SeqCst);
            }
        }
        Ok(Workers { pool })
    }

    /// The default number of workers per tier: [`PER_CPU`] per CPU the server may run on.
    pub(crate) fn default_count() -> usize {
        PER_CPU * std::thread::available_parallelism().map_or(4, |n| n.get())
    }

    /// Starts serving a client whose handshake has completed.
    pub(crate) fn adopt(&self, session: Session<B>) {
        session.start(&self.pool.watcher);
        if self.pool.count == 0 {
            spawn_own_thread(session);
        } else {
            self.pool.place(session);
        }
    }
}

/// Starts the pool's threads from a thread of its own, at the nice value the server started
/// with, whichever thread asks. A thread inherits its starter's nice value, and a below-normal
/// worker (nice 10) that started a waiting thread, or placed a client that had moved to the
/// normal tier, would leave the new thread at nice 10, serving normal clients' commands after
/// below-normal ones': going back to nice 0 takes CAP_SYS_NICE, which the server need not have.
struct Spawner {
    requests: crossbeam_channel::Sender<Spawn>,
}

struct Spawn {
    name: String,
    body: Box<dyn FnOnce() + Send>,
    started: crossbeam_channel::Sender<std::io::Result<()>>,
}

impl Spawner {
    /// The spawner; its thread ends when the spawner is dropped.
    fn start() -> std::io::Result<Spawner> {
        let (requests, incoming) = crossbeam_channel::unbounded::<Spawn>();
        std::thread::Builder::new()
            .name("session-spawn".into())
            .spawn(move || {
                for s in incoming {
                    let r = std::thread::Builder::new().name(s.name).spawn(s.body);
                    // The asker waits for exactly this answer.
                    let _ = s.started.send(r.map(drop));
                }
            })?;
        Ok(Spawner { requests })
    }

    /// Starts a thread named `name` running `body`, once it has started.
    fn spawn(&self, name: String, body: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let (started, answer) = crossbeam_channel::bounded(1);
        let gone = || std::io::Error::other("the thread that starts session threads has ended");
        self.requests
            .send(Spawn {
                name,
                body: Box::new(body),
                started,
            })
            .map_err(|_| gone())?;
        answer.recv().unwrap_or_else(|_| Err(gone()))
    }
}

/// Serves `session` on a thread of its own (`count` 0).
fn spawn_own_thread<B: Backend>(session: Session<B>) {
    let (tx, rx) = mpsc::channel::<Session<B>>();
    let spawned = std::thread::Builder::new()
        .name(format!("client-{}", session.id()))
        .spawn(move || {
            if let Ok(s) = rx.recv() {
                s.run();
            }
        });
    match spawned {
        Ok(_) => {
            // The thread waits for exactly this message.
            let _ = tx.send(session);
        }
        Err(e) => refuse(session, &e),
    }
}

/// Turns away a client no thread could be started for; what it was given goes back.
fn refuse<B: Backend>(session: Session<B>, e: &std::io::Error) {
    session.outbox.disconnect(format!(
        "the server could not start a thread to serve it: {e}"
    ));
    session.teardown();
}

impl<B: Backend> Pool<B> {
    /// Hands `session`, whose held command may wait, to a waiting thread of its own: an idle
    /// one, or one started for it.
    fn wait_on_device(self: &Arc<Self>, session: Session<B>) {
        let promised = self
            .idle_waiters
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !promised && self.start_waiter().is_err() {
            // No thread to be had: the threads running take it in turn.
            tracing::warn!("cannot start a waiting thread; the client waits its turn");
        }
        // The receiving end lives as long as the pool.
        if let Err(crossbeam_channel::SendError(mut s)) = self.waiting.send(session) {
            s.handle_held();
            self.place(s);
        }
    }

    /// Starts a waiting thread; it takes a client at once (the one it was started for).
    fn start_waiter(self: &Arc<Self>) -> std::io::Result<()> {
        let n = self.waiters.fetch_add(1, Ordering::SeqCst);
        let (queue, pool) = (self.queue.clone(), Arc::downgrade(self));
        self.spawner
            .spawn(format!("session-wait{n}"), move || {
                wait_for_device(&queue, &pool)
            })
            .inspect_err(|_| {
                self.waiters.fetch_sub(1, Ordering::SeqCst);
            })
    }

    /// Hands `session` to the least-loaded worker of its tier, starting one if needed.
    fn place(self: &Arc<Self>, session: Session<B>) {
        let tier = usize::from(session.below_normal());
        let worker = {
            let mut workers = lock(&self.tiers[tier]);
            let least = workers
                .iter()
                .map(|w| (lock(&w.state).load, w))
                .min_by_key(|(load, _)| *load)
                .map(|(load, w)| (load, w.clone()));
            match least {
                Some((load, w))
                    if load == 0 || (workers.len() >= self.count && load < PER_WORKER) =>
                {
                    w
                }
                _ => {
                    let w = Arc::new(Worker {
                        name: format!(
                            "client-{}w{}",
                            if tier == 1 { "l" } else { "" },
                            workers.len()
                        ),
                        below_normal: tier == 1,
                        state: Mutex::new(WorkerState {
                            inbox: Vec::new(),
                            load: 0,
                            running: false,
                        }),
                        bell: AtomicU32::new(0),
                        sleepers: AtomicU32::new(0),
                    });
                    workers.push(w.clone());
                    w
                }
            }
        };
        let mut state = lock(&worker.state);
        state.inbox.push(session);
        state.load += 1;
        if state.running {
            drop(state);
            worker.bell().ring();
            return;
        }
        let (pool, w) = (self.clone(), worker.clone());
        match self
            .spawner
            .spawn(worker.name.clone(), move || work(&pool, &w))
        {
            Ok(()) => state.running = true,
            Err(e) => {
                state.load -= 1;
                let session = state.inbox.pop();
                drop(state);
                if let Some(s) = session {
                    refuse(s, &e);
                }
            }
        }
    }
}

/// One worker's thread: serves its clients in turns until it has none left.
fn work<B: Backend>(pool: &Arc<Pool<B>>, worker: &Worker<B>) {
    set_thread_nice(worker.below_normal);
    let mut mine: Vec<Session<B>> = Vec::new();
    let mut spin_first = true;
    loop {
        // Read before the inbox is looked at, so that a client handed over after this point
        // moves the word and ends the sleep below.
        let announced = worker.bell.load(Ordering::SeqCst);
        {
            let mut state = lock(&worker.state);
            mine.append(&mut state.inbox);
            if mine.is_empty() {
                state.running = false;
                return;
            }
        }
        let outcome = turn(&mut mine);
        for s in outcome.closed {
            lock(&worker.state).load -= 1;
            release(s);
        }
        for s in outcome.moved {
            lock(&worker.state).load -= 1;
            pool.place(s);
        }
        for s in outcome.waiting {
            lock(&worker.state).load -= 1;
            pool.wait_on_device(s);
        }
        if outcome.busy || mine.is_empty() {
            spin_first = true;
            continue;
        }
        let waited = sleep(
            worker,
            announced,
            &mine,
            pool.waits,
            spin_first && !outcome.unrung_only,
            outcome.blocked,
            outcome.due,
        );
        // A wake-up that found nothing (a timeout, or a client ringing for nothing) goes
        // straight back to sleep: a client ringing in a loop gets no spinning out of it. A
        // held run's time running out is not such a wake-up: the run is submitted next, and
        // the client may post again soon.
        spin_first =
            (waited == Wake::Ready && mine.iter().any(|s| s.has_work())) || outcome.due.is_some();
    }
}

/// What a turn over a worker's clients left.
pub(crate) struct Turn<B: Backend> {
    /// Some client may have more commands.
    pub(crate) busy: bool,
    /// Some client's completion ring is full.
    pub(crate) blocked: bool,
    /// The earliest instant at which a client's held run is due ([`Step::Holds`]).
    pub(crate) due: Option<Instant>,
    /// Every client that stayed holds a run whose commands it leaves unrung until the last
    /// (`Step::Holds` with `unrung`): nothing is worth a spin or a yield.
    pub(crate) unrung_only: bool,
    /// Clients that are gone, to release.
    pub(crate) closed: Vec<Session<B>>,
    /// Clients that changed tier, to place again.
    pub(crate) moved: Vec<Session<B>>,
    /// Clients whose next command may wait, for a waiting thread.
    pub(crate) waiting: Vec<Session<B>>,
}

/// Visits each client once, taking at most [`TURN`] commands from each.
pub(crate) fn turn<B: Backend>(clients: &mut Vec<Session<B>>) -> Turn<B> {
    let mut out = Turn {
        busy: false,
        blocked: false,
        due: None,
        unrung_only: true,
        closed: Vec::new(),
        moved: Vec::new(),
        waiting: Vec::new(),
    };
    let mut i = 0;
    while i < clients.len() {
        match clients[i].step(TURN) {
            Step::More => out.busy = true,
            Step::Holds { due, unrung } => {
                out.due = Some(out.due.map_or(due, |d| d.min(due)));
                out.unrung_only &= unrung;
            }
            Step::Idle => out.unrung_only = false,
            Step::Blocked => {
                out.blocked = true;
                out.unrung_only = false;
            }
            Step::Closed => {
                out.closed.push(clients.remove(i));
                continue;
            }
            Step::Retier => {
                out.moved.push(clients.remove(i));
                continue;
            }
            Step::Waits => {
                out.waiting.push(clients.remove(i));
                continue;
            }
        }
        i += 1;
    }
    out
}

/// A waiting thread: handles each client's held command, then hands the client back. Beyond
/// [`WAITERS`], one idle for [`WAITER_IDLE`] that no client was promised ends.
fn wait_for_device<B: Backend>(
    queue: &crossbeam_channel::Receiver<Session<B>>,
    pool: &Weak<Pool<B>>,
) {
    loop {
        let next = queue.recv_timeout(WAITER_IDLE);
        let mut session = match next {
            Ok(s) => s,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                let Some(p) = pool.upgrade() else { return };
                let spare = p.waiters.load(Ordering::SeqCst) > WAITERS
                    && p.idle_waiters
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                if spare {
                    p.waiters.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                continue;
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
        };
        session.handle_held();
        match pool.upgrade() {
            Some(pool) => {
                pool.place(session);
                pool.idle_waiters.fetch_add(1, Ordering::SeqCst);
            }
            None => return session.teardown(),
        }
    }
}

/// Releases a departed client's resources on a thread of its own: the release can wait for
/// every stream the client left busy, and the worker's other clients should not.
fn release<B: Backend>(session: Session<B>) {
    let (tx, rx) = mpsc::channel::<Session<B>>();
    let spawned = std::thread::Builder::new()
        .name("session-release".into())
        .spawn(move || {
            if let Ok(s) = rx.recv() {
                s.teardown();
            }
        });
    match spawned {
        Ok(_) => {
            let _ = tx.send(session);
        }
        Err(_) => session.teardown(),
    }
}

/// Waits until a client of `worker` has work, a client is handed to it or `due` comes (a held
/// run's time): spins and yields first if `spin_first`, then sleeps on every client's doorbell
/// and the worker's own word.
fn sleep<B: Backend>(
    worker: &Worker<B>,
    announced: u32,
    clients: &[Session<B>],
    (spin, yield_for): (Duration, Duration),
    spin_first: bool,
    blocked: bool,
    due: Option<Instant>,
) -> Wake {
    let ready =
        || worker.bell.load(Ordering::Relaxed) != announced || clients.iter().any(|s| s.has_work());
    // Every phase ends by `due` at the latest.
    let by_due = |t: Instant| due.map_or(t, |d| t.min(d));
    let start = Instant::now();
    let (spin_end, yield_end) = (by_due(start + spin), by_due(start + spin + yield_for));
    if spin_first {
        while Instant::now() < spin_end {
            if ready() {
                return Wake::Ready;
            }
            std::hint::spin_loop();
        }
        while Instant::now() < yield_end {
            if ready() {
                return Wake::Ready;
            }
            // Another thread had this CPU meanwhile: sleep without yielding further.
            if yield_contended() {
                break;
            }
        }
    }
    let bells: Vec<_> = std::iter::once(worker.bell())
        .chain(clients.iter().map(|s| s.bell()))
        .collect();
    for b in &bells {
        b.sleepers().fetch_add(1, Ordering::SeqCst);
    }
    // Each word is read after its sleeper count went up and before the last look at the
    // rings: a client that submits after that look sees the count and rings, which moves the
    // word, so the sleep below ends at once or is woken.
    let mut words: Vec<_> = bells.iter().map(|b| (b.word(), b.value())).collect();
    // The worker's own word is compared with the value read before the inbox was emptied.
    words[0].1 = announced;
    let waited = if ready() {
        Wake::Ready
    } else {
        let now = Instant::now();
        let nap = if blocked { FULL_POLL } else { NAP };
        let nap = by_due(now + nap).saturating_duration_since(now);
        wait_any(&words, nap).unwrap_or_else(|e| {
            // Cannot happen for a worker (the kernel was probed and a worker holds fewer words
            // than the limit); napping keeps its clients served if it does.
            tracing::error!(
                worker = worker.name,
                "cannot sleep on the clients' doorbells: {e}"
            );
            std::thread::sleep(FULL_POLL);
            Wake::Ready
        })
    };
    for b in &bells {
        b.sleepers().fetch_sub(1, Ordering::SeqCst);
    }
    waited
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's nice value.
    fn nice() -> i32 {
        let tid = nix::unistd::gettid().as_raw();
        // SAFETY: getpriority only reads its arguments; on Linux PRIO_PROCESS with a thread id
        // reads that thread's nice value (-1 is a valid answer, not an error, for a thread).
        unsafe { nix::libc::getpriority(nix::libc::PRIO_PROCESS, tid as u32) }
    }

    #[test]
    fn threads_a_below_normal_thread_asks_for_start_at_the_servers_nice_value() {
        let base = nice();
        if base >= 10 {
            eprintln!(
                "skipped: this test runs at nice {base}, no lower than a below-normal worker"
            );
            return;
        }
        let spawner = Spawner::start().unwrap();
        let (tx, rx) = mpsc::channel();
        let direct = std::thread::spawn(move || {
            set_thread_nice(true);
            assert_eq!(nice(), 10, "a thread may always lower its own priority");
            spawner
                .spawn("asked".into(), move || tx.send(nice()).unwrap())
                .unwrap();
            std::thread::spawn(nice).join().unwrap()
        })
        .join()
        .unwrap();
        assert_eq!(
            direct, 10,
            "a thread started directly inherits its starter's nice value"
        );
        assert_eq!(rx.recv().unwrap(), base);
    }
}
