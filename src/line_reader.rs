//! Reading newline-delimited messages with a size cap, for the JSON-RPC transports (stdio)
//! and the sandbox's tool channel (fd 3): a peer that never sends a newline cannot make
//! the reader buffer without bound.

use tokio::io::AsyncBufRead;
use tokio::io::AsyncBufReadExt;

/// Reads one `\n`-terminated line into `line` (without the newline), keeping at most
/// `cap` bytes; returns `None` at EOF, `Some(true)` when the line was longer than `cap`
/// (the rest is consumed and dropped).
pub async fn read_line_capped<R: AsyncBufRead + Unpin>(
    input: &mut R,
    line: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<Option<bool>> {
    let mut too_long = false;
    let mut seen_any = false;
    loop {
        let buf = input.fill_buf().await?;
        if buf.is_empty() {
            return Ok(seen_any.then_some(too_long));
        }
        seen_any = true;
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if line.len() + chunk.len() > cap {
            too_long = true;
            line.clear();
        } else if !too_long {
            line.extend_from_slice(chunk);
        }
        let used = done.unwrap_or(buf.len());
        input.consume(used);
        if done.is_some() {
            return Ok(Some(too_long));
        }
    }
}
