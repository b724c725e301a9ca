//! Every opcode refuses what a client must not send: malformed commands, bad or foreign
//! handles, pointers and ranges outside what the client holds.

use super::*;
use mps_core::protocol::Cluster;

#[test]
fn the_core_runs_a_kernel_and_copies_on_the_simulator() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let m = c.load_module(PTX).unwrap();
    let f = c.function(m, "fill_u32");
    let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let p = c.alloc(64);
    let params = fill_params(p, 0xabcd_0123, 16);
    assert!(matches!(c.send(&launch(f, &params), s, 0), Output::Silent));
    let back = Request::CopyDtoH {
        dst: HostRef::Staging { offset: 0 },
        src: p,
        len: 64,
    };
    assert!(matches!(c.send(&back, s, flags::MARK), Output::Silent));
    wait_progress(&c.channel, slot as u32, c.seq);
    assert!(c.faults.0.lock().unwrap().is_empty());
    let (staging, _) = c.channel.staging();
    // SAFETY: the staging area holds at least 64 bytes, written by the finished copy.
    let got = unsafe { std::slice::from_raw_parts(staging as *const u32, 16) };
    assert!(got.iter().all(|v| *v == 0xabcd_0123), "{got:x?}");
}

#[test]
fn malformed_commands_are_refused_before_anything_runs() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let (good, _) = Request::MemAlloc { size: 64 }.encode(1, 0, flags::REPLY);
    let mut cases: Vec<(Command, Vec<u8>, &str)> = Vec::new();
    let mut unknown = good;
    unknown.opcode = 999;
    cases.push((unknown, vec![], "unknown opcode"));
    let mut bad_flags = good;
    bad_flags.flags = 0x80;
    cases.push((bad_flags, vec![], "undefined flag"));
    let mut reserved = good;
    reserved.reserved = 1;
    cases.push((reserved, vec![], "reserved"));
    let mut marked = good;
    marked.flags |= flags::MARK;
    cases.push((marked, vec![], "cannot carry MARK"));
    let mut payload = good;
    payload.extra_slots = 1;
    cases.push((payload, vec![0; SLOT_BYTES], "takes no payload"));
    let (mut long_params, _) = launch(1, &[0; 8]).encode(1, 0, flags::REPLY);
    long_params.args[4] = 200 << 32;
    cases.push((long_params, vec![0; SLOT_BYTES], "longer than"));
    let (mut memset, _) = Request::Memset {
        fill: Fill {
            dst: 0,
            value: 0,
            elem_size: 4,
            count: 1,
        },
    }
    .encode(1, 0, flags::REPLY);
    memset.args[2] = 3;
    cases.push((memset, vec![], "neither 1 nor 4"));
    memset.args[2] = 1;
    memset.args[1] = 0x100;
    cases.push((memset, vec![], "does not fit"));
    let (mut module, _) = Request::ModuleData {
        staging_offset: 0,
        len: 1,
        last: true,
    }
    .encode(1, 0, flags::REPLY);
    module.args[2] = 2;
    cases.push((module, vec![], "last is 2, not 0 or 1"));
    let (mut priority, _) = Request::SetPriority { level: 1 }.encode(1, 0, flags::REPLY);
    priority.args[0] = 2;
    cases.push((priority, vec![], "neither 0"));
    let (mut stream_priority, _) = Request::StreamCreate { priority: 0 }.encode(1, 0, 1);
    stream_priority.args[0] = 1 << 40;
    cases.push((stream_priority, vec![], "priority out of range"));
    for percent in [0, 101] {
        let (share, _) = Request::SetSmShare { percent }.encode(1, 0, flags::REPLY);
        cases.push((share, vec![], "1 to 100"));
    }
    for (cmd, payload, says) in cases {
        match c.send_raw(&cmd, &payload) {
            Output::Post(reply) => {
                let e = reply.result().unwrap_err();
                assert_eq!(e.status, Status::InvalidValue, "{cmd:?}: {e}");
                assert!(e.message.contains(says), "{cmd:?}: {e} lacks {says:?}");
            }
            other => panic!("{cmd:?} was answered with {other:?}"),
        }
    }
}

