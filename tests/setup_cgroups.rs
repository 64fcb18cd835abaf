//! `codebox setup-cgroups` on the real host, as root: delegate cgroups to an unprivileged
//! user, run `codebox run --memory 64M` as that user inside the delegation (started by
//! root with `--enter`, and entered by the user alone on v1), see the limit hold and the
//! sandbox cgroup appear below the delegated directories, refuse to remove a delegation
//! in use, remove it, and refuse bad input (not root, unknown user, bad names, a
//! read-only hierarchy).
//!
//! Needs root (it creates the user `codebox-test` if missing, as `cargo xtask test`'s
//! rootless pass does, and writes the cgroup hierarchies): as anyone else it prints SKIP
//! and passes, even under `CODEBOX_TEST_STRICT=1` — the rootless pass runs this binary
//! too, and has nothing to test here. Missing user namespaces, rootfs or cgroups skip,
//! or fail when strict.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use codebox::sandbox::cgroup::delegate;
use codebox::sandbox::cgroup::Controller;

const USER: &str = "codebox-test";

/// Whether this test can run here; prints the reason when it cannot.
fn runnable(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {test}: setup-cgroups needs root (this is an unprivileged run)");
        return false;
    }
    if !common::sandbox_available(test) {
        return false;
    }
    let has_memory = delegate::at_roots(Path::new("/proc"), Path::new("/")).is_ok_and(|r| {
        r.parents
            .iter()
            .any(|p| p.controllers.contains(&Controller::Memory))
    });
    if !has_memory {
        let reason = "no mounted cgroup hierarchy has the memory controller";
        assert!(
            !common::strict(),
            "{test}: required feature missing: {reason}"
        );
        eprintln!("SKIP {test}: {reason}");
        return false;
    }
    true
}

/// The test user's uid, created like `cargo xtask test` creates it.
fn ensure_user() -> u32 {
    // One at a time: two `useradd` racing for the same new user (both tests start by
    // creating it on a fresh machine) can leave its home with one uid and the user with
    // another.
    static CREATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    let id = || Command::new("id").args(["-u", USER]).output().unwrap();
    let mut out = id();
    if !out.status.success() {
        let made = Command::new("useradd")
            .args(["--create-home", "--shell", "/bin/sh", USER])
            .status()
            .unwrap();
        assert!(made.success(), "useradd {USER} failed");
        out = id();
    }
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The binary and rootfs the test user runs: the build's own when the user can read
/// them, else copies in a world-readable temporary directory (removed on drop).
struct Readable {
    codebox: PathBuf,
    rootfs: PathBuf,
    staged: Option<tempfile::TempDir>,
}

impl Readable {
    fn new() -> Readable {
        let (codebox, rootfs) = (common::codebox_bin(), common::rootfs_dir());
        let readable = |p: &Path| {
            Command::new("runuser")
                .args(["-u", USER, "--", "test", "-r"])
                .arg(p)
                .status()
                .is_ok_and(|s| s.success())
        };
        if readable(&codebox) && readable(&rootfs.join(".manifest")) {
            return Readable {
                codebox,
                rootfs,
                staged: None,
            };
        }
        let dir = tempfile::Builder::new()
            .prefix("codebox-setup-cgroups-")
            .tempdir()
            .unwrap();
        eprintln!(
            "staging the binary and the rootfs in {}",
            dir.path().display()
        );
        let staged_bin = dir.path().join("codebox");
        common::copy_executable(&codebox, &staged_bin);
        let staged_rootfs = dir.path().join("rootfs");
        let copied = Command::new("cp")
            .arg("-a")
            .arg(&rootfs)
            .arg(&staged_rootfs)
            .status()
            .unwrap();
        assert!(copied.success(), "copying the rootfs failed");
        let chmod = Command::new("chmod")
            .args(["-R", "a+rX"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(chmod.success());
        Readable {
            codebox: staged_bin,
            rootfs: staged_rootfs,
            staged: Some(dir),
        }
    }

    /// `codebox ARGS` as root, with the rootfs the user can read.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.codebox);
        cmd.args(args)
            .env("CODEBOX_ROOTFS", &self.rootfs)
            .current_dir("/");
        cmd
    }

    /// `codebox ARGS` as the test user (its own HOME, the same rootfs).
    fn as_user(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", USER, "--", "env"])
            .arg(format!("HOME=/home/{USER}"))
            .arg(format!("CODEBOX_ROOTFS={}", self.rootfs.display()))
            .arg(&self.codebox)
            .args(args)
            .current_dir("/");
        cmd
    }
}

impl Drop for Readable {
    fn drop(&mut self) {
        if let Some(dir) = self.staged.take() {
            let _ = dir.close();
        }
    }
}

/// The delegated directories `name` would have on this host.
fn planned_dirs(name: &str, uid: u32) -> Vec<delegate::PlannedDir> {
    let roots = delegate::at_roots(Path::new("/proc"), Path::new("/")).unwrap();
    delegate::plan(&roots.parents, name, uid, uid).unwrap().dirs
}

/// Removes the delegation if a failed assertion left it, and ends the processes this
/// test started inside it.
struct Cleanup<'a> {
    readable: &'a Readable,
    name: String,
    children: Vec<Child>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self
            .readable
            .command(&[
                "setup-cgroups",
                "--user",
                USER,
                "--name",
                &self.name,
                "--remove",
            ])
            .output();
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A program that waits a moment (so the test can look at its cgroups) and then
/// allocates and touches 200 MB: more than the 64 MiB limit.
const BOMB: &str = "import time\ntime.sleep(1.5)\nx = bytearray(200 << 20)\nprint(len(x))\n";

/// The sandbox cgroups (`codebox-<pid>-…`) right below `dir`.
fn sandbox_dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("codebox-") && name != "codebox-supervisor"
        })
        .map(|e| e.path())
        .collect()
}

