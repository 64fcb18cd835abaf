//! `[[native]]` in the recipe: small C programs of codebox's own (the Python zygote's fork
//! path and the init of its children, `src/runtime/zygote/`), compiled with the host's C
//! compiler into the build directory and planned like any host file. The rootfs's C library
//! is the host's (its libraries come from the host, see `ldso.rs`), so a shared object
//! built here loads there.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// One program: `source` (relative to the workspace root) built as `kind` to `to` (in the
/// rootfs).
#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Native {
    pub source: PathBuf,
    pub to: PathBuf,
    pub kind: Kind,
}

#[derive(Debug, Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A shared object for ctypes (`-shared -fPIC`).
    Shared,
    /// A static executable without a C library (`-nostdlib -static`): its own `_start`
    /// and raw system calls.
    Freestanding,
}

/// The compiler's arguments for `kind` (before the output and the source). Warnings are
/// errors. `_FORTIFY_SOURCE` is off: the fork path jumps from a child's stack back to the
/// zygote's (`longjmp`), which glibc's checked variant may take for stack smashing.
pub fn flags(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Shared => &[
            "-O2",
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-U_FORTIFY_SOURCE",
            "-fPIC",
            "-shared",
        ],
        Kind::Freestanding => &[
            "-O2",
            "-std=gnu11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-ffreestanding",
            "-fno-builtin",
            "-fno-stack-protector",
            "-fno-pie",
            "-no-pie",
            "-static",
            "-nostdlib",
        ],
    }
}

/// Compiles each program into `build_dir/native/` (every run: a few hundred milliseconds;
/// the output is the same for the same source, so the sync copies only a changed one).
/// Returns `(rootfs path, built file)` pairs.
pub fn build(
    root: &Path,
    build_dir: &Path,
    programs: &[Native],
) -> Result<Vec<(PathBuf, PathBuf)>> {
    let out_dir = build_dir.join("native");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let mut built = Vec::new();
    for p in programs {
        let source = root.join(&p.source);
        let name =
            p.to.file_name()
                .with_context(|| format!("[[native]] to = {:?} has no file name", p.to))?;
        let out = out_dir.join(name);
        let status = Command::new(&cc)
            .args(flags(p.kind))
            .arg("-o")
            .arg(&out)
            .arg(&source)
            .status()
            .with_context(|| {
                format!(
                    "running the C compiler {:?} for {} (install gcc, or set CC)",
                    cc,
                    source.display()
                )
            })?;
        if !status.success() {
            bail!("compiling {} failed ({status})", source.display());
        }
        built.push((p.to.clone(), out));
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_have_their_flags() {
        let n: Native = toml::from_str(
            "source = \"src/runtime/zygote/init.c\"\nto = \"opt/x/init\"\nkind = \"freestanding\"\n",
        )
        .unwrap();
        assert_eq!(n.kind, Kind::Freestanding);
        assert!(flags(Kind::Freestanding).contains(&"-nostdlib"));
        assert!(flags(Kind::Shared).contains(&"-shared"));
        assert!(toml::from_str::<Native>("source = \"a\"\nto = \"b\"\nkind = \"dll\"\n").is_err());
    }
}
