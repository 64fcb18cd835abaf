//! The stdio transport, with JSON-RPC framing errors answered instead of dropped.
//!
//! rmcp's stdio transport silently skips a line that is not JSON (or not UTF-8, or
//! nested too deep), so a client that sent one waits forever. This guard sits between
//! the real stdin/stdout and rmcp: every line from stdin goes through
//! [`framing::check`](crate::server::transport::framing::check) (size, UTF-8, JSON, depth, the JSON-RPC
//! shape, params of known methods); a line that fails is answered with its JSON-RPC
//! error (with the request's id when it can be read; a refused notification gets no
//! answer, as JSON-RPC asks) and the session goes on. Everything rmcp
//! writes and every such error reach stdout through one writer task, a whole line at a
//! time, so messages never interleave.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::line_reader::read_line_capped;
use crate::server::transport::framing::{check, Refusal, MAX_MESSAGE_BYTES, PARSE_ERROR};

/// In-memory pipe capacity between the guard and rmcp.
const PIPE_BYTES: usize = 256 * 1024;

/// Error answers waiting for stdout: when the client does not read them, the guard stops
/// reading its input (as rmcp does with its own answers) rather than queue them all.
const QUEUED_ERRORS: usize = 64;

/// Guards the process's stdin and stdout; returns the (reader, writer) pair to give rmcp.
pub fn stdio() -> (
    impl AsyncRead + Send + Unpin,
    impl AsyncWrite + Send + Unpin,
) {
    guard(tokio::io::stdin(), tokio::io::stdout())
}

/// Guards any line-oriented input and output (see the module docs).
pub fn guard<R, W>(input: R, output: W) -> (tokio::io::DuplexStream, tokio::io::DuplexStream)
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let (rmcp_in, to_rmcp) = tokio::io::duplex(PIPE_BYTES);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(PIPE_BYTES);
    let (errors_tx, errors_rx) = mpsc::channel(QUEUED_ERRORS);
    tokio::spawn(read_input(BufReader::new(input), to_rmcp, errors_tx));
    tokio::spawn(write_output(BufReader::new(from_rmcp), output, errors_rx));
    (rmcp_in, rmcp_out)
}

/// Forwards well-formed lines to rmcp; turns the others into parse errors.
async fn read_input<R: AsyncBufRead + Unpin>(
    mut input: R,
    mut to_rmcp: tokio::io::DuplexStream,
    errors: mpsc::Sender<String>,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        let too_long = match read_line_capped(&mut input, &mut line, MAX_MESSAGE_BYTES).await {
            Ok(None) => break,
            Ok(Some(too_long)) => too_long,
            Err(e) => {
                tracing::warn!(error = %e, "reading stdin failed; ending the session");
                break;
            }
        };
        // rmcp takes a line that starts with a UTF-8 byte order mark (some Windows tools
        // write one); the parser here does not, so it goes before the check.
        if line.starts_with(b"\xef\xbb\xbf") {
            line.drain(..3);
        }
        let checked = if too_long {
            Err(Refusal {
                code: PARSE_ERROR,
                id: serde_json::Value::Null,
                message: crate::server::transport::framing::too_large(),
                notification: false,
            })
        } else {
            check(&line)
        };
        match checked {
            Ok(()) if crate::server::transport::framing::is_blank(&line) => {}
            Ok(()) => {
                line.push(b'\n');
                if to_rmcp.write_all(&line).await.is_err() {
                    break;
                }
            }
            Err(refusal) => {
                tracing::warn!(
                    code = refusal.code,
                    why = %refusal.message,
                    bytes = line.len(),
                    "malformed JSON-RPC message on stdin"
                );
                if !refusal.notification
                    && errors.send(refusal.to_json().to_string()).await.is_err()
                {
                    break;
                }
            }
        }
    }
    // EOF: rmcp sees its input end and closes the session.
    let _ = to_rmcp.shutdown().await;
}

