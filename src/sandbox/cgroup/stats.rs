//! What a run used and which limits it hit, read from the sandbox cgroup's files.
//!
//! | figure | v2 | v1 |
//! |---|---|---|
//! | peak memory | `memory.peak` (5.19+) | `memory.max_usage_in_bytes` |
//! | CPU time | `cpu.stat` `usage_usec` (core, no controller needed) | `cpuacct.usage` (ns) |
//! | OOM kill | `memory.events` `oom_kill`/`oom_group_kill` > 0 | `memory.oom_control` `oom_kill` > 0 |
//! | pids limit hit | `pids.events` `max` > 0 | `pids.events` `max` > 0 |
//!
//! A missing file (older kernel, controller not present) gives `None`/`false`, not an error.

use std::path::Path;

use serde::Serialize;

use super::error::Result;
use super::files;

/// Per-run figures from the sandbox cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CgroupStats {
    /// Highest memory use of the cgroup, in bytes (`None` when the kernel does not say).
    pub peak_memory_bytes: Option<u64>,
    /// CPU time used by all its processes, user + system, in microseconds.
    pub cpu_usec: Option<u64>,
    /// The kernel's OOM killer killed a process of the cgroup (the memory limit was hit).
    pub oom_killed: bool,
    /// A `fork`/`clone` failed because the pids limit was reached.
    pub pids_limited: bool,
}

impl CgroupStats {
    /// The figures of a sandbox cgroup from its directories alone (one per hierarchy, as
    /// the spawner reports them), for a process that does not hold its handle: each
    /// figure from the directory that has its file.
    pub fn read_dirs(dirs: &[std::path::PathBuf]) -> Result<CgroupStats> {
        let mut out = CgroupStats::default();
        for dir in dirs {
            if dir.join("memory.peak").exists() || dir.join("memory.events").exists() {
                (out.peak_memory_bytes, out.oom_killed) = memory_v2(dir)?;
            } else if dir.join("memory.max_usage_in_bytes").exists() {
                (out.peak_memory_bytes, out.oom_killed) = memory_v1(dir)?;
            }
            // v2's cpu.stat has usage_usec; v1's cpu.stat does not (cpuacct.usage has it).
            if out.cpu_usec.is_none() {
                out.cpu_usec = match cpu_v2(dir)? {
                    Some(usec) => Some(usec),
                    None => cpu_v1(dir)?,
                };
            }
            out.pids_limited |= pids_limited(dir)?;
        }
        Ok(out)
    }
}

/// Peak memory and OOM kills on a v2 cgroup.
pub(super) fn memory_v2(dir: &Path) -> Result<(Option<u64>, bool)> {
    let peak = optional_single(&dir.join("memory.peak"))?;
    let events = dir.join("memory.events");
    let oom = match files::read_optional(&events)? {
        Some(text) => {
            files::keyed_value(&events, &text, "oom_kill")?.unwrap_or(0) > 0
                || files::keyed_value(&events, &text, "oom_group_kill")?.unwrap_or(0) > 0
        }
        None => false,
    };
    Ok((peak, oom))
}

/// Peak memory and OOM kills on a v1 memory cgroup.
pub(super) fn memory_v1(dir: &Path) -> Result<(Option<u64>, bool)> {
    let peak = optional_single(&dir.join("memory.max_usage_in_bytes"))?;
    let control = dir.join("memory.oom_control");
    let oom = match files::read_optional(&control)? {
        Some(text) => files::keyed_value(&control, &text, "oom_kill")?.unwrap_or(0) > 0,
        None => false,
    };
    Ok((peak, oom))
}

/// CPU time in µs from a v2 cgroup's `cpu.stat`.
pub(super) fn cpu_v2(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join("cpu.stat");
    match files::read_optional(&path)? {
        Some(text) => files::keyed_value(&path, &text, "usage_usec"),
        None => Ok(None),
    }
}