/// `codebox run --json --memory 64M python BOMB` as started by `cmd`; while it runs,
/// checks that its sandbox cgroup is below every delegated directory with the limit in
/// the memory one; then that it was OOM-killed and its cgroups are gone.
fn bomb_is_contained(cmd: &mut Command, dirs: &[delegate::PlannedDir]) {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        seen = dirs.iter().map(|d| sandbox_dirs(&d.dir)).collect();
        if seen.iter().all(|s| s.len() == 1) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let memory_limit: Vec<String> = dirs
        .iter()
        .zip(&seen)
        .filter(|(d, _)| d.controllers.contains(&Controller::Memory))
        .filter_map(|(d, s)| {
            let file = if d.version == 2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            std::fs::read_to_string(s.first()?.join(file)).ok()
        })
        .collect();
    let out = child.wait_with_output().unwrap();
    let all = text(&out);
    for (d, s) in dirs.iter().zip(&seen) {
        assert_eq!(
            s.len(),
            1,
            "no sandbox cgroup below {}: {all}",
            d.dir.display()
        );
    }
    assert_eq!(memory_limit, vec![format!("{}\n", 64 << 20)], "{all}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON result ({e}): {all}"));
    assert_eq!(result["oom_killed"], true, "{all}");
    assert_eq!(
        result["stdout"], "",
        "the allocation must not succeed: {all}"
    );
    for d in dirs {
        assert!(
            sandbox_dirs(&d.dir).is_empty(),
            "left below {}",
            d.dir.display()
        );
    }
}

