//! The audit log: writing, resuming, rotating, failing, and catching tampering.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::log::{numbered, rfc3339_utc_ms};
use super::*;

fn tool_call(i: u64) -> AuditEvent {
    AuditEvent::ToolCall(ToolCallRecord {
        client: format!("client-{i}"),
        session: Some("s1".into()),
        name: "time__now".into(),
        ok: i % 3 != 0,
        duration_ms: 1.5,
        bytes_in: i,
        bytes_out: 2 * i,
        error_kind: (i % 3 == 0).then(|| "upstream".into()),
    })
}

fn execution(code: &str) -> AuditEvent {
    AuditEvent::Execution(ExecutionRecord {
        client: "test".into(),
        session: None,
        language: "python".into(),
        code_sha256: code_digest(code),
        code_bytes: code.len() as u64,
        code: Some(code.into()),
        allowed_tools: vec!["time__*".into()],
        tools_called: vec![ToolCalled {
            name: "time__now".into(),
            ok: true,
            duration_ms: 3.0,
        }],
        tools_called_omitted: 0,
        egress_allowed: 0,
        egress_denied: 0,
        egress_omitted: 0,
        exit_code: Some(0),
        signal: None,
        limits_hit: vec!["output".into()],
        duration_ms: 120.25,
        cpu_ms: Some(80.0),
        peak_memory_bytes: Some(12 << 20),
        output_bytes: 42,
        profile: "default".into(),
        rootfs_manifest_sha256: None,
        outcome: "ok".into(),
    })
}

fn config(dir: &Path) -> AuditConfig {
    AuditConfig::new(dir.join("audit.jsonl"))
}

