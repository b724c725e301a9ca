//! Property tests of everything mps-core decodes from a peer: commands (`Request::decode`),
//! completions (`Completion::result`, `message`), the handshake's strings (group names and
//! messages), and PTX module images. Each decoder must never panic, whatever the bytes, and must
//! give back what its encoder wrote.
//!
//! Cases per property: `PROPTEST_CASES` (default 2,000, a few seconds in all); a failure prints
//! the smallest input it found, which then belongs in the regression tests at the end.

use mps_core::protocol::{
    COMPLETION_DATA_BYTES, Command, Completion, CompletionKind, GROUP_BYTES, Hello, Request,
    SLOT_BYTES, Welcome, check_group, get_str, put_str,
};
use mps_core::ptx::{ImageFormat, parse_entries};
use mps_core::{Error, Status};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig {
        cases,
        // Failures are reported with the shrunk input; no files are written next to the tests.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A u64 as a hostile client picks them: edges more often than chance would.
fn word() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(4),
        Just(100),
        Just(101),
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 + 1),
        Just(u64::MAX),
        0u64..4096,
        any::<u64>(),
    ]
}

/// A command slot with mostly valid opcodes and flags, and its payload slots.
fn command() -> impl Strategy<Value = (Command, Vec<u8>)> {
    (
        prop_oneof![0u16..40, any::<u16>()],
        prop_oneof![0u16..8, any::<u16>()],
        prop_oneof![3 => 0u16..4, 1 => any::<u16>()],
        prop_oneof![3 => Just(0u16), 1 => any::<u16>()],
        any::<u64>(),
        word(),
        [word(), word(), word(), word(), word()],
        prop::collection::vec(any::<u8>(), 0..4 * SLOT_BYTES),
    )
        .prop_map(
            |(opcode, flags, extra, reserved, seq, stream, args, mut payload)| {
                // Mostly a payload as long as extra_slots says; sometimes not.
                if payload.len() % 3 != 0 {
                    payload.resize(extra as usize * SLOT_BYTES, 0xa5);
                }
                let cmd = Command {
                    opcode,
                    flags,
                    extra_slots: extra,
                    reserved,
                    seq,
                    stream,
                    args,
                };
                (cmd, payload)
            },
        )
}

fn padded(payload: &[u8]) -> Vec<u8> {
    let mut p = payload.to_vec();
    p.resize(payload.len().div_ceil(SLOT_BYTES) * SLOT_BYTES, 0);
    p
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_command_decodes_or_is_refused_and_round_trips((cmd, payload) in command()) {
        if let Ok(req) = Request::decode(&cmd, &payload) {
            let (again, bytes) = req.encode(cmd.seq, cmd.stream, cmd.flags);
            let bytes = padded(bytes);
            prop_assert_eq!(Request::decode(&again, &bytes).unwrap(), req);
        }
    }

    #[test]
    fn any_completion_reads_without_panicking(bytes in prop::array::uniform32(any::<u8>()),
                                               tail in prop::collection::vec(any::<u8>(), 224)) {
        let mut raw = [0u8; size_of::<Completion>()];
        raw[..32].copy_from_slice(&bytes);
        raw[32..].copy_from_slice(&tail);
        let c: Completion = bytemuck::pod_read_unaligned(&raw);
        let _ = c.message();
        prop_assert!(c.data().len() <= COMPLETION_DATA_BYTES);
        match c.result() {
            Ok(v) => prop_assert_eq!(v, c.values),
            Err(e) => prop_assert_ne!(e.status, Status::Success),
        }
    }

    #[test]
    fn an_error_completion_carries_its_status_and_message(
        status in (1u32..64).prop_filter_map("a status", Status::from_u32)
            .prop_filter("an error", |s| *s != Status::Success),
        message in ".{0,300}",
        seq in any::<u64>(),
    ) {
        let c = Completion::error(seq, CompletionKind::Reply, &Error::new(status, message.clone()));
        let e = c.result().unwrap_err();
        prop_assert_eq!(e.status, status);
        // The message, cut at a character boundary to fit.
        prop_assert!(message.starts_with(&e.message));
        prop_assert!(e.message.len() <= COMPLETION_DATA_BYTES);
        prop_assert!(message.len() <= COMPLETION_DATA_BYTES || e.message.len() + 4 > COMPLETION_DATA_BYTES);
    }

    #[test]
    fn any_hello_or_welcome_reads_without_panicking(raw in prop::collection::vec(any::<u8>(), size_of::<Welcome>())) {
        let h: Hello = bytemuck::pod_read_unaligned(&raw[..size_of::<Hello>()]);
        let group = get_str(&h.group);
        if check_group(&group).is_ok() {
            prop_assert!(group.len() < GROUP_BYTES);
        }
        let w: Welcome = bytemuck::pod_read_unaligned(&raw);
        let _ = get_str(&w.message);
    }

    #[test]
    fn a_valid_group_name_round_trips(name in "[A-Za-z0-9_-][A-Za-z0-9_.-]{0,30}") {
        prop_assert!(check_group(&name).is_ok());
        let field: [u8; GROUP_BYTES] = put_str(&name);
        prop_assert_eq!(get_str(&field), name);
    }

    #[test]
    fn any_module_image_is_read_or_refused(image in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = ImageFormat::detect(&image);
        let _ = parse_entries(&image);
    }

    #[test]
    fn ptx_made_of_its_own_tokens_is_read_or_refused(tokens in prop::collection::vec(ptx_token(), 0..60)) {
        let text = tokens.concat();
        if let Ok(entries) = parse_entries(text.as_bytes()) {
            for e in entries {
                // Offsets ascend and every parameter fits in the 32-bit layout.
                let mut end = 0u64;
                for p in &e.params {
                    prop_assert!(u64::from(p.offset) >= end);
                    end = u64::from(p.offset) + u64::from(p.size);
                }
                prop_assert!(end <= u64::from(u32::MAX));
            }
        }
    }

    #[test]
    fn generated_entries_are_read_back(entries in prop::collection::vec(entry(), 1..5)) {
        let mut text = String::from(".version 8.8\n.target sm_90\n.address_size 64\n");
        for (name, params) in &entries {
            let list: Vec<String> = params
                .iter()
                .enumerate()
                .map(|(i, (ty, _, count))| match count {
                    Some(n) => format!(".param .align 8 .b8 {name}_p{i}[{n}]"),
                    None => format!(".param {ty} {name}_p{i}"),
                })
                .collect();
            text += &format!(".visible .entry {name}(\n\t{}\n)\n{{\n\tret;\n}}\n", list.join(",\n\t"));
        }
        prop_assert_eq!(ImageFormat::detect(text.as_bytes()).unwrap(), ImageFormat::Ptx);
        let read = parse_entries(text.as_bytes()).unwrap();
        prop_assert_eq!(read.len(), entries.len());
        for (got, (name, params)) in read.iter().zip(&entries) {
            prop_assert_eq!(&got.name, name);
            let sizes: Vec<u32> = got.params.iter().map(|p| p.size).collect();
            let want: Vec<u32> = params.iter().map(|(_, size, count)| count.map_or(*size, |n| n)).collect();
            prop_assert_eq!(sizes, want);
        }
    }
}

