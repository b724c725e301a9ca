//! Trust on the filesystem: the directories mps keeps its socket and logs in, and the files it
//! creates there, as OpenSSH and systemd treat theirs.
//!
//! A directory is used only if it is owned by this user or root and nobody else can write it;
//! every directory above it must be owned by this user or root and be writable by others only
//! if it is sticky (as /tmp is). The last component is never a symbolic link; one above it is
//! followed only if this user or root owns the link. Directories are created with the mode
//! asked for whatever the umask, set on the opened descriptor, and every check is made on an
//! opened descriptor, never on a path that could be swapped between the check and the use.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Component, Path, PathBuf};

use mps_core::{Error, Result, Status};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};

/// The log directory: `$MPS_LOG_DIRECTORY`; else, for a user other than root with
/// `$XDG_RUNTIME_DIR` set, `$XDG_RUNTIME_DIR/mps-log`; else `/tmp/mps-log`.
pub fn default_log_dir() -> PathBuf {
    default_dir("MPS_LOG_DIRECTORY", "mps-log")
}

/// `$var`; else `$XDG_RUNTIME_DIR/name` for a user other than root (a directory only that user
/// can write, so nobody can take the name first); else `/tmp/name`.
pub(crate) fn default_dir(var: &'static str, name: &str) -> PathBuf {
    if let Some(v) = crate::env::setting_os(var) {
        return PathBuf::from(v);
    }
    if !nix::unistd::geteuid().is_root() {
        if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
            if run.is_absolute() {
                return run.join(name);
            }
        }
    }
    Path::new("/tmp").join(name)
}

fn refused(msg: String) -> Error {
    Error::new(Status::PermissionDenied, msg)
}

fn os(what: &str, path: &Path, e: Errno) -> Error {
    refused(format!("{what} {}: {e}", path.display()))
}

fn mode(bits: u32) -> Mode {
    Mode::from_bits_truncate(bits)
}

fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

