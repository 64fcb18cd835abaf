//! Output files: what a program leaves under `/workspace/out` (and the workspace files a
//! call names in `outputs`) comes back with its result.
//!
//! The runtime sends them on fd 3 at the end of a run (`codebox/file` chunks, then one
//! `codebox/files` summary; see `runtime/boot.rs`); the proxy assembles them within
//! [`OutFilesLimits`] ([`Assembler`]); the server keeps them as the caller's resources
//! and shows each in the form a client can use ([`Shown`]): images (PNG, JPEG, GIF,
//! WebP, told by their first bytes, never by their name) as image content within the
//! result's image budget, SVG and other small text files as embedded text resources,
//! anything else (or over its budget) as a resource link with its size. All of it is the
//! program's own output: a path or a byte is checked here, never trusted.

use std::collections::BTreeSet;

use serde::Serialize;

/// Bounds on the output files of one execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutFilesLimits {
    /// Files returned; the rest are counted.
    pub max_files: usize,
    /// Bytes of all files together (what the runtime sends and the proxy holds).
    pub max_bytes: usize,
    /// Bytes of images shown inline in one result, all together (base64 makes a third
    /// more); an image past it is a resource link.
    pub image_bytes: usize,
    /// Largest text file embedded whole in the result; larger ones are links.
    pub embed_bytes: usize,
}

impl Default for OutFilesLimits {
    fn default() -> OutFilesLimits {
        OutFilesLimits {
            max_files: 50,
            max_bytes: 16 << 20,
            image_bytes: 512 << 10,
            embed_bytes: 16 << 10,
        }
    }
}

/// One output file, as assembled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutFile {
    /// Relative to `/workspace`, checked like a call's file paths.
    pub path: String,
    pub bytes: Vec<u8>,
}

/// A file the runtime did not send, and why (a symlink, too large, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Skipped {
    pub path: String,
    pub why: String,
}

/// The output files of one run, as the proxy assembled them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutFiles {
    pub files: Vec<OutFile>,
    pub skipped: Vec<Skipped>,
    /// Files past `max_files` (or past the runtime's walk), counted only.
    pub omitted: u64,
}

/// Skipped files listed by name; more are counted in `omitted`.
const MAX_SKIPPED: usize = 100;
/// Paths remembered as refused.
const MAX_REFUSED: usize = 1_000;
/// Longest reason kept from the runtime.
const MAX_WHY_BYTES: usize = 200;

/// Assembles `codebox/file` chunks into files within the limits.
#[derive(Debug)]
pub struct Assembler {
    limits: OutFilesLimits,
    out: OutFiles,
    bytes: usize,
    /// The file being received: its index in `out.files` (chunks must follow in order).
    open: Option<usize>,
    /// Paths already refused once (further chunks of them are dropped quietly); at most
    /// [`MAX_REFUSED`], so a flood of made-up paths cannot grow it.
    refused: BTreeSet<String>,
}

impl Assembler {
    pub fn new(limits: OutFilesLimits) -> Assembler {
        Assembler {
            limits,
            out: OutFiles::default(),
            bytes: 0,
            open: None,
            refused: BTreeSet::new(),
        }
    }

