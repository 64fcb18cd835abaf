//! [`SandboxCgroup`]: one sandbox's cgroup across every hierarchy it lives in, from
//! placement to kill, figures and removal.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::error::{Error, Result};
use super::stats::{self, CgroupStats};
use super::{files, v1, v2, Controller};

/// How long the processes of a killed cgroup get to exit before removal gives up.
const EXIT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a v1 (or v2) freeze may take before killing goes ahead anyway.
const FREEZE_TIMEOUT: Duration = Duration::from_millis(200);
/// How long removal keeps retrying `rmdir` on a cgroup that is still busy (`EBUSY`: the kernel has
/// not yet unlinked the last exited task, which under load can take a while); after that
/// the directory is left to the next start's stale clean-up, and the failure is logged.
const RMDIR_PATIENCE: Duration = Duration::from_secs(2);

#[derive(Debug)]
pub(super) struct V2Dir {
    pub path: PathBuf,
    /// The same cgroup as `/proc/<pid>/cgroup` shows it (`0::<cgroup_path>`).
    pub cgroup_path: String,
    pub fd: Option<OwnedFd>,
    pub controllers: Vec<Controller>,
}

#[derive(Debug)]
pub(super) struct V1Dir {
    pub path: PathBuf,
    pub controllers: Vec<Controller>,
}

/// One sandbox's cgroup: a directory in the v2 hierarchy and/or one per v1 hierarchy,
/// all with the same name. Dropping it kills every process in it and removes it (best
/// effort, failures logged); [`SandboxCgroup::remove`] does the same and reports.
#[derive(Debug)]
pub struct SandboxCgroup {
    pub(super) name: String,
    pub(super) v2: Option<V2Dir>,
    pub(super) v1: Vec<V1Dir>,
    pub(super) proc_root: PathBuf,
    pub(super) removed: bool,
}

impl SandboxCgroup {
    /// The cgroup's name (the last path component in every hierarchy).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every directory of this cgroup: the v2 one first, then one per v1 hierarchy.
    pub fn paths(&self) -> Vec<&Path> {
        let v2 = self.v2.iter().map(|d| d.path.as_path());
        v2.chain(self.v1.iter().map(|d| d.path.as_path())).collect()
    }

    /// The v2 directory, when the sandbox has one.
    pub fn v2_path(&self) -> Option<&Path> {
        self.v2.as_ref().map(|d| d.path.as_path())
    }

    /// v2 only: an `O_DIRECTORY` fd of the cgroup for `clone3`'s `CLONE_INTO_CGROUP`.
    /// The caller puts it in `clone_args.cgroup` and adds the flag; the child then starts
    /// life in the cgroup, so there is no `cgroup.procs` write for v2 on the hot path.
    /// `None` when the sandbox has no v2 directory. On a hybrid host the child must still
    /// join the v1 hierarchies: see [`SandboxCgroup::open_v1_tasks`].
    pub fn clone_into_fd(&self) -> Option<BorrowedFd<'_>> {
        self.v2.as_ref()?.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// Moves `pid` (the whole thread group) into every hierarchy of the cgroup by writing
    /// it to `cgroup.procs`. For v2 the write is skipped when `/proc/<pid>/cgroup` shows
    /// the process already there (placed by `CLONE_INTO_CGROUP`). For processes other
    /// than the sandbox init (which joins its v1 hierarchies itself, see `join.rs`): each
    /// v1 write takes the kernel's global threadgroup lock (milliseconds).
    pub fn add_process(&self, pid: i32) -> Result<()> {
        self.add_process_v2(pid)?;
        let value = pid.to_string();
        for d in &self.v1 {
            files::write(&d.path.join("cgroup.procs"), &value).inspect_err(|e| {
                tracing::error!(?e, pid, cgroup = %d.path.display(), "moving into a v1 cgroup failed");
            })?;
        }
        Ok(())
    }

    pub(super) fn in_v2_already(&self, pid: i32, cgroup_path: &str) -> bool {
        let path = self.proc_root.join(pid.to_string()).join("cgroup");
        std::fs::read_to_string(path).is_ok_and(|text| {
            text.lines()
                .any(|l| l.strip_prefix("0::").is_some_and(|p| p == cgroup_path))
        })
    }

