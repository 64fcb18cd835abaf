//! The release as a user gets it: the tarball unpacked into a fresh directory, its binary
//! run with an empty environment (`env -i`: no `CODEBOX_ROOTFS`, no `PATH`, no `HOME`), so
//! the rootfs can only be found next to the binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

use crate::test::run_checked;

/// A fresh directory holding the unpacked release; removed when dropped.
pub struct Unpacked {
    dir: PathBuf,
    /// The release's top directory inside it.
    pub top: PathBuf,
}

impl Unpacked {
    /// Unpacks `tarball` (whose top directory is `stem`) into a new directory below
    /// `parent`, with the archive's modes (`-p`) whatever the umask.
    pub fn new(tarball: &Path, stem: &str, parent: &Path) -> Result<Unpacked> {
        let dir = parent.join(format!("codebox-dist-check-{}", std::process::id()));
        crate::rootfs::seal::remove_tree(&dir)?;
        std::fs::create_dir_all(&dir)?;
        let unpacked = Unpacked {
            top: dir.join(stem),
            dir,
        };
        run_checked(
            Command::new("tar")
                .args([
                    "--extract",
                    "--preserve-permissions",
                    "--use-compress-program=zstd",
                    "--file",
                ])
                .arg(tarball)
                .arg("-C")
                .arg(&unpacked.dir),
            "unpacking the tarball",
        )?;
        Ok(unpacked)
    }

    pub fn codebox(&self) -> PathBuf {
        self.top.join("bin/codebox")
    }

    /// The directory holding the release (for chmod by the caller).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        if let Err(e) = crate::rootfs::seal::remove_tree(&self.dir) {
            eprintln!("cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// `env -i CODEBOX ARGS...` from `/`: nothing from this environment reaches it.
pub fn empty_env(codebox: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("env");
    cmd.arg("-i").arg(codebox).args(args).current_dir("/");
    cmd
}

/// Runs `cmd` (a `codebox doctor --json`): its parsed report and the process's output.
pub fn doctor_report(cmd: &mut Command) -> Result<(serde_json::Value, Output)> {
    let out = cmd.output().context("cannot start codebox doctor")?;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "codebox doctor --json printed no JSON ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((report, out))
}

/// `dist`'s own check: the unpacked release's doctor finds and verifies its rootfs.
/// Whether this host can run sandboxes is the host's business (printed, not required).
pub fn unpacked(tarball: &Path, stem: &str) -> Result<()> {
    let release = Unpacked::new(tarball, stem, &std::env::temp_dir())?;
    let (report, out) = doctor_report(&mut empty_env(&release.codebox(), &["doctor", "--json"]))?;
    let rootfs = report["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["layer"] == "rootfs"))
        .context("doctor's report has no rootfs line")?;
    if rootfs["status"] != "ok" {
        bail!(
            "the unpacked release does not find or verify its rootfs: {}",
            rootfs["detail"]
        );
    }
    let expected = release.top.join("share/codebox/rootfs");
    let detail = rootfs["detail"].as_str().unwrap_or_default();
    if !detail.starts_with(&*expected.to_string_lossy()) {
        bail!("the unpacked release used another rootfs: {detail}");
    }
    println!(
        "check: unpacked in {}, `env -i bin/codebox doctor`: rootfs {detail}; host ready: {} (exit {})",
        release.dir().display(),
        report["ready"],
        out.status
    );
    Ok(())
}