#[test]
fn every_opcode_checks_its_handles_pointers_and_ranges() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let s = c.stream();
    let e = c.event();
    let m = c.load_module(PTX).unwrap();
    let f = c.function(m, "fill_u32");
    let p = c.alloc(256);
    let hb = c.host_alloc(4096);
    let staging = c.channel.staging().1 as u64;
    let unknown_stream = 0x0100_0000_0000_9999;
    use Status::{InvalidHandle as Handle, InvalidValue as Value, NotFound};
    let params = fill_params(p, 0, 1);
    let cases: Vec<(Request<'_>, u64, Status, &str)> = vec![
        (Request::MemAlloc { size: 0 }, 0, Value, "0 bytes"),
        (Request::MemFree { ptr: p + 4 }, 0, Handle, "not its start"),
        (
            Request::MemFree { ptr: 0xdead },
            0,
            Handle,
            "not an allocation",
        ),
        (Request::HostAlloc { size: 0 }, 0, Value, "0-byte"),
        (Request::HostFree { handle: e }, 0, Handle, "names an event"),
        (
            Request::CopyHtoD {
                dst: p,
                src: HostRef::Staging { offset: 0 },
                len: 257,
            },
            s,
            Handle,
            "runs past the end of its allocation",
        ),
        (
            Request::CopyHtoD {
                dst: p,
                src: HostRef::Staging { offset: 0 },
                len: 0,
            },
            s,
            Value,
            "empty",
        ),
        (
            Request::CopyHtoD {
                dst: p,
                src: HostRef::Staging {
                    offset: staging - 1,
                },
                len: 2,
            },
            s,
            Value,
            "staging area",
        ),
        (
            Request::CopyHtoD {
                dst: p,
                src: HostRef::Staging { offset: u64::MAX },
                len: 2,
            },
            s,
            Value,
            "staging area",
        ),
        (
            Request::CopyDtoH {
                dst: HostRef::Buffer {
                    handle: hb,
                    offset: 4095,
                },
                src: p,
                len: 2,
            },
            s,
            Value,
            "host buffer",
        ),
        (
            Request::CopyDtoH {
                dst: HostRef::Buffer {
                    handle: s,
                    offset: 0,
                },
                src: p,
                len: 2,
            },
            s,
            Handle,
            "names a stream",
        ),
        (
            Request::CopyDtoD {
                copy: DeviceCopy {
                    dst: p,
                    src: p + 128,
                    len: 256,
                },
            },
            s,
            Handle,
            "copy source",
        ),
        (
            Request::CopyDtoD {
                copy: DeviceCopy {
                    dst: p,
                    src: p,
                    len: u64::MAX,
                },
            },
            s,
            Handle,
            "runs past",
        ),
        (
            Request::Memset {
                fill: Fill {
                    dst: p,
                    value: 0,
                    elem_size: 4,
                    count: u64::MAX,
                },
            },
            s,
            Value,
            "overflows",
        ),
        (
            Request::Memset {
                fill: Fill {
                    dst: p,
                    value: 0,
                    elem_size: 4,
                    count: 65,
                },
            },
            s,
            Handle,
            "memset destination",
        ),
        (
            Request::ModuleData {
                staging_offset: staging,
                len: 1,
                last: true,
            },
            0,
            Value,
            "staging area",
        ),
        (
            Request::ModuleData {
                staging_offset: u64::MAX,
                len: 2,
                last: true,
            },
            0,
            Value,
            "staging area",
        ),
        (
            Request::ModuleUnload { module: f },
            0,
            Handle,
            "names a function",
        ),
        (
            Request::GetFunction {
                module: m,
                name: b"no_such_kernel",
            },
            0,
            NotFound,
            "no kernel named",
        ),
        (
            Request::GetFunction {
                module: m,
                name: &[0xff, 0xfe],
            },
            0,
            Value,
            "UTF-8",
        ),
        (
            Request::GetFunction {
                module: s,
                name: b"fill_u32",
            },
            0,
            Handle,
            "names a stream",
        ),
        (
            Request::ParamInfo {
                function: m,
                first: 0,
            },
            0,
            Handle,
            "names a module",
        ),
        (launch(f, &params[..20]), s, Value, "24 bytes of parameters"),
        (launch(e, &params), s, Handle, "names an event"),
        (
            Request::Launch {
                spec: LaunchSpec {
                    function: f,
                    grid: one(),
                    block: Dim3 {
                        x: 2048,
                        y: 1,
                        z: 1,
                    },
                    shared_mem: 0,
                    cluster: None,
                    params: &params,
                },
            },
            s,
            Value,
            "1024 threads",
        ),
        (
            Request::Launch {
                spec: LaunchSpec {
                    function: f,
                    grid: one(),
                    block: one(),
                    shared_mem: 2 << 30,
                    cluster: None,
                    params: &params,
                },
            },
            s,
            Value,
            "bytes of dynamic shared memory",
        ),
        (
            Request::Launch {
                spec: LaunchSpec {
                    function: f,
                    grid: Dim3 { x: 0, y: 1, z: 1 },
                    block: one(),
                    shared_mem: 0,
                    cluster: None,
                    params: &params,
                },
            },
            s,
            Value,
            "zero extent",
        ),
        (
            Request::Launch {
                spec: LaunchSpec {
                    function: f,
                    grid: Dim3 { x: 3, y: 1, z: 1 },
                    block: one(),
                    shared_mem: 0,
                    cluster: Some(Cluster {
                        dims: Dim3 { x: 2, y: 1, z: 1 },
                        non_portable: false,
                    }),
                    params: &params,
                },
            },
            s,
            Value,
            "do not divide the grid",
        ),
        (
            Request::Launch {
                spec: LaunchSpec {
                    function: f,
                    grid: Dim3 { x: 16, y: 1, z: 1 },
                    block: one(),
                    shared_mem: 0,
                    cluster: Some(Cluster {
                        dims: Dim3 { x: 16, y: 1, z: 1 },
                        non_portable: false,
                    }),
                    params: &params,
                },
            },
            s,
            Value,
            "the portable size",
        ),
        (
            launch(f, &params),
            unknown_stream,
            Handle,
            "does not belong",
        ),
        (Request::Mark, unknown_stream, Handle, "does not belong"),
        (Request::Mark, e, Handle, "names an event"),
        (
            Request::StreamDestroy { stream: 0 },
            0,
            Value,
            "default stream",
        ),
        (
            Request::StreamDestroy { stream: e },
            0,
            Handle,
            "names an event",
        ),
        (
            Request::EventDestroy { event: s },
            0,
            Handle,
            "names a stream",
        ),
        (
            Request::EventRecord { event: m },
            s,
            Handle,
            "names a module",
        ),
        (
            Request::StreamWaitEvent { event: 12345 },
            s,
            Handle,
            "is not an event handle",
        ),
        (
            Request::EventElapsed { start: e, end: e },
            0,
            Value,
            "never recorded",
        ),
        (
            Request::EventElapsed { start: e, end: hb },
            0,
            Handle,
            "names a host buffer",
        ),
        (Request::SetMemLimit { bytes: 0 }, 0, Value, "0 bytes"),
    ];
    for (req, stream, status, says) in &cases {
        c.refused(req, *stream, *status, says);
    }
    // Nothing refused above ran or broke the session: the objects still work.
    c.ok(&launch(f, &params), s);
    c.ok(
        &Request::ParamInfo {
            function: f,
            first: 9,
        },
        0,
    );
    c.ok(&Request::MemFree { ptr: p }, 0);
    c.ok(&Request::HostFree { handle: hb }, 0);
    c.refused(
        &Request::HostFree { handle: hb },
        0,
        Handle,
        "does not belong",
    );
    assert!(c.faults.0.lock().unwrap().is_empty());
}

