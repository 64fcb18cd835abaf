//! A keep-alive sandbox: one interpreter that runs several programs in turn, so the
//! state one run leaves (variables, imports, open files) is there for the next.
//!
//! The runtime is told by a `SESSION` record at the head of its boot frame
//! (`runtime::session_boot_frame`). After each run it flushes stdout and stderr and sends
//! the notification `codebox/done {status}` on fd 3; the proxy serving fd 3 hands it to
//! this driver. The next run goes down fd 3 as a `codebox/run` line. Because the runtime
//! flushes before it reports, every byte of a run's output is in the pipes when `done`
//! arrives: draining them until they are empty gives exactly that run's output.
//!
//! A run that times out or is cancelled kills the sandbox: an interpreter stuck in a
//! loop cannot be interrupted safely, so its state is lost and the caller is told.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};

use super::client::{RemoteSandbox, Stream};
use super::{Error, Result};
use crate::proxy::ProxySession;
use crate::sandbox::{Captured, Ending, LandlockStatus};

/// How one run of a keep-alive sandbox ended.
#[derive(Debug, Clone)]
pub enum RunEnd {
    /// The program finished; the interpreter waits for the next. `ok` is false when it
    /// raised an uncaught error.
    Done { ok: bool },
    /// The interpreter exited (`sys.exit`, `Deno.exit`, a crash, the OOM killer).
    Exited(Ending),
    /// The run hit its timeout; the sandbox was killed.
    TimedOut(Ending),
    /// The caller cancelled; the sandbox was killed.
    Cancelled(Ending),
}

/// One run's output and ending.
#[derive(Debug, Clone)]
pub struct LiveRun {
    pub end: RunEnd,
    pub stdout: Captured,
    pub stderr: Captured,
    /// From the code's delivery to its `done` (or the end of the sandbox).
    pub duration: Duration,
}

/// A sandbox kept alive between runs. Dropping it kills the sandbox.
pub struct LiveSandbox {
    sandbox: RemoteSandbox,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    proxy: std::sync::Arc<ProxySession>,
    control: mpsc::UnboundedReceiver<Value>,
    exited: oneshot::Receiver<Ending>,
    /// Set once the sandbox has ended; no run is possible after.
    ended: Option<Ending>,
    channel: tokio::task::JoinHandle<()>,
    runs: u64,
}

impl LiveSandbox {
    /// Takes over a freshly spawned sandbox: writes `frame` (a session boot frame that
    /// carries the first run) to fd 3, then serves fd 3 with `proxy` for the sandbox's
    /// whole life. The first [`LiveSandbox::run`] waits for that first program.
    pub fn start(
        mut sandbox: RemoteSandbox,
        frame: Vec<u8>,
        proxy: std::sync::Arc<ProxySession>,
    ) -> Result<LiveSandbox> {
        let io = |doing| move |source| Error::Io { doing, source };
        let (stdout, stderr, channel, exited) = sandbox.take_io();
        let stdout = pipe::Receiver::from_owned_fd(stdout).map_err(io("reading stdout"))?;
        let stderr = pipe::Receiver::from_owned_fd(stderr).map_err(io("reading stderr"))?;
        let channel = std::os::unix::net::UnixStream::from(channel);
        channel
            .set_nonblocking(true)
            .map_err(io("setting up fd 3"))?;
        let mut stream =
            tokio::net::UnixStream::from_std(channel).map_err(io("setting up fd 3"))?;
        let (control_tx, control) = mpsc::unbounded_channel();
        proxy.set_control(control_tx);
        let serving = proxy.clone();
        let channel = tokio::spawn(async move {
            if stream.write_all(&frame).await.is_ok() {
                serving.serve(stream).await;
            }
        });
        Ok(LiveSandbox {
            sandbox,
            stdout,
            stderr,
            proxy,
            control,
            exited,
            ended: None,
            channel,
            runs: 0,
        })
    }

    /// The sandbox has ended (exit, kill, timeout); it takes no more runs.
    pub fn has_ended(&self) -> bool {
        self.ended.is_some()
    }

    pub fn landlock(&self) -> Option<LandlockStatus> {
        self.sandbox.landlock()
    }

    /// The proxy serving this sandbox's tool calls (its report is per run).
    pub fn proxy(&self) -> &std::sync::Arc<ProxySession> {
        &self.proxy
    }

