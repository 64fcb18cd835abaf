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

/// [`Passthrough`] with configured egress secrets replaced as the output streams (a
/// secret cut by a chunk boundary is held back until it can be told apart); what is held
/// at the end goes out with [`Redacting::finish`].
pub struct Redacting {
    stdout: codebox::egress::Redactor,
    stderr: codebox::egress::Redactor,
}

impl Redacting {
    pub fn new(secrets: &codebox::egress::Secrets) -> Redacting {
        Redacting {
            stdout: codebox::egress::Redactor::new(secrets.clone()),
            stderr: codebox::egress::Redactor::new(secrets.clone()),
        }
    }

    pub fn finish(mut self) {
        let (out, err) = (self.stdout.finish(), self.stderr.finish());
        Passthrough.stdout(&out);
        Passthrough.stderr(&err);
    }
}

impl OutputSink for Redacting {
    fn stdout(&mut self, chunk: &[u8]) {
        let out = self.stdout.push(chunk);
        Passthrough.stdout(&out);
    }
    fn stderr(&mut self, chunk: &[u8]) {
        let err = self.stderr.push(chunk);
        Passthrough.stderr(&err);
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
