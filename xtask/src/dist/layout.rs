//! What goes where, as data: the release tarball's tree and the Debian package's tree,
//! decided from the inputs before anything is copied (unit-tested without a build).
//!
//! Both trees keep the rule the binary looks for its rootfs by: `bin/codebox` next to
//! `share/codebox/rootfs` (the tarball under any prefix, the package under `/usr`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// The ExecStart binary the units in `deploy/` name: the tarball unpacked at /opt/codebox.
pub const SYSTEM_UNIT_EXE: &str = "/opt/codebox/bin/codebox";
/// The user unit's binary: the tarball unpacked at ~/.local (`%h` is systemd's home).
pub const USER_UNIT_EXE: &str = "%h/.local/bin/codebox";
/// The Debian package's binary.
pub const DEB_EXE: &str = "/usr/bin/codebox";

/// The files a release is made from.
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The workspace root (README.md, docs/, deploy/).
    pub repo: PathBuf,
    pub binary: PathBuf,
    pub rootfs: PathBuf,
}

/// One thing to put in a tree; `to` is relative to the tree's top.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A file copied with this mode.
    File {
        from: PathBuf,
        to: PathBuf,
        mode: u32,
    },
    /// A whole directory copied as it is (modes, symlinks, times).
    Tree { from: PathBuf, to: PathBuf },
    /// A file written from text.
    Text {
        to: PathBuf,
        text: String,
        mode: u32,
    },
}

impl Item {
    pub fn to(&self) -> &Path {
        match self {
            Item::File { to, .. } | Item::Tree { to, .. } | Item::Text { to, .. } => to,
        }
    }
}

/// The documentation both trees carry, with where it goes below `share/doc/codebox`.
fn docs(inputs: &Inputs, doc: &Path) -> Vec<Item> {
    [
        "README.md",
        "docs/src/operations/deploy.md",
        "docs/ARCHITECTURE.md",
    ]
    .iter()
    .map(|rel| Item::File {
        from: inputs.repo.join(rel),
        to: doc.join(Path::new(rel).file_name().expect("a file name")),
        mode: 0o644,
    })
    .chain(std::iter::once(Item::Tree {
        // The book's chapters (markdown), which the README's links point into.
        from: inputs.repo.join("docs/src"),
        to: doc.join("book"),
    }))
    .collect()
}

/// A unit file with its binary's path replaced: `text` must name `from` exactly once in
/// its ExecStart line, so a unit edited out of step with the packaging fails the build.
pub fn unit_for(text: &str, from: &str, to: &str) -> Result<String> {
    let exec_lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ExecStart="))
        .collect();
    match exec_lines.as_slice() {
        [line] if line.matches(from).count() == 1 => {}
        _ => bail!("the unit's one ExecStart= line must name {from} once; found {exec_lines:?}"),
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if line.starts_with("ExecStart=") {
            out.push_str(&line.replacen(from, to, 1));
        } else {
            out.push_str(line);
        }
    }
    Ok(out)
}

/// The tarball's tree below its top directory.
pub fn tarball(inputs: &Inputs, system_unit: &str, user_unit: &str) -> Vec<Item> {
    let mut items = vec![
        Item::File {
            from: inputs.binary.clone(),
            to: "bin/codebox".into(),
            mode: 0o755,
        },
        Item::Tree {
            from: inputs.rootfs.clone(),
            to: "share/codebox/rootfs".into(),
        },
        Item::Text {
            to: "share/codebox/systemd/codebox-system.service".into(),
            text: system_unit.to_string(),
            mode: 0o644,
        },
        Item::Text {
            to: "share/codebox/systemd/codebox.service".into(),
            text: user_unit.to_string(),
            mode: 0o644,
        },
    ];
    items.extend(docs(inputs, Path::new("share/doc/codebox")));
    items
}

