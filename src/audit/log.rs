//! The writer: appends records to the log file, keeps the chain, rotates by size.
//!
//! One `write(2)` per line on an `O_APPEND` descriptor, under a mutex, so lines never
//! interleave. A record becomes part of the chain only once its whole line is in the
//! file; a write cut short (disk full) is cut off again with `ftruncate`, so the next
//! record follows the last good one. A single writer is assumed: codebox's own process.
//!
//! Device files (such as `/dev/full` or a `/dev/stdout` symlink) are written but never
//! read, rotated, truncated or fsynced.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::chain::{line_hash, parse_header, GENESIS};
use super::{AuditConfig, AuditEvent, AuditStatus, Error, FsyncPolicy, OnFailure, Result};
use crate::error_chain::error_chain;

/// The audit log. `Send + Sync`; every call is synchronous (the server calls it from
/// `spawn_blocking`).
pub struct AuditLog {
    config: AuditConfig,
    inner: Mutex<Writer>,
}

/// The open file and the chain's head, behind the mutex.
struct Writer {
    path: PathBuf,
    /// `None` after a rotation could not open the new file; the next append retries.
    file: Option<File>,
    /// A regular file (not a device): may be read, rotated, truncated and fsynced.
    regular: bool,
    /// Bytes in the file, all of them complete lines.
    size: u64,
    /// A write was cut short and its bytes could not be cut off yet.
    needs_repair: bool,
    /// `seq` and line hash of the last record in the chain.
    seq: u64,
    last_hash: String,
    records_written: u64,
    failures: u64,
    healthy: bool,
    last_error: Option<String>,
}

/// One line: the chain fields, then the event's.
#[derive(Serialize)]
struct Line<'a> {
    seq: u64,
    time: &'a str,
    prev: &'a str,
    #[serde(flatten)]
    event: &'a AuditEvent,
}

impl AuditLog {
    /// Opens the log (creating it with mode 0600, and missing parent directories with
    /// 0700) and resumes the chain from its last line. A file whose last line was cut
    /// short (no newline) is rotated aside as it is, and the chain goes on from its last
    /// complete record in a new file.
    pub fn open(config: AuditConfig) -> Result<AuditLog> {
        let path = config.path.clone();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| Error::CreateDir {
                    path: dir.to_path_buf(),
                    source,
                })?;
        }
        let mut w = Writer {
            path,
            file: None,
            regular: false,
            size: 0,
            needs_repair: false,
            seq: 0,
            last_hash: GENESIS.into(),
            records_written: 0,
            failures: 0,
            healthy: true,
            last_error: None,
        };
        w.reopen()?;
        if w.regular {
            w.resume(&config)?;
        }
        Ok(AuditLog {
            config,
            inner: Mutex::new(w),
        })
    }

    /// Appends one record (dropping the code text unless `include_code` is set). On
    /// failure the error is returned and kept in [`AuditLog::status`]; the record is then
    /// not part of the chain, and the next append follows the last good record.
    pub fn append(&self, mut event: AuditEvent) -> Result<()> {
        event.redact(self.config.include_code);
        let mut w = self.lock();
        let result = w.append(&self.config, &event);
        match &result {
            Ok(()) => w.healthy = true,
            Err(err) => {
                let message = error_chain(err);
                tracing::error!(error = %message, path = ?w.path, "audit log write failed");
                w.healthy = false;
                w.failures += 1;
                w.last_error = Some(message);
            }
        }
        result
    }

    pub fn status(&self) -> AuditStatus {
        let w = self.lock();
        AuditStatus {
            path: w.path.clone(),
            healthy: w.healthy,
            records_written: w.records_written,
            last_error: w.last_error.clone(),
            failures: w.failures,
            last_seq: w.seq,
            last_hash: w.last_hash.clone(),
        }
    }

    pub fn include_code(&self) -> bool {
        self.config.include_code
    }

    pub fn on_failure(&self) -> OnFailure {
        self.config.on_failure
    }

    pub fn config(&self) -> &AuditConfig {
        &self.config
    }

    /// Nothing panics while the lock is held, but a poisoned lock must not take the
    /// server down either: the writer's state is consistent between statements.
    fn lock(&self) -> MutexGuard<'_, Writer> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for AuditLog {
    /// The file is closed: under `rotate` (and `always`), its data reaches the disk.
    fn drop(&mut self) {
        let w = self.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let (Some(file), true) = (&w.file, w.regular) {
            if self.config.fsync != FsyncPolicy::Never {
                if let Err(err) = file.sync_all() {
                    tracing::warn!(?err, path = ?w.path, "cannot fsync the audit log on close");
                }
            }
        }
    }
}

