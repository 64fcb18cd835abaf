//! The release as users install it (issue: "the dist tarball unpacked into a fresh
//! directory on this machine runs `doctor` and an execution with no environment
//! variables set"):
//!
//! 1. `cargo xtask dist --profile dev --level 3`: the CI build reuses the debug binary
//!    the tests built. The `dist` profile (fat LTO, one codegen unit) that `cargo xtask
//!    dist` ships took 42 min wall (14.6 min CPU) on the 2-core machine shared with other
//!    builds, a plain release build 24 min (14.7 min CPU): too much for CI's budget. The
//!    step takes ~2 min once the debug binary exists (4.5 min measured with its build);
//! 2. the tarball unpacked into a fresh directory in /tmp; there, with `env -i` (no
//!    variable at all: no PATH, HOME or CODEBOX_ROOTFS), `bin/codebox doctor` must be
//!    ready and `bin/codebox run python -c 'print(6*7)'` must print 42 — as root, and as
//!    the unprivileged test user inside its cgroup delegation (as `setup-cgroups --enter`
//!    would start it);
//! 3. the Debian package: `dpkg-deb --info`/`--contents`, unpacked with `dpkg -x` into
//!    a fresh directory (never installed on this machine), and run from there;
//! 4. the OCI image built from the release tree and checked by skopeo, umoci and runc
//!    (`image::validate`).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use super::{delegate::Delegation, rootless};
use crate::dist::check::{doctor_report, empty_env, Unpacked};

pub fn run(root: &Path, is_root: bool) -> Result<()> {
    let release = crate::dist::run_for_ci(&["--profile", "dev", "--level", "3", "--no-check"])?;
    let stem = crate::dist::stem(root)?;

    // 2. The tarball in a fresh directory, with an empty environment.
    let unpacked = Unpacked::new(&release.tarball, &stem, &std::env::temp_dir())?;
    let codebox = unpacked.codebox();
    ready_and_runs(&mut |args| Ok(empty_env(&codebox, args)), "root")?;
    if is_root {
        rootless::ensure_user()?;
        let (uid, gid) = rootless::user_ids()?;
        // The unpacked tree is root's; the user needs to traverse and read it.
        chmod_readable(unpacked.dir())?;
        let delegation =
            Delegation::create(&format!("codebox-delegated-{}", rootless::USER), uid, gid)?;
        let mut as_user = |args: &[&str]| -> Result<Command> {
            let mut cmd = Command::new("runuser");
            delegation.enter_on_exec(&mut cmd)?;
            cmd.args(["-u", rootless::USER, "--", "env", "-i"])
                .arg(&codebox)
                .args(args)
                .current_dir("/");
            Ok(cmd)
        };
        ready_and_runs(&mut as_user, rootless::USER)?;
    }
    drop(unpacked);

    // 3. The Debian package, unpacked, never installed.
    if let Some(deb) = &release.deb {
        deb_runs(deb)?;
    }

    // 4. The image.
    let image = crate::image::build(&release.tree, None)?;
    crate::image::validate::all(&image, &release.tree)
}

/// `doctor` ready and a Python execution printing 42, with the command `make` builds.
fn ready_and_runs(make: &mut dyn FnMut(&[&str]) -> Result<Command>, who: &str) -> Result<()> {
    let (report, out) = doctor_report(&mut make(&["doctor", "--json"])?)?;
    if report["ready"] != true || !out.status.success() {
        bail!(
            "unpacked release, env -i, as {who}: doctor is not ready ({}): {}",
            out.status,
            serde_json::to_string_pretty(&report["checks"])?
        );
    }
    let rootfs = report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["layer"] == "rootfs"))
        .map(|c| c["detail"].to_string())
        .unwrap_or_default();
    println!("release as {who}: env -i bin/codebox doctor: ready; rootfs {rootfs}");
    let out = make(&["run", "python", "-c", "print(6*7)"])?
        .output()
        .context("cannot start codebox run")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && stdout == "42\n",
        "unpacked release, env -i, as {who}: codebox run printed {stdout:?} ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    println!("release as {who}: env -i bin/codebox run python -c 'print(6*7)': 42");
    Ok(())
}

/// Directories a+rx, files a+r below `dir` (and `dir` itself).
fn chmod_readable(dir: &Path) -> Result<()> {
    super::run_checked(
        Command::new("chmod").args(["-R", "a+rX"]).arg(dir),
        "chmod -R a+rX (unpacked release)",
    )
}

/// The package's metadata and contents, then its tree unpacked and run.
fn deb_runs(deb: &Path) -> Result<()> {
    let info = Command::new("dpkg-deb").arg("--info").arg(deb).output()?;
    let info_text = String::from_utf8_lossy(&info.stdout);
    ensure!(
        info.status.success()
            && info_text.contains("Package: codebox")
            && info_text.contains("Depends: libc6 (>= "),
        "dpkg-deb --info: {info_text}"
    );
    let contents = Command::new("dpkg-deb")
        .arg("--contents")
        .arg(deb)
        .output()?;
    let listing = String::from_utf8_lossy(&contents.stdout);
    for needed in [
        "./usr/bin/codebox",
        "./usr/share/codebox/rootfs/.manifest",
        "./lib/systemd/system/codebox.service",
        "./usr/lib/systemd/user/codebox.service",
        "./usr/lib/sysusers.d/codebox.conf",
    ] {
        ensure!(
            listing.lines().any(|l| l.ends_with(needed)),
            "the package has no {needed}"
        );
    }
    ensure!(
        listing.lines().all(|l| l.contains(" root/root ")),
        "the package has entries not owned by root"
    );
    let dir = std::env::temp_dir().join(format!("codebox-deb-check-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(dir.clone());
    super::run_checked(Command::new("dpkg").arg("-x").arg(deb).arg(&dir), "dpkg -x")?;
    let codebox = dir.join("usr/bin/codebox");
    ready_and_runs(
        &mut |args| Ok(empty_env(&codebox, args)),
        "root (from the .deb)",
    )?;
    println!(
        "deb: {} lines of contents, unpacked and run",
        listing.lines().count()
    );
    Ok(())
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if self.0.exists() {
            // The unpacked rootfs is sealed (xtask/src/rootfs/seal.rs).
            if let Err(e) = crate::rootfs::seal::remove_tree(&self.0) {
                eprintln!("cannot remove {}: {e}", self.0.display());
            }
        }
    }
}
