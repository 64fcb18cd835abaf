//! Delegating a cgroup subtree to an unprivileged user, as root: what
//! `codebox setup-cgroups` does on hosts without systemd, and what
//! [`CgroupManager::delegate_for_user`](super::CgroupManager::delegate_for_user) does
//! below root's own cgroups.
//!
//! Three steps, each its own function:
//!
//! 1. **Where**: one [`ParentDir`] per hierarchy codebox uses — the v2 hierarchy when it
//!    is mounted (even without controllers: `cgroup.kill`, `CLONE_INTO_CGROUP`), and
//!    every v1 hierarchy carrying memory, pids, cpu, cpuacct or freezer. [`at_roots`]
//!    takes this process's own cgroup in each hierarchy, so a delegation stays within
//!    the bounds the administrator's session is under (run from a boot script, that is
//!    the top of each hierarchy: `/sys/fs/cgroup/memory/<name>`, …); a manager's own
//!    cgroups are the other choice.
//! 2. **Plan** ([`plan`]): plain data — per hierarchy the directory, what to chown, the
//!    v2 controllers to enable in the parent's `cgroup.subtree_control`, whether `cpuset`
//!    values must be copied, and where a process goes to enter it. Bad names, uid 0 and
//!    read-only hierarchies are refused here, before anything changes.
//! 3. **Execute**: [`apply`] (create and chown; running it twice is fine),
//!    [`enter_self`] (move this process in), [`remove`] (refused while a process is
//!    inside).
//!
//! # Entering
//!
//! codebox creates sandbox cgroups below its own cgroup, so the user's codebox must run
//! inside the delegated directories. Who may move it there is the kernel's decision:
//!
//! - **v1**: a process may move itself (or another process of its uid) into a cgroup
//!   whose `cgroup.procs` it may write, wherever it comes from. The user can enter the v1
//!   directories alone.
//! - **v2**: moving also needs write access to `cgroup.procs` of the *common ancestor*
//!   of the source and destination cgroups; for a process in a root-owned cgroup that is
//!   root's. So root moves it (or starts it there). Root puts it into
//!   `<dir>/codebox-supervisor`, the leaf discovery already recognises: `<dir>` itself
//!   then holds no process, and the user's codebox may enable controllers for its
//!   sandboxes there (v2's "no internal processes" rule) however many processes the
//!   entered command starts. Without the v2 part (a user entering alone on a hybrid host)
//!   codebox uses the v1 hierarchies only: the limits hold, a kill is freeze-then-kill.

use std::os::unix::fs::{chown, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::discover::{self, Membership};
use super::{files, naming, v1, v2, Controller, SUPERVISOR_LEAF};

/// The directory name `setup-cgroups` uses when none is given.
pub fn default_name(user: &str) -> String {
    format!("codebox-delegated-{user}")
}

/// Longest accepted directory name.
const MAX_NAME: usize = 64;

/// How long [`remove`] retries a directory the kernel still calls busy (processes that
/// just exited).
const RMDIR_PATIENCE: Duration = Duration::from_secs(2);

/// Errors of delegation: planning, applying, entering and removing.
#[derive(Debug, thiserror::Error)]
pub enum DelegationError {
    #[error("invalid cgroup directory name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    #[error("cgroups are not delegated to root (uid 0): root needs no delegation")]
    ToRoot,
    #[error(
        "no cgroup hierarchy codebox uses is mounted (cgroup2, or v1 memory/pids/cpu/\
         cpuacct/freezer under /sys/fs/cgroup)"
    )]
    NoHierarchy,
    #[error(
        "the {hierarchy} hierarchy at {path} is mounted read-only: nothing can be created \
         there (remount it read-write, e.g. `mount -o remount,rw {path}`, or run this where \
         the cgroup hierarchies are writable)"
    )]
    ReadOnly { hierarchy: String, path: PathBuf },
    #[error(
        "{path} exists and belongs to uid {owner}, not to uid {uid}: it is someone else's \
         delegation (pick another --name, or remove that one first)"
    )]
    OwnedByOther { path: PathBuf, owner: u32, uid: u32 },
    #[error(
        "cannot enable {controllers} for the delegated cgroup in {path}{}",
        internal_processes_hint(.source)
    )]
    EnableControllers {
        path: PathBuf,
        controllers: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", busy_text(.busy))]
    Busy { busy: Vec<(PathBuf, Vec<i32>)> },
    #[error("nothing to enter: {}", .reasons.join("; "))]
    NothingToEnter { reasons: Vec<String> },
    #[error(transparent)]
    Cgroup(#[from] super::Error),
}

/// EBUSY from `cgroup.subtree_control`, in words.
fn internal_processes_hint(source: &std::io::Error) -> &'static str {
    if source.raw_os_error() == Some(libc::EBUSY) {
        " (that cgroup holds processes itself, which v2's \"no internal processes\" rule \
         forbids for a cgroup that passes controllers down, as in a container's own cgroup: \
         move its processes into a child cgroup first)"
    } else {
        ""
    }
}

