//! The server logs a user leaves behind are bounded: every group name a user makes up gets a
//! server, and every server a log (`server-<uid>-<group>.log`, and its `.1` once rotated) in
//! that user's log directory. Before a server with a log of a new name starts, the logs of
//! servers no longer running are removed, the least recently written first, until that
//! directory holds at most `--max-server-logs` logs with the new one; a running server's log is
//! never removed (so a user with more servers running than the bound keeps all their logs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use mps_ipc::trust::TrustedDir;

/// Server logs kept per user unless the operator says otherwise: twice the default servers
/// per user, so that the logs of as many past servers stay beside those of the running ones.
pub const DEFAULT_MAX_SERVER_LOGS: usize = 32;

/// Entries of a log directory read at most when bounding it: one readdir and a stat each, so
/// that a user who fills their own directory with names costs the daemon's intake a bounded
/// time (a few milliseconds) per server started.
const MOST_ENTRIES_READ: usize = 16384;

/// The log of the server of (`uid`, `group`, `device`): device 0 keeps the names of a host with
/// one device; `@` cannot occur in a group name.
pub(super) fn log_name(uid: u32, group: &str, device: u32) -> String {
    match device {
        0 => format!("server-{uid}-{group}.log"),
        d => format!("server-{uid}-{group}@{d}.log"),
    }
}

/// The log a file of a server's log belongs to: `NAME` for itself and its older generation
/// `NAME.1`; `None` for a file that is not a server's log.
fn log_of(file: &str) -> Option<&str> {
    let name = file.strip_suffix(".1").unwrap_or(file);
    (name.starts_with("server-") && name.ends_with(".log")).then_some(name)
}

/// Removes from `dir` (uid `uid`'s server logs) the logs of servers no longer running, the
/// least recently written first, until it holds at most `max` logs counting `new` (the log of
/// the server about to start); the logs in `live` (running servers') and `new` stay. Each
/// removal is logged; a log that cannot be removed is logged and left.
pub(super) fn bound(dir: &TrustedDir, uid: u32, max: usize, live: &BTreeSet<String>, new: &str) {
    let (files, unread) = match dir.files(|f| log_of(f).is_some(), MOST_ENTRIES_READ) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(uid, "cannot bound the server logs: {e}");
            return;
        }
    };
    if unread {
        tracing::warn!(
            uid,
            "{} holds more than {MOST_ENTRIES_READ} entries; only the server logs among the \
             first {MOST_ENTRIES_READ} are bounded",
            dir.path().display()
        );
    }
    // Each log with its files and when it was last written (the newer of its two files).
    let mut logs: BTreeMap<String, (SystemTime, Vec<String>)> = BTreeMap::new();
    for (file, written) in files {
        let name = log_of(&file).expect("listed as a log").to_string();
        let log = logs.entry(name).or_insert((written, Vec::new()));
        log.0 = log.0.max(written);
        log.1.push(file);
    }
    let mut count = logs.len() + usize::from(!logs.contains_key(new));
    let mut past: Vec<(SystemTime, String, Vec<String>)> = logs
        .into_iter()
        .filter(|(name, _)| name != new && !live.contains(name))
        .map(|(name, (written, files))| (written, name, files))
        .collect();
    past.sort();
    for (_, _, files) in past {
        if count <= max {
            break;
        }
        let mut removed = Vec::new();
        for file in files {
            match dir.remove(&file) {
                Ok(()) => removed.push(file),
                Err(e) => tracing::warn!(
                    uid,
                    "cannot remove {}: {e}",
                    dir.path().join(&file).display()
                ),
            }
        }
        if !removed.is_empty() {
            tracing::info!(
                uid,
                "removed {} of {}, the log of a server no longer running: uid {uid} has more \
                 than {max} server logs (mps-control --max-server-logs)",
                removed.join(" and "),
                dir.path().display()
            );
            count -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn names(dir: &std::path::Path) -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }

    #[test]
    fn the_least_recently_written_past_logs_go_first_and_live_ones_stay() {
        let path = std::env::temp_dir().join(format!("mps-logs-bound-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        let dir = TrustedDir::open(&path, 0o700).unwrap();
        let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs);
        // (file, when it was last written): g0 is the oldest but its server runs; g2's older
        // generation is old, its log recent.
        let files = [
            ("server-7-g0.log", 0),
            ("server-7-g1.log", 10),
            ("server-7-g1.log.1", 5),
            ("server-7-g2.log.1", 1),
            ("server-7-g2.log", 40),
            ("server-7-g3.log", 20),
            ("server-7-g4@1.log", 30),
            ("control.log", 0),
            ("notes", 0),
        ];
        for (name, secs) in files {
            let f = std::fs::File::create(path.join(name)).unwrap();
            f.set_modified(at(secs)).unwrap();
        }
        std::fs::create_dir(path.join("server-7-dir.log")).unwrap();
        let live = BTreeSet::from(["server-7-g0.log".to_string()]);
        // Five logs and the new one, at most four: g1 and g3 (the oldest past ones) go.
        bound(&dir, 7, 4, &live, "server-7-g5.log");
        let left = names(&path);
        let expected: BTreeSet<String> = [
            "server-7-g0.log",
            "server-7-g2.log.1",
            "server-7-g2.log",
            "server-7-g4@1.log",
            "control.log",
            "notes",
            "server-7-dir.log",
        ]
        .into_iter()
        .map(str::to_string)
        .collect();
        assert_eq!(left, expected);
        // A log that exists already is not a new one; live logs stay whatever the bound.
        bound(&dir, 7, 1, &live, "server-7-g2.log");
        let left = names(&path);
        assert!(left.contains("server-7-g0.log") && left.contains("server-7-g2.log"));
        assert!(!left.contains("server-7-g4@1.log"), "{left:?}");
        std::fs::remove_dir_all(&path).unwrap();
    }

    #[test]
    fn server_log_names_are_recognised_with_their_older_generation() {
        assert_eq!(log_name(0, "default", 0), "server-0-default.log");
        assert_eq!(log_name(5, "a", 2), "server-5-a@2.log");
        assert_eq!(log_of("server-5-a@2.log.1"), Some("server-5-a@2.log"));
        assert_eq!(log_of("control.log"), None);
        assert_eq!(log_of("server-5-a.log.2"), None);
    }
}