#[test]
fn only_stream_ordered_opcodes_may_name_a_stream() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let s = c.stream();
    let e = c.event();
    let not_ordered = [
        Request::MemAlloc { size: 64 },
        Request::MemFree { ptr: 1 },
        Request::MemGetInfo,
        Request::HostAlloc { size: 64 },
        Request::HostFree { handle: 1 },
        Request::ModuleData {
            staging_offset: 0,
            len: 1,
            last: false,
        },
        Request::ModuleUnload { module: 1 },
        Request::GetFunction {
            module: 1,
            name: b"k",
        },
        Request::ParamInfo {
            function: 1,
            first: 0,
        },
        Request::StreamCreate { priority: 0 },
        Request::StreamDestroy { stream: s },
        Request::EventCreate,
        Request::EventDestroy { event: e },
        Request::EventElapsed { start: e, end: e },
        Request::SetMemLimit { bytes: 1 },
        Request::SetPriority { level: 1 },
        Request::SetSmShare { percent: 50 },
        Request::ReserveSms { percent: 50 },
        Request::SmInfo,
    ];
    for req in &not_ordered {
        assert!(!req.opcode().is_stream_ordered());
        c.refused(req, s, Status::InvalidValue, "is not stream-ordered");
    }
    // The stream and event were not destroyed by the refused commands.
    c.ok(&Request::Mark, s);
    c.ok(&Request::EventRecord { event: e }, s);
}
