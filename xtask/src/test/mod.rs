//! `cargo xtask test`: everything CI runs, in order, failing fast.
//!
//! 1. host packages the build needs (root only: apt-get)
//! 2. the rootfs (`cargo xtask rootfs`)
//! 3. `cargo fmt --check` and `cargo clippy --all-targets -- -D warnings`, then the
//!    Kubernetes manifests and the balancer config (`kubernetes.rs`, about 10 s)
//! 4. the microVM guest of the test build (`cargo xtask guest`), then `cargo test
//!    --workspace` as the current user, strict (no feature may be skipped); then the
//!    instruction budgets of the hot paths under callgrind (`instructions.rs`)
//! 5. the MCP conformance suite against `codebox serve --http`, with its baseline
//! 6. as root: the integration tests again as an unprivileged user (rootless mode)
//! 7. the release (`release.rs`): `cargo xtask dist` of the debug binary, the tarball
//!    unpacked and run with an empty environment (root and rootless), the .deb unpacked
//!    and run, the OCI image checked by skopeo, umoci and runc
//! 8. the leak check: no sandbox process, cgroup or temporary file is left from 4–7
//! 9. `cargo build --benches` (test profile), so the benches keep compiling and linking
//! 10. the fuzz targets (`cargo xtask fuzz`): the oracles' unit tests, seeds and
//!     regression inputs replayed, then
//!     each target under AFL++ for `CODEBOX_FUZZ_SECONDS` (default 20); a crash fails

mod conformance;
pub mod delegate;
pub(crate) mod host;
mod kubernetes;
mod leaks;
mod release;
mod rootless;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

const HELP: &str = "\
cargo xtask test [--no-lint] [--no-rootless] [--no-release] [--rootless-only NAME]
                 [--release-only]

Runs everything CI runs: host packages (as root), the rootfs, fmt and clippy, the whole
test suite, the integration tests again as an unprivileged user (when run as root), and
`cargo build --benches`.

  --no-lint             skip cargo fmt --check and cargo clippy
  --no-rootless         skip the unprivileged-user pass
  --no-release          skip the release step (dist tarball, .deb, OCI image)
  --release-only        only host packages and the release step, with the rootfs as it
                        is ($CODEBOX_ROOTFS, else target/rootfs; not rebuilt)
  --rootless-only NAME  as root: only the unprivileged-user pass, of the integration-test
                        binaries whose name contains NAME (for working on one of them);
                        NAME::TEST runs only the tests of NAME whose names contain TEST
";

