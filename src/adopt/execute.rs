//! The filesystem side of adopting: reading the files a plan is made from, and carrying a
//! plan out in one linear procedure (check, back up, write).
//!
//! A file that is a symlink is written through: its target is backed up and replaced, and
//! the output says so; a symlink to nothing, or to something other than a regular file,
//! is refused. Every write is atomic (a temporary file in the same directory, renamed over
//! the old one) and keeps the old file's mode and owner.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::plan::{FileChange, FileRead, Plan, Snapshot};
use super::{Error, Result};

/// Reads `paths` (through symlinks); a missing file is recorded as missing.
pub fn read(paths: &[PathBuf]) -> Result<Snapshot> {
    let mut snapshot = Snapshot::default();
    for path in paths {
        snapshot.insert(path.clone(), read_one(path)?);
    }
    Ok(snapshot)
}

fn read_one(path: &Path) -> Result<Option<FileRead>> {
    let failed = |source: std::io::Error| {
        tracing::warn!(path = %path.display(), ?source, "cannot read a file to adopt");
        Error::Read {
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed(e)),
    };
    let mode = file.metadata().map_err(failed)?.mode() & 0o7777;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(failed)?;
    Ok(Some(FileRead { bytes, mode }))
}

/// Now in UTC as a backup suffix: `20250102T030405Z`.
pub fn stamp() -> String {
    let t = time::OffsetDateTime::now_utc();
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Carries `plan` out; `say` gets a line for each backup made and for each symlink written
/// through. With `dry_run`, checks and says what would be backed up, and changes nothing.
pub fn execute(plan: &Plan, dry_run: bool, stamp: &str, say: &mut dyn FnMut(String)) -> Result<()> {
    // 1. Where each file really is, and that it still holds what the plan was made from
    //    (Claude Code rewrites ~/.claude.json while it runs).
    let mut real = Vec::with_capacity(plan.files.len());
    for change in &plan.files {
        let path = write_path(&change.path, say)?;
        unchanged(&path, change, false)?;
        real.push(path);
    }
    // 2. A backup of every file that exists, before anything changes.
    for (change, path) in plan.files.iter().zip(&real) {
        let Some(original) = &change.original else {
            continue;
        };
        let backup = free_backup_path(path, stamp);
        if dry_run {
            say(format!(
                "would back up {} to {}",
                path.display(),
                backup.display()
            ));
        } else {
            back_up(path, &backup, original)?;
            say(format!(
                "backed up {} to {}",
                path.display(),
                backup.display()
            ));
        }
    }
    if dry_run {
        return Ok(());
    }
    // 3. The changes, in the plan's order, each one atomic.
    for (i, (change, path)) in plan.files.iter().zip(&real).enumerate() {
        unchanged(path, change, i > 0)?;
        match &change.text {
            Some(text) => write_atomically(path, text, change)?,
            None => remove(path)?,
        }
    }
    Ok(())
}

/// The file to write for `path`: itself, or a symlink's target (said), which must be a
/// regular file.
fn write_path(path: &Path, say: &mut dyn FnMut(String)) -> Result<PathBuf> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(path.to_path_buf()),
        Err(source) => {
            return Err(Error::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    if meta.is_file() {
        return Ok(path.to_path_buf());
    }
    if !meta.file_type().is_symlink() {
        return Err(Error::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let refuse = |target: PathBuf, problem| {
        tracing::warn!(path = %path.display(), target = %target.display(), problem, "refusing to write through a symlink");
        Error::Symlink {
            path: path.to_path_buf(),
            target,
            problem,
        }
    };
    let link = fs::read_link(path).unwrap_or_default();
    let target = fs::canonicalize(path).map_err(|_| refuse(link.clone(), "does not exist"))?;
    if !fs::metadata(&target).is_ok_and(|m| m.is_file()) {
        return Err(refuse(target, "is not a regular file"));
    }
    say(format!(
        "{} is a symlink: writing through to {}",
        path.display(),
        target.display()
    ));
    Ok(target)
}

/// Refuses when `path` no longer holds what the plan was made from; `midway`: after
/// other files of the plan were written.
fn unchanged(path: &Path, change: &FileChange, midway: bool) -> Result<()> {
    let now = read_one(path)?.map(|r| r.bytes);
    if now == change.original {
        return Ok(());
    }
    tracing::warn!(path = %path.display(), midway, "file changed since it was read");
    let path = path.to_path_buf();
    Err(match midway {
        false => Error::Changed { path },
        true => Error::ChangedWhileWriting { path },
    })
}

/// `<file>.codebox-backup-<stamp>`, with `-2`, `-3`... when that name is taken.
fn free_backup_path(path: &Path, stamp: &str) -> PathBuf {
    let base = format!("{}.codebox-backup-{stamp}", path.display());
    (1..)
        .map(|n| match n {
            1 => PathBuf::from(&base),
            n => PathBuf::from(format!("{base}-{n}")),
        })
        .find(|p| fs::symlink_metadata(p).is_err())
        .expect("some suffix is free")
}

/// Writes `bytes` (the file as read and checked) to a new `backup` with the file's mode
/// and owner.
fn back_up(path: &Path, backup: &Path, bytes: &[u8]) -> Result<()> {
    let failed = |source: std::io::Error| {
        tracing::error!(path = %path.display(), backup = %backup.display(), ?source, "backup failed");
        Error::Backup {
            path: path.to_path_buf(),
            backup: backup.to_path_buf(),
            source,
        }
    };
    let meta = fs::metadata(path).map_err(failed)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(backup)
        .map_err(failed)?;
    file.set_permissions(fs::Permissions::from_mode(meta.mode() & 0o7777))
        .map_err(failed)?;
    give_owner(&file, &meta).map_err(failed)?;
    file.write_all(bytes).map_err(failed)?;
    file.sync_all().map_err(failed)?;
    sync_dir(backup).map_err(failed)
}

/// Replaces (or creates) `path` with `text`: a temporary file in the same directory with
/// the old file's mode and owner (a new file: the plan's mode), synced, then renamed.
fn write_atomically(path: &Path, text: &str, change: &FileChange) -> Result<()> {
    let failed = |source: std::io::Error| {
        tracing::error!(path = %path.display(), ?source, "cannot write an adopted file");
        Error::Write {
            path: path.to_path_buf(),
            source,
        }
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(change.dir_mode)
            .create(dir)
            .map_err(failed)?;
    }
    let old = match fs::metadata(path) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(failed(e)),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".codebox-tmp")
        .tempfile_in(dir)
        .map_err(failed)?;
    let mode = old.as_ref().map_or(change.new_mode, |m| m.mode() & 0o7777);
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(failed)?;
    if let Some(old) = &old {
        give_owner(tmp.as_file(), old).map_err(failed)?;
    }
    tmp.write_all(text.as_bytes()).map_err(failed)?;
    tmp.as_file().sync_all().map_err(failed)?;
    tmp.persist(path).map_err(|e| failed(e.error))?;
    sync_dir(path).map_err(failed)
}

/// Removes `path` (already backed up).
fn remove(path: &Path) -> Result<()> {
    let failed = |source: std::io::Error| {
        tracing::error!(path = %path.display(), ?source, "cannot remove an adopted file");
        Error::Write {
            path: path.to_path_buf(),
            source,
        }
    };
    fs::remove_file(path).map_err(failed)?;
    sync_dir(path).map_err(failed)
}

/// Gives `file` the owner of `like` when it differs (root editing another user's file).
fn give_owner(file: &fs::File, like: &fs::Metadata) -> std::io::Result<()> {
    let mine = file.metadata()?;
    if (mine.uid(), mine.gid()) == (like.uid(), like.gid()) {
        return Ok(());
    }
    std::os::unix::fs::fchown(file, Some(like.uid()), Some(like.gid()))
}

/// Makes a rename or removal in `path`'s directory durable.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    fs::File::open(path.parent().unwrap_or(Path::new("/")))?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &Path, original: Option<&str>, text: Option<&str>) -> FileChange {
        FileChange {
            path: path.to_path_buf(),
            original: original.map(|o| o.as_bytes().to_vec()),
            text: text.map(str::to_string),
            new_mode: 0o600,
            dir_mode: 0o700,
        }
    }

    fn plan(files: Vec<FileChange>) -> Plan {
        Plan {
            files,
            ..Plan::default()
        }
    }

    #[test]
    fn writes_back_up_keep_modes_and_make_private_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("old.json");
        fs::write(&old, "{}").unwrap();
        fs::set_permissions(&old, fs::Permissions::from_mode(0o640)).unwrap();
        let new = tmp.path().join("a/b/new.json");
        let p = plan(vec![
            change(&new, None, Some("{\"n\": 1}\n")),
            change(&old, Some("{}"), Some("{\"o\": 1}\n")),
        ]);
        let mut said = Vec::new();
        execute(&p, false, "STAMP", &mut |l| said.push(l)).unwrap();
        assert_eq!(fs::read_to_string(&new).unwrap(), "{\"n\": 1}\n");
        assert_eq!(fs::read_to_string(&old).unwrap(), "{\"o\": 1}\n");
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&new), 0o600);
        assert_eq!(mode(&tmp.path().join("a/b")), 0o700);
        assert_eq!(mode(&old), 0o640);
        let backup = tmp.path().join("old.json.codebox-backup-STAMP");
        assert_eq!(fs::read_to_string(&backup).unwrap(), "{}");
        assert_eq!(mode(&backup), 0o640);
        assert_eq!(said.len(), 1, "{said:?}");
        // A second backup in the same second gets its own name.
        let p = plan(vec![change(&old, Some("{\"o\": 1}\n"), None)]);
        execute(&p, false, "STAMP", &mut |_| {}).unwrap();
        assert!(!old.exists());
        let second = tmp.path().join("old.json.codebox-backup-STAMP-2");
        assert_eq!(fs::read_to_string(second).unwrap(), "{\"o\": 1}\n");
        let leftovers: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("codebox-tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_dry_run_or_a_changed_file_changes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("f.json");
        fs::write(&f, "{}").unwrap();
        let mut said = Vec::new();
        let p = plan(vec![change(&f, Some("{}"), Some("[]\n"))]);
        execute(&p, true, "S", &mut |l| said.push(l)).unwrap();
        assert_eq!(fs::read_to_string(&f).unwrap(), "{}");
        assert!(said[0].starts_with("would back up"), "{said:?}");
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
        let p = plan(vec![change(&f, Some("{\"x\": 1}"), Some("[]\n"))]);
        let e = execute(&p, false, "S", &mut |_| {}).unwrap_err();
        assert!(matches!(e, Error::Changed { .. }), "{e}");
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn symlinks_are_written_through_or_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("dotfiles/claude.json");
        fs::create_dir(tmp.path().join("dotfiles")).unwrap();
        fs::write(&target, "{}").unwrap();
        let link = tmp.path().join(".claude.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let mut said = Vec::new();
        let p = plan(vec![change(&link, Some("{}"), Some("{\"a\": 1}\n"))]);
        execute(&p, false, "S", &mut |l| said.push(l)).unwrap();
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&link).unwrap(), "{\"a\": 1}\n");
        assert!(tmp
            .path()
            .join("dotfiles/claude.json.codebox-backup-S")
            .exists());
        assert!(
            said.iter().any(|l| l.contains("writing through")),
            "{said:?}"
        );

        let dangling = tmp.path().join("dangling.json");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        let p = plan(vec![change(&dangling, None, Some("{}\n"))]);
        let e = execute(&p, false, "S", &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        let p = plan(vec![change(tmp.path(), None, Some("{}\n"))]);
        let e = execute(&p, false, "S", &mut |_| {}).unwrap_err();
        assert!(matches!(e, Error::NotAFile { .. }), "{e}");
    }
}
