//! The binary finds its rootfs the way a release lays it out: `bin/codebox` next to
//! `share/codebox/rootfs`, with no environment at all (`env -i`), also when started
//! through a symlink from elsewhere; a binary copied alone names every place it looked;
//! a rootfs the operator named is never bypassed for another one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// `<tmp>/bin/codebox`: a hard link to the tested binary where possible, else a copy
/// (rootless: the link is refused for a file of another user).
fn release_tree() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("bin")).unwrap();
    let exe = t.path().join("bin/codebox");
    if std::fs::hard_link(codebox_bin(), &exe).is_err() {
        copy_executable(&codebox_bin(), &exe);
    }
    (t, exe)
}

fn with_rootfs(top: &Path) {
    std::fs::create_dir_all(top.join("share/codebox")).unwrap();
    let real = std::fs::canonicalize(rootfs_dir()).unwrap();
    std::os::unix::fs::symlink(real, top.join("share/codebox/rootfs")).unwrap();
}

fn empty_env(exe: &Path, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("env");
    cmd.arg("-i");
    for (k, v) in extra {
        cmd.arg(format!("{k}={v}"));
    }
    cmd.arg(exe).args(args).current_dir("/").output().unwrap()
}

#[test]
fn a_copied_binary_alone_names_every_place_it_looked() {
    let (t, exe) = release_tree();
    let out = empty_env(&exe, &["run", "python", "-c", "print(1)"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let release = t.path().join("share/codebox/rootfs");
    assert!(
        err.contains(&format!("{} (next to the executable)", release.display())),
        "{err}"
    );
    for hint in [
        "share/codebox/rootfs next to bin/codebox",
        "--rootfs",
        "CODEBOX_ROOTFS",
    ] {
        assert!(err.contains(hint), "{hint}: {err}");
    }
}

#[test]
fn the_release_layout_is_found_with_no_environment_and_through_a_symlink() {
    if !rootfs_dir().join(".manifest").exists() {
        assert!(!strict(), "no rootfs at {}", rootfs_dir().display());
        eprintln!(
            "SKIP: no rootfs at {} (run `cargo xtask rootfs`)",
            rootfs_dir().display()
        );
        return;
    }
    let (t, exe) = release_tree();
    with_rootfs(t.path());
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&exe, elsewhere.join("codebox")).unwrap();
    for started_as in [exe.clone(), elsewhere.join("codebox")] {
        let out = empty_env(&started_as, &["doctor", "--json"], &[]);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        let rootfs = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["layer"] == "rootfs")
            .unwrap();
        assert_eq!(rootfs["status"], "ok", "{rootfs}");
        let detail = rootfs["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&*t.path().join("share/codebox/rootfs").to_string_lossy()),
            "started as {}: {detail}",
            started_as.display()
        );
    }
}

#[test]
fn a_named_rootfs_that_is_missing_is_not_bypassed() {
    if !rootfs_dir().join(".manifest").exists() {
        assert!(!strict(), "no rootfs at {}", rootfs_dir().display());
        eprintln!("SKIP: no rootfs at {}", rootfs_dir().display());
        return;
    }
    let (t, exe) = release_tree();
    with_rootfs(t.path());
    // A release tree that would work is right there; the named one wins, and fails.
    for (args, env) in [
        (
            vec!["run", "python", "-c", "print(1)"],
            vec![("CODEBOX_ROOTFS", "/nonexistent/rootfs")],
        ),
        (
            vec![
                "run",
                "--rootfs",
                "/nonexistent/rootfs",
                "python",
                "-c",
                "print(1)",
            ],
            vec![],
        ),
    ] {
        let out = empty_env(&exe, &args, &env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(err.contains("/nonexistent/rootfs"), "{err}");
        assert!(!err.contains("next to the executable"), "{err}");
    }
}