fn busy_text(busy: &[(PathBuf, Vec<i32>)]) -> String {
    let mut pids: Vec<i32> = busy.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    pids.sort_unstable();
    pids.dedup();
    let dirs: Vec<String> = busy.iter().map(|(d, _)| d.display().to_string()).collect();
    format!(
        "the delegation is in use by processes {pids:?} (in {}): stop them (the user's \
         codebox and what it started) and remove it again",
        dirs.join(", ")
    )
}

type Result<T> = std::result::Result<T, DelegationError>;

/// One hierarchy a delegated directory goes into, below `dir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParentDir {
    /// 1 or 2.
    pub version: u8,
    /// v1: the hierarchy's controllers codebox uses. v2: those the parent offers its
    /// children once enabled (its `cgroup.controllers`).
    pub controllers: Vec<Controller>,
    /// v2: those already enabled for its children (its `cgroup.subtree_control`).
    pub enabled: Vec<Controller>,
    /// The parent cgroup's directory.
    pub dir: PathBuf,
    /// The parent as `/proc/<pid>/cgroup` names it (`/` for the top).
    pub cgroup_path: String,
    /// The mount is read-only.
    pub read_only: bool,
    /// v1: `cpuset` is co-mounted, so a new cgroup needs `cpuset.cpus`/`cpuset.mems`.
    pub with_cpuset: bool,
}

/// The tops of the hierarchies codebox uses, and the ones it skipped with the reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Roots {
    pub parents: Vec<ParentDir>,
    pub notes: Vec<String>,
}

/// This process's cgroup in every hierarchy codebox uses, from `<proc_root>/self/cgroup`
/// and `<proc_root>/self/mountinfo` (mount points relative to `fs_root`, as in
/// discovery): the parents of a delegation. From a boot script (init's cgroups) these
/// are the tops of the hierarchies.
pub fn at_roots(proc_root: &Path, fs_root: &Path) -> Result<Roots> {
    let self_dir = proc_root.join("self");
    let cgroup_file = self_dir.join("cgroup");
    let memberships = discover::parse_proc_cgroup(&cgroup_file, &files::read(&cgroup_file)?)?;
    let mounts = discover::parse_mountinfo(&files::read(&self_dir.join("mountinfo"))?);
    roots_of(&memberships, &mounts, fs_root)
}

/// [`at_roots`] from parsed files; reads only the v2 top's controller lists.
pub(super) fn roots_of(
    memberships: &[Membership],
    mounts: &[discover::CgroupMount],
    fs_root: &Path,
) -> Result<Roots> {
    let mut roots = Roots::default();
    for m in memberships {
        // Of several mounts of one hierarchy, the one showing the most of it.
        let (version, mount, controllers) = if m.is_v2() {
            let mount = mounts
                .iter()
                .filter(|mt| mt.v2)
                .min_by_key(|mt| mt.root.len());
            (2, mount, Vec::new())
        } else {
            let controllers = discover::v1_controllers(m);
            if controllers.is_empty() {
                continue;
            }
            let mount = discover::v1_mounts(m, mounts).min_by_key(|mt| mt.root.len());
            (1, mount, controllers)
        };
        let Some(mount) = mount else {
            roots.notes.push(format!(
                "{}: not mounted",
                hierarchy_name(version, &controllers)
            ));
            continue;
        };
        // Below this process's own cgroup: a delegation stays inside whatever bounds
        // the administrator's own session is under (run from a boot script, that is the
        // hierarchy's top).
        // (A process whose cgroup its mount does not show, as in a container without a
        // cgroup namespace: below what the mount shows.)
        let own = discover::dir_in_mount(fs_root, mount, &m.path).map(|d| (d, m.path.clone()));
        let shown =
            || discover::dir_in_mount(fs_root, mount, &mount.root).map(|d| (d, mount.root.clone()));
        let Some((dir, cgroup_path)) = own.or_else(shown) else {
            continue;
        };
        let (controllers, enabled) = if version == 2 {
            (
                discover::v2_controllers(&dir.join("cgroup.controllers"))?,
                discover::v2_controllers(&dir.join("cgroup.subtree_control"))?,
            )
        } else {
            (controllers, Vec::new())
        };
        roots.parents.push(ParentDir {
            version,
            controllers,
            enabled,
            dir,
            cgroup_path,
            read_only: mount.read_only,
            with_cpuset: m.controllers.iter().any(|c| c == "cpuset"),
        });
    }
    // v2 first, as the manager lists its hierarchies; v1 in `/proc/self/cgroup` order.
    roots.parents.sort_by_key(|p| std::cmp::Reverse(p.version));
    Ok(roots)
}