/// A directory this process may trust, held open. It is checked once, when it is opened; since
/// nobody else can change its entries afterwards, names inside it stay what this process made
/// them, and everything in it is reached through its descriptor.
#[derive(Debug)]
pub struct TrustedDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl TrustedDir {
    /// Opens the directory `path`, creating it (and any missing parent) with `bits` whatever the
    /// umask, after checking that it and every directory above it can be trusted. A directory
    /// that exists keeps its mode.
    pub fn open(path: &Path, bits: u32) -> Result<TrustedDir> {
        let path = std::path::absolute(path)
            .map_err(|e| refused(format!("cannot resolve {}: {e}", path.display())))?;
        let parts: Vec<&OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(p) => Some(Ok(p)),
                Component::RootDir | Component::CurDir => None,
                _ => Some(Err(())),
            })
            .collect::<std::result::Result<_, ()>>()
            .map_err(|()| {
                refused(format!(
                    "{} contains \"..\"; give the directory without it",
                    path.display()
                ))
            })?;
        let root = Path::new("/");
        let mut dir: OwnedFd = nix::fcntl::open(
            root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| os("cannot open", root, e))?;
        check_dir(
            &fstat(&dir).map_err(|e| os("fstat", root, e))?,
            root,
            false,
            None,
        )?;
        let mut shown = PathBuf::from("/");
        for (i, part) in parts.iter().enumerate() {
            shown.push(part);
            let last = i + 1 == parts.len();
            dir = step(&dir, part, &shown, bits, last)?;
        }
        Ok(TrustedDir { fd: dir, path })
    }

    /// Subdirectory `name`, created with exactly `bits` if it is missing; checked as
    /// [`TrustedDir::open`] checks, except that `owner` may own it too: when `owner` is given (by
    /// root, for a user's server) it is made theirs with mode `bits`.
    pub fn subdir(&self, name: &str, bits: u32, owner: Option<(u32, u32)>) -> Result<TrustedDir> {
        let path = self.path.join(name);
        file_name(name, &path)?;
        let (fd, created) = open_dir(&self.fd, OsStr::new(name), &path, bits, true)?;
        if let Some((uid, gid)) = owner {
            // Only this process writes its parent, so what is there is what it made: make it
            // theirs, and theirs alone, before checking.
            fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(|e| os(&format!("cannot give to uid {uid}:"), &path, e))?;
            fchmod(&fd, mode(bits)).map_err(|e| os("cannot set the mode of", &path, e))?;
        } else if created {
            fchmod(&fd, mode(bits)).map_err(|e| os("cannot set the mode of", &path, e))?;
        }
        let st = fstat(&fd).map_err(|e| os("fstat", &path, e))?;
        check_dir(&st, &path, true, owner.map(|(uid, _)| uid))?;
        Ok(TrustedDir { fd, path })
    }

    /// The directory's path, for messages and for programs given it by name.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the directory's mode to exactly `bits`.
    pub fn set_mode(&self, bits: u32) -> Result<()> {
        fchmod(&self.fd, mode(bits)).map_err(|e| os("cannot set the mode of", &self.path, e))
    }

    /// Creates file `name` anew, with exactly mode `bits`, for writing: whatever was there (a
    /// file, a link) is removed first, and the new file is made with `O_EXCL | O_NOFOLLOW`, so
    /// nothing outside this directory is ever written.
    pub fn create_file(&self, name: &str, bits: u32) -> Result<File> {
        let path = self.path.join(name);
        file_name(name, &path)?;
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(os("cannot replace", &path, e)),
        }
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd =
            openat(&self.fd, name, flags, mode(bits)).map_err(|e| os("cannot create", &path, e))?;
        fchmod(&fd, mode(bits)).map_err(|e| os("cannot set the mode of", &path, e))?;
        Ok(File::from(fd))
    }

    /// Opens file `name` for appending, creating it with mode `bits` if it is missing: never
    /// through a symbolic link, and only a regular file of this user (or of `owner`) with no
    /// other hard link. An existing file gets mode `bits` too, so a log created under a looser
    /// umask is made private; with `owner` (root making a user's log), the file is made theirs.
    pub fn append_file(&self, name: &str, bits: u32, owner: Option<(u32, u32)>) -> Result<File> {
        let path = self.path.join(name);
        file_name(name, &path)?;
        let flags = OFlag::O_WRONLY
            | OFlag::O_APPEND
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NOCTTY
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, mode(bits)).map_err(|e| match e {
            Errno::ELOOP => refused(format!(
                "{} is a symbolic link; mps does not write through one (it could point at any \
                 file). Remove it",
                path.display()
            )),
            e => os("cannot open", &path, e),
        })?;
        let st = fstat(&fd).map_err(|e| os("fstat", &path, e))?;
        if file_type(&st) != SFlag::S_IFREG {
            return Err(refused(format!(
                "{} is not a regular file; remove it",
                path.display()
            )));
        }
        let me = nix::unistd::geteuid().as_raw();
        if st.st_uid != me && Some(st.st_uid) != owner.map(|(uid, _)| uid) {
            return Err(refused(format!(
                "{} is owned by uid {}, not by you (uid {me}); remove it",
                path.display(),
                st.st_uid
            )));
        }
        if st.st_nlink != 1 {
            return Err(refused(format!(
                "{} has {} hard links; another name for it could be anywhere. Remove it",
                path.display(),
                st.st_nlink
            )));
        }
        if let Some((uid, gid)) = owner {
            fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                .map_err(|e| os(&format!("cannot give to uid {uid}:"), &path, e))?;
        }
        if st.st_mode & 0o7777 != bits {
            fchmod(&fd, mode(bits)).map_err(|e| os("cannot set the mode of", &path, e))?;
        }
        // Writes block as usual; O_NONBLOCK only kept the open from waiting on a FIFO.
        nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_APPEND))
            .map_err(|e| os("fcntl", &path, e))?;
        Ok(File::from(fd))
    }

    /// Listens on Unix socket `name` in this directory, with exactly mode `bits`. Fails if
    /// something already answers there (another server or daemon); a stale socket file left by
    /// one that died is replaced.
    ///
    /// The socket is bound through this directory's descriptor (`/proc/self/fd/N/name`: no
    /// component above is looked up again, and a long directory path does not run into the
    /// socket address's 108 bytes). Its mode is set on the socket before `bind` (Linux gives the
    /// new file that mode less the umask), so the file never appears with more permissions than
    /// `bits`; the umask's bits are then added back through the descriptor's path, which only
    /// this user can change inside this directory.
    pub fn listen(&self, name: &str, bits: u32) -> Result<UnixListener> {
        let path = self.path.join(name);
        file_name(name, &path)?;
        let via_fd = PathBuf::from(format!("/proc/self/fd/{}/{name}", self.fd.as_raw_fd()));
        if UnixStream::connect(&via_fd).is_ok() {
            return Err(refused(format!(
                "{} is already served (another mps-server or mps-control listens there); stop it \
                 or choose another pipe directory",
                path.display()
            )));
        }
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(os("cannot replace", &path, e)),
        }
        let fail = |what: &str, e: Errno| os(what, &path, e);
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
        std::fs::set_permissions(&via_fd, std::fs::Permissions::from_mode(bits))
            .map_err(|e| refused(format!("cannot set the mode of {}: {e}", path.display())))?;
        listen(&sock, Backlog::new(128).unwrap_or(Backlog::MAXCONN))
            .map_err(|e| fail("cannot listen on", e))?;
        Ok(UnixListener::from(sock))
    }

    /// Renames entry `from` to `to` within this directory, replacing what `to` named (a link
    /// is renamed itself, never followed).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let path = self.path.join(from);
        file_name(from, &path)?;
        file_name(to, &self.path.join(to))?;
        nix::fcntl::renameat(&self.fd, from, &self.fd, to)
            .map_err(|e| os(&format!("cannot rename to {to}:"), &path, e))
    }

    /// The regular files of this directory whose names `wanted` accepts, with when each was
    /// last written, from at most `most` entries read (links and other kinds are left out, and
    /// never followed); the `bool` says whether entries were left unread. The entries are read
    /// through this directory's descriptor, each file is looked at with `fstatat` without
    /// following a link, and a name that is not UTF-8 is left out.
    pub fn files(
        &self,
        wanted: impl Fn(&str) -> bool,
        most: usize,
    ) -> Result<(Vec<(String, std::time::SystemTime)>, bool)> {
        let via_fd = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        let entries = std::fs::read_dir(&via_fd)
            .map_err(|e| refused(format!("cannot list {}: {e}", self.path.display())))?;
        let mut found = Vec::new();
        for (read, entry) in entries.enumerate() {
            if read == most {
                return Ok((found, true));
            }
            let Ok(entry) = entry else { continue };
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !wanted(&name) {
                continue;
            }
            let Ok(st) = fstatat(&self.fd, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            if file_type(&st) != SFlag::S_IFREG {
                continue;
            }
            let since_epoch = std::time::Duration::new(
                u64::try_from(st.st_mtime).unwrap_or(0),
                u32::try_from(st.st_mtime_nsec).unwrap_or(0),
            );
            found.push((name, std::time::UNIX_EPOCH + since_epoch));
        }
        Ok((found, false))
    }

    /// Removes entry `name` (a file or a socket; a link itself, never what it points to).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir).map_err(std::io::Error::from)
    }
}

