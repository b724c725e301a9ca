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
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use mps_core::{Error, Result, Status};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};

/// The log directory: `$MPS_LOG_DIRECTORY`; else, for a user other than root with
/// `$XDG_RUNTIME_DIR` set, `$XDG_RUNTIME_DIR/mps-log`; else `/tmp/mps-log`.
pub fn default_log_dir() -> PathBuf {
    default_dir("MPS_LOG_DIRECTORY", "mps-log")
}

/// `$var`; else `$XDG_RUNTIME_DIR/name` for a user other than root (a directory only that user
/// can write, so nobody can take the name first); else `/tmp/name`.
pub(crate) fn default_dir(var: &str, name: &str) -> PathBuf {
    if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
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

/// Opens the directory `path`, creating it (and any missing parent) with `mode` whatever the
/// umask, after checking that it and every directory above it can be trusted. Returns the
/// opened directory, for creating files in it without going through the path again.
pub fn private_dir(path: &Path, mode: u32) -> Result<OwnedFd> {
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
    check_dir(&fstat(&dir).map_err(|e| os("fstat", root, e))?, root, false)?;
    let mut shown = PathBuf::from("/");
    let me = nix::unistd::geteuid().as_raw();
    for (i, part) in parts.iter().enumerate() {
        shown.push(part);
        let last = i + 1 == parts.len();
        // O_PATH suffices to walk through a directory above (and needs no read permission on
        // it); the last one, and any created here, are opened for real to set their mode.
        let open = |readable: bool| {
            let mut flags = OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
            flags |= if readable {
                OFlag::O_RDONLY
            } else {
                OFlag::O_PATH
            };
            match openat(&dir, *part, flags, Mode::empty()) {
                Err(Errno::ELOOP | Errno::ENOTDIR) => match link_owner(&dir, part) {
                    Some(owner) if !last && (owner == me || owner == 0) => {
                        openat(&dir, *part, flags - OFlag::O_NOFOLLOW, Mode::empty())
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
                match mkdirat(&dir, *part, Mode::from_bits_truncate(mode)) {
                    Ok(()) => created = true,
                    Err(Errno::EEXIST) => {}
                    Err(e) => return Err(os("cannot create", &shown, e)),
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
            e => os("cannot open", &shown, e),
        })?;
        if created {
            fchmod(&fd, Mode::from_bits_truncate(mode))
                .map_err(|e| os("cannot set the mode of", &shown, e))?;
        }
        check_dir(
            &fstat(&fd).map_err(|e| os("fstat", &shown, e))?,
            &shown,
            last,
        )?;
        dir = fd;
    }
    Ok(dir)
}

/// The owner of `name` in `dir` if it is a symbolic link.
fn link_owner(dir: &OwnedFd, name: &OsStr) -> Option<u32> {
    let st = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    (SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK).then_some(st.st_uid)
}

/// The rules for a directory: owned by this user or root; the one used (`last`) writable by
/// nobody else, one above it only if sticky.
fn check_dir(st: &FileStat, path: &Path, last: bool) -> Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    if st.st_uid != me && st.st_uid != 0 {
        return Err(refused(format!(
            "{} is owned by uid {}, not by you (uid {me}) or root: that user could replace what \
             mps puts there. Remove it or choose another directory",
            path.display(),
            st.st_uid
        )));
    }
    let mode = st.st_mode & 0o7777;
    let others_write = mode & 0o022 != 0;
    let sticky = mode & 0o1000 != 0;
    if others_write && (last || !sticky) {
        return Err(refused(format!(
            "{} can be written by its group or by others (mode {mode:04o}), so they could \
             replace what mps puts there; run chmod go-w on it or choose another directory",
            path.display()
        )));
    }
    Ok(())
}

/// Opens (creating with `mode`) the file `name` in the directory `dir` (opened by
/// [`private_dir`]; `dir_path` only names it in errors) for appending: never through a
/// symbolic link, and only a regular file of this user with no other hard link. An existing
/// file gets `mode` too, so a log created under a looser umask is made private.
pub fn open_private_file(dir: &OwnedFd, dir_path: &Path, name: &str, mode: u32) -> Result<File> {
    let path = dir_path.join(name);
    if name.is_empty() || name.as_bytes().contains(&b'/') || name == "." || name == ".." {
        return Err(refused(format!(
            "{name:?} is not a file name (it must not be empty or contain '/')"
        )));
    }
    let flags = OFlag::O_WRONLY
        | OFlag::O_APPEND
        | OFlag::O_CREAT
        | OFlag::O_NOFOLLOW
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC
        | OFlag::O_NONBLOCK;
    let fd = openat(dir, name, flags, Mode::from_bits_truncate(mode)).map_err(|e| match e {
        Errno::ELOOP => refused(format!(
            "{} is a symbolic link; mps does not write through one (it could point at any \
             file). Remove it",
            path.display()
        )),
        e => os("cannot open", &path, e),
    })?;
    let st = fstat(&fd).map_err(|e| os("fstat", &path, e))?;
    let me = nix::unistd::geteuid().as_raw();
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(refused(format!(
            "{} is not a regular file; remove it",
            path.display()
        )));
    }
    if st.st_uid != me {
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
    if st.st_mode & 0o7777 != mode {
        fchmod(&fd, Mode::from_bits_truncate(mode))
            .map_err(|e| os("cannot set the mode of", &path, e))?;
    }
    // Writes block as usual; O_NONBLOCK only kept the open from waiting on a FIFO.
    nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_APPEND))
        .map_err(|e| os("fcntl", &path, e))?;
    Ok(File::from(fd))
}

/// Whether `fd` (an opened directory) is the directory at `path` now: for a caller that must
/// pass a path to the kernel (bind) after checking the directory through its descriptor.
pub fn is_same_dir(fd: &impl AsFd, path: &Path) -> bool {
    let (Ok(a), Ok(b)) = (fstat(fd), nix::sys::stat::lstat(path)) else {
        return false;
    };
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mps-trust-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn directories_are_created_with_the_mode_asked_whatever_the_umask() {
        let d = scratch("mode");
        let old = nix::sys::stat::umask(Mode::empty());
        let made = private_dir(&d.join("a/b"), 0o700);
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
        let e = private_dir(&open, 0o700).unwrap_err();
        assert!(e.message.contains("mode 0777"), "{}", e.message);
        // Sticky and world-writable is fine above the directory used (as /tmp is).
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        private_dir(&open.join("inner"), 0o700).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symbolic_link_is_not_followed_at_the_last_component() {
        let d = scratch("link");
        std::fs::create_dir(d.join("real")).unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
        let e = private_dir(&d.join("link"), 0o700).unwrap_err();
        assert!(e.message.contains("is a symbolic link"), "{}", e.message);
        // Above the last component a link of this user is followed.
        private_dir(&d.join("link/inner"), 0o700).unwrap();
        assert!(d.join("real/inner").is_dir());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_private_file_is_never_reached_through_a_link() {
        let d = scratch("file");
        let dir = private_dir(&d, 0o700).unwrap();
        let target = d.join("precious");
        std::fs::write(&target, "x").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&target, d.join("server.log")).unwrap();
        let e = open_private_file(&dir, &d, "server.log", 0o600).unwrap_err();
        assert!(e.message.contains("symbolic link"), "{}", e.message);
        std::fs::hard_link(&target, d.join("other.log")).unwrap();
        let e = open_private_file(&dir, &d, "other.log", 0o600).unwrap_err();
        assert!(e.message.contains("2 hard links"), "{}", e.message);
        let m = std::fs::metadata(&target).unwrap().mode() & 0o7777;
        assert_eq!(m, 0o644, "the target's mode changed");
        assert!(open_private_file(&dir, &d, "../x", 0o600).is_err());
        // A file of ours with a loose mode is made private.
        std::fs::write(d.join("loose.log"), "").unwrap();
        std::fs::set_permissions(d.join("loose.log"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        open_private_file(&dir, &d, "loose.log", 0o600).unwrap();
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
        let e = private_dir(&theirs, 0o700).unwrap_err();
        assert!(e.message.contains("owned by uid 65534"), "{}", e.message);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
