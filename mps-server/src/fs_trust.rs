//! Directories and files a process run as root (or as a user, in a shared `/tmp`) can trust, as
//! OpenSSH and systemd trust theirs: a directory is used only if this user or root owns it and
//! nobody else can write it, and everything in it is reached through its descriptor, never by a
//! path that another user could turn into a symbolic link.
//!
//! A [`TrustedDir`] is checked once, when it is opened; since no one else can change its entries
//! afterwards, names inside it stay what this process made them.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use mps_core::{Error, Result, Status};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};

/// A directory this process may trust, held open.
#[derive(Debug)]
pub struct TrustedDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn denied(message: String) -> Error {
    Error::new(Status::PermissionDenied, message)
}

fn mode_bits(st: &FileStat) -> u32 {
    st.st_mode & 0o7777
}

fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits)
}

/// Refuses a directory whose owner is neither this user, root nor `also`, or that its group or
/// others can write.
fn check_dir(path: &Path, st: &FileStat, also: Option<u32>) -> Result<()> {
    if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFDIR {
        return Err(denied(format!("{} is not a directory", path.display())));
    }
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me && st.st_uid != 0 && Some(st.st_uid) != also {
        return Err(denied(format!(
            "{} belongs to uid {}, not to this user (uid {me}) or root: its owner could replace \
             the sockets and files in it; remove it or choose another directory",
            path.display(),
            st.st_uid
        )));
    }
    if mode_bits(st) & 0o022 != 0 {
        return Err(denied(format!(
            "{} can be written by its group or by others (mode {:o}): they could replace the \
             sockets and files in it; run `chmod go-w {}` or choose another directory",
            path.display(),
            mode_bits(st),
            path.display()
        )));
    }
    Ok(())
}

/// Opens directory `name` in `parent` without following a symbolic link, creating it with
/// exactly `bits` if it is missing; `created` says whether it was.
fn open_dir(parent: impl AsFd, name: &Path, bits: u32, shown: &Path) -> Result<(OwnedFd, bool)> {
    let created = match mkdirat(&parent, name, mode(bits)) {
        Ok(()) => true,
        Err(Errno::EEXIST) => false,
        Err(e) => {
            return Err(denied(format!("cannot create {}: {e}", shown.display())));
        }
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(&parent, name, flags, Mode::empty()).map_err(|e| {
        // With O_DIRECTORY, Linux reports a symbolic link as ENOTDIR rather than ELOOP.
        let link = fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
            SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK
        });
        if link {
            denied(format!(
                "{} is a symbolic link; a pipe or log directory must be a real directory: \
                 remove the link or choose another directory",
                shown.display()
            ))
        } else {
            denied(format!("cannot open {}: {e}", shown.display()))
        }
    })?;
    if created {
        // mkdir applied the umask; the mode asked for is the mode meant.
        fchmod(&fd, mode(bits))
            .map_err(|e| denied(format!("cannot set the mode of {}: {e}", shown.display())))?;
    }
    Ok((fd, created))
}

