//! Property tests of what the server and the daemon parse from others: the hello as the server
//! reads it off a socket (`read_hello`), the welcome as a client turns it into a channel layout
//! (`Layout::from_welcome`) and the operators' commands to the daemon (`Daemon::command`); what
//! the daemon sends a server is fuzzed where it is decoded (`control::wire`'s tests). None may panic, whatever the
//! input; settings read back what was set.
//!
//! Cases per property: `PROPTEST_CASES` (default 2,000; a fifth of that for the daemon, which binds sockets for each).

use std::os::unix::net::UnixStream;

use mps_core::protocol::{HELLO_PREFIX, Hello, MAGIC, PROTOCOL_VERSION, Welcome, put_str};
use mps_ipc::channel::Layout;
use mps_server::control::{Daemon, DaemonConfig};
use mps_server::registry::Defaults;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const DEFAULTS: Defaults = Defaults {
    mem_limit: 0,
    priority: 0,
    sm_share: 100,
    max_sm_reserve: 50,
};

/// A daemon bound in a fresh directory, with a server binary that does not exist (no command
/// here may start a server).
fn daemon() -> (Daemon, std::path::PathBuf) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("mps-fuzz-daemon-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = Daemon::bind(DaemonConfig {
        pipe_dir: dir.join("pipe"),
        log_dir: dir.join("log"),
        server_bin: dir.join("no-such-mps-server"),
        server_args: vec![],
        devices: vec![0, 1],
        defaults: DEFAULTS,
        standby: false,
        hellos: Default::default(),
        max_servers_per_user: 16,
        max_server_logs: 32,
        config: Default::default(),
        config_path: dir.join("mps.toml"),
        proc_root: "/proc".into(),
    })
    .unwrap();
    (d, dir)
}

/// Words the parsers know, numbers at their edges, and junk.
fn word(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(known).prop_map(str::to_string),
        prop::sample::select(vec![
            "0",
            "1",
            "-1",
            "100",
            "101",
            "-f",
            "-t",
            "-v",
            "4294967296",
            "18446744073709551615",
            "1GiB",
            "0x10",
            "1e9",
            "",
        ])
        .prop_map(str::to_string),
        any::<u64>().prop_map(|n| n.to_string()),
        "\\PC{0,8}",
    ]
}

fn line(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec(word(known), 0..5).prop_map(|w| w.join(" "))
}

const DAEMON_COMMANDS: &[&str] = &[
    "get_server_list",
    "get_server_status",
    "shutdown_server",
    "status",
    "get_client_list",
    "terminate_client",
    "set_default_client_priority",
    "get_default_client_priority",
    "set_default_active_thread_percentage",
    "get_default_active_thread_percentage",
    "set_active_thread_percentage",
    "get_active_thread_percentage",
    "set_max_sm_reservation",
    "get_max_sm_reservation",
    "set_default_device_pinned_mem_limit",
    "get_default_device_pinned_mem_limit",
    "set_device_pinned_mem_limit",
    "get_device_pinned_mem_limit",
];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_hello_on_the_socket_is_read_or_refused(
        bytes in prop::collection::vec(any::<u8>(), 0..96),
        valid_prefix in any::<bool>(),
    ) {
        let mut bytes = bytes;
        if valid_prefix && bytes.len() >= HELLO_PREFIX {
            bytes[..4].copy_from_slice(&MAGIC.to_ne_bytes());
            bytes[4..8].copy_from_slice(&PROTOCOL_VERSION.to_ne_bytes());
        }
        let (client, server) = UnixStream::pair().unwrap();
        mps_ipc::socket::send(&client, &bytes, &[]).unwrap();
        drop(client);
        match mps_server::server::read_hello(&server) {
            Ok(h) => {
                // Only a whole hello with the right prefix is read, and as it was sent.
                prop_assert!(bytes.len() >= size_of::<Hello>());
                prop_assert_eq!(bytemuck::bytes_of(&h), &bytes[..size_of::<Hello>()]);
            }
            Err(e) => prop_assert!(!e.message.is_empty()),
        }
    }

    #[test]
    fn any_welcome_gives_a_sound_layout_or_an_error(
        submit in prop_oneof![(0u32..20).prop_map(|k| 1u32 << k), any::<u32>()],
        complete in prop_oneof![(0u32..20).prop_map(|k| 1u32 << k), any::<u32>()],
        staging in prop_oneof![(0u64..300).prop_map(|p| p * 4096), any::<u64>()],
        sizes in prop_oneof![Just(None), (any::<u64>(), any::<u64>()).prop_map(Some)],
        status in prop_oneof![Just(0u32), any::<u32>()],
    ) {
        let announced = Layout {
            submit_slots: submit,
            complete_slots: complete,
            staging_bytes: staging as usize,
        };
        // Sizes that match the rings when the rings are usable (or arbitrary ones).
        let (client_bytes, server_bytes) = match sizes {
            Some(s) => s,
            None if announced.validate().is_ok() => {
                (announced.client_bytes() as u64, announced.server_bytes() as u64)
            }
            None => (0, 0),
        };
        let w = Welcome {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            status,
            submit_slots: submit,
            complete_slots: complete,
            staging_bytes: staging,
            client_segment_bytes: client_bytes,
            server_segment_bytes: server_bytes,
            message: put_str("fuzz"),
            ..bytemuck::Zeroable::zeroed()
        };
        if let Ok(layout) = Layout::from_welcome(&w) {
            prop_assert!(layout.validate().is_ok());
            prop_assert_eq!(layout.client_bytes() as u64, client_bytes);
            prop_assert_eq!(layout.server_bytes() as u64, server_bytes);
        }
    }
}

proptest! {
    // Each case binds a daemon's sockets: fewer of them.
    #![proptest_config(ProptestConfig { cases: config().cases / 5 + 1, ..config() })]

    #[test]
    fn any_operator_command_is_answered_or_refused(lines in prop::collection::vec(line(DAEMON_COMMANDS), 1..20)) {
        let (d, dir) = daemon();
        for l in &lines {
            let _ = d.command(l);
        }
        prop_assert!(d.command("set_default_active_thread_percentage 37").is_ok());
        prop_assert_eq!(d.command("get_default_active_thread_percentage").unwrap(), "37\n");
        drop(d);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
