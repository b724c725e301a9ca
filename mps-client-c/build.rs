//! Gives the shared library its soname and tells dependent crates where the headers are.

use std::path::PathBuf;

fn main() {
    // The soname carries the ABI's major version (libmpsclient.so.0), as the dynamic linker and
    // the Debian package expect: programs linked now keep working across compatible releases.
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    // A plain link argument, not a cdylib one: cargo passes a dependency's cdylib link arguments
    // on to every cdylib that depends on it (mps-cuda's libcuda.so.1 would take this soname).
    // On this package's executables (tests, examples) a soname is inert.
    println!("cargo:rustc-link-arg=-Wl,-soname,libmpsclient.so.{major}");

    // Crates that depend on this one and build C or C++ against mps.h / mps.hpp find them in
    // DEP_MPSCLIENT_INCLUDE (this package `links` mpsclient).
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let include = manifest.join("../include");
    for header in ["mps.h", "mps.hpp"] {
        println!("cargo:rerun-if-changed=../include/{header}");
        assert!(
            include.join(header).exists(),
            "{} is missing: build mps-client-c from the mps repository, which holds include/",
            include.join(header).display()
        );
    }
    let include = include.canonicalize().expect("include/ resolves");
    println!("cargo:include={}", include.display());
}
