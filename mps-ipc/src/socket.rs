//! The Unix socket in the pipe directory: where it is, and messages with file descriptors.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::sys::socket::{
    ControlMessage, ControlMessageOwned, MsgFlags, getsockopt, recvmsg, sendmsg, sockopt,
};

/// The file name of the server socket inside the pipe directory.
pub const SOCKET_NAME: &str = "mps.sock";

/// The pipe directory: `$MPS_PIPE_DIRECTORY`, else `/tmp/mps`.
pub fn default_pipe_dir() -> PathBuf {
    std::env::var_os("MPS_PIPE_DIRECTORY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/mps"))
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

/// Receives exactly `buf.len()` bytes and any descriptors that came with them (at most
/// `max_fds`; more are closed and reported as an error).
pub fn recv(sock: &UnixStream, buf: &mut [u8], max_fds: usize) -> io::Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    let mut got = 0;
    let mut too_many = false;
    let mut cmsg_space = vec![0u8; cmsg_space(max_fds.max(1))];
    while got < buf.len() {
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let msg = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        if msg.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(received) = c {
                for fd in received {
                    // SAFETY: the kernel just installed this descriptor for us; nobody else owns
                    // it.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    if fds.len() < max_fds {
                        fds.push(owned);
                    } else {
                        too_many = true;
                    }
                }
            }
        }
        got += msg.bytes;
    }
    if too_many {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer sent more file descriptors than expected",
        ));
    }
    Ok(fds)
}

fn cmsg_space(fds: usize) -> usize {
    // CMSG_SPACE for `fds` descriptors; libc's macro is a const fn on Linux.
    // SAFETY: CMSG_SPACE only does arithmetic on its argument.
    unsafe { nix::libc::CMSG_SPACE((fds * size_of::<RawFd>()) as u32) as usize }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};

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

    fn tempfile_in_memory() -> std::fs::File {
        std::fs::File::from(
            nix::sys::memfd::memfd_create("t", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap(),
        )
    }
}
