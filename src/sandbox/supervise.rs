//! Supervising a running sandbox: feed fd 3, drain stdout/stderr with byte caps, enforce
//! the wall-clock timeout, and collect how the program ended.
//!
//! A single `poll(2)` loop over the output pipes, the init's pidfd and (while input is
//! pending) the channel; no threads, so it also runs in the single-threaded CLI.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::cgroup::CgroupStats;
use super::error::{Error, Result};
use super::landlock::LandlockStatus;
use super::report::ProgramStatus;
use super::spec::Limits;
use super::Sandbox;
use crate::sandbox::child::fds;

/// The most of a stream's end that is kept: a program's last lines (a summary, a
/// traceback) matter most. A stream's cap is shared: its last quarter (at most this) is
/// for the end, the rest for the head, so no more than the cap is ever kept.
pub const TAIL_BYTES: usize = 64 * 1024;

/// Output of one stream within its cap: the head, the end, and the true total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The head: up to the cap less the tail's room.
    pub bytes: Vec<u8>,
    /// What came after `bytes`, of which the last `tail_room` bytes are kept (up to
    /// twice that while the stream runs).
    pub tail: Vec<u8>,
    pub tail_room: usize,
    pub total_bytes: u64,
    /// Some of the stream between `bytes` and `tail` was not kept.
    pub truncated: bool,
}

impl Captured {
    /// Keeps the head and the end of the stream within `cap` bytes together; returns
    /// the part kept in the head (what is streamed as it comes).
    pub fn push<'a>(&mut self, chunk: &'a [u8], cap: usize) -> &'a [u8] {
        self.total_bytes += chunk.len() as u64;
        self.tail_room = (cap / 4).min(TAIL_BYTES);
        let head_cap = cap - self.tail_room;
        let room = head_cap.saturating_sub(self.bytes.len());
        let (kept, rest) = chunk.split_at(chunk.len().min(room));
        self.bytes.extend_from_slice(kept);
        if !rest.is_empty() {
            let rest = &rest[rest.len().saturating_sub(self.tail_room)..];
            self.tail.extend_from_slice(rest);
            if self.tail.len() > 2 * self.tail_room {
                self.tail.drain(..self.tail.len() - self.tail_room);
            }
            self.truncated = self.left_out() > 0;
        }
        kept
    }

    /// The kept end: the last `tail_room` bytes after the head.
    fn kept_tail(&self) -> &[u8] {
        &self.tail[self.tail.len().saturating_sub(self.tail_room)..]
    }

    /// Bytes of the stream kept neither in the head nor in the end.
    pub fn left_out(&self) -> u64 {
        self.total_bytes
            .saturating_sub((self.bytes.len() + self.kept_tail().len()) as u64)
    }

    /// The stream as text: the head, then (when bytes were left out) a marker and the
    /// end; bytes that are not UTF-8 become U+FFFD.
    pub fn text(&self, stream: &str) -> String {
        let tail = self.kept_tail();
        let left_out = self.left_out();
        if left_out == 0 {
            let mut all = self.bytes.clone();
            all.extend_from_slice(tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        // The end starts wherever the gap ended: skip a partial character.
        let start = tail
            .iter()
            .position(|b| b & 0xC0 != 0x80)
            .unwrap_or(tail.len());
        format!(
            "{}\n[codebox: {left_out} bytes of {stream} were not kept here: the first {} and the last {} bytes are]\n{}",
            String::from_utf8_lossy(&self.bytes),
            self.bytes.len(),
            tail.len() - start,
            String::from_utf8_lossy(&tail[start..])
        )
    }
}

/// Receives output as it arrives (only the part within the caps).
pub trait OutputSink {
    fn stdout(&mut self, _chunk: &[u8]) {}
    fn stderr(&mut self, _chunk: &[u8]) {}
}

/// A sink that only captures.
pub struct Discard;
impl OutputSink for Discard {}

/// How a sandboxed run ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The program's status as reported by the init; `None` when the sandbox was killed
    /// before the program ended (timeout).
    pub status: Option<ProgramStatus>,
    pub timed_out: bool,
    pub stdout: Captured,
    pub stderr: Captured,
    /// From the program's exec to the end of the sandbox.
    pub duration: Duration,
    /// What landlock enforced for the program.
    pub landlock: Option<LandlockStatus>,
    /// Figures from the sandbox's cgroup (`None` without cgroups).
    pub cgroup: Option<CgroupStats>,
}

