//! Client graphs end to end, against a real server process (the simulator, or a GPU with
//! `MPS_TEST_BACKEND=cuda`): a request captured once and replayed many times with new input,
//! graphs of several clients at once, what a capture refuses, and the C and C++ programs, built
//! with `-Wall -Wextra -Werror` against include/ and the library of this build.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use mpsclient::{Client, Dim3, Status, Stream};

/// Elements per request.
const N: usize = 1024;
/// Dependent kernels per request.
const CHAIN: usize = 12;

/// A request as a small-inference client makes it: `N` floats copied in from a host buffer,
/// `CHAIN` dependent `add_f32` kernels (x += 1), copied out to a host buffer.
struct Request {
    exec: mpsclient::GraphExec,
    input: *mut f32,
    output: *mut f32,
}

/// Captures a request on `stream`, waiting `pause` after each captured command.
fn capture_request(c: &Client, stream: Stream, pause: Duration) -> Request {
    let bytes = (N * 4) as u64;
    let m = c.module_load(&ptx()).unwrap();
    let add = c.module_get_function(m, "add_f32").unwrap();
    let (x, one) = (c.mem_alloc(bytes).unwrap(), c.mem_alloc(bytes).unwrap());
    c.memset_d32(one, 1.0f32.to_bits(), N as u64, stream)
        .unwrap();
    let input = c.host_alloc(N * 4).unwrap() as *mut f32;
    let output = c.host_alloc(N * 4).unwrap() as *mut f32;
    c.stream_synchronize(stream).unwrap();

    c.stream_begin_capture(stream).unwrap();
    assert!(c.stream_is_capturing(stream));
    // SAFETY: both host buffers are N floats long.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(input as *const u8, N * 4),
            std::slice::from_raw_parts_mut(output as *mut u8, N * 4),
        )
    };
    c.memcpy_htod(x, src, stream).unwrap();
    std::thread::sleep(pause);
    let (xb, ob, nb) = (
        x.0.to_le_bytes(),
        one.0.to_le_bytes(),
        (N as u64).to_le_bytes(),
    );
    let grid = Dim3 {
        x: (N / 128) as u32,
        y: 1,
        z: 1,
    };
    let block = Dim3 { x: 128, y: 1, z: 1 };
    for _ in 0..CHAIN {
        c.launch(add, grid, block, 0, stream, &[&xb, &ob, &xb, &nb])
            .unwrap();
        std::thread::sleep(pause);
    }
    c.memcpy_dtoh(dst, x, stream).unwrap();
    let graph = c.stream_end_capture(stream).unwrap();
    assert!(!c.stream_is_capturing(stream));
    let exec = c.graph_instantiate(graph).unwrap();
    c.graph_destroy(graph).unwrap();
    Request {
        exec,
        input,
        output,
    }
}

/// Runs `launches` requests through the graph, each with new input, and checks every result.
fn replay(c: &Client, r: &Request, stream: Stream, launches: usize, seed: usize) {
    // SAFETY: both host buffers are N floats long, used by this thread only between launches.
    let (input, output) = unsafe {
        (
            std::slice::from_raw_parts_mut(r.input, N),
            std::slice::from_raw_parts_mut(r.output, N),
        )
    };
    for k in 0..launches {
        let base = ((seed * launches + k) % 4096) as f32;
        for (i, v) in input.iter_mut().enumerate() {
            *v = base + i as f32;
        }
        output.fill(-1.0);
        c.graph_launch(r.exec, stream).unwrap();
        c.stream_synchronize(stream).unwrap();
        for (i, v) in output.iter().enumerate() {
            assert_eq!(
                *v,
                base + i as f32 + CHAIN as f32,
                "launch {k}, element {i}"
            );
        }
    }
}

#[test]
fn a_captured_request_replays_correctly_many_times() {
    let server = TestServer::start();
    let c = server.client();
    let s = c.stream_create(0).unwrap();
    let r = capture_request(&c, s, Duration::ZERO);
    replay(&c, &r, s, 300, 0);
    // Into another stream, and the default one.
    let t = c.stream_create(0).unwrap();
    replay(&c, &r, t, 20, 1);
    replay(&c, &r, Stream::DEFAULT, 20, 2);
    c.graph_exec_destroy(r.exec).unwrap();
    // The launch is refused by the server: reported by the next call.
    let e = c
        .graph_launch(r.exec, s)
        .and_then(|()| c.synchronize())
        .unwrap_err();
    assert_eq!(e.status, Status::InvalidHandle, "{e}");
}

