//! Whole output streams of results whose budget cut them, and the output files of
//! executions, kept for a while as resources of the client that ran them:
//! `codebox://executions/<id>/stdout` (and `stderr`), read in pages (`?page=2`) that each
//! fit in one MCP message, and `codebox://executions/<id>/files/<path>` (text in pages
//! of text, anything else as base64 blobs in pages of [`BLOB_PAGE_BYTES`]). Another
//! client's executions are unknown to a caller. What is kept is what the result was made
//! from: secrets redacted and personal data tokenized already (a file's path too).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// URI prefix of kept streams.
pub const PREFIX: &str = "codebox://executions/";

/// Escaped JSON bytes of one page (with the envelope, well within what a client accepts
/// in one message).
pub const PAGE_BYTES: usize = 256 * 1024;

/// Bytes of a binary file per page (base64 makes a third more).
pub const BLOB_PAGE_BYTES: usize = 512 * 1024;

/// One kept output file, under the path the model sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptFile {
    pub path: String,
    pub mime: &'static str,
    pub bytes: Vec<u8>,
}

impl KeptFile {
    fn is_text(&self) -> bool {
        std::str::from_utf8(&self.bytes).is_ok()
    }

    fn pages(&self) -> usize {
        match std::str::from_utf8(&self.bytes) {
            Ok(text) => crate::output::json_text::pieces(text, PAGE_BYTES)
                .len()
                .max(1),
            Err(_) => self.bytes.len().div_ceil(BLOB_PAGE_BYTES).max(1),
        }
    }
}

/// One page of a kept file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilePage {
    Text(String),
    /// Base64 of the page's bytes.
    Blob(String),
}

/// Limits of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptLimits {
    /// How long a stream stays readable.
    pub ttl: Duration,
    /// Bytes of all kept streams together; the oldest go first past it.
    pub max_bytes: usize,
}

impl Default for KeptLimits {
    fn default() -> KeptLimits {
        KeptLimits {
            ttl: Duration::from_secs(15 * 60),
            max_bytes: 64 << 20,
        }
    }
}

struct Entry {
    id: String,
    owner: String,
    at: Instant,
    stdout: Option<String>,
    stderr: Option<String>,
    files: Vec<KeptFile>,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.stdout.as_ref().map_or(0, String::len)
            + self.stderr.as_ref().map_or(0, String::len)
            + self.files.iter().map(|f| f.bytes.len()).sum::<usize>()
    }
}

/// The kept streams, oldest first.
pub struct KeptOutputs {
    limits: KeptLimits,
    entries: Mutex<(VecDeque<Entry>, usize)>,
}

/// One kept stream, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub uri: String,
    pub bytes: usize,
    pub pages: usize,
    pub mime: &'static str,
}

impl KeptOutputs {
    pub fn new(limits: KeptLimits) -> KeptOutputs {
        KeptOutputs {
            limits,
            entries: Mutex::default(),
        }
    }

    /// Keeps the streams of execution `id` (see [`new_id`]) for `owner`; false when they
    /// are larger than the whole store.
    pub fn keep(
        &self,
        id: &str,
        owner: &str,
        stdout: Option<String>,
        stderr: Option<String>,
    ) -> bool {
        self.insert(Entry {
            id: id.to_string(),
            owner: owner.to_string(),
            at: Instant::now(),
            stdout,
            stderr,
            files: Vec::new(),
        })
    }

    /// Keeps the output files of execution `id` for `owner`; false when they are larger
    /// than the whole store.
    pub fn keep_files(&self, id: &str, owner: &str, files: Vec<KeptFile>) -> bool {
        self.insert(Entry {
            id: id.to_string(),
            owner: owner.to_string(),
            at: Instant::now(),
            stdout: None,
            stderr: None,
            files,
        })
    }

