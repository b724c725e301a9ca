//! Shared-memory segments: anonymous memory files (memfd) mapped into both processes.
//!
//! A segment's memory is allocated when it is created (`fallocate`), after a check that the
//! system and this process's memory cgroup can give that much. A memfd is otherwise sparse: a
//! client asking for a terabyte would cost the server a terabyte of address space and no memory
//! at all, until the address space ran out and the server could no longer start a thread; and a
//! page first touched under memory pressure would be a SIGBUS in whichever process touched it.
//! Now a segment costs what its size says, the moment it exists, or is refused.
//!
//! The server creates every segment and seals it against shrinking and growing before a client
//! gets its descriptor, so a client cannot truncate a file under the server's mapping (which would
//! turn the server's next access into SIGBUS). Segments that only the server writes are also
//! sealed against future writable mappings, so a client can map them read-only and nothing else.

use std::ffi::c_void;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use memmap2::{Mmap, MmapMut, MmapOptions};
use mps_core::{Error, Result, Status};
use nix::fcntl::{FallocateFlags, fallocate};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

enum Map {
    Rw(MmapMut),
    Ro(Mmap),
    /// Read-write at an address the peer chose ([`Segment::open_at`]); unmapped on drop.
    At(NonNull<c_void>),
}

// SAFETY: the mapping is shared memory owned by the segment, like memmap2's maps (which are
// Send and Sync): nothing about it is tied to the thread that made it.
unsafe impl Send for Map {}
// SAFETY: as above; the segment hands out only its address, never a reference into it.
unsafe impl Sync for Map {}

/// A mapped memfd.
pub struct Segment {
    file: File,
    map: Map,
    len: usize,
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Map::At(p) = self.map {
            // SAFETY: the mapping open_at made, `len` bytes; the segment owned it and is going.
            let _ = unsafe { munmap(p, self.len) };
        }
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("len", &self.len)
            .field("writable", &self.is_writable())
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
        let refused = |why: String| {
            Error::new(
                Status::OutOfMemory,
                format!("cannot create a {len}-byte shared segment: {why}"),
            )
        };
        if let Some(available) = memory_available() {
            if len as u64 > available {
                return Err(refused(format!(
                    "only {available} bytes of memory are available to this process"
                )));
            }
        }
        file.set_len(len as u64)
            .map_err(|e| refused(format!("sizing the memfd: {e}")))?;
        if len > 0 {
            let bytes = i64::try_from(len).map_err(|_| refused("too large for a file".into()))?;
            fallocate(&file, FallocateFlags::empty(), 0, bytes)
                .map_err(|e| refused(format!("allocating its memory: {e}")))?;
        }
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

    /// Maps a segment received from the server read-write at address `at`, where the server
    /// maps it too, so that one address names the bytes in both processes (as CUDA's unified
    /// addressing names page-locked memory by one address on host and device). Where this
    /// process already maps something there, the segment is mapped at an address of the
    /// kernel's choosing instead: [`Segment::as_ptr`] says which. Checks as [`Segment::open`].
    pub fn open_at(fd: OwnedFd, len: usize, at: usize) -> Result<Segment> {
        let file = checked(fd, len)?;
        let (Some(addr), Some(length)) = (NonZeroUsize::new(at), NonZeroUsize::new(len)) else {
            return Segment::map(file, len, true);
        };
        // MAP_FIXED_NOREPLACE never replaces a mapping (EEXIST instead); a kernel older than
        // 4.17 takes it as a hint, hence the check of the address it gave.
        // SAFETY: a new shared mapping of a sealed file of at least `len` bytes (checked), at an
        // address nothing in this process maps; it stays backed for its whole life.
        let mapped = unsafe {
            mmap(
                Some(addr),
                length,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_FIXED_NOREPLACE,
                &file,
                0,
            )
        };
        match mapped {
            Ok(p) if p.as_ptr() as usize == at => Ok(Segment {
                file,
                map: Map::At(p),
                len,
            }),
            Ok(p) => {
                // SAFETY: the mapping just made, at the address the kernel chose; nothing uses it.
                let _ = unsafe { munmap(p, len) };
                Segment::map(file, len, true)
            }
            Err(_) => Segment::map(file, len, true),
        }
    }

    /// Maps a segment received from the server, checking that it is at least `len` bytes and
    /// that its size is sealed.
    pub fn open(fd: OwnedFd, len: usize, writable: bool) -> Result<Segment> {
        Segment::map(checked(fd, len)?, len, writable)
    }

