//! Verification against hostile changes: unsealed trees (every run checks every entry's
//! metadata) and sealed ones (every run checks the root, the manifest and the
//! directories; `recheck` checks everything).

use super::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

/// A tiny rootfs with a valid manifest, removed whatever its modes when dropped.
pub(crate) struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        unseal(self.dir.path());
    }
}

/// `chmod -R u+w`: a sealed tree's directories refuse their owner's unlinks otherwise.
fn unseal(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(meta.mode() | 0o700));
        for e in fs::read_dir(path).into_iter().flatten().flatten() {
            unseal(&e.path());
        }
    }
}

use std::os::unix::fs::MetadataExt;

const HELLO_SHA: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

/// `usr/bin/tool` ("hello"), `usr/lib/data` ("hello"), `bin -> usr/bin`; sealed: every
/// directory 0555, every file 0444, the root and the manifest too; else 0755/0644.
fn tree(sealed: bool) -> Tree {
    let t = Tree {
        dir: tempfile::tempdir().unwrap(),
    };
    let r = t.path();
    fs::create_dir_all(r.join("usr/bin")).unwrap();
    fs::create_dir_all(r.join("usr/lib")).unwrap();
    fs::write(r.join("usr/bin/tool"), b"hello").unwrap();
    fs::write(r.join("usr/lib/data"), b"hello").unwrap();
    std::os::unix::fs::symlink("usr/bin", r.join("bin")).unwrap();
    let (d, f) = if sealed {
        ("0555", "0444")
    } else {
        ("0755", "0644")
    };
    fs::write(
        r.join(manifest::FILE_NAME),
        format!(
            "{}\nl\tusr/bin\t/bin\nd\t{d}\t/usr\nd\t{d}\t/usr/bin\nf\t{f}\t5\t{HELLO_SHA}\t/usr/bin/tool\nd\t{d}\t/usr/lib\nf\t{f}\t5\t{HELLO_SHA}\t/usr/lib/data\n",
            manifest::HEADER
        ),
    )
    .unwrap();
    let mode = |s: &str| u32::from_str_radix(s, 8).unwrap();
    for (p, m) in [
        ("usr/bin/tool", f),
        ("usr/lib/data", f),
        (manifest::FILE_NAME, f),
        ("usr/bin", d),
        ("usr/lib", d),
        ("usr", d),
        ("", d),
    ] {
        fs::set_permissions(r.join(p), fs::Permissions::from_mode(mode(m))).unwrap();
    }
    t
}

/// Runs `f` with `dir` writable by its owner, then seals `dir` again (as a user with a
/// chmod, or root without one, would change a sealed tree).
fn in_writable(dir: &Path, f: impl FnOnce()) {
    let mode = fs::metadata(dir).unwrap().mode() & 0o7777;
    fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o200)).unwrap();
    f();
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).unwrap();
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn intact_tree_verifies_fully_then_by_stamp() {
    let t = tree(false);
    let stamps = tempfile::tempdir().unwrap();
    let v = verify(t.path(), Some(stamps.path())).unwrap();
    assert_eq!(v.verification, Verification::Full);
    assert_eq!(v.entries, 6);
    assert!(
        v.sealed.as_ref().unwrap_err().contains("write bit"),
        "{v:?}"
    );
    let v = verify(t.path(), Some(stamps.path())).unwrap();
    assert_eq!(v.verification, Verification::Stamp);
}

#[test]
fn a_sealed_tree_verifies_fully_then_by_its_seal() {
    let t = tree(true);
    let stamps = tempfile::tempdir().unwrap();
    let v = verify(t.path(), Some(stamps.path())).unwrap();
    assert_eq!(v.verification, Verification::Full);
    assert_eq!(v.sealed, Ok(()));
    let full = v.manifest_sha256.clone();
    let v = verify(t.path(), Some(stamps.path())).unwrap();
    assert_eq!(v.verification, Verification::Sealed);
    assert_eq!((v.manifest_sha256, v.entries), (full, 6));
    // No stamp, no fast path.
    let v = verify(t.path(), None).unwrap();
    assert_eq!(v.verification, Verification::Full);
}

