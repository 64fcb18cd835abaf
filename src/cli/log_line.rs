//! Log lines of bounded length: whatever an event carries (a client's method name, a
//! whole message rmcp logs at debug level), one line on stderr is at most
//! [`MAX_LINE_BYTES`], cut with a marker saying how much was left out.

use std::io::Write;

/// Longest log line written.
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// stderr, one formatted event per `write` (as tracing-subscriber's fmt layer writes).
pub struct BoundedStderr;

impl Write for BoundedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        write_bounded(&mut err, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Writes `buf` to `out`, cut at [`MAX_LINE_BYTES`] (keeping its final newline).
fn write_bounded(out: &mut impl Write, buf: &[u8]) -> std::io::Result<()> {
    if buf.len() <= MAX_LINE_BYTES {
        return out.write_all(buf);
    }
    let mut end = MAX_LINE_BYTES;
    // Do not split a UTF-8 sequence.
    while end > 0 && (buf[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    out.write_all(&buf[..end])?;
    let newline = if buf.ends_with(b"\n") { "\n" } else { "" };
    write!(out, "…[{} more bytes]{newline}", buf.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_and_short_ones_kept() {
        let mut out = Vec::new();
        write_bounded(&mut out, b"short\n").unwrap();
        assert_eq!(out, b"short\n");
        let mut long = "é".repeat(MAX_LINE_BYTES).into_bytes();
        long.push(b'\n');
        let mut out = Vec::new();
        write_bounded(&mut out, &long).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.len() < MAX_LINE_BYTES + 40, "{}", text.len());
        assert!(
            text.ends_with("more bytes]\n"),
            "{}",
            &text[text.len() - 30..]
        );
    }
}
