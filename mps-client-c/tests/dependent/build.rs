//! Compiles uses_header.c against the header mps-client-c exposes (DEP_MPSCLIENT_INCLUDE).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let include = std::env::var("DEP_MPSCLIENT_INCLUDE")
        .expect("mps-client-c exposes its headers as DEP_MPSCLIENT_INCLUDE");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let object = out.join("uses_header.o");
    let ok = Command::new(&cc)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-c",
            "src/uses_header.c",
            "-I",
        ])
        .arg(&include)
        .arg("-o")
        .arg(&object)
        .status()
        .expect("run the C compiler")
        .success();
    assert!(ok, "compiling against {include}/mps.h failed");
    let ok = Command::new("ar")
        .arg("rcs")
        .arg(out.join("libuses_header.a"))
        .arg(&object)
        .status()
        .expect("run ar")
        .success();
    assert!(ok, "ar failed");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=uses_header");
    println!("cargo:rerun-if-changed=src/uses_header.c");
}