#[test]
fn same_size_tampering_is_caught_despite_the_stamp() {
    let t = tree(false);
    let stamps = tempfile::tempdir().unwrap();
    verify(t.path(), Some(stamps.path())).unwrap();
    fs::write(t.path().join("usr/bin/tool"), b"HELLO").unwrap();
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
}

#[test]
fn missing_file_is_incomplete() {
    let t = tree(false);
    fs::remove_file(t.path().join("usr/bin/tool")).unwrap();
    let err = verify(t.path(), None).unwrap_err();
    assert!(matches!(err, Error::Missing { .. }), "{err}");
    assert!(err.to_string().contains("cargo xtask rootfs"));
}

#[test]
fn unlisted_file_and_mode_change_are_caught() {
    let t = tree(false);
    fs::write(t.path().join("usr/bin/extra"), b"x").unwrap();
    let err = verify(t.path(), None).unwrap_err();
    assert!(err.to_string().contains("not listed"), "{err}");

    let t = tree(false);
    fs::set_permissions(
        t.path().join("usr/bin/tool"),
        fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    let err = verify(t.path(), None).unwrap_err();
    assert!(err.to_string().contains("mode"), "{err}");
}

#[test]
fn retargeted_symlink_and_changed_kind_are_caught() {
    let t = tree(false);
    fs::remove_file(t.path().join("bin")).unwrap();
    std::os::unix::fs::symlink("/usr/bin", t.path().join("bin")).unwrap();
    let err = verify(t.path(), None).unwrap_err();
    assert!(err.to_string().contains("points to /usr/bin"), "{err}");

    let t = tree(false);
    fs::remove_file(t.path().join("usr/bin/tool")).unwrap();
    fs::create_dir(t.path().join("usr/bin/tool")).unwrap();
    let err = verify(t.path(), None).unwrap_err();
    assert!(
        err.to_string().contains("no longer a regular file"),
        "{err}"
    );
}

#[test]
fn missing_manifest_is_a_clear_error() {
    let t = tempfile::tempdir().unwrap();
    let err = verify(t.path(), None).unwrap_err();
    assert!(err.to_string().contains("no readable manifest"), "{err}");
    let err = locate(Some(t.path())).unwrap_err();
    assert!(err.to_string().contains("cargo xtask rootfs"), "{err}");
}

/// A sealed tree with a stamp, and that stamp's directory.
pub(crate) fn stamped_sealed_tree() -> (Tree, tempfile::TempDir) {
    let t = tree(true);
    let stamps = tempfile::tempdir().unwrap();
    assert_eq!(
        verify(t.path(), Some(stamps.path())).unwrap().verification,
        Verification::Full
    );
    assert_eq!(
        verify(t.path(), Some(stamps.path())).unwrap().verification,
        Verification::Sealed
    );
    (t, stamps)
}

#[test]
fn a_file_planted_in_a_sealed_directory_is_caught() {
    let (t, stamps) = stamped_sealed_tree();
    let lib = t.path().join("usr/lib");
    in_writable(&lib, || {
        fs::write(lib.join("sitecustomize.py"), b"x").unwrap()
    });
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(
        err.to_string()
            .contains("/usr/lib/sitecustomize.py is not listed"),
        "{err}"
    );
    // At the top, too (the root directory is no manifest entry).
    let (t, stamps) = stamped_sealed_tree();
    in_writable(t.path(), || fs::write(t.path().join("evil"), b"x").unwrap());
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("/evil is not listed"), "{err}");
}

#[test]
fn a_file_removed_from_a_sealed_directory_is_caught() {
    let (t, stamps) = stamped_sealed_tree();
    let lib = t.path().join("usr/lib");
    in_writable(&lib, || fs::remove_file(lib.join("data")).unwrap());
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(matches!(err, Error::Missing { .. }), "{err}");
}

