//! The Unix socket in the pipe directory: where it is, and messages with file descriptors.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::socket::{ControlMessage, MsgFlags, getsockopt, sendmsg, sockopt};

/// The file name of the server socket inside the pipe directory.
pub const SOCKET_NAME: &str = "mps.sock";

/// The pipe directory: `$MPS_PIPE_DIRECTORY`; else, for a user other than root with
/// `$XDG_RUNTIME_DIR` set, `$XDG_RUNTIME_DIR/mps` (a directory nobody else can create first);
/// else `/tmp/mps`.
pub fn default_pipe_dir() -> PathBuf {
    crate::trust::default_dir("MPS_PIPE_DIRECTORY", "mps")
}

/// Credentials of the process at the other end, from SO_PEERCRED.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Who is at the other end of `sock`.
pub fn peer(sock: &UnixStream) -> io::Result<Peer> {
    let c = getsockopt(sock, sockopt::PeerCredentials).map_err(io::Error::from)?;
    Ok(Peer {
        pid: c.pid(),
        uid: c.uid(),
        gid: c.gid(),
    })
}

/// Checks, before anything is sent, that the server at the other end of `sock` (connected to
/// `path`) runs as this user or as root, and returns its credentials. Anyone who could put a
/// socket at that path (a pipe directory created by another user, say) would otherwise receive
/// the client's modules and buffers and could forge its results.
pub fn check_server(sock: &UnixStream, path: &Path) -> mps_core::Result<Peer> {
    let found = peer(sock).map_err(|e| {
        mps_core::Error::new(
            mps_core::Status::Connection,
            format!(
                "cannot learn who serves the socket at {} (SO_PEERCRED): {e}",
                path.display()
            ),
        )
    })?;
    let me = nix::unistd::geteuid().as_raw();
    if found.uid != me && found.uid != 0 {
        return Err(mps_core::Error::new(
            mps_core::Status::PermissionDenied,
            format!(
                "the socket at {} is served by uid {}, not by you (uid {me}) or root; refusing \
                 to send anything. Check who owns the pipe directory {}",
                path.display(),
                found.uid,
                path.parent().unwrap_or(path).display()
            ),
        ));
    }
    Ok(found)
}

/// Sends `bytes` with `fds` attached (SCM_RIGHTS).
pub fn send(sock: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs = if raw.is_empty() {
        vec![]
    } else {
        vec![ControlMessage::ScmRights(&raw)]
    };
    let mut sent = sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(bytes)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(io::Error::from)?;
    // The descriptors went with the first byte; the rest (rare for messages this small) follows
    // without them.
    while sent < bytes.len() {
        sent += sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&bytes[sent..])],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(io::Error::from)?;
    }
    Ok(())
}

/// The most descriptors Linux passes in one message (SCM_MAX_FD). A control buffer with room for
/// this many is never truncated by SCM_RIGHTS alone.
const SCM_MAX_FD: usize = 253;

/// Receives exactly `buf.len()` bytes and any descriptors that came with them (at most
/// `max_fds`). Every descriptor the kernel installed is owned from the moment it arrives, so on
/// every error (too many descriptors, truncated control data, a failed read, the peer gone) all
/// of them are closed, never left open in this process.
pub fn recv(sock: &UnixStream, buf: &mut [u8], max_fds: usize) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        let (n, truncated) = recv_some(sock, &mut buf[got..], &mut fds, 0)?;
        if truncated {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer sent more control data than a message may carry (MSG_CTRUNC); \
                 the descriptors that arrived were closed",
            ));
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        got += n;
    }
    if fds.len() > max_fds {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the peer sent {} file descriptors where at most {max_fds} belong; they were \
                 closed",
                fds.len()
            ),
        ));
    }
    Ok(fds)
}

/// Reads what has already arrived into `buf` without waiting, where no descriptor belongs (any
/// that came are closed and reported as an error). `Ok(0)`: the peer closed the connection; an
/// error of kind `WouldBlock`: nothing has arrived. For loops that watch many sockets at once
/// and must never block on one.
pub fn recv_available(sock: &UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut fds = Vec::new();
    let (n, truncated) = recv_some(sock, buf, &mut fds, nix::libc::MSG_DONTWAIT)?;
    if truncated || !fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the peer sent {} file descriptors where none belong; they were closed",
                fds.len()
            ),
        ));
    }
    Ok(n)
}

/// One `recvmsg` into `buf`: returns the bytes read and whether the control data was truncated,
/// and appends every descriptor received to `fds` (which then owns it).
fn recv_some(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    flags: nix::libc::c_int,
) -> io::Result<(usize, bool)> {
    use nix::libc;
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; cmsg_space(SCM_MAX_FD).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all zeroes is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    let n = loop {
        // SAFETY: msg points at `iov` (which covers `buf`, live and writable for the call) and
        // at `control`, both of the lengths given; the kernel writes within them only.
        let n =
            unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | flags) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            // A failed recvmsg installs no descriptors.
            return Err(e);
        }
    };
    // Take every descriptor before looking at anything else, so that none can leak.
    // SAFETY: msg's control fields describe `control`, which the kernel filled.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !c.is_null() {
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR return null or a header wholly inside the buffer.
        let hdr = unsafe { &*c };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN only does arithmetic.
            let header = unsafe { libc::CMSG_LEN(0) } as usize;
            let count = (hdr.cmsg_len as usize).saturating_sub(header) / size_of::<RawFd>();
            // SAFETY: the header lies inside the buffer; its data follows it.
            let data = unsafe { libc::CMSG_DATA(c) };
            for i in 0..count {
                // SAFETY: the kernel wrote `count` descriptors after the header (cmsg_len says
                // so, and it never exceeds the buffer); the data may be unaligned for an int.
                let fd = unsafe {
                    data.add(i * size_of::<RawFd>())
                        .cast::<RawFd>()
                        .read_unaligned()
                };
                // SAFETY: the kernel just installed this descriptor for us; nobody else owns
                // it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
        // SAFETY: `c` is a header of msg's control buffer.
        c = unsafe { libc::CMSG_NXTHDR(&msg, c) };
    }
    Ok((n, msg.msg_flags & libc::MSG_CTRUNC != 0))
}

