//! What a hostile local user may try against the server before and around the handshake:
//! descriptors smuggled with the hello, slow and half-open connections, huge host buffers, and
//! a pipe or log directory prepared by someone else. Each test fails on a server without the
//! defence it names.

mod common;

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::TestServer;
use mps_core::protocol::{self, Hello, MAGIC, PROTOCOL_VERSION};
use mps_ipc::socket;

fn hello() -> Hello {
    Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        reserved: [0; 2],
        group: protocol::put_str("default"),
    }
}

/// The server's pid, from the credentials of a connection to it (the connection is then
/// refused and closed).
fn server_pid(server: &TestServer) -> i32 {
    let s = UnixStream::connect(server.socket()).unwrap();
    let pid = socket::peer(&s).unwrap().pid;
    let bad = [0u8; size_of::<Hello>()];
    socket::send(&s, &bad, &[]).unwrap();
    wait_closed(&s);
    pid
}

/// Descriptors the process `pid` holds open.
fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Reads until the server closes `s` (whatever it sends first); panics after 20 s.
fn wait_closed(s: &UnixStream) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match (&*s).read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

#[test]
fn descriptors_sent_with_a_hello_are_closed() {
    let server = TestServer::start();
    let pid = server_pid(&server);
    let baseline = open_fds(pid);
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    for n in [1usize, 3, 8, 64] {
        for _ in 0..5 {
            let s = UnixStream::connect(server.socket()).unwrap();
            let fds = vec![w.as_fd(); n];
            socket::send(&s, bytemuck::bytes_of(&hello()), &fds).unwrap();
            wait_closed(&s);
        }
    }
    assert_eq!(
        open_fds(pid),
        baseline,
        "the server kept descriptors that came with refused hellos; log:\n{}",
        server.log()
    );
    // And it still serves a client that behaves.
    let c = server.client();
    c.mem_alloc(4096).unwrap();
}

/// The process's virtual memory size in bytes (VmSize).
fn address_space(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap();
    kib * 1024
}

#[test]
fn a_host_buffer_costs_its_size_not_a_terabyte_of_address_space() {
    let server = TestServer::start();
    let pid = server_pid(&server);
    let c = server.client();
    let before = address_space(pid);
    for _ in 0..4 {
        let e = c.host_alloc(1 << 40).unwrap_err();
        assert_eq!(e.status, mps_core::Status::OutOfMemory, "{}", e.message);
        assert!(
            e.message.contains("bytes of memory are available"),
            "{}",
            e.message
        );
    }
    let grown = address_space(pid).saturating_sub(before);
    assert!(
        grown < 1 << 40,
        "the server's address space grew by {grown} bytes for refused host buffers"
    );
    // A buffer the machine can give is still served, and its memory is real.
    let p = c.host_alloc(1 << 20).unwrap();
    // SAFETY: the buffer is 1 MiB long and mapped writable in this process.
    unsafe { p.add((1 << 20) - 1).write(7) };
}
