//! The `mps-transparent` mode: the native workers, unmodified, loading mps's `libcuda.so.1`
//! (crate `mps-cuda`) instead of NVIDIA's, as clients of an mps server started here.
//!
//! The workers are started the way `mps-run` starts a program: a directory holding the library
//! first on `LD_LIBRARY_PATH`, `MPS_PIPE_DIRECTORY` naming the server. cudarc finds the driver by
//! `dlopen` of a list of names tried in order, `libcuda.so` first and `libcuda.so.1` last
//! (`cudarc::get_lib_name_candidates`): a directory holding only `libcuda.so.1` would lose to
//! NVIDIA's `libcuda.so` where the driver installed one. The directory made here holds both names,
//! and each worker checks, before its first driver call, that the file it loaded is the one asked
//! for: a worker that measured NVIDIA's driver under this mode's name fails instead.

use std::ffi::{CStr, c_void};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The library's file in a cargo build (its soname is `libcuda.so.1`), and in an installation.
const BUILT: &str = "libmpscuda.so";
const SONAME: &str = "libcuda.so.1";
/// The names the workers' driver loader asks for first and last (see the module's comment).
const NAMES: [&str; 2] = ["libcuda.so", SONAME];
/// Tells a worker which file its driver library must be.
const EXPECTED: &str = "MPS_BENCH_LIBCUDA";

/// mps's driver library, linked under the driver's names into a directory of this run's own
/// (removed on drop).
#[derive(Debug)]
pub(crate) struct Library {
    file: PathBuf,
    dir: PathBuf,
}

impl Library {
    /// Finds the library in `dir` (`libmpscuda.so` of a cargo build, else the `libcuda.so.1` of
    /// an installation) and links it under the driver's names.
    pub(crate) fn prepare(dir: &Path) -> Library {
        let file = [BUILT, SONAME]
            .iter()
            .map(|n| dir.join(n))
            .find(|f| f.exists())
            .unwrap_or_else(|| {
                panic!(
                    "mps-transparent: no {BUILT} or {SONAME} in {}: build it (cargo build -p \
                     mps-cuda) or name its directory with --mps-cuda-lib",
                    dir.display()
                )
            });
        let file = file
            .canonicalize()
            .unwrap_or_else(|e| panic!("cannot resolve {}: {e}", file.display()));
        let links = std::env::temp_dir().join(format!("mps-bench-cuda-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&links);
        std::fs::create_dir_all(&links)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", links.display()));
        for name in NAMES {
            std::os::unix::fs::symlink(&file, links.join(name))
                .unwrap_or_else(|e| panic!("cannot link {}: {e}", links.join(name).display()));
        }
        Library { file, dir: links }
    }

    /// The environment that makes a native worker load this library (the server's pipe
    /// directory comes from the service).
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        let mut path = self.dir.display().to_string();
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
            path = format!("{path}:{}", old.to_string_lossy());
        }
        vec![
            ("LD_LIBRARY_PATH".to_string(), path),
            (EXPECTED.to_string(), self.file.display().to_string()),
        ]
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// In a worker of the mode: loads the driver library as cudarc does and checks that it is the
/// file `mps-bench run` asked for; panics, naming both files, otherwise.
pub(crate) fn check_loaded() {
    let want = std::env::var_os(EXPECTED).unwrap_or_else(|| {
        panic!("mps-transparent: {EXPECTED} is not set: workers are started by `mps-bench run`")
    });
    let got = loaded_driver();
    // The same file, by device and inode: a path may be a link to it.
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let same = id(&got).is_some() && id(&got) == id(Path::new(&want));
    assert!(
        same,
        "mps-transparent: this worker loaded the CUDA driver from {}, not mps's library {}: \
         check LD_LIBRARY_PATH ({:?}) and that the directory holds libcuda.so",
        got.display(),
        Path::new(&want).display(),
        std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default()
    );
}

/// The file the driver's `cuInit` comes from, in the library cudarc loads.
fn loaded_driver() -> PathBuf {
    // SAFETY: culib opens the driver library by cudarc's names (panicking, with the names
    // tried, if none opens), as the first driver call would; `cuInit` is looked up as an
    // address, never called here.
    let address = unsafe {
        let symbol = cudarc::driver::sys::culib()
            .get::<*mut c_void>(b"cuInit")
            .unwrap_or_else(|e| panic!("the loaded CUDA driver has no cuInit: {e}"));
        *symbol
    };
    let mut info = std::mem::MaybeUninit::<nix::libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads the address and fills `info`; dli_fname then points to the
    // loader's copy of the object's path, valid while the object stays loaded (for the life
    // of the process: cudarc never unloads it).
    let file = unsafe {
        let found = nix::libc::dladdr(address, info.as_mut_ptr());
        let info = info.assume_init();
        assert!(
            found != 0 && !info.dli_fname.is_null(),
            "dladdr found no object holding the driver's cuInit at {address:p}"
        );
        CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned()
    };
    PathBuf::from(file)
}
