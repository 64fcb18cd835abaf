//! The Debian package's control data: `DEBIAN/control` and the `postinst` that creates the
//! service account, as text from data (unit-tested), and the `dpkg-deb` call.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};

use crate::test::run_checked;

/// Debian's name for an architecture Rust calls `arch`.
pub fn debian_arch(arch: &str) -> Result<&'static str> {
    Ok(match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no Debian architecture known for {other}"),
    })
}

/// `DEBIAN/control`. `depends` is the shared libraries' packages the binary needs
/// (from `dpkg -S` of what `ldd` listed), `installed_kib` the tree's size.
pub fn control(version: &str, arch: &str, depends: &[String], installed_kib: u64) -> String {
    format!(
        "Package: codebox\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: codebox maintainers <codebox@localhost>\n\
         Installed-Size: {installed_kib}\n\
         Depends: {depends}\n\
         Section: devel\n\
         Priority: optional\n\
         Description: code-execution sandboxes for AI agents, over MCP\n \
         codebox runs Python and TypeScript in throw-away Linux sandboxes (user, mount,\n \
         pid, net, ipc, uts and cgroup namespaces, seccomp, landlock, a read-only root\n \
         filesystem shipped in /usr/share/codebox/rootfs) and serves them over MCP.\n \
         Run `codebox doctor` to see what this host supports.\n",
        depends = depends.join(", ")
    )
}

/// `DEBIAN/postinst`: the system unit's account (systemd-sysusers reads
/// /usr/lib/sysusers.d/codebox.conf; without systemd nothing is created and the README
/// says to run codebox as a user of one's own).
pub const POSTINST: &str = "#!/bin/sh\n\
set -e\n\
if [ \"$1\" = configure ] && command -v systemd-sysusers >/dev/null 2>&1; then\n\
\tsystemd-sysusers codebox.conf\n\
fi\n";

/// How `dpkg-deb` compresses the package's data.
pub fn compression(fast: bool) -> [&'static str; 2] {
    if fast {
        // CI: seconds instead of minutes for ~400 MB; every dpkg reads gzip.
        ["-Zgzip", "-z1"]
    } else {
        // xz: what every dpkg since Debian 6 reads, ~4× smaller than the tree.
        ["-Zxz", "-z6"]
    }
}

/// `dpkg-deb --build` of `tree` into `out` (root ownership without fakeroot).
pub fn build(tree: &Path, out: &Path, fast: bool) -> Result<()> {
    run_checked(
        Command::new("dpkg-deb")
            .arg("--root-owner-group")
            .args(compression(fast))
            .arg("--build")
            .arg(tree)
            .arg(out),
        "dpkg-deb --build",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_is_valid_deb822_with_a_folded_description() {
        let c = control(
            "0.1.0",
            "amd64",
            &["libc6 (>= 2.34)".into(), "libgcc-s1".into()],
            400_000,
        );
        assert!(c.ends_with('\n'));
        for line in c.lines() {
            // Either a "Field: value" line or a continuation starting with one space.
            assert!(
                line.starts_with(' ')
                    || line.split_once(": ").is_some_and(|(k, _)| !k.contains(' ')),
                "{line:?}"
            );
        }
        assert!(c.contains("Depends: libc6 (>= 2.34), libgcc-s1\n"), "{c}");
        assert!(c.contains("Architecture: amd64\n"));
    }

    #[test]
    fn unknown_architectures_are_refused() {
        assert_eq!(debian_arch("x86_64").unwrap(), "amd64");
        assert!(debian_arch("riscv64gc").is_err());
    }
}