impl Outcome {
    pub fn exit_code(&self) -> Option<i32> {
        match self.status {
            Some(ProgramStatus::Exited(c)) => Some(c),
            _ => None,
        }
    }

    pub fn signal(&self) -> Option<i32> {
        match self.status {
            Some(ProgramStatus::Signaled(s)) => Some(s),
            None if self.timed_out => Some(libc::SIGKILL),
            _ => None,
        }
    }
}

const CHUNK: usize = 64 * 1024;

impl Sandbox {
    /// Writes `input` to the program's fd 3, drains its output and waits for the end of
    /// the whole sandbox, killing it at `limits.timeout`.
    pub fn run_to_completion(
        self,
        input: &[u8],
        limits: &Limits,
        sink: &mut dyn OutputSink,
    ) -> Result<Outcome> {
        let io = |doing| move |e: std::io::Error| Error::Io { doing, source: e };
        for fd in [
            self.io.stdout.as_fd(),
            self.io.stderr.as_fd(),
            self.io.channel.as_fd(),
        ] {
            fds::set_nonblocking(fd, true).map_err(io("setting up the output pipes"))?;
        }
        let deadline = self.started + limits.timeout;
        // The init ends the sandbox a little after our timer would, should we not.
        if let Err(e) = self
            .watch
            .arm(super::lifeline::run_deadline(limits.timeout))
        {
            tracing::warn!(?e, "arming the sandbox's own deadline failed");
        }
        let mut stdout = Captured::default();
        let mut stderr = Captured::default();
        let (mut out_open, mut err_open, mut exited) = (true, true, false);
        let mut input = input;
        let mut timed_out = false;
        let mut buf = vec![0u8; CHUNK];

        while out_open || err_open || !exited {
            let now = Instant::now();
            if !timed_out && !exited && now >= deadline {
                tracing::debug!(
                    pid = self.watch.pid().as_raw(),
                    "timeout: killing the sandbox"
                );
                self.watch.kill()?;
                timed_out = true;
            }
            let wait = if exited || timed_out {
                PollTimeout::NONE
            } else {
                poll_timeout(deadline - now)
            };

            let mut pfds = Vec::with_capacity(4);
            let mut roles = Vec::with_capacity(4);
            if out_open {
                pfds.push(PollFd::new(self.io.stdout.as_fd(), PollFlags::POLLIN));
                roles.push(Role::Stdout);
            }
            if err_open {
                pfds.push(PollFd::new(self.io.stderr.as_fd(), PollFlags::POLLIN));
                roles.push(Role::Stderr);
            }
            if !exited {
                pfds.push(PollFd::new(self.watch.pidfd(), PollFlags::POLLIN));
                roles.push(Role::Exit);
            }
            if !input.is_empty() {
                pfds.push(PollFd::new(self.io.channel.as_fd(), PollFlags::POLLOUT));
                roles.push(Role::Input);
            }
            match poll(&mut pfds, wait) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io("polling the sandbox")(e.into())),
            }
            let ready: Vec<(Role, bool)> = pfds
                .iter()
                .zip(&roles)
                .map(|(p, r)| (*r, p.revents().is_some_and(|ev| !ev.is_empty())))
                .collect();
            drop(pfds);
            for (role, is_ready) in ready {
                if !is_ready {
                    continue;
                }
                match role {
                    Role::Stdout => {
                        out_open = drain(self.io.stdout.as_fd(), &mut buf, |c| {
                            sink.stdout(stdout.push(c, limits.stdout_cap))
                        })
                        .map_err(io("reading stdout"))?
                    }
                    Role::Stderr => {
                        err_open = drain(self.io.stderr.as_fd(), &mut buf, |c| {
                            sink.stderr(stderr.push(c, limits.stderr_cap))
                        })
                        .map_err(io("reading stderr"))?
                    }
                    Role::Exit => exited = true,
                    Role::Input => match nix::unistd::write(self.io.channel.as_fd(), input) {
                        Ok(n) => input = &input[n..],
                        Err(nix::errno::Errno::EAGAIN) => {}
                        // The program closed fd 3 or is gone: nobody will read the rest.
                        Err(_) => input = &[],
                    },
                }
            }
        }
        let duration = self.started.elapsed();
        let landlock = self.io.landlock;
        let ending = self.watch.finish()?;
        tracing::debug!(
            program_us = duration.as_micros() as u64,
            finished_us = self.started.elapsed().as_micros() as u64,
            "sandbox finished"
        );
        Ok(Outcome {
            status: ending.status,
            timed_out,
            stdout,
            stderr,
            duration,
            landlock,
            cgroup: ending.cgroup,
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Role {
    Stdout,
    Stderr,
    Exit,
    Input,
}

/// Reads everything available; returns whether the stream is still open.
fn drain(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    mut on_chunk: impl FnMut(&[u8]),
) -> std::io::Result<bool> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        match n {
            0 => return Ok(false),
            n if n > 0 => on_chunk(&buf[..n as usize]),
            _ => {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock => return Ok(true),
                    std::io::ErrorKind::Interrupted => continue,
                    _ => return Err(e),
                }
            }
        }
    }
}

