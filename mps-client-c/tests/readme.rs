//! The README's commands for building a C program against the library from the source tree, run
//! as they stand there (read from README.md, so that they cannot drift from what is tested), from
//! the repository root, against a server of this build.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The first `sh` block under the heading `heading` of a Markdown text.
fn commands_under(markdown: &str, heading: &str) -> Option<String> {
    let section = markdown.split_once(&format!("\n{heading}\n"))?.1;
    let section = section.split("\n## ").next()?;
    let block = section.split_once("```sh\n")?.1;
    Some(block.split_once("```")?.0.to_owned())
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `target/<profile>`, from this test executable's path (`target/<profile>/deps/..`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// An mps-server of this build (simulator backend) in a fresh pipe directory, killed on drop.
struct Server {
    dir: PathBuf,
    child: Child,
}

impl Server {
    fn start() -> Server {
        let mut build = Command::new(env!("CARGO"));
        build.args([
            "build",
            "--quiet",
            "-p",
            "mps-server",
            "--bin",
            "mps-server",
        ]);
        if target_dir().ends_with("release") {
            build.arg("--release");
        }
        assert!(build.current_dir(root()).status().unwrap().success());
        let dir = std::env::temp_dir().join(format!("mps-readme-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(target_dir().join("mps-server"))
            .args(["--backend", "sim", "--pipe-dir"])
            .arg(&dir)
            .arg("--log-dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mps-server");
        let mut server = Server { dir, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(server.dir.join("mps.sock")).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("mps-server exited at start ({status}):\n{}", server.log());
            }
            assert!(Instant::now() < deadline, "no server:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn the_readmes_c_build_commands_work_as_written() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let commands = commands_under(&readme, "## A C client")
        .expect("README.md has a ```sh block under '## A C client'");
    assert!(
        commands.contains("cargo build") && commands.contains("./vector_add"),
        "the README's block is not the build-and-run commands:\n{commands}"
    );
    let server = Server::start();
    // As a user runs them: from the repository root, into its target/ (not a target directory
    // this test run may have been given).
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &commands])
        .current_dir(root())
        .env("MPS_PIPE_DIRECTORY", &server.dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(root().join("vector_add"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("elements correct"),
        "the README's commands failed ({}):\n{commands}\nstdout:\n{stdout}\nstderr:\n{}\nserver log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
}

#[test]
fn the_commands_are_found_under_their_heading_only() {
    let md = "# t\n\n## A\n\n```sh\nfirst\n```\n\n## A C client\n\ntext\n\n```c\nint x;\n```\n\n```sh\nmake \\\n  it\n./run\n```\n\n```sh\nlater\n```\n\n## B\n\n```sh\nother\n```\n";
    assert_eq!(
        commands_under(md, "## A C client").unwrap(),
        "make \\\n  it\n./run\n"
    );
    assert_eq!(commands_under(md, "## None"), None);
    assert_eq!(
        commands_under(
            "## A C client\n\nno block\n\n## B\n\n```sh\nx\n```\n",
            "## A C client"
        ),
        None
    );
}
