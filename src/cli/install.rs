//! `codebox install claude-code` and `codebox uninstall claude-code`: Claude Code's MCP
//! servers move behind codebox (into codebox's upstream configuration, with the one
//! codebox entry in their place), and back. The work is `codebox::adopt`'s; this file
//! reads the command line and the environment, and prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use codebox::adopt::claude_code::{self, Launcher, Locations};
use codebox::adopt::{execute, plan};
use codebox::rootfs;

use super::out::outln;

#[derive(Debug, Args)]
pub struct InstallArgs {
    #[command(subcommand)]
    client: InstallClient,
}

#[derive(Debug, Subcommand)]
enum InstallClient {
    /// Move Claude Code's MCP servers behind codebox: a project's (.mcp.json, and your
    /// local-scope servers of it in ~/.claude.json) or, with --user, your user-scope ones;
    /// each changed file is backed up first.
    ClaudeCode(InstallClaudeCode),
}

#[derive(Debug, Args)]
struct InstallClaudeCode {
    #[command(flatten)]
    scope: ScopeArgs,
    /// The rootfs the codebox entry serves with [default: where `codebox serve` finds it].
    #[arg(long, value_name = "DIR")]
    rootfs: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct UninstallArgs {
    #[command(subcommand)]
    client: UninstallClient,
}

#[derive(Debug, Subcommand)]
enum UninstallClient {
    /// Put the servers codebox took from Claude Code back, remove the codebox entry and
    /// codebox's copy; each changed file is backed up first.
    ClaudeCode(UninstallClaudeCode),
}

#[derive(Debug, Args)]
struct UninstallClaudeCode {
    #[command(flatten)]
    scope: ScopeArgs,
}

#[derive(Debug, Args)]
struct ScopeArgs {
    /// The project: its .mcp.json (project scope) and your local-scope servers of it in
    /// ~/.claude.json [default: the current directory].
    #[arg(long, value_name = "DIR", conflicts_with = "user")]
    project: Option<PathBuf>,
    /// Your user-scope servers (`mcpServers` at the top of ~/.claude.json) instead.
    #[arg(long)]
    user: bool,
    /// Print what would change, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn install(args: InstallArgs) -> anyhow::Result<ExitCode> {
    let InstallClient::ClaudeCode(args) = args.client;
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .context("cannot find the running codebox binary")?;
    let rootfs_dir = rootfs::locate(args.rootfs.as_deref())?;
    let rootfs_dir = std::fs::canonicalize(&rootfs_dir)
        .with_context(|| format!("cannot resolve the rootfs {}", rootfs_dir.display()))?;
    let launcher = Launcher::new(&exe, &rootfs_dir)?;
    adopt(&args.scope, plan::Action::Install(&launcher))
}

pub fn uninstall(args: UninstallArgs) -> anyhow::Result<ExitCode> {
    let UninstallClient::ClaudeCode(args) = args.client;
    adopt(&args.scope, plan::Action::Uninstall)
}

/// Reads, plans, prints the plan, carries it out (or not, on a dry run), prints the backups.
fn adopt(scope: &ScopeArgs, action: plan::Action<'_>) -> anyhow::Result<ExitCode> {
    let at = locations(scope)?;
    let snapshot = execute::read(&plan::files_to_read(&at, scope.user))?;
    let plan = plan::plan(&plan::Inputs {
        action,
        at: &at,
        user: scope.user,
        snapshot: &snapshot,
        is_me: &claude_code::runs_this_binary,
    })?;
    let (verb, other, undoes) = match action {
        plan::Action::Install(_) => ("install", "uninstall", "undoes it"),
        plan::Action::Uninstall => ("uninstall", "install", "installs again"),
    };
    let (what, flag) = match scope.user {
        true => ("user scope".to_string(), " --user".to_string()),
        false => (
            format!("project {}", at.project_dir.display()),
            format!(" --project {}", at.project_dir.display()),
        ),
    };
    if plan.nothing_to_do() {
        outln!("codebox {verb} claude-code ({what}): nothing to do")?;
        return Ok(ExitCode::SUCCESS);
    }
    let dry = if scope.dry_run { ", dry run" } else { "" };
    outln!("codebox {verb} claude-code ({what}{dry}):")?;
    for line in plan.describe() {
        outln!("  {line}")?;
    }
    let mut said = Vec::new();
    let done = execute::execute(&plan, scope.dry_run, &execute::stamp(), &mut |l| {
        said.push(l)
    });
    // What was backed up is worth knowing even when a later step failed.
    for line in &said {
        outln!("  {line}")?;
    }
    done?;
    if scope.dry_run {
        outln!("dry run: nothing was changed")?;
    } else {
        outln!(
            "done; restart Claude Code (or reconnect with /mcp) to pick it up; `codebox {other} claude-code{flag}` {undoes}"
        )?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The files of the chosen scope, from `$HOME`, `$XDG_CONFIG_HOME` and the project
/// directory (canonical: Claude Code keys `projects` by the real path).
fn locations(scope: &ScopeArgs) -> anyhow::Result<Locations> {
    let home = match std::env::var_os("HOME") {
        Some(h) if Path::new(&h).is_absolute() => PathBuf::from(h),
        _ => bail!("HOME is not set to an absolute path: cannot find ~/.claude.json"),
    };
    if let Some(dir) = std::env::var_os("CLAUDE_CONFIG_DIR") {
        // Where Claude Code keeps its files then is not settled enough to follow.
        tracing::warn!(
            CLAUDE_CONFIG_DIR = %Path::new(&dir).display(),
            "CLAUDE_CONFIG_DIR is set; codebox adopts $HOME/.claude.json all the same"
        );
    }
    let config_home = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from);
    let project = match (&scope.project, scope.user) {
        // The user scope has no project; its Locations name the root, unused.
        (_, true) => PathBuf::from("/"),
        (Some(dir), false) => dir.clone(),
        (None, false) => std::env::current_dir().context("cannot read the current directory")?,
    };
    let project = std::fs::canonicalize(&project)
        .with_context(|| format!("no project directory {}", project.display()))?;
    if !project.is_dir() {
        bail!("{} is not a directory", project.display());
    }
    Ok(Locations::new(&home, config_home.as_deref(), &project)?)
}
