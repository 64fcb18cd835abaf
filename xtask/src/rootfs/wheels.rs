//! Python packages from binary wheels, installed with pip into a staging directory of the
//! build directory and reused while the requirements and the target stay the same (as
//! `deno.rs` does for Deno).
//!
//! No package code runs at build time:
//! - `--only-binary=:all:`: pip never takes a source distribution, so no build backend
//!   (`setup.py`, PEP 517 hooks) runs; a requirement with no wheel for the target fails;
//! - the target is given explicitly (`--python-version`, `--implementation`, `--abi`,
//!   `--platform`: the rootfs's interpreter and glibc, not the host's), and pip accepts an
//!   explicit target only together with `--only-binary=:all:`;
//! - installing a wheel only unpacks it (and `--no-compile` skips even the byte-compile,
//!   which `python.rs` does later with the rootfs's own interpreter);
//! - afterwards every installed distribution must have come from a wheel: a
//!   `*.dist-info/WHEEL` file, no `*.egg-info`.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The file in a staging directory that says what it holds.
const STAMP: &str = ".codebox-requirements";

/// What wheels must fit: the rootfs's interpreter and C library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `3.11`
    pub python_version: String,
    /// `x86_64`
    pub arch: String,
    /// The glibc minor version (glibc 2.36 → 36).
    pub glibc_minor: u32,
}

impl Target {
    /// The rootfs's target: its Python version, this machine's architecture and the glibc
    /// the rootfs copies (the host's, which this process runs on too).
    pub fn for_rootfs(python_version: &str) -> Result<Self> {
        // SAFETY: gnu_get_libc_version takes no arguments and returns a pointer to a
        // static NUL-terminated string.
        let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
        let version = version.to_str().context("glibc's version is not UTF-8")?;
        let glibc_minor = parse_glibc(version)
            .with_context(|| format!("cannot read glibc version {version:?}"))?;
        Ok(Self {
            python_version: python_version.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
            glibc_minor,
        })
    }

    /// `cp311`
    pub fn abi(&self) -> String {
        format!("cp{}", self.python_version.replace('.', ""))
    }

    /// Every manylinux platform tag this glibc runs, newest first (pip takes them as given:
    /// it adds no older ones of its own for `manylinux_2_x` tags).
    pub fn platforms(&self) -> Vec<String> {
        let arch = &self.arch;
        let mut tags: Vec<String> = (5..=self.glibc_minor)
            .rev()
            .map(|m| format!("manylinux_2_{m}_{arch}"))
            .collect();
        // The legacy names of manylinux_2_17, _2_12 and _2_5.
        for (name, minor) in [
            ("manylinux2014", 17),
            ("manylinux2010", 12),
            ("manylinux1", 5),
        ] {
            if self.glibc_minor >= minor {
                tags.push(format!("{name}_{arch}"));
            }
        }
        tags
    }

    /// pip's arguments that select wheels for this target.
    fn pip_args(&self) -> Vec<String> {
        let mut args = vec![
            "--only-binary=:all:".to_owned(),
            "--implementation".to_owned(),
            "cp".to_owned(),
            "--python-version".to_owned(),
            self.python_version.clone(),
            "--abi".to_owned(),
            self.abi(),
        ];
        for p in self.platforms() {
            args.push("--platform".to_owned());
            args.push(p);
        }
        args
    }
}