/// Refuses a `name` that is not a single entry of a directory.
fn file_name(name: &str, path: &Path) -> Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(refused(format!(
            "{name:?} (for {}) is not a file name: it must not be empty or contain '/'",
            path.display()
        )));
    }
    Ok(())
}

/// One step of [`TrustedDir::open`]'s walk: component `part` of `dir` (shown as `shown`),
/// created with `bits` if missing, opened and checked.
fn step(dir: &OwnedFd, part: &OsStr, shown: &Path, bits: u32, last: bool) -> Result<OwnedFd> {
    let (fd, created) = open_dir(dir, part, shown, bits, last)?;
    if created {
        fchmod(&fd, mode(bits)).map_err(|e| os("cannot set the mode of", shown, e))?;
    }
    check_dir(
        &fstat(&fd).map_err(|e| os("fstat", shown, e))?,
        shown,
        last,
        None,
    )?;
    Ok(fd)
}

/// Opens directory `part` of `dir`, creating it with `bits` (less the umask; the caller sets the
/// mode) if it is missing; says whether it was created. The directory used (`last`) is never
/// reached through a symbolic link; one above it is, only if this user or root owns the link.
/// `O_PATH` suffices to walk through a directory above (and needs no read permission on it);
/// the last one, and any created here, are opened for real to set their mode.
fn open_dir(
    dir: &OwnedFd,
    part: &OsStr,
    shown: &Path,
    bits: u32,
    last: bool,
) -> Result<(OwnedFd, bool)> {
    let me = nix::unistd::geteuid().as_raw();
    let open = |readable: bool| {
        let mut flags = OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        flags |= if readable {
            OFlag::O_RDONLY
        } else {
            OFlag::O_PATH
        };
        match openat(dir, part, flags, Mode::empty()) {
            // With O_DIRECTORY, Linux reports a symbolic link as ENOTDIR rather than ELOOP.
            Err(Errno::ELOOP | Errno::ENOTDIR) => match link_owner(dir, part) {
                Some(owner) if !last && (owner == me || owner == 0) => {
                    openat(dir, part, flags - OFlag::O_NOFOLLOW, Mode::empty())
                }
                Some(_) => Err(Errno::ELOOP),
                None => Err(Errno::ENOTDIR),
            },
            other => other,
        }
    };
    let mut created = false;
    let opened = match open(last) {
        Err(Errno::ENOENT) => {
            match mkdirat(dir, part, mode(bits)) {
                Ok(()) => created = true,
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(os("cannot create", shown, e)),
            }
            open(last || created)
        }
        other => other,
    };
    let fd = opened.map_err(|e| match e {
        Errno::ELOOP => refused(format!(
            "{} is a symbolic link{}; mps does not follow it (another user could point it \
             anywhere). Use the directory it names, or remove it",
            shown.display(),
            if last { "" } else { " of another user" }
        )),
        Errno::ENOTDIR => refused(format!("{} is not a directory", shown.display())),
        e => os("cannot open", shown, e),
    })?;
    Ok((fd, created))
}

