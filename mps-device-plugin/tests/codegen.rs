//! `src/api/v1beta1.rs` is generated from `proto/api.proto` (the kubelet's device plugin API)
//! and checked in, so that building the plugin needs neither `protoc` nor a protobuf compiler
//! crate; this test regenerates it with protox (a protobuf compiler in Rust) and
//! tonic-prost-build and fails on any difference. `MPS_BLESS=1` writes the new code instead.

use std::path::Path;

#[test]
fn the_generated_api_matches_the_proto() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile([root.join("proto/api.proto")], [root.join("proto")])
        .expect("proto/api.proto compiles");
    let out =
        std::env::temp_dir().join(format!("mps-device-plugin-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    tonic_prost_build::configure()
        .build_transport(true)
        .emit_rerun_if_changed(false)
        .out_dir(&out)
        .compile_fds(fds)
        .expect("tonic-prost-build generates the API");
    let fresh = std::fs::read_to_string(out.join("v1beta1.rs")).unwrap();
    let _ = std::fs::remove_dir_all(&out);
    let checked_in = root.join("src/api/v1beta1.rs");
    if std::env::var_os("MPS_BLESS").is_some() {
        std::fs::write(&checked_in, &fresh).unwrap();
        return;
    }
    let old = std::fs::read_to_string(&checked_in).unwrap_or_default();
    assert!(
        old == fresh,
        "src/api/v1beta1.rs is out of date with proto/api.proto; regenerate it with\n  \
         MPS_BLESS=1 cargo test -p mps-device-plugin --test codegen"
    );
}
