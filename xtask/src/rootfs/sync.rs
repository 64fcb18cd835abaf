//! Making the output directory match the plan with as little work as possible: remove what
//! the plan does not have, copy a file only when its size or mtime differs from its source
//! (copies keep the source's mtime), fix modes, re-point symlinks. Files get their sealed
//! mode here; directories are sealed by `seal::seal` once everything is written (see
//! `seal.rs`), and opened only where something is written into them.

use std::fs::{self, File, FileTimes, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use super::plan::{Entry, Plan};
use super::seal::{file_mode, open_dir, open_tree};
use super::state::{Key, State};

/// The manifest sits in the rootfs but is not part of the plan.
pub const MANIFEST: &str = ".manifest";

#[derive(Debug, Default)]
pub struct Stats {
    pub copied: usize,
    pub copied_bytes: u64,
    pub unchanged: usize,
    pub removed: usize,
}

pub fn sync(plan: &Plan, out: &Path, state: &mut State) -> Result<Stats> {
    let mut stats = Stats::default();
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    prune(plan, out, Path::new(""), &mut stats)?;
    for (rel, entry) in plan.entries() {
        let dest = out.join(rel);
        let existing = fs::symlink_metadata(&dest).ok();
        let parent = dest.parent().unwrap_or(out);
        match entry {
            Entry::Dir => {
                if existing.is_none() {
                    open_dir(parent)?;
                    fs::create_dir(&dest)
                        .with_context(|| format!("creating {}", dest.display()))?;
                }
            }
            Entry::File { src, mode } => {
                let src_meta =
                    fs::metadata(src).with_context(|| format!("reading {}", src.display()))?;
                let same = existing
                    .as_ref()
                    .is_some_and(|m| m.is_file() && Key::of(m) == Key::of(&src_meta));
                if same {
                    stats.unchanged += 1;
                    set_mode(&dest, file_mode(*mode))?;
                } else {
                    open_dir(parent)?;
                    copy(src, &src_meta, &dest, file_mode(*mode), rel, state)?;
                    stats.copied += 1;
                    stats.copied_bytes += src_meta.len();
                }
            }
            Entry::Symlink { target } => {
                if fs::read_link(&dest).ok().as_ref() != Some(target) {
                    open_dir(parent)?;
                    if existing.is_some() {
                        fs::remove_file(&dest)
                            .with_context(|| format!("removing {}", dest.display()))?;
                    }
                    symlink(target, &dest)
                        .with_context(|| format!("creating link {}", dest.display()))?;
                }
            }
            Entry::Generated => {}
        }
    }
    Ok(stats)
}

/// Remove everything under `out/sub` that the plan does not have, or has as another kind.
fn prune(plan: &Plan, out: &Path, sub: &Path, stats: &mut Stats) -> Result<()> {
    let dir = out.join(sub);
    let mut children = Vec::new();
    for e in fs::read_dir(&dir).with_context(|| format!("reading directory {}", dir.display()))? {
        children.push(e.with_context(|| format!("reading directory {}", dir.display()))?);
    }
    for e in children {
        let rel = sub.join(e.file_name());
        if rel == Path::new(MANIFEST) {
            continue;
        }
        let path = e.path();
        let ft = e
            .file_type()
            .with_context(|| format!("reading {}", path.display()))?;
        let keep = match plan.get(&rel) {
            Some(Entry::Dir) => ft.is_dir(),
            Some(Entry::File { .. } | Entry::Generated) => ft.is_file(),
            Some(Entry::Symlink { .. }) => ft.is_symlink(),
            None => false,
        };
        if keep {
            if ft.is_dir() {
                prune(plan, out, &rel, stats)?;
            }
            continue;
        }
        open_dir(&dir)?;
        if ft.is_dir() {
            open_tree(&path)?;
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
        stats.removed += 1;
    }
    Ok(())
}

/// Copy `src` to `dest` through a temporary file, hashing on the way, with `mode` and the
/// source's mtime; record the hash in `state`.
fn copy(
    src: &Path,
    src_meta: &fs::Metadata,
    dest: &Path,
    mode: u32,
    rel: &Path,
    state: &mut State,
) -> Result<()> {
    let name = dest.file_name().context("no file name")?.to_string_lossy();
    let tmp: PathBuf = dest.with_file_name(format!(".{name}.codebox-tmp"));
    let mut input = File::open(src).with_context(|| format!("opening {}", src.display()))?;
    let mut output = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", src.display())),
        };
        hasher.update(&buf[..n]);
        output
            .write_all(&buf[..n])
            .with_context(|| format!("writing {}", tmp.display()))?;
    }
    output
        .set_permissions(Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", tmp.display()))?;
    let mtime = src_meta
        .modified()
        .with_context(|| format!("reading mtime of {}", src.display()))?;
    output
        .set_times(FileTimes::new().set_modified(mtime))
        .with_context(|| format!("setting mtime of {}", tmp.display()))?;
    let meta = output
        .metadata()
        .with_context(|| format!("reading {}", tmp.display()))?;
    drop(output);
    if fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
        open_tree(dest)?;
        fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    fs::rename(&tmp, dest)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    state.record(rel, &meta, hasher.finalize().into());
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    let meta = fs::symlink_metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.permissions().mode() & 0o7777 != mode {
        fs::set_permissions(path, Permissions::from_mode(mode))
            .with_context(|| format!("chmod {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn second_sync_copies_nothing_and_extras_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        let out = t.path().join("out");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("a"), "hello").unwrap();
        fs::write(src.join("x"), "#!").unwrap();
        fs::set_permissions(src.join("x"), Permissions::from_mode(0o4711)).unwrap();
        let mut plan = Plan::default();
        plan.file("d/a", &src.join("a")).unwrap();
        plan.file("d/x", &src.join("x")).unwrap();
        plan.symlink("d/l", "a").unwrap();
        plan.dir("e").unwrap();
        let mut state = State::default();

        let s = sync(&plan, &out, &mut state).unwrap();
        assert_eq!((s.copied, s.unchanged), (2, 0));
        let x = fs::metadata(out.join("d/x")).unwrap();
        assert_eq!(x.mode() & 0o7777, 0o555);
        assert_eq!(x.mtime(), fs::metadata(src.join("x")).unwrap().mtime());
        assert_eq!(
            fs::metadata(out.join("d/a")).unwrap().mode() & 0o7777,
            0o444
        );
        assert_eq!(fs::read_link(out.join("d/l")).unwrap(), Path::new("a"));

        fs::write(out.join("d/stray"), "").unwrap();
        fs::create_dir_all(out.join("old/deep")).unwrap();
        fs::write(out.join(MANIFEST), "kept").unwrap();
        fs::set_permissions(out.join("d/a"), Permissions::from_mode(0o666)).unwrap();
        let s = sync(&plan, &out, &mut state).unwrap();
        assert_eq!((s.copied, s.unchanged, s.removed), (0, 2, 2));
        assert!(!out.join("d/stray").exists() && !out.join("old").exists());
        assert!(out.join(MANIFEST).exists());
        assert_eq!(
            fs::metadata(out.join("d/a")).unwrap().mode() & 0o7777,
            0o444
        );
        assert_eq!(state.hashed, 0);

        fs::write(src.join("a"), "changed").unwrap();
        let s = sync(&plan, &out, &mut state).unwrap();
        assert_eq!((s.copied, s.unchanged), (1, 1));
        assert_eq!(fs::read(out.join("d/a")).unwrap(), b"changed");
    }

    /// A sealed tree is rebuilt by its owner (directories opened only where written), and
    /// a rebuild that changes nothing changes no mode and no directory's change time.
    #[test]
    fn a_sealed_tree_syncs_and_an_unchanged_one_stays_untouched() {
        use super::super::seal::seal;
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("src");
        let out = t.path().join("out");
        fs::create_dir(&src).unwrap();
        fs::write(src.join("a"), "hello").unwrap();
        let mut plan = Plan::default();
        plan.file("d/a", &src.join("a")).unwrap();
        plan.dir("e/f").unwrap();
        let mut state = State::default();
        sync(&plan, &out, &mut state).unwrap();
        assert!(seal(&out, &plan).unwrap() > 0);
        let mode = |p: &str| fs::metadata(out.join(p)).unwrap().mode() & 0o7777;
        assert_eq!(
            (mode(""), mode("d"), mode("e/f"), mode("d/a")),
            (0o555, 0o555, 0o555, 0o444)
        );

        let ctimes = || {
            ["", "d", "e", "e/f", "d/a"].map(|p| {
                fs::metadata(out.join(p)).unwrap().ctime_nsec()
                    + fs::metadata(out.join(p)).unwrap().ctime() * 1_000_000_000
            })
        };
        let before = ctimes();
        sync(&plan, &out, &mut state).unwrap();
        assert_eq!(seal(&out, &plan).unwrap(), 0);
        assert_eq!(ctimes(), before);

        // A new file in a sealed directory, a removed directory, a changed source.
        fs::write(src.join("b"), "new").unwrap();
        fs::write(src.join("a"), "changed").unwrap();
        let mut plan = Plan::default();
        plan.file("d/a", &src.join("a")).unwrap();
        plan.file("d/b", &src.join("b")).unwrap();
        plan.dir("e").unwrap();
        let s = sync(&plan, &out, &mut state).unwrap();
        assert_eq!((s.copied, s.removed), (2, 1));
        seal(&out, &plan).unwrap();
        assert_eq!((mode("d"), mode("d/b"), mode("e")), (0o555, 0o444, 0o555));
        assert!(!out.join("e/f").exists());
        super::super::seal::remove_tree(&out).unwrap();
    }
}
