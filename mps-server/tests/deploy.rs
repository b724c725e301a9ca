//! What ships beside the binaries: the Kubernetes manifests in deploy/kubernetes, checked
//! against the Kubernetes schemas by kubernetes-validate (from PyPI; it carries its schemas, so
//! it works offline; .ci/run installs it), the man pages, checked against the binaries' own
//! options and commands, and the version each shipped file states. (scripts/package-test checks
//! the Debian packages themselves.)

mod common;

use std::process::Command;

use common::{control_bin, root, server_bin, skip_unless_ci};

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
    // Outside CI a missing validator is a visible skip; in CI (.ci/run installs it) a failure.
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict"])
        .args(&files)
        .output();
    let missing = match &out {
        Err(e) => Some(format!("cannot run python3 ({e})")),
        Ok(o) if String::from_utf8_lossy(&o.stderr).contains("No module named") => {
            Some("kubernetes-validate is not installed (pip install kubernetes-validate)".into())
        }
        Ok(_) => None,
    };
    if let Some(why) = missing {
        skip_unless_ci("kubernetes_manifests_validate_strictly", &why);
        return;
    }
    let out = out.unwrap();
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

/// The client Deployment asks the device plugin for both shares and sets up nothing that the
/// plugin hands out (no mount, no MPS_ variable); the plugin runs beside the daemon.
#[test]
fn the_client_deployment_asks_for_both_shares_and_leaves_the_rest_to_the_plugin() {
    let read = |path: &str| {
        let text = std::fs::read_to_string(root().join(path)).unwrap();
        text.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let deployment = read("deploy/kubernetes/example-client-deployment.yaml");
    for resource in ["mps-rs.github.io/gpu-memory:", "mps-rs.github.io/gpu-sm:"] {
        assert!(
            deployment.contains(resource),
            "the Deployment does not ask for {resource}"
        );
    }
    for handed_out in [
        "hostPath",
        "volumeMounts",
        "MPS_",
        "LD_LIBRARY_PATH",
        "nvidia.com/gpu",
    ] {
        assert!(
            !deployment.contains(handed_out),
            "the Deployment sets {handed_out}: the plugin hands that out"
        );
    }
    let daemonset = read("deploy/kubernetes/mps-daemonset.yaml");
    assert!(daemonset.contains("mps-device-plugin"));
    assert!(daemonset.contains("path: /var/lib/kubelet/device-plugins"));
}

/// A man page's text with roff's escapes of `-` undone.
fn man_page(name: &str) -> String {
    std::fs::read_to_string(root().join("docs/man").join(name))
        .unwrap()
        .replace("\\-", "-")
}

/// The long options a binary's `--help` lists.
fn long_options(bin: &std::path::Path) -> Vec<String> {
    let out = Command::new(bin).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    help.split_whitespace()
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(|w| w.trim_end_matches(',').to_string())
        .filter(|w| w != "--help" && w != "--version")
        .collect()
}

#[test]
fn the_man_pages_document_every_option_and_command() {
    for (bin, page) in [
        (server_bin(), "mps-server.1"),
        (control_bin(), "mps-control.1"),
    ] {
        let text = man_page(page);
        let options = long_options(&bin);
        assert!(options.len() >= 8, "{options:?}");
        for option in options {
            assert!(text.contains(&option), "{page} does not document {option}");
        }
    }
    // Every command the daemon's parser matches (`("name", [...]) =>` arms).
    let source = std::fs::read_to_string(root().join("mps-server/src/control/command.rs")).unwrap();
    let text = man_page("mps-control.1");
    let commands: Vec<&str> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(\""))
        .filter_map(|l| l.split('"').next())
        .filter(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_') && c.contains('_'))
        .collect();
    assert!(commands.len() >= 15, "{commands:?}");
    for command in commands {
        assert!(
            text.contains(command),
            "mps-control.1 does not document {command}"
        );
    }
}

/// Files that carry the version by nature (the Debian changelog, the pkg-config file, the man
/// pages, the Kubernetes image tags) must say the crates' version: a release that forgets one
/// fails here.
#[test]
fn shipped_files_carry_the_crates_version() {
    let version = env!("CARGO_PKG_VERSION");
    let read = |path: &str| std::fs::read_to_string(root().join(path)).unwrap();
    let first_line = read("deploy/debian/changelog");
    let first_line = first_line.lines().next().unwrap();
    assert!(
        first_line.starts_with(&format!("mps ({version}-")),
        "deploy/debian/changelog begins {first_line:?}, not with version {version}"
    );
    assert!(
        read("deploy/debian/mpsclient.pc")
            .lines()
            .any(|l| l == format!("Version: {version}")),
        "deploy/debian/mpsclient.pc does not say Version: {version}"
    );
    for page in [
        "docs/man/mps-control.1",
        "docs/man/mps-server.1",
        "docs/man/mps-run.1",
    ] {
        let th = read(page);
        let th = th.lines().next().unwrap();
        assert!(th.contains(&format!("\"mps {version}\"")), "{page}: {th}");
    }
    for manifest in [
        "deploy/kubernetes/mps-daemonset.yaml",
        "deploy/kubernetes/example-client-pod.yaml",
    ] {
        for image in read(manifest)
            .lines()
            .filter(|l| l.trim().starts_with("image:"))
        {
            assert!(
                image.ends_with(&format!(":{version}")),
                "{manifest}: {image}"
            );
        }
    }
}