/// Pieces PTX is made of, and the ones the reader looks for.
fn ptx_token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(".entry ".to_string()),
        Just(".visible ".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just(",".to_string()),
        Just(" ".to_string()),
        Just("\n".to_string()),
        Just(".param ".to_string()),
        Just(".align ".to_string()),
        Just(".ptr .global ".to_string()),
        Just("//".to_string()),
        Just("/*".to_string()),
        Just("*/".to_string()),
        prop::sample::select(vec![".u8 ", ".b16 ", ".f32 ", ".u64 ", ".b8 ", ".bogus "])
            .prop_map(str::to_string),
        "[a-z_$.][a-z0-9_]{0,6}".prop_map(|s| s + " "),
        prop_oneof![Just(1u64 << 31), word()].prop_map(|n| format!("{n} ")),
        prop_oneof![
            Just(u32::MAX as u64),
            Just(1 << 31),
            0u64..100,
            any::<u64>()
        ]
        .prop_map(|n| format!("x[{n}] ")),
        "\\PC{0,3}",
    ]
}

type Param = (&'static str, u32, Option<u32>);

/// A kernel name and its parameters: (type, size) or a byte array of `count`.
fn entry() -> impl Strategy<Value = (String, Vec<Param>)> {
    let scalar = prop::sample::select(vec![
        (".u8", 1u32),
        (".u16", 2),
        (".f32", 4),
        (".u32", 4),
        (".u64", 8),
        (".f64", 8),
    ]);
    let param = prop_oneof![
        scalar.prop_map(|(t, s)| (t, s, None)),
        (1u32..64).prop_map(|n| (".b8", 1, Some(n))),
    ];
    ("[a-z_][a-z0-9_]{0,12}", prop::collection::vec(param, 0..8))
}

// Regression tests: inputs the properties above found that once made a decoder misbehave.

#[test]
fn a_parameter_aligned_past_four_gibibytes_is_refused() {
    // The aligned offset of the second parameter overflowed u32 (a panic in a debug build, a
    // wrapped offset in a release build).
    let ptx = ".version 8.8\n.target sm_90\n.entry k(.param .b8 a[4294967295], \
               .param .align 2147483648 .u8 b)\n";
    let e = parse_entries(ptx.as_bytes()).unwrap_err();
    assert_eq!(e.status, Status::InvalidImage, "{}", e.message);
}