    fn insert(&self, entry: Entry) -> bool {
        let size = entry.bytes();
        if size > self.limits.max_bytes {
            tracing::info!(
                size,
                limit = self.limits.max_bytes,
                "an execution's output is larger than the kept-output store"
            );
            return false;
        }
        let mut guard = self.entries.lock().expect("kept outputs lock");
        let (entries, total) = &mut *guard;
        expire(entries, total, self.limits.ttl);
        while *total + size > self.limits.max_bytes {
            let Some(old) = entries.pop_front() else {
                break;
            };
            *total -= old.bytes();
        }
        *total += size;
        entries.push_back(entry);
        true
    }

    /// The caller's kept streams.
    pub fn list(&self, owner: &str) -> Vec<Listed> {
        let mut guard = self.entries.lock().expect("kept outputs lock");
        let (entries, total) = &mut *guard;
        expire(entries, total, self.limits.ttl);
        let mut out = Vec::new();
        for e in entries.iter().filter(|e| e.owner == owner) {
            for (stream, text) in [("stdout", &e.stdout), ("stderr", &e.stderr)] {
                if let Some(text) = text {
                    out.push(Listed {
                        uri: format!("{PREFIX}{}/{stream}", e.id),
                        bytes: text.len(),
                        pages: crate::output::json_text::pieces(text, PAGE_BYTES)
                            .len()
                            .max(1),
                        mime: "text/plain",
                    });
                }
            }
            for f in &e.files {
                out.push(Listed {
                    uri: file_uri(&e.id, &f.path),
                    bytes: f.bytes.len(),
                    pages: f.pages(),
                    mime: f.mime,
                });
            }
        }
        out
    }

    /// `None` when `uri` is not a kept file's; else page N of it (text or a blob) with
    /// its MIME type and page count, or why there is none.
    pub fn read_file(
        &self,
        owner: &str,
        uri: &str,
    ) -> Option<Result<(FilePage, &'static str, usize), String>> {
        let rest = uri.strip_prefix(PREFIX)?;
        let (id, encoded) = rest.split_once("/files/")?;
        // A `?page=N` is outside the encoded path (whose `?` is `%3F`).
        let (encoded, page) = match encoded.rsplit_once("?page=") {
            Some((p, n)) => (p, Some(n)),
            None => (encoded, None),
        };
        let unknown = || {
            format!("unknown resource {uri:?}: output files are readable for {} s after their execution, by the client that ran it", self.limits.ttl.as_secs())
        };
        let mut guard = self.entries.lock().expect("kept outputs lock");
        let (entries, total) = &mut *guard;
        expire(entries, total, self.limits.ttl);
        let page = match page {
            None => 1,
            Some(n) => match n.parse::<usize>().ok().filter(|n| *n >= 1) {
                Some(n) => n,
                None => return Some(Err(format!("{uri:?}: a page is a number from 1"))),
            },
        };
        let Some(path) = percent_decoded(encoded) else {
            return Some(Err(unknown()));
        };
        let file = entries
            .iter()
            .filter(|e| e.id == id && e.owner == owner)
            .flat_map(|e| e.files.iter())
            .find(|f| f.path == path);
        let Some(file) = file else {
            return Some(Err(unknown()));
        };
        let pages = file.pages();
        if page > pages {
            return Some(Err(format!("{uri:?}: there are {pages} pages")));
        }
        let body = if file.is_text() {
            let text = std::str::from_utf8(&file.bytes).unwrap_or_default();
            let piece = crate::output::json_text::pieces(text, PAGE_BYTES)
                .get(page - 1)
                .copied()
                .unwrap_or_default();
            FilePage::Text(piece.to_string())
        } else {
            use base64::Engine as _;
            let chunk = file
                .bytes
                .chunks(BLOB_PAGE_BYTES)
                .nth(page - 1)
                .unwrap_or_default();
            FilePage::Blob(base64::engine::general_purpose::STANDARD.encode(chunk))
        };
        Some(Ok((body, file.mime, pages)))
    }

    /// `None` when `uri` is not a kept stream's; else page N of it with the page count,
    /// or why there is none (expired, another client's, no such page).
    pub fn read(&self, owner: &str, uri: &str) -> Option<Result<(String, usize), String>> {
        let rest = uri.strip_prefix(PREFIX)?;
        if rest
            .split_once('/')
            .is_some_and(|(_, s)| s.starts_with("files/"))
        {
            return None; // a file's: `read_file`
        }
        Some(self.read_page(owner, uri, rest))
    }

