//! `cargo xtask guest`: the microVM backend's guest and the directory its VMM is jailed in.
//!
//! # Layout
//! - [`kernel`]: Debian's cloud kernel, fetched with apt and pinned (`rootfs/guest.lock`);
//! - [`modules`]: the modules the guest loads and their dependencies, from `.modinfo`;
//! - [`cpio`], [`initramfs`]: the initramfs (newc), holding codebox as `/init`;
//! - [`erofs`]: the rootfs as a read-only erofs image, from the manifest-checked tree.
//!
//! The output, `target/guest` (or `$CODEBOX_GUEST`), is built like the rootfs (the same
//! plan, sync and `.manifest`, so codebox verifies it the same way) and is the root the
//! jailed QEMU sees:
//!
//! ```text
//! usr/bin/qemu-system-x86_64, its libraries, usr/share/qemu/<firmware>
//! boot/vmlinuz  boot/initramfs.cpio  boot/rootfs.erofs
//! guest.toml    what it was made from: kernel, modules, build ID of the guest init,
//!               the rootfs manifest's SHA-256, the QEMU version
//! proc dev tmp workspace   mount points of the jail
//! ```

mod cpio;
mod erofs;
mod initramfs;
mod kernel;
mod modules;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::rootfs::{manifest, plan::Plan, state, sync};

const HELP: &str = "\
cargo xtask guest [--codebox PATH] [--rootfs DIR] [--out DIR] [--repin]

Build the microVM backend's guest and the root directory of its jailed VMM (QEMU):
Debian's cloud kernel (apt-get download, pinned by rootfs/guest.lock), an initramfs with
the modules of rootfs/guest.toml (and their dependencies) and codebox itself as the
guest init, the rootfs as a read-only erofs image (checked against its .manifest
first), and QEMU with its libraries and firmware. Listed in DIR/.manifest like the
rootfs; guest.toml records what it was made from.

Options:
  --codebox PATH  the codebox binary the guest runs as its init (default:
                  target/debug/codebox); the host refuses a guest of another build
  --rootfs DIR    the rootfs tree to pack (default: $CODEBOX_ROOTFS, else target/rootfs)
  --out DIR       where to build (default: $CODEBOX_GUEST, else target/guest)
  --repin         take the archive's current kernel and rewrite rootfs/guest.lock
  -h, --help      print this help

Needs apt-get and dpkg-deb, strip (binutils), mkfs.erofs (erofs-utils) and
qemu-system-x86_64 (qemu-system-x86); `cargo xtask test` installs them as root.
";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Recipe {
    kernel: KernelRecipe,
    vmm: VmmRecipe,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelRecipe {
    package: String,
    modules: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VmmRecipe {
    qemu: PathBuf,
    files: Vec<PathBuf>,
}

#[derive(Debug, Default)]
struct Options {
    codebox: Option<PathBuf>,
    rootfs: Option<PathBuf>,
    out: Option<PathBuf>,
    repin: bool,
    help: bool,
}

impl Options {
    fn parse(args: &[OsString]) -> Result<Self> {
        let mut o = Options::default();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let s = arg.to_string_lossy();
            let mut value = |name: &str| -> Result<PathBuf> {
                Ok(args
                    .next()
                    .with_context(|| format!("{name} needs a value"))?
                    .into())
            };
            match s.as_ref() {
                "-h" | "--help" => o.help = true,
                "--repin" => o.repin = true,
                "--codebox" => o.codebox = Some(value("--codebox")?),
                "--rootfs" => o.rootfs = Some(value("--rootfs")?),
                "--out" => o.out = Some(value("--out")?),
                _ => bail!("unexpected argument {s:?}; see `cargo xtask guest --help`"),
            }
        }
        Ok(o)
    }
}

/// The target directory of the workspace.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

