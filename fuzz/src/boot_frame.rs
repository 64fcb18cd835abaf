//! The files and code a client gives an execution, as the boot frame carries them to the
//! sandbox (`codebox::runtime::boot`), and as a session's `codebox/run` message does.
//!
//! Input: structured (`arbitrary`): code, files as text, base64 or bytes, the frame's
//! flags, and the output paths asked for.
//!
//! Properties:
//! - `decode_files` gives back the bytes a client encoded, and refuses bad base64;
//! - `validate_files` accepts only relative paths of plain components, without control
//!   characters, none of them another's directory (checked here independently);
//! - the frame decodes, by its specification (the module docs of `runtime::boot`, which
//!   `boot.py` and `boot.js` implement), into exactly the records put in: the flags in
//!   their places, every file with its path and bytes, the output paths, and the code
//!   last; no path or content can forge a record;
//! - a session's `codebox/run` message is one JSON line carrying the same code, files
//!   and output paths.

use std::collections::BTreeMap;

use arbitrary::{Arbitrary, Unstructured};
use base64::Engine as _;
use codebox::output::OutFilesLimits;
use codebox::runtime::boot::{self, FileContent, Files};
use serde_json::Value;

#[derive(Arbitrary, Debug)]
enum Given {
    Text(String),
    Base64(String),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Call {
    code: String,
    files: Vec<(String, Given)>,
    session: bool,
    ephemeral: bool,
    value: bool,
    outputs: Option<(u8, u16, Vec<String>)>,
}

pub fn run(data: &[u8]) {
    let Ok(call) = Call::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let mut given = BTreeMap::new();
    let mut sent_bytes = BTreeMap::new();
    for (path, content) in call.files {
        // A later file of the same path replaces an earlier one.
        sent_bytes.remove(&path);
        let content = match content {
            Given::Text(t) => FileContent::Text(t),
            Given::Base64(b) => FileContent::Binary { base64: b },
            Given::Bytes(bytes) => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(&bytes);
                sent_bytes.insert(path.clone(), bytes);
                FileContent::Binary { base64: encoded }
            }
        };
        given.insert(path, content);
    }
    let files = match boot::decode_files(given) {
        Ok(files) => files,
        Err(e) => {
            assert!(matches!(e, boot::FileError::BadBase64 { .. }), "{e}");
            assert!(e.to_string().len() < 1024, "a long error: {e}");
            return;
        }
    };
    for (path, bytes) in &sent_bytes {
        assert_eq!(
            &files[path], bytes,
            "base64 did not round-trip for {path:?}"
        );
    }
    if let Err(e) = boot::validate_files(&files, boot::MAX_FILES_BYTES) {
        assert!(e.to_string().len() < 1024, "a long error: {e}");
        return;
    }
    for path in files.keys() {
        assert_plain(path);
        let mut prefix = String::new();
        for component in path.split('/') {
            if !prefix.is_empty() {
                assert!(
                    !files.contains_key(&prefix),
                    "{prefix:?} is a file and a directory"
                );
                prefix.push('/');
            }
            prefix.push_str(component);
        }
    }
    let outputs = call.outputs.map(|(max_files, max_bytes, paths)| {
        let limits = OutFilesLimits {
            max_files: usize::from(max_files),
            max_bytes: usize::from(max_bytes),
            ..OutFilesLimits::default()
        };
        let paths: Vec<String> = paths
            .into_iter()
            .filter(|p| boot::validate_path(p).is_ok())
            .collect();
        (limits, paths)
    });

    let mut frame = match call.session {
        true => boot::session_boot_frame(&call.code, &files),
        false => boot::boot_frame_with_files(&call.code, &files),
    };
    let ephemeral = call.ephemeral && !call.session;
    if ephemeral {
        frame = boot::ephemeral(frame);
    }
    if call.value {
        frame = boot::with_value(frame);
    }
    if let Some((limits, paths)) = &outputs {
        frame = boot::with_outputs(frame, limits, paths);
    }
    let decoded = decode(&frame).unwrap_or_else(|e| panic!("the frame does not decode: {e}"));
    assert_eq!(decoded.session, call.session, "SESSION");
    assert_eq!(decoded.ephemeral, ephemeral, "EPHEMERAL");
    assert_eq!(decoded.value, call.value, "VALUE");
    assert_eq!(decoded.code, call.code.as_bytes(), "CODE");
    assert_eq!(decoded.files, files, "FILE records");
    let want_outputs = outputs
        .as_ref()
        .map(|(l, p)| (l.max_files, l.max_bytes, p.clone()));
    assert_eq!(decoded.outputs, want_outputs, "OUTPUTS");

    let paths = outputs.map(|(_, p)| p).unwrap_or_default();
    check_run_message(&call.code, &files, &paths);
}