fn parse_glibc(version: &str) -> Option<u32> {
    let (major, minor) = version.split_once('.')?;
    if major != "2" {
        return None;
    }
    minor
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A staging directory and whether pip ran to fill it.
#[derive(Debug)]
pub struct Staged {
    pub dir: PathBuf,
    pub installed: bool,
}

/// Installs `requirements` for `target` into `build_dir/name` (through `name.tmp`, renamed
/// when complete), or reuses what is there when it was made for the same requirements and
/// target. `pip_extra` goes to pip before the requirements (tests: a local index).
pub fn stage(
    build_dir: &Path,
    name: &str,
    requirements: &[String],
    target: &Target,
    pip_extra: &[OsString],
) -> Result<Staged> {
    let dir = build_dir.join(name);
    let args = target.pip_args();
    let stamp = format!(
        "{}\n{}\n{}\n",
        requirements.join("\n"),
        args.join(" "),
        pip_extra
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    if fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp) {
        return Ok(Staged {
            dir,
            installed: false,
        });
    }

    let tmp = build_dir.join(format!("{name}.tmp"));
    remove_all(&tmp)?;
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    if !requirements.is_empty() {
        eprintln!(
            "installing {} Python requirement(s) from binary wheels into {}",
            requirements.len(),
            dir.display()
        );
        let output = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                "--no-compile",
                // The conflicts pip would report are those of the Python running pip.
                "--no-warn-conflicts",
                "--no-warn-script-location",
            ])
            .args(&args)
            .arg("--target")
            .arg(&tmp)
            .args(pip_extra)
            .arg("--")
            .args(requirements)
            .output()
            .context("running `python3 -m pip`: is python3 with pip on PATH?")?;
        if !output.status.success() {
            bail!(
                "`python3 -m pip install --only-binary=:all: --target {} {}` failed ({}):\n{}",
                tmp.display(),
                requirements.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim_end()
            );
        }
        check_all_wheels(&tmp)?;
    }
    fs::write(tmp.join(STAMP), &stamp)
        .with_context(|| format!("writing {}", tmp.join(STAMP).display()))?;
    remove_all(&dir)?;
    fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    Ok(Staged {
        dir,
        installed: !requirements.is_empty(),
    })
}

