//! Discovery: which cgroup hierarchies this process is in, where they are mounted, which
//! controllers each one carries, and so where codebox may create sandbox cgroups.
//!
//! Inputs are `<proc>/self/cgroup` (one line per hierarchy: `id:controllers:path`, with
//! `0::path` for v2) and `<proc>/self/mountinfo` (the `cgroup` and `cgroup2` mounts). The
//! process's own cgroup in a hierarchy is `mount point + (own path - mount root)`; that
//! directory is the *base* below which sandboxes go. Mount points are taken relative to
//! `fs_root`, so the whole procedure runs against a temp directory in tests.

use std::path::{Path, PathBuf};

use super::error::{Error, Result};
use super::files;
use super::{Controller, SUPERVISOR_LEAF};

/// One line of `/proc/<pid>/cgroup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Membership {
    pub hierarchy_id: u32,
    /// Empty for the v2 hierarchy; `name=systemd` style entries for named v1 hierarchies.
    pub controllers: Vec<String>,
    /// Relative to the reader's cgroup namespace root, starting with `/`.
    pub path: String,
}

impl Membership {
    pub fn is_v2(&self) -> bool {
        self.hierarchy_id == 0 && self.controllers.is_empty()
    }
}

/// Parses `/proc/<pid>/cgroup`.
pub(super) fn parse_proc_cgroup(path: &Path, text: &str) -> Result<Vec<Membership>> {
    let bad = |line: &str| Error::Parse {
        path: path.to_path_buf(),
        reason: format!("malformed line {line:?}"),
    };
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        // The path may itself contain ':', so split at most twice.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(cgroup_path)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad(line));
        };
        let hierarchy_id = id.parse().map_err(|_| bad(line))?;
        let controllers = controllers
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        out.push(Membership {
            hierarchy_id,
            controllers,
            path: cgroup_path.to_string(),
        });
    }
    Ok(out)
}

/// A `cgroup` or `cgroup2` mount from mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CgroupMount {
    /// The cgroup the mount shows at its mount point (field 4), e.g. `/` or `/docker/abc`.
    pub root: String,
    pub mount_point: PathBuf,
    pub v2: bool,
    /// Super options; for v1 they name the controllers (`rw,cpu,cpuacct`).
    pub options: Vec<String>,
    /// The mount (field 6) or its super block is read-only: nothing can be created there.
    pub read_only: bool,
}

/// The cgroup mounts of a mountinfo file (other lines and malformed lines are skipped).
pub(super) fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        // `36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:1 - cgroup cgroup rw,memory`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.len() < 3 {
            continue;
        }
        let v2 = match right[0] {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        let options: Vec<String> = right[2].split(',').map(str::to_string).collect();
        let read_only = left.get(5).is_some_and(|o| o.split(',').any(|o| o == "ro"))
            || options.iter().any(|o| o == "ro");
        out.push(CgroupMount {
            root: unescape(left[3]),
            mount_point: PathBuf::from(unescape(left[4])),
            v2,
            options,
            read_only,
        });
    }
    out
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let digits = bytes.get(i + 1..i + 4).unwrap_or_default();
            if digits.len() == 3 && digits.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the cgroup `cgroup_path` of a hierarchy lives, given one of its mounts; `None`
/// when the mount does not show that cgroup (its root is elsewhere in the hierarchy).
pub(super) fn dir_in_mount(
    fs_root: &Path,
    mount: &CgroupMount,
    cgroup_path: &str,
) -> Option<PathBuf> {
    let root = mount.root.trim_end_matches('/');
    let rest = if root.is_empty() {
        cgroup_path
    } else {
        let tail = cgroup_path.strip_prefix(root)?;
        if !tail.is_empty() && !tail.starts_with('/') {
            return None;
        }
        tail
    };
    let rel_mount = mount
        .mount_point
        .strip_prefix("/")
        .unwrap_or(&mount.mount_point);
    let mut dir = fs_root.join(rel_mount);
    for part in rest.split('/').filter(|p| !p.is_empty()) {
        if part == ".." || part == "." {
            return None;
        }
        dir.push(part);
    }
    Some(dir)
}

/// The v2 hierarchy as codebox will use it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct V2Base {
    /// The supervisor's own v2 cgroup (or the parent of its `codebox-supervisor` leaf).
    pub dir: PathBuf,
    /// The same cgroup as `/proc/<pid>/cgroup` names it (`/` for the namespace root).
    pub cgroup_path: String,
    /// Wanted controllers listed in `<dir>/cgroup.controllers`.
    pub available: Vec<Controller>,
    /// Wanted controllers listed in `<dir>/cgroup.subtree_control`: sandboxes get these.
    pub enabled: Vec<Controller>,
}

/// One v1 hierarchy codebox will use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct V1Base {
    /// The supervisor's own cgroup in this hierarchy.
    pub dir: PathBuf,
    /// The same cgroup as `/proc/<pid>/cgroup` names it.
    pub cgroup_path: String,
    /// The wanted controllers this hierarchy carries.
    pub controllers: Vec<Controller>,
    /// `cpuset` is co-mounted: new cgroups need `cpuset.cpus`/`cpuset.mems` copied in.
    pub with_cpuset: bool,
}

