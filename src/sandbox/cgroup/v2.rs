//! The v2 side: limits (through cgroups-rs), the directory fd for `CLONE_INTO_CGROUP`,
//! `cgroup.kill`, `cgroup.events`, and enabling controllers for a delegated subtree.

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use cgroups_rs::cpu::CpuController;
use cgroups_rs::memory::MemController;
use cgroups_rs::pid::PidController;
use cgroups_rs::MaxValue;

use super::error::{Error, Result};
use super::{files, CgroupLimits, Controller};

/// Writes the limits whose controllers are enabled on v2 (`on_v2`) into `dir`:
/// `memory.max` and `memory.swap.max = 0`, `pids.max`, `cpu.max`.
pub(super) fn apply_limits(dir: &Path, on_v2: &[Controller], limits: &CgroupLimits) -> Result<()> {
    let set = |what, r: cgroups_rs::error::Result<()>| {
        r.map_err(|source| {
            tracing::error!(?source, dir = %dir.display(), what, "setting a v2 cgroup limit failed");
            Error::SetLimit {
                path: dir.to_path_buf(),
                what,
                source,
            }
        })
    };
    if let (Some(bytes), true) = (limits.memory_bytes, on_v2.contains(&Controller::Memory)) {
        let mem = MemController::new(dir.to_path_buf(), true);
        set("memory.max", mem.set_limit(super::as_i64("memory", bytes)?))?;
        // No swap: the limit is the limit. Absent when swap accounting is off.
        if dir.join("memory.swap.max").exists() {
            set("memory.swap.max", mem.set_memswap_limit(0))?;
        }
    }
    if let (Some(n), true) = (limits.pids, on_v2.contains(&Controller::Pids)) {
        let pids = PidController::new(dir.to_path_buf(), true);
        set(
            "pids.max",
            pids.set_pid_max(MaxValue::Value(super::as_i64("pids", n)?)),
        )?;
    }
    if let (Some((quota, period)), true) = (limits.cpu_quota, on_v2.contains(&Controller::Cpu)) {
        let cpu = CpuController::new(dir.to_path_buf(), true);
        set(
            "cpu.max",
            cpu.set_cfs_quota_and_period(Some(super::as_i64("cpu quota", quota)?), Some(period)),
        )?;
    }
    Ok(())
}

/// An `O_DIRECTORY` fd of the cgroup, for `clone_args.cgroup`.
pub(super) fn open_dir(dir: &Path) -> Result<OwnedFd> {
    let open_err = |source| Error::Open {
        path: dir.to_path_buf(),
        source,
    };
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| open_err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // SAFETY: open(2) with a valid NUL-terminated path and flags; no memory is shared.
    let fd = unsafe {
        libc::open(
            c_path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(open_err(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by open(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Writes `1` to `cgroup.kill`: SIGKILL to every process of the subtree, atomically with
/// respect to forks (5.14+). `Ok(false)` when the kernel has no `cgroup.kill`.
pub(super) fn kill(dir: &Path) -> Result<bool> {
    let path = dir.join("cgroup.kill");
    match files::write_io(&path, "1") {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(Error::Write {
            path,
            value: "1".into(),
            source,
        }),
    }
}

/// `populated` from `cgroup.events`: whether any process is left in the subtree.
pub(super) fn populated(dir: &Path) -> Result<bool> {
    let path = dir.join("cgroup.events");
    let text = files::read(&path)?;
    Ok(files::keyed_value(&path, &text, "populated")?.unwrap_or(0) > 0)
}

/// Freezes the subtree (`cgroup.freeze`, 5.2+) and waits up to `timeout` for
/// `frozen 1` in `cgroup.events`. Only used when `cgroup.kill` is missing.
pub(super) fn freeze(dir: &Path, timeout: Duration) -> Result<bool> {
    files::write(&dir.join("cgroup.freeze"), "1")?;
    let events = dir.join("cgroup.events");
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        let text = files::read(&events)?;
        if files::keyed_value(&events, &text, "frozen")? == Some(1) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Thaws the subtree.
pub(super) fn thaw(dir: &Path) -> Result<()> {
    files::write(&dir.join("cgroup.freeze"), "0")
}

/// `+memory +pids +cpu` (those given) for `<base>/cgroup.subtree_control`.
pub(super) fn subtree_control_line(controllers: &[Controller]) -> String {
    controllers
        .iter()
        .map(|c| format!("+{}", c.name()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (f, v) in [
            ("memory.max", "max\n"),
            ("memory.swap.max", "max\n"),
            ("pids.max", "max\n"),
            ("cpu.max", "max 100000\n"),
            ("cgroup.kill", ""),
            ("cgroup.events", "populated 1\nfrozen 0\n"),
        ] {
            std::fs::write(d.path().join(f), v).unwrap();
        }
        d
    }

    fn read(d: &tempfile::TempDir, f: &str) -> String {
        std::fs::read_to_string(d.path().join(f)).unwrap()
    }

    #[test]
    fn limits_go_into_the_v2_files() {
        let d = v2_dir();
        let limits = CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(16),
            cpu_quota: Some((50_000, 100_000)),
        };
        apply_limits(
            d.path(),
            &[Controller::Memory, Controller::Pids, Controller::Cpu],
            &limits,
        )
        .unwrap();
        assert_eq!(read(&d, "memory.max"), "67108864");
        assert_eq!(read(&d, "memory.swap.max"), "0");
        assert_eq!(read(&d, "pids.max"), "16");
        assert_eq!(read(&d, "cpu.max"), "50000 100000");
    }

    #[test]
    fn controllers_not_on_v2_are_left_alone() {
        let d = v2_dir();
        let limits = CgroupLimits {
            memory_bytes: Some(64 << 20),
            pids: Some(16),
            cpu_quota: None,
        };
        apply_limits(d.path(), &[Controller::Pids], &limits).unwrap();
        assert_eq!(read(&d, "memory.max"), "max\n");
        assert_eq!(read(&d, "pids.max"), "16");
    }

    #[test]
    fn no_swap_file_no_swap_write() {
        let d = v2_dir();
        std::fs::remove_file(d.path().join("memory.swap.max")).unwrap();
        let limits = CgroupLimits {
            memory_bytes: Some(1 << 30),
            ..Default::default()
        };
        apply_limits(d.path(), &[Controller::Memory], &limits).unwrap();
        assert!(!d.path().join("memory.swap.max").exists());
        assert_eq!(read(&d, "memory.max"), "1073741824");
    }

    #[test]
    fn kill_events_and_fd() {
        let d = v2_dir();
        assert!(kill(d.path()).unwrap());
        assert_eq!(read(&d, "cgroup.kill"), "1");
        assert!(populated(d.path()).unwrap());
        std::fs::remove_file(d.path().join("cgroup.kill")).unwrap();
        assert!(
            !kill(d.path()).unwrap(),
            "no cgroup.kill: caller falls back"
        );
        assert!(open_dir(d.path()).is_ok());
        assert!(open_dir(&d.path().join("nope")).is_err());
        assert_eq!(
            subtree_control_line(&[Controller::Memory, Controller::Pids]),
            "+memory +pids"
        );
    }
}
