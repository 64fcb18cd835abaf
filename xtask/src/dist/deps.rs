//! What the binary needs of the system it runs on: the Debian packages owning its
//! interpreter and shared libraries (found as the loader finds them, then `dpkg -S`), and
//! the newest glibc symbol version it references (its `DT_VERNEED` entries).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use goblin::elf::Elf;

use crate::rootfs::{host_libraries, HostLibrary};

/// A Debian package and its installed version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// The packages owning every file the loader opens to start `binary` on this host.
pub fn packages(binary: &Path) -> Result<(Vec<HostLibrary>, BTreeSet<Package>)> {
    let libs = host_libraries(binary)?;
    let mut names = BTreeSet::new();
    for lib in &libs {
        names.insert(owner(lib)?);
    }
    let mut out = BTreeSet::new();
    for name in names {
        let version = installed_version(&name)?;
        out.insert(Package { name, version });
    }
    Ok((libs, out))
}

/// The package `dpkg -S` names for the path the loader looked for, else for the file it
/// resolved to (on a merged-/usr host dpkg knows `/lib/...`, not `/usr/lib/...`).
fn owner(lib: &HostLibrary) -> Result<String> {
    for path in [&lib.found, &lib.real] {
        let out = Command::new("dpkg")
            .arg("-S")
            .arg(path)
            .output()
            .context("cannot run dpkg -S (is this a Debian host?)")?;
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            if let Some(name) = parse_dpkg_s(&text) {
                return Ok(name);
            }
        }
    }
    bail!(
        "no Debian package owns {} ({}): the image and the package need to know where it comes from",
        lib.found.display(),
        lib.real.display()
    )
}

/// The package of `dpkg -S`'s first line, `libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6`,
/// without its architecture.
pub fn parse_dpkg_s(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let (packages, path) = line.split_once(": ")?;
    if !path.starts_with('/') {
        return None;
    }
    let first = packages.split(", ").next()?;
    let name = first.split(':').next()?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

fn installed_version(name: &str) -> Result<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", name])
        .output()
        .context("cannot run dpkg-query")?;
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || v.is_empty() {
        bail!("dpkg-query knows no installed version of {name}");
    }
    Ok(v)
}

/// The newest `GLIBC_x.y[.z]` version the binary's symbols ask for, e.g. `2.34`.
pub fn glibc_needed(binary: &Path) -> Result<Option<String>> {
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let elf = Elf::parse(&bytes).with_context(|| format!("parsing {}", binary.display()))?;
    let mut names = Vec::new();
    if let Some(verneed) = &elf.verneed {
        for need in verneed.iter() {
            for aux in need.iter() {
                if let Some(name) = elf.dynstrtab.get_at(aux.vna_name) {
                    names.push(name.to_string());
                }
            }
        }
    }
    Ok(newest_glibc(names.iter().map(String::as_str)))
}

/// The highest of the `GLIBC_*` version names, compared number by number.
pub fn newest_glibc<'a>(names: impl Iterator<Item = &'a str>) -> Option<String> {
    names
        .filter_map(|n| n.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let nums: Option<Vec<u32>> = v.split('.').map(|p| p.parse().ok()).collect();
            nums.map(|n| (n, v.to_string()))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_s_lines_give_the_package_without_architecture() {
        assert_eq!(
            parse_dpkg_s("libc6:amd64: /lib/x86_64-linux-gnu/libc.so.6\n").as_deref(),
            Some("libc6")
        );
        assert_eq!(
            parse_dpkg_s("libgcc-s1:amd64, other: /lib/x/libgcc_s.so.1\n").as_deref(),
            Some("libgcc-s1")
        );
        assert_eq!(parse_dpkg_s(""), None);
        assert_eq!(
            parse_dpkg_s("dpkg-query: no path found matching pattern"),
            None
        );
    }

    #[test]
    fn glibc_versions_compare_as_numbers() {
        let names = [
            "GLIBC_2.2.5",
            "GLIBC_2.34",
            "GLIBC_2.9",
            "GCC_3.0",
            "GLIBC_PRIVATE",
        ];
        assert_eq!(newest_glibc(names.into_iter()).as_deref(), Some("2.34"));
        assert_eq!(newest_glibc(["GCC_4.2"].into_iter()), None);
    }

    #[test]
    fn this_xtask_binary_needs_a_glibc_and_its_packages_are_known() {
        // The xtask binary itself: a real Rust executable linked like codebox.
        let exe = std::env::current_exe().unwrap();
        let v = glibc_needed(&exe)
            .unwrap()
            .expect("a glibc-linked executable");
        assert!(v.starts_with("2."), "{v}");
        if Path::new("/var/lib/dpkg/status").exists() {
            let (libs, pkgs) = packages(&exe).unwrap();
            assert!(libs
                .iter()
                .any(|l| l.found.to_string_lossy().contains("libc.so.6")));
            assert!(pkgs.iter().any(|p| p.name == "libc6"), "{pkgs:?}");
        }
    }
}
