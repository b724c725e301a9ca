//! A crate that depends on this one builds C against the header it exposes
//! (`DEP_MPSCLIENT_INCLUDE`) and links: the way a Rust program with some C joins mps.

use std::path::Path;
use std::process::Command;

#[test]
fn a_dependent_crate_builds_c_against_the_exposed_header() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let krate = here.join("tests/dependent");
    // Resolve as the workspace does and share its target directory, so nothing is built twice.
    std::fs::copy(here.join("../Cargo.lock"), krate.join("Cargo.lock")).unwrap();
    let target = here.join("../target/dependent");
    let out = Command::new(env!("CARGO"))
        .args(["run", "--quiet", "--offline", "--manifest-path"])
        .arg(krate.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(krate.join("Cargo.lock"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), "MPS_ERROR_NOT_READY");
}
