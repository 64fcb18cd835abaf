//! The cgroup layer: one cgroup per sandbox, below the supervisor's own cgroup, with
//! memory/pids/CPU limits, whole-tree kill, per-run figures, and nothing left afterwards.
//!
//! # Backends
//!
//! Discovery ([`CgroupManager::discover_host`]) reads `/proc/self/cgroup` and
//! `/proc/self/mountinfo` and decides, per controller, where it lives:
//!
//! - **v2** (the primary backend): a sandbox is `<own v2 cgroup>/codebox-…` with
//!   `memory.max`, `memory.swap.max = 0`, `pids.max` and `cpu.max`. The sandbox init is
//!   placed with `clone3(CLONE_INTO_CGROUP)` using [`SandboxCgroup::clone_into_fd`] (no
//!   `cgroup.procs` write on the hot path) and the tree dies by `cgroup.kill`.
//! - **v1** fallback, for hosts whose controllers sit on v1 hierarchies: one directory of
//!   the same name per hierarchy (memory, pids, cpu, cpuacct, freezer; each below the
//!   supervisor's own cgroup *in that hierarchy*, which may differ per hierarchy), the
//!   same limits through `memory.limit_in_bytes` + `memory.memsw.limit_in_bytes`,
//!   `pids.max`, `cpu.cfs_quota_us`/`cpu.cfs_period_us`; the init moves itself in by
//!   writing `0` to each hierarchy's `tasks` through a descriptor the parent opened
//!   ([`SandboxCgroup::open_v1_tasks`], [`TasksFds::join_self`]: no global lock, see
//!   `join.rs`); kill is freeze, SIGKILL every pid, thaw.
//! - **hybrid**: both. When the supervisor may write its own v2 cgroup, every sandbox
//!   also gets a v2 directory even if v2 carries none of the controllers, because
//!   `cgroup.kill`, `CLONE_INTO_CGROUP`, `cgroup.events` and `cpu.stat` are core v2
//!   features that need no controller. Limits go wherever each controller is.
//!
//! On the development machine and CI (kernel 6.x, systemd-less VM) `discover_host()` as
//! root returns `Backend::Hybrid { v2: [], v1: [memory, pids, cpu, cpuacct, freezer] }`:
//! memory at `/sys/fs/cgroup/memory/process_api/<id>`, the other v1 controllers at the
//! roots of their hierarchies, and the controller-less unified hierarchy at
//! `/sys/fs/cgroup/unified` used for `cgroup.kill` and `CLONE_INTO_CGROUP`.
//!
//! # Use
//!
//! ```no_run
//! # use codebox::sandbox::cgroup::*;
//! # fn main() -> Result<()> {
//! // Once, at start-up, before forking the spawner:
//! let mut cgroups = CgroupManager::discover_host()?;
//! // A no-op unless a delegated v2 subtree needs it; an error only means "no v2 limits".
//! if let Err(e) = cgroups.enable_v2_controllers() {
//!     tracing::warn!(?e, "v2 controllers stay disabled");
//! }
//! let stale = cgroups.cleanup_stale()?; // crashed supervisors' leftovers
//! println!("{} ({stale} stale cgroups removed)", cgroups.backend());
//!
//! // Per sandbox:
//! let limits = CgroupLimits { memory_bytes: Some(256 << 20), pids: Some(64), cpu_quota: None };
//! let cg = cgroups.create("python", &limits)?;
//! // Before clone3: the v1 `tasks` descriptors the child will write "0" to.
//! let tasks = cg.open_v1_tasks()?;
//! // clone3 with `cg.clone_into_fd()` (when Some) in clone_args.cgroup | CLONE_INTO_CGROUP;
//! // the child calls TasksFds::of(&tasks).join_self() first thing; the parent drops `tasks`.
//! // ... run; on timeout: cg.kill_all()?
//! let figures = cg.stats()?; // peak memory, CPU time, oom_killed, pids_limited
//! cg.remove()?; // blocks while the processes exit: spawn_blocking under tokio
//! # let _ = figures; Ok(()) }
//! ```
//!
//! A memory bomb shows up as `oom_killed: true` (the program itself dies of SIGKILL from
//! the kernel's OOM killer, which stays enabled; codebox reports the cause from the memory
//! events rather than a bare signal).
//!
//! # Names and clean-up
//!
//! Sandbox cgroups are `codebox-<supervisor pid>-<its start time>-<seq>[-<hint>]`. After a
//! run the [`SandboxCgroup`] is removed (explicitly or on drop) in every hierarchy. At
//! start-up [`CgroupManager::cleanup_stale`] kills and removes every `codebox-…` cgroup
//! below the base whose supervisor is gone (the start time guards against pid reuse); a
//! live supervisor's cgroups are never touched.
//!
//! # What cgroups-rs is used for
//!
//! The [`cgroups-rs`](https://docs.rs/cgroups-rs/0.3.4) controllers, constructed on an
//! explicit directory (`MemController::new(dir, v2)` and friends), write the limit values
//! in both v1 and v2 syntax (`set_limit`, `set_memswap_limit`, `set_pid_max`,
//! `set_cfs_quota_and_period`) and drive the v1 freezer (`freeze`, `thaw`, `state`).
//! Everything else is direct file I/O, where cgroups-rs does not fit:
//!
//! - discovery: its `Hierarchy` reads `/proc/self/mountinfo` and `/sys/fs/cgroup` (no
//!   temp-dir roots for tests) and picks v1 *or* v2 for the whole host (no hybrid, no
//!   per-controller base paths such as memory at `/process_api/<id>` and pids at `/`);
//! - `cgroup.kill`: its `Cgroup::kill` goes through that `Hierarchy`, whose v2 root is
//!   fixed at `/sys/fs/cgroup` (wrong where v2 is at `/sys/fs/cgroup/unified`);
//! - statistics: `MemController::memory_stat` turns read errors into 0, unwraps (panics)
//!   when a v2 `memory.*` file is missing, and parses `memory.oom_control` by position;
//!   here each figure is parsed by key and a missing file is `None`;
//! - the `CLONE_INTO_CGROUP` directory fd, `cgroup.events`, `memory.events`, moving a
//!   process (one `write` to `cgroup.procs`) and `rmdir` with retries.
//!
//! Version 0.3.4 is pinned on purpose: 0.4 and later depend unconditionally on zbus (a
//! D-Bus stack with its own async executor; 75 crates in all against 0.3.4's 19) for a
//! systemd manager codebox does not use; the fs controller API used here is the same.
//! The price of 0.3.4 is a second, older `nix` (0.25), `thiserror` 1 and `bitflags` 1.
//!
//! # Placement and the sandbox's cgroup namespace
//!
//! With `CLONE_NEWCGROUP | CLONE_INTO_CGROUP` the kernel roots the new cgroup namespace
//! at the target cgroup, so in v2 the sandbox sees itself as `0::/` (checked by
//! `tests/cgroup.rs`). v1 hierarchies cannot be entered at clone time: the namespace's v1
//! roots are the supervisor's v1 cgroups, so after joining them the sandbox sees
//! `/codebox-…` in its v1 lines. The sandbox init hides them by
//! `unshare(CLONE_NEWCGROUP)` once more after joining.
//!
//! # v2 delegation (rootless on a v2 host)
//!
//! An unprivileged supervisor can only create cgroups in a subtree delegated to it. With
//! systemd: run codebox as a service (or `systemd-run --user --scope -p Delegate=yes`)
//! with `Delegate=yes`, which chowns the unit's cgroup directory and its `cgroup.procs`,
//! `cgroup.threads` and `cgroup.subtree_control` to the user, and lists the controllers in
//! its `cgroup.controllers`. Then v2's *no internal processes* rule applies: a cgroup with
//! controllers enabled in `cgroup.subtree_control` may not hold processes itself. So at
//! start-up the supervisor moves itself (every process of its own cgroup) into a leaf,
//! `<own>/codebox-supervisor`, and only then writes `+memory +pids +cpu` to
//! `<own>/cgroup.subtree_control`; sandboxes are created next to the leaf as
//! `<own>/codebox-…`. [`CgroupManager::enable_v2_controllers`] does exactly that (call it
//! before forking the spawner; it is a no-op when nothing needs enabling), and discovery
//! recognises the leaf, so a supervisor already in it still uses `<own>`. Moving a
//! process needs write access to `cgroup.procs` of the common ancestor of the source and
//! destination cgroups, which for `<own>` and its children is the delegated `<own>`.
//!
//! # v1 delegation (rootless on a v1 or hybrid host)
//!
//! On v1 codebox just needs its own cgroup directory in each hierarchy to be writable by
//! it; see [`CgroupManager::delegate_for_user`] for exactly what root has to prepare
//! (which `cargo xtask test` does for the `codebox-test` user).
//!
//! # Delegation without systemd (`codebox setup-cgroups`)
//!
//! [`delegate`] plans and carries out a delegation below the administrator's own cgroup
//! in every hierarchy codebox uses (v1, hybrid and v2), starts a process inside it, and removes it again; see there
//! for who may move a process into which hierarchy.