/// Everything discovery found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Layout {
    pub v2: Option<V2Base>,
    pub v1: Vec<V1Base>,
    /// Hierarchies found but not usable, and why (for `codebox doctor`).
    pub notes: Vec<String>,
}

/// Builds the layout from the two `/proc` files; reads `cgroup.controllers` and
/// `cgroup.subtree_control` of the v2 base and checks each base is writable.
pub(super) fn layout(
    memberships: &[Membership],
    mounts: &[CgroupMount],
    fs_root: &Path,
) -> Result<Layout> {
    let mut layout = Layout::default();
    for m in memberships {
        if m.is_v2() {
            v2_base(m, mounts, fs_root, &mut layout)?;
        } else {
            v1_base(m, mounts, fs_root, &mut layout);
        }
    }
    Ok(layout)
}

fn v2_base(
    m: &Membership,
    mounts: &[CgroupMount],
    fs_root: &Path,
    layout: &mut Layout,
) -> Result<()> {
    let Some(mut dir) = mounts
        .iter()
        .filter(|mt| mt.v2)
        .find_map(|mt| dir_in_mount(fs_root, mt, &m.path))
    else {
        layout.notes.push(format!(
            "v2: own cgroup {} is not visible under any cgroup2 mount",
            m.path
        ));
        return Ok(());
    };
    // A supervisor that moved itself into its leaf (see `enable_v2_controllers`) still
    // creates sandboxes next to the leaf, not inside it.
    let mut cgroup_path = m.path.clone();
    if dir.file_name().is_some_and(|n| n == SUPERVISOR_LEAF) {
        dir.pop();
        cgroup_path.truncate(cgroup_path.len() - SUPERVISOR_LEAF.len());
        let trimmed = cgroup_path.trim_end_matches('/').len().max(1);
        cgroup_path.truncate(trimmed);
    }
    if !files::writable(&dir) {
        layout.notes.push(format!(
            "v2: {} is not writable by this user (rootless needs a delegated subtree: \
             systemd Delegate=yes, or `codebox setup-cgroups`)",
            dir.display()
        ));
        return Ok(());
    }
    let available = v2_controllers(&dir.join("cgroup.controllers"))?;
    let enabled = v2_controllers(&dir.join("cgroup.subtree_control"))?;
    let missing: Vec<&str> = available
        .iter()
        .filter(|c| !enabled.contains(c))
        .map(|c| c.name())
        .collect();
    if !missing.is_empty() {
        layout.notes.push(format!(
            "v2: {} available in {} but not enabled in its cgroup.subtree_control \
             (CgroupManager::enable_v2_controllers does that)",
            missing.join(", "),
            dir.display()
        ));
    }
    layout.v2 = Some(V2Base {
        dir,
        cgroup_path,
        available,
        enabled,
    });
    Ok(())
}

/// The controllers codebox uses among those a v2 list file names (`cgroup.controllers`,
/// `cgroup.subtree_control`), sorted; a missing file lists none.
pub(super) fn v2_controllers(file: &Path) -> Result<Vec<Controller>> {
    let text = files::read_optional(file)?.unwrap_or_default();
    let mut found: Vec<Controller> = text
        .split_whitespace()
        .filter_map(Controller::from_v2_name)
        .collect();
    found.sort();
    Ok(found)
}

/// The controllers codebox uses among those of a v1 hierarchy (one `/proc/<pid>/cgroup`
/// line), in the line's order.
pub(super) fn v1_controllers(m: &Membership) -> Vec<Controller> {
    m.controllers
        .iter()
        .filter_map(|c| Controller::from_v1_name(c))
        .collect()
}

/// The mounts of the v1 hierarchy `m` is a line of (every one of its controllers among
/// the mount's super options).
pub(super) fn v1_mounts<'a>(
    m: &'a Membership,
    mounts: &'a [CgroupMount],
) -> impl Iterator<Item = &'a CgroupMount> {
    mounts
        .iter()
        .filter(|mt| !mt.v2 && m.controllers.iter().all(|c| mt.options.contains(c)))
}

fn v1_base(m: &Membership, mounts: &[CgroupMount], fs_root: &Path, layout: &mut Layout) {
    let controllers = v1_controllers(m);
    if controllers.is_empty() {
        return;
    }
    let names = m.controllers.join(",");
    let dir = v1_mounts(m, mounts).find_map(|mt| dir_in_mount(fs_root, mt, &m.path));
    let Some(dir) = dir else {
        layout.notes.push(format!(
            "v1 {names}: own cgroup {} is not visible under any mount",
            m.path
        ));
        return;
    };
    if !files::writable(&dir) {
        layout.notes.push(format!(
            "v1 {names}: {} is not writable by this user (rootless needs it delegated: \
             `codebox setup-cgroups`)",
            dir.display()
        ));
        return;
    }
    layout.v1.push(V1Base {
        dir,
        cgroup_path: m.path.clone(),
        controllers,
        with_cpuset: m.controllers.iter().any(|c| c == "cpuset"),
    });
}

