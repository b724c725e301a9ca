//! Groups of the configuration file against the real daemon, on the simulator (16 SMs a
//! server): limits that hold for all of a group's clients together, shown by `status`,
//! `get_server_list` and the metrics; who may join a group; and clients placed in a group by
//! their cgroup, read from a directory standing in for /proc, and from a real cgroup v2 where
//! the machine has one and the tests run as root.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::daemon::TestDaemon;
use common::*;
use mpsclient::{Client, Status};

const MIB: u64 = 1 << 20;

/// Writes `text` as `mps.toml` in a directory of its own; returns its path.
fn config_file(text: &str) -> PathBuf {
    let path = temp_dir("groups-config").join("mps.toml");
    write(&path, text);
    path
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// A daemon reading `config`, and reading clients' processes in `proc_root` if given.
fn daemon(config: &Path, proc_root: Option<&Path>) -> TestDaemon {
    let mut args = vec!["--config", config.to_str().unwrap()];
    if let Some(root) = proc_root {
        args.extend(["--proc-root", root.to_str().unwrap()]);
    }
    TestDaemon::start("groups", &args)
}

/// A stand-in for /proc where process `pid` is in cgroup `cgroup`.
fn fake_proc(pid: u32, cgroup: &str) -> PathBuf {
    let root = temp_dir("groups-proc");
    set_cgroup(&root, pid, cgroup);
    root
}

fn set_cgroup(root: &Path, pid: u32, cgroup: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("cgroup"), format!("0::{cgroup}\n")).unwrap();
}

/// The words `get_server_list` gives the server of group `group`.
fn listed(d: &TestDaemon, group: &str) -> String {
    let list = d.ctl_line("get_server_list");
    list.lines()
        .find(|l| l.contains(&format!("group={group} ")))
        .unwrap_or_else(|| panic!("no server of group {group}: {list}"))
        .to_string()
}

#[test]
fn a_groups_memory_limit_holds_for_all_its_clients_together() {
    const TEST: &str = "a_groups_memory_limit_holds_for_all_its_clients_together";
    if let Some(role) = role() {
        // A second client process of the group, beside the test's 5 MiB.
        assert_eq!(role, "second");
        let c = Client::connect(None).unwrap();
        let e = c.mem_alloc(4 * MIB).unwrap_err();
        assert_eq!(e.status, Status::QuotaExceeded, "{e}");
        assert!(e.message.contains("all the clients of this server"), "{e}");
        c.mem_alloc(3 * MIB).unwrap();
        return;
    }
    let path = config_file(
        "[groups.default]\ndevice_mem_limit = \"8MiB\"\nmax_clients = 3\n\
         client_device_mem_limit = \"6MiB\"\n",
    );
    let d = daemon(&path, None);
    let a = d.client();
    a.mem_alloc(5 * MIB).unwrap();
    d.run_role(TEST, "second", &[]);
    // What the second held goes back once the server sees it gone.
    wait_until(
        "the second client's memory to come back",
        || listed(&d, "default"),
        |l| l.contains(&format!("mem={}/", 5 * MIB)),
    );
    // Each client (process) is held to its own limit inside the group's.
    let e = a.mem_alloc(2 * MIB).unwrap_err();
    assert!(e.message.contains("process"), "{e}");
    let b = d.client();
    let pb = b.mem_alloc(MIB).unwrap();
    // Its use against its limits, in get_server_list, status and the metrics.
    let line = listed(&d, "default");
    assert!(
        line.contains(&format!("clients=2/3 mem={}/{}", 6 * MIB, 8 * MIB)),
        "{line}"
    );
    let status = d.ctl_line("status");
    assert!(status.contains("MAX-CLIENTS"), "{status}");
    let row = status
        .lines()
        .rev()
        .find(|l| l.starts_with("default "))
        .unwrap();
    let words: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        words[4..8],
        ["2", "3", &(6 * MIB).to_string(), &(8 * MIB).to_string()]
    );
    // The third connection is the last the group admits.
    let _c = d.client();
    let e = Client::connect(Some(&d.dir)).unwrap_err();
    assert!(e.message.contains("max-clients"), "{e}");
    // A lower limit on reload takes nothing held, and refuses the next allocation.
    write(
        &path,
        "[groups.default]\ndevice_mem_limit = \"2MiB\"\nmax_clients = 3\n",
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_until(
        "the group's new limit",
        || listed(&d, "default"),
        |l| l.contains(&format!("/{}", 2 * MIB)),
    );
    assert_eq!(b.mem_alloc(4096).unwrap_err().status, Status::QuotaExceeded);
    b.mem_free(pb).unwrap();
}