pub mod delegate;
mod discover;
mod error;
mod files;
mod handle;
mod join;
mod naming;
mod stats;
mod v1;
mod v2;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

pub use error::{Error, Result};
pub use handle::SandboxCgroup;
pub use join::{TasksFds, MAX_V1_HIERARCHIES};
pub use stats::CgroupStats;

use discover::{Layout, V1Base, V2Base};
use handle::{V1Dir, V2Dir};
use naming::Owner;

/// The v2 leaf a supervisor moves itself into before enabling controllers for its
/// sandboxes (the "no internal processes" rule).
pub const SUPERVISOR_LEAF: &str = "codebox-supervisor";

/// A cgroup controller codebox uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Controller {
    /// Memory limit, peak, OOM events.
    Memory,
    /// Process count limit and its events.
    Pids,
    /// CPU bandwidth limit (and, on v2, nothing else: CPU time is core there).
    Cpu,
    /// v1 only: CPU time used.
    CpuAcct,
    /// v1 only: freezing for a race-free tree kill (v2 has `cgroup.kill`).
    Freezer,
}

impl Controller {
    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::CpuAcct => "cpuacct",
            Controller::Freezer => "freezer",
        }
    }

    fn from_v1_name(name: &str) -> Option<Controller> {
        Some(match name {
            "memory" => Controller::Memory,
            "pids" => Controller::Pids,
            "cpu" => Controller::Cpu,
            "cpuacct" => Controller::CpuAcct,
            "freezer" => Controller::Freezer,
            _ => return None,
        })
    }

    /// The controllers that exist as such on v2 (freezing and CPU time are core there).
    fn from_v2_name(name: &str) -> Option<Controller> {
        Some(match name {
            "memory" => Controller::Memory,
            "pids" => Controller::Pids,
            "cpu" => Controller::Cpu,
            _ => return None,
        })
    }
}

