//! The v1 side: limits through the v1 files (cgroups-rs), `cpuset` inheritance for
//! co-mounted hierarchies, and the freezer.

use std::path::Path;
use std::time::{Duration, Instant};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::freezer::{FreezerController, FreezerState};
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::MaxValue;

use super::error::{Error, Result};
use super::{files, CgroupLimits, Controller};

/// Writes the limits whose controllers this hierarchy carries (`here`) into `dir`:
/// `memory.limit_in_bytes` and `memory.memsw.limit_in_bytes` (same value: no swap, when
/// swap accounting exists), `pids.max`, `cpu.cfs_quota_us` + `cpu.cfs_period_us`. The OOM
/// killer stays enabled (`memory.oom_control` untouched): the kernel kills the biggest
/// process and `memory.oom_control` counts it.
pub(super) fn apply_limits(dir: &Path, here: &[Controller], limits: &CgroupLimits) -> Result<()> {
    let set = |what, r: cgroups_rs::error::Result<()>| {
        r.map_err(|source| {
            tracing::error!(?source, dir = %dir.display(), what, "setting a v1 cgroup limit failed");
            Error::SetLimit {
                path: dir.to_path_buf(),
                what,
                source,
            }
        })
    };
    if let (Some(bytes), true) = (limits.memory_bytes, here.contains(&Controller::Memory)) {
        let mem = MemController::new(dir.to_path_buf(), false);
        let bytes = super::as_i64("memory", bytes)?;
        // memsw must stay >= the memory limit, so the memory limit goes first.
        set("memory.limit_in_bytes", mem.set_limit(bytes))?;
        if dir.join("memory.memsw.limit_in_bytes").exists() {
            set("memory.memsw.limit_in_bytes", mem.set_memswap_limit(bytes))?;
        }
    }
    if let (Some(n), true) = (limits.pids, here.contains(&Controller::Pids)) {
        let pids = PidController::new(dir.to_path_buf(), false);
        set(
            "pids.max",
            pids.set_pid_max(MaxValue::Value(super::as_i64("pids", n)?)),
        )?;
    }
    if let (Some((quota, period)), true) = (limits.cpu_quota, here.contains(&Controller::Cpu)) {
        let cpu = CpuController::new(dir.to_path_buf(), false);
        set(
            "cpu.cfs_quota_us",
            cpu.set_cfs_quota_and_period(Some(super::as_i64("cpu quota", quota)?), Some(period)),
        )?;
    }
    Ok(())
}

/// A new cgroup in a hierarchy with `cpuset` co-mounted starts with empty `cpuset.cpus`
/// and `cpuset.mems`, and no process can join it; copy the parent's.
pub(super) fn inherit_cpuset(parent: &Path, dir: &Path) -> Result<()> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mine = files::read(&dir.join(file))?;
        if mine.trim().is_empty() {
            let theirs = files::read(&parent.join(file))?;
            files::write(&dir.join(file), theirs.trim())?;
        }
    }
    Ok(())
}

/// Freezes the cgroup (and its descendants) and waits up to `timeout` for `FROZEN`.
/// Returns whether it got there; a cgroup stuck in `FREEZING` is still killed, just with
/// less certainty that nothing forks meanwhile.
pub(super) fn freeze(dir: &Path, timeout: Duration) -> Result<bool> {
    let freezer = FreezerController::new(dir.to_path_buf(), false);
    freezer.freeze().map_err(|source| Error::SetLimit {
        path: dir.to_path_buf(),
        what: "freezer.state",
        source,
    })?;
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        if let Ok(FreezerState::Frozen) = freezer.state() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Thaws the cgroup; killed processes then run to their death.
pub(super) fn thaw(dir: &Path) -> Result<()> {
    FreezerController::new(dir.to_path_buf(), false)
        .thaw()
        .map_err(|source| Error::SetLimit {
            path: dir.to_path_buf(),
            what: "freezer.state",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (f, v) in files {
            std::fs::write(d.path().join(f), v).unwrap();
        }
        d
    }

    fn read(d: &Path, f: &str) -> String {
        std::fs::read_to_string(d.join(f)).unwrap()
    }

    #[test]
    fn limits_go_into_the_v1_files() {
        let d = v1_dir(&[
            ("memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
            ("pids.max", "max\n"),
            ("cpu.cfs_quota_us", "-1\n"),
            ("cpu.cfs_period_us", "100000\n"),
        ]);
        let limits = CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(16),
            cpu_quota: Some((20_000, 50_000)),
        };
        let all = [Controller::Memory, Controller::Pids, Controller::Cpu];
        apply_limits(d.path(), &all, &limits).unwrap();
        assert_eq!(read(d.path(), "memory.limit_in_bytes"), "67108864");
        assert_eq!(read(d.path(), "memory.memsw.limit_in_bytes"), "67108864");
        assert_eq!(read(d.path(), "pids.max"), "16");
        assert_eq!(read(d.path(), "cpu.cfs_quota_us"), "20000");
        assert_eq!(read(d.path(), "cpu.cfs_period_us"), "50000");
    }

    #[test]
    fn only_this_hierarchys_controllers() {
        let d = v1_dir(&[("pids.max", "max\n")]);
        let limits = CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(8),
            cpu_quota: None,
        };
        apply_limits(d.path(), &[Controller::Pids], &limits).unwrap();
        assert_eq!(read(d.path(), "pids.max"), "8");
        assert!(!d.path().join("memory.limit_in_bytes").exists());
    }

    #[test]
    fn memsw_only_when_swap_accounting_exists() {
        let d = v1_dir(&[("memory.limit_in_bytes", "9223372036854771712\n")]);
        let limits = CgroupLimits {
            memory_bytes: Some(1 << 20),
            ..Default::default()
        };
        apply_limits(d.path(), &[Controller::Memory], &limits).unwrap();
        assert!(!d.path().join("memory.memsw.limit_in_bytes").exists());
    }

    #[test]
    fn cpuset_is_inherited_when_empty() {
        let parent = v1_dir(&[("cpuset.cpus", "0-3\n"), ("cpuset.mems", "0\n")]);
        let child = parent.path().join("child");
        std::fs::create_dir(&child).unwrap();
        std::fs::write(child.join("cpuset.cpus"), "\n").unwrap();
        std::fs::write(child.join("cpuset.mems"), "0\n").unwrap();
        inherit_cpuset(parent.path(), &child).unwrap();
        assert_eq!(read(&child, "cpuset.cpus"), "0-3");
        assert_eq!(read(&child, "cpuset.mems"), "0\n");
    }

    #[test]
    fn freezer_round_trip_on_files() {
        let d = v1_dir(&[("freezer.state", "THAWED\n")]);
        // A plain file reads back what was written, so FROZEN is "reached" at once.
        assert!(freeze(d.path(), Duration::from_millis(10)).unwrap());
        assert_eq!(read(d.path(), "freezer.state"), "FROZEN");
        thaw(d.path()).unwrap();
        assert_eq!(read(d.path(), "freezer.state"), "THAWED");
    }
}
