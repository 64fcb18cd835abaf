//! Pieces shared by `bench-compare` and `bench-throughput`: a `codebox serve` started for
//! a run, MCP clients over stdio and streamable HTTP, latency statistics, and the
//! resource snapshot of the leak check.

pub mod http;
pub mod leaks;
pub mod mcp;
pub mod mcp_http;
pub mod mcp_stdio;
pub mod server;
pub mod stats;

use std::path::PathBuf;
use std::process::ExitStatus;

use anyhow::Result;

/// The two languages codebox runs, as the MCP tools name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    Python,
    TypeScript,
}

impl Lang {
    pub fn parse(s: &str) -> Option<Lang> {
        match s {
            "python" => Some(Lang::Python),
            "typescript" => Some(Lang::TypeScript),
            _ => None,
        }
    }

    pub fn tool(self) -> &'static str {
        match self {
            Lang::Python => "execute_python",
            Lang::TypeScript => "execute_typescript",
        }
    }

    /// A program that prints `1` and a newline.
    pub fn print_one(self) -> &'static str {
        match self {
            Lang::Python => "print(1)",
            Lang::TypeScript => "console.log(1)",
        }
    }

    /// Its name, also its key in `health`'s `pool.languages`.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::TypeScript => "typescript",
        }
    }
}

/// The release binary and the rootfs, built unless `build` is false (then they must exist).
pub fn prepare(build: bool) -> Result<(PathBuf, PathBuf)> {
    let root = crate::test::workspace_root();
    if build {
        crate::rootfs::run(&[])?;
        crate::test::run_checked(
            &mut crate::test::cargo_command(&root, &["build", "--release", "--package", "codebox"]),
            "cargo build --release",
        )?;
    }
    let codebox = root.join("target/release/codebox");
    let rootfs = root.join("target/rootfs");
    for p in [&codebox, &rootfs] {
        if !p.exists() {
            anyhow::bail!("{} is missing: run without --no-build", p.display());
        }
    }
    Ok((codebox, rootfs))
}

/// When codebox refused its command line (clap's usage error: status 2 and an "unexpected
/// argument" or "unrecognized subcommand"), the first line of its complaint: the feature
/// is not in this build yet.
pub fn usage_error(status: ExitStatus, stderr: &str) -> Option<String> {
    let clap_says = ["unexpected argument", "unrecognized subcommand"];
    if status.code() != Some(2) || !clap_says.iter().any(|s| stderr.contains(s)) {
        return None;
    }
    stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    #[test]
    fn clap_usage_errors_are_recognised() {
        let two = ExitStatus::from_raw(2 << 8);
        let clap = "error: unrecognized subcommand 'exec'\n\nUsage: codebox [OPTIONS] <COMMAND>\n";
        assert_eq!(
            usage_error(two, clap).as_deref(),
            Some("error: unrecognized subcommand 'exec'")
        );
        assert_eq!(usage_error(ExitStatus::from_raw(125 << 8), clap), None);
        assert_eq!(usage_error(two, "python3: can't open file"), None);
    }
}
