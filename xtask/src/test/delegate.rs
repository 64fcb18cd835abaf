//! Delegating cgroups to the rootless test user, as an administrator (or systemd's
//! `Delegate=yes`) would: one directory below root's own cgroup in every hierarchy codebox
//! uses, owned by the user, with the test process moved in before it drops privileges.
//!
//! For each line of `/proc/self/cgroup`: `0::<path>` is the v2 hierarchy (at the cgroup2
//! mount point); `N:<controllers>:<path>` is a v1 hierarchy, used when it carries memory,
//! pids, cpu, cpuacct or freezer. codebox then creates its sandbox cgroups below these.
//!
//! `codebox setup-cgroups` (library: `codebox::sandbox::cgroup::delegate`) does the same
//! for administrators, but at the top of each hierarchy. This pass keeps its own copy
//! below root's own cgroups on purpose: xtask cannot link the crate, and the leak check
//! (`leaks.rs`) walks what lies below this process's cgroups, which on the development
//! machine's memory hierarchy (`/process_api/<id>`) the top is not.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// Delegated directories; removed on drop (a directory still busy is reported as a leak).
pub struct Delegation {
    dirs: Vec<PathBuf>,
}

impl Delegation {
    pub fn create(name: &str, uid: u32, gid: u32) -> Result<Delegation> {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup")?;
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
        let mut dirs = Vec::new();
        for line in cgroups.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            let (mount, v2) = if id == "0" {
                match mount_point(&mounts, |fstype, _| fstype == "cgroup2") {
                    Some(m) => (m, true),
                    None => continue,
                }
            } else {
                let wanted: Vec<&str> = ctrls.split(',').collect();
                if !wanted.iter().any(|c| V1_CONTROLLERS.contains(c)) {
                    continue;
                }
                let found = mount_point(&mounts, |fstype, opts| {
                    fstype == "cgroup" && wanted.iter().all(|c| opts.split(',').any(|o| o == *c))
                });
                match found {
                    Some(m) => (m, false),
                    None => continue,
                }
            };
            let dir = mount.join(rel).join(name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    println!("(not delegating {}: {e})", dir.display());
                    continue;
                }
            }
            let mut owned = vec![dir.clone(), dir.join("cgroup.procs")];
            if v2 {
                owned.push(dir.join("cgroup.threads"));
                owned.push(dir.join("cgroup.subtree_control"));
            } else {
                owned.push(dir.join("tasks"));
            }
            for p in owned.iter().filter(|p| p.exists()) {
                std::os::unix::fs::chown(p, Some(uid), Some(gid))
                    .with_context(|| format!("chown {}", p.display()))?;
            }
            dirs.push(dir);
        }
        println!("delegated cgroups: {}", dirs.len());
        Ok(Delegation { dirs })
    }

    /// Makes `cmd` move itself into every delegated cgroup right before it execs.
    pub fn enter_on_exec(&self, cmd: &mut Command) -> Result<()> {
        let procs: Vec<File> = self
            .dirs
            .iter()
            .map(|d| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(d.join("cgroup.procs"))
                    .with_context(|| format!("open {}/cgroup.procs", d.display()))
            })
            .collect::<Result<_>>()?;
        let fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
        // SAFETY: the closure runs between fork and exec in the child; it only calls
        // getpid and write(2) on descriptors opened before the fork, formatting the pid
        // into a stack buffer (no allocation, no locks).
        unsafe {
            cmd.pre_exec(move || {
                let _keep = &procs;
                let mut buf = [0u8; 16];
                let mut n = libc::getpid() as u32;
                let mut i = buf.len();
                loop {
                    i -= 1;
                    buf[i] = b'0' + (n % 10) as u8;
                    n /= 10;
                    if n == 0 {
                        break;
                    }
                }
                for fd in &fds {
                    if libc::write(*fd, buf[i..].as_ptr().cast(), buf.len() - i) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        Ok(())
    }
}

impl Drop for Delegation {
    fn drop(&mut self) {
        // Sandboxes of the last test may still be tearing down (a killed server's
        // cgroups go with its spawner): give them a moment before calling it a leak.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for d in &self.dirs {
            let result = loop {
                // A container runtime that joined the directory may have removed it.
                match std::fs::remove_dir(d) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break Ok(()),
                    Err(_) if std::time::Instant::now() < until => {
                        std::thread::sleep(std::time::Duration::from_millis(100));
                    }
                    other => break other,
                }
            };
            if let Err(e) = result {
                eprintln!(
                    "LEAK: cannot remove delegated cgroup {}: {e}; it holds:{}",
                    d.display(),
                    contents(d)
                );
            }
        }
    }
}

/// What keeps a cgroup directory busy: its child cgroups and its processes (with their
/// command lines), each on a line of its own.
fn contents(dir: &Path) -> String {
    let mut out = String::new();
    for entry in walkdir(dir) {
        let procs = std::fs::read_to_string(entry.join("cgroup.procs")).unwrap_or_default();
        out.push_str(&format!("\n    {}", entry.display()));
        for pid in procs.split_whitespace() {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            out.push_str(&format!("\n      pid {pid}: {}", cmdline.trim()));
        }
    }
    out
}

/// `dir` and every directory below it.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut found = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < found.len() {
        if let Ok(entries) = std::fs::read_dir(&found[i]) {
            found.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        i += 1;
    }
    found
}

/// The mount point of the first mount whose (fstype, super options) match.
pub(super) fn mount_point(
    mountinfo: &str,
    matches: impl Fn(&str, &str) -> bool,
) -> Option<PathBuf> {
    for line in mountinfo.lines() {
        let (left, right) = line.split_once(" - ")?;
        let mount = left.split(' ').nth(4)?;
        let mut r = right.split(' ');
        let (fstype, _source, opts) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        if matches(fstype, opts) {
            return Some(Path::new(mount).to_path_buf());
        }
    }
    None
}