    /// One chunk: `data` at `offset` of the file at `path`. A new file starts at offset 0;
    /// a later chunk must continue the file being received. Anything else is dropped
    /// (and the file with it).
    pub fn chunk(&mut self, path: &str, offset: u64, data: Vec<u8>) {
        if self.refused.contains(path) {
            return;
        }
        if offset == 0 {
            self.open = None;
            if let Err(why) = crate::runtime::boot::validate_path(path) {
                return self.refuse(path, why.to_string());
            }
            if self.out.files.iter().any(|f| f.path == path) {
                return self.refuse(path, "sent twice".into());
            }
            if self.out.files.len() >= self.limits.max_files {
                self.remember_refused(path);
                self.out.omitted += 1;
                return;
            }
            self.out.files.push(OutFile {
                path: path.to_string(),
                bytes: Vec::new(),
            });
            self.open = Some(self.out.files.len() - 1);
        }
        let Some(index) = self.open else {
            return self.refuse(path, "its chunks came out of order".into());
        };
        let file = &mut self.out.files[index];
        if file.path != path || file.bytes.len() as u64 != offset {
            let file = self.out.files.remove(index);
            self.bytes -= file.bytes.len();
            self.open = None;
            return self.refuse(path, "its chunks came out of order".into());
        }
        if self.bytes + data.len() > self.limits.max_bytes {
            let file = self.out.files.remove(index);
            self.bytes -= file.bytes.len();
            self.open = None;
            let limit = self.limits.max_bytes;
            return self.refuse(
                path,
                format!("over the {limit} bytes of output files an execution returns"),
            );
        }
        self.bytes += data.len();
        file.bytes.extend_from_slice(&data);
    }

    /// The runtime's summary: what it skipped and how many it left out.
    pub fn summary(&mut self, skipped: Vec<Skipped>, omitted: u64) {
        for s in skipped {
            let why = crate::proxy::clip(&s.why, MAX_WHY_BYTES).into_owned();
            let path = crate::proxy::clip(&s.path, crate::runtime::boot::MAX_PATH_BYTES);
            self.skip(path.into_owned(), why);
        }
        self.out.omitted = self.out.omitted.saturating_add(omitted);
    }

    /// Remembers a refused path so that its later chunks are dropped quietly: only a
    /// path that could be a file's (at most [`crate::runtime::boot::MAX_PATH_BYTES`]; a
    /// longer one's later chunks are refused again as out of order), and at most
    /// [`MAX_REFUSED`] of them.
    fn remember_refused(&mut self, path: &str) {
        if self.refused.len() < MAX_REFUSED && path.len() <= crate::runtime::boot::MAX_PATH_BYTES {
            self.refused.insert(path.to_string());
        }
    }

    fn refuse(&mut self, path: &str, why: String) {
        self.remember_refused(path);
        let path = crate::proxy::clip(path, crate::runtime::boot::MAX_PATH_BYTES).into_owned();
        self.skip(path, why);
    }

    fn skip(&mut self, path: String, why: String) {
        if self.out.skipped.len() < MAX_SKIPPED {
            self.out.skipped.push(Skipped { path, why });
        } else {
            self.out.omitted += 1;
        }
    }

    pub fn finish(self) -> OutFiles {
        self.out
    }
}

/// What a file is, by its first bytes (images) or its name and bytes (text).
pub fn mime_of(path: &str, bytes: &[u8]) -> &'static str {
    if let Some(image) = image_mime(bytes) {
        return image;
    }
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    let text = std::str::from_utf8(bytes).is_ok();
    match (ext.as_deref(), text) {
        (Some("svg"), true) => "image/svg+xml",
        (Some("csv"), true) => "text/csv",
        (Some("tsv"), true) => "text/tab-separated-values",
        (Some("json"), true) => "application/json",
        (Some("jsonl" | "ndjson"), true) => "application/x-ndjson",
        (Some("md" | "markdown"), true) => "text/markdown",
        (Some("html" | "htm"), true) => "text/html",
        (Some("xml"), true) => "application/xml",
        (Some("yaml" | "yml"), true) => "application/yaml",
        (_, true) => "text/plain",
        (Some("pdf"), false) if bytes.starts_with(b"%PDF-") => "application/pdf",
        (Some("zip" | "xlsx" | "docx"), false) if bytes.starts_with(b"PK\x03\x04") => {
            match ext.as_deref() {
                Some("xlsx") => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
                Some("docx") => {
                    "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
                }
                _ => "application/zip",
            }
        }
        (Some("parquet"), false) if bytes.starts_with(b"PAR1") => "application/vnd.apache.parquet",
        _ => "application/octet-stream",
    }
}