/// A log in `dir` holding `n` tool-call records.
fn log_with(dir: &Path, n: u64) -> (AuditLog, PathBuf) {
    let log = AuditLog::open(config(dir)).unwrap();
    for i in 1..=n {
        log.append(tool_call(i)).unwrap();
    }
    (log, dir.join("audit.jsonl"))
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(
        path,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
}

/// Line number, seq and reason of the first broken record.
fn broken(path: &Path) -> (u64, Option<u64>, String) {
    match verify(path) {
        Err(VerifyError::Broken { line, seq, reason }) => (line, seq, reason),
        other => panic!("expected a broken chain, got {other:?}"),
    }
}

fn broken_at(path: &Path) -> (u64, Option<u64>) {
    let (line, seq, _) = broken(path);
    (line, seq)
}

#[test]
fn appended_records_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_with(dir.path(), 4);
    log.append(execution("print(1)")).unwrap();
    let summary = verify(&path).unwrap();
    assert_eq!(
        (summary.records, summary.first_seq, summary.last_seq),
        (5, 1, 5)
    );
    assert!(!summary.continues_rotated_file);
    assert_eq!(summary.first_prev, GENESIS);
    let status = log.status();
    assert_eq!(summary.last_hash, status.last_hash);
    assert!(status.healthy && status.last_error.is_none());
    assert_eq!(
        (status.records_written, status.failures, status.last_seq),
        (5, 0, 5)
    );

    let lines = lines(&path);
    assert!(lines[0].starts_with(r#"{"seq":1,"time":""#), "{}", lines[0]);
    assert!(lines[0].contains(&format!(
        r#""prev":"{GENESIS}","event":"tool_call","client":"client-1""#
    )));
    assert!(lines[4].contains(r#""event":"execution""#));
    for pair in lines.windows(2) {
        let next: serde_json::Value = serde_json::from_str(&pair[1]).unwrap();
        assert_eq!(next["prev"], line_hash(pair[0].as_bytes()));
    }
    // The event fields read back as they were written.
    let back: AuditEvent = serde_json::from_str(&lines[1]).unwrap();
    assert_eq!(back, tool_call(2));
    let time: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    let time = time["time"].as_str().unwrap();
    assert!(time.len() == 24 && time.ends_with('Z'), "{time}");
}

#[test]
fn times_are_rfc3339_utc_with_milliseconds() {
    let at = |secs: u64, ms: u64| {
        rfc3339_utc_ms(UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(ms))
    };
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
    assert_eq!(at(951_782_400, 500), "2000-02-29T00:00:00.500Z");
    assert_eq!(at(1_735_689_599, 999), "2024-12-31T23:59:59.999Z");
    assert_eq!(at(4_107_542_400 + 3_723, 7), "2100-03-01T01:02:03.007Z");
}

#[test]
fn any_changed_byte_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_with(dir.path(), 4);
    let anchor = log.status().last_hash;
    let original = lines(&path);
    for (i, line) in original.iter().enumerate() {
        for j in 0..line.len() {
            let mut bytes = line.clone().into_bytes();
            bytes[j] = if bytes[j] == b'7' { b'8' } else { b'7' };
            let mut tampered = original.clone();
            tampered[i] = String::from_utf8(bytes).unwrap();
            write_lines(&path, &tampered);
            let at = i as u64 + 1;
            match verify(&path) {
                // The changed line, or the next one whose prev no longer matches.
                Err(VerifyError::Broken { line, .. }) => {
                    assert!(
                        line == at || line == at + 1,
                        "byte {j} of line {at}: {line}"
                    )
                }
                // Only the last line's content can change without breaking a link; the
                // anchor kept by the writer shows it.
                Ok(s) => assert!(
                    i == original.len() - 1 && s.last_hash != anchor,
                    "byte {j} of line {at} changed unnoticed"
                ),
                Err(e) => panic!("{e}"),
            }
        }
    }
}

#[test]
fn changes_are_reported_at_the_right_line() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, path) = log_with(dir.path(), 5);
    let original = lines(&path);

    // An event field of line 2: the link from line 3 breaks.
    let mut t = original.clone();
    t[1] = t[1].replace("client-2", "client-9");
    write_lines(&path, &t);
    let (line, seq, reason) = broken(&path);
    assert_eq!((line, seq), (3, Some(3)));
    assert!(reason.contains("line 2"), "{reason}");
    let shown = verify(&path).unwrap_err().to_string();
    assert!(
        shown.starts_with("record at line 3 (seq 3): prev does not match"),
        "{shown}"
    );

    // The seq of line 2: caught on line 2 itself.
    let mut t = original.clone();
    t[1] = t[1].replacen(r#""seq":2"#, r#""seq":7"#, 1);
    write_lines(&path, &t);
    assert_eq!(broken(&path).0, 2);

    // Not JSON any more.
    let mut t = original.clone();
    t[3].truncate(10);
    write_lines(&path, &t);
    let (line, seq, reason) = broken(&path);
    assert_eq!((line, seq), (4, None));
    assert!(reason.contains("not a JSON audit record"), "{reason}");
    assert!(verify(&path)
        .unwrap_err()
        .to_string()
        .contains("(seq unknown)"));
}

#[test]
fn deleted_swapped_and_inserted_lines_are_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_with(dir.path(), 6);
    let original = lines(&path);

    let mut t = original.clone();
    t.remove(2);
    write_lines(&path, &t);
    let (line, seq, reason) = broken(&path);
    assert_eq!((line, seq), (3, Some(4)));
    assert!(reason.contains("where 3 was expected"), "{reason}");

    let mut t = original.clone();
    t.swap(1, 2);
    write_lines(&path, &t);
    assert_eq!(broken_at(&path), (2, Some(3)));

    let mut t = original.clone();
    t.insert(4, original[1].clone());
    write_lines(&path, &t);
    assert_eq!(broken_at(&path), (5, Some(2)));

    // Without its first line the file looks like the continuation of a rotated one: the
    // summary says so.
    write_lines(&path, &original[1..]);
    let s = verify(&path).unwrap();
    assert!(s.continues_rotated_file && s.first_seq == 2);

    // Without its last line the chain is intact but ends early: the anchor shows it.
    write_lines(&path, &original[..5]);
    let s = verify(&path).unwrap();
    assert_eq!(s.last_seq, 5);
    assert_ne!(s.last_hash, log.status().last_hash);
}

#[test]
fn an_incomplete_last_line_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let (_log, path) = log_with(dir.path(), 3);
    let text = std::fs::read_to_string(&path).unwrap();

    std::fs::write(&path, text.trim_end_matches('\n')).unwrap();
    let (line, seq, reason) = broken(&path);
    assert_eq!((line, seq), (3, Some(3)));
    assert!(reason.contains("incomplete"), "{reason}");

    std::fs::write(&path, &text[..text.len() - 20]).unwrap();
    let (line, seq, _) = broken(&path);
    assert_eq!((line, seq), (3, None));
}

