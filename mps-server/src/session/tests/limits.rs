//! Every limit on a client is refused by name, and frees up when the client gives back.

use super::*;

#[test]
fn every_count_limit_is_refused_by_name_and_frees_up_again() {
    let server = sim();
    let limits = Limits {
        max_streams: 2,
        max_events: 2,
        max_modules: 1,
        max_functions: 1,
        max_host_buffers: 1,
        ..Limits::default()
    };
    let mut c = server.client(limits);
    let quota = Status::QuotaExceeded;

    let s1 = c.stream();
    c.stream();
    let create = Request::StreamCreate { priority: 0 };
    c.refused(&create, 0, quota, "max_streams");
    c.ok(&Request::StreamDestroy { stream: s1 }, 0);
    c.stream();

    let e1 = c.event();
    c.event();
    c.refused(&Request::EventCreate, 0, quota, "max_events");
    c.ok(&Request::EventDestroy { event: e1 }, 0);
    c.event();

    let m = c.load_module(PTX).unwrap();
    let e = c.load_module(PTX).unwrap_err();
    assert_eq!(e.status, quota, "{e}");
    assert!(e.message.contains("max_modules"), "{e}");

    let f = c.function(m, "fill_u32");
    let get = Request::GetFunction {
        module: m,
        name: b"add_f32",
    };
    c.refused(&get, 0, quota, "max_functions");
    // Unloading the module drops its functions with it.
    c.ok(&Request::ModuleUnload { module: m }, 0);
    let gone = Request::ParamInfo {
        function: f,
        first: 0,
    };
    c.refused(&gone, 0, Status::InvalidHandle, "does not belong");
    let m = c.load_module(PTX).unwrap();
    c.function(m, "add_f32");

    let hb = c.host_alloc(64);
    c.refused(
        &Request::HostAlloc { size: 64 },
        0,
        quota,
        "max_host_buffers",
    );
    c.ok(&Request::HostFree { handle: hb }, 0);
    c.host_alloc(64);
}

#[test]
fn host_buffer_bytes_are_bounded_per_client() {
    let server = sim();
    let limits = Limits {
        max_host_bytes: 8192,
        ..Limits::default()
    };
    let mut c = server.client(limits);
    let quota = Status::QuotaExceeded;
    let a = c.host_alloc(4096);
    // 4097 bytes take two pages.
    c.refused(
        &Request::HostAlloc { size: 4097 },
        0,
        quota,
        "max_host_bytes",
    );
    let huge = c.refused(
        &Request::HostAlloc { size: u64::MAX },
        0,
        quota,
        "max_host_bytes",
    );
    assert!(huge.message.contains(&u64::MAX.to_string()), "{huge}");
    c.host_alloc(4096);
    c.refused(
        &Request::HostAlloc { size: 1 },
        0,
        quota,
        "limit of 8192 bytes",
    );
    c.ok(&Request::HostFree { handle: a }, 0);
    c.host_alloc(1);
}

#[test]
fn module_uploads_are_bounded_and_an_abandoned_one_is_freed() {
    let server = sim();
    let limits = Limits {
        max_module_bytes: 1024,
        ..Limits::default()
    };
    let mut c = server.client(limits);
    let chunk = |len, last| Request::ModuleData {
        staging_offset: 0,
        len,
        last,
    };
    c.ok(&chunk(1000, false), 0);
    assert!(c.core.pending_module_bytes() >= 1000);
    c.refused(
        &chunk(100, false),
        0,
        Status::QuotaExceeded,
        "max_module_bytes",
    );
    assert_eq!(c.core.pending_module_bytes(), 0);
    // A chunk outside the staging area abandons the upload too.
    c.ok(&chunk(1000, false), 0);
    let outside = Request::ModuleData {
        staging_offset: u64::MAX,
        len: 1,
        last: false,
    };
    c.refused(&outside, 0, Status::InvalidValue, "staging area");
    assert_eq!(c.core.pending_module_bytes(), 0);
    // A whole image that fits loads; one that does not is refused.
    let small = b".version 8.0\n.target sm_90\n.address_size 64\n";
    c.load_module(small).unwrap();
    let mut big = small.to_vec();
    big.resize(1025, b' ');
    let e = c.load_module(&big).unwrap_err();
    assert_eq!(e.status, Status::QuotaExceeded, "{e}");
    assert_eq!(c.core.pending_module_bytes(), 0);
}

