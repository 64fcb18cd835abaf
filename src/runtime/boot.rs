//! The boot frame: what the supervisor writes on fd 3 before anything else.
//!
//! A sequence of records, each an ASCII header `<KIND> <byte length>\n` followed by exactly
//! that many bytes:
//!
//! - `FILE`, zero or more: `<relative path>\0<content>`; the boot file writes it under
//!   `/workspace` (creating parent directories) before the program starts;
//! - `CODE`, exactly once and last: the program's UTF-8 source.
//!
//! A keep-alive sandbox (a session: one interpreter, several runs, state kept between
//! them) is announced by a first, empty record `SESSION 0\n` ([`session_boot_frame`]);
//! the `FILE` and `CODE` records that follow are the first run. After each run the runtime
//! flushes stdout and stderr, then writes on fd 3 the JSON-RPC notification
//! `{"jsonrpc":"2.0","method":"codebox/done","params":{"status":"ok"|"error"}}` (one line;
//! `error` when the run raised an uncaught exception, printed on stderr as the one-shot mode
//! prints it). Then it reads fd 3 line by line, ignoring anything that is not a
//! `codebox/run` notification (such as late responses to tool calls an earlier run
//! abandoned), until the next run arrives ([`session_run_message`]:
//! `{"jsonrpc":"2.0","method":"codebox/run","params":{"code":…,"files":{path: text}}}`).
//! Its files are written as `FILE` records are, then its code runs in the same interpreter
//! state. Tool calls during a run use fd 3 as in the one-shot mode. `sys.exit` /
//! `Deno.exit` end the process, and so the session; EOF on fd 3 while waiting ends it
//! with status 0.
//!
//! A one-shot run whose sandbox binds no host directory (nothing it leaves behind can be
//! seen afterwards) may start with an empty record `EPHEMERAL 0\n` ([`ephemeral`]): the
//! runtime then skips the interpreter's teardown once the program is over. It still does
//! what a caller can see of a normal exit — non-daemon threads are joined, exit handlers
//! run, stdout and stderr are flushed, the exit status is the same — and drops the rest
//! (freeing every object, closing files no one can read any more), which for Python is
//! several milliseconds of a `print(1)`.
//!
//! A record `VALUE 0\n` ([`with_value`]; the server sends it, `codebox run` does not) asks
//! for the value of a program's last expression, as a REPL shows it: when the program (or
//! a session's run) ends with an expression statement whose value is not `None` /
//! `undefined`, the runtime sends `{"jsonrpc":"2.0","method":"codebox/value","params":
//! {"repr":…}}` on fd 3 (Python's `repr`, Deno's `Deno.inspect`; at most 200,000
//! characters) before the program's exit or the run's `codebox/done`. Without it nobody
//! reads fd 3 past the frame, and a long line would block.
//!
//! Files travel inside the frame rather than through a host directory, so the host never
//! writes into a tree the sandbox can also write (no symlink races, no ownership to fix
//! up), and a pre-started sandbox can receive them with its code. The paths are validated
//! here, before anything is sent; the in-sandbox writer additionally refuses to follow
//! symlinks.

use std::collections::BTreeMap;

/// Most files one execution may bring.
pub const MAX_FILES: usize = 100;
/// Most bytes of file content one execution may bring, all files together, unless the
/// server says otherwise (`max_files_size`). An MCP message is at most 16 MiB, so a
/// client can send about 12 MiB of binary content as base64.
pub const MAX_FILES_BYTES: usize = 10 * 1024 * 1024;

/// Workspace files of one execution: relative path → content (any bytes).
pub type Files = BTreeMap<String, Vec<u8>>;
/// Longest relative path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// A file refused before the run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("{count} files given; at most {MAX_FILES} are allowed")]
    TooMany { count: usize },
    #[error("the files hold {size} bytes together; at most {limit} are allowed")]
    TooLarge { size: usize, limit: usize },
    #[error("file path {path:?} is invalid: {why}")]
    BadPath { path: String, why: &'static str },
    #[error("file path {path:?} is both a file and a directory of another file")]
    FileIsDirectory { path: String },
    #[error("file {path:?}: its base64 does not decode ({why})")]
    BadBase64 { path: String, why: String },
}

