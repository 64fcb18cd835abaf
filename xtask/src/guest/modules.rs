//! The kernel modules the guest loads, and the ones they need.
//!
//! Debian's kernel package ships no `modules.dep` (depmod runs at install time), so the
//! dependencies are read where depmod reads them: each module's `.modinfo` section
//! (`name=`, `depends=`, `softdep=pre: ...`). A dependency the kernel has built in
//! (`modules.builtin`) needs nothing. The result is a load order: every module after
//! the modules it depends on.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use goblin::elf::Elf;

/// What `.modinfo` says about one module.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModInfo {
    pub name: String,
    pub depends: Vec<String>,
    /// `softdep=pre:` names: loaded before the module when they are modules.
    pub soft_pre: Vec<String>,
}

/// Module names use `_` where file names may use `-` (`virtio-rng.ko` is `virtio_rng`).
pub fn normalize(name: &str) -> String {
    name.replace('-', "_")
}

/// Parses the NUL-separated `key=value` strings of a `.modinfo` section.
pub fn parse_modinfo(section: &[u8]) -> ModInfo {
    let mut info = ModInfo::default();
    for field in section.split(|&b| b == 0) {
        let Ok(field) = std::str::from_utf8(field) else {
            continue;
        };
        if let Some(name) = field.strip_prefix("name=") {
            info.name = normalize(name);
        } else if let Some(deps) = field.strip_prefix("depends=") {
            info.depends = deps
                .split(',')
                .filter(|d| !d.is_empty())
                .map(normalize)
                .collect();
        } else if let Some(soft) = field.strip_prefix("softdep=") {
            // "pre: a b post: c": only what comes before the module matters for loading.
            let mut pre = false;
            for word in soft.split_whitespace() {
                match word {
                    "pre:" => pre = true,
                    "post:" => pre = false,
                    w if pre => info.soft_pre.push(normalize(w)),
                    _ => {}
                }
            }
        }
    }
    info
}

/// Reads the `.modinfo` section of the module file at `path`.
pub fn read_modinfo(path: &Path) -> Result<ModInfo> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let elf = Elf::parse(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    for sh in &elf.section_headers {
        if elf.shdr_strtab.get_at(sh.sh_name) == Some(".modinfo") {
            let range = sh
                .file_range()
                .context("a .modinfo section without bytes")?;
            let section = bytes
                .get(range)
                .with_context(|| format!("{}: .modinfo lies outside the file", path.display()))?;
            let mut info = parse_modinfo(section);
            if info.name.is_empty() {
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                info.name = normalize(stem.trim_end_matches(".ko"));
            }
            return Ok(info);
        }
    }
    bail!("{} has no .modinfo section", path.display())
}

/// The modules of one kernel: name → (file, modinfo), and the built-in names.
#[derive(Debug, Default)]
pub struct Tree {
    pub modules: BTreeMap<String, (PathBuf, ModInfo)>,
    pub builtin: BTreeSet<String>,
}