/// Every distribution in `dir` came from a wheel: it has `*.dist-info/WHEEL`, and nothing
/// was installed the setuptools way (`*.egg-info`). Returns the `name==version` of each.
pub fn check_all_wheels(dir: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let rd = fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in rd {
        let e = e.with_context(|| format!("reading {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".egg-info") {
            bail!(
                "{} was not installed from a wheel ({name})",
                dir.join(&name).display()
            );
        }
        let Some(dist) = name.strip_suffix(".dist-info") else {
            continue;
        };
        if !e.path().join("WHEEL").is_file() {
            bail!("{} has no WHEEL file: not installed from a wheel", name);
        }
        found.push(dist.replacen('-', "==", 1));
    }
    found.sort();
    Ok(found)
}

pub fn remove_all(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    #[test]
    fn targets_name_every_manylinux_tag_of_their_glibc() {
        let t = Target {
            python_version: "3.11".into(),
            arch: "x86_64".into(),
            glibc_minor: 36,
        };
        assert_eq!(t.abi(), "cp311");
        let p = t.platforms();
        assert_eq!(p.first().unwrap(), "manylinux_2_36_x86_64");
        assert!(p.contains(&"manylinux_2_17_x86_64".to_owned()));
        assert!(p.contains(&"manylinux_2_5_x86_64".to_owned()));
        assert!(!p.iter().any(|t| t.contains("2_37")));
        assert_eq!(
            &p[p.len() - 3..],
            [
                "manylinux2014_x86_64",
                "manylinux2010_x86_64",
                "manylinux1_x86_64"
            ]
        );
        let old = Target {
            glibc_minor: 12,
            ..t.clone()
        };
        assert!(!old.platforms().iter().any(|t| t.contains("2014")));
        let args = t.pip_args();
        assert!(args.contains(&"--only-binary=:all:".to_owned()));
        assert!(args.windows(2).any(|w| w == ["--abi", "cp311"]));
        assert_eq!(parse_glibc("2.36"), Some(36));
        assert_eq!(parse_glibc("2.39.9000"), Some(39));
        assert_eq!(parse_glibc("3.1"), None);
        let host = Target::for_rootfs("3.11").unwrap();
        assert!(host.glibc_minor >= 17, "{host:?}");
    }

    #[test]
    fn only_wheel_installs_pass_the_check() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("a-1.0.dist-info")).unwrap();
        fs::write(t.path().join("a-1.0.dist-info/WHEEL"), "").unwrap();
        fs::create_dir_all(t.path().join("a")).unwrap();
        assert_eq!(check_all_wheels(t.path()).unwrap(), ["a==1.0"]);
        fs::create_dir_all(t.path().join("b-2.dist-info")).unwrap();
        let err = check_all_wheels(t.path()).unwrap_err().to_string();
        assert!(err.contains("no WHEEL"), "{err}");
        fs::write(t.path().join("b-2.dist-info/WHEEL"), "").unwrap();
        fs::create_dir_all(t.path().join("c-3-py3.11.egg-info")).unwrap();
        let err = check_all_wheels(t.path()).unwrap_err().to_string();
        assert!(err.contains("not installed from a wheel"), "{err}");
    }

    /// Whether `python3 -m pip` can run here; tests that need it skip with a reason.
    pub fn have_pip() -> bool {
        let ok = Command::new("python3")
            .args(["-m", "pip", "--version"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            eprintln!("skipped: `python3 -m pip` is not available");
        }
        ok
    }

    /// A pure-Python wheel `name-version` of one module `name` whose body is `body`,
    /// written into `dir` (with Python's zipfile, which any python3 has).
    pub fn make_wheel(dir: &Path, name: &str, version: &str, body: &str) -> PathBuf {
        let script = r#"
import base64, hashlib, sys, zipfile
out, name, version, body = sys.argv[1:5]
info = f"{name}-{version}.dist-info"
files = {
    f"{name}/__init__.py": body,
    f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: codebox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for path, text in files.items():
    data = text.encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(data)}")
record.append(f"{info}/RECORD,,")
files[f"{info}/RECORD"] = "\n".join(record) + "\n"
with zipfile.ZipFile(out, "w") as z:
    for path, text in files.items():
        z.writestr(path, text)
"#;
        let path = dir.join(format!("{name}-{version}-py3-none-any.whl"));
        let status = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&path)
            .args([name, version, body])
            .status()
            .unwrap();
        assert!(status.success());
        path
    }

    fn local_index(dir: &Path) -> Vec<OsString> {
        vec![
            "--no-index".into(),
            "--find-links".into(),
            dir.as_os_str().to_owned(),
        ]
    }

    fn target() -> Target {
        Target::for_rootfs("3.11").unwrap()
    }

    #[test]
    fn wheels_install_once_and_are_reused() {
        if !have_pip() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let index = t.path().join("index");
        fs::create_dir_all(&index).unwrap();
        make_wheel(&index, "tinypkg", "1.0", "VALUE = 42\n");
        let build = t.path().join("build");
        let reqs = vec!["tinypkg==1.0".to_owned()];
        let s = stage(&build, "pkgs", &reqs, &target(), &local_index(&index)).unwrap();
        assert!(s.installed);
        assert_eq!(
            fs::read_to_string(s.dir.join("tinypkg/__init__.py")).unwrap(),
            "VALUE = 42\n"
        );
        assert_eq!(check_all_wheels(&s.dir).unwrap(), ["tinypkg==1.0"]);
        // Nothing byte-compiled by the host's pip.
        assert!(!s.dir.join("tinypkg/__pycache__").exists());
        let again = stage(&build, "pkgs", &reqs, &target(), &local_index(&index)).unwrap();
        assert!(!again.installed);
        // Another requirement list installs again, from scratch.
        let none = stage(&build, "pkgs", &[], &target(), &local_index(&index)).unwrap();
        assert!(!none.installed && !none.dir.join("tinypkg").exists());
    }

    #[test]
    fn source_distributions_never_run() {
        if !have_pip() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let index = t.path().join("index");
        let marker = t.path().join("setup-py-ran");
        // An sdist whose setup.py would leave a marker if anything ran it.
        let src = t.path().join("evil-1.0");
        fs::create_dir_all(&src).unwrap();
        fs::write(
            src.join("setup.py"),
            format!(
                "open({:?}, 'w').write('ran')\nfrom setuptools import setup\nsetup(name='evil', version='1.0')\n",
                marker.to_str().unwrap()
            ),
        )
        .unwrap();
        fs::write(
            src.join("PKG-INFO"),
            "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
        )
        .unwrap();
        fs::create_dir_all(&index).unwrap();
        let status = Command::new("tar")
            .arg("-czf")
            .arg(index.join("evil-1.0.tar.gz"))
            .arg("-C")
            .arg(t.path())
            .arg("evil-1.0")
            .status()
            .unwrap();
        assert!(status.success());
        let build = t.path().join("build");
        let err = stage(
            &build,
            "pkgs",
            &["evil==1.0".to_owned()],
            &target(),
            &local_index(&index),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("evil"), "{err}");
        assert!(!marker.exists(), "pip ran the sdist's setup.py");
        assert!(!build.join("pkgs").exists());
    }
}
