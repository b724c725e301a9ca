//! `mps-run PROGRAM [ARGS...]`: runs an unmodified CUDA program as a client of an mps server,
//! by putting mps's `libcuda.so.1` first on the program's library path and executing it.
//!
//! Where the library is, in order: `$MPS_CUDA_LIBRARY_DIR`; `../lib/mps/` beside the launcher
//! (an installed package: `/usr/bin/mps-run`, `/usr/lib/mps/libcuda.so.1`); the launcher's own
//! directory in a cargo build (`target/<profile>/libmpscuda.so`, whose soname is
//! `libcuda.so.1`), for which a directory `mps-cuda-lib/` holding the links `libcuda.so.1` and
//! `libcuda.so` is made beside it. Both names: a program that loads the driver by the unversioned
//! name (cudarc tries `libcuda.so` first) would otherwise find NVIDIA's ahead of ours.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const SONAME: &str = "libcuda.so.1";
/// The unversioned name some programs load the driver by.
const DEV_NAME: &str = "libcuda.so";
/// The library's file in a cargo build, and the link to it from `mps-cuda-lib/`.
const BUILT: &str = "libmpscuda.so";
const LINK_TARGET: &str = "../libmpscuda.so";

/// A directory holding `libcuda.so.1` for the launcher at `exe`.
fn library_dir(exe: &Path) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("MPS_CUDA_LIBRARY_DIR") {
        let dir = PathBuf::from(dir);
        if dir.join(SONAME).exists() {
            return Ok(dir);
        }
        return Err(format!(
            "MPS_CUDA_LIBRARY_DIR is {} but it holds no {SONAME}",
            dir.display()
        ));
    }
    let bin = exe
        .parent()
        .ok_or_else(|| format!("{} has no directory", exe.display()))?;
    let installed = bin.join("../lib/mps");
    if installed.join(SONAME).exists() {
        return Ok(installed);
    }
    let built = bin.join(BUILT);
    if built.exists() {
        let dir = bin.join("mps-cuda-lib");
        for name in [SONAME, DEV_NAME] {
            let link = dir.join(name);
            if std::fs::read_link(&link).ok().as_deref() == Some(Path::new(LINK_TARGET)) {
                continue;
            }
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            // Made under a temporary name and renamed, so that launchers started together
            // never see a half-made link.
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(LINK_TARGET, &tmp)
                .and_then(|()| std::fs::rename(&tmp, &link))
                .map_err(|e| format!("cannot link {}: {e}", link.display()))?;
        }
        return Ok(dir);
    }
    Err(format!(
        "no {SONAME} of mps found: looked in {} and for {}; set MPS_CUDA_LIBRARY_DIR to the \
         directory that holds it",
        installed.display(),
        built.display()
    ))
}

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!(
            "usage: mps-run PROGRAM [ARGS...]\n\
             runs PROGRAM with mps's libcuda.so.1, as a client of the mps server of \
             $MPS_PIPE_DIRECTORY (default /tmp/mps)"
        );
        return ExitCode::from(2);
    };
    let dir = match std::env::current_exe()
        .map_err(|e| format!("cannot find this launcher's path: {e}"))
        .and_then(|exe| library_dir(&exe))
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("mps-run: {e}");
            return ExitCode::from(2);
        }
    };
    let mut path = OsString::from(dir.canonicalize().unwrap_or(dir));
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let err = Command::new(&program)
        .args(args)
        .env("LD_LIBRARY_PATH", path)
        .exec();
    eprintln!(
        "mps-run: cannot run {}: {err}",
        Path::new(&program).display()
    );
    ExitCode::from(127)
}
