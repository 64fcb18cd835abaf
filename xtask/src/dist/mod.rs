//! `cargo xtask dist`: a release that installs anywhere.
//!
//! - [`layout`]: what goes where in the tarball and in the Debian package (data);
//! - [`deps`]: the Debian packages the binary's shared libraries come from;
//! - [`deb`]: the package's control data and `dpkg-deb`;
//! - [`check`]: the tarball unpacked into a fresh directory, its `doctor` run with an
//!   empty environment.
//!
//! The procedure: build the binary (profile `dist`: stripped, LTO), stage
//! `target/packages/codebox-<version>-<arch>-linux/` (kept: `cargo xtask image` builds from
//! it), pack it with `tar` and `zstd`, stage and build the `.deb`, then check the tarball.

pub mod check;
pub mod deb;
pub mod deps;
pub mod layout;

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::test::{cargo_command, run_checked, workspace_root};
use layout::{Inputs, Item};

const HELP: &str = "\
cargo xtask dist [--profile NAME | --binary FILE] [--rootfs DIR] [--level N] [--no-deb]
                 [--no-check]

Builds a relocatable release in target/packages:
  codebox-VERSION-ARCH-linux.tar.zst   bin/codebox, share/codebox/rootfs (with its
                                       manifest), share/codebox/systemd/*.service,
                                       share/doc/codebox/; unpack it under any prefix
  codebox_VERSION_DEBARCH.deb          /usr/bin/codebox, /usr/share/codebox/rootfs,
                                       systemd units, a sysusers.d entry
  codebox-VERSION-ARCH-linux/          the staged tree (`cargo xtask image` uses it)
The binary finds its rootfs at ../share/codebox/rootfs from its own directory.
Last, the tarball is unpacked into a fresh directory and its `codebox doctor` run with
an empty environment: the rootfs must verify there.

Options:
  --profile NAME  cargo profile of the binary (default: dist, stripped with LTO; `dev`
                  for a quick debug build, as CI does)
  --binary FILE   ship this codebox binary instead of building one
  --rootfs DIR    the rootfs to ship (default: $CODEBOX_ROOTFS, else target/rootfs)
  --level N       zstd level of the tarball (default 19; CI uses 3); below 10 the
                  .deb is gzip -1 instead of xz -6
  --no-deb        skip the Debian package
  --no-check      skip unpacking and running the tarball
";

struct Options {
    profile: String,
    binary: Option<PathBuf>,
    rootfs: Option<PathBuf>,
    level: u32,
    deb: bool,
    check: bool,
}

impl Options {
    fn parse(args: &[OsString]) -> Result<Option<Options>> {
        let mut o = Options {
            profile: "dist".into(),
            binary: None,
            rootfs: None,
            level: 19,
            deb: true,
            check: true,
        };
        let mut args = args.iter();
        while let Some(a) = args.next() {
            let mut value = |name: &str| -> Result<String> {
                args.next()
                    .and_then(|v| v.to_str())
                    .map(str::to_string)
                    .with_context(|| format!("{name} needs a value"))
            };
            match a.to_str() {
                Some("--profile") => o.profile = value("--profile")?,
                Some("--rootfs") => o.rootfs = Some(value("--rootfs")?.into()),
                Some("--binary") => o.binary = Some(value("--binary")?.into()),
                Some("--level") => {
                    o.level = value("--level")?
                        .parse()
                        .ok()
                        .filter(|l| (1..=22).contains(l))
                        .context("--level takes a zstd level from 1 to 22")?
                }
                Some("--no-deb") => o.deb = false,
                Some("--no-check") => o.check = false,
                Some("-h" | "--help") => {
                    print!("{HELP}");
                    return Ok(None);
                }
                _ => bail!("unknown option {a:?}; see `cargo xtask dist --help`"),
            }
        }
        Ok(Some(o))
    }
}

/// What `dist` made.
pub struct Release {
    /// The staged tree (top directory of the tarball).
    pub tree: PathBuf,
    pub tarball: PathBuf,
    pub deb: Option<PathBuf>,
}

pub fn run(args: &[OsString]) -> Result<()> {
    let Some(opts) = Options::parse(args)? else {
        return Ok(());
    };
    build(&opts).map(drop)
}

/// `cargo xtask dist` with these arguments, for CI: returns what it made.
pub fn run_for_ci(args: &[&str]) -> Result<Release> {
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let opts = Options::parse(&args)?.context("--help given")?;
    build(&opts)
}

/// The release's name stem, e.g. `codebox-0.1.0-x86_64-linux`.
pub fn stem(root: &Path) -> Result<String> {
    Ok(format!(
        "codebox-{}-{}-linux",
        version(root)?,
        std::env::consts::ARCH
    ))
}

/// The codebox package's version from the workspace's Cargo.toml.
pub fn version(root: &Path) -> Result<String> {
    let text = fs::read_to_string(root.join("Cargo.toml"))?;
    let doc: toml::Table = toml::from_str(&text).context("parsing Cargo.toml")?;
    doc.get("package")
        .and_then(|p| p.get("version"))
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .context("Cargo.toml has no package.version")
}

fn build(opts: &Options) -> Result<Release> {
    let started = Instant::now();
    let root = workspace_root();
    let out = root.join("target/packages");
    fs::create_dir_all(&out)?;

    // 1. The binary.
    let binary = match &opts.binary {
        Some(b) => {
            if !b.is_file() {
                bail!("--binary {} is not a file", b.display());
            }
            b.clone()
        }
        None => {
            let built = Instant::now();
            run_checked(
                &mut cargo_command(
                    &root,
                    &[
                        "build",
                        "--package",
                        "codebox",
                        "--bin",
                        "codebox",
                        "--profile",
                        &opts.profile,
                    ],
                ),
                "cargo build (codebox)",
            )?;
            println!("built in {:.0?}", built.elapsed());
            let dir = if opts.profile == "dev" {
                "debug"
            } else {
                &opts.profile
            };
            root.join("target").join(dir).join("codebox")
        }
    };
    println!("binary: {} ({} bytes)", binary.display(), size(&binary)?);

    // 2. The rootfs it ships.
    let rootfs = opts
        .rootfs
        .clone()
        .or_else(|| std::env::var_os("CODEBOX_ROOTFS").map(PathBuf::from))
        .unwrap_or_else(|| root.join("target/rootfs"));
    if !rootfs.join(".manifest").is_file() {
        bail!(
            "{} has no .manifest: build the rootfs with `cargo xtask rootfs`",
            rootfs.display()
        );
    }
    let inputs = Inputs {
        repo: root.clone(),
        binary,
        rootfs,
    };
    let system_unit = fs::read_to_string(root.join("deploy/codebox-system.service"))?;
    let user_unit = fs::read_to_string(root.join("deploy/codebox.service"))?;

    // 3. The tarball: stage the tree, then tar | zstd.
    let stem = stem(&root)?;
    let tree = out.join(&stem);
    stage(&tree, &layout::tarball(&inputs, &system_unit, &user_unit))?;
    let tarball = out.join(format!("{stem}.tar.zst"));
    let packed = Instant::now();
    pack(&out, &stem, &tarball, opts.level)?;
    println!(
        "tarball: {} ({} bytes, zstd -{} in {:.0?}; tree {} bytes)",
        tarball.display(),
        size(&tarball)?,
        opts.level,
        packed.elapsed(),
        tree_size(&tree)?
    );

    // 4. The Debian package.
    let deb = if opts.deb {
        Some(build_deb(
            &root,
            &out,
            &inputs,
            &system_unit,
            &user_unit,
            opts.level < 10,
        )?)
    } else {
        None
    };

    // 5. The tarball, unpacked into a fresh directory, must run.
    if opts.check {
        check::unpacked(&tarball, &stem)?;
    }
    println!("xtask dist: done in {:.0?}", started.elapsed());
    Ok(Release { tree, tarball, deb })
}

/// Makes `top` hold exactly `items` (a previous tree there is removed first).
fn stage(top: &Path, items: &[Item]) -> Result<()> {
    // A previous tree holds a sealed rootfs (see rootfs/seal.rs).
    crate::rootfs::seal::remove_tree(top)?;
    fs::create_dir_all(top)?;
    fs::set_permissions(top, fs::Permissions::from_mode(0o755))?;
    for item in items {
        let to = top.join(item.to());
        let parent = to.parent().context("an item below the top")?;
        fs::create_dir_all(parent)?;
        match item {
            Item::File { from, mode, .. } => {
                fs::copy(from, &to).with_context(|| format!("copying {}", from.display()))?;
                fs::set_permissions(&to, fs::Permissions::from_mode(*mode))?;
            }
            // cp -a: modes, symlinks and times as they are; the manifest checks modes
            // and targets, not owners.
            Item::Tree { from, .. } => run_checked(
                Command::new("cp")
                    .args(["-a", "--reflink=auto"])
                    .arg(from)
                    .arg(&to),
                &format!("copying {}", from.display()),
            )?,
            Item::Text { text, mode, .. } => {
                fs::write(&to, text)?;
                fs::set_permissions(&to, fs::Permissions::from_mode(*mode))?;
            }
        }
    }
    // Directories created on the way get 0755 whatever the umask; the rootfs, copied
    // as it is, stays sealed (its top directory included).
    run_checked(
        Command::new("find")
            .arg(top)
            .args(["-type", "d", "-path"])
            .arg(format!("{}/*/rootfs", top.display()))
            .args([
                "-prune", "-o", "-type", "d", "-exec", "chmod", "0755", "{}", "+",
            ]),
        "setting directory modes",
    )
}