#[test]
fn a_ptx_module_of_too_many_entries_is_refused() {
    let server = sim();
    let limits = Limits {
        max_module_entries: 3,
        ..Limits::default()
    };
    let mut c = server.client(limits);
    let module = |n: usize| {
        let mut ptx = String::from(".version 8.0\n.target sm_90\n.address_size 64\n");
        for i in 0..n {
            ptx += &format!(".visible .entry k{i}()\n{{\n\tret;\n}}\n");
        }
        ptx.into_bytes()
    };
    c.load_module(&module(3)).unwrap();
    let e = c.load_module(&module(4)).unwrap_err();
    assert_eq!(e.status, Status::QuotaExceeded, "{e}");
    assert!(e.message.contains("max_module_entries"), "{e}");
}

#[test]
fn limits_past_what_the_protocol_allows_are_refused() {
    let server = sim();
    for limits in [
        Limits {
            max_streams: MAX_STREAMS,
            ..Limits::default()
        },
        Limits {
            max_module_bytes: protocol::MAX_MODULE_BYTES + 1,
            ..Limits::default()
        },
    ] {
        let e = server.try_client(limits).err().expect("refused");
        assert_eq!(e.status, Status::InvalidValue, "{e}");
    }
    assert!(Limits::default().check().is_ok());
}

#[test]
fn the_memory_limit_is_enforced_and_only_lowered() {
    let server = sim();
    let mut c = server.client(Limits::default());
    assert_eq!(c.ok(&Request::SetMemLimit { bytes: 4096 }, 0)[0], 4096);
    assert_eq!(c.ok(&Request::SetMemLimit { bytes: 1 << 20 }, 0)[0], 4096);
    // Counted as allocations take it: 3000 bytes take 12 granules of 256.
    let p = c.alloc(3000);
    let quota = Status::QuotaExceeded;
    c.refused(&Request::MemAlloc { size: 2000 }, 0, quota, "limit of 4096");
    // The message states the request, not a sum that wrapped around.
    let e = c.refused(
        &Request::MemAlloc { size: u64::MAX },
        0,
        quota,
        "on top of the 3072",
    );
    assert!(e.message.contains(&u64::MAX.to_string()), "{e}");
    let [free, total, ..] = c.ok(&Request::MemGetInfo, 0);
    assert_eq!((free, total), (4096 - 3000, 4096));
    c.ok(&Request::MemFree { ptr: p }, 0);
    c.alloc(4096);
}

#[test]
fn the_priority_is_only_lowered() {
    let server = sim();
    let mut c = server.client(Limits::default());
    let below = protocol::PRIORITY_BELOW_NORMAL;
    assert_eq!(
        c.ok(&Request::SetPriority { level: below }, 0)[0],
        below as u64
    );
    let normal = Request::SetPriority {
        level: protocol::PRIORITY_NORMAL,
    };
    assert_eq!(c.ok(&normal, 0)[0], below as u64);
    assert_eq!(c.core.priority().load(Ordering::Relaxed), below);
}

#[test]
fn a_stream_the_backend_cannot_create_is_a_refusal_and_the_session_carries_on() {
    // The default stream and one more.
    let server = Server::new(Recorder::new(2));
    let mut c = server.client(Limits::default());
    let [s, slot, ..] = c.ok(&Request::StreamCreate { priority: 0 }, 0);
    let create = Request::StreamCreate { priority: 0 };
    c.refused(
        &create,
        0,
        Status::OutOfMemory,
        "cannot start a stream thread",
    );
    c.ok(&Request::Mark, s);
    c.ok(&Request::StreamDestroy { stream: s }, 0);
    server.backend.streams_left.store(1, Ordering::Relaxed);
    // The refused stream gave its progress slot back.
    let [_, again, ..] = c.ok(&create, 0);
    assert_eq!(again, slot);
}

#[test]
fn a_session_that_cannot_get_its_default_stream_is_not_started() {
    let server = Server::new(Recorder::new(0));
    let e = server.try_client(Limits::default()).err().expect("refused");
    assert_eq!(e.status, Status::OutOfMemory, "{e}");
    assert_eq!(server.backend.registered.load(Ordering::Relaxed), 0);
}