/// The owner of `name` in `dir` if it is a symbolic link.
fn link_owner(dir: &OwnedFd, name: &OsStr) -> Option<u32> {
    let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    (file_type(&st) == SFlag::S_IFLNK).then_some(st.st_uid)
}

/// The rules for a directory: owned by this user, root or `also`; the one used (`last`)
/// writable by nobody else, one above it only if sticky.
fn check_dir(st: &FileStat, path: &Path, last: bool, also: Option<u32>) -> Result<()> {
    if file_type(st) != SFlag::S_IFDIR {
        return Err(refused(format!("{} is not a directory", path.display())));
    }
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me && st.st_uid != 0 && Some(st.st_uid) != also {
        return Err(refused(format!(
            "{} is owned by uid {}, not by you (uid {me}) or root: that user could replace what \
             mps puts there. Remove it or choose another directory",
            path.display(),
            st.st_uid
        )));
    }
    let bits = st.st_mode & 0o7777;
    let others_write = bits & 0o022 != 0;
    let sticky = bits & 0o1000 != 0;
    if others_write && (last || !sticky) {
        return Err(refused(format!(
            "{} can be written by its group or by others (mode {bits:04o}), so they could \
             replace what mps puts there; run chmod go-w on it or choose another directory",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mps-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn mode_of(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    /// What the socket modes rest on: Linux gives a socket's file the mode set on the socket
    /// before `bind`, less the umask — never the default 0777 less the umask.
    #[test]
    fn linux_binds_a_socket_with_the_mode_set_on_it_before() {
        let dir = scratch("fchmod");
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
        assert_eq!(got & !0o600, 0, "bound with mode {got:o}, wider than 600");
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
        // A second listener on a live socket is refused; a stale socket file is replaced.
        let live = dir.listen("live", 0o600).unwrap();
        let e = dir.listen("live", 0o600).unwrap_err();
        assert!(e.message.contains("already served"), "{e}");
        drop(live);
        dir.listen("live", 0o600).unwrap();
        std::fs::remove_dir_all(dir.path()).unwrap();
    }

    #[test]
    fn a_subdirectory_gets_its_mode_and_is_never_a_link() {
        let d = scratch("subdir");
        let dir = TrustedDir::open(&d.join("a"), 0o700).unwrap();
        let sub = dir.subdir("s", 0o711, None).unwrap();
        assert_eq!(mode_of(sub.path()), 0o711);
        std::os::unix::fs::symlink(dir.path(), dir.path().join("link")).unwrap();
        let e = dir.subdir("link", 0o700, None).unwrap_err();
        assert!(e.message.contains("is a symbolic link"), "{e}");
        assert!(dir.subdir("../x", 0o700, None).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_created_file_replaces_a_link_instead_of_writing_through_it() {
        let d = scratch("create");
        let dir = TrustedDir::open(&d.join("d"), 0o700).unwrap();
        let target = d.join("precious");
        std::fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("pid")).unwrap();
        std::io::Write::write_all(&mut dir.create_file("pid", 0o644).unwrap(), b"1\n").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("pid")).unwrap(),
            "1\n"
        );
        assert_eq!(mode_of(&dir.path().join("pid")), 0o644);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn directories_are_created_with_the_mode_asked_whatever_the_umask() {
        let d = scratch("mode");
        let old = nix::sys::stat::umask(Mode::empty());
        let made = TrustedDir::open(&d.join("a/b"), 0o700);
        nix::sys::stat::umask(old);
        made.unwrap();
        for p in [d.join("a"), d.join("a/b")] {
            let m = std::fs::metadata(&p).unwrap().mode() & 0o7777;
            assert_eq!(m, 0o700, "{}", p.display());
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_others_can_write_is_refused() {
        let d = scratch("open");
        let open = d.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = TrustedDir::open(&open, 0o700).unwrap_err();
        assert!(e.message.contains("mode 0777"), "{}", e.message);
        // Sticky and world-writable is fine above the directory used (as /tmp is).
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        TrustedDir::open(&open.join("inner"), 0o700).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symbolic_link_is_not_followed_at_the_last_component() {
        let d = scratch("link");
        std::fs::create_dir(d.join("real")).unwrap();
        // Its mode set, not left to the umask, which another test of this process sets to 0
        // for a moment.
        std::fs::set_permissions(d.join("real"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        let e = TrustedDir::open(&d.join("link"), 0o700).unwrap_err();
        assert!(e.message.contains("is a symbolic link"), "{}", e.message);
        // Above the last component a link of this user is followed.
        TrustedDir::open(&d.join("link/inner"), 0o700).unwrap();
        assert!(d.join("real/inner").is_dir());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_private_file_is_never_reached_through_a_link() {
        let d = scratch("file");
        let dir = TrustedDir::open(&d, 0o700).unwrap();
        let target = d.join("precious");
        std::fs::write(&target, "x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&target, d.join("server.log")).unwrap();
        let e = dir.append_file("server.log", 0o600, None).unwrap_err();
        assert!(e.message.contains("symbolic link"), "{}", e.message);
        std::fs::hard_link(&target, d.join("other.log")).unwrap();
        let e = dir.append_file("other.log", 0o600, None).unwrap_err();
        assert!(e.message.contains("2 hard links"), "{}", e.message);
        let m = std::fs::metadata(&target).unwrap().mode() & 0o7777;
        assert_eq!(m, 0o644, "the target's mode changed");
        assert!(dir.append_file("../x", 0o600, None).is_err());
        // A file of ours with a loose mode is made private.
        std::fs::write(d.join("loose.log"), "").unwrap();
        std::fs::set_permissions(d.join("loose.log"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        dir.append_file("loose.log", 0o600, None).unwrap();
        let m = std::fs::metadata(d.join("loose.log")).unwrap().mode() & 0o7777;
        assert_eq!(m, 0o600);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root, to give a directory to another user (nobody)");
            return;
        }
        let d = scratch("owner");
        let theirs = d.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = TrustedDir::open(&theirs, 0o700).unwrap_err();
        assert!(e.message.contains("owned by uid 65534"), "{}", e.message);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
