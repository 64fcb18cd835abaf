//! `codebox audit verify`: exit 0 for an intact chain, 1 naming the first broken record,
//! 2 for a file it cannot read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use codebox::audit::{AuditConfig, AuditEvent, AuditLog, ToolCallRecord};

fn verify(files: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_codebox"))
        .args(["audit", "verify"])
        .args(files)
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A log of `n` tool calls, rotated every `max_bytes`.
fn write_log(dir: &Path, n: u64, max_bytes: u64) -> PathBuf {
    let mut config = AuditConfig::new(dir.join("audit.jsonl"));
    config.max_bytes = max_bytes;
    let log = AuditLog::open(config).unwrap();
    for i in 1..=n {
        log.append(AuditEvent::ToolCall(ToolCallRecord {
            client: format!("client-{i}"),
            session: None,
            name: "time__now".into(),
            ok: true,
            duration_ms: 2.0,
            bytes_in: 10,
            bytes_out: 20,
            error_kind: None,
        }))
        .unwrap();
    }
    dir.join("audit.jsonl")
}

#[test]
fn an_intact_log_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), 5, 1 << 20);
    let out = verify(&[&path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("ok: 5 records (seq 1..5), chain intact\n"),
        "{stdout}"
    );
}

#[test]
fn a_tampered_log_names_the_broken_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), 5, 1 << 20);
    let tampered = std::fs::read_to_string(&path)
        .unwrap()
        .replace("client-2", "client-X");
    std::fs::write(&path, tampered).unwrap();
    let out = verify(&[&path]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(
            "broken: record at line 3 (seq 3): prev does not match the sha256 of line 2"
        ),
        "{stderr}"
    );
}

#[test]
fn a_missing_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let out = verify(&[&missing]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("codebox: cannot read audit log") && stderr.contains("missing.jsonl"),
        "{stderr}"
    );
}

#[test]
fn rotated_files_verify_together_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_log(dir.path(), 12, 800);
    let rotated = |n: u32| dir.path().join(format!("audit.jsonl.{n}"));
    let (older, old) = (rotated(2), rotated(1));
    assert!(older.exists(), "the log rotated at least twice");

    let out = verify(&[&path]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("note: continues a rotated file"));

    let out = verify(&[&older, &old, &path]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("continues"));

    let out = verify(&[&old, &older, &path]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("record at line 1")
            && text(&out.stderr).contains("does not continue"),
        "{}",
        text(&out.stderr)
    );
}