/// One file's content as a call gives it: text, or `{"base64": "..."}` for any bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, schemars::JsonSchema)]
#[serde(try_from = "serde_json::Value")]
pub enum FileContent {
    Text(String),
    Binary {
        /// The bytes in standard base64 (padding optional).
        base64: String,
    },
}

impl TryFrom<serde_json::Value> for FileContent {
    type Error = String;

    /// A string, or an object with one string `base64`; anything else in words the model
    /// can act on (serde's own "did not match any variant" would not say what is wanted).
    fn try_from(value: serde_json::Value) -> Result<FileContent, String> {
        match value {
            serde_json::Value::String(text) => Ok(FileContent::Text(text)),
            serde_json::Value::Object(map) if map.len() == 1 => match map.get("base64") {
                Some(serde_json::Value::String(b)) => Ok(FileContent::Binary { base64: b.clone() }),
                _ => Err(FILE_CONTENT_EXPECTED.into()),
            },
            _ => Err(FILE_CONTENT_EXPECTED.into()),
        }
    }
}

const FILE_CONTENT_EXPECTED: &str =
    "a file's content is expected as a string (text) or {\"base64\": \"...\"} (any bytes)";

/// The files of a call as bytes; invalid base64 is an error naming the file.
pub fn decode_files(given: BTreeMap<String, FileContent>) -> Result<Files, FileError> {
    use base64::Engine as _;
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    given
        .into_iter()
        .map(|(path, content)| {
            let bytes = match content {
                FileContent::Text(text) => text.into_bytes(),
                FileContent::Binary { base64 } => {
                    engine
                        .decode(base64.trim())
                        .map_err(|e| FileError::BadBase64 {
                            path: path.chars().take(120).collect(),
                            why: e.to_string(),
                        })?
                }
            };
            Ok((path, bytes))
        })
        .collect()
}

/// Checks files for the workspace: relative paths of plain components (no `.`, `..`,
/// empty component, NUL or control character), no path that is also another's
/// directory, at most [`MAX_FILES`] files and `max_bytes` of content.
pub fn validate_files(files: &Files, max_bytes: usize) -> Result<(), FileError> {
    if files.len() > MAX_FILES {
        return Err(FileError::TooMany { count: files.len() });
    }
    let size: usize = files.values().map(Vec::len).sum();
    if size > max_bytes {
        return Err(FileError::TooLarge {
            size,
            limit: max_bytes,
        });
    }
    for path in files.keys() {
        validate_path(path)?;
    }
    // BTreeMap order puts "a" right before its descendants "a/…" only when no sibling
    // sorts between them ("a-b" does), so check every prefix explicitly.
    for path in files.keys() {
        let mut prefix = String::new();
        for component in path.split('/') {
            if !prefix.is_empty() && files.contains_key(&prefix) {
                return Err(FileError::FileIsDirectory { path: prefix });
            }
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(component);
        }
    }
    Ok(())
}