#[test]
fn a_groups_sm_share_and_another_groups_reservation_hold_for_all_their_clients() {
    if let Some(role) = role() {
        assert_eq!(role, "rt");
        let c = Client::connect(None).unwrap();
        let sm = c.sm_info().unwrap();
        if on_gpu() {
            // Whole green-context units from the device's first SM, about a quarter.
            assert!(
                sm.sms >= sm.device_sms / 5 && sm.sms < sm.device_sms / 2,
                "{sm:?}"
            );
        } else {
            assert_eq!((sm.sms, sm.device_sms), (4, 16), "25% of 16 SMs, reserved");
        }
        return;
    }
    let path = config_file(
        "[groups.default]\nactive_thread_percentage = 50\n\
         [groups.rt]\nsm_reservation = 25\n",
    );
    let d = daemon(&path, None);
    let (a, b) = (d.client(), d.client());
    let (sa, sb) = (a.sm_info().unwrap(), b.sm_info().unwrap());
    assert_eq!(sa, sb, "both clients run within the group's part");
    if on_gpu() {
        assert!(sa.sms < sa.device_sms * 3 / 5, "about half: {sa:?}");
    } else {
        assert_eq!(sa.sms, 8, "half of 16 SMs: {sa:?}");
    }
    d.run_role(
        "a_groups_sm_share_and_another_groups_reservation_hold_for_all_their_clients",
        "rt",
        &[("MPS_GROUP", "rt")],
    );
    // The share starts where the reservations end.
    let line = listed(&d, "default");
    assert!(
        line.contains(&format!("sms={} sm_range=25-75%", sa.sms)),
        "{line}"
    );
}

/// Starts `cmd` with its standard input and output piped; returns it and the first line it
/// writes that `said` accepts (its later lines are read and dropped).
fn spawn_until(
    mut cmd: std::process::Command,
    said: impl Fn(&str) -> bool,
) -> (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
    String,
) {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines
        .find_map(|l| l.ok().filter(|l| said(l)))
        .expect("the client ended without saying what was expected");
    (child, lines, line)
}

/// Microseconds since the epoch, to compare when two processes' kernels ran.
fn now_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// How long each block of the kernels of `reservations_of_two_groups_*` stays resident: with
/// four blocks per SM of the device on a quarter of its SMs, each kernel runs for several
/// times this, long enough for the two groups' kernels to overlap.
const RESIDENT_NS: u64 = 300_000_000;