#[test]
fn reopening_resumes_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_with(dir.path(), 3);
    let head = log.status().last_hash;
    drop(log);
    let log = AuditLog::open(config(dir.path())).unwrap();
    let status = log.status();
    assert_eq!((status.last_seq, status.records_written), (3, 0));
    assert_eq!(status.last_hash, head);
    log.append(tool_call(4)).unwrap();
    log.append(execution("x = 1")).unwrap();
    let s = verify(&path).unwrap();
    assert_eq!((s.records, s.first_seq, s.last_seq), (5, 1, 5));
    assert_eq!(s.last_hash, log.status().last_hash);
}

#[test]
fn an_incomplete_tail_is_rotated_aside_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_with(dir.path(), 3);
    let head = log.status().last_hash;
    drop(log);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(r#"{"seq":4,"ti"#);
    std::fs::write(&path, &text).unwrap();

    let log = AuditLog::open(config(dir.path())).unwrap();
    // The damaged file is kept as it is, and still shows its damage.
    assert_eq!(std::fs::read_to_string(numbered(&path, 1)).unwrap(), text);
    assert_eq!(broken(&numbered(&path, 1)).0, 4);
    log.append(tool_call(4)).unwrap();
    let s = verify(&path).unwrap();
    assert_eq!((s.records, s.first_seq), (1, 4));
    assert_eq!(s.first_prev, head);
}

#[test]
fn an_invalid_last_record_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_with(dir.path(), 2);
    drop(log);
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str("not json\n");
    std::fs::write(&path, text).unwrap();
    let err = AuditLog::open(config(dir.path())).err().unwrap();
    assert!(matches!(err, Error::Resume { .. }), "{err}");
    assert!(err.to_string().contains("codebox audit verify"), "{err}");
}

#[test]
fn rotation_keeps_the_chain_and_at_most_keep_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_bytes = 1000;
    cfg.keep = 2;
    let path = cfg.path.clone();
    // Left over from a larger `keep`: removed at the first rotation.
    std::fs::write(numbered(&path, 3), "old").unwrap();
    std::fs::write(numbered(&path, 4), "old").unwrap();
    let log = AuditLog::open(cfg.clone()).unwrap();
    for i in 1..=40 {
        log.append(tool_call(i)).unwrap();
    }
    assert!(!numbered(&path, 3).exists() && !numbered(&path, 4).exists());

    let oldest = verify(&numbered(&path, 2)).unwrap();
    let middle = verify(&numbered(&path, 1)).unwrap();
    let newest = verify(&path).unwrap();
    for (old, new) in [(&oldest, &middle), (&middle, &newest)] {
        assert!(new.continues_rotated_file);
        assert_eq!(new.first_seq, old.last_seq + 1);
        assert_eq!(new.first_prev, old.last_hash);
    }
    // The first prev of a file is the hash of the last line of the one before.
    let last_old = lines(&numbered(&path, 1)).pop().unwrap();
    assert_eq!(newest.first_prev, line_hash(last_old.as_bytes()));
    assert_eq!(newest.last_seq, 40);
    assert!(oldest.first_seq > 1, "older files were dropped");
    for p in [numbered(&path, 2), numbered(&path, 1), path.clone()] {
        assert!(
            std::fs::metadata(&p).unwrap().len() <= cfg.max_bytes,
            "{p:?}"
        );
    }

    // keep = 0: nothing but the current file.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_bytes = 1000;
    cfg.keep = 0;
    let log = AuditLog::open(cfg.clone()).unwrap();
    for i in 1..=20 {
        log.append(tool_call(i)).unwrap();
    }
    assert!(!numbered(&cfg.path, 1).exists());
    assert_eq!(verify(&cfg.path).unwrap().last_seq, 20);
}

#[test]
fn a_record_larger_than_max_bytes_gets_a_file_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_bytes = 100;
    let log = AuditLog::open(cfg.clone()).unwrap();
    for i in 1..=3 {
        log.append(tool_call(i)).unwrap();
    }
    assert_eq!(lines(&cfg.path).len(), 1);
    assert_eq!(verify(&cfg.path).unwrap().first_seq, 3);
}

