//! Shared-memory segments: anonymous memory files (memfd) mapped into both processes.
//!
//! The server creates every segment and seals it against shrinking and growing before a client
//! gets its descriptor, so a client cannot truncate a file under the server's mapping (which would
//! turn the server's next access into SIGBUS). Segments that only the server writes are also
//! sealed against future writable mappings, so a client can map them read-only and nothing else.

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use memmap2::{Mmap, MmapMut, MmapOptions};
use mps_core::{Error, Result, Status};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};

enum Map {
    Rw(MmapMut),
    Ro(Mmap),
}

/// A mapped memfd.
pub struct Segment {
    file: File,
    map: Map,
    len: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("len", &self.len)
            .field("writable", &matches!(self.map, Map::Rw(_)))
            .finish()
    }
}

fn os_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(Status::Internal, format!("{what}: {e}"))
}

impl Segment {
    /// Creates a zero-filled segment of `len` bytes, mapped read-write.
    pub fn create(name: &str, len: usize) -> Result<Segment> {
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(|e| os_error("memfd_create failed", e))?;
        let file = File::from(fd);
        file.set_len(len as u64).map_err(|e| {
            Error::new(
                Status::OutOfMemory,
                format!("cannot size a {len}-byte shared segment: {e}"),
            )
        })?;
        // SAFETY: the file is a memfd we just created and sized; its size is sealed below before
        // anyone else can reach it, so the mapping stays backed for its whole life.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&file) }
            .map_err(|e| os_error("mmap of a new shared segment failed", e))?;
        let seg = Segment {
            file,
            map: Map::Rw(map),
            len,
        };
        seg.seal(false)?;
        Ok(seg)
    }

    /// Seals the size (and, with `read_only_for_others`, any future writable mapping).
    pub fn seal(&self, read_only_for_others: bool) -> Result<()> {
        let mut seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW;
        if read_only_for_others {
            seals |= SealFlag::F_SEAL_FUTURE_WRITE | SealFlag::F_SEAL_SEAL;
        }
        fcntl(&self.file, FcntlArg::F_ADD_SEALS(seals))
            .map_err(|e| os_error("sealing a shared segment failed", e))?;
        Ok(())
    }

    /// Maps a segment received from the server, checking that it is at least `len` bytes and
    /// that its size is sealed.
    pub fn open(fd: OwnedFd, len: usize, writable: bool) -> Result<Segment> {
        let file = File::from(fd);
        let size = file
            .metadata()
            .map_err(|e| os_error("fstat of a received segment failed", e))?
            .len();
        if size < len as u64 {
            return Err(Error::new(
                Status::ProtocolMismatch,
                format!("received segment has {size} bytes, the handshake promised {len}"),
            ));
        }
        let seals = fcntl(&file, FcntlArg::F_GET_SEALS)
            .map_err(|e| os_error("reading a received segment's seals failed", e))?;
        let needed = (SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW).bits();
        if seals & needed != needed {
            return Err(Error::new(
                Status::ProtocolMismatch,
                "received segment's size is not sealed",
            ));
        }
        let opts = {
            let mut o = MmapOptions::new();
            o.len(len);
            o
        };
        // SAFETY: the segment's size is sealed (checked above) and at least `len` bytes, so the
        // mapping stays backed for its whole life.
        let map = unsafe {
            if writable {
                opts.map_mut(&file).map(Map::Rw)
            } else {
                opts.map(&file).map(Map::Ro)
            }
        }
        .map_err(|e| os_error("mmap of a received segment failed", e))?;
        Ok(Segment { file, map, len })
    }

    /// The base address of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.map {
            Map::Rw(m) => m.as_ptr() as *mut u8,
            Map::Ro(m) => m.as_ptr() as *mut u8,
        }
    }

    /// Whether this process may write the mapping.
    pub fn is_writable(&self) -> bool {
        matches!(self.map, Map::Rw(_))
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the segment is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd, to pass to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

// SAFETY: a Segment only hands out its base address; all accesses through it are raw-pointer or
// atomic accesses whose soundness the callers argue. The mapping itself may be used from any
// thread.
unsafe impl Sync for Segment {}
// SAFETY: as above; the mapping is not tied to the creating thread.
unsafe impl Send for Segment {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_segment_is_shared_through_its_fd() {
        let seg = Segment::create("test", 8192).unwrap();
        // SAFETY: the mapping is 8192 bytes long and writable.
        unsafe { seg.as_ptr().add(100).write(42) };
        let fd = seg.fd().try_clone_to_owned().unwrap();
        let other = Segment::open(fd, 8192, false).unwrap();
        // SAFETY: the mapping is 8192 bytes long.
        assert_eq!(unsafe { other.as_ptr().add(100).read() }, 42);
        assert!(!other.is_writable());
        // The size is sealed: a receiver cannot shrink it.
        let fd = seg.fd().try_clone_to_owned().unwrap();
        assert!(File::from(fd).set_len(10).is_err());
    }

    #[test]
    fn a_server_only_segment_refuses_writable_maps() {
        let seg = Segment::create("ro", 4096).unwrap();
        seg.seal(true).unwrap();
        let fd = seg.fd().try_clone_to_owned().unwrap();
        assert!(Segment::open(fd, 4096, true).is_err());
        let fd = seg.fd().try_clone_to_owned().unwrap();
        assert!(Segment::open(fd, 4096, false).is_ok());
        let fd = seg.fd().try_clone_to_owned().unwrap();
        assert!(
            Segment::open(fd, 8192, false).is_err(),
            "larger than the file"
        );
    }
}