#[test]
fn reservations_of_two_groups_keep_their_sms_apart_on_the_gpu() {
    const TEST: &str = "reservations_of_two_groups_keep_their_sms_apart_on_the_gpu";
    if let Some(role) = role() {
        // A client of a reserving group: it says its SMs, waits for its go, then runs a long
        // kernel and says which SMs its blocks ran on, and when.
        assert_eq!(role, "reserver");
        let c = Client::connect(None).unwrap();
        let sm = c.sm_info().unwrap();
        println!("ready sms={}", sm.sms);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::stdin().lock(), &mut line).unwrap();
        let start = now_us();
        let used = sms_used(&c, 4 * sm.device_sms, RESIDENT_NS);
        let end = now_us();
        let used: Vec<String> = used.iter().map(u32::to_string).collect();
        println!(
            "sms={} used={} from={start} to={end}",
            sm.sms,
            used.join(",")
        );
        return;
    }
    if !on_gpu() {
        return skip(TEST, "needs a GPU (MPS_TEST_BACKEND=cuda)");
    }
    // Two groups, each reserving a quarter of the SMs, served by two server processes (each
    // with its green context over its part); the default group runs on what they leave.
    let path =
        config_file("[groups.rsv-a]\nsm_reservation = 25\n[groups.rsv-b]\nsm_reservation = 25\n");
    let d = daemon(&path, None);
    let start = |group: &str| {
        spawn_until(d.role(TEST, "reserver", &[("MPS_GROUP", group)]), |l| {
            l.starts_with("ready ")
        })
    };
    let mut reservers = [start("rsv-a"), start("rsv-b")];
    let c = d.client();
    let device = c.sm_info().unwrap().device_sms;
    for (child, _, _) in &mut reservers {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    }
    // This process's client, of the default group, runs a kernel meanwhile too.
    let rest = sms_used(&c, 4 * device, RESIDENT_NS / 4);
    let mut said = Vec::new();
    for (mut child, mut lines, _) in reservers {
        let line = lines
            .find_map(|l| l.ok().filter(|l| l.starts_with("sms=")))
            .expect("a reserving client ended without saying which SMs it ran on");
        assert!(child.wait().unwrap().success(), "a reserving client failed");
        said.push(line);
    }
    // (SMs of its reservation, SMs its blocks ran on, when its kernel ran.)
    let read = |line: &str| {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {line}"))
        };
        let sms: u32 = field("sms=").parse().unwrap();
        let used: std::collections::BTreeSet<u32> = field("used=")
            .split(',')
            .map(|n| n.parse().unwrap())
            .collect();
        let when: (u128, u128) = (
            field("from=").parse().unwrap(),
            field("to=").parse().unwrap(),
        );
        (sms, used, when)
    };
    let (a, b) = (read(&said[0]), read(&said[1]));
    println!(
        "device {device} SMs: rsv-a reserved {} and ran on {}, rsv-b reserved {} and ran on {}, \
         the default group ran on {}; {}",
        a.0,
        a.1.len(),
        b.0,
        b.1.len(),
        rest.len(),
        d.ctl_line("get_server_list").replace('\n', "; ")
    );
    for (group, (sms, used, _)) in [("rsv-a", &a), ("rsv-b", &b)] {
        // Whole green-context units from its part's first SM, about a quarter.
        assert!(
            *sms >= device / 5 && *sms < device / 2,
            "{group}: 25% of {device} SMs gave {sms}"
        );
        assert!(
            used.len() as u32 <= *sms && used.len() as u32 > sms / 2,
            "{group}: with {sms} SMs reserved, {} blocks ran on {} SMs: {used:?}",
            4 * device,
            used.len()
        );
    }
    // The two kernels ran at once, each on SMs the other never touched.
    assert!(
        a.2.0.max(b.2.0) < a.2.1.min(b.2.1),
        "the two groups' kernels did not overlap: {said:?}"
    );
    let shared: Vec<&u32> = a.1.intersection(&b.1).collect();
    assert!(
        shared.is_empty(),
        "the two reservations' kernels shared SMs {shared:?}: {said:?}"
    );
    // And the default group, running meanwhile, stayed off both reservations.
    let trespassed: Vec<&u32> = rest
        .iter()
        .filter(|s| a.1.contains(s) || b.1.contains(s))
        .collect();
    assert!(
        trespassed.is_empty(),
        "the default group's kernel ran on reserved SMs {trespassed:?} ({} SMs in all)",
        rest.len()
    );
}

#[test]
fn rules_refuse_and_admit_by_uid_gid_and_cgroup() {
    let me = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let pid = std::process::id();
    let root = fake_proc(pid, "/team/job-1");
    let path = config_file(&format!("[groups.default]\nuids = [{}]\n", me + 1));
    let d = daemon(&path, Some(&root));
    let e = Client::connect(Some(&d.dir)).unwrap_err();
    assert_eq!(e.status, Status::PermissionDenied, "{e}");
    assert!(
        e.message
            .contains(&format!("group default admits uids [{}]", me + 1)),
        "{e}"
    );
    assert!(e.message.contains(&format!("uid {me}")), "{e}");
    drop(d);
    for rule in [
        format!("uids = [{me}]"),
        format!("gids = [{gid}]"),
        "cgroups = [\"/team\"]".to_string(),
    ] {
        let path = config_file(&format!("[groups.default]\n{rule}\n"));
        let d = daemon(&path, Some(&root));
        d.client()
            .mem_alloc(4096)
            .unwrap_or_else(|e| panic!("{rule}: {e}"));
    }
    // A cgroup that only starts like the rule's is not under it.
    let path = config_file("[groups.default]\ncgroups = [\"/tea\"]\n");
    let d = daemon(&path, Some(&root));
    let e = Client::connect(Some(&d.dir)).unwrap_err();
    assert!(e.message.contains("cgroup /team/job-1"), "{e}");
}