    fn read_page(&self, owner: &str, uri: &str, rest: &str) -> Result<(String, usize), String> {
        let unknown = || {
            format!("unknown resource {uri:?}: kept output is readable for {} s after its execution, by the client that ran it", self.limits.ttl.as_secs())
        };
        let (path, page) = match rest.split_once("?page=") {
            Some((p, n)) => (
                p,
                n.parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("{uri:?}: a page is a number from 1"))?,
            ),
            None => (rest, 1),
        };
        let (id, stream) = path.split_once('/').ok_or_else(unknown)?;
        let mut guard = self.entries.lock().expect("kept outputs lock");
        let (entries, total) = &mut *guard;
        expire(entries, total, self.limits.ttl);
        // An execution may have two entries (its cut streams, its files): the one that
        // holds the stream.
        let text = entries
            .iter()
            .filter(|e| e.id == id && e.owner == owner)
            .find_map(|e| match stream {
                "stdout" => e.stdout.as_deref(),
                "stderr" => e.stderr.as_deref(),
                _ => None,
            })
            .ok_or_else(unknown)?;
        let pages = crate::output::json_text::pieces(text, PAGE_BYTES);
        let count = pages.len().max(1);
        match pages.get(page - 1) {
            Some(p) => Ok((p.to_string(), count)),
            None if page == 1 => Ok((String::new(), 1)),
            None => Err(format!("{uri:?}: there are {count} pages")),
        }
    }
}