pub fn run(args: &[OsString]) -> Result<()> {
    let mut lint = true;
    let mut rootless = true;
    let mut release = true;
    let mut release_only = false;
    let mut rootless_only: Option<String> = None;
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--no-lint") => lint = false,
            Some("--no-rootless") => rootless = false,
            Some("--no-release") => release = false,
            Some("--release-only") => release_only = true,
            Some("--rootless-only") => {
                let name = args.next().and_then(|n| n.to_str()).context(
                    "--rootless-only needs the name (or part of it) of an integration-test binary",
                )?;
                rootless_only = Some(name.to_string());
            }
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(());
            }
            _ => bail!("unknown option {a:?}; see `cargo xtask test --help`"),
        }
    }
    let started = Instant::now();
    let root = workspace_root();
    let is_root = is_root();
    without_incremental_builds();

    step("host packages");
    host::ensure_packages(is_root)?;

    if release_only {
        step("release: dist tarball, .deb and OCI image, unpacked and run with env -i");
        let before = leaks::Snapshot::take();
        release::run(&root, is_root)?;
        step("leak check");
        before.check_nothing_left()?;
        println!(
            "\nxtask test --release-only: passed in {:.0?}",
            started.elapsed()
        );
        return Ok(());
    }

    step("rootfs");
    crate::rootfs::run(&[])?;
    let rootfs = root.join("target/rootfs");

    step("Python MCP SDK (test client)");
    let pydeps = host::ensure_mcp_sdk(&root)?;

    step("upstream MCP servers (test fixtures)");
    let upstreams = host::ensure_upstream_servers(&root)?;

    if let Some(name) = rootless_only {
        if !is_root {
            bail!("--rootless-only runs tests as another user: run it as root");
        }
        step(&format!(
            "integration tests matching {name:?} as an unprivileged user"
        ));
        // A zygote run (`CODEBOX_TEST_ZYGOTE=1`) is passed on to the unprivileged user.
        let zygote: &[(&str, &str)] = match std::env::var("CODEBOX_TEST_ZYGOTE") {
            Ok(v) if v == "1" => &[("CODEBOX_TEST_ZYGOTE", "1")],
            _ => &[],
        };
        let (binary, tests) = match name.split_once("::") {
            Some((binary, tests)) => (binary.to_string(), Some(tests.to_string())),
            None => (name.clone(), None),
        };
        let mut env: Vec<(&str, &str)> = zygote.to_vec();
        if let Some(tests) = &tests {
            env.push((rootless::TEST_FILTER, tests));
        }
        return rootless::run(&root, &rootfs, &pydeps, &upstreams, Some(&binary), &env);
    }

    if lint {
        step("cargo fmt --check");
        cargo(&root, &["fmt", "--all", "--check"])?;
        step("cargo clippy");
        cargo(
            &root,
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        )?;
        step("cargo fmt --check and cargo clippy of fuzz/ (its own workspace)");
        let fuzz_manifest = root.join("fuzz/Cargo.toml");
        let fuzz_manifest = fuzz_manifest.to_str().context("a UTF-8 path")?;
        cargo(
            &root,
            &["fmt", "--manifest-path", fuzz_manifest, "--all", "--check"],
        )?;
        cargo(
            &root,
            &[
                "clippy",
                "--manifest-path",
                fuzz_manifest,
                "--locked",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        )?;
    }

    step("Kubernetes manifests and the balancer config");
    kubernetes::run(&root)?;

    step("the book: configuration reference current, built, every internal link checked");
    crate::docs::build(&root, true)?;

    let before_tests = leaks::Snapshot::take();

    // tests/microvm.rs boots the guest whose init is the codebox binary of this very
    // build (the host refuses another): build the tests first, then the guest from it.
    step("microVM guest of the test build (cargo xtask guest)");
    cargo(&root, &["test", "--workspace", "--no-run"])?;
    crate::guest::run(&[])?;

    step("cargo test (as the current user)");
    let mut test = cargo_command(&root, &["test", "--workspace"]);
    test.env("CODEBOX_TEST_STRICT", "1")
        .env("CODEBOX_ROOTFS", &rootfs)
        .env("CODEBOX_TEST_PYDEPS", &pydeps)
        .env("CODEBOX_TEST_UPSTREAMS", &upstreams);
    run_checked(&mut test, "cargo test")?;

    step("instruction budgets of the hot paths (callgrind)");
    // Strict: a harness that cannot run here fails the step, as a test would.
    crate::instructions::check(&root, &rootfs, &[], false, true)?;

    step("escape and isolation suites on sandboxes forked from the Python zygote");
    let mut forked = cargo_command(&root, &["test", "--test", "escapes", "--test", "isolation"]);
    forked
        .env("CODEBOX_TEST_STRICT", "1")
        .env("CODEBOX_TEST_ZYGOTE", "1")
        .env("CODEBOX_ROOTFS", &rootfs)
        .env("CODEBOX_TEST_PYDEPS", &pydeps)
        .env("CODEBOX_TEST_UPSTREAMS", &upstreams);
    run_checked(&mut forked, "cargo test (zygote)")?;

    step("MCP conformance suite");
    conformance::run(&root, &root.join("target/debug/codebox"), &rootfs)?;

    if rootless && is_root {
        step("integration tests as an unprivileged user");
        rootless::run(&root, &rootfs, &pydeps, &upstreams, None, &[])?;
        step("escape and isolation suites on zygote-born sandboxes, unprivileged");
        for suite in ["escapes", "isolation"] {
            let zygote = [("CODEBOX_TEST_ZYGOTE", "1")];
            rootless::run(&root, &rootfs, &pydeps, &upstreams, Some(suite), &zygote)?;
        }
    } else if rootless {
        println!("(already unprivileged: the run above was the rootless pass)");
    }

    if release {
        step("release: dist tarball, .deb and OCI image, unpacked and run with env -i");
        release::run(&root, is_root)?;
    }

    step("leak check");
    before_tests.check_nothing_left()?;

    // The benches build and link in the test profile, on the artifacts `cargo test` built
    // (`cargo bench --no-run` compiled everything again optimised: 10 of CI's 60 minutes;
    // `cargo xtask bench-*` and `cargo bench` build them optimised when they are run).
    step("the benches build (cargo build --benches)");
    cargo(&root, &["build", "--workspace", "--benches"])?;

    step("fuzz targets: seeds and regressions, then a short bounded run of each");
    let seconds = match std::env::var("CODEBOX_FUZZ_SECONDS") {
        Ok(v) => v
            .parse()
            .context("CODEBOX_FUZZ_SECONDS must be a whole number of seconds")?,
        Err(_) => 20,
    };
    // The oracles' own tests (the targets' seeds replay through the binaries below).
    let fuzz_manifest = root.join("fuzz/Cargo.toml");
    let fuzz_manifest = fuzz_manifest.to_str().context("a UTF-8 path")?;
    cargo(
        &root,
        &[
            "test",
            "--manifest-path",
            fuzz_manifest,
            "--locked",
            "-p",
            "codebox-fuzz-oracles",
        ],
    )?;
    let targets: Vec<String> = crate::fuzz::TARGETS.iter().map(|t| t.to_string()).collect();
    let options = crate::fuzz::Options {
        seconds: Some(seconds),
        execs: None,
        resume: false,
        build: true,
        replay_only: false,
        jobs: 1,
        // A short smoke run: the instrumented build was most of this step (11.7 min at
        // opt-level 3 on 2 cores, 8.5 at 1, 3.5 at 0). At 0 each input runs several
        // times slower, which 20 s of fuzzing per target can afford: the seeds and
        // regressions replay all the same, and long campaigns (`cargo xtask fuzz`)
        // build at 3.
        opt_level: Some(0),
    };
    let outcomes = crate::fuzz::campaign(&root, &targets, &options)?;
    crate::fuzz::report(&outcomes);
    crate::fuzz::check(&root, &outcomes)?;

    println!(
        "\nxtask test: all steps passed in {:.0?}",
        started.elapsed()
    );
    Ok(())
}