    /// Runs one program: `message` is the `codebox/run` line for every run but the first
    /// (whose code was in the boot frame). Streams output to `on_output`, kills the
    /// sandbox at `timeout` (counted from now) or when `cancel` resolves.
    pub async fn run(
        &mut self,
        message: Option<Vec<u8>>,
        (stdout_cap, stderr_cap): (usize, usize),
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<LiveRun> {
        if self.ended.is_some() {
            return Err(Error::Protocol("the keep-alive sandbox has already ended"));
        }
        let started = Instant::now();
        let first = self.runs == 0;
        self.runs += 1;
        match message {
            Some(mut line) if !first => {
                if line.last() == Some(&b'\n') {
                    line.pop();
                }
                if !self.proxy.send_line(line) {
                    return Err(Error::Protocol("the sandbox's tool channel is closed"));
                }
            }
            Some(_) => return Err(Error::Protocol("the first run travels in the boot frame")),
            None if !first => return Err(Error::Protocol("a run after the first needs its code")),
            None => {}
        }
        let deadline = tokio::time::Instant::from_std(started + timeout);
        // The init's own deadline for this run (see sandbox/lifeline.rs).
        self.sandbox
            .arm_now(crate::sandbox::lifeline::run_deadline(timeout));
        let (mut out, mut err) = (Captured::default(), Captured::default());
        let mut obuf = vec![0u8; 64 * 1024];
        let mut ebuf = vec![0u8; 64 * 1024];
        let (mut out_open, mut err_open) = (true, true);
        tokio::pin!(cancel);
        let end = loop {
            tokio::select! {
                r = self.stdout.read(&mut obuf), if out_open => match r {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => {
                        let kept = out.push(&obuf[..n], stdout_cap);
                        if !kept.is_empty() { on_output(Stream::Stdout, kept) }
                    }
                },
                r = self.stderr.read(&mut ebuf), if err_open => match r {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => {
                        let kept = err.push(&ebuf[..n], stderr_cap);
                        if !kept.is_empty() { on_output(Stream::Stderr, kept) }
                    }
                },
                note = self.control.recv() => match note {
                    Some(note) if note.get("method").and_then(Value::as_str) == Some("codebox/done") => {
                        let ok = note.get("status").and_then(Value::as_str) == Some("ok");
                        break RunEnd::Done { ok };
                    }
                    Some(other) => {
                        tracing::debug!(note = %other, "ignoring a control notification");
                    }
                    // The proxy stopped serving: the sandbox closed fd 3 or is gone.
                    None => {
                        let ending = self.wait_exit().await?;
                        break RunEnd::Exited(ending);
                    }
                },
                e = &mut self.exited => {
                    // Resolved either way: never poll the receiver again.
                    self.sandbox.mark_ended();
                    let ending = match e {
                        Ok(ending) => ending,
                        Err(_) => {
                            self.ended = Some(Ending::default());
                            return Err(Error::Lost);
                        }
                    };
                    self.ended = Some(ending.clone());
                    break RunEnd::Exited(ending);
                }
                _ = tokio::time::sleep_until(deadline) => {
                    self.sandbox.kill_now();
                    break RunEnd::TimedOut(self.wait_exit().await?);
                }
                _ = &mut cancel => {
                    self.sandbox.kill_now();
                    break RunEnd::Cancelled(self.wait_exit().await?);
                }
            }
        };
        // Everything the run wrote is in the pipes now (the runtime flushed before it
        // reported; an ended sandbox has closed them): take it without waiting.
        let until_eof = !matches!(end, RunEnd::Done { .. });
        drain(&mut self.stdout, &mut obuf, until_eof, |c| {
            let kept = out.push(c, stdout_cap);
            if !kept.is_empty() {
                on_output(Stream::Stdout, kept)
            }
        })
        .await;
        drain(&mut self.stderr, &mut ebuf, until_eof, |c| {
            let kept = err.push(c, stderr_cap);
            if !kept.is_empty() {
                on_output(Stream::Stderr, kept)
            }
        })
        .await;
        if matches!(end, RunEnd::Done { .. }) {
            // Between runs the interpreter idles: bounded again by the idle lifetime.
            self.sandbox
                .arm_now(crate::sandbox::lifeline::IDLE_LIFETIME);
        }
        Ok(LiveRun {
            end,
            stdout: out,
            stderr: err,
            duration: started.elapsed(),
        })
    }

    /// Waits for the sandbox's end (after a kill, or once fd 3 closed).
    async fn wait_exit(&mut self) -> Result<Ending> {
        if let Some(ending) = &self.ended {
            return Ok(ending.clone());
        }
        let got = (&mut self.exited).await;
        self.sandbox.mark_ended();
        match got {
            Ok(ending) => {
                self.ended = Some(ending.clone());
                Ok(ending)
            }
            Err(_) => {
                self.ended = Some(Ending::default());
                Err(Error::Lost)
            }
        }
    }
}

impl Drop for LiveSandbox {
    fn drop(&mut self) {
        self.channel.abort();
    }
}

/// Reads what is in `pipe`: until it would block, or (`until_eof`) until its writers
/// are all gone — bounded, so a grandchild holding the pipe cannot stall the caller.
async fn drain(
    pipe: &mut pipe::Receiver,
    buf: &mut [u8],
    until_eof: bool,
    mut push: impl FnMut(&[u8]),
) {
    if until_eof {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, pipe.read(buf)).await {
            if n == 0 {
                break;
            }
            push(&buf[..n]);
        }
        return;
    }
    loop {
        match pipe.try_read(buf) {
            Ok(0) => break,
            Ok(n) => push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}