/// `v2`, `v1 memory`, `v1 cpu,cpuacct`.
fn hierarchy_name(version: u8, controllers: &[Controller]) -> String {
    if version == 2 {
        return "v2".to_string();
    }
    let names: Vec<&str> = controllers.iter().map(|c| c.name()).collect();
    format!("v1 {}", names.join(","))
}

/// What delegating `name` to `uid:gid` does, hierarchy by hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DelegationPlan {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub dirs: Vec<PlannedDir>,
}

/// The delegated directory in one hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedDir {
    /// 1 or 2.
    pub version: u8,
    /// v1: the hierarchy's controllers; v2: those the directory offers the user's
    /// codebox (its `cgroup.controllers` once the plan ran).
    pub controllers: Vec<Controller>,
    pub parent: PathBuf,
    /// `<parent>/<name>`.
    pub dir: PathBuf,
    /// The directory as `/proc/<pid>/cgroup` names it.
    pub cgroup_path: String,
    /// v2: written to the parent's `cgroup.subtree_control` (`+memory +pids +cpu`).
    pub enable_in_parent: Vec<Controller>,
    /// v1: copy `cpuset.cpus` and `cpuset.mems` from the parent.
    pub copy_cpuset: bool,
    /// Given to the user: the directory, then the files it must write.
    pub chown: Vec<PathBuf>,
    /// v2: the leaf a process is moved into to enter (`<dir>/codebox-supervisor`).
    pub leaf: Option<PathBuf>,
}

impl PlannedDir {
    /// `v2`, `v1 memory`, `v1 cpu,cpuacct`.
    pub fn hierarchy(&self) -> String {
        hierarchy_name(self.version, &self.controllers)
    }

    /// The `cgroup.procs` a process is written to to enter this directory.
    pub fn entry(&self) -> PathBuf {
        self.leaf.as_ref().unwrap_or(&self.dir).join("cgroup.procs")
    }
}