#[test]
fn a_file_renamed_over_in_a_sealed_directory_is_caught() {
    // Same size, same mode, a new inode in place of the old one.
    let (t, stamps) = stamped_sealed_tree();
    let lib = t.path().join("usr/lib");
    in_writable(&lib, || {
        fs::write(lib.join("new"), b"HELLO").unwrap();
        fs::set_permissions(lib.join("new"), fs::Permissions::from_mode(0o444)).unwrap();
        fs::rename(lib.join("new"), lib.join("data")).unwrap();
    });
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
}

#[test]
fn a_chmod_of_a_sealed_directory_is_caught() {
    let (t, stamps) = stamped_sealed_tree();
    fs::set_permissions(t.path().join("usr/bin"), fs::Permissions::from_mode(0o755)).unwrap();
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(
        err.to_string()
            .contains("/usr/bin has mode 0755, expected 0555"),
        "{err}"
    );
}

#[test]
fn a_tree_that_becomes_writable_is_caught() {
    let (t, stamps) = stamped_sealed_tree();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let v = verify(t.path(), Some(stamps.path())).unwrap();
    // The root is no manifest entry: its mode is not the manifest's to judge. The tree
    // is verified in full and is no longer sealed, so every run checks every entry.
    assert_eq!(v.verification, Verification::Full);
    assert!(
        v.sealed
            .unwrap_err()
            .contains("the root directory has a write bit"),
        "sealed"
    );
    assert_eq!(
        verify(t.path(), Some(stamps.path())).unwrap().verification,
        Verification::Stamp
    );
    // Any entry becoming writable differs from the manifest.
    let (t, stamps) = stamped_sealed_tree();
    unseal(t.path());
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("has mode 07"), "{err}");
}

#[test]
fn a_replaced_manifest_is_read_again() {
    let (t, stamps) = stamped_sealed_tree();
    let m = t.path().join(manifest::FILE_NAME);
    let text = fs::read_to_string(&m).unwrap();
    // The same text in a new inode: a full verification, which passes.
    in_writable(t.path(), || {
        fs::remove_file(&m).unwrap();
        fs::write(&m, &text).unwrap();
        fs::set_permissions(&m, fs::Permissions::from_mode(0o444)).unwrap();
    });
    let v = verify(t.path(), Some(stamps.path())).unwrap();
    assert_eq!(v.verification, Verification::Full);
    // A manifest that no longer matches the tree.
    let other = "0".repeat(64);
    in_writable(t.path(), || {
        fs::remove_file(&m).unwrap();
        fs::write(&m, text.replace(HELLO_SHA, &other)).unwrap();
        fs::set_permissions(&m, fs::Permissions::from_mode(0o444)).unwrap();
    });
    let err = verify(t.path(), Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
}

#[test]
fn a_root_replaced_by_another_tree_is_caught() {
    let (t, stamps) = stamped_sealed_tree();
    let root = t.path().to_path_buf();
    // Another sealed tree, tampered, moved into the verified one's place.
    let other = tree(true);
    let tool = other.path().join("usr/bin/tool");
    in_writable(&other.path().join("usr/bin"), || {
        fs::remove_file(&tool).unwrap();
        fs::write(&tool, b"HELLO").unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o444)).unwrap();
    });
    let aside = root.with_extension("aside");
    fs::rename(&root, &aside).unwrap();
    fs::rename(other.path(), &root).unwrap();
    let err = verify(&root, Some(stamps.path())).unwrap_err();
    // Put things back for the guards' clean-up.
    fs::rename(&root, other.path()).unwrap();
    fs::rename(&aside, &root).unwrap();
    assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
}