impl fmt::Display for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The limits of one sandbox cgroup; `None` leaves a resource unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory (RSS + page cache + kernel memory charged to the cgroup), bytes. Swap is
    /// off for the sandbox: v2 `memory.swap.max = 0`, v1 memsw limit = this.
    pub memory_bytes: Option<u64>,
    /// Processes and threads at once.
    pub pids: Option<u64>,
    /// CFS bandwidth: `(quota µs, period µs)`, e.g. `(50_000, 100_000)` = half a CPU.
    pub cpu_quota: Option<(u64, u64)>,
}

impl CgroupLimits {
    /// The controllers these limits need.
    pub fn controllers(&self) -> Vec<Controller> {
        let mut out = Vec::new();
        if self.memory_bytes.is_some() {
            out.push(Controller::Memory);
        }
        if self.pids.is_some() {
            out.push(Controller::Pids);
        }
        if self.cpu_quota.is_some() {
            out.push(Controller::Cpu);
        }
        out
    }

    /// Rejects values the kernel would refuse or that make no sense for a sandbox.
    pub fn validate(&self) -> Result<()> {
        if self.memory_bytes == Some(0) {
            return Err(Error::InvalidLimit("memory limit of 0 bytes".into()));
        }
        if self.pids == Some(0) {
            return Err(Error::InvalidLimit("pids limit of 0".into()));
        }
        if let Some((quota, period)) = self.cpu_quota {
            if !(1_000..=1_000_000).contains(&period) {
                return Err(Error::InvalidLimit(format!(
                    "cpu period {period} µs is outside 1000..=1000000"
                )));
            }
            if quota < 1_000 {
                return Err(Error::InvalidLimit(format!(
                    "cpu quota {quota} µs is below 1000"
                )));
            }
        }
        Ok(())
    }
}