pub fn run(args: &[OsString]) -> Result<()> {
    let opts = Options::parse(args)?;
    if opts.help {
        print!("{HELP}");
        return Ok(());
    }
    let start = Instant::now();
    let root = workspace_root();
    let env_dir = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let out = opts
        .out
        .clone()
        .or_else(|| env_dir("CODEBOX_GUEST"))
        .unwrap_or_else(|| root.join("target/guest"));
    let rootfs = opts
        .rootfs
        .clone()
        .or_else(|| env_dir("CODEBOX_ROOTFS"))
        .unwrap_or_else(|| root.join("target/rootfs"));
    let codebox = opts
        .codebox
        .clone()
        .unwrap_or_else(|| root.join("target/debug/codebox"));
    let build_dir = root.join("target/guest-build");
    fs::create_dir_all(&build_dir).with_context(|| format!("creating {}", build_dir.display()))?;

    let recipe_path = root.join("rootfs/guest.toml");
    let recipe: Recipe = toml::from_str(
        &fs::read_to_string(&recipe_path)
            .with_context(|| format!("reading {}", recipe_path.display()))?,
    )
    .with_context(|| format!("parsing {}", recipe_path.display()))?;

    // The kernel and the modules the guest loads.
    let kernel = kernel::prepare(&root, &build_dir, &recipe.kernel.package, opts.repin)?;
    let mut tree = modules::Tree::scan(&kernel.modules_dir)?;
    let order = tree.load_order(&recipe.kernel.modules)?;

    // The initramfs: codebox as /init with its loader and libraries, and the modules.
    let init = initramfs::stripped(&codebox, &build_dir.join("codebox-init"))?;
    let build_id = initramfs::build_id(&init)?;
    let libraries: Vec<(PathBuf, PathBuf)> = crate::rootfs::host_libraries(&codebox)?
        .into_iter()
        .map(|l| (l.found, l.real))
        .collect();
    let contents = initramfs::Contents::plan(&init, &libraries, &order)?;
    let initramfs_path = build_dir.join("initramfs.cpio");
    let initramfs_size = contents.write(&initramfs_path)?;

    // The rootfs image.
    let (erofs_path, rootfs_manifest) = erofs::build(&rootfs, &build_dir)?;

    // What it was made from.
    let qemu_version = command_line(&recipe.vmm.qemu, "--version")?;
    let module_names: Vec<&str> = order.iter().map(|(n, _)| n.as_str()).collect();
    let description = format!(
        "# Written by `cargo xtask guest`: what this guest was made from.\n\
         kernel_package = {:?}\nkernel_version = {:?}\nkernel_release = {:?}\n\
         modules = {:?}\ninit_build_id = {:?}\nrootfs_manifest_sha256 = {:?}\nqemu = {:?}\n",
        kernel.package,
        kernel.version,
        kernel.release,
        module_names,
        build_id,
        rootfs_manifest,
        qemu_version.lines().next().unwrap_or(""),
    );
    let description_path = build_dir.join("guest.toml");
    state::write_atomic(&description_path, description.as_bytes())?;

    // The jail's root, planned and synced like the rootfs.
    let mut plan = Plan::default();
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        plan.symlink(link, target)?;
    }
    for dir in ["proc", "dev", "tmp", "workspace", "boot"] {
        plan.dir(dir)?;
    }
    plan.file("usr/bin/qemu-system-x86_64", &recipe.vmm.qemu)?;
    // At the path named (QEMU looks for its firmware by name; Debian's are links).
    for file in &recipe.vmm.files {
        let rel = file
            .strip_prefix("/")
            .with_context(|| format!("{} is not absolute", file.display()))?;
        plan.file(rel, file)?;
    }
    plan.file("boot/vmlinuz", &kernel.vmlinuz)?;
    plan.file("boot/initramfs.cpio", &initramfs_path)?;
    plan.file("boot/rootfs.erofs", &erofs_path)?;
    plan.file("guest.toml", &description_path)?;
    let libs = crate::rootfs::plan_libraries(&mut plan)?;
    plan.check_links()?;
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let out = fs::canonicalize(&out)?;
    if out.read_dir()?.next().is_some() && !out.join(sync::MANIFEST).is_file() {
        bail!(
            "refusing to build into {}: it is not empty and has no {} from an earlier build",
            out.display(),
            sync::MANIFEST
        );
    }
    let mut st = state::State::load(&build_dir.join("state.tsv"));
    let stats = sync::sync(&plan, &out, &mut st)?;
    // Sealed like the rootfs (no write bit anywhere), which the manifest's scan requires
    // and codebox's sealed check of the tree relies on.
    crate::rootfs::seal::seal(&out, &plan)?;
    let lines = manifest::scan(&out, &plan, &mut st)?;
    manifest::write(&out, &manifest::render(&lines))?;
    st.retain(|p| plan.get(p).is_some());
    st.save()?;

    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "guest {}: kernel {} {}, {} modules ({}), initramfs {:.1} MiB (init build {}), \
         rootfs image {:.1} MiB, QEMU with {} libraries; copied {}, unchanged {}; {:.1}s",
        out.display(),
        kernel.package,
        kernel.version,
        module_names.len(),
        module_names.join(" "),
        mib(initramfs_size),
        &build_id[..12],
        mib(fs::metadata(&erofs_path)?.len()),
        libs,
        stats.copied,
        stats.unchanged,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The first line a program prints for `arg` (e.g. its version).
fn command_line(program: &Path, arg: &str) -> Result<String> {
    let out = Command::new(program)
        .arg(arg)
        .output()
        .with_context(|| format!("running {} (install qemu-system-x86)", program.display()))?;
    if !out.status.success() {
        bail!("{} {arg} failed", program.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let a = |v: &[&str]| Options::parse(&v.iter().map(OsString::from).collect::<Vec<_>>());
        let o = a(&["--codebox", "x", "--repin"]).unwrap();
        assert_eq!(o.codebox, Some(PathBuf::from("x")));
        assert!(o.repin);
        assert!(a(&["--out"]).is_err());
        assert!(a(&["--what"]).is_err());
    }

    #[test]
    fn the_recipe_in_the_tree_parses() {
        let text = fs::read_to_string(workspace_root().join("rootfs/guest.toml")).unwrap();
        let r: Recipe = toml::from_str(&text).unwrap();
        assert!(r.kernel.modules.iter().any(|m| m == "erofs"));
        let lock = fs::read_to_string(workspace_root().join("rootfs/guest.lock")).unwrap();
        assert_eq!(kernel::parse_lock(&lock).unwrap().len(), 2);
    }
}