/// A capture that stays open across many of the server's busy-time samples (on a GPU, every
/// 5 ms it asks the streams with work pending whether they are idle; asking a capturing stream
/// would invalidate its capture) ends with its graph, which replays correctly.
#[test]
fn a_capture_open_across_the_servers_busy_samples_is_kept() {
    let server = TestServer::start();
    let c = server.client();
    let s = c.stream_create(0).unwrap();
    let r = capture_request(&c, s, Duration::from_millis(15));
    replay(&c, &r, s, 5, 3);
}

#[test]
fn clients_replay_their_graphs_at_the_same_time() {
    let server = TestServer::start();
    std::thread::scope(|scope| {
        for seed in 0..4 {
            let server = &server;
            scope.spawn(move || {
                let c = server.client();
                let s = c.stream_create(0).unwrap();
                let r = capture_request(&c, s, Duration::ZERO);
                replay(&c, &r, s, 100, seed);
            });
        }
    });
}

#[test]
fn what_a_capture_cannot_hold_is_refused_and_the_stream_recovers() {
    let server = TestServer::start();
    let c = server.client();
    let s = c.stream_create(0).unwrap();
    let e = c.event_create().unwrap();
    let p = c.mem_alloc(1024).unwrap();
    c.stream_begin_capture(s).unwrap();
    let says = |e: mpsclient::Error, status: Status, words: &str| {
        assert_eq!(e.status, status, "{e}");
        assert!(e.message.contains(words), "{e:?} lacks {words:?}");
    };
    // Refused here: waiting for work that is recorded, not run.
    says(
        c.stream_synchronize(s).unwrap_err(),
        Status::InvalidValue,
        "captures a graph",
    );
    says(
        c.synchronize().unwrap_err(),
        Status::InvalidValue,
        "captures a graph",
    );
    says(
        c.event_record(e, s).unwrap_err(),
        Status::InvalidValue,
        "captures a graph",
    );
    says(
        c.memcpy_htod(p, &[0u8; 64], s).unwrap_err(),
        Status::InvalidValue,
        "pageable memory",
    );
    // Refused by the server: freeing memory while a stream captures.
    says(
        c.mem_free(p).unwrap_err(),
        Status::InvalidValue,
        "captures a graph",
    );
    c.memset_d8(p, 1, 1024, s).unwrap();
    let graph = c.stream_end_capture(s).unwrap();
    // The stream runs work again.
    c.memset_d8(p, 2, 1024, s).unwrap();
    let mut back = [0u8; 1024];
    c.memcpy_dtoh(&mut back, p, s).unwrap();
    assert!(back.iter().all(|&b| b == 2));
    // A graph of one client is unknown to another.
    let other = server.client();
    says(
        other.graph_instantiate(graph).unwrap_err(),
        Status::InvalidHandle,
        "does not belong to this client",
    );
    c.graph_destroy(graph).unwrap();
    c.mem_free(p).unwrap();
}

/// Compiles `source` with `-Wall -Wextra -Werror`, runs it against a fresh server and returns
/// its output.
fn build_and_run(compiler: &str, std: &str, source: &str, name: &str) -> String {
    let exe = temp_dir(name).join(name);
    build_with(compiler, std, &root().join(source), &exe);
    let server = TestServer::start();
    let out = Command::new(&exe)
        .arg(root().join("kernels/test_kernels.ptx"))
        .env("MPS_PIPE_DIRECTORY", &server.dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    stdout
}

#[test]
fn the_c_graph_test_passes() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = build_and_run(
        &cc,
        "-std=c11",
        "mps-server/tests/c/graph_test.c",
        "graph_test",
    );
    assert!(out.contains("all checks passed"), "{out}");
}

#[test]
fn the_cpp_graph_test_passes() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = build_and_run(
        &cxx,
        "-std=c++17",
        "mps-server/tests/cpp/graph_test.cpp",
        "graph_test_cpp",
    );
    assert!(out.contains("all checks passed"), "{out}");
}