/// The Debian package's tree (below `/`), without `DEBIAN/`.
pub fn deb(inputs: &Inputs, system_unit: &str, user_unit: &str) -> Result<Vec<Item>> {
    let mut items = vec![
        Item::File {
            from: inputs.binary.clone(),
            to: "usr/bin/codebox".into(),
            mode: 0o755,
        },
        Item::Tree {
            from: inputs.rootfs.clone(),
            to: "usr/share/codebox/rootfs".into(),
        },
        Item::Text {
            to: "lib/systemd/system/codebox.service".into(),
            text: unit_for(system_unit, SYSTEM_UNIT_EXE, DEB_EXE)?,
            mode: 0o644,
        },
        Item::Text {
            to: "usr/lib/systemd/user/codebox.service".into(),
            text: unit_for(user_unit, USER_UNIT_EXE, DEB_EXE)?,
            mode: 0o644,
        },
        Item::Text {
            to: "usr/lib/sysusers.d/codebox.conf".into(),
            text: SYSUSERS.to_string(),
            mode: 0o644,
        },
    ];
    items.extend(docs(inputs, Path::new("usr/share/doc/codebox")));
    Ok(items)
}

/// The system unit's account, created by systemd-sysusers (postinst, or at boot).
pub const SYSUSERS: &str = "\
# The account deploy/codebox-system.service runs codebox as (rootless: sandboxes map to it).
u codebox - \"codebox sandboxes\" /var/lib/codebox /usr/sbin/nologin
";

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs() -> Inputs {
        Inputs {
            repo: "/repo".into(),
            binary: "/repo/target/dist/codebox".into(),
            rootfs: "/repo/target/rootfs".into(),
        }
    }

    const SYSTEM: &str =
        "[Service]\nExecStart=/opt/codebox/bin/codebox serve --http 127.0.0.1:8080\n";
    const USER: &str = "[Service]\nExecStart=%h/.local/bin/codebox serve --http 127.0.0.1:8080\n";

    fn find<'a>(items: &'a [Item], to: &str) -> &'a Item {
        items.iter().find(|i| i.to() == Path::new(to)).unwrap()
    }

    #[test]
    fn the_binary_sits_next_to_share_codebox_rootfs_in_both_trees() {
        for (items, bin, rootfs) in [
            (
                tarball(&inputs(), SYSTEM, USER),
                "bin/codebox",
                "share/codebox/rootfs",
            ),
            (
                deb(&inputs(), SYSTEM, USER).unwrap(),
                "usr/bin/codebox",
                "usr/share/codebox/rootfs",
            ),
        ] {
            let bin_dir = Path::new(bin).parent().unwrap();
            // The binary's own lookup rule, applied to the tree's layout.
            assert_eq!(
                bin_dir.parent().unwrap().join("share/codebox/rootfs"),
                Path::new(rootfs)
            );
            assert!(matches!(find(&items, bin), Item::File { mode: 0o755, .. }));
            assert!(matches!(find(&items, rootfs), Item::Tree { .. }));
            assert!(items
                .iter()
                .any(|i| i.to().ends_with("doc/codebox/README.md")));
            assert!(items
                .iter()
                .any(|i| i.to().ends_with("doc/codebox/deploy.md")));
            assert!(items.iter().any(|i| i.to().ends_with("doc/codebox/book")));
        }
    }

    #[test]
    fn the_package_units_start_usr_bin_codebox() {
        let items = deb(&inputs(), SYSTEM, USER).unwrap();
        for unit in [
            "lib/systemd/system/codebox.service",
            "usr/lib/systemd/user/codebox.service",
        ] {
            let Item::Text { text, .. } = find(&items, unit) else {
                panic!("{unit} is not text")
            };
            assert!(text.contains("ExecStart=/usr/bin/codebox serve"), "{text}");
        }
    }

    #[test]
    fn a_unit_out_of_step_with_the_packaging_fails() {
        let other = "ExecStart=/usr/local/bin/codebox serve\n";
        assert!(unit_for(other, SYSTEM_UNIT_EXE, DEB_EXE).is_err());
        let twice =
            "ExecStart=/opt/codebox/bin/codebox serve\nExecStart=/opt/codebox/bin/codebox x\n";
        assert!(unit_for(twice, SYSTEM_UNIT_EXE, DEB_EXE).is_err());
        // Only the ExecStart line changes; comments naming the path stay as written.
        let commented =
            "# cp to /opt/codebox/bin/codebox\nExecStart=/opt/codebox/bin/codebox serve\n";
        let out = unit_for(commented, SYSTEM_UNIT_EXE, DEB_EXE).unwrap();
        assert_eq!(
            out,
            "# cp to /opt/codebox/bin/codebox\nExecStart=/usr/bin/codebox serve\n"
        );
    }
}
