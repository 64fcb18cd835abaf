//! Streaming a sandboxed program's output to ours, and the exit status we end with.

use std::io::Write;

use codebox::sandbox::OutputSink;

/// Exit status after a timeout, as timeout(1) uses.
pub const EXIT_TIMED_OUT: u8 = 124;

/// Streams the program's output to ours as it arrives (the part within the caps).
pub struct Passthrough;

impl OutputSink for Passthrough {
    fn stdout(&mut self, chunk: &[u8]) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(chunk).and_then(|_| out.flush());
    }
    fn stderr(&mut self, chunk: &[u8]) {
        let _ = std::io::stderr().lock().write_all(chunk);
    }
}

/// The shell convention: the program's exit code, 128 + signal, 124 on timeout, 125 when
/// there is no status at all.
pub fn exit_status(timed_out: bool, exit_code: Option<i32>, signal: Option<i32>) -> u8 {
    if timed_out {
        return EXIT_TIMED_OUT;
    }
    match (exit_code, signal) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => (128 + sig).clamp(0, 255) as u8,
        (None, None) => super::EXIT_CODEBOX_FAILED,
    }
}
