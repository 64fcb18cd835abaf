//! The `codebox` command line.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(args.verbose);
    match cli::dispatch(args) {
        Ok(code) => code,
        Err(e) => {
            // One line: the problem, its causes, and the fix where there is one.
            eprintln!("codebox: {e:#}");
            ExitCode::from(cli::EXIT_CODEBOX_FAILED)
        }
    }
}