/// A path the workspace takes, checked without `validate_path`.
fn assert_plain(path: &str) {
    assert!(
        !path.is_empty() && path.len() <= boot::MAX_PATH_BYTES,
        "{path:?}"
    );
    assert!(!path.starts_with('/'), "absolute: {path:?}");
    assert!(
        !path.chars().any(char::is_control),
        "control character: {path:?}"
    );
    assert!(!path.contains('\0'));
    for c in path.split('/') {
        assert!(!matches!(c, "" | "." | ".."), "component {c:?} in {path:?}");
    }
}

#[derive(Debug, Default)]
struct Decoded {
    session: bool,
    ephemeral: bool,
    value: bool,
    outputs: Option<(usize, usize, Vec<String>)>,
    files: Files,
    code: Vec<u8>,
}

/// The boot frame's specification: records `<KIND> <n>\n` + n bytes; `SESSION` only
/// first; flags and `OUTPUTS` at most once; `FILE` records `path\0content`; `CODE` once
/// and last, with nothing after it.
fn decode(mut frame: &[u8]) -> Result<Decoded, String> {
    let mut out = Decoded::default();
    let mut first = true;
    loop {
        let nl = frame
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("a header without a newline")?;
        if nl > 64 {
            return Err("a header longer than the runtimes read".into());
        }
        let header = std::str::from_utf8(&frame[..nl]).map_err(|_| "header not UTF-8")?;
        let (kind, size) = header.split_once(' ').ok_or("header without a size")?;
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("bad size in {header:?}"));
        }
        let size: usize = size.parse().map_err(|_| "size overflows")?;
        let body = frame.get(nl + 1..nl + 1 + size).ok_or("record cut short")?;
        frame = &frame[nl + 1 + size..];
        let once = |seen: bool| {
            if seen {
                Err(format!("{kind} twice"))
            } else {
                Ok(true)
            }
        };
        match kind {
            "SESSION" if first && size == 0 => out.session = true,
            "EPHEMERAL" if size == 0 => out.ephemeral = once(out.ephemeral)?,
            "VALUE" if size == 0 => out.value = once(out.value)?,
            "OUTPUTS" if out.outputs.is_none() => {
                let text = std::str::from_utf8(body).map_err(|_| "OUTPUTS not UTF-8")?;
                let (head, rest) = text.split_once('\n').ok_or("OUTPUTS without limits")?;
                let (files, bytes) = head.split_once(' ').ok_or("OUTPUTS limits")?;
                let paths = rest.split('\n').filter(|p| !p.is_empty()).map(String::from);
                out.outputs = Some((
                    files.parse().map_err(|_| "max_files")?,
                    bytes.parse().map_err(|_| "max_bytes")?,
                    paths.collect(),
                ));
            }
            "FILE" => {
                let nul = body
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or("FILE without NUL")?;
                let path = std::str::from_utf8(&body[..nul]).map_err(|_| "path not UTF-8")?;
                if out
                    .files
                    .insert(path.to_string(), body[nul + 1..].to_vec())
                    .is_some()
                {
                    return Err(format!("FILE {path:?} twice"));
                }
            }
            "CODE" => {
                if !frame.is_empty() {
                    return Err("bytes after CODE".into());
                }
                out.code = body.to_vec();
                return Ok(out);
            }
            _ => return Err(format!("unexpected record {header:?}")),
        }
        first = false;
    }
}

fn check_run_message(code: &str, files: &Files, outputs: &[String]) {
    let line = boot::session_run_message(code, files, outputs);
    assert_eq!(line.last(), Some(&b'\n'));
    assert!(
        !line[..line.len() - 1].contains(&b'\n'),
        "codebox/run is more than one line"
    );
    let message: Value = serde_json::from_slice(&line).expect("codebox/run is JSON");
    assert_eq!(message["method"], boot::RUN_METHOD);
    let params = &message["params"];
    assert_eq!(params["code"], code);
    let sent: Vec<String> = match params.get("outputs") {
        Some(v) => serde_json::from_value(v.clone()).expect("outputs are strings"),
        None => Vec::new(),
    };
    assert_eq!(sent, outputs);
    let mut got = Files::new();
    if let Some(map) = params.get("files").and_then(Value::as_object) {
        for (path, value) in map {
            let bytes = match value {
                Value::String(t) => t.as_bytes().to_vec(),
                v => base64::engine::general_purpose::STANDARD
                    .decode(v["base64"].as_str().expect("base64 string"))
                    .expect("base64 decodes"),
            };
            got.insert(path.clone(), bytes);
        }
    } else {
        assert!(params.get("files").is_none(), "files is not an object");
    }
    assert_eq!(&got, files, "codebox/run files");
}