/// Which cgroup hierarchies sandboxes get, and which controllers are where; for
/// `codebox doctor`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Backend {
    /// No cgroup hierarchy this process may write: no limits, kill via the pid namespace.
    None,
    /// Only v1 hierarchies (no usable v2 hierarchy).
    V1 { controllers: Vec<Controller> },
    /// Only the v2 hierarchy; `controllers` are those enabled for sandboxes (possibly
    /// none: kill, placement and CPU time still work).
    V2 { controllers: Vec<Controller> },
    /// A v2 directory (with `v2`'s controllers, possibly none) *and* v1 directories.
    Hybrid {
        v2: Vec<Controller>,
        v1: Vec<Controller>,
    },
}

impl Backend {
    /// Every controller sandboxes get, wherever it is.
    pub fn controllers(&self) -> Vec<Controller> {
        let mut all = match self {
            Backend::None => vec![],
            Backend::V1 { controllers } | Backend::V2 { controllers } => controllers.clone(),
            Backend::Hybrid { v2, v1 } => v2.iter().chain(v1).copied().collect(),
        };
        all.sort();
        all
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |cs: &[Controller]| {
            if cs.is_empty() {
                "no controllers".to_string()
            } else {
                cs.iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
            }
        };
        match self {
            Backend::None => write!(f, "cgroups: none usable"),
            Backend::V1 { controllers } => write!(f, "cgroups: v1 ({})", list(controllers)),
            Backend::V2 { controllers } => write!(f, "cgroups: v2 ({})", list(controllers)),
            Backend::Hybrid { v2, v1 } => write!(
                f,
                "cgroups: hybrid: v2 ({}; cgroup.kill, CLONE_INTO_CGROUP) + v1 ({})",
                list(v2),
                list(v1)
            ),
        }
    }
}

/// One hierarchy sandboxes are created in, for `codebox doctor` and tests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hierarchy {
    /// 1 or 2.
    pub version: u8,
    /// The base directory: the supervisor's own cgroup there.
    pub base: PathBuf,
    /// The controllers sandboxes get from it.
    pub controllers: Vec<Controller>,
}

/// Sequence numbers for sandbox cgroup names, per process.
static SEQ: AtomicU64 = AtomicU64::new(1);

/// Starts this process's cgroup name sequence at `generation << 32`: spawners forked one
/// after another from the same factory share the owner part of their cgroup names, and
/// must not reuse each other's sequence numbers.
pub fn start_sequence(generation: u32) {
    SEQ.store((u64::from(generation) << 32).max(1), Ordering::Relaxed);
}

/// The cgroup hierarchies of this process, discovered once; creates sandbox cgroups.
#[derive(Debug)]
pub struct CgroupManager {
    proc_root: PathBuf,
    owner: Owner,
    v2: Option<V2Base>,
    v1: Vec<V1Base>,
    notes: Vec<String>,
}

impl CgroupManager {
    /// Discovers the hierarchies of this process from `<proc_root>/self/{cgroup,mountinfo,
    /// stat}`; mount points in mountinfo are taken relative to `fs_root`. The host is
    /// `discover(Path::new("/proc"), Path::new("/"))`; tests pass temp directories. A host
    /// without any usable hierarchy gives a manager whose backend is [`Backend::None`].
    pub fn discover(proc_root: &Path, fs_root: &Path) -> Result<CgroupManager> {
        let self_dir = proc_root.join("self");
        let cgroup_file = self_dir.join("cgroup");
        let memberships = discover::parse_proc_cgroup(&cgroup_file, &files::read(&cgroup_file)?)?;
        let mounts = discover::parse_mountinfo(&files::read(&self_dir.join("mountinfo"))?);
        let stat_file = self_dir.join("stat");
        let stat = discover::parse_stat(&stat_file, &files::read(&stat_file)?)?;
        let Layout { v2, v1, notes } = discover::layout(&memberships, &mounts, fs_root)?;
        let manager = CgroupManager {
            proc_root: proc_root.to_path_buf(),
            owner: Owner {
                pid: stat.pid,
                start: stat.start,
            },
            v2,
            v1,
            notes,
        };
        tracing::debug!(backend = %manager.backend(), notes = ?manager.notes, "cgroups discovered");
        Ok(manager)
    }