/// A new execution id: 24 hex digits from the system's randomness (unguessable; the
/// owner is checked as well).
pub fn new_id() -> String {
    let mut raw = [0u8; 12];
    if getrandom::fill(&mut raw).is_err() {
        tracing::warn!("no randomness for an execution id; using the clock");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        raw.copy_from_slice(&nanos.to_le_bytes()[..12]);
    }
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

/// The execution id a kept stream's or file's URI names (`None`: not such a URI).
pub fn execution_id(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix(PREFIX)?;
    Some(rest.split_once('/').map_or(rest, |(id, _)| id))
}

/// The URI of one kept stream.
pub fn uri(id: &str, stream: &str) -> String {
    format!("{PREFIX}{id}/{stream}")
}

/// The URI of one kept output file (`path` as the model sees it), every byte but
/// unreserved characters and `/` percent-encoded (RFC 3986: a name may hold a space, `#`
/// or `?`).
pub fn file_uri(id: &str, path: &str) -> String {
    let mut uri = format!("{PREFIX}{id}/files/");
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// `text` with `%XX` escapes decoded (`None` when the result is not UTF-8).
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |k: usize| bytes.get(k).and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn expire(entries: &mut VecDeque<Entry>, total: &mut usize, ttl: Duration) {
    while entries.front().is_some_and(|e| e.at.elapsed() > ttl) {
        let old = entries.pop_front().expect("checked");
        *total -= old.bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_reads_its_streams_in_pages_and_nobody_else_does() {
        let kept = KeptOutputs::new(KeptLimits::default());
        let big = "x".repeat(PAGE_BYTES * 2 + 10);
        let id = new_id();
        assert!(kept.keep(&id, "alice", Some(big.clone()), None));
        let uri = format!("{PREFIX}{id}/stdout");
        let (first, pages) = kept.read("alice", &uri).unwrap().unwrap();
        assert_eq!(pages, 3);
        let mut whole = first;
        for n in 2..=3 {
            whole += &kept
                .read("alice", &format!("{uri}?page={n}"))
                .unwrap()
                .unwrap()
                .0;
        }
        assert_eq!(whole, big);
        assert!(kept
            .read("alice", &format!("{uri}?page=4"))
            .unwrap()
            .is_err());
        assert!(kept
            .read("alice", &format!("{uri}?page=0"))
            .unwrap()
            .is_err());
        assert!(kept.read("mallory", &uri).unwrap().is_err());
        assert!(kept
            .read("alice", &format!("{PREFIX}{id}/stderr"))
            .unwrap()
            .is_err());
        assert!(kept
            .read("alice", &format!("{PREFIX}{id}/../x"))
            .unwrap()
            .is_err());
        assert!(kept.read("alice", "codebox://servers/x.ts").is_none());
        assert_eq!(kept.list("alice").len(), 1);
        assert!(kept.list("mallory").is_empty());
    }

    /// A replica's ids carry its name (`r1.<hex>`): the dot reads as part of the id,
    /// and the id is found in every URI form (see crate::replica).
    #[test]
    fn qualified_ids_are_kept_read_and_named_by_their_uris() {
        let kept = KeptOutputs::new(KeptLimits::default());
        let id = format!("codebox-1.{}", new_id());
        assert!(kept.keep(&id, "alice", Some("x".repeat(10)), None));
        let files = vec![KeptFile {
            path: "a b.txt".into(),
            mime: "text/plain",
            bytes: b"hi".to_vec(),
        }];
        assert!(kept.keep_files(&id, "alice", files));
        let (text, _) = kept.read("alice", &uri(&id, "stdout")).unwrap().unwrap();
        assert_eq!(text, "x".repeat(10));
        let file = file_uri(&id, "a b.txt");
        assert!(kept.read_file("alice", &file).unwrap().is_ok());
        assert!(kept.read("bob", &uri(&id, "stdout")).unwrap().is_err());
        for u in [
            uri(&id, "stdout"),
            format!("{}?page=2", uri(&id, "stderr")),
            file,
        ] {
            assert_eq!(execution_id(&u), Some(id.as_str()), "{u}");
        }
        assert_eq!(execution_id(&format!("{PREFIX}{id}")), Some(id.as_str()));
        assert_eq!(execution_id("codebox://tasks"), None);
    }

    #[test]
    fn streams_and_files_of_one_execution_are_both_readable() {
        let kept = KeptOutputs::new(KeptLimits::default());
        let id = new_id();
        let file = KeptFile {
            path: "out/a b#c?page=2.txt".into(),
            mime: "text/plain",
            bytes: b"hi".to_vec(),
        };
        assert!(kept.keep_files(&id, "alice", vec![file]));
        assert!(kept.keep(&id, "alice", Some("whole".into()), None));
        let (text, _) = kept.read("alice", &uri(&id, "stdout")).unwrap().unwrap();
        assert_eq!(text, "whole");
        let listed = kept.list("alice");
        let file_uri = &listed
            .iter()
            .find(|l| l.uri.contains("/files/"))
            .unwrap()
            .uri;
        assert!(
            file_uri.ends_with("/files/out/a%20b%23c%3Fpage%3D2.txt"),
            "{file_uri}"
        );
        let (page, mime, pages) = kept.read_file("alice", file_uri).unwrap().unwrap();
        assert_eq!(
            (page, mime, pages),
            (FilePage::Text("hi".into()), "text/plain", 1)
        );
        assert!(kept.read_file("mallory", file_uri).unwrap().is_err());
        assert!(kept
            .read_file("alice", &format!("{file_uri}?page=2"))
            .unwrap()
            .is_err());
    }

    #[test]
    fn old_streams_go_first_past_the_size_and_after_the_ttl() {
        let kept = KeptOutputs::new(KeptLimits {
            ttl: Duration::from_millis(200),
            max_bytes: 100,
        });
        let (a, b) = (new_id(), new_id());
        assert!(kept.keep(&a, "c", Some("a".repeat(60)), None));
        assert!(kept.keep(&b, "c", Some("b".repeat(60)), None));
        let read = |id: &str| kept.read("c", &format!("{PREFIX}{id}/stdout")).unwrap();
        assert!(read(&a).is_err(), "evicted for b");
        assert!(read(&b).is_ok());
        assert!(!kept.keep(&new_id(), "c", Some("c".repeat(101)), None));
        std::thread::sleep(Duration::from_millis(250));
        assert!(read(&b).is_err(), "expired");
    }
}
