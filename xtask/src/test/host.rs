//! Host packages the build and the tests need, installed with apt-get when run as root.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use super::run_checked;

/// (a file the package provides, the Debian package).
const PACKAGES: &[(&str, &str)] = &[
    // Debian's CPython and standard library: the rootfs copies them.
    ("/usr/bin/python3.11", "python3.11"),
    ("/usr/lib/python3.11/os.py", "libpython3.11-stdlib"),
    // runuser and useradd for the rootless pass.
    ("/usr/sbin/runuser", "util-linux"),
    ("/usr/sbin/useradd", "passwd"),
];

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

pub fn ensure_packages(is_root: bool) -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(file, _)| !Path::new(file).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        println!("all present");
        return Ok(());
    }
    if !is_root {
        bail!(
            "missing packages {}: install them with `sudo apt-get install {}`",
            missing.join(", "),
            missing.join(" ")
        );
    }
    run_checked(
        Command::new("apt-get").args(["update", "-q"]),
        "apt-get update",
    )?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install",
    )
}
