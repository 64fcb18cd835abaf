//! The stdio transport's guard (`codebox::server::transport::stdio_guard::guard`): client lines in,
//! well-formed ones on to rmcp, JSON-RPC errors for the rest.
//!
//! Input: the bytes a client writes on stdin.
//!
//! Properties:
//! - exactly the lines that pass the check reach rmcp, whole, in order (a byte order
//!   mark removed, blank lines skipped);
//! - every other line that is not a notification is answered, in order, and an answer
//!   to a line with a readable id carries that id;
//! - the guard ends when its input does (no line is lost or held).

use codebox::server::transport::framing::{self, MAX_MESSAGE_BYTES};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{block_on, oracle};

pub fn run(data: &[u8]) {
    let (forwarded, answers) = block_on(through_guard(data));
    let (mut want_forwarded, mut want_answers) = (Vec::new(), Vec::new());
    for line in lines(data) {
        let line = line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(line);
        if line.len() > MAX_MESSAGE_BYTES {
            want_answers.push(None);
            continue;
        }
        match framing::check(line) {
            Ok(()) if framing::is_blank(line) => {}
            Ok(()) => want_forwarded.push(line.to_vec()),
            Err(r) if r.notification => {}
            Err(_) => want_answers.push(oracle::readable_id(line, framing::MAX_ID_BYTES)),
        }
    }
    assert_eq!(
        forwarded.len(),
        want_forwarded.len(),
        "lines forwarded to rmcp"
    );
    for (got, want) in forwarded.iter().zip(&want_forwarded) {
        assert_eq!(got, want, "a forwarded line changed");
    }
    assert_eq!(
        answers.len(),
        want_answers.len(),
        "error answers: {answers:?}"
    );
    for (answer, id) in answers.iter().zip(&want_answers) {
        let answer: Value = serde_json::from_slice(answer).expect("an answer is JSON");
        assert_eq!(answer["jsonrpc"], "2.0");
        assert!(answer["error"]["code"].is_i64(), "{answer}");
        if let Some(id) = id {
            assert_eq!(&answer["id"], id, "answer with the wrong id");
        }
    }
}

/// `data` as `read_line_capped` splits it: on `\n`, a last line without one included.
fn lines(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut parts: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    if data.is_empty() || data.ends_with(b"\n") {
        parts.pop();
    }
    parts.into_iter()
}

/// The lines the guard forwarded to rmcp and the lines it wrote to stdout.
async fn through_guard(input: &[u8]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let capacity = input.len() + 1024;
    let (mut client_end, server_in) = tokio::io::duplex(capacity);
    let (server_out, mut client_read) = tokio::io::duplex(capacity * 4 + 64 * 1024);
    let (mut rmcp_in, rmcp_out) =
        codebox::server::transport::stdio_guard::guard(server_in, server_out);
    client_end.write_all(input).await.expect("write stdin");
    drop(client_end);
    // stdout is read while rmcp's side is: answers must not wait for room.
    let rmcp = async move {
        let mut forwarded = Vec::new();
        rmcp_in
            .read_to_end(&mut forwarded)
            .await
            .expect("read rmcp's input");
        // rmcp ends once its input has (and only then, so every answer is queued).
        drop(rmcp_out);
        forwarded
    };
    let stdout = async move {
        let mut out = Vec::new();
        client_read
            .read_to_end(&mut out)
            .await
            .expect("read stdout");
        out
    };
    let (forwarded, out) = tokio::join!(rmcp, stdout);
    (split_lines(&forwarded), split_lines(&out))
}

fn split_lines(bytes: &[u8]) -> Vec<Vec<u8>> {
    assert!(
        bytes.is_empty() || bytes.ends_with(b"\n"),
        "output ends in the middle of a line"
    );
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}
