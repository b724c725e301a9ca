//! Standby servers (`mps-control --standby`): beside the server of each (user, group, device),
//! a second one is started at once; it makes its device context and then waits for its go on a
//! pipe, as `mps-server --standby` does. When the active server's context fails, the standby
//! is told to go and takes that user and group's new clients at once, with no process to start
//! and no context to make (on a GPU, most of a second) between the fault and the next client
//! served; then a new standby is started. A standby costs a second context on the device per
//! (user, group, device).
//!
//! A standby started before an operator changed the defaults would serve with the old ones: it
//! is not promoted, but stopped, and a fresh server started instead.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use super::Daemon;
use super::routing::{ServerInfo, ServerKey, ServerProc, ServerState, stop_server};

/// A standby server and the write end of the pipe it waits on.
pub(super) struct Standby {
    server: ServerProc,
    go: File,
}

impl Daemon {
    fn standbys(&self) -> MutexGuard<'_, std::collections::BTreeMap<ServerKey, Standby>> {
        self.standbys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a standby for `key`, unless the daemon keeps none or one stands by already.
    pub(super) fn keep_standby(self: &Arc<Self>, key: &ServerKey) {
        if !self.cfg.standby {
            return;
        }
        let mut standbys = self.standbys();
        if let Some(s) = standbys.get_mut(key) {
            if s.server.child.try_wait().ok().flatten().is_none() {
                return;
            }
            tracing::warn!(
                uid = key.0,
                group = key.1,
                device = key.2,
                pid = s.server.child.id(),
                "the standby server had exited; starting another"
            );
            standbys.remove(key);
        }
        let (uid, group, device) = (key.0, key.1.as_str(), key.2);
        let started = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| mps_core::Error::internal(format!("cannot make a pipe: {e}")))
            .and_then(|(read, write)| {
                let server = self.start_server(uid, group, device, Some(&read))?;
                Ok(Standby {
                    server,
                    go: File::from(write),
                })
            });
        match started {
            Ok(s) => {
                tracing::info!(
                    uid,
                    group,
                    device,
                    pid = s.server.child.id(),
                    "started a standby server"
                );
                standbys.insert(key.clone(), s);
            }
            Err(e) => tracing::warn!(
                uid,
                group,
                device,
                "cannot start a standby server ({e}); after a fault a fresh server is started \
                 instead"
            ),
        }
    }

    /// The standby of `key`, told to go, if one stands by with the defaults in force now.
    pub(super) fn promote_standby(&self, key: &ServerKey) -> Option<ServerProc> {
        let mut standby = self.standbys().remove(key)?;
        let pid = standby.server.child.id();
        let stale = standby.server.defaults != self.server_defaults(key.2);
        let gone = standby.server.child.try_wait().ok().flatten();
        let refused = match (gone, stale) {
            (Some(status), _) => format!("it had exited ({status})"),
            (None, true) => "the defaults changed since it started".to_string(),
            (None, false) => match standby.go.write_all(b"g") {
                Ok(()) => return Some(standby.server),
                Err(e) => format!("it cannot be told to go: {e}"),
            },
        };
        tracing::warn!(
            uid = key.0,
            group = key.1,
            device = key.2,
            pid,
            "the standby server is not promoted ({refused}); starting a fresh server"
        );
        stop_server(&mut standby.server, Duration::ZERO);
        None
    }

    /// The standby servers, as operators see them.
    pub(super) fn standby_list(&self) -> Vec<ServerInfo> {
        self.standbys()
            .values_mut()
            .filter_map(|s| {
                let running = s.server.child.try_wait().ok().flatten().is_none();
                running.then(|| s.server.info(ServerState::Standby))
            })
            .collect()
    }

    /// Whose standby servers the daemon holds (running or not yet reaped).
    pub(super) fn standby_keys(&self) -> Vec<ServerKey> {
        self.standbys().keys().cloned().collect()
    }

    /// The standby servers `which` picks (by key and server), taken out for stopping.
    pub(super) fn take_standby(
        &self,
        which: impl Fn(&ServerKey, &ServerProc) -> bool,
    ) -> Vec<ServerProc> {
        let mut standbys = self.standbys();
        let keys: Vec<ServerKey> = standbys
            .iter()
            .filter(|(k, s)| which(k, &s.server))
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| standbys.remove(&k))
            .map(|s| s.server)
            .collect()
    }

    /// Every standby server, for stopping.
    pub(super) fn take_standbys(&self) -> Vec<ServerProc> {
        std::mem::take(&mut *self.standbys())
            .into_values()
            .map(|s| s.server)
            .collect()
    }
}