#[test]
fn the_code_text_is_logged_only_when_asked() {
    let secret = "print('SECRET_CODE_TEXT_1234')";
    let dir = tempfile::tempdir().unwrap();
    let log = AuditLog::open(config(dir.path())).unwrap();
    assert!(!log.include_code());
    log.append(execution(secret)).unwrap();
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(!text.contains("SECRET_CODE_TEXT"), "{text}");
    assert!(!text.contains(r#""code":"#), "{text}");
    assert!(text.contains(&code_digest(secret)));

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.include_code = true;
    let log = AuditLog::open(cfg).unwrap();
    log.append(execution(secret)).unwrap();
    let text = std::fs::read_to_string(dir.path().join("audit.jsonl")).unwrap();
    assert!(text.contains(secret), "{text}");
}

#[test]
fn files_and_directories_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/audit.jsonl");
    AuditLog::open(AuditConfig::new(&path)).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&dir.path().join("a/b")), 0o700);
    assert_eq!(mode(&dir.path().join("a")), 0o700);
}

#[test]
fn an_unusable_path_fails_to_open() {
    let dir = tempfile::tempdir().unwrap();
    // A parent that is a file (fails for root too).
    let file = dir.path().join("file");
    std::fs::write(&file, "").unwrap();
    let err = AuditLog::open(AuditConfig::new(file.join("sub/audit.jsonl")))
        .err()
        .unwrap();
    assert!(matches!(err, Error::CreateDir { .. }), "{err}");
    // A directory where the file should be.
    let err = AuditLog::open(AuditConfig::new(dir.path())).err().unwrap();
    assert!(matches!(err, Error::Open { .. }), "{err}");
    // A read-only directory (root ignores the mode).
    if nix::unistd::geteuid().is_root() {
        eprintln!("skipping the read-only directory case: root may write anywhere");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
    let err = AuditLog::open(AuditConfig::new(ro.join("audit.jsonl")))
        .err()
        .unwrap();
    assert!(matches!(err, Error::Open { .. }), "{err}");
    let err = AuditLog::open(AuditConfig::new(ro.join("sub/audit.jsonl")))
        .err()
        .unwrap();
    assert!(matches!(err, Error::CreateDir { .. }), "{err}");
}

#[test]
fn a_full_disk_is_reported_not_fatal() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        eprintln!("skipping: this host has no /dev/full");
        return;
    }
    let log = AuditLog::open(AuditConfig::new(full)).unwrap();
    let err = log.append(tool_call(1)).unwrap_err();
    assert!(matches!(err, Error::Write { .. }), "{err}");
    let err = log.append(execution("1")).unwrap_err();
    assert!(matches!(err, Error::Write { .. }), "{err}");
    let status = log.status();
    assert!(!status.healthy);
    assert_eq!((status.failures, status.records_written), (2, 0));
    assert_eq!((status.last_seq, status.last_hash.as_str()), (0, GENESIS));
    let last_error = status.last_error.unwrap();
    assert!(last_error.contains("/dev/full"), "{last_error}");
    assert!(full.exists(), "a device file is never rotated");

    let dir = tempfile::tempdir().unwrap();
    let (good, path) = log_with(dir.path(), 2);
    assert!(good.status().healthy);
    assert_eq!(verify(&path).unwrap().records, 2);
}

#[test]
fn a_failed_append_leaves_the_chain_intact_and_the_log_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // Every record after the first rotates the file.
    cfg.max_bytes = 1;
    cfg.keep = 1;
    let path = cfg.path.clone();
    let log = AuditLog::open(cfg).unwrap();
    log.append(tool_call(1)).unwrap();
    log.append(tool_call(2)).unwrap();
    // FILE.1 is a non-empty directory: rotation cannot rename FILE onto it.
    std::fs::remove_file(numbered(&path, 1)).unwrap();
    std::fs::create_dir_all(numbered(&path, 1).join("x")).unwrap();
    let err = log.append(tool_call(3)).unwrap_err();
    assert!(matches!(err, Error::Rotate { .. }), "{err}");
    let status = log.status();
    assert!(!status.healthy && status.failures == 1);
    assert!(status.last_error.unwrap().contains("cannot rotate"));
    assert_eq!(status.last_seq, 2);

    std::fs::remove_dir_all(numbered(&path, 1)).unwrap();
    log.append(tool_call(3)).unwrap();
    let status = log.status();
    assert!(status.healthy && status.last_error.is_some());
    let old = verify(&numbered(&path, 1)).unwrap();
    let new = verify(&path).unwrap();
    assert_eq!((old.last_seq, new.first_seq), (2, 3));
    assert_eq!(new.first_prev, old.last_hash);
}

