//! The initramfs: codebox's own guest init and the kernel modules it loads, nothing else.
//!
//! ```text
//! /init                         the codebox binary (stripped), run as `/init guest-init`
//! /lib64/ld-linux-x86-64.so.2   its loader, and below /lib its libraries (libc, libm,
//! /lib/x86_64-linux-gnu/...     libgcc_s): the host's files, which are the ones the
//!                               rootfs copies too (both from this Debian release)
//! /modules/order                module file names, one a line, in load order
//! /modules/*.ko
//! /dev /proc /sys /tmp /rootfs  mount points
//! ```
//!
//! The binary's GNU build ID goes into `guest.toml`: the host refuses a guest whose init
//! is another build than itself (the two speak one protocol, in one binary).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use goblin::elf::Elf;

use super::cpio::{Node, Writer};

/// The GNU build ID of an ELF file, as lower-case hex.
pub fn build_id(path: &Path) -> Result<String> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let elf = Elf::parse(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    if let Some(notes) = elf.iter_note_headers(&bytes) {
        for note in notes {
            let note = note.with_context(|| format!("reading the notes of {}", path.display()))?;
            // NT_GNU_BUILD_ID
            if note.name == "GNU" && note.n_type == 3 {
                return Ok(note.desc.iter().map(|b| format!("{b:02x}")).collect());
            }
        }
    }
    bail!("{} has no GNU build ID note", path.display())
}

/// `strip` of `binary` into `out` (symbols and debug information go, the build ID stays),
/// redone only when the binary changed.
pub fn stripped(binary: &Path, out: &Path) -> Result<PathBuf> {
    let stamp = out.with_extension("stamp");
    let meta = fs::metadata(binary).with_context(|| {
        format!(
            "{} is missing: build it first (cargo build), or name one with --codebox",
            binary.display()
        )
    })?;
    let want = format!(
        "{}:{}:{:?}",
        binary.display(),
        meta.len(),
        meta.modified().ok()
    );
    if out.is_file() && fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return Ok(out.to_path_buf());
    }
    let status = Command::new("strip")
        .arg("-o")
        .arg(out)
        .arg(binary)
        .status()
        .context("running strip (install binutils)")?;
    if !status.success() {
        bail!("strip {} failed", binary.display());
    }
    fs::write(&stamp, want)?;
    Ok(out.to_path_buf())
}

/// What goes into the archive, as data: (path, mode, content).
#[derive(Debug, Default)]
pub struct Contents {
    pub dirs: Vec<String>,
    /// (path in the archive, mode, host file).
    pub files: Vec<(String, u32, PathBuf)>,
    /// (path, bytes) of generated files.
    pub generated: Vec<(String, Vec<u8>)>,
}

impl Contents {
    /// The layout described in the module documentation.
    pub fn plan(
        init: &Path,
        libraries: &[(PathBuf, PathBuf)],
        modules: &[(String, PathBuf)],
    ) -> Result<Contents> {
        let mut c = Contents::default();
        for d in ["dev", "proc", "sys", "tmp", "rootfs", "modules"] {
            c.dirs.push(d.into());
        }
        c.files.push(("init".into(), 0o755, init.to_path_buf()));
        for (found, real) in libraries {
            let rel = found
                .strip_prefix("/")
                .with_context(|| format!("library path {} is not absolute", found.display()))?
                .to_str()
                .context("a library path that is not UTF-8")?
                .to_string();
            let mut parent = String::new();
            for comp in rel.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
                parent = if parent.is_empty() {
                    comp.to_string()
                } else {
                    format!("{parent}/{comp}")
                };
                if !c.dirs.contains(&parent) {
                    c.dirs.push(parent.clone());
                }
            }
            c.files.push((rel, 0o755, real.clone()));
        }
        let mut order = String::new();
        for (name, file) in modules {
            let base = file
                .file_name()
                .and_then(|n| n.to_str())
                .with_context(|| format!("module {name} has no file name"))?;
            order.push_str(base);
            order.push('\n');
            c.files
                .push((format!("modules/{base}"), 0o644, file.clone()));
        }
        c.generated
            .push(("modules/order".into(), order.into_bytes()));
        Ok(c)
    }

    /// Writes the archive to `out`; returns its size.
    pub fn write(&self, out: &Path) -> Result<u64> {
        let tmp = out.with_extension("tmp");
        let file = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut w = Writer::new(std::io::BufWriter::new(file));
        for d in &self.dirs {
            w.add(d, 0o755, Node::Dir)?;
        }
        for (path, mode, src) in &self.files {
            let bytes = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
            w.add(path, *mode, Node::File(&bytes))?;
        }
        for (path, bytes) in &self.generated {
            w.add(path, 0o644, Node::File(bytes))?;
        }
        let (buf, size) = w.finish()?;
        buf.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        fs::rename(&tmp, out)?;
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_has_parents_before_children_and_the_module_order() {
        let c = Contents::plan(
            Path::new("/b/codebox"),
            &[
                ("/lib64/ld-linux-x86-64.so.2".into(), "/usr/lib64/ld".into()),
                (
                    "/lib/x86_64-linux-gnu/libc.so.6".into(),
                    "/usr/lib/libc".into(),
                ),
            ],
            &[
                ("virtio".into(), "/k/virtio.ko".into()),
                ("virtio_rng".into(), "/k/virtio-rng.ko".into()),
            ],
        )
        .unwrap();
        let pos = |d: &str| c.dirs.iter().position(|x| x == d).unwrap();
        assert!(pos("lib") < pos("lib/x86_64-linux-gnu"));
        assert!(c.dirs.contains(&"lib64".to_string()));
        assert_eq!(c.files[0].0, "init");
        assert!(c.files.iter().any(|f| f.0 == "modules/virtio-rng.ko"));
        let order = &c.generated[0];
        assert_eq!(order.0, "modules/order");
        assert_eq!(order.1, b"virtio.ko\nvirtio-rng.ko\n");
    }

    #[test]
    fn this_test_binary_has_a_build_id() {
        let exe = std::env::current_exe().unwrap();
        let id = build_id(&exe).unwrap();
        assert!(
            id.len() >= 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
    }
}
