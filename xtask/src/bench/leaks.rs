//! What a server holds on the host, to compare before and after a load: the processes of
//! its tree (walked through the ppid in `/proc/*/stat`), the `codebox*` cgroup
//! directories (its own are named `codebox-<its pid>-...`, see
//! src/sandbox/cgroup/naming.rs), the host's mount count, and open fds.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Deep enough for systemd's `user.slice/user-N.slice/user@N.service/app.slice/x.scope`.
const CGROUP_DEPTH: usize = 8;

#[derive(Clone, Debug)]
pub struct Snapshot {
    /// pid and start time of the server and every descendant.
    pub processes: Vec<(u32, u64)>,
    /// `codebox*` directories anywhere below /sys/fs/cgroup.
    pub cgroups_all: usize,
    /// The server's own sandbox cgroups, in every hierarchy.
    pub cgroups_server: usize,
    /// Lines of /proc/self/mountinfo (the host's mount namespace).
    pub mounts: usize,
    pub server_fds: usize,
    /// Open fds of the whole tree (the spawner keeps one set per sandbox).
    pub tree_fds: usize,
    /// The server's resident memory (KiB): shown, not checked (an allocator keeps what
    /// a load made it take).
    pub server_rss_kib: usize,
    /// CPU time (ms) of the tree: user and system time of every process in it, plus what
    /// each has reaped (a sandbox, once waited for, counts in its reaper's). The difference
    /// between two snapshots is what the server and its sandboxes cost in between,
    /// whatever else the machine runs.
    pub tree_cpu_ms: u64,
}

impl Snapshot {
    pub fn take(server_pid: u32) -> Snapshot {
        let processes = process_tree(server_pid);
        let (cgroups_all, ours) = codebox_cgroups(server_pid);
        Snapshot {
            cgroups_all,
            cgroups_server: ours.len(),
            mounts: std::fs::read_to_string("/proc/self/mountinfo")
                .map(|m| m.lines().count())
                .unwrap_or(0),
            server_fds: fd_count(server_pid),
            tree_fds: processes.iter().map(|(p, _)| fd_count(*p)).sum(),
            server_rss_kib: rss_kib(server_pid),
            tree_cpu_ms: processes.iter().map(|(p, _)| cpu_ms(*p)).sum(),
            processes,
        }
    }

    fn figures(&self) -> [(&'static str, usize); 6] {
        [
            ("processes in the server's tree", self.processes.len()),
            ("the server's cgroup dirs", self.cgroups_server),
            ("codebox* cgroup dirs (all)", self.cgroups_all),
            ("host mounts", self.mounts),
            ("server fds", self.server_fds),
            ("fds of the tree", self.tree_fds),
        ]
    }

    /// What grew from `self` to `after`, except the count of all `codebox*` cgroups,
    /// which other codebox processes on the host change too.
    pub fn grown(&self, after: &Snapshot) -> Vec<String> {
        self.figures()
            .iter()
            .zip(after.figures())
            .filter(|((name, b), (_, a))| *a > *b && !name.contains("(all)"))
            .map(|((name, b), (_, a))| format!("{name}: {b} -> {a}"))
            .collect()
    }

    pub fn print_against(&self, after: &Snapshot) {
        println!("{:34} {:>8} {:>8}", "", "before", "after");
        for ((name, b), (_, a)) in self.figures().iter().zip(after.figures()) {
            println!("{name:34} {b:>8} {a:>8}");
        }
        println!(
            "{:34} {:>8} {:>8}  (shown, not checked)",
            "server RSS (KiB)", self.server_rss_kib, after.server_rss_kib
        );
    }
}

/// utime + stime + cutime + cstime of `pid`, in ms (0 when it cannot be read).
fn cpu_ms(pid: u32) -> u64 {
    // SAFETY: sysconf takes an integer and returns one.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some((_, rest)) = text.rsplit_once(')') else {
        return 0;
    };
    // After the command: state is field 3; utime..cstime are fields 14-17.
    let sum: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    sum * 1000 / ticks
}

/// VmRSS of `pid` in KiB (0 when it cannot be read).
fn rss_kib(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Which of these processes still run (same pid and start time).
pub fn still_running(processes: &[(u32, u64)]) -> Vec<u32> {
    processes
        .iter()
        .filter(|(pid, start)| stat(*pid).is_some_and(|(_, s)| s == *start))
        .map(|(pid, _)| *pid)
        .collect()
}

/// The server's own sandbox cgroup directories.
pub fn server_cgroups(server_pid: u32) -> Vec<PathBuf> {
    codebox_cgroups(server_pid).1
}

/// `(ppid, start time)` from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the parenthesised command: state, ppid, ..., start time (field 22).
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

fn process_tree(root: u32) -> Vec<(u32, u64)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut starts = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((ppid, start)) = stat(pid) {
            children.entry(ppid).or_default().push(pid);
            starts.insert(pid, start);
        }
    }
    let mut tree = Vec::new();
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        if let Some(start) = starts.get(&pid) {
            tree.push((pid, *start));
            todo.extend(children.get(&pid).into_iter().flatten());
        }
    }
    tree
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The number of `codebox*` directories below /sys/fs/cgroup, and those of the server.
fn codebox_cgroups(server_pid: u32) -> (usize, Vec<PathBuf>) {
    let mut all = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), 0, &mut all);
    let prefix = format!("codebox-{server_pid}-");
    let ours = all
        .iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .cloned()
        .collect();
    (all.len(), ours)
}

fn walk(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) {
    if depth > CGROUP_DEPTH {
        return;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = e.path();
        if e.file_name().to_string_lossy().starts_with("codebox") {
            found.push(path.clone());
        }
        walk(&path, depth + 1, found);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_resident_size_and_cpu_time() {
        assert!(rss_kib(std::process::id()) > 0);
        // Work until the kernel has counted a tick of it (a bounded number of steps).
        let mut x = 1u64;
        let counted = (0..100_000).any(|_| {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
            cpu_ms(std::process::id()) > 0
        });
        assert!(counted, "no CPU time counted ({x})");
        assert_eq!(rss_kib(u32::MAX), 0);
    }

    #[test]
    fn this_process_is_its_own_tree() {
        let me = std::process::id();
        let tree = process_tree(me);
        assert_eq!(tree.first().map(|(p, _)| *p), Some(me));
        assert_eq!(still_running(&tree[..1]), vec![me]);
    }

    #[test]
    fn only_growth_counts_and_not_other_servers_cgroups() {
        let before = Snapshot {
            processes: vec![(1, 1), (2, 2)],
            cgroups_all: 4,
            cgroups_server: 2,
            mounts: 20,
            server_fds: 10,
            tree_fds: 30,
            server_rss_kib: 1000,
            tree_cpu_ms: 10,
        };
        let mut after = before.clone();
        after.processes.pop();
        after.cgroups_all = 9;
        after.server_rss_kib = 2000;
        assert!(before.grown(&after).is_empty());
        after.server_fds = 11;
        assert_eq!(before.grown(&after), vec!["server fds: 10 -> 11"]);
    }
}
