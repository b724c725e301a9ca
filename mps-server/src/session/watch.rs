//! One thread that watches every client's socket for its hang-up (or for bytes a client must not
//! send after the handshake), so that session workers can sleep on doorbells alone and a
//! thousand clients cost one watching thread, not a thousand.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::outbox::Outbox;

type Watched = Vec<(Arc<UnixStream>, Arc<Outbox>)>;

/// The watching thread's handle; dropping it ends the thread.
#[derive(Debug)]
pub(crate) struct Watcher {
    watched: Arc<Mutex<Watched>>,
    /// Written to after a socket is added, so that the thread polls the new set.
    nudge: UnixStream,
}

impl Watcher {
    /// Starts the watching thread.
    pub(crate) fn start() -> std::io::Result<Watcher> {
        let (nudge, nudged) = UnixStream::pair()?;
        nudged.set_nonblocking(true)?;
        let watched: Arc<Mutex<Watched>> = Arc::default();
        let list = watched.clone();
        std::thread::Builder::new()
            .name("sessions-watch".into())
            .spawn(move || watch(&list, &nudged))?;
        Ok(Watcher { watched, nudge })
    }

    /// Watches `socket`: when the client hangs up, sends bytes or the socket fails, `outbox`
    /// disconnects the client with the reason (which wakes its session).
    pub(crate) fn watch(&self, socket: Arc<UnixStream>, outbox: Arc<Outbox>) {
        lock(&self.watched).push((socket, outbox));
        // A full nudge socket already holds a wake-up, which is all this byte is.
        let _ = std::io::Write::write(&mut &self.nudge, &[1]);
    }
}

fn lock(m: &Mutex<Watched>) -> std::sync::MutexGuard<'_, Watched> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn watch(watched: &Mutex<Watched>, nudged: &UnixStream) {
    let mut drain = [0u8; 256];
    loop {
        let list = lock(watched).clone();
        let mut fds = Vec::with_capacity(list.len() + 1);
        fds.push(PollFd::new(nudged.as_fd(), PollFlags::POLLIN));
        fds.extend(
            list.iter()
                .map(|(s, _)| PollFd::new(s.as_fd(), PollFlags::POLLIN)),
        );
        match poll(&mut fds, PollTimeout::NONE) {
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
        for (fd, (sock, outbox)) in fds[1..].iter().zip(&list) {
            if !ready(fd) {
                continue;
            }
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
            lock(watched).retain(|(s, _)| !gone.iter().any(|g| Arc::ptr_eq(g, s)));
        }
    }
}
