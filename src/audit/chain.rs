//! The hash chain: what links one line to the next, and checking a whole file.
//!
//! Every line is one JSON object with `seq` and `prev`; `prev` is the lower-case hex
//! SHA-256 of the previous line's exact bytes (without its newline), and [`GENESIS`] for
//! the very first record. `seq` counts records from 1 and goes on across rotated files, so
//! a file's first record either is the genesis (`seq` 1) or continues the file rotated
//! before it (`seq` > 1, `prev` the hash of that file's last line).
//!
//! A changed, deleted, inserted or reordered line breaks a `seq` step or a `prev` link;
//! [`verify`] reports the first line where that shows. A change to the *last* line of the
//! newest file breaks no link: compare [`VerifySummary::last_hash`] with a copy kept
//! elsewhere (the running server reports it in [`super::AuditStatus::last_hash`]).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::rootfs::manifest::hex;

/// `prev` of the first record ever written: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The link to a line: lower-case hex SHA-256 of its bytes without the newline.
pub fn line_hash(line: &[u8]) -> String {
    hex(&Sha256::digest(line))
}

/// The chain fields of a line; the event fields are not looked at.
#[derive(Debug, Deserialize)]
pub(super) struct Header {
    pub seq: u64,
    pub prev: String,
}

/// Parses the chain fields of one line (without its newline).
pub(super) fn parse_header(line: &[u8]) -> Result<Header, String> {
    let h: Header =
        serde_json::from_slice(line).map_err(|e| format!("not a JSON audit record: {e}"))?;
    if h.seq == 0 {
        return Err("seq is 0 (records count from 1)".into());
    }
    let is_hash = h.prev.len() == 64
        && h.prev
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !is_hash {
        return Err(format!("prev {:?} is not a lower-case hex SHA-256", h.prev));
    }
    Ok(h)
}

/// An intact log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifySummary {
    /// Records in the file (0 for an empty file).
    pub records: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// The first record's `prev` is not [`GENESIS`]: the file follows a rotated one,
    /// whose last line hashes to [`VerifySummary::first_prev`].
    pub continues_rotated_file: bool,
    /// The first record's `prev` ([`GENESIS`] for an empty file).
    pub first_prev: String,
    /// [`line_hash`] of the last line ([`GENESIS`] for an empty file): what the next
    /// record's `prev` must be, and the anchor to compare with a copy kept elsewhere.
    pub last_hash: String,
}

/// Why a log file did not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("cannot read audit log {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The first record that breaks the chain.
    #[error("record at line {line} ({}): {reason}", seq_label(*.seq))]
    Broken {
        /// 1-based line number.
        line: u64,
        /// The record's `seq`, when the line has one.
        seq: Option<u64>,
        reason: String,
    },
}

fn seq_label(seq: Option<u64>) -> String {
    match seq {
        Some(s) => format!("seq {s}"),
        None => "seq unknown".into(),
    }
}

/// Checks one log file's chain: every line a JSON record with `seq` and `prev`, `seq`
/// going up by exactly 1, `prev` the hash of the line before, the first line either the
/// genesis (`seq` 1) or a continuation (`seq` > 1), and a newline after the last line.
pub fn verify(path: &Path) -> Result<VerifySummary, VerifyError> {
    let read_err = |source| VerifyError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(read_err)?);
    let mut summary = VerifySummary {
        records: 0,
        first_seq: 0,
        last_seq: 0,
        continues_rotated_file: false,
        first_prev: GENESIS.into(),
        last_hash: GENESIS.into(),
    };
    let mut buf = Vec::new();
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf).map_err(read_err)? == 0 {
            return Ok(summary);
        }
        let line_no = summary.records + 1;
        let broken = |seq, reason: String| VerifyError::Broken {
            line: line_no,
            seq,
            reason,
        };
        let Some(line) = buf.strip_suffix(b"\n") else {
            let seq = parse_header(&buf).ok().map(|h| h.seq);
            return Err(broken(
                seq,
                "the last line is incomplete (no trailing newline): a write was cut short or the file was truncated".into(),
            ));
        };
        let h = parse_header(line).map_err(|reason| broken(None, reason))?;
        check_link(&summary, &h).map_err(|reason| broken(Some(h.seq), reason))?;
        if summary.records == 0 {
            summary.first_seq = h.seq;
            summary.continues_rotated_file = h.prev != GENESIS;
            summary.first_prev = h.prev;
        }
        summary.records += 1;
        summary.last_seq = h.seq;
        summary.last_hash = line_hash(line);
    }
}

/// Checks that `h` may follow the records summarised so far.
fn check_link(so_far: &VerifySummary, h: &Header) -> Result<(), String> {
    if so_far.records == 0 {
        return match (h.prev == GENESIS, h.seq) {
            (true, 1) | (false, 2..) => Ok(()),
            (true, s) => Err(format!(
                "the genesis record (prev of zeros) has seq {s}, not 1"
            )),
            (false, _) => Err("seq 1 must have the genesis prev (64 zeros)".into()),
        };
    }
    let expected = so_far.last_seq + 1;
    if h.seq != expected {
        return Err(format!(
            "seq {} where {expected} was expected: a record was deleted, inserted or moved",
            h.seq
        ));
    }
    if h.prev != so_far.last_hash {
        return Err(format!(
            "prev does not match the sha256 of line {}: that line or this record was changed",
            so_far.records
        ));
    }
    Ok(())
}
