//! Two clients on one backend: the objects of one are unknown to the other.

use super::*;

#[test]
fn one_clients_handles_and_pointers_are_unknown_to_another() {
    let server = sim();
    let mut a = server.client(Limits::default());
    let mut b = server.client(Limits::default());
    let s = a.stream();
    let e = a.event();
    let m = a.load_module(PTX).unwrap();
    let f = a.function(m, "fill_u32");
    let p = a.alloc(256);
    let hb = a.host_alloc(4096);
    let q = b.alloc(256);
    let params = fill_params(p, 1, 1);
    let theirs = "does not belong to this client";
    let not_ours = "not inside any allocation of this client";
    let buffer = HostRef::Buffer {
        handle: hb,
        offset: 0,
    };
    let cases: Vec<(Request<'_>, u64, &str)> = vec![
        (Request::Mark, s, theirs),
        (launch(f, &params), 0, theirs),
        (Request::EventRecord { event: e }, 0, theirs),
        (Request::StreamWaitEvent { event: e }, 0, theirs),
        (Request::EventElapsed { start: e, end: e }, 0, theirs),
        (Request::EventDestroy { event: e }, 0, theirs),
        (Request::StreamDestroy { stream: s }, 0, theirs),
        (
            Request::GetFunction {
                module: m,
                name: b"fill_u32",
            },
            0,
            theirs,
        ),
        (Request::ModuleUnload { module: m }, 0, theirs),
        (
            Request::ParamInfo {
                function: f,
                first: 0,
            },
            0,
            theirs,
        ),
        (Request::HostFree { handle: hb }, 0, theirs),
        (
            Request::CopyHtoD {
                dst: q,
                src: buffer,
                len: 4,
            },
            0,
            theirs,
        ),
        (
            Request::CopyDtoH {
                dst: buffer,
                src: q,
                len: 4,
            },
            0,
            theirs,
        ),
        (
            Request::MemFree { ptr: p },
            0,
            "not an allocation of this client",
        ),
        (
            Request::CopyHtoD {
                dst: p,
                src: HostRef::Staging { offset: 0 },
                len: 4,
            },
            0,
            not_ours,
        ),
        (
            Request::CopyDtoD {
                copy: DeviceCopy {
                    dst: q,
                    src: p,
                    len: 4,
                },
            },
            0,
            not_ours,
        ),
        (
            Request::Memset {
                fill: Fill {
                    dst: p,
                    value: 0,
                    elem_size: 1,
                    count: 4,
                },
            },
            0,
            not_ours,
        ),
    ];
    for (req, stream, says) in &cases {
        b.refused(req, *stream, Status::InvalidHandle, says);
    }
    // Everything of a's is still a's and still works.
    a.ok(&launch(f, &params), s);
    a.ok(&Request::EventRecord { event: e }, s);
    a.ok(&Request::HostFree { handle: hb }, 0);
    a.ok(&Request::MemFree { ptr: p }, 0);
    a.ok(&Request::StreamDestroy { stream: s }, 0);
}