/// Checks one path for the workspace (see [`validate_files`]).
pub fn validate_path(path: &str) -> Result<(), FileError> {
    let bad = |why| {
        Err(FileError::BadPath {
            path: path.chars().take(120).collect(),
            why,
        })
    };
    if path.is_empty() {
        return bad("it is empty");
    }
    if path.len() > MAX_PATH_BYTES {
        return bad("it is longer than 1024 bytes");
    }
    if path.starts_with('/') {
        return bad("it must be relative to /workspace");
    }
    if path.chars().any(char::is_control) {
        return bad("it contains a control character");
    }
    for component in path.split('/') {
        match component {
            "" => return bad("it has an empty component"),
            "." | ".." => return bad("it has a . or .. component"),
            c if c.len() > 255 => return bad("a component is longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

/// The boot frame for `code` with no files.
pub fn boot_frame(code: &str) -> Vec<u8> {
    boot_frame_with_files(code, &Files::new())
}

/// The boot frame for `code`, preceded by `files` (validate them first with
/// [`validate_files`]).
pub fn boot_frame_with_files(code: &str, files: &Files) -> Vec<u8> {
    let files_len: usize = files.iter().map(|(p, c)| p.len() + c.len() + 32).sum();
    let mut frame = Vec::with_capacity(code.len() + files_len + 16);
    for (path, content) in files {
        record(&mut frame, "FILE", &[path.as_bytes(), b"\0", content]);
    }
    record(&mut frame, "CODE", &[code.as_bytes()]);
    frame
}

/// The record that marks a one-shot run whose sandbox is discarded with everything in it.
pub const EPHEMERAL_RECORD: &[u8] = b"EPHEMERAL 0\n";

/// `frame` (a one-shot boot frame) for a sandbox that binds no host directory: the
/// runtime may skip its teardown after the program.
pub fn ephemeral(frame: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(EPHEMERAL_RECORD.len() + frame.len());
    out.extend_from_slice(EPHEMERAL_RECORD);
    out.extend_from_slice(&frame);
    out
}

/// The record that asks for the last expression's value.
pub const VALUE_RECORD: &[u8] = b"VALUE 0\n";
/// The notification that carries it.
pub const VALUE_METHOD: &str = "codebox/value";

/// `frame` (one-shot or a session's) with the [`VALUE_RECORD`]: after `SESSION`, which
/// must come first, otherwise in front.
pub fn with_value(frame: Vec<u8>) -> Vec<u8> {
    insert_record(frame, VALUE_RECORD)
}

/// The record that asks for the output files at the end of a run, with their limits and
/// the workspace files the call named: `OUTPUTS <n>\n<max_files> <max_bytes>\n` then one
/// path per line (paths hold no control character: [`validate_path`]). Not JSON: Python
/// would import its json module (milliseconds) for every run to read it.
pub const OUTPUTS_KIND: &str = "OUTPUTS";
/// A chunk of one output file: `{"path", "offset", "base64"}` (at most 1 MiB of bytes).
pub const FILE_METHOD: &str = "codebox/file";
/// After the chunks, when a file was skipped or left out: `{"skipped": [{"path", "why"}],
/// "omitted": n}`.
pub const FILES_METHOD: &str = "codebox/files";

/// `frame` (one-shot or a session's) with an OUTPUTS record (see [`OUTPUTS_KIND`]).
pub fn with_outputs(
    frame: Vec<u8>,
    limits: &crate::output::OutFilesLimits,
    paths: &[String],
) -> Vec<u8> {
    let mut spec = format!("{} {}\n", limits.max_files, limits.max_bytes);
    for path in paths {
        debug_assert!(validate_path(path).is_ok());
        spec.push_str(path);
        spec.push('\n');
    }
    let mut rec = Vec::with_capacity(spec.len() + 16);
    record(&mut rec, OUTPUTS_KIND, &[spec.as_bytes()]);
    insert_record(frame, &rec)
}

/// `frame` with `rec` after `SESSION`, which must come first, otherwise in front.
fn insert_record(frame: Vec<u8>, rec: &[u8]) -> Vec<u8> {
    let at = if frame.starts_with(SESSION_RECORD) {
        SESSION_RECORD.len()
    } else {
        0
    };
    let mut out = Vec::with_capacity(rec.len() + frame.len());
    out.extend_from_slice(&frame[..at]);
    out.extend_from_slice(rec);
    out.extend_from_slice(&frame[at..]);
    out
}

/// The record that opens a session's boot frame.
pub const SESSION_RECORD: &[u8] = b"SESSION 0\n";
/// The notification the supervisor sends to start a session's next run.
pub const RUN_METHOD: &str = "codebox/run";
/// The notification the runtime sends when a session's run has finished.
pub const DONE_METHOD: &str = "codebox/done";

/// The boot frame of a keep-alive session: the `SESSION` record, then `files` and `code`
/// (the first run) as in [`boot_frame_with_files`]. Validate the files first with
/// [`validate_files`].
pub fn session_boot_frame(code: &str, files: &Files) -> Vec<u8> {
    let mut frame = SESSION_RECORD.to_vec();
    frame.extend_from_slice(&boot_frame_with_files(code, files));
    frame
}

/// A session's next run: the `codebox/run` notification as one JSON line, newline
/// included. `files` (validated with [`validate_files`]) are written under `/workspace`
/// before `code` runs; the key is left out when there are none. `outputs`: the workspace
/// files the run returns besides `/workspace/out`'s (left out when empty).
pub fn session_run_message(code: &str, files: &Files, outputs: &[String]) -> Vec<u8> {
    use base64::Engine as _;
    let mut params = serde_json::Map::new();
    params.insert("code".into(), code.into());
    if !outputs.is_empty() {
        params.insert("outputs".into(), outputs.into());
    }
    if !files.is_empty() {
        // Text as a string, anything else as {"base64": ...} (the runtimes take both).
        let files = files
            .iter()
            .map(|(path, content)| {
                let value = match std::str::from_utf8(content) {
                    Ok(text) => text.into(),
                    Err(_) => serde_json::json!({
                        "base64": base64::engine::general_purpose::STANDARD.encode(content)
                    }),
                };
                (path.clone(), value)
            })
            .collect();
        params.insert("files".into(), serde_json::Value::Object(files));
    }
    let message = serde_json::json!({
        "jsonrpc": "2.0",
        "method": RUN_METHOD,
        "params": params,
    });
    let mut line = message.to_string().into_bytes();
    line.push(b'\n');
    line
}

fn record(frame: &mut Vec<u8>, kind: &str, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    frame.extend_from_slice(format!("{kind} {len}\n").as_bytes());
    for part in parts {
        frame.extend_from_slice(part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(entries: &[(&str, &str)]) -> Files {
        entries
            .iter()
            .map(|(p, c)| (p.to_string(), c.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn an_ephemeral_frame_starts_with_its_record() {
        let frame = ephemeral(boot_frame("print(1)"));
        assert_eq!(frame, b"EPHEMERAL 0\nCODE 8\nprint(1)".to_vec());
        assert_eq!(
            with_value(frame),
            b"VALUE 0\nEPHEMERAL 0\nCODE 8\nprint(1)".to_vec()
        );
        assert_eq!(
            with_value(session_boot_frame("1", &Files::new())),
            b"SESSION 0\nVALUE 0\nCODE 1\n1".to_vec()
        );
        let limits = crate::output::OutFilesLimits::default();
        let paths = ["a.csv".to_string(), "d/b c.txt".to_string()];
        assert_eq!(
            with_outputs(boot_frame("1"), &limits, &paths),
            b"OUTPUTS 28\n50 16777216\na.csv\nd/b c.txt\nCODE 1\n1".to_vec()
        );
    }

    #[test]
    fn frame_without_files_is_one_code_record() {
        assert_eq!(boot_frame("print(1)"), b"CODE 8\nprint(1)");
        assert_eq!(boot_frame("é"), "CODE 2\né".as_bytes());
    }

    #[test]
    fn files_come_first_in_path_order() {
        let f = files(&[("b/c.txt", "xy"), ("a.csv", "1,2\n")]);
        let frame = boot_frame_with_files("pass", &f);
        assert_eq!(
            frame,
            b"FILE 10\na.csv\x001,2\nFILE 10\nb/c.txt\0xyCODE 4\npass".as_slice()
        );
    }

    #[test]
    fn session_frame_starts_with_the_session_record() {
        assert_eq!(
            session_boot_frame("x = 1", &BTreeMap::new()),
            b"SESSION 0\nCODE 5\nx = 1".as_slice()
        );
        let f = files(&[("a.txt", "hi")]);
        let mut expected = b"SESSION 0\n".to_vec();
        expected.extend_from_slice(&boot_frame_with_files("pass", &f));
        assert_eq!(session_boot_frame("pass", &f), expected);
    }

    #[test]
    fn run_message_is_one_json_line() {
        let line = session_run_message("print(\"a\\nb\")\n", &BTreeMap::new(), &[]);
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let msg: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            msg,
            serde_json::json!({
                "jsonrpc": "2.0",
                "method": "codebox/run",
                "params": {"code": "print(\"a\\nb\")\n"},
            })
        );
        assert!(msg.get("id").is_none(), "a notification has no id");
    }

    #[test]
    fn run_message_carries_files() {
        let f = files(&[("dir/b.txt", "line\n\u{e9}"), ("a.csv", "1,2")]);
        let line = session_run_message("pass", &f, &[]);
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        let msg: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(msg["method"], RUN_METHOD);
        assert_eq!(msg["params"]["code"], "pass");
        assert_eq!(
            msg["params"]["files"],
            serde_json::json!({"a.csv": "1,2", "dir/b.txt": "line\n\u{e9}"})
        );
    }

    #[test]
    fn good_paths_pass() {
        let f = files(&[
            ("data.csv", ""),
            ("dir/sub/x.json", "{}"),
            ("a", "1"),
            ("a-b/c", "2"),
            (".hidden", "h"),
            ("ünïcode ok.txt", "u"),
        ]);
        assert_eq!(validate_files(&f, MAX_FILES_BYTES), Ok(()));
    }

    #[test]
    fn bad_paths_are_refused_with_the_reason() {
        for (path, why) in [
            ("", "empty"),
            ("/etc/passwd", "relative"),
            ("../x", ". or .."),
            ("a/../../x", ". or .."),
            ("./x", ". or .."),
            ("a//b", "empty component"),
            ("a/", "empty component"),
            ("a\nb", "control"),
            ("a\0b", "control"),
        ] {
            let err = validate_files(&files(&[(path, "x")]), MAX_FILES_BYTES).unwrap_err();
            assert!(err.to_string().contains(why), "{path:?}: {err}");
        }
        let long = "x".repeat(256);
        let err = validate_files(&files(&[(long.as_str(), "")]), MAX_FILES_BYTES).unwrap_err();
        assert!(err.to_string().contains("255"), "{err}");
        let longer = "a/".repeat(600);
        assert!(validate_files(&files(&[(longer.as_str(), "")]), MAX_FILES_BYTES).is_err());
    }

    #[test]
    fn a_file_cannot_also_be_a_directory() {
        let f = files(&[("a", "1"), ("a-b", "2"), ("a/c", "3")]);
        assert_eq!(
            validate_files(&f, MAX_FILES_BYTES),
            Err(FileError::FileIsDirectory { path: "a".into() })
        );
    }

    #[test]
    fn count_and_size_are_limited() {
        let many: Files = (0..=MAX_FILES)
            .map(|i| (format!("f{i}"), Vec::new()))
            .collect();
        assert_eq!(
            validate_files(&many, MAX_FILES_BYTES),
            Err(FileError::TooMany {
                count: MAX_FILES + 1
            })
        );
        let big = files(&[("a", &"x".repeat(MAX_FILES_BYTES)), ("b", "y")]);
        assert!(matches!(
            validate_files(&big, MAX_FILES_BYTES),
            Err(FileError::TooLarge { .. })
        ));
    }

    #[test]
    fn binary_files_travel_as_bytes_and_as_base64_in_a_session_message() {
        let mut f = files(&[("a.txt", "text")]);
        f.insert("b.bin".into(), vec![0, 255, 10, 0x80]);
        let frame = boot_frame_with_files("pass", &f);
        let expect = [
            b"FILE 10\na.txt\0text".as_slice(),
            b"FILE 10\nb.bin\0\x00\xff\n\x80",
        ]
        .concat();
        assert!(frame.starts_with(&expect), "{frame:?}");
        let line = session_run_message("pass", &f, &[]);
        let msg: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(msg["params"]["files"]["a.txt"], "text");
        assert_eq!(msg["params"]["files"]["b.bin"]["base64"], "AP8KgA==");
        let big = files(&[("a", "xx")]);
        assert_eq!(
            validate_files(&big, 1),
            Err(FileError::TooLarge { size: 2, limit: 1 })
        );
    }

    #[test]
    fn files_are_text_or_base64_and_bad_base64_names_the_file() {
        let given: BTreeMap<String, FileContent> = serde_json::from_value(serde_json::json!({
            "a.txt": "hi",
            "b.bin": {"base64": "AP8KgA=="},
            "c.bin": {"base64": "AP8KgA"},
        }))
        .unwrap();
        let f = decode_files(given).unwrap();
        assert_eq!(f["a.txt"], b"hi");
        assert_eq!(f["b.bin"], [0, 255, 10, 0x80]);
        assert_eq!(f["c.bin"], [0, 255, 10, 0x80]);
        let bad: BTreeMap<String, FileContent> =
            serde_json::from_value(serde_json::json!({"x.bin": {"base64": "not base64!"}}))
                .unwrap();
        let err = decode_files(bad).unwrap_err().to_string();
        assert!(err.contains("\"x.bin\"") && err.contains("base64"), "{err}");
        for bad in [
            serde_json::json!({"y": {"hex": "00"}}),
            serde_json::json!({"y": 5}),
            serde_json::json!({"y": {"base64": "AA==", "x": 1}}),
        ] {
            let err = serde_json::from_value::<BTreeMap<String, FileContent>>(bad)
                .unwrap_err()
                .to_string();
            assert!(err.contains("expected as a string (text) or"), "{err}");
        }
    }
}