impl TrustedDir {
    /// Opens the directory at `path`, creating it (and its parents) if it is missing, with
    /// exactly `bits` as its mode. A symbolic link at `path`, a directory another user owns, or
    /// one its group or others can write is refused with the reason.
    pub fn open(path: &Path, bits: u32) -> Result<TrustedDir> {
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .ok_or_else(|| denied(format!("{} does not name a directory", path.display())))?;
        std::fs::create_dir_all(parent)
            .map_err(|e| denied(format!("cannot create {}: {e}", parent.display())))?;
        let parent_fd = File::open(parent)
            .map_err(|e| denied(format!("cannot open {}: {e}", parent.display())))?;
        let (fd, _) = open_dir(&parent_fd, Path::new(name), bits, path)?;
        let st = fstat(&fd).map_err(|e| denied(format!("fstat {}: {e}", path.display())))?;
        check_dir(path, &st, None)?;
        Ok(TrustedDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Subdirectory `name`, created with exactly `bits` if it is missing; checked as
    /// [`TrustedDir::open`] checks, except that `owner` may own it too, and when `owner` is given
    /// (by root, for a user's server) it is made theirs with mode `bits`.
    pub fn subdir(&self, name: &str, bits: u32, owner: Option<(u32, u32)>) -> Result<TrustedDir> {
        let path = self.path.join(name);
        let (fd, _) = open_dir(&self.fd, Path::new(name), bits, &path)?;
        let st = fstat(&fd).map_err(|e| denied(format!("fstat {}: {e}", path.display())))?;
        if let Some((uid, gid)) = owner {
            // Only this process writes its parent, so what is there is what it made: make it
            // theirs, and theirs alone, before checking.
            fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(|e| denied(format!("cannot give {} to uid {uid}: {e}", path.display())))?;
            fchmod(&fd, mode(bits))
                .map_err(|e| denied(format!("cannot set the mode of {}: {e}", path.display())))?;
            let st = fstat(&fd).map_err(|e| denied(format!("fstat {}: {e}", path.display())))?;
            check_dir(&path, &st, Some(uid))?;
        } else {
            check_dir(&path, &st, None)?;
        }
        Ok(TrustedDir { fd, path })
    }

    /// The directory's path, for messages and for programs given it by name.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the directory's mode to exactly `bits`.
    pub fn set_mode(&self, bits: u32) -> Result<()> {
        fchmod(&self.fd, mode(bits)).map_err(|e| {
            denied(format!(
                "cannot set the mode of {}: {e}",
                self.path.display()
            ))
        })
    }

    /// Creates file `name` anew, with exactly mode `bits`, for writing: whatever was there (a
    /// file, a link) is removed first, and the new file is made with `O_EXCL | O_NOFOLLOW`, so
    /// nothing outside this directory is ever written.
    pub fn create_file(&self, name: &str, bits: u32) -> Result<File> {
        let path = self.path.join(name);
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(denied(format!("cannot replace {}: {e}", path.display()))),
        }
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, mode(bits))
            .map_err(|e| denied(format!("cannot create {}: {e}", path.display())))?;
        fchmod(&fd, mode(bits))
            .map_err(|e| denied(format!("cannot set the mode of {}: {e}", path.display())))?;
        Ok(File::from(fd))
    }