fn poll_timeout(d: Duration) -> PollTimeout {
    // Round up so the loop does not spin in the last sub-millisecond before the deadline.
    let ms = d.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_the_head_and_the_end_within_the_cap() {
        // A cap of 8: 6 for the head, 2 for the end.
        let mut c = Captured::default();
        assert_eq!(c.push(b"hello", 8), b"hello");
        assert_eq!(c.push(b"world", 8), b"w");
        assert_eq!(c.push(b"!", 8), b"");
        assert_eq!(c.bytes, b"hellow");
        assert_eq!(c.total_bytes, 11);
        assert!(c.truncated);
        assert_eq!(c.left_out(), 3);
        assert_eq!(
            c.text("stdout"),
            "hellow\n[codebox: 3 bytes of stdout were not kept here: the first 6 and the last 2 bytes are]\nd!"
        );
    }

    #[test]
    fn a_long_stream_keeps_its_head_a_marker_and_its_last_bytes() {
        let cap = 1 << 20;
        let mut c = Captured::default();
        c.push(b"head\n", cap);
        let middle = vec![b'x'; 3 * cap];
        for chunk in middle.chunks(1000) {
            c.push(chunk, cap);
        }
        c.push("the end: é\n".as_bytes(), cap);
        assert!(c.truncated);
        assert_eq!(c.bytes.len() + TAIL_BYTES, cap, "never more than the cap");
        assert_eq!(c.left_out(), c.total_bytes - cap as u64);
        let text = c.text("stdout");
        assert!(text.starts_with("head\nxx"), "{}", &text[..80]);
        assert!(text.contains(&format!("{} bytes of stdout were not kept", c.left_out())));
        assert!(text.ends_with("xxthe end: é\n"));
        // The tail stays bounded however long the stream.
        assert!(c.tail.len() <= 2 * TAIL_BYTES);
    }

    #[test]
    fn a_tail_that_starts_inside_a_character_skips_it() {
        let mut c = Captured::default();
        let mut long = "é".repeat(100_000).into_bytes();
        long.push(b'z');
        c.push(&long, 1000);
        let text = c.text("stderr");
        assert!(!text.contains('\u{fffd}'), "no replacement character");
        assert!(text.ends_with("éz"));
    }

    #[test]
    fn capture_within_cap_is_not_truncated() {
        let mut c = Captured::default();
        c.push(b"abc", 3);
        assert!(!c.truncated);
        assert_eq!(c.total_bytes, 3);
    }
}
