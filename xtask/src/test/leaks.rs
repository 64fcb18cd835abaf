//! The whole-run leak check: after every test, nothing a sandbox or a server left behind.
//!
//! A snapshot is taken before the tests and compared after them (waiting up to 15 s for
//! stragglers that are still being torn down):
//! - processes: none new in a pid namespace other than ours (a sandbox's init or program)
//!   and no `codebox` process still running (a server or spawner a test forgot);
//! - cgroups: no new `codebox-*` directory anywhere below this process's own cgroup, in
//!   every mounted hierarchy (v2 and v1);
//! - temporary files: no new entry in /tmp or /var/tmp.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// What existed before the tests ran.
pub struct Snapshot {
    processes: BTreeSet<String>,
    cgroups: BTreeSet<PathBuf>,
    temp: BTreeSet<PathBuf>,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        Snapshot {
            processes: suspect_processes().into_iter().collect(),
            cgroups: codebox_cgroups().into_iter().collect(),
            temp: temp_entries().into_iter().collect(),
        }
    }

    /// Fails with the list of what is left, after a grace period for teardown.
    pub fn check_nothing_left(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let left = self.left_over();
            if left.is_empty() {
                println!("leak check: no sandbox process, cgroup or temporary file left");
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("left behind after the test run:\n  {}", left.join("\n  "));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn left_over(&self) -> Vec<String> {
        let mut left = Vec::new();
        for p in suspect_processes() {
            if !self.processes.contains(&p) {
                left.push(format!("process {p}"));
            }
        }
        for c in codebox_cgroups() {
            if !self.cgroups.contains(&c) {
                left.push(format!("cgroup {}", c.display()));
            }
        }
        for t in temp_entries() {
            if !self.temp.contains(&t) {
                left.push(format!("temporary file {}", t.display()));
            }
        }
        left
    }
}

/// "pid (start time) cmdline" of processes in another pid namespace, or running a
/// `codebox` binary.
fn suspect_processes() -> Vec<String> {
    let me = std::process::id().to_string();
    let my_ns = std::fs::read_link("/proc/self/ns/pid").ok();
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) || pid == me {
            continue;
        }
        let dir = entry.path();
        let ns = std::fs::read_link(dir.join("ns/pid")).ok();
        let exe = std::fs::read_link(dir.join("exe")).ok();
        let foreign_ns = ns.is_some() && ns != my_ns;
        let codebox = exe
            .as_deref()
            .and_then(Path::file_name)
            .is_some_and(|n| n == "codebox");
        if !(foreign_ns || codebox) {
            continue;
        }
        let cmdline = std::fs::read(dir.join("cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        // Field 22 of stat (after the parenthesised name) is the start time: a reused
        // pid is a different process.
        let start = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(19).map(str::to_string))
            })
            .unwrap_or_default();
        found.push(format!("{pid} ({start}) {}", cmdline.trim()));
    }
    found
}

/// Every `codebox-*` directory below this process's cgroup, in every hierarchy.
fn codebox_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for root in own_cgroup_dirs() {
        walk(&root, 0, &mut found);
    }
    found
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    if depth > 4 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = e.path();
        if e.file_name().to_string_lossy().starts_with("codebox-") {
            found.push(path.clone());
        }
        walk(&path, depth + 1, found);
    }
}

/// This process's cgroup directory in each mounted hierarchy.
fn own_cgroup_dirs() -> Vec<PathBuf> {
    let (Ok(cgroups), Ok(mounts)) = (
        std::fs::read_to_string("/proc/self/cgroup"),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let wanted: Vec<&str> = ctrls.split(',').filter(|c| !c.is_empty()).collect();
        let mount = super::delegate::mount_point(&mounts, |fstype, opts| {
            if id == "0" {
                fstype == "cgroup2"
            } else {
                fstype == "cgroup"
                    && !wanted.is_empty()
                    && wanted.iter().all(|c| opts.split(',').any(|o| o == *c))
            }
        });
        if let Some(m) = mount {
            dirs.push(m.join(path.trim_start_matches('/')));
        }
    }
    dirs
}

fn temp_entries() -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in ["/tmp", "/var/tmp"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            found.extend(entries.flatten().map(|e| e.path()));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_temporary_file_is_reported_and_its_removal_clears_it() {
        let before = Snapshot::take();
        let dir = tempfile::Builder::new()
            .prefix("codebox-leak-check-")
            .tempdir_in("/tmp")
            .unwrap();
        let left = before.left_over();
        assert!(
            left.iter().any(|l| l.contains("codebox-leak-check-")),
            "{left:?}"
        );
        drop(dir);
        assert!(!before
            .left_over()
            .iter()
            .any(|l| l.contains("codebox-leak-check-")));
    }

    #[test]
    fn own_cgroup_dirs_exist() {
        for d in own_cgroup_dirs() {
            assert!(d.is_dir(), "{}", d.display());
        }
    }
}