/// Checks a delegated directory's name: one path component of `[A-Za-z0-9._@-]`, at most
/// 64 bytes, no `..`, not starting with `.`, and never a name codebox itself gives its
/// cgroups (a sandbox's `codebox-<pid>-<start>-<seq>`, which stale clean-up removes, or
/// the supervisor leaf).
pub fn check_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.contains('/') {
        Some("it contains '/' (one directory name, not a path)")
    } else if name.contains("..") || name.starts_with('.') {
        Some("it contains '..' or starts with '.'")
    } else if name.len() > MAX_NAME {
        Some("it is longer than 64 bytes")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"._@-".contains(&b))
    {
        Some("only letters, digits and . _ @ - are allowed")
    } else if naming::parse_name(name).is_some() || name == SUPERVISOR_LEAF {
        Some("codebox uses names like this for its own cgroups")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(DelegationError::InvalidName {
            name: name.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Plans delegating `name` below every parent to `uid:gid`. Nothing is read or written.
pub fn plan(parents: &[ParentDir], name: &str, uid: u32, gid: u32) -> Result<DelegationPlan> {
    check_name(name)?;
    if uid == 0 {
        return Err(DelegationError::ToRoot);
    }
    if parents.is_empty() {
        return Err(DelegationError::NoHierarchy);
    }
    if let Some(ro) = parents.iter().find(|p| p.read_only) {
        return Err(DelegationError::ReadOnly {
            hierarchy: hierarchy_name(ro.version, &ro.controllers),
            path: ro.dir.clone(),
        });
    }
    let dirs = parents
        .iter()
        .map(|p| {
            let dir = p.dir.join(name);
            // What the kernel's delegation model (cgroup-v2.rst, "Delegation") and v1's
            // permission checks need the user to own.
            let files: &[&str] = if p.version == 2 {
                &["cgroup.procs", "cgroup.threads", "cgroup.subtree_control"]
            } else {
                &["cgroup.procs", "tasks"]
            };
            let chown = std::iter::once(dir.clone())
                .chain(files.iter().map(|f| dir.join(f)))
                .collect();
            PlannedDir {
                version: p.version,
                controllers: p.controllers.clone(),
                parent: p.dir.clone(),
                cgroup_path: format!("{}/{name}", p.cgroup_path.trim_end_matches('/')),
                enable_in_parent: if p.version == 2 {
                    let missing = p.controllers.iter().filter(|c| !p.enabled.contains(c));
                    missing.copied().collect()
                } else {
                    Vec::new()
                },
                copy_cpuset: p.version == 1 && p.with_cpuset,
                chown,
                leaf: (p.version == 2).then(|| dir.join(SUPERVISOR_LEAF)),
                dir,
            }
        })
        .collect();
    Ok(DelegationPlan {
        name: name.to_string(),
        uid,
        gid,
        dirs,
    })
}

/// What [`apply`] did in one hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub dir: PathBuf,
    /// Created now (else it existed and was taken over again).
    pub created: bool,
    /// v2 controllers enabled in the parent now.
    pub enabled: Vec<Controller>,
}

/// Carries out a plan: per hierarchy, enable the v2 controllers in the parent, create the
/// directory (reusing one that exists and is root's or the user's), copy the cpuset
/// values, chown. Running it again changes nothing.
pub fn apply(plan: &DelegationPlan) -> Result<Vec<Applied>> {
    let mut done = Vec::new();
    for d in &plan.dirs {
        // 1. v2 offers a child only the controllers enabled in the parent's
        //    cgroup.subtree_control; the user cannot write the parent's.
        let enabled = enable_in_parent(d)?;
        // 2. The directory itself.
        let created = make_dir(d, plan.uid)?;
        // 3. A v1 cpuset-co-mounted cgroup takes no process until it has cpus and mems.
        if d.copy_cpuset {
            v1::inherit_cpuset(&d.parent, &d.dir)?;
        }
        // 4. Hand it over: the user may now create cgroups in it and move processes in.
        for path in &d.chown {
            chown(path, Some(plan.uid), Some(plan.gid)).map_err(|source| {
                tracing::error!(?source, path = %path.display(), uid = plan.uid, "chown for delegation failed");
                super::Error::Chown {
                    path: path.clone(),
                    source,
                }
            })?;
        }
        tracing::info!(dir = %d.dir.display(), created, uid = plan.uid, "cgroup delegated");
        done.push(Applied {
            dir: d.dir.clone(),
            created,
            enabled,
        });
    }
    Ok(done)
}

fn enable_in_parent(d: &PlannedDir) -> Result<Vec<Controller>> {
    let file = d.parent.join("cgroup.subtree_control");
    // Enabled meanwhile (a second run, another delegation): nothing to write.
    let enabled = discover::v2_controllers(&file)?;
    let missing: Vec<Controller> = d
        .enable_in_parent
        .iter()
        .copied()
        .filter(|c| !enabled.contains(c))
        .collect();
    if missing.is_empty() {
        return Ok(missing);
    }
    let line = v2::subtree_control_line(&missing);
    files::write_io(&file, &line).map_err(|source| {
        tracing::error!(?source, path = %file.display(), %line, "enabling v2 controllers for the delegation failed");
        DelegationError::EnableControllers {
            path: file.clone(),
            controllers: line.clone(),
            source,
        }
    })?;
    Ok(missing)
}

/// Creates `d.dir`; an existing directory is reused when root or `uid` owns it.
fn make_dir(d: &PlannedDir, uid: u32) -> Result<bool> {
    match std::fs::create_dir(&d.dir) {
        Ok(()) => return Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
            tracing::error!(dir = %d.dir.display(), "cgroup hierarchy is read-only");
            return Err(DelegationError::ReadOnly {
                hierarchy: d.hierarchy(),
                path: d.parent.clone(),
            });
        }
        Err(source) => {
            tracing::error!(?source, dir = %d.dir.display(), "creating the delegated cgroup failed");
            return Err(super::Error::Create {
                path: d.dir.clone(),
                source,
            }
            .into());
        }
    }
    check_owner(&d.dir, uid)?;
    Ok(false)
}

/// Refuses a directory that belongs to neither root nor `uid`.
fn check_owner(dir: &Path, uid: u32) -> Result<()> {
    let meta = std::fs::metadata(dir).map_err(|source| super::Error::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    let owner = meta.uid();
    if owner != 0 && owner != uid {
        tracing::error!(dir = %dir.display(), owner, uid, "delegated cgroup belongs to someone else");
        return Err(DelegationError::OwnedByOther {
            path: dir.to_path_buf(),
            owner,
            uid,
        });
    }
    Ok(())
}

/// How [`enter_self`] fared in one hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entered {
    /// Moved in by writing to this `cgroup.procs`.
    Joined(PathBuf),
    /// This process already is in the directory or below it.
    AlreadyInside,
    /// Not entered, and why.
    Skipped(String),
}

/// Moves this process into the delegated directories of `plan` (after [`apply`]).
///
/// As root (`as_root`) every hierarchy is entered; on v2 the process goes into the leaf
/// `<dir>/codebox-supervisor`, made and given to the user here. As the user only what it
/// owns is entered, which the kernel allows on v1 alone (see the module docs); the v2
/// part is skipped with the reason. [`DelegationError::NothingToEnter`] when no
/// hierarchy could be entered.
pub fn enter_self(
    plan: &DelegationPlan,
    proc_root: &Path,
    as_root: bool,
) -> Result<Vec<(PathBuf, Entered)>> {
    let own_file = proc_root.join("self/cgroup");
    let own = discover::parse_proc_cgroup(&own_file, &files::read(&own_file)?)?;
    let pid = std::process::id().to_string();
    let mut outcome = Vec::new();
    for d in &plan.dirs {
        let entered = if inside(&own, d) {
            Entered::AlreadyInside
        } else if as_root {
            if let Some(leaf) = &d.leaf {
                make_leaf(leaf, plan)?;
            }
            join(&d.entry(), &pid)?;
            Entered::Joined(d.entry())
        } else if d.version == 2 {
            Entered::Skipped(
                "only root can move a process into a v2 cgroup here (moving needs write \
                 access to the cgroup.procs of the common ancestor, a root-owned cgroup)"
                    .to_string(),
            )
        } else if !d.dir.is_dir() {
            Entered::Skipped(format!("{} does not exist", d.dir.display()))
        } else if let Some(other) = [d.dir.clone(), d.entry()]
            .into_iter()
            .find(|p| std::fs::metadata(p).map_or(true, |m| m.uid() != plan.uid))
        {
            Entered::Skipped(format!("{} is not yours", other.display()))
        } else {
            join(&d.entry(), &pid)?;
            Entered::Joined(d.entry())
        };
        tracing::debug!(dir = %d.dir.display(), ?entered, "entering the delegation");
        outcome.push((d.dir.clone(), entered));
    }
    if outcome
        .iter()
        .all(|(_, e)| matches!(e, Entered::Skipped(_)))
    {
        let reasons = plan
            .dirs
            .iter()
            .zip(outcome)
            .filter_map(|(d, (_, e))| match e {
                Entered::Skipped(why) => Some(format!("{}: {why}", d.hierarchy())),
                _ => None,
            })
            .collect();
        tracing::error!(name = %plan.name, uid = plan.uid, "no part of the delegation could be entered");
        return Err(DelegationError::NothingToEnter { reasons });
    }
    Ok(outcome)
}

/// Whether `own` (this process's `/proc/self/cgroup`) places it in `d` or below.
fn inside(own: &[Membership], d: &PlannedDir) -> bool {
    let line = own.iter().find(|m| {
        if d.version == 2 {
            m.is_v2()
        } else {
            discover::v1_controllers(m) == d.controllers
        }
    });
    line.is_some_and(|m| {
        m.path == d.cgroup_path
            || m.path
                .strip_prefix(&d.cgroup_path)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// The v2 leaf, owned by the user like the directory (the user's codebox moves its own
/// processes within the delegation).
fn make_leaf(leaf: &Path, plan: &DelegationPlan) -> Result<()> {
    match std::fs::create_dir(leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            tracing::error!(?source, leaf = %leaf.display(), "creating the delegation's leaf failed");
            return Err(super::Error::Create {
                path: leaf.to_path_buf(),
                source,
            }
            .into());
        }
    }
    for path in [
        leaf.to_path_buf(),
        leaf.join("cgroup.procs"),
        leaf.join("cgroup.threads"),
    ] {
        chown(&path, Some(plan.uid), Some(plan.gid)).map_err(|source| {
            tracing::error!(?source, path = %path.display(), "chown of the delegation's leaf failed");
            super::Error::Chown { path, source }
        })?;
    }
    Ok(())
}

fn join(procs: &Path, pid: &str) -> Result<()> {
    files::write(procs, pid).inspect_err(|e| {
        tracing::error!(?e, procs = %procs.display(), "moving into the delegated cgroup failed");
    })?;
    Ok(())
}

/// What [`remove`] found in one hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Removed, with this many directories below it (leftover sandbox cgroups, the leaf).
    Removed { below: usize },
    /// There was nothing.
    Absent,
}

/// Removes the delegated directories of `plan`, every directory below them first. Refused
/// with [`DelegationError::Busy`] — before anything is removed — while any of them holds
/// a process, and with [`DelegationError::OwnedByOther`] for a directory that is neither
/// root's nor the plan's user's. v2 controllers enabled in a parent stay enabled (other
/// children may use them).
pub fn remove(plan: &DelegationPlan) -> Result<Vec<(PathBuf, Removal)>> {
    // 1. Whose they are, and whether anyone is inside, for every hierarchy first.
    let present: Vec<&PlannedDir> = plan.dirs.iter().filter(|d| d.dir.is_dir()).collect();
    for d in &present {
        check_owner(&d.dir, plan.uid)?;
    }
    let busy = processes_inside(present.iter().map(|d| d.dir.as_path()))?;
    if !busy.is_empty() {
        tracing::error!(?busy, "the delegation still holds processes");
        return Err(DelegationError::Busy { busy });
    }
    // 2. Deepest first: a cgroup with children cannot be removed.
    let deadline = Instant::now() + RMDIR_PATIENCE;
    let mut outcome = Vec::new();
    for d in &plan.dirs {
        if !present.contains(&d) {
            outcome.push((d.dir.clone(), Removal::Absent));
            continue;
        }
        let below = files::subdirs_deepest_first(&d.dir);
        for dir in below.iter().chain([&d.dir]) {
            super::handle::rmdir_retrying(dir, deadline)?;
        }
        tracing::info!(dir = %d.dir.display(), below = below.len(), "delegated cgroup removed");
        outcome.push((d.dir.clone(), Removal::Removed { below: below.len() }));
    }
    Ok(outcome)
}

/// The cgroups among `dirs` and their subdirectories that hold processes, with the pids.
pub(super) fn processes_inside<'a>(
    dirs: impl Iterator<Item = &'a Path>,
) -> Result<Vec<(PathBuf, Vec<i32>)>> {
    let mut busy = Vec::new();
    for dir in dirs {
        let mut all = files::subdirs_deepest_first(dir);
        all.push(dir.to_path_buf());
        for cg in all {
            let procs = cg.join("cgroup.procs");
            let Some(text) = files::read_optional(&procs)? else {
                continue;
            };
            let pids = files::parse_pids(&procs, &text)?;
            if !pids.is_empty() {
                busy.push((cg, pids));
            }
        }
    }
    Ok(busy)
}

/// The delegated directories named `name` at the hierarchy tops that belong to `uid`
/// (for `codebox doctor`: "one exists, but this process is not in it").
pub fn existing(proc_root: &Path, fs_root: &Path, name: &str, uid: u32) -> Vec<PathBuf> {
    if check_name(name).is_err() {
        return Vec::new();
    }
    let Ok(roots) = at_roots(proc_root, fs_root) else {
        return Vec::new();
    };
    roots
        .parents
        .iter()
        .map(|p| p.dir.join(name))
        .filter(|d| std::fs::metadata(d).is_ok_and(|m| m.is_dir() && m.uid() == uid))
        .collect()
}

#[cfg(test)]
mod tests;