    /// The pids of every process in the cgroup and its descendants, in any hierarchy
    /// (as this process's pid namespace numbers them), sorted.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let mut pids = Vec::new();
        for dir in self.paths() {
            for d in files::subdirs_deepest_first(dir)
                .iter()
                .map(PathBuf::as_path)
                .chain([dir])
            {
                let procs = d.join("cgroup.procs");
                match files::read_optional(&procs)? {
                    Some(text) => pids.extend(files::parse_pids(&procs, &text)?),
                    // Removed meanwhile: nothing in it.
                    None => continue,
                }
            }
        }
        pids.sort_unstable();
        pids.dedup();
        Ok(pids)
    }

    /// SIGKILLs every process of the cgroup tree. v2: `cgroup.kill` (atomic, forks
    /// included). Without it (v1, or a kernel before 5.14): freeze (v1 freezer, else v2
    /// `cgroup.freeze`), SIGKILL every pid in `cgroup.procs`, thaw, and again until no
    /// process is left. Returns once the signals are sent; [`SandboxCgroup::remove`]
    /// waits for the processes to be gone.
    pub fn kill_all(&self) -> Result<()> {
        if let Some(d) = &self.v2 {
            match v2::kill(&d.path) {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    tracing::debug!(cgroup = %d.path.display(), "no cgroup.kill; freezing and killing")
                }
                Err(_) if self.vanished() => return Ok(()),
                Err(e) => {
                    tracing::warn!(?e, cgroup = %d.path.display(), "cgroup.kill failed; freezing and killing")
                }
            }
        }
        self.freeze_and_kill()
    }

    /// Whether every directory of the cgroup is gone: removed by another cleaner (the
    /// spawner factory of a supervisor that ended, racing a later process's stale
    /// cleanup). A cgroup is removed only once empty, so nothing of it is left to end.
    fn vanished(&self) -> bool {
        let gone = self.paths().into_iter().all(gone);
        if gone {
            tracing::debug!(cgroup = %self.name, "the cgroup was removed by another cleaner");
        }
        gone
    }

    fn freezer(&self) -> Freezer<'_> {
        if let Some(d) = self
            .v1
            .iter()
            .find(|d| d.controllers.contains(&Controller::Freezer))
        {
            return Freezer::V1(&d.path);
        }
        match &self.v2 {
            Some(d) if d.path.join("cgroup.freeze").exists() => Freezer::V2(&d.path),
            _ => Freezer::None,
        }
    }

    /// Freeze, kill every pid, thaw; repeated until the cgroup is empty or the time is up.
    fn freeze_and_kill(&self) -> Result<()> {
        let freezer = self.freezer();
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let mut pause = Duration::from_micros(100);
        loop {
            freezer.freeze();
            let pids = self.pids();
            let mut result = Ok(());
            for &pid in pids.as_deref().unwrap_or_default() {
                match kill(Pid::from_raw(pid), Signal::SIGKILL) {
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(e) => {
                        tracing::error!(?e, pid, cgroup = %self.name, "killing a cgroup member failed");
                        result = Err(Error::Signal {
                            pid,
                            path: self.first_path(),
                            source: e.into(),
                        });
                    }
                }
            }
            freezer.thaw();
            let pids = pids?;
            result?;
            if pids.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                tracing::error!(?pids, cgroup = %self.name, "processes survive SIGKILL");
                return Err(Error::StillPopulated {
                    path: self.first_path(),
                    pids,
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    fn first_path(&self) -> PathBuf {
        self.paths()
            .first()
            .map(|p| p.to_path_buf())
            .unwrap_or_default()
    }

    /// Whether no process is left: v2 `cgroup.events` says unpopulated and no
    /// hierarchy lists a pid.
    fn is_empty(&self) -> Result<bool> {
        if let Some(d) = &self.v2 {
            if v2::populated(&d.path)? {
                return Ok(false);
            }
        }
        Ok(self.pids()?.is_empty())
    }

    fn wait_empty(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(50);
        loop {
            if self.is_empty()? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Per-run figures: peak memory, CPU time, whether the OOM killer struck, whether the
    /// pids limit refused a fork. Read them before [`SandboxCgroup::remove`].
    pub fn stats(&self) -> Result<CgroupStats> {
        let mut out = CgroupStats::default();
        if let Some((dir, is_v2)) = self.dir_of(Controller::Memory) {
            let (peak, oom) = if is_v2 {
                stats::memory_v2(dir)?
            } else {
                stats::memory_v1(dir)?
            };
            out.peak_memory_bytes = peak;
            out.oom_killed = oom;
        }
        // v2's cpu.stat is core (no controller needed), so any v2 directory has it.
        out.cpu_usec = match (&self.v2, self.dir_of(Controller::CpuAcct)) {
            (Some(d), _) => stats::cpu_v2(&d.path)?,
            (None, Some((dir, _))) => stats::cpu_v1(dir)?,
            (None, None) => None,
        };
        if let Some((dir, _)) = self.dir_of(Controller::Pids) {
            out.pids_limited = stats::pids_limited(dir)?;
        }
        Ok(out)
    }

    fn dir_of(&self, c: Controller) -> Option<(&Path, bool)> {
        if let Some(d) = self.v2.as_ref().filter(|d| d.controllers.contains(&c)) {
            return Some((&d.path, true));
        }
        self.v1
            .iter()
            .find(|d| d.controllers.contains(&c))
            .map(|d| (d.path.as_path(), false))
    }

    /// Kills everything in the cgroup, waits for it to exit, and removes the cgroup (and
    /// any cgroups the sandbox made below it) in every hierarchy, retrying `rmdir` briefly
    /// while the kernel still counts it busy.
    /// Removes the v2 directory when it has no controller (a hybrid host's v2 limits
    /// nothing): for a sandbox forked elsewhere, whose process would have to join it by
    /// writing `cgroup.procs`, which waits for an RCU grace period (the whole-process
    /// move takes the kernel's global threadgroup lock). Killing then goes through the v1
    /// freezer, and the sandbox's pid namespace ends with its init anyway.
    pub fn drop_v2_without_controllers(&mut self) -> Result<()> {
        if self.v2.as_ref().is_some_and(|d| d.controllers.is_empty()) {
            let d = self.v2.take().expect("checked above");
            drop(d.fd);
            rmdir_retrying(&d.path, Instant::now() + EXIT_TIMEOUT)?;
        }
        Ok(())
    }

    pub fn remove(mut self) -> Result<()> {
        let result = self.teardown();
        self.removed = true;
        result
    }

    fn teardown(&mut self) -> Result<()> {
        if let Err(e) = self.kill_all() {
            tracing::warn!(?e, cgroup = %self.name, "killing the cgroup failed; removing anyway");
        }
        match self.wait_empty(EXIT_TIMEOUT) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(cgroup = %self.name, "cgroup still populated after kill; killing again");
                self.freeze_and_kill()?;
                if !self.wait_empty(EXIT_TIMEOUT)? {
                    let pids = self.pids().unwrap_or_default();
                    tracing::error!(?pids, cgroup = %self.name, "cgroup does not empty");
                    return Err(Error::StillPopulated {
                        path: self.first_path(),
                        pids,
                    });
                }
            }
            Err(_) if self.vanished() => return Ok(()),
            Err(e) => {
                tracing::warn!(?e, cgroup = %self.name, "cannot tell whether the cgroup is empty")
            }
        }
        if let Some(d) = &mut self.v2 {
            d.fd = None;
        }
        // One patience for the whole removal: the spawner is single-threaded, and a
        // cgroup that stays busy must not stall it once per directory.
        let deadline = Instant::now() + RMDIR_PATIENCE;
        let mut first_err = None;
        for dir in self.paths() {
            for d in files::subdirs_deepest_first(dir)
                .iter()
                .map(PathBuf::as_path)
                .chain([dir])
            {
                // (rmdir_retrying logs its own failure, with the tasks left.)
                if let Err(e) = rmdir_retrying(d, deadline) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for SandboxCgroup {
    fn drop(&mut self) {
        if !self.removed {
            if let Err(e) = self.teardown() {
                tracing::error!(?e, cgroup = %self.name, "cleaning up the sandbox cgroup failed");
            }
            self.removed = true;
        }
    }
}

/// Removes `dir`, retrying while it is busy until `deadline`.
pub(super) fn rmdir_retrying(dir: &Path, deadline: Instant) -> Result<()> {
    let mut pause = Duration::from_millis(1);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match std::fs::remove_dir(dir) {
            Ok(()) => {
                if attempts > 1 {
                    tracing::debug!(cgroup = %dir.display(), attempts, "cgroup removed after EBUSY");
                }
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(source) => {
                let tasks = std::fs::read_to_string(dir.join("tasks"))
                    .or_else(|_| std::fs::read_to_string(dir.join("cgroup.procs")))
                    .unwrap_or_default();
                tracing::error!(
                    cgroup = %dir.display(),
                    attempts,
                    tasks = %tasks.split_whitespace().collect::<Vec<_>>().join(","),
                    %source,
                    "cgroup cannot be removed"
                );
                return Err(Error::Remove {
                    path: dir.to_path_buf(),
                    source,
                });
            }
        }
    }
}

/// Which freezer the kill loop uses; failures only make the kill less certain, so they
/// are logged, not returned.
enum Freezer<'a> {
    V1(&'a Path),
    V2(&'a Path),
    None,
}

impl Freezer<'_> {
    fn freeze(&self) {
        let r = match self {
            Freezer::V1(dir) => v1::freeze(dir, FREEZE_TIMEOUT),
            Freezer::V2(dir) => v2::freeze(dir, FREEZE_TIMEOUT),
            Freezer::None => return,
        };
        match r {
            Ok(true) => {}
            Ok(false) => tracing::warn!(freezer = ?self.dir(), "cgroup did not freeze in time"),
            Err(_) if self.dir().is_some_and(gone) => {}
            Err(e) => tracing::warn!(?e, freezer = ?self.dir(), "freezing failed"),
        }
    }

    fn thaw(&self) {
        let r = match self {
            Freezer::V1(dir) => v1::thaw(dir),
            Freezer::V2(dir) => v2::thaw(dir),
            Freezer::None => return,
        };
        match r {
            Ok(()) => {}
            // Removed by another cleaner: nothing left frozen.
            Err(_) if self.dir().is_some_and(gone) => {}
            Err(e) => tracing::error!(?e, freezer = ?self.dir(), "thawing failed"),
        }
    }

    fn dir(&self) -> Option<&Path> {
        match self {
            Freezer::V1(d) | Freezer::V2(d) => Some(d),
            Freezer::None => None,
        }
    }
}

/// Whether `dir` no longer exists.
fn gone(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
}