/// CPU time in µs from a v1 cgroup's `cpuacct.usage` (nanoseconds).
pub(super) fn cpu_v1(dir: &Path) -> Result<Option<u64>> {
    Ok(optional_single(&dir.join("cpuacct.usage"))?.map(|ns| ns / 1000))
}

/// Whether `pids.events` counts a fork refused by the limit (same format on v1 and v2).
pub(super) fn pids_limited(dir: &Path) -> Result<bool> {
    let path = dir.join("pids.events");
    Ok(match files::read_optional(&path)? {
        Some(text) => files::keyed_value(&path, &text, "max")?.unwrap_or(0) > 0,
        None => false,
    })
}

fn optional_single(path: &Path) -> Result<Option<u64>> {
    match files::read_optional(path)? {
        Some(text) => files::single_value(path, &text).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn v2_files() {
        let d = dir_with(&[
            ("memory.peak", "67108864\n"),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 230\noom 1\noom_kill 1\noom_group_kill 0\n",
            ),
            (
                "cpu.stat",
                "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\n",
            ),
            ("pids.events", "max 3\n"),
        ]);
        assert_eq!(memory_v2(d.path()).unwrap(), (Some(67_108_864), true));
        assert_eq!(cpu_v2(d.path()).unwrap(), Some(123_456));
        assert!(pids_limited(d.path()).unwrap());
    }

    #[test]
    fn figures_from_the_directories_alone() {
        // Hybrid: a controller-less v2 directory, then v1 memory, cpu, cpuacct, pids.
        let v2 = dir_with(&[
            ("cpu.stat", "usage_usec 900\n"),
            ("cgroup.events", "populated 0\n"),
        ]);
        let memory = dir_with(&[
            ("memory.max_usage_in_bytes", "4096\n"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
            ),
        ]);
        let cpu = dir_with(&[("cpu.stat", "nr_periods 1\nnr_throttled 0\n")]);
        let pids = dir_with(&[("pids.events", "max 2\n")]);
        let dirs: Vec<_> = [&v2, &memory, &cpu, &pids]
            .iter()
            .map(|d| d.path().to_path_buf())
            .collect();
        let stats = CgroupStats::read_dirs(&dirs).unwrap();
        assert_eq!(stats.peak_memory_bytes, Some(4096));
        assert_eq!(stats.cpu_usec, Some(900));
        assert!(!stats.oom_killed && stats.pids_limited);
        // v1 only: CPU from cpuacct.usage (ns).
        let cpuacct = dir_with(&[("cpuacct.usage", "5000000\n")]);
        let dirs = [
            memory.path().to_path_buf(),
            cpu.path().to_path_buf(),
            cpuacct.path().to_path_buf(),
        ];
        assert_eq!(CgroupStats::read_dirs(&dirs).unwrap().cpu_usec, Some(5000));
    }

    #[test]
    fn v2_quiet_run_and_old_kernel() {
        let d = dir_with(&[
            ("memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"),
            ("pids.events", "max 0\n"),
        ]);
        // No memory.peak before 5.19, no cpu.stat in a fake tree.
        assert_eq!(memory_v2(d.path()).unwrap(), (None, false));
        assert_eq!(cpu_v2(d.path()).unwrap(), None);
        assert!(!pids_limited(d.path()).unwrap());
    }

    #[test]
    fn v1_files() {
        let d = dir_with(&[
            ("memory.max_usage_in_bytes", "5001216\n"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            ),
            ("cpuacct.usage", "2500000\n"),
            ("pids.events", "max 0\n"),
        ]);
        assert_eq!(memory_v1(d.path()).unwrap(), (Some(5_001_216), true));
        assert_eq!(cpu_v1(d.path()).unwrap(), Some(2500));
        assert!(!pids_limited(d.path()).unwrap());
    }

    #[test]
    fn garbage_is_an_error_with_the_path() {
        let d = dir_with(&[("memory.peak", "lots\n")]);
        let err = memory_v2(d.path()).unwrap_err().to_string();
        assert!(err.contains("memory.peak"), "{err}");
    }
}