impl Writer {
    fn append(&mut self, config: &AuditConfig, event: &AuditEvent) -> Result<()> {
        let seq = self.seq + 1;
        let time = rfc3339_utc_ms(SystemTime::now());
        let mut line = serde_json::to_vec(&Line {
            seq,
            time: &time,
            prev: &self.last_hash,
            event,
        })
        .map_err(Error::Serialize)?;
        let hash = line_hash(&line);
        line.push(b'\n');

        if self.needs_repair {
            self.cut_partial()?;
        }
        if self.file.is_none() {
            self.reopen()?;
        }
        if self.regular && self.size > 0 && self.size + line.len() as u64 > config.max_bytes {
            self.rotate(config)?;
        }
        self.write_line(&line)?;
        // The line is in the file: it is part of the chain whatever fsync says.
        self.seq = seq;
        self.last_hash = hash;
        self.records_written += 1;
        if config.fsync == FsyncPolicy::Always && self.regular {
            if let Some(file) = &self.file {
                file.sync_data().map_err(|source| Error::Sync {
                    path: self.path.clone(),
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// One `write(2)` of the whole line; a short write is cut off again.
    fn write_line(&mut self, line: &[u8]) -> Result<()> {
        let Some(file) = self.file.as_mut() else {
            return Err(Error::Write {
                path: self.path.clone(),
                source: io::Error::other("the audit log is not open"),
            });
        };
        let written = loop {
            match file.write(line) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(Error::Write {
                        path: self.path.clone(),
                        source,
                    })
                }
                Ok(n) => break n,
            }
        };
        if written < line.len() {
            if self.regular {
                self.needs_repair = true;
                if let Err(err) = self.cut_partial() {
                    tracing::error!(error = %error_chain(&err), "partial audit record left in the file; cut off at the next append");
                }
            }
            return Err(Error::ShortWrite {
                path: self.path.clone(),
                written,
                len: line.len(),
            });
        }
        self.size += line.len() as u64;
        Ok(())
    }

    /// Cuts the file back to its complete lines after a short write.
    fn cut_partial(&mut self) -> Result<()> {
        if let Some(file) = &self.file {
            file.set_len(self.size).map_err(|source| Error::Repair {
                path: self.path.clone(),
                source,
            })?;
        }
        self.needs_repair = false;
        Ok(())
    }

    /// Opens (or creates) the file at the log's path for appending.
    fn reopen(&mut self) -> Result<()> {
        let open_err = |source| Error::Open {
            path: self.path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&self.path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        self.regular = meta.is_file();
        self.size = if self.regular { meta.len() } else { 0 };
        self.file = Some(file);
        self.needs_repair = false;
        Ok(())
    }

    /// Takes the chain's head from the file's last complete line.
    fn resume(&mut self, config: &AuditConfig) -> Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let tail = read_tail(file, self.size).map_err(|source| Error::Read {
            path: self.path.clone(),
            source,
        })?;
        let resume_err = |reason: String| Error::Resume {
            path: self.path.clone(),
            reason,
        };
        let Some(line) = tail.last_line else {
            if tail.complete_len < self.size {
                return Err(resume_err(
                    "it holds only an incomplete record (no newline)".into(),
                ));
            }
            return Ok(());
        };
        let header = parse_header(&line)
            .map_err(|why| resume_err(format!("its last record is not valid: {why}")))?;
        self.seq = header.seq;
        self.last_hash = line_hash(&line);
        if tail.complete_len < self.size {
            tracing::warn!(
                path = ?self.path,
                seq = self.seq,
                "the audit log ends in an incomplete record; rotating it aside as it is and going on from its last complete record"
            );
            self.rotate(config)?;
        }
        Ok(())
    }

    /// `FILE` becomes `FILE.1`, `FILE.1` becomes `FILE.2` and so on, up to `FILE.<keep>`;
    /// then a new, empty `FILE` is opened. The chain goes on across the files.
    fn rotate(&mut self, config: &AuditConfig) -> Result<()> {
        if let (Some(file), true) = (&self.file, config.fsync != FsyncPolicy::Never) {
            file.sync_all().map_err(|source| Error::Sync {
                path: self.path.clone(),
                source,
            })?;
        }
        let path = self.path.clone();
        let numbered = |n: usize| numbered(&path, n);
        let rename = |from: PathBuf, to: PathBuf| match fs::rename(&from, &to) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(Error::Rotate {
                from,
                to,
                source: e,
            }),
            _ => Ok(()),
        };
        for n in (1..config.keep).rev() {
            rename(numbered(n), numbered(n + 1))?;
        }
        if config.keep == 0 {
            match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(Error::Rotate {
                        from: path,
                        to: PathBuf::from("(removed: keep = 0)"),
                        source: e,
                    })
                }
                _ => {}
            }
        } else {
            rename(path.clone(), numbered(1))?;
        }
        // The descriptor now points at FILE.1 (or at nothing): never write to it again.
        self.file = None;
        self.reopen()?;
        if config.fsync != FsyncPolicy::Never {
            if let Err(err) = sync_dir(&self.path) {
                tracing::warn!(?err, path = ?self.path, "cannot fsync the audit log's directory after rotation");
            }
        }
        // Files beyond `keep` (left by a larger `keep` before) go.
        for n in config.keep + 1.. {
            if fs::remove_file(numbered(n)).is_err() {
                break;
            }
        }
        tracing::info!(path = ?self.path, seq = self.seq, "audit log rotated");
        Ok(())
    }
}