impl Tree {
    /// Scans `lib/modules/<release>` (every `*.ko` below `kernel/`, and `modules.builtin`).
    pub fn scan(dir: &Path) -> Result<Tree> {
        let mut tree = Tree::default();
        let builtin = dir.join("modules.builtin");
        let text = fs::read_to_string(&builtin)
            .with_context(|| format!("reading {}", builtin.display()))?;
        for line in text.lines() {
            if let Some(file) = line.rsplit('/').next() {
                tree.builtin.insert(normalize(file.trim_end_matches(".ko")));
            }
        }
        let mut stack = vec![dir.join("kernel")];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
                let path = e?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|x| x == "ko") {
                    // Only the name is needed for the scan; the file is parsed again when
                    // chosen (a few hundred small reads instead of thousands of parses).
                    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                    tree.modules
                        .insert(normalize(stem), (path.clone(), ModInfo::default()));
                }
            }
        }
        Ok(tree)
    }

    /// `wanted` and everything they depend on, in an order the kernel can load them.
    pub fn load_order(&mut self, wanted: &[String]) -> Result<Vec<(String, PathBuf)>> {
        let mut order = Vec::new();
        let mut done = BTreeSet::new();
        for name in wanted {
            self.visit(
                &normalize(name),
                &mut Vec::new(),
                &mut done,
                &mut order,
                true,
            )?;
        }
        Ok(order)
    }

    fn visit(
        &mut self,
        name: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        order: &mut Vec<(String, PathBuf)>,
        required: bool,
    ) -> Result<()> {
        if done.contains(name) || self.builtin.contains(name) {
            return Ok(());
        }
        if path.iter().any(|p| p == name) {
            bail!("module dependency cycle: {} -> {name}", path.join(" -> "));
        }
        let Some((file, info)) = self.modules.get(name).cloned() else {
            if required {
                bail!(
                    "module {name} is neither in the kernel package nor built in{}",
                    if path.is_empty() {
                        String::new()
                    } else {
                        format!(" (needed by {})", path.join(" -> "))
                    }
                );
            }
            // A soft dependency that is not a module of this kernel: nothing to load.
            return Ok(());
        };
        let info = if info.name.is_empty() {
            let info = read_modinfo(&file)?;
            self.modules
                .insert(name.to_string(), (file.clone(), info.clone()));
            info
        } else {
            info
        };
        path.push(name.to_string());
        for dep in &info.soft_pre {
            self.visit(dep, path, done, order, false)?;
        }
        for dep in &info.depends {
            self.visit(dep, path, done, order, true)?;
        }
        path.pop();
        done.insert(name.to_string());
        order.push((name.to_string(), file));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modinfo_fields_are_read() {
        let section =
            b"license=GPL\0depends=virtio,virtio_ring\0softdep=pre: crc32c post: foo\0name=virtio-blk\0";
        let info = parse_modinfo(section);
        assert_eq!(info.name, "virtio_blk");
        assert_eq!(info.depends, ["virtio", "virtio_ring"]);
        assert_eq!(info.soft_pre, ["crc32c"]);
        assert_eq!(parse_modinfo(b"depends=\0").depends, Vec::<String>::new());
    }

    fn tree(mods: &[(&str, &[&str], &[&str])], builtin: &[&str]) -> Tree {
        let mut t = Tree::default();
        for (name, deps, soft) in mods {
            t.modules.insert(
                name.to_string(),
                (
                    PathBuf::from(format!("/m/{name}.ko")),
                    ModInfo {
                        name: name.to_string(),
                        depends: deps.iter().map(|s| s.to_string()).collect(),
                        soft_pre: soft.iter().map(|s| s.to_string()).collect(),
                    },
                ),
            );
        }
        t.builtin = builtin.iter().map(|s| s.to_string()).collect();
        t
    }

    #[test]
    fn dependencies_come_first_and_once() {
        let mut t = tree(
            &[
                ("virtio_ring", &[], &[]),
                ("virtio", &["virtio_ring"], &[]),
                ("virtio_blk", &["virtio", "virtio_ring"], &[]),
                ("erofs", &["libcrc32c"], &[]),
                ("libcrc32c", &[], &["crc32c"]),
            ],
            &["crc32c"],
        );
        let order: Vec<String> = t
            .load_order(&["virtio_blk".into(), "erofs".into(), "virtio".into()])
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            order,
            ["virtio_ring", "virtio", "virtio_blk", "libcrc32c", "erofs"]
        );
    }

    #[test]
    fn missing_modules_and_cycles_are_refused() {
        let mut t = tree(&[("a", &["b"], &[]), ("b", &["a"], &[])], &[]);
        let err = t.load_order(&["a".into()]).unwrap_err().to_string();
        assert!(err.contains("cycle"), "{err}");
        let mut t = tree(&[("a", &["nothere"], &[])], &[]);
        let err = t.load_order(&["a".into()]).unwrap_err().to_string();
        assert!(
            err.contains("nothere") && err.contains("needed by a"),
            "{err}"
        );
        // A soft dependency that does not exist is not an error.
        let mut t = tree(&[("a", &[], &["nothere"])], &[]);
        assert_eq!(t.load_order(&["a".into()]).unwrap().len(), 1);
    }
}