/// Copies rmcp's output lines and the guard's errors to `output`, a line at a time.
async fn write_output<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    mut from_rmcp: R,
    mut output: W,
    mut errors: mpsc::Receiver<String>,
) {
    let mut line = Vec::new();
    let mut errors_open = true;
    loop {
        tokio::select! {
            read = from_rmcp.read_until(b'\n', &mut line) => {
                match read {
                    Ok(0) | Err(_) => {
                        // Answers already queued still go out: `select!` may see rmcp's
                        // end before the answer to the last bad line.
                        while let Ok(mut e) = errors.try_recv() {
                            e.push('\n');
                            if output.write_all(e.as_bytes()).await.is_err() {
                                break;
                            }
                        }
                        break;
                    }
                    Ok(_) => {
                        if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                            break;
                        }
                        line.clear();
                    }
                }
            }
            error = errors.recv(), if errors_open => match error {
                Some(mut e) => {
                    e.push('\n');
                    if output.write_all(e.as_bytes()).await.is_err() || output.flush().await.is_err() {
                        break;
                    }
                }
                None => errors_open = false,
            },
        }
    }
    let _ = output.flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn through_guard(input: &[u8]) -> (Vec<String>, Vec<String>) {
        let (client_end, server_in) = tokio::io::duplex(1 << 20);
        let (server_out, mut client_read) = tokio::io::duplex(1 << 20);
        let (mut rmcp_in, mut rmcp_out) = guard(server_in, server_out);
        let mut client_end = client_end;
        client_end.write_all(input).await.unwrap();
        drop(client_end);
        let mut forwarded = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut rmcp_in, &mut forwarded)
            .await
            .unwrap();
        rmcp_out.write_all(b"{\"from\":\"rmcp\"}\n").await.unwrap();
        drop(rmcp_out);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client_read, &mut out)
            .await
            .unwrap();
        (
            forwarded.lines().map(str::to_string).collect(),
            out.lines().map(str::to_string).collect(),
        )
    }

    #[tokio::test]
    async fn good_lines_pass_bad_lines_get_parse_errors() {
        let input = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n\
                      {\"jsonrpc\": \"2.0\", \"id\": 2, \"method\": \n\
                      \xff\xfe{}\n\
                      \n\
                      [1,2]\n";
        let (forwarded, out) = through_guard(input).await;
        assert_eq!(
            forwarded,
            ["{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"]
        );
        assert_eq!(out.len(), 4, "{out:?}");
        assert!(out.iter().any(|l| l.contains("-32600")), "{out:?}");
        let errors: Vec<serde_json::Value> = out
            .iter()
            .filter(|l| l.contains("-32700"))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(errors.len(), 2, "{out:?}");
        assert!(errors.iter().all(|e| e["id"].is_null()));
        assert!(errors[0]["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Parse error: EOF"));
        assert!(errors[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not UTF-8"));
        assert!(out.iter().any(|l| l == "{\"from\":\"rmcp\"}"));
    }

    #[tokio::test]
    async fn deep_nesting_and_bad_params_are_answered_with_the_id() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let input = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{{\"name\":\"x\",\"arguments\":{{\"a\":{deep}}}}}}}\n\
             {{\"jsonrpc\":\"2.0\",\"id\":\"r2\",\"method\":\"tools/list\",\"params\":[]}}\n\
             {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\",\"params\":3}}\n"
        );
        let (forwarded, out) = through_guard(input.as_bytes()).await;
        assert!(forwarded.is_empty(), "{forwarded:?}");
        let answers: Vec<serde_json::Value> = out
            .iter()
            .filter(|l| l.contains("error"))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // The notification gets no answer.
        assert_eq!(answers.len(), 2, "{out:?}");
        assert_eq!(answers[0]["error"]["code"], -32700);
        assert_eq!(answers[0]["id"], 1);
        assert_eq!(answers[1]["error"]["code"], -32602);
        assert_eq!(answers[1]["id"], "r2");
    }

    /// rmcp reads a line after a byte order mark; so does the guard, instead of
    /// answering it with a parse error.
    #[tokio::test]
    async fn a_byte_order_mark_is_not_a_parse_error() {
        let (forwarded, out) =
            through_guard(b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
                .await;
        assert_eq!(
            forwarded,
            ["{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"]
        );
        assert_eq!(out, ["{\"from\":\"rmcp\"}"], "{out:?}");
    }

    /// A client that sends bad lines and never reads stdout: the guard stops reading
    /// its input once a few answers wait, instead of queuing an answer per line.
    #[tokio::test]
    async fn unread_error_answers_hold_the_input_back() {
        let (mut client_end, server_in) = tokio::io::duplex(64 * 1024);
        let (server_out, _never_read) = tokio::io::duplex(1024);
        let (_rmcp_in, _rmcp_out) = guard(server_in, server_out);
        // 120 KB: twice the input pipe, far more than the answers that may wait.
        let bad = "x\n".repeat(60_000);
        let wrote = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client_end.write_all(bad.as_bytes()),
        )
        .await;
        assert!(
            wrote.is_err(),
            "every bad line was taken in, its answer queued"
        );
    }

    #[tokio::test]
    async fn oversized_lines_are_refused_and_the_next_line_still_passes() {
        let mut input = vec![b'"'];
        input.extend(std::iter::repeat_n(b'x', MAX_MESSAGE_BYTES + 10));
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let last = br#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
        input.extend_from_slice(b"\"\n");
        input.extend_from_slice(ping);
        input.push(b'\n');
        input.extend_from_slice(last);
        let (forwarded, out) = through_guard(&input).await;
        assert_eq!(
            forwarded,
            [
                std::str::from_utf8(ping).unwrap(),
                std::str::from_utf8(last).unwrap()
            ]
        );
        assert!(out.iter().any(|l| l.contains("larger than")), "{out:?}");
    }
}