const fn cmsg_space(fds: usize) -> usize {
    // CMSG_SPACE for `fds` descriptors, as the C macro computes it (header and data each rounded
    // up to the alignment of size_t).
    const fn round(n: usize) -> usize {
        n.div_ceil(size_of::<usize>()) * size_of::<usize>()
    }
    round(size_of::<nix::libc::cmsghdr>()) + round(fds * size_of::<RawFd>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;

    #[test]
    fn descriptors_travel_with_messages() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut file = tempfile_in_memory();
        file.write_all(b"payload").unwrap();
        send(&a, b"hello", &[std::os::fd::AsFd::as_fd(&file)]).unwrap();
        let mut buf = [0u8; 5];
        let fds = recv(&b, &mut buf, 2).unwrap();
        assert_eq!(&buf, b"hello");
        assert_eq!(fds.len(), 1);
        let mut got = std::fs::File::from(fds.into_iter().next().unwrap());
        got.rewind().unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "payload");
        let me = peer(&b).unwrap();
        assert_eq!(me.pid as u32, std::process::id());
        drop(a);
        assert_eq!(
            recv(&b, &mut buf, 0).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    /// A pipe whose read end reports end-of-file once every copy of the write end is closed:
    /// the way to see that received descriptors were closed, whatever other threads do.
    fn pipe() -> (std::fs::File, OwnedFd) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        (std::fs::File::from(r), w)
    }

    /// Whether every copy of the pipe's write end is closed: end of file within a deadline. A
    /// test of this process that forks holds copies of every descriptor until its child
    /// exits, so a copy may outlive the one under test for a moment; a leaked one never goes.
    fn all_copies_closed(mut read_end: std::fs::File) -> bool {
        nix::fcntl::fcntl(
            &read_end,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut b = [0u8; 1];
        loop {
            // 0 bytes: end of file, every write end is gone; WouldBlock: one is still open.
            match read_end.read(&mut b) {
                Ok(0) => return true,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                _ => return false,
            }
        }
    }

    #[test]
    fn surplus_descriptors_are_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = pipe();
        send(&a, b"hello", &[w.as_fd(), w.as_fd(), w.as_fd()]).unwrap();
        drop(w);
        let mut buf = [0u8; 5];
        let e = recv(&b, &mut buf, 0).unwrap_err();
        assert!(e.to_string().contains("3 file descriptors"), "{e}");
        assert!(all_copies_closed(r), "a received descriptor was left open");
    }

    #[test]
    fn descriptors_of_a_truncated_message_are_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        // Credentials take room in the control buffer ahead of the descriptors, so the most
        // descriptors a message may carry no longer fit: the kernel truncates (MSG_CTRUNC).
        nix::sys::socket::setsockopt(&b, sockopt::PassCred, &true).unwrap();
        let (r, w) = pipe();
        let many = vec![w.as_fd(); SCM_MAX_FD];
        send(&a, b"hello", &many).unwrap();
        drop(many);
        drop(w);
        let mut buf = [0u8; 5];
        let e = recv(&b, &mut buf, 2).unwrap_err();
        assert!(e.to_string().contains("MSG_CTRUNC"), "{e}");
        assert!(all_copies_closed(r), "a received descriptor was left open");
    }

    #[test]
    fn descriptors_are_closed_when_the_peer_leaves_mid_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, w) = pipe();
        send(&a, b"hel", &[w.as_fd()]).unwrap();
        drop(w);
        drop(a);
        let mut buf = [0u8; 5];
        let e = recv(&b, &mut buf, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(all_copies_closed(r), "a received descriptor was left open");
    }

    #[test]
    fn a_server_of_this_user_is_trusted() {
        let (a, _b) = UnixStream::pair().unwrap();
        let p = check_server(&a, Path::new("/x/mps.sock")).unwrap();
        assert_eq!(p.uid, nix::unistd::geteuid().as_raw());
    }

    #[test]
    fn a_server_of_another_user_is_refused() {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, bind, socket};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root, to listen as another user (nobody)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("mps-peer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join(SOCKET_NAME);
        let listener = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(listener.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        // The listening socket's credentials are those of the process that calls listen(): a
        // child that became `nobody` does so on the socket bound here.
        // SAFETY: the child calls only async-signal-safe functions (setgid, setuid, listen,
        // _exit) before it exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                // SAFETY: plain system calls on values we own; _exit never returns.
                unsafe {
                    let ok = nix::libc::setgid(65534) == 0
                        && nix::libc::setuid(65534) == 0
                        && nix::libc::listen(listener.as_raw_fd(), 4) == 0;
                    nix::libc::_exit(if ok { 0 } else { 1 });
                }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
        let sock = UnixStream::connect(&path).unwrap();
        let e = check_server(&sock, &path).unwrap_err();
        assert_eq!(e.status, mps_core::Status::PermissionDenied);
        let expected = format!("the socket at {} is served by uid 65534", path.display());
        assert!(e.message.contains(&expected), "{}", e.message);
        drop(listener);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_in_memory() -> std::fs::File {
        std::fs::File::from(
            nix::sys::memfd::memfd_create("t", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap(),
        )
    }
}