/// `FILE.<n>`.
pub(super) fn numbered(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Makes renames in the file's directory durable.
fn sync_dir(file: &Path) -> io::Result<()> {
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

/// The end of a log file.
struct Tail {
    /// The last complete line (without its newline).
    last_line: Option<Vec<u8>>,
    /// Bytes up to and including the last newline; less than the file's length when the
    /// file ends in an incomplete line.
    complete_len: u64,
}

/// Reads the file backwards from `len` until the last complete line is found, in chunks
/// that double so a long line costs linear time.
fn read_tail(file: &File, len: u64) -> io::Result<Tail> {
    let mut start = len;
    let mut tail: Vec<u8> = Vec::new();
    loop {
        if let Some(last_nl) = tail.iter().rposition(|&b| b == b'\n') {
            let line_start = match tail[..last_nl].iter().rposition(|&b| b == b'\n') {
                Some(prev_nl) => Some(prev_nl + 1),
                None if start == 0 => Some(0),
                None => None,
            };
            if let Some(line_start) = line_start {
                return Ok(Tail {
                    last_line: Some(tail[line_start..last_nl].to_vec()),
                    complete_len: start + last_nl as u64 + 1,
                });
            }
        } else if start == 0 {
            return Ok(Tail {
                last_line: None,
                complete_len: 0,
            });
        }
        let n = (tail.len() as u64).max(64 * 1024).min(start);
        let mut chunk = vec![0; n as usize];
        file.read_exact_at(&mut chunk, start - n)?;
        start -= n;
        chunk.extend_from_slice(&tail);
        tail = chunk;
    }
}

/// RFC 3339 in UTC with milliseconds: `2025-01-31T09:15:02.481Z`.
pub(super) fn rfc3339_utc_ms(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        d.subsec_millis()
    )
}

/// Year, month, day of a count of days since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, proleptic Gregorian).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // 0..=365
    let mp = (5 * doy + 2) / 153; // March-based month, 0..=11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::super::{verify, ToolCallRecord};
    use super::*;

    fn event(client: String) -> AuditEvent {
        AuditEvent::ToolCall(ToolCallRecord {
            client,
            session: None,
            name: "t".into(),
            ok: true,
            duration_ms: 0.0,
            bytes_in: 0,
            bytes_out: 0,
            error_kind: None,
        })
    }

    #[test]
    fn a_short_write_is_cut_off_before_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(AuditConfig::new(&path)).unwrap();
        log.append(event("a".into())).unwrap();
        // What a write cut short by a full disk leaves, when ftruncate failed too.
        {
            let mut w = log.lock();
            w.file
                .as_mut()
                .unwrap()
                .write_all(br#"{"seq":2,"ti"#)
                .unwrap();
            w.needs_repair = true;
        }
        log.append(event("b".into())).unwrap();
        let s = verify(&path).unwrap();
        assert_eq!((s.records, s.last_seq), (2, 2));
    }

    #[test]
    fn the_tail_is_found_past_long_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(AuditConfig::new(&path)).unwrap();
        for n in [10, 200_000, 70_000] {
            log.append(event("x".repeat(n))).unwrap();
        }
        let head = log.status().last_hash;
        drop(log);
        let log = AuditLog::open(AuditConfig::new(&path)).unwrap();
        assert_eq!((log.status().last_seq, log.status().last_hash), (3, head));

        let file = File::open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        let tail = read_tail(&file, len).unwrap();
        assert_eq!(tail.complete_len, len);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            tail.last_line.unwrap(),
            text.lines().last().unwrap().as_bytes()
        );

        // A long incomplete tail: the complete part ends before it.
        let mut text = text.into_bytes();
        let complete = text.len() as u64;
        text.extend(std::iter::repeat_n(b'y', 150_000));
        std::fs::write(&path, &text).unwrap();
        let tail = read_tail(&File::open(&path).unwrap(), text.len() as u64).unwrap();
        assert_eq!(tail.complete_len, complete);
        assert!(tail.last_line.unwrap().len() > 70_000);
    }
}