/// The fields of `/proc/<pid>/stat` codebox needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Stat {
    pub pid: i32,
    /// Field 4.
    pub ppid: i32,
    /// Field 22: clock ticks after boot.
    pub start: u64,
}

/// Parses `/proc/<pid>/stat`.
pub(super) fn parse_stat(path: &Path, text: &str) -> Result<Stat> {
    let bad = |reason: &str| Error::Parse {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let pid = text
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| bad("no pid"))?;
    // The command name (field 2) is in parentheses and may contain anything; the fields
    // after the last ')' start with field 3 (state): ppid is index 1, start time index 19.
    let after: Vec<&str> = text
        .rsplit_once(')')
        .ok_or_else(|| bad("no ')'"))?
        .1
        .split_whitespace()
        .collect();
    let ppid = after
        .get(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no parent pid"))?;
    let start = after
        .get(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no start time"))?;
    Ok(Stat { pid, ppid, start })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This development machine: memory on v1 at a nested path, the rest of the v1
    /// controllers at `/`, and a controller-less v2 hierarchy at /sys/fs/cgroup/unified.
    pub const HYBRID_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n\
        5:devices:/\n4:memory:/process_api/abc\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";
    pub const HYBRID_MOUNTINFO: &str = "\
25 1 0:22 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_proc_cgroup() {
        let p = Path::new("cgroup");
        let ms = parse_proc_cgroup(p, HYBRID_CGROUP).unwrap();
        assert_eq!(ms.len(), 10);
        assert_eq!(
            ms[5],
            Membership {
                hierarchy_id: 4,
                controllers: vec!["memory".into()],
                path: "/process_api/abc".into()
            }
        );
        assert!(ms[9].is_v2());
        assert_eq!(ms[0].controllers, vec!["name=systemd".to_string()]);
        let odd = parse_proc_cgroup(p, "1:cpu,cpuacct:/a:b\n").unwrap();
        assert_eq!(
            odd[0].controllers,
            vec!["cpu".to_string(), "cpuacct".into()]
        );
        assert_eq!(odd[0].path, "/a:b");
        assert!(parse_proc_cgroup(p, "x:cpu:/\n").is_err());
        assert!(parse_proc_cgroup(p, "1:cpu\n").is_err());
    }

    #[test]
    fn parses_mountinfo() {
        let mounts = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(mounts.len(), 10, "only cgroup and cgroup2 mounts");
        let unified = mounts.iter().find(|m| m.v2).unwrap();
        assert_eq!(unified.mount_point, Path::new("/sys/fs/cgroup/unified"));
        let cpu = &mounts[0];
        assert_eq!(cpu.options, vec!["rw".to_string(), "cpu".into()]);
        let escaped = parse_mountinfo(
            "1 2 0:3 /docker/a\\040b /sys/fs/cg\\040x rw shared:2 - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        assert_eq!(escaped[0].root, "/docker/a b");
        assert_eq!(escaped[0].mount_point, Path::new("/sys/fs/cg x"));
        assert!(mounts.iter().all(|m| !m.read_only));
        let ro = parse_mountinfo(
            "1 2 0:3 / /sys/fs/cgroup/pids ro,nosuid - cgroup cgroup rw,pids\n\
             1 2 0:4 / /sys/fs/cgroup/cpu rw - cgroup cgroup ro,cpu\n",
        );
        assert!(ro[0].read_only && ro[1].read_only);
    }

    #[test]
    fn own_dir_strips_the_mount_root() {
        let fs = Path::new("/fake");
        let mount = |root: &str| CgroupMount {
            root: root.into(),
            mount_point: "/sys/fs/cgroup".into(),
            v2: true,
            options: vec![],
            read_only: false,
        };
        assert_eq!(
            dir_in_mount(fs, &mount("/"), "/user.slice/codebox.service"),
            Some(PathBuf::from(
                "/fake/sys/fs/cgroup/user.slice/codebox.service"
            ))
        );
        // A container that sees only its own subtree (no cgroup namespace).
        assert_eq!(
            dir_in_mount(fs, &mount("/docker/abc"), "/docker/abc"),
            Some(PathBuf::from("/fake/sys/fs/cgroup"))
        );
        assert_eq!(
            dir_in_mount(fs, &mount("/docker/abc"), "/docker/abc/sub"),
            Some(PathBuf::from("/fake/sys/fs/cgroup/sub"))
        );
        assert_eq!(
            dir_in_mount(fs, &mount("/docker/abc"), "/docker/abcd"),
            None
        );
        assert_eq!(dir_in_mount(fs, &mount("/docker/abc"), "/other"), None);
        assert_eq!(dir_in_mount(fs, &mount("/"), "/a/../b"), None);
    }

    #[test]
    fn parses_stat_with_odd_command_names() {
        let p = Path::new("stat");
        let text = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 \
                    1000 10 18446744073709551615\n";
        assert_eq!(
            parse_stat(p, text).unwrap(),
            Stat {
                pid: 4242,
                ppid: 1,
                start: 987654
            }
        );
        assert!(parse_stat(p, "4242 (x) S 1\n").is_err());
    }
}
