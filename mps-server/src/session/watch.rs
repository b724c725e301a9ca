//! One thread that watches every client's socket for its hang-up (or for bytes a client must not
//! send after the handshake), so that session workers can sleep on doorbells alone and a
//! thousand clients cost one watching thread, not a thousand. Between hang-ups it looks at each
//! client's activity a few times a second and logs a client whose commands stall
//! (`stall.rs`).

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use super::stall::{Activity, Watch};
use crate::lock;
use crate::outbox::Outbox;

/// How often the watcher looks for stalled clients when no socket wakes it.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// One watched client.
#[derive(Clone, Debug)]
pub(crate) struct Watched {
    pub(crate) socket: Arc<UnixStream>,
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) activity: Arc<Activity>,
    pub(crate) client: u32,
    pub(crate) pid: i32,
}

type List = Vec<(Watched, Arc<Mutex<Watch>>)>;

/// The watching thread's handle; dropping it ends the thread.
#[derive(Debug)]
pub(crate) struct Watcher {
    watched: Arc<Mutex<List>>,
    /// Written to after a socket is added, so that the thread polls the new set.
    nudge: UnixStream,
}

impl Watcher {
    /// Starts the watching thread.
    pub(crate) fn start() -> std::io::Result<Watcher> {
        let (nudge, nudged) = UnixStream::pair()?;
        nudged.set_nonblocking(true)?;
        let watched: Arc<Mutex<List>> = Arc::default();
        let list = watched.clone();
        std::thread::Builder::new()
            .name("sessions-watch".into())
            .spawn(move || watch(&list, &nudged))?;
        Ok(Watcher { watched, nudge })
    }

    /// Watches `client.socket`: when the client hangs up, sends bytes or the socket fails,
    /// its outbox disconnects it with the reason (which wakes its session).
    pub(crate) fn watch(&self, client: Watched) {
        let watch = Arc::new(Mutex::new(Watch::new(Instant::now())));
        lock(&self.watched).push((client, watch));
        // A full nudge socket already holds a wake-up, which is all this byte is.
        let _ = std::io::Write::write(&mut &self.nudge, &[1]);
    }
}

fn watch(watched: &Mutex<List>, nudged: &UnixStream) {
    let mut drain = [0u8; 256];
    loop {
        let list = lock(watched).clone();
        let mut fds = Vec::with_capacity(list.len() + 1);
        fds.push(PollFd::new(nudged.as_fd(), PollFlags::POLLIN));
        fds.extend(
            list.iter()
                .map(|(c, _)| PollFd::new(c.socket.as_fd(), PollFlags::POLLIN)),
        );
        let every = PollTimeout::try_from(LOOK_EVERY).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, every) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                // Cannot happen with valid descriptors; without this thread hang-ups would go
                // unseen, so say so loudly.
                tracing::error!("the socket watcher stops: poll failed: {e}");
                return;
            }
        }
        let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[0]) {
            // End of file: the handle was dropped, the server is going away.
            if let Ok(0) = (&*nudged).read(&mut drain) {
                return;
            }
        }
        let mut gone = Vec::new();
        for (fd, (client, _)) in fds[1..].iter().zip(&list) {
            if !ready(fd) {
                continue;
            }
            let (sock, outbox) = (&client.socket, &client.outbox);
            let mut buf = [0u8; 64];
            let reason = match (&**sock).read(&mut buf) {
                Ok(0) => "hung up".to_string(),
                Ok(_) => "sent bytes on its socket after the handshake".to_string(),
                Err(e) => format!("socket error: {e}"),
            };
            outbox.disconnect(reason);
            gone.push(sock.clone());
        }
        drop(fds);
        if !gone.is_empty() {
            lock(watched).retain(|(c, _)| !gone.iter().any(|g| Arc::ptr_eq(g, &c.socket)));
        }
        look_for_stalls(&list, Instant::now());
    }
}

/// Logs each client whose commands have stalled since the last look (at most one report per
/// stall, and few per client: see `stall.rs`).
fn look_for_stalls(list: &List, now: Instant) {
    for (c, watch) in list {
        if c.outbox.closing() {
            continue;
        }
        if let Some(report) = lock(watch).look(&c.activity, c.outbox.untaken(), now) {
            tracing::info!(client = c.client, pid = c.pid, "{report}");
        }
    }
}