    /// [`CgroupManager::discover`] on this host: `/proc` and the real mounts.
    pub fn discover_host() -> Result<CgroupManager> {
        Self::discover(Path::new("/proc"), Path::new("/"))
    }

    /// Which hierarchies sandboxes get and which controllers are where.
    pub fn backend(&self) -> Backend {
        let v1: Vec<Controller> = {
            let mut all: Vec<Controller> =
                self.v1.iter().flat_map(|b| b.controllers.clone()).collect();
            all.sort();
            all
        };
        match &self.v2 {
            None if v1.is_empty() => Backend::None,
            None => Backend::V1 { controllers: v1 },
            Some(b) if v1.is_empty() => Backend::V2 {
                controllers: b.enabled.clone(),
            },
            Some(b) => Backend::Hybrid {
                v2: b.enabled.clone(),
                v1,
            },
        }
    }

    /// The hierarchies sandboxes are created in: v2 first, then v1 in `/proc/self/cgroup`
    /// order.
    pub fn hierarchies(&self) -> Vec<Hierarchy> {
        let v2 = self.v2.iter().map(|b| Hierarchy {
            version: 2,
            base: b.dir.clone(),
            controllers: b.enabled.clone(),
        });
        let v1 = self.v1.iter().map(|b| Hierarchy {
            version: 1,
            base: b.dir.clone(),
            controllers: b.controllers.clone(),
        });
        v2.chain(v1).collect()
    }

