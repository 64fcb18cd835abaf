//! The `codebox` command line.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::parse();
    cli::init_logging(args.verbose);
    match cli::dispatch(args) {
        Ok(code) => code,
        // The reader of our output went away (`... | head -1`): nothing to report.
        Err(e) if cli::out::is_stdout_closed(&e) => ExitCode::from(cli::out::EXIT_STDOUT_CLOSED),
        Err(e) => {
            // One line: the problem, its causes, and the fix where there is one.
            eprintln!("codebox: {e:#}");
            ExitCode::from(cli::EXIT_CODEBOX_FAILED)
        }
    }
}