#[test]
fn a_cgroup_routed_to_a_group_places_its_processes_there_and_cannot_leave() {
    if let Some(role) = role() {
        // Another process of the same cgroup, asking for another group by name.
        let root = PathBuf::from(std::env::var("MPS_TEST_PROC").unwrap());
        set_cgroup(&root, std::process::id(), "/system.slice/train.service");
        let e = Client::connect(None).unwrap_err();
        assert_eq!(role, "escape");
        assert_eq!(e.status, Status::PermissionDenied, "{e}");
        assert!(
            e.message.contains("routed to group train") && e.message.contains("route_cgroups"),
            "{e}"
        );
        return;
    }
    let pid = std::process::id();
    let root = fake_proc(pid, "/system.slice/train.service");
    let path = config_file(
        "[groups.train]\nroute_cgroups = [\"/system.slice/train.service\"]\n\
         device_mem_limit = \"1MiB\"\nclient_priority = 1\n",
    );
    let d = daemon(&path, Some(&root));
    // No MPS_GROUP: the cgroup decides, and the group's limit holds.
    let c = d.client();
    assert_eq!(
        c.mem_alloc(2 * MIB).unwrap_err().status,
        Status::QuotaExceeded
    );
    assert_eq!(d.servers()[0].group, "train");
    // The group's priority holds for its new clients whatever the default becomes.
    d.ctl_line("set_default_client_priority 0");
    let _again = d.client();
    let pid = d.server_pids()[0].to_string();
    let clients = d.ctl_ok(&["get_client_list", &pid, "-v"]);
    assert_eq!(clients.matches("priority=1").count(), 2, "{clients}");
    d.run_role(
        "a_cgroup_routed_to_a_group_places_its_processes_there_and_cannot_leave",
        "escape",
        &[
            ("MPS_GROUP", "other"),
            ("MPS_TEST_PROC", root.to_str().unwrap()),
        ],
    );
    assert_eq!(d.servers().len(), 1, "no server for the group asked for");
}

/// A cgroup v2 hierarchy this process may make cgroups in, and the path of its root as
/// /proc/PID/cgroup writes it.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (fields, fstype) = l.split_once(" - ")?;
        let fields: Vec<&str> = fields.split_whitespace().collect();
        (fstype.starts_with("cgroup2 ") && fields.get(3) == Some(&"/"))
            .then(|| PathBuf::from(fields[4]))
    })
}

#[test]
fn processes_in_real_cgroups_are_routed_and_admitted_by_them() {
    const TEST: &str = "processes_in_real_cgroups_are_routed_and_admitted_by_them";
    if let Some(role) = role() {
        // Moves itself into the cgroup it is given, then connects.
        let cg = std::env::var("MPS_TEST_CGROUP").unwrap();
        std::fs::write(
            Path::new(&cg).join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .unwrap();
        let c = Client::connect(None);
        match role.as_str() {
            // Routed to team, whose limit holds.
            "member" => {
                let e = c.unwrap().mem_alloc(2 * MIB).unwrap_err();
                assert_eq!(e.status, Status::QuotaExceeded, "{e}");
            }
            // Admitted to closed by its cgroup.
            "insider" => c.unwrap().mem_alloc(2 * MIB).map(drop).unwrap(),
            _ => {
                let e = c.unwrap_err();
                assert_eq!(e.status, Status::PermissionDenied, "{e}");
                assert!(e.message.contains("group closed admits"), "{e}");
            }
        }
        return;
    }
    let Some(mount) = cgroup2_mount() else {
        return skip(TEST, "this machine has no cgroup v2 hierarchy mounted");
    };
    let name = format!("mps-test-{}", std::process::id());
    let dirs: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|x| mount.join(format!("{name}-{x}")))
        .collect();
    let made: Vec<bool> = dirs
        .iter()
        .map(|d| std::fs::create_dir(d).is_ok())
        .collect();
    if made.contains(&false) {
        for (dir, made) in dirs.iter().zip(made) {
            if made {
                let _ = std::fs::remove_dir(dir);
            }
        }
        return skip(
            TEST,
            "cannot make cgroups here (not root, or a read-only hierarchy)",
        );
    }
    let path = config_file(&format!(
        "[groups.team]\nroute_cgroups = [\"/{name}-a\"]\ndevice_mem_limit = \"1MiB\"\n\
         [groups.closed]\ncgroups = [\"/{name}-c\"]\n"
    ));
    let d = daemon(&path, None);
    let cgroup = |dir: &Path| [("MPS_TEST_CGROUP", dir.to_str().unwrap().to_string())];
    let run = |role: &str, dir: &Path, group: Option<&str>| {
        let mut env: Vec<(&str, String)> = cgroup(dir).into();
        env.extend(group.map(|g| ("MPS_GROUP", g.to_string())));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        d.run_role(TEST, role, &env);
    };
    run("member", &dirs[0], None);
    run("outsider", &dirs[1], Some("closed"));
    run("insider", &dirs[2], Some("closed"));
    let mut groups: Vec<String> = d.servers().into_iter().map(|s| s.group).collect();
    groups.sort();
    assert_eq!(groups, ["closed", "team"]);
    drop(d);
    for dir in dirs {
        wait_until(
            "the test's cgroup to empty",
            || std::fs::remove_dir(&dir).is_ok() || !dir.exists(),
            |gone| *gone,
        );
    }
}
