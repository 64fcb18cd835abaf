//! Command-line interface: argument parsing and dispatch.

mod audit;
mod doctor;
mod egress;
mod exec;
mod install;
mod log_line;
pub mod out;
mod packages;
mod passthrough;
mod prepare;
mod run;
mod run_tools;
mod serve;
mod setup_cgroups;
mod tools;
mod upstreams;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// Exit status when codebox itself failed (as opposed to the program it ran).
pub const EXIT_CODEBOX_FAILED: u8 = 125;

/// Run Python and TypeScript in throw-away Linux sandboxes.
#[derive(Debug, Parser)]
#[command(name = "codebox", version, about)]
pub struct Cli {
    /// More logging on stderr (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a program in a fresh sandbox.
    Run(run::RunArgs),
    /// Run any program of the rootfs (an absolute path) in a fresh sandbox with the layers
    /// and limits of `run`: `codebox exec -- /usr/bin/python3 -S -c pass`.
    #[command(override_usage = "codebox exec [OPTIONS] -- PROGRAM [ARGS]...")]
    Exec(exec::ExecArgs),
    /// Serve MCP on stdio, or streamable HTTP with --http (the tools are listed in the
    /// help, from the server's own tool list).
    Serve(serve::ServeArgs),
    /// Check this host layer by layer: namespaces, cgroups, seccomp, landlock, rootfs, runtimes.
    Doctor(doctor::DoctorArgs),
    /// Inspect the upstream tools: `tools tokens` measures what their definitions cost a
    /// model's context against codebox's own.
    Tools(tools::ToolsArgs),
    /// The audit log: `audit verify FILE` checks its hash chain.
    Audit(audit::AuditArgs),
    /// As root, without systemd: delegate a cgroup directory in every hierarchy to a user
    /// so their codebox runs rootless with limits (v1, hybrid, v2); `--enter -- COMMAND`
    /// runs a command inside it, `--remove` undoes it.
    #[command(
        name = "setup-cgroups",
        override_usage = "codebox setup-cgroups --user USER [--name DIR] [--remove]\n       \
                          codebox setup-cgroups [--user USER] [--name DIR] --enter -- COMMAND [ARGS]..."
    )]
    SetupCgroups(setup_cgroups::SetupCgroupsArgs),
    /// Put codebox in front of an MCP client's servers: `install claude-code` moves
    /// Claude Code's servers into codebox's upstream configuration and adds the codebox
    /// entry in their place (backups first; --dry-run to see the plan).
    Install(install::InstallArgs),
    /// Undo `install`: `uninstall claude-code` puts the servers back.
    Uninstall(install::UninstallArgs),
    /// The microVM guest's init (pid 1 inside the VM); never run by hand.
    #[command(name = "guest-init", hide = true)]
    GuestInit,
}

/// Parses the command line. Help names `serve`'s tools from the server's tool router,
/// so the list cannot go stale; it is built only when help is asked for.
pub fn parse() -> Cli {
    let wants_help = std::env::args_os()
        .skip(1)
        .any(|a| a == "-h" || a == "--help" || a == "help");
    if !wants_help {
        return Cli::parse();
    }
    let cmd = Cli::command().mut_subcommand("serve", |c| c.about(serve_about()));
    let matches = cmd.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `serve`'s one-line help: the transports and every tool it serves.
pub fn serve_about() -> String {
    let tools: Vec<String> = codebox::server::CodeboxServer::tool_definitions()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    format!(
        "Serve MCP on stdio, or streamable HTTP with --http; tools: {}",
        tools.join(", ")
    )
}

pub fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Exec(args) => exec::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Tools(args) => tools::run(args),
        Command::Audit(args) => audit::run(args),
        Command::SetupCgroups(args) => setup_cgroups::run(args),
        Command::Install(args) => install::install(args),
        Command::Uninstall(args) => install::uninstall(args),
        Command::GuestInit => codebox::microvm::guest::run(),
    }
}

/// Logs go to stderr; `RUST_LOG` overrides the level chosen with `-v`.
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| log_line::BoundedStderr)
        .without_time()
        .init();
}