#[test]
fn a_stamp_from_another_tree_vouches_for_nothing() {
    let (a, stamps) = stamped_sealed_tree();
    let b = tree(true);
    let tool = b.path().join("usr/bin/tool");
    in_writable(&b.path().join("usr/bin"), || {
        fs::remove_file(&tool).unwrap();
        fs::write(&tool, b"HELLO").unwrap();
        fs::set_permissions(&tool, fs::Permissions::from_mode(0o444)).unwrap();
    });
    fs::copy(
        stamp::path(stamps.path(), a.path()),
        stamp::path(stamps.path(), b.path()),
    )
    .unwrap();
    let err = verify(b.path(), Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");
}

#[test]
fn an_entry_owned_by_someone_else_unseals_the_tree() {
    if !is_root() {
        eprintln!("skipped: changing a file's owner needs root");
        return;
    }
    let t = tree(true);
    let stamps = tempfile::tempdir().unwrap();
    nix::unistd::chown(
        &t.path().join("usr/lib/data"),
        Some(nix::unistd::Uid::from_raw(54321)),
        None,
    )
    .unwrap();
    let v = verify(t.path(), Some(stamps.path())).unwrap();
    assert!(
        v.sealed
            .unwrap_err()
            .contains("/usr/lib/data is owned by uid 54321"),
        "sealed"
    );
    // Every later run checks every entry: that user can change the file unseen.
    assert_eq!(
        verify(t.path(), Some(stamps.path())).unwrap().verification,
        Verification::Stamp
    );
}

#[test]
fn recheck_finds_what_the_sealed_fast_path_does_not_look_at() {
    // Root (or the owner after a chmod) rewriting a file in place: the file's change
    // time moves, no directory's does.
    let (t, stamps) = stamped_sealed_tree();
    let mut r = verify(t.path(), Some(stamps.path())).unwrap();
    assert_eq!(
        recheck(&mut r, Some(stamps.path())).unwrap(),
        Recheck::Unchanged
    );
    let tool = t.path().join("usr/bin/tool");
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&tool, b"HELLO").unwrap();
    fs::set_permissions(&tool, fs::Permissions::from_mode(0o444)).unwrap();
    assert_eq!(
        verify(t.path(), Some(stamps.path())).unwrap().verification,
        Verification::Sealed,
        "the per-run check does not read files (see the module documentation)"
    );
    let err = recheck(&mut r, Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("SHA-256 mismatch"), "{err}");

    // A chmod'ed file.
    let (t, stamps) = stamped_sealed_tree();
    let mut r = verify(t.path(), Some(stamps.path())).unwrap();
    fs::set_permissions(
        t.path().join("usr/lib/data"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let err = recheck(&mut r, Some(stamps.path())).unwrap_err();
    assert!(err.to_string().contains("has mode 0644"), "{err}");
}

#[test]
fn recheck_adopts_a_touched_but_intact_tree_and_refuses_a_new_manifest() {
    let (t, stamps) = stamped_sealed_tree();
    let mut r = verify(t.path(), Some(stamps.path())).unwrap();
    // Same contents written again: metadata moved, the tree is intact.
    let data = t.path().join("usr/lib/data");
    fs::set_permissions(&data, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&data, b"hello").unwrap();
    fs::set_permissions(&data, fs::Permissions::from_mode(0o444)).unwrap();
    assert_eq!(
        recheck(&mut r, Some(stamps.path())).unwrap(),
        Recheck::Reverified
    );
    assert_eq!(
        recheck(&mut r, Some(stamps.path())).unwrap(),
        Recheck::Unchanged
    );
    // A new manifest (an upgrade under a running server) is another tree.
    let m = t.path().join(manifest::FILE_NAME);
    let text = fs::read_to_string(&m).unwrap();
    in_writable(t.path(), || {
        fs::remove_file(&m).unwrap();
        fs::write(&m, text.replace("/usr/lib/data\n", "/usr/lib/data\n\n")).unwrap();
    });
    let err = recheck(&mut r, Some(stamps.path())).unwrap_err();
    assert!(matches!(err, Error::Replaced { .. }), "{err}");
    assert!(err.to_string().contains("restart codebox"), "{err}");
}
