//! `codebox audit verify FILE...`: checks the hash chain of audit log files (see
//! `codebox::audit::chain`).
//!
//! Exit status: 0 intact, 1 broken (the first broken record on stderr), 2 a file could not
//! be read.

use super::out::outln;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};

use codebox::audit::{self, VerifyError, VerifySummary};

/// A chain is broken.
const EXIT_BROKEN: u8 = 1;
/// A file could not be read.
const EXIT_UNREADABLE: u8 = 2;

#[derive(Debug, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: AuditCommand,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Check the hash chain of audit log files. Give rotated files oldest first
    /// (audit.jsonl.2 audit.jsonl.1 audit.jsonl) to check the links between them too.
    Verify(VerifyArgs),
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        AuditCommand::Verify(args) => verify(&args.files),
    }
}

fn verify(files: &[PathBuf]) -> anyhow::Result<ExitCode> {
    // File names are printed only when there are several.
    let label = |p: &Path| {
        if files.len() > 1 {
            format!("{}: ", p.display())
        } else {
            String::new()
        }
    };
    // The last non-empty file so far: the next one must continue it.
    let mut before: Option<(&Path, VerifySummary)> = None;
    for path in files {
        let summary = match audit::verify(path) {
            Ok(s) => s,
            Err(err @ VerifyError::Read { .. }) => {
                eprintln!("codebox: {:#}", anyhow::Error::from(err));
                return Ok(ExitCode::from(EXIT_UNREADABLE));
            }
            Err(err) => {
                eprintln!("broken: {}{err}", label(path));
                return Ok(ExitCode::from(EXIT_BROKEN));
            }
        };
        if summary.records == 0 {
            outln!("{}ok: 0 records, empty log", label(path))?;
            continue;
        }
        let linked = match &before {
            Some((old_path, old)) => {
                if let Err(reason) = continues(old, &summary) {
                    eprintln!(
                        "broken: {}record at line 1 (seq {}): does not continue {}: {reason}",
                        label(path),
                        summary.first_seq,
                        old_path.display()
                    );
                    return Ok(ExitCode::from(EXIT_BROKEN));
                }
                Some(*old_path)
            }
            None => None,
        };
        outln!(
            "{}ok: {} records (seq {}..{}), chain intact",
            label(path),
            summary.records,
            summary.first_seq,
            summary.last_seq
        )?;
        match linked {
            Some(old) => outln!("  continues {}", old.display())?,
            None if summary.continues_rotated_file => outln!(
                "  note: continues a rotated file whose last line has sha256 {} \
                 (verify them together, oldest first, to check that link)",
                summary.first_prev
            )?,
            None => {}
        }
        outln!("  last record sha256 {}", summary.last_hash)?;
        before = Some((path, summary));
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `next` takes the chain on where `old` ends.
fn continues(old: &VerifySummary, next: &VerifySummary) -> Result<(), String> {
    if next.first_seq != old.last_seq + 1 {
        return Err(format!(
            "seq {} where {} was expected",
            next.first_seq,
            old.last_seq + 1
        ));
    }
    if next.first_prev != old.last_hash {
        return Err("prev is not the sha256 of that file's last line".into());
    }
    Ok(())
}