    /// Maps `len` bytes of `file`, checked by [`checked`], where the kernel chooses.
    fn map(file: File, len: usize, writable: bool) -> Result<Segment> {
        let opts = {
            let mut o = MmapOptions::new();
            o.len(len);
            o
        };
        // SAFETY: the segment's size is sealed (checked) and at least `len` bytes, so the
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
            Map::At(p) => p.as_ptr().cast(),
        }
    }

    /// Whether this process may write the mapping.
    pub fn is_writable(&self) -> bool {
        matches!(self.map, Map::Rw(_) | Map::At(_))
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

/// The received segment `fd` as a file, once it is found at least `len` bytes with its size
/// sealed (a peer cannot then shrink it under a mapping).
fn checked(fd: OwnedFd, len: usize) -> Result<File> {
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
    Ok(file)
}

/// The bytes of memory this process may still take: the system's `MemAvailable`, lowered by the
/// limit of its memory cgroup (v2 or v1) where one is set and readable. `None` when not even
/// /proc/meminfo can be read (the allocation itself is then the only check).
fn memory_available() -> Option<u64> {
    let system = meminfo("MemAvailable:")?;
    let room = cgroup_memory().map(|(max, used)| max.saturating_sub(used));
    Some(system.min(room.unwrap_or(u64::MAX)))
}

/// The memory this process may use at most: the system's `MemTotal`, lowered by the limit of
/// its memory cgroup where one is set and readable; `None` when /proc/meminfo cannot be read.
/// Limits sized from the machine start from this.
pub fn machine_memory() -> Option<u64> {
    let system = meminfo("MemTotal:")?;
    Some(system.min(cgroup_memory().map_or(u64::MAX, |(max, _)| max)))
}

/// The line `key` of /proc/meminfo, in bytes.
fn meminfo(key: &str) -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo.lines().find_map(|l| {
        let kib = l.strip_prefix(key)?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok().map(|k| k * 1024)
    })
}

/// The limit of this process's memory cgroup and what it uses now, if it has a limit.
fn cgroup_memory() -> Option<(u64, u64)> {
    let read = |p: std::path::PathBuf| -> Option<u64> {
        std::fs::read_to_string(p).ok()?.trim().parse().ok()
    };
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        // v2 (the unified hierarchy) names no controller; v1 has its own "memory" hierarchy.
        let (base, limit, usage) = match controllers {
            "" => ("/sys/fs/cgroup", "memory.max", "memory.current"),
            "memory" => (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ),
            _ => continue,
        };
        // Inside a cgroup namespace the path is not under the mount; the mount's root is then
        // our own cgroup.
        for dir in [std::path::Path::new(base).join(path), base.into()] {
            if let (Some(max), Some(used)) = (read(dir.join(limit)), read(dir.join(usage))) {
                return Some((max, used));
            }
        }
    }
    None
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
    fn a_segment_opens_at_the_address_asked_where_it_is_free_and_elsewhere_if_not() {
        let seg = Segment::create("test", 8192).unwrap();
        // SAFETY: the mapping is 8192 bytes long and writable.
        unsafe { seg.as_ptr().write(7) };
        let free = address_no_one_else_takes(8192);
        let fd = || seg.fd().try_clone_to_owned().unwrap();
        let at = Segment::open_at(fd(), 8192, free).unwrap();
        assert_eq!(at.as_ptr() as usize, free);
        // SAFETY: both map the same 8192 bytes.
        unsafe {
            assert_eq!(at.as_ptr().read(), 7);
            at.as_ptr().add(1).write(9);
            assert_eq!(seg.as_ptr().add(1).read(), 9);
        }
        assert!(at.is_writable());
        // Taken (by `seg` itself): mapped elsewhere, never over it.
        let elsewhere = Segment::open_at(fd(), 8192, seg.as_ptr() as usize).unwrap();
        assert_ne!(elsewhere.as_ptr(), seg.as_ptr());
        // SAFETY: as above.
        assert_eq!(unsafe { elsewhere.as_ptr().read() }, 7);
        drop(at);
        // Unmapped on drop: the address can be taken again.
        let again = Segment::open_at(fd(), 8192, free).unwrap();
        assert_eq!(again.as_ptr() as usize, free);
    }

    /// An address free in this process that the kernel does not hand out unasked, so that the
    /// other tests' mappings, made on parallel threads, cannot take it while a test relies on
    /// it being free: mappings are placed top-down from below the stack, and 32 TiB is far
    /// under where that reaches.
    fn address_no_one_else_takes(len: usize) -> usize {
        let length = NonZeroUsize::new(len).unwrap();
        (0..64)
            .map(|i| (32usize << 40) + (i << 30))
            .find(|&at| {
                // SAFETY: an inaccessible anonymous mapping where nothing is mapped (NOREPLACE),
                // given back at once; nothing uses it.
                unsafe {
                    match nix::sys::mman::mmap_anonymous(
                        NonZeroUsize::new(at),
                        length,
                        ProtFlags::PROT_NONE,
                        MapFlags::MAP_PRIVATE | MapFlags::MAP_FIXED_NOREPLACE,
                    ) {
                        Ok(p) => {
                            // A kernel before 4.17 takes NOREPLACE as a hint and maps elsewhere.
                            let there = p.as_ptr() as usize == at;
                            munmap(p, len).unwrap();
                            there
                        }
                        Err(_) => false,
                    }
                }
            })
            .expect("no free address found above 32 TiB")
    }

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
    fn a_segment_larger_than_the_memory_is_refused_at_once() {
        let e = Segment::create("huge", 1 << 40).unwrap_err();
        assert_eq!(e.status, Status::OutOfMemory);
        assert!(e.message.contains("1099511627776-byte"), "{}", e.message);
    }

    #[test]
    fn a_segment_is_backed_by_memory_from_its_creation() {
        use std::os::unix::fs::MetadataExt;
        let len = 1 << 20;
        let seg = Segment::create("backed", len).unwrap();
        let blocks = seg.file.metadata().unwrap().blocks();
        assert!(
            blocks * 512 >= len as u64,
            "only {blocks} blocks of 512 bytes back a {len}-byte segment"
        );
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
