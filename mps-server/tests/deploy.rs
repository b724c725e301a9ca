//! The Kubernetes manifests in deploy/kubernetes, checked against the Kubernetes schemas by
//! kubernetes-validate (from PyPI; it carries its schemas, so it works offline; .ci/run installs
//! it).

mod common;

use std::process::Command;

use common::root;

#[test]
fn kubernetes_manifests_validate_strictly() {
    let dir = root().join("deploy/kubernetes");
    let files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    assert!(files.len() >= 2, "manifests missing in {}", dir.display());
    // The module form finds the validator wherever pip put it, whether or not its script is on
    // PATH.
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(&files)
        .output()
        .expect("run python3");
    let missing = String::from_utf8_lossy(&out.stderr).contains("No module named");
    if missing && std::env::var_os("CI").is_none() {
        println!("skipped: kubernetes-validate is not installed; pip install kubernetes-validate");
        return;
    }
    assert!(
        !missing,
        "kubernetes-validate is missing in CI (.ci/run installs it)"
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert_eq!(
        text.matches(" passed for resource ").count(),
        files.len(),
        "{text}"
    );
}

#[test]
fn the_client_pod_needs_only_the_pipe_directory() {
    let text =
        std::fs::read_to_string(root().join("deploy/kubernetes/example-client-pod.yaml")).unwrap();
    // The manifest itself, without its comments.
    let pod: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !pod.contains("hostIPC"),
        "segments travel as descriptors: no hostIPC"
    );
    assert!(
        !pod.contains("nvidia.com/gpu"),
        "the daemon's server owns the GPU"
    );
    assert_eq!(
        pod.matches("hostPath:").count(),
        1,
        "only the pipe directory is mounted"
    );
    assert!(pod.contains("path: /run/mps"));
}