    /// Opens file `name` for appending, creating it with mode `bits` if it is missing. A link
    /// (symbolic or hard), something other than a regular file, or a file another user owns is
    /// refused with the reason; an existing file gets mode `bits`. With `owner`, the file is
    /// made theirs.
    pub fn append_file(&self, name: &str, bits: u32, owner: Option<(u32, u32)>) -> Result<File> {
        let path = self.path.join(name);
        let flags = OFlag::O_WRONLY
            | OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, mode(bits)).map_err(|e| match e {
            Errno::ELOOP => denied(format!(
                "{} is a symbolic link, which a log is never written through: remove it",
                path.display()
            )),
            e => denied(format!("cannot open {}: {e}", path.display())),
        })?;
        let st = fstat(&fd).map_err(|e| denied(format!("fstat {}: {e}", path.display())))?;
        if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) != SFlag::S_IFREG {
            return Err(denied(format!(
                "{} is not a regular file: remove it",
                path.display()
            )));
        }
        if st.st_nlink != 1 {
            return Err(denied(format!(
                "{} has {} hard links; a log must have one: remove it",
                path.display(),
                st.st_nlink
            )));
        }
        let me = nix::unistd::geteuid().as_raw();
        let theirs = owner.map(|(uid, _)| uid);
        if st.st_uid != me && Some(st.st_uid) != theirs {
            return Err(denied(format!(
                "{} belongs to uid {}, not to this user (uid {me}): remove it",
                path.display(),
                st.st_uid
            )));
        }
        if let Some((uid, gid)) = owner {
            fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(|e| denied(format!("cannot give {} to uid {uid}: {e}", path.display())))?;
        }
        fchmod(&fd, mode(bits))
            .map_err(|e| denied(format!("cannot set the mode of {}: {e}", path.display())))?;
        // O_NONBLOCK only kept a FIFO planted here from blocking the open.
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_APPEND))
            .map_err(|e| denied(format!("fcntl {}: {e}", path.display())))?;
        Ok(File::from(fd))
    }

    /// This directory's entry `name` as a path through the open descriptor, so that no
    /// component above it is looked up again.
    fn via_fd(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()))
    }

    /// Listens on Unix socket `name` in this directory, with exactly mode `bits`. Fails if
    /// something already answers there; a stale socket file is replaced.
    ///
    /// The socket is bound through this directory's descriptor, and its mode is set on the
    /// socket before `bind` (Linux gives the new file that mode less the umask), so the file
    /// never appears with more permissions than `bits`; the umask's bits are then added back by
    /// name, which only this user can change inside this directory.
    pub fn listen(&self, name: &str, bits: u32) -> Result<UnixListener> {
        let path = self.path.join(name);
        let via_fd = self.via_fd(name);
        if UnixStream::connect(&via_fd).is_ok() {
            return Err(denied(format!(
                "{} is already served (another mps-server or mps-control listens there); stop it \
                 or choose another pipe directory",
                path.display()
            )));
        }
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(denied(format!("cannot replace {}: {e}", path.display()))),
        }
        let fail = |what: &str, e: Errno| denied(format!("{what} {}: {e}", path.display()));
        let sock = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| fail("cannot create a socket for", e))?;
        fchmod(&sock, mode(bits)).map_err(|e| fail("cannot set the mode of", e))?;
        let addr = UnixAddr::new(&via_fd).map_err(|e| fail("cannot address", e))?;
        bind(sock.as_raw_fd(), &addr).map_err(|e| fail("cannot listen on", e))?;
        std::fs::set_permissions(&via_fd, std::os::unix::fs::PermissionsExt::from_mode(bits))
            .map_err(|e| denied(format!("cannot set the mode of {}: {e}", path.display())))?;
        listen(&sock, Backlog::MAXCONN).map_err(|e| fail("cannot listen on", e))?;
        Ok(UnixListener::from(sock))
    }

    /// Removes entry `name` (a file or a socket; a link itself, never what it points to).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir).map_err(io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mps-fs-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// What the daemon's socket modes rest on: Linux gives a socket's file the mode set on the
    /// socket before `bind`, less the umask — never the default 0777 less the umask.
    #[test]
    fn linux_binds_a_socket_with_the_mode_set_on_it_before() {
        let dir = scratch("fchmod");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let sock = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        fchmod(&sock, mode(0o600)).unwrap();
        bind(sock.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
        let got = mode_of(&path);
        assert_eq!(
            got & !0o600,
            0,
            "bound with mode {got:o}, wider than the 600 set"
        );
        assert_ne!(
            got & 0o600,
            0,
            "bound with mode {got:o}: the owner cannot use it"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sockets_get_exactly_their_mode_whatever_the_umask() {
        let dir = TrustedDir::open(&scratch("listen"), 0o700).unwrap();
        for bits in [0o600, 0o666] {
            let _l = dir.listen("s", bits).unwrap();
            assert_eq!(mode_of(&dir.path().join("s")), bits);
        }
        // A second listener on a live socket is refused.
        let _l = dir.listen("live", 0o600).unwrap();
        let e = dir.listen("live", 0o600).unwrap_err();
        assert!(e.message.contains("already served"), "{e}");
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    #[test]
    fn directories_are_made_with_their_mode_and_links_are_refused() {
        let root = scratch("dirs");
        let dir = TrustedDir::open(&root.join("a/b"), 0o700).unwrap();
        assert_eq!(mode_of(dir.path()), 0o700);
        let sub = dir.subdir("s", 0o711, None).unwrap();
        assert_eq!(mode_of(sub.path()), 0o711);
        std::os::unix::fs::symlink(dir.path(), root.join("link")).unwrap();
        let e = TrustedDir::open(&root.join("link"), 0o700).unwrap_err();
        assert!(e.message.contains("symbolic link"), "{e}");
        let open = root.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = TrustedDir::open(&open, 0o700).unwrap_err();
        assert!(e.message.contains("chmod go-w"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn files_are_never_written_through_a_link() {
        let root = scratch("files");
        let dir = TrustedDir::open(&root.join("d"), 0o700).unwrap();
        let target = root.join("precious");
        std::fs::write(&target, "keep").unwrap();
        // create_file replaces the link with a file of its own.
        std::os::unix::fs::symlink(&target, dir.path().join("pid")).unwrap();
        std::io::Write::write_all(&mut dir.create_file("pid", 0o644).unwrap(), b"1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("pid")).unwrap(),
            "1\n"
        );
        assert_eq!(mode_of(&dir.path().join("pid")), 0o644);
        // append_file refuses a symbolic link and a hard link, and keeps its file private.
        std::os::unix::fs::symlink(&target, dir.path().join("log")).unwrap();
        let e = dir.append_file("log", 0o600, None).unwrap_err();
        assert!(e.message.contains("symbolic link"), "{e}");
        std::fs::remove_file(dir.path().join("log")).unwrap();
        std::fs::hard_link(&target, dir.path().join("log")).unwrap();
        let e = dir.append_file("log", 0o600, None).unwrap_err();
        assert!(e.message.contains("hard links"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        std::fs::remove_file(dir.path().join("log")).unwrap();
        let mut log = dir.append_file("log", 0o600, None).unwrap();
        std::io::Write::write_all(&mut log, b"line\n").unwrap();
        let meta = std::fs::metadata(dir.path().join("log")).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.len()), (0o600, 5));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