#[test]
fn concurrent_appends_make_one_chain() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.fsync = FsyncPolicy::Never;
    let log = Arc::new(AuditLog::open(cfg).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0..50 {
                    log.append(tool_call(t * 100 + i)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = verify(&dir.path().join("audit.jsonl")).unwrap();
    assert_eq!((s.records, s.last_seq), (400, 400));
    assert_eq!(log.status().records_written, 400);
}

#[test]
fn every_fsync_policy_writes() {
    for fsync in [FsyncPolicy::Always, FsyncPolicy::Rotate, FsyncPolicy::Never] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.fsync = fsync;
        cfg.max_bytes = 600;
        let log = AuditLog::open(cfg.clone()).unwrap();
        for i in 1..=10 {
            log.append(tool_call(i)).unwrap();
        }
        assert_eq!(verify(&cfg.path).unwrap().last_seq, 10, "{fsync:?}");
    }
}

#[test]
fn config_defaults_sizes_and_unknown_keys() {
    let cfg: AuditConfig = toml::from_str(r#"path = "/var/log/codebox/audit.jsonl""#).unwrap();
    assert_eq!(cfg, AuditConfig::new("/var/log/codebox/audit.jsonl"));
    assert_eq!(
        (cfg.max_bytes, cfg.keep, cfg.fsync, cfg.on_failure),
        (64 << 20, 5, FsyncPolicy::Rotate, OnFailure::Continue)
    );
    let cfg: AuditConfig = toml::from_str(
        "path = \"a\"\ninclude_code = true\nmax_bytes = \"1M\"\nkeep = 0\nfsync = \"always\"\non_failure = \"refuse\"",
    )
    .unwrap();
    assert_eq!(
        (
            cfg.include_code,
            cfg.max_bytes,
            cfg.keep,
            cfg.fsync,
            cfg.on_failure
        ),
        (true, 1 << 20, 0, FsyncPolicy::Always, OnFailure::Refuse)
    );
    let cfg: AuditConfig = toml::from_str("path = \"a\"\nmax_bytes = 4096").unwrap();
    assert_eq!(cfg.max_bytes, 4096);
    assert!(toml::from_str::<AuditConfig>("path = \"a\"\nmax_byte = 1").is_err());
    assert!(toml::from_str::<AuditConfig>("path = \"a\"\nfsync = \"sometimes\"").is_err());
    assert!(toml::from_str::<AuditConfig>("path = \"a\"\nmax_bytes = \"lots\"").is_err());
}

#[test]
fn an_empty_file_verifies_and_starts_at_genesis() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    std::fs::write(&path, "").unwrap();
    let s = verify(&path).unwrap();
    assert_eq!((s.records, s.last_hash.as_str()), (0, GENESIS));
    assert!(matches!(
        verify(&dir.path().join("missing")),
        Err(VerifyError::Read { .. })
    ));
}

#[test]
fn the_omitted_calls_summary_is_chained_and_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let (log, path) = log_with(dir.path(), 3);
    let summary = crate::audit::ToolCallsOmittedRecord {
        client: "test".into(),
        session: Some("cbx_1234".into()),
        count: 9900,
        by_outcome: [
            ("unknown_tool".to_string(), 900),
            ("limit".to_string(), 9000),
        ]
        .into_iter()
        .collect(),
    };
    log.append(AuditEvent::ToolCallsOmitted(summary.clone()))
        .unwrap();
    let mut exec = execution("print(1)");
    if let AuditEvent::Execution(e) = &mut exec {
        e.tools_called_omitted = 9900;
    }
    log.append(exec).unwrap();
    assert_eq!(verify(&path).unwrap().records, 5);
    let lines = lines(&path);
    let line: serde_json::Value = serde_json::from_str(&lines[3]).unwrap();
    assert_eq!(line["event"], "tool_calls_omitted");
    assert_eq!(line["count"], 9900);
    assert_eq!(line["by_outcome"]["limit"], 9000);
    let back: AuditEvent = serde_json::from_str(&lines[3]).unwrap();
    assert_eq!(back, AuditEvent::ToolCallsOmitted(summary));
    let exec: serde_json::Value = serde_json::from_str(&lines[4]).unwrap();
    assert_eq!(exec["tools_called_omitted"], 9900);
    // An execution with nothing omitted does not carry the field.
    let plain: serde_json::Value = serde_json::to_value(execution("print(2)")).unwrap();
    assert!(plain.get("tools_called_omitted").is_none());
}