/// The MIME type of an image MCP clients show, from its signature.
fn image_mime(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// One returned file in a result's `files`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct FileRecord {
    /// Relative to `/workspace` (tokenized when personal-data handling is on).
    pub path: String,
    pub mime: &'static str,
    pub bytes: usize,
    pub shown: Shown,
    /// Where it can be read whole (absent when withheld, or too large to keep).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
}

/// How one file reaches the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Shown {
    /// MCP image content (base64 in the result).
    Image,
    /// An embedded text resource (SVG and small text files).
    Embedded,
    /// A resource link with its size: read it with `resources/read`.
    Link,
    /// Listed only: personal-data handling is on and binary content cannot be scanned.
    Withheld,
}

/// How each file is shown, in order, given the budgets: images while the image budget
/// lasts, text up to `embed_bytes` while the embedding budget lasts, links for the rest.
/// `binary_allowed`: false with personal-data handling on (only text, which is
/// tokenized, leaves).
pub fn plan(files: &[OutFile], limits: &OutFilesLimits, binary_allowed: bool) -> Vec<Shown> {
    let mut image_left = limits.image_bytes;
    // Embedded text shares the image budget's order of size: a handful of small files.
    let mut embed_left = limits.embed_bytes * 4;
    files
        .iter()
        .map(|f| {
            let mime = mime_of(&f.path, &f.bytes);
            let text = std::str::from_utf8(&f.bytes).is_ok();
            if mime.starts_with("image/") && mime != "image/svg+xml" {
                if !binary_allowed {
                    Shown::Withheld
                } else if f.bytes.len() <= image_left {
                    image_left -= f.bytes.len();
                    Shown::Image
                } else {
                    Shown::Link
                }
            } else if text {
                if f.bytes.len() <= limits.embed_bytes && f.bytes.len() <= embed_left {
                    embed_left -= f.bytes.len();
                    Shown::Embedded
                } else {
                    Shown::Link
                }
            } else if binary_allowed {
                Shown::Link
            } else {
                Shown::Withheld
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn limits() -> OutFilesLimits {
        OutFilesLimits {
            max_files: 3,
            max_bytes: 100,
            image_bytes: 40,
            embed_bytes: 10,
        }
    }

    #[test]
    fn chunks_assemble_in_order_within_the_limits() {
        let mut a = Assembler::new(limits());
        a.chunk("out/a.txt", 0, b"hello ".to_vec());
        a.chunk("out/a.txt", 6, b"world".to_vec());
        a.chunk("out/b.bin", 0, vec![0; 50]);
        // Over the total: dropped whole, and its later chunks too.
        a.chunk("out/c.bin", 0, vec![1; 40]);
        a.chunk("out/c.bin", 40, vec![1; 10]);
        a.chunk("out/d", 0, Vec::new());
        a.chunk("out/e", 0, Vec::new());
        a.chunk("out/f", 0, Vec::new());
        let out = a.finish();
        let names: Vec<&str> = out.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["out/a.txt", "out/b.bin", "out/d"]);
        assert_eq!(out.files[0].bytes, b"hello world");
        assert_eq!(out.omitted, 2, "e and f are past max_files");
        assert_eq!(out.skipped.len(), 1);
        assert!(out.skipped[0].why.contains("over the 100 bytes"), "{out:?}");
    }

    #[test]
    fn hostile_paths_and_chunks_are_refused() {
        let mut a = Assembler::new(OutFilesLimits::default());
        for bad in [
            "../etc/passwd",
            "/etc/passwd",
            "out/../../x",
            "",
            "out//x",
            "a\nb",
        ] {
            a.chunk(bad, 0, b"x".to_vec());
        }
        // A chunk for a file that never started, or out of order.
        a.chunk("out/late", 5, b"x".to_vec());
        a.chunk("out/gap", 0, b"ab".to_vec());
        a.chunk("out/gap", 3, b"c".to_vec());
        // The same path twice.
        a.chunk("out/twice", 0, b"1".to_vec());
        a.chunk("out/twice", 0, b"2".to_vec());
        let out = a.finish();
        let names: Vec<&str> = out.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["out/twice"]);
        assert_eq!(out.files[0].bytes, b"1");
        assert_eq!(out.skipped.len(), 9, "{:?}", out.skipped);
    }

    #[test]
    fn refused_paths_hold_little_memory_however_long() {
        let mut a = Assembler::new(OutFilesLimits::default());
        let long = "a".repeat(1 << 20);
        for i in 0..50 {
            a.chunk(&format!("{i}{long}"), 0, Vec::new());
            a.chunk(&format!("{i}{long}"), 1, Vec::new());
        }
        assert!(a.refused.is_empty(), "no over-long path is remembered");
        let held: usize = a
            .out
            .skipped
            .iter()
            .map(|s| s.path.len() + s.why.len())
            .sum();
        assert!(held < 100 * 2_000, "{held}");
        for i in 0..5_000 {
            a.chunk(&format!("../{i}"), 0, Vec::new());
        }
        assert_eq!(a.refused.len(), MAX_REFUSED);
    }

    #[test]
    fn the_summary_is_bounded() {
        let mut a = Assembler::new(OutFilesLimits::default());
        let many = (0..500)
            .map(|i| Skipped {
                path: format!("out/link{i}"),
                why: "w".repeat(10_000),
            })
            .collect();
        a.summary(many, u64::MAX);
        let out = a.finish();
        assert_eq!(out.skipped.len(), MAX_SKIPPED);
        assert!(out.skipped[0].why.len() < MAX_WHY_BYTES + 40);
        assert_eq!(out.omitted, u64::MAX, "saturates");
    }

    #[test]
    fn images_are_told_by_their_bytes_not_their_names() {
        assert_eq!(mime_of("chart.png", PNG), "image/png");
        assert_eq!(mime_of("chart.dat", PNG), "image/png");
        assert_eq!(mime_of("fake.png", b"not a png"), "text/plain");
        assert_eq!(mime_of("x.jpg", &[0xff, 0xd8, 0xff, 0xe0]), "image/jpeg");
        assert_eq!(mime_of("x", b"GIF89a...."), "image/gif");
        assert_eq!(mime_of("x", b"RIFF\0\0\0\0WEBPVP8 "), "image/webp");
        assert_eq!(mime_of("d.svg", b"<svg/>"), "image/svg+xml");
        assert_eq!(mime_of("d.CSV", b"a,b\n1,2\n"), "text/csv");
        assert_eq!(
            mime_of("d.csv", &[0xff, 0xfe, 0]),
            "application/octet-stream"
        );
        assert_eq!(mime_of("r.pdf", b"%PDF-1.7\n\xff"), "application/pdf");
        assert_eq!(mime_of("r.pdf", b"\xff\xfe"), "application/octet-stream");
    }

    #[test]
    fn images_inline_within_the_budget_then_links() {
        let file = |path: &str, bytes: &[u8]| OutFile {
            path: path.into(),
            bytes: bytes.to_vec(),
        };
        let mut big_png = PNG.to_vec();
        big_png.resize(30, 0);
        let files = [
            file("out/a.png", &big_png),
            file("out/b.png", &big_png),
            file("out/s.svg", b"<svg/>"),
            file("out/t.csv", b"a,b\n"),
            file("out/long.txt", &[b'x'; 11]),
            file("out/z.bin", &[0xff, 0]),
        ];
        let shown = plan(&files, &limits(), true);
        assert_eq!(
            shown,
            [
                Shown::Image,
                Shown::Link,
                Shown::Embedded,
                Shown::Embedded,
                Shown::Link,
                Shown::Link
            ]
        );
        let shown = plan(&files, &limits(), false);
        assert_eq!(shown[0], Shown::Withheld);
        assert_eq!(shown[3], Shown::Embedded);
        assert_eq!(shown[5], Shown::Withheld);
    }
}
