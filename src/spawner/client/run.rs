//! Running a program in a [`RemoteSandbox`]: the boot frame in, fd 3 to the tool proxy,
//! stdout and stderr captured within their caps and streamed, the timeout and the
//! cancel, the status from the init's pipe or the spawner's report.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

use super::{ChannelServer, RemoteSandbox, Stream, CHANNEL_DRAIN};
use crate::sandbox::{Captured, Ending, Outcome};
use crate::spawner::wire::Request;
use crate::spawner::{Error, Result};

impl RemoteSandbox {
    /// Writes `input` to fd 3, streams output to `on_output` (within the caps), kills the
    /// sandbox at `timeout` or when `cancel` resolves, and waits for its end.
    pub async fn run_to_completion(
        self,
        input: &[u8],
        stdout_cap: usize,
        stderr_cap: usize,
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
        on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<Outcome> {
        self.run_with_channel(
            input.to_vec(),
            None,
            (stdout_cap, stderr_cap),
            timeout,
            cancel,
            on_output,
        )
        .await
    }

    /// As [`Self::run_to_completion`], and once `frame` (the boot frame) is written, fd 3
    /// is handed to `channel.service` (the tool proxy) until the sandbox ends.
    ///
    /// `channel.exit_notice` carries the status of the runtime's `codebox/exit` (sent by a
    /// one-shot runtime once the program ended and its output was flushed and closed).
    /// With it and both output pipes at end of file, the run is over: the result is
    /// given then, with the cgroup's figures as they are, and the sandbox is killed and
    /// reaped afterwards, off the request path (the kernel's teardown of a process that
    /// loaded pandas takes ~6 ms). The status is the program's to choose anyway; a
    /// program that sends the notice and goes on running only ends itself sooner.
    pub async fn run_with_channel(
        mut self,
        frame: Vec<u8>,
        channel: Option<ChannelServer>,
        (stdout_cap, stderr_cap): (usize, usize),
        timeout: Duration,
        cancel: impl std::future::Future<Output = ()>,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<Outcome> {
        // The timeout and the duration count from the code's delivery, which for a pooled
        // sandbox is long after its spawn.
        self.started = Instant::now();
        // The init's own deadline from now: it ends the sandbox should we not.
        self.arm_now(crate::sandbox::lifeline::run_deadline(timeout));
        let io = |doing| move |source| Error::Io { doing, source };
        let mut stdout =
            tokio::net::unix::pipe::Receiver::from_owned_fd(self.stdout.take().expect("stdout"))
                .map_err(io("reading stdout"))?;
        let mut stderr =
            tokio::net::unix::pipe::Receiver::from_owned_fd(self.stderr.take().expect("stderr"))
                .map_err(io("reading stderr"))?;
        let (service, mut exit_notice) = match channel {
            Some(c) => (Some(c.service), c.exit_notice),
            None => (None, None),
        };
        let fd3 = std::os::unix::net::UnixStream::from(self.channel.take().expect("channel"));
        fd3.set_nonblocking(true).map_err(io("setting up fd 3"))?;
        let mut stream = tokio::net::UnixStream::from_std(fd3).map_err(io("setting up fd 3"))?;
        // The boot frame first; then the proxy, if any, owns the channel. When the
        // program closes fd 3 or is gone, nobody reads the rest of the frame.
        let delivered = std::sync::OnceLock::new();
        let started = self.started;
        let channel_task = async {
            if stream.write_all(&frame).await.is_err() {
                return;
            }
            let _ = delivered.set(started.elapsed());
            if let Some(serve) = service {
                serve(stream).await;
            } else {
                // Keep our end open: the program may still read it (and see no EOF).
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(channel_task);
        let mut channel_done = false;
        // The exit report stays in `self` unless it arrives during the run: dropping the
        // sandbox then waits for it on behalf of what `hold_until_gone` holds.
        let mut exit_seen = false;
        // The program's status from the pipe, while the figures are awaited from the
        // spawner (it then finds the pipe empty).
        let mut piped_status = None;
        let mut status_pipe = match self.status.take() {
            Some(fd) => Some(
                tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                    .map_err(io("reading the status pipe"))?,
            ),
            None => None,
        };
        let mut status_record = [0u8; crate::sandbox::report::STATUS_LEN];
        let mut status_got = 0usize;

        let deadline = tokio::time::Instant::from_std(self.started + timeout);
        let (mut out, mut err) = (Captured::default(), Captured::default());
        let (mut out_open, mut err_open) = (true, true);
        let mut ending: Option<Ending> = None;
        let mut timed_out = false;
        let mut cancelled = false;
        // Read into spare capacity (`read_buf`): no 128 KiB zeroed per run.
        let mut obuf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut ebuf: Vec<u8> = Vec::with_capacity(64 * 1024);
        // When each step of the run was seen (debug figures: where the time goes).
        let (mut first_output, mut output_closed, mut exited_at) = (None, None, None);
        // The runtime's own word that the program ended (see `exit_notice`).
        let mut noted_status: Option<i32> = None;
        let mut ended_early = false;
        tokio::pin!(cancel);
        while out_open || err_open || ending.is_none() {
            if let (false, false, None, Some(code), false, false) = (
                out_open,
                err_open,
                ending.as_ref(),
                noted_status,
                timed_out,
                cancelled,
            ) {
                if let Some(cgroup) = self.figures_if_still_there() {
                    ending = Some(Ending {
                        status: Some(crate::sandbox::report::ProgramStatus::Exited(code)),
                        cgroup,
                    });
                    exited_at = Some(self.started.elapsed());
                    ended_early = true;
                    break;
                }
                // The cgroup is being removed: the program is gone already, and its
                // status is on its way.
                noted_status = None;
            }
            tokio::select! {
                got = wait_notice(&mut exit_notice), if exit_notice.is_some() => {
                    exit_notice = None;
                    noted_status = got.ok();
                }
                r = read_chunk(&mut stdout, &mut obuf), if out_open => match r {
                    Ok(0) | Err(_) => {
                        out_open = false;
                        output_closed = Some(self.started.elapsed());
                    }
                    Ok(n) => {
                        first_output.get_or_insert_with(|| self.started.elapsed());
                        let kept = out.push(&obuf[..n], stdout_cap);
                        if !kept.is_empty() { on_output(Stream::Stdout, kept) }
                    }
                },
                r = read_chunk(&mut stderr, &mut ebuf), if err_open => match r {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => {
                        first_output.get_or_insert_with(|| self.started.elapsed());
                        let kept = err.push(&ebuf[..n], stderr_cap);
                        if !kept.is_empty() { on_output(Stream::Stderr, kept) }
                    }
                },
                _ = &mut channel_task, if !channel_done => channel_done = true,
                r = read_status(&mut status_pipe, &mut status_record[status_got..]), if status_pipe.is_some() && ending.is_none() => match r {
                    Ok(n) if n > 0 => {
                        status_got += n;
                        if status_got == status_record.len() {
                            // The init reported the program's end: the result is known
                            // now; the spawner reaps and cleans up in its own time.
                            status_pipe = None;
                            exited_at = Some(self.started.elapsed());
                            let status = crate::sandbox::report::decode_status(&status_record);
                            // Figures read from the cgroup's directories count only if the
                            // directories are still there afterwards; the spawner may be
                            // removing them. Else its exit report carries them.
                            match self.figures_if_still_there() {
                                Some(cgroup) => ending = Some(Ending { status, cgroup }),
                                None => {
                                    tracing::debug!(sandbox = self.id, "cgroup already gone; waiting for the spawner's figures");
                                    piped_status = Some(status);
                                }
                            }
                        }
                    }
                    // End of file or an error: the spawner took the record (or the
                    // sandbox was killed); its exit report has it.
                    _ => status_pipe = None,
                },
                e = exit_report(&mut self.exited), if ending.is_none() => {
                    exit_seen = true;
                    exited_at.get_or_insert_with(|| self.started.elapsed());
                    // Resolved: a receiver must not be polled again (oneshot panics with
                    // "called after complete"), here or in `Drop`.
                    self.exited = None;
                    let mut e = match e {
                        Ok(e) => e,
                        Err(_) => {
                            self.ended = true;
                            return Err(Error::Lost);
                        }
                    };
                    // The record was ours to read: the spawner found the pipe empty.
                    if let Some(status) = piped_status.take() {
                        e.status = status;
                    }
                    ending = Some(e);
                }
                _ = tokio::time::sleep_until(deadline), if !timed_out && !cancelled && ending.is_none() => {
                    timed_out = true;
                    self.spawner.send(&Request::Kill { id: self.id }).await?;
                }
                _ = &mut cancel, if !cancelled && !timed_out && ending.is_none() => {
                    cancelled = true;
                    self.spawner.send(&Request::Kill { id: self.id }).await?;
                }
            }
        }
        // Ended by its status (not by the runtime's `codebox/exit`, which comes after every
        // line the program wrote on fd 3): lines it wrote just before it ended (a tool
        // call's record, output files' chunks) may still be unread. The program and its
        // pid namespace are gone, so fd 3 is at its end once those are read: let the proxy
        // finish them, within a bound.
        if !ended_early && !channel_done {
            let _ = tokio::time::timeout(CHANNEL_DRAIN, &mut channel_task).await;
        }
        // Ended early: the sandbox is still there; dropping it kills it, and what it
        // holds is released once the spawner reports it gone.
        self.ended = !ended_early;
        if exit_seen {
            self.exited = None;
        }
        let duration = self.started.elapsed();
        let us = |d: Option<Duration>| d.map(|d| d.as_micros() as u64);
        tracing::debug!(
            sandbox = self.id,
            delivered_us = us(delivered.get().copied()),
            first_output_us = us(first_output),
            stdout_closed_us = us(output_closed),
            exited_us = us(exited_at),
            total_us = duration.as_micros() as u64,
            ended_early,
            "run steps (from the code's delivery)"
        );
        let ending = ending.expect("loop ends with an ending");
        Ok(Outcome {
            status: ending.status,
            timed_out,
            stdout: out,
            stderr: err,
            duration,
            landlock: self.landlock,
            cgroup: ending.cgroup,
        })
    }
}

/// Reads what is there into `buf`'s spare capacity (emptied first: `buf[..n]` is the
/// chunk); cancel-safe, as `read_buf` is.
async fn read_chunk(
    pipe: &mut tokio::net::unix::pipe::Receiver,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    buf.clear();
    pipe.read_buf(buf).await
}

/// Waits for the spawner's exit report, if it has not been seen yet.
async fn exit_report(
    rx: &mut Option<oneshot::Receiver<Ending>>,
) -> std::result::Result<Ending, oneshot::error::RecvError> {
    match rx {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// Waits for the runtime's exit notice (called only while there is a receiver).
async fn wait_notice(
    rx: &mut Option<oneshot::Receiver<i32>>,
) -> std::result::Result<i32, oneshot::error::RecvError> {
    match rx {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// Reads from the status pipe, if there still is one (a disabled `select!` branch still
/// builds its future).
async fn read_status(
    pipe: &mut Option<tokio::net::unix::pipe::Receiver>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}