pub fn is_root() -> bool {
    host::is_root()
}

pub use kubernetes::run_command as check_kubernetes;

/// Prints a step's heading with the time since the first step and the space left where
/// the builds go: CI's budget is per run, and its disk is not ours to size (a run ran out
/// of space building the fuzz targets), so the log says what each step cost of both.
fn step(name: &str) {
    static FIRST: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let since = FIRST
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs();
    let free = match free_bytes(&workspace_root()) {
        Some(bytes) => format!(", {:.1} GiB free", bytes as f64 / (1u64 << 30) as f64),
        None => String::new(),
    };
    println!("\n==> {name}   [+{}:{:02}{free}]", since / 60, since % 60);
}

/// Bytes an unprivileged writer may still use on the file system holding `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value for it.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a NUL-terminated string and `stat` a live, writable statvfs.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) } != 0 {
        return None;
    }
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// Turns off cargo's incremental compilation for every build this run starts, unless the
/// caller chose a setting. A whole-suite run builds each test binary once; the
/// incremental state it would keep was 2.6 GiB of the ~17 GiB a full run wrote (12 GiB
/// after a few local rebuilds), and disk is what a CI run last ran out of.
fn without_incremental_builds() {
    if std::env::var_os("CARGO_INCREMENTAL").is_none() {
        // SAFETY: called from `run` before xtask starts any thread, so no other thread
        // can be reading the environment while it changes.
        unsafe { std::env::set_var("CARGO_INCREMENTAL", "0") };
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

pub fn cargo_command(root: &Path, args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(args).current_dir(root);
    cmd
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    run_checked(
        &mut cargo_command(root, args),
        &format!("cargo {}", args.join(" ")),
    )
}

pub fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}