    /// Hierarchies that were found but cannot be used, and controllers that could be
    /// enabled, in words (for `codebox doctor`).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// On a delegated v2 subtree whose controllers are available but not yet enabled for
    /// children: moves the processes of the supervisor's own cgroup (the supervisor and
    /// its descendants) into `<own>/codebox-supervisor` (unless `<own>` is the real root
    /// cgroup, which is exempt from the no-internal-processes rule) and writes
    /// `+memory +pids +cpu` (those available) to `<own>/cgroup.subtree_control`. Returns
    /// the controllers it enabled; a no-op otherwise. Call once at start-up, before
    /// forking the spawner.
    ///
    /// If `<own>` also holds processes that are not the supervisor's (a login session's
    /// scope, a container's init), nothing is moved and [`Error::SharedCgroup`] says so:
    /// such a cgroup is not delegated to codebox. Sandboxes then still get v2 directories
    /// (kill, placement, CPU time) but no v2 limits; run codebox in its own delegated
    /// cgroup (`systemd-run --user --scope -p Delegate=yes codebox …`) to get them.
    pub fn enable_v2_controllers(&mut self) -> Result<Vec<Controller>> {
        let Some(base) = &self.v2 else {
            return Ok(vec![]);
        };
        let missing: Vec<Controller> = base
            .available
            .iter()
            .copied()
            .filter(|c| !base.enabled.contains(c))
            .collect();
        if missing.is_empty() {
            return Ok(vec![]);
        }
        // Only the root cgroup lacks cgroup.type.
        let is_root = !base.dir.join("cgroup.type").exists();
        if !is_root {
            let procs_file = base.dir.join("cgroup.procs");
            let pids = files::parse_pids(&procs_file, &files::read(&procs_file)?)?;
            // Only our own process tree may be moved: a cgroup shared with other
            // processes (a login session's scope, a container's init) is not delegated
            // to codebox, and moving its processes would break whoever manages it.
            let foreign: Vec<i32> = pids
                .iter()
                .copied()
                .filter(|&p| !self.is_own_tree(p))
                .collect();
            if !foreign.is_empty() {
                tracing::error!(?foreign, base = %base.dir.display(), "own v2 cgroup is shared");
                return Err(Error::SharedCgroup {
                    path: base.dir.clone(),
                    pids: foreign,
                });
            }
            if !pids.is_empty() {
                let leaf = base.dir.join(SUPERVISOR_LEAF);
                match std::fs::create_dir(&leaf) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(source) => {
                        tracing::error!(?source, leaf = %leaf.display(), "creating the supervisor leaf failed");
                        return Err(Error::Create { path: leaf, source });
                    }
                }
                for pid in pids {
                    match files::write_io(&leaf.join("cgroup.procs"), &pid.to_string()) {
                        Ok(()) => {}
                        // Exited meanwhile.
                        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                        Err(source) => {
                            tracing::error!(?source, pid, leaf = %leaf.display(), "moving into the supervisor leaf failed");
                            return Err(Error::Write {
                                path: leaf.join("cgroup.procs"),
                                value: pid.to_string(),
                                source,
                            });
                        }
                    }
                }
            }
        }
        let line = v2::subtree_control_line(&missing);
        files::write(&base.dir.join("cgroup.subtree_control"), &line).inspect_err(|e| {
            tracing::error!(?e, base = %base.dir.display(), "enabling v2 controllers failed");
        })?;
        if let Some(base) = &mut self.v2 {
            base.enabled.extend(&missing);
            base.enabled.sort();
        }
        let names: Vec<&str> = missing.iter().map(|c| c.name()).collect();
        self.notes
            .retain(|n| !n.starts_with("v2: ") || !n.contains("not enabled"));
        tracing::info!(controllers = ?names, "enabled v2 controllers for sandboxes");
        Ok(missing)
    }

    /// Whether `pid` is this process or one of its descendants (gone counts as ours:
    /// nothing to move).
    fn is_own_tree(&self, mut pid: i32) -> bool {
        for _ in 0..64 {
            if pid == self.owner.pid {
                return true;
            }
            if pid <= 1 {
                return false;
            }
            let path = self.proc_root.join(pid.to_string()).join("stat");
            pid = match std::fs::read_to_string(&path) {
                Ok(text) => match discover::parse_stat(&path, &text) {
                    Ok(stat) => stat.ppid,
                    Err(_) => return false,
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
                Err(_) => return false,
            };
        }
        false
    }

    /// Kills and removes every `codebox-…` cgroup below the bases whose supervisor is
    /// gone (crashed, or killed before it could clean up). Returns how many it removed;
    /// on failures it still tries every one and returns the first error.
    pub fn cleanup_stale(&self) -> Result<usize> {
        let mut removed = 0;
        let mut first_err = None;
        for cg in self.stale()? {
            let name = cg.name.clone();
            match cg.remove() {
                Ok(()) => {
                    tracing::info!(cgroup = %name, "removed a stale sandbox cgroup");
                    removed += 1;
                }
                Err(e) => {
                    tracing::error!(?e, cgroup = %name, "removing a stale sandbox cgroup failed");
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(removed), Err)
    }

    /// Kills and removes every sandbox cgroup this supervisor created (through any of its
    /// spawner processes). Only for a moment when no spawner of this supervisor runs: the
    /// spawner factory calls it after reaping a dead spawner and before forking the next,
    /// and after the last one exited. Returns how many it removed.
    pub fn remove_owned(&self) -> Result<usize> {
        self.remove_owned_if(|_| true)
    }

    /// As [`CgroupManager::remove_owned`], only the cgroups whose sequence number passes
    /// `which` (see [`start_sequence`]: the upper 32 bits are the creating process's
    /// generation), so one process's clean-up can spare another's cgroups.
    pub fn remove_owned_if(&self, which: impl Fn(u64) -> bool) -> Result<usize> {
        let mut removed = 0;
        let mut first_err = None;
        for cg in self.matching(|owner, seq| owner == self.owner && which(seq))? {
            let name = cg.name.clone();
            match cg.remove() {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::error!(?e, cgroup = %name, "removing a dead spawner's cgroup failed");
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(removed), Err)
    }

    /// The stale sandbox cgroups, as handles (dropping one removes it).
    fn stale(&self) -> Result<Vec<SandboxCgroup>> {
        self.matching(|owner, _| !naming::owner_alive(&self.proc_root, owner))
    }

    /// The sandbox cgroups whose owner and sequence number pass `keep`, as handles
    /// (dropping one removes it).
    fn matching(&self, keep: impl Fn(naming::Owner, u64) -> bool) -> Result<Vec<SandboxCgroup>> {
        let mut found: BTreeMap<String, SandboxCgroup> = BTreeMap::new();
        for (version, base, controllers) in self.bases() {
            let entries = match std::fs::read_dir(base) {
                Ok(e) => e,
                Err(source) => {
                    return Err(Error::Read {
                        path: base.to_path_buf(),
                        source,
                    })
                }
            };
            for dirent in entries.flatten() {
                let Some(name) = dirent.file_name().to_str().map(str::to_string) else {
                    continue;
                };
                let (Some(owner), Some(seq)) =
                    (naming::parse_name(&name), naming::parse_seq(&name))
                else {
                    continue;
                };
                if !dirent.file_type().is_ok_and(|t| t.is_dir()) || !keep(owner, seq) {
                    continue;
                }
                let cg = found.entry(name.clone()).or_insert_with(|| SandboxCgroup {
                    name: name.clone(),
                    v2: None,
                    v1: Vec::new(),
                    proc_root: self.proc_root.clone(),
                    removed: false,
                });
                let path = dirent.path();
                if version == 2 {
                    let cgroup_path = self
                        .v2
                        .as_ref()
                        .map(|b| join_cgroup_path(&b.cgroup_path, &name));
                    cg.v2 = Some(V2Dir {
                        path,
                        cgroup_path: cgroup_path.unwrap_or_default(),
                        fd: None,
                        controllers: controllers.to_vec(),
                    });
                } else {
                    cg.v1.push(V1Dir {
                        path,
                        controllers: controllers.to_vec(),
                    });
                }
            }
        }
        Ok(found.into_values().collect())
    }

    fn bases(&self) -> Vec<(u8, &Path, &[Controller])> {
        let v2 = self
            .v2
            .iter()
            .map(|b| (2, b.dir.as_path(), b.enabled.as_slice()));
        let v1 = self
            .v1
            .iter()
            .map(|b| (1, b.dir.as_path(), b.controllers.as_slice()));
        v2.chain(v1).collect()
    }

    /// Creates the cgroup of one sandbox, `codebox-<pid>-<start>-<seq>[-<name_hint>]`, in
    /// every hierarchy, with `limits` written. `name_hint` is at most 24 of
    /// `[A-Za-z0-9_]` (or empty). A limit whose controller is on no usable hierarchy is
    /// an error ([`Error::ControllerUnavailable`]): the caller decides whether to run
    /// without it. On any failure whatever was created is removed again.
    pub fn create(&self, name_hint: &str, limits: &CgroupLimits) -> Result<SandboxCgroup> {
        let hint = naming::check_hint(name_hint)?;
        limits.validate()?;
        for controller in limits.controllers() {
            if !self.has(controller) {
                // The caller decides what this means (doctor reports it, run fails with it).
                tracing::debug!(%controller, "a limit's controller is not available");
                return Err(Error::ControllerUnavailable { controller });
            }
        }
        if self.v2.is_none() && self.v1.is_empty() {
            return Err(Error::NoHierarchy);
        }
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let name = naming::sandbox_name(self.owner, seq, hint);
        // Built up step by step: on an early return, dropping it removes what exists.
        let mut cg = SandboxCgroup {
            name: name.clone(),
            v2: None,
            v1: Vec::new(),
            proc_root: self.proc_root.clone(),
            removed: false,
        };
        if let Some(base) = &self.v2 {
            let path = base.dir.join(&name);
            mkdir(&path)?;
            let dir = cg.v2.insert(V2Dir {
                path,
                cgroup_path: join_cgroup_path(&base.cgroup_path, &name),
                fd: None,
                controllers: base.enabled.clone(),
            });
            v2::apply_limits(&dir.path, &base.enabled, limits)?;
            dir.fd = Some(v2::open_dir(&dir.path)?);
        }
        for base in &self.v1 {
            let path = base.dir.join(&name);
            mkdir(&path)?;
            cg.v1.push(V1Dir {
                path: path.clone(),
                controllers: base.controllers.clone(),
            });
            if base.with_cpuset {
                v1::inherit_cpuset(&base.dir, &path)?;
            }
            v1::apply_limits(&path, &base.controllers, limits)?;
        }
        Ok(cg)
    }

    fn has(&self, c: Controller) -> bool {
        self.v2.as_ref().is_some_and(|b| b.enabled.contains(&c))
            || self.v1.iter().any(|b| b.controllers.contains(&c))
    }

    /// Prepares, as root, a cgroup in which the user `uid:gid` can run codebox rootless,
    /// `<base>/<dir_name>` below root's own cgroup in every hierarchy this manager uses
    /// (created or reused, then the directory, its `cgroup.procs` and `tasks` (v1) or
    /// `cgroup.threads` and `cgroup.subtree_control` (v2) chowned to the user), and returns
    /// the `cgroup.procs` files into which root writes the pid of the process that will
    /// exec the rootless program (on v2 only root may move it: see [`delegate`]). Root's
    /// own `cgroup.subtree_control` is left as it is. Undo: `rmdir` the directories once
    /// those processes have exited. `codebox setup-cgroups` does the same below its
    /// own cgroup in each hierarchy ([`delegate::at_roots`]); both go through [`delegate::plan`] and
    /// [`delegate::apply`].
    ///
    /// `cargo xtask test` cannot link this crate, so it repeats these steps itself with
    /// `dir_name = codebox-delegated-<user>`; on the development machine that is
    /// `/sys/fs/cgroup/{unified,pids,cpu,cpuacct,freezer}/codebox-delegated-codebox-test`
    /// and `/sys/fs/cgroup/memory/<root's memory cgroup>/codebox-delegated-codebox-test`.
    pub fn delegate_for_user(
        &self,
        dir_name: &str,
        uid: u32,
        gid: u32,
    ) -> std::result::Result<Vec<PathBuf>, delegate::DelegationError> {
        let plan = delegate::plan(&self.own_parents(), dir_name, uid, gid)?;
        delegate::apply(&plan)?;
        Ok(plan
            .dirs
            .iter()
            .map(|d| d.dir.join("cgroup.procs"))
            .collect())
    }

    /// This manager's bases as delegation parents: only what sandboxes here get.
    fn own_parents(&self) -> Vec<delegate::ParentDir> {
        let v2 = self.v2.iter().map(|b| delegate::ParentDir {
            version: 2,
            controllers: b.enabled.clone(),
            enabled: b.enabled.clone(),
            dir: b.dir.clone(),
            cgroup_path: b.cgroup_path.clone(),
            read_only: false,
            with_cpuset: false,
        });
        let v1 = self.v1.iter().map(|b| delegate::ParentDir {
            version: 1,
            controllers: b.controllers.clone(),
            enabled: Vec::new(),
            dir: b.dir.clone(),
            cgroup_path: b.cgroup_path.clone(),
            read_only: false,
            with_cpuset: b.with_cpuset,
        });
        v2.chain(v1).collect()
    }
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir(path).map_err(|source| {
        tracing::error!(?source, cgroup = %path.display(), "creating the sandbox cgroup failed");
        Error::Create {
            path: path.to_path_buf(),
            source,
        }
    })
}

fn join_cgroup_path(parent: &str, name: &str) -> String {
    format!("{}/{name}", parent.trim_end_matches('/'))
}

/// Limits are `u64` in the API and `i64` in cgroups-rs.
fn as_i64(what: &str, value: u64) -> Result<i64> {
    i64::try_from(value)
        .map_err(|_| Error::InvalidLimit(format!("{what} limit {value} is too large")))
}

#[cfg(test)]
mod tests;