/// `tar` of `dir/stem` (root-owned entries, sorted names) compressed by `zstd`.
fn pack(dir: &Path, stem: &str, out: &Path, level: u32) -> Result<()> {
    run_checked(
        Command::new("tar")
            .args([
                "--create",
                "--format=gnu",
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
            ])
            .arg(format!(
                "--use-compress-program=zstd -T0 -{level}{}",
                if level > 19 { " --ultra" } else { "" }
            ))
            .arg("--file")
            .arg(out)
            .arg("-C")
            .arg(dir)
            .arg(stem),
        "tar | zstd",
    )
}

fn build_deb(
    root: &Path,
    out: &Path,
    inputs: &Inputs,
    system_unit: &str,
    user_unit: &str,
    fast: bool,
) -> Result<PathBuf> {
    let version = version(root)?;
    let arch = deb::debian_arch(std::env::consts::ARCH)?;
    let tree = out.join("deb-root");
    stage(&tree, &layout::deb(inputs, system_unit, user_unit)?)?;
    let (_, packages) = deps::packages(&inputs.binary)?;
    let glibc = deps::glibc_needed(&inputs.binary)?;
    let depends: Vec<String> = packages
        .iter()
        .map(|p| match (&glibc, p.name.as_str()) {
            (Some(v), "libc6") => format!("libc6 (>= {v})"),
            _ => p.name.clone(),
        })
        .collect();
    let control_dir = tree.join("DEBIAN");
    fs::create_dir_all(&control_dir)?;
    fs::set_permissions(&control_dir, fs::Permissions::from_mode(0o755))?;
    let kib = tree_size(&tree)?.div_ceil(1024);
    fs::write(
        control_dir.join("control"),
        deb::control(&version, arch, &depends, kib),
    )?;
    fs::write(control_dir.join("postinst"), deb::POSTINST)?;
    fs::set_permissions(
        control_dir.join("postinst"),
        fs::Permissions::from_mode(0o755),
    )?;
    let file = out.join(format!("codebox_{version}_{arch}.deb"));
    let started = Instant::now();
    deb::build(&tree, &file, fast)?;
    crate::rootfs::seal::remove_tree(&tree)?;
    println!(
        "deb: {} ({} bytes, in {:.0?}; Depends: {})",
        file.display(),
        size(&file)?,
        started.elapsed(),
        depends.join(", ")
    );
    Ok(file)
}

fn size(path: &Path) -> Result<u64> {
    Ok(fs::metadata(path)
        .with_context(|| format!("{}", path.display()))?
        .len())
}

/// Apparent size of every regular file below `dir`.
pub fn tree_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                total += e.metadata()?.len();
            }
        }
    }
    Ok(total)
}
