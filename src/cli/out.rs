//! What the CLI writes to stdout. A reader that goes away early (`codebox tools tokens
//! --json | head -1`) closes the pipe; Rust ignores SIGPIPE, so the write fails with
//! `EPIPE` and `println!` would panic. Every stdout write of the CLI goes through
//! [`write`] instead, which turns `EPIPE` into [`StdoutClosed`]; `main` ends quietly on
//! it with the status a shell reports for a process killed by SIGPIPE.
//!
//! SIGPIPE itself stays ignored: `serve` and `tools` write to pipes and sockets of
//! upstream servers and clients, where a vanished peer must be an error, not death.

use std::io::Write;

/// Exit status after stdout was closed: 128 + SIGPIPE, as a shell shows for `yes | head`.
pub const EXIT_STDOUT_CLOSED: u8 = 128 + libc::SIGPIPE as u8;

/// The reader of our stdout went away: not a failure of codebox.
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed by its reader")]
pub struct StdoutClosed;

/// Writes `args` to stdout and flushes.
pub fn write(args: std::fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(e) => Err(anyhow::Error::new(e).context("cannot write to stdout")),
    }
}

/// Whether `err` means only that stdout was closed.
pub fn is_stdout_closed(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<StdoutClosed>())
}

/// `println!` that returns an error instead of panicking (see the module docs).
macro_rules! outln {
    () => {
        $crate::cli::out::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::cli::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;