#[test]
fn setup_then_a_rootless_run_with_limits_then_remove() {
    const TEST: &str = "setup_then_a_rootless_run_with_limits_then_remove";
    if !runnable(TEST) {
        return;
    }
    let uid = ensure_user();
    let readable = Readable::new();
    let name = format!("codebox-test-setup-{}", std::process::id());
    let mut cleanup = Cleanup {
        readable: &readable,
        name: name.clone(),
        children: Vec::new(),
    };
    let dirs = planned_dirs(&name, uid);
    let setup = ["setup-cgroups", "--user", USER, "--name", name.as_str()];

    // 1. Set up, twice: every hierarchy named, the user owns each directory.
    let first = ok(&mut readable.command(&setup));
    for d in &dirs {
        assert!(
            first.contains(&d.dir.display().to_string()),
            "{} not reported:\n{first}",
            d.dir.display()
        );
        assert_eq!(std::fs::metadata(&d.dir).unwrap().uid(), uid);
    }
    assert!(
        first.contains("created") && first.contains("--enter --"),
        "{first}"
    );
    let second = ok(&mut readable.command(&setup));
    assert!(!second.contains("created"), "{second}");
    assert!(second.contains("already there"), "{second}");

    // 2. Root starts a command inside it as the user.
    let mut enter: Vec<&str> = setup.to_vec();
    enter.extend(["--enter", "--", "sh", "-c", "id -u; cat /proc/self/cgroup"]);
    let inside = ok(&mut readable.command(&enter));
    assert!(inside.starts_with(&format!("{uid}\n")), "{inside}");
    for d in &dirs {
        let entered = inside.lines().any(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next(), fields.next(), fields.next());
            let controllers: Vec<&str> = controllers.unwrap_or("").split(',').collect();
            if d.version == 2 {
                controllers == [""]
                    && path == Some(&format!("{}/codebox-supervisor", d.cgroup_path))
            } else {
                path == Some(&d.cgroup_path)
                    && d.controllers
                        .iter()
                        .all(|c| controllers.contains(&c.name()))
            }
        });
        assert!(entered, "{} not entered:\n{inside}", d.hierarchy());
    }

    // 3. The user's `codebox run` in it, started by root: the limit holds.
    let mut run: Vec<&str> = setup.to_vec();
    let codebox = readable.codebox.to_str().unwrap();
    run.extend(["--enter", "--", codebox, "run", "--json", "--memory", "64M"]);
    run.extend(["python", "-c", BOMB]);
    bomb_is_contained(&mut readable.command(&run), &dirs);

    // 4. The user alone enters the v1 part (v2 needs root) and runs the same.
    let v1: Vec<delegate::PlannedDir> = dirs.iter().filter(|d| d.version == 1).cloned().collect();
    let own = ["setup-cgroups", "--name", name.as_str(), "--enter", "--"];
    let mut args = own.to_vec();
    args.extend([
        codebox, "run", "--json", "--memory", "64M", "python", "-c", BOMB,
    ]);
    bomb_is_contained(&mut readable.as_user(&args), &v1);

    // 5. Not removed while a process is inside; nothing is removed then.
    let mut sleep: Vec<&str> = setup.to_vec();
    sleep.extend(["--enter", "--", "sleep", "60"]);
    let child = readable.command(&sleep).spawn().unwrap();
    let pid = child.id() as i32;
    cleanup.children.push(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(dirs[0].entry())
        .unwrap_or_default()
        .contains(&pid.to_string())
    {
        assert!(Instant::now() < deadline, "the sleep never entered");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut remove: Vec<&str> = setup.to_vec();
    remove.push("--remove");
    let refused = readable.command(&remove).output().unwrap();
    let refused_text = text(&refused);
    assert_eq!(refused.status.code(), Some(125), "{refused_text}");
    assert!(
        refused_text.contains(&format!("in use by processes [{pid}]")),
        "{refused_text}"
    );
    assert!(dirs.iter().all(|d| d.dir.is_dir()), "{refused_text}");
    for mut child in cleanup.children.drain(..) {
        child.kill().unwrap();
        child.wait().unwrap();
    }

    // 6. Removed: nothing left in any hierarchy; removing again is fine.
    let removed = ok(&mut readable.command(&remove));
    assert!(removed.contains("removed the delegation"), "{removed}");
    for d in &dirs {
        assert!(!d.dir.exists(), "{} is left", d.dir.display());
    }
    let again = ok(&mut readable.command(&remove));
    assert!(again.contains("nothing to remove"), "{again}");
}

#[test]
fn bad_input_is_refused_clearly() {
    const TEST: &str = "bad_input_is_refused_clearly";
    if !runnable(TEST) {
        return;
    }
    let uid = ensure_user();
    let readable = Readable::new();
    let name = format!("codebox-test-refused-{}", std::process::id());
    let refused = |cmd: &mut Command, expected: &str| {
        let out = cmd.output().unwrap();
        let all = text(&out);
        assert_eq!(out.status.code(), Some(125), "{all}");
        assert!(all.contains(expected), "{expected:?} not in:\n{all}");
    };
    refused(
        &mut readable.as_user(&["setup-cgroups", "--user", USER]),
        "must run as root",
    );
    refused(
        &mut readable.command(&["setup-cgroups", "--user", "no-such-user-codebox"]),
        "unknown user \"no-such-user-codebox\"",
    );
    refused(
        &mut readable.command(&["setup-cgroups", "--user", "root"]),
        "root needs no delegated cgroups",
    );
    for bad in ["a/b", "..", "../etc"] {
        refused(
            &mut readable.command(&["setup-cgroups", "--user", USER, "--name", bad]),
            &format!("invalid cgroup directory name {bad:?}"),
        );
    }
    // A hierarchy mounted read-only (in a mount namespace of the command's own) is
    // named, and nothing is created anywhere.
    let dirs = planned_dirs(&name, uid);
    let ro = dirs.iter().find(|d| d.version == 1).unwrap_or(&dirs[0]);
    let script = format!(
        "mount -o remount,bind,ro {} && exec \"$0\" setup-cgroups --user {USER} --name {name}",
        ro.parent.display()
    );
    refused(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .arg(&readable.codebox),
        &format!(
            "the {} hierarchy at {} is mounted read-only",
            ro.hierarchy(),
            ro.parent.display()
        ),
    );
    for d in &dirs {
        assert!(!d.dir.exists(), "{} was created", d.dir.display());
    }
    // Someone else's directory is not taken over.
    std::fs::create_dir(&dirs[0].dir).unwrap();
    std::os::unix::fs::chown(&dirs[0].dir, Some(uid + 1), None).unwrap();
    let taken = readable
        .command(&["setup-cgroups", "--user", USER, "--name", &name])
        .output()
        .unwrap();
    std::fs::remove_dir(&dirs[0].dir).unwrap();
    let all = text(&taken);
    assert_eq!(taken.status.code(), Some(125), "{all}");
    assert!(all.contains("belongs to uid"), "{all}");
    for d in &dirs {
        let _ = std::fs::remove_dir(&d.dir);
    }
}
