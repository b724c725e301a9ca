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
