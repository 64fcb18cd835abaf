//! A stdio upstream's process: its own process group, stderr into the log, and a kill
//! that reaches the whole group.
//!
//! Each server starts as the leader of a new process group (`process_group(0)`), so
//! whatever it starts (`npx` → `node`, `uvx` → `python`) is in the group too. Stopping is
//! SIGTERM to the group, a grace period for the leader to exit, SIGKILL to the group, then
//! reaping the leader and waiting (bounded) until no process of the group is left. The
//! SIGKILL goes out while the leader is still unreaped, so the group id cannot have been
//! reused by then. PR_SET_PDEATHSIG is not used: it follows the spawning *thread*, and
//! tokio's blocking threads come and go; if codebox is killed outright, the group
//! survives it.
//!
//! Dropping a [`ServerProcess`] without [`ServerProcess::terminate`] sends SIGTERM at once
//! and finishes the procedure on the tokio runtime (or SIGKILLs the group at once without
//! one).
//!
//! stderr goes to the `tracing` log line by line (with the server's name), never to
//! codebox's stdout, which is the MCP transport; the last lines are kept for error
//! messages.

use std::collections::{BTreeMap, VecDeque};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start {command:?}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// Longest stderr line logged as is; longer lines are cut.
const MAX_LINE: usize = 4096;
/// stderr lines kept for error messages, and the length of each.
const TAIL_LINES: usize = 8;
const TAIL_LINE_LEN: usize = 300;
/// How often termination checks whether the leader exited or the group emptied.
const POLL: Duration = Duration::from_millis(10);
/// How long termination waits for the rest of the group after the leader is reaped.
const GROUP_WAIT: Duration = Duration::from_secs(2);
/// How long termination waits for the last stderr lines (a process outside the group
/// may still hold the pipe).
const STDERR_DRAIN: Duration = Duration::from_secs(1);

/// A running stdio server (the leader of its own process group).
#[derive(Debug)]
pub struct ServerProcess {
    server: String,
    pid: u32,
    /// `None` once terminated.
    child: Option<Child>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// The stderr forwarder; it ends at EOF, once the whole group is gone.
    stderr_task: Option<tokio::task::JoinHandle<()>>,
    grace: Duration,
}

/// The server's stdout (its MCP output) and stdin (its MCP input).
pub type Pipes = (ChildStdout, ChildStdin);

impl ServerProcess {
    /// Starts `command args` with `env` on top of codebox's environment, less the
    /// variables codebox took secrets from (`config::secret_vars`). `grace` is how long
    /// the group gets between SIGTERM and SIGKILL.
    pub fn spawn(
        server: &str,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        grace: Duration,
    ) -> Result<(ServerProcess, Pipes)> {
        let spawn_error = |source| Error::Spawn {
            command: command.to_string(),
            source,
        };
        let mut command_line = Command::new(command);
        // codebox's own secrets (`env:VAR` in its configuration) are not the server's;
        // a variable its entry sets itself (`env`) is.
        for var in crate::config::secret_vars() {
            command_line.env_remove(var);
        }
        let mut child = command_line
            .args(args)
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(spawn_error)?;
        let pid = child
            .id()
            .ok_or_else(|| spawn_error(std::io::Error::other("exited before it had a pid")))?;
        let (Some(stdout), Some(stdin), Some(stderr)) =
            (child.stdout.take(), child.stdin.take(), child.stderr.take())
        else {
            unreachable!("all three pipes were requested");
        };
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_task = tokio::spawn(forward_stderr(
            server.to_string(),
            stderr,
            stderr_tail.clone(),
        ));
        tracing::info!(server, pid, command, "started stdio MCP server");
        let process = ServerProcess {
            server: server.to_string(),
            pid,
            child: Some(child),
            stderr_tail,
            stderr_task: Some(stderr_task),
            grace,
        };
        Ok((process, (stdout, stdin)))
    }

    /// The leader's pid, which is also the group's id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The last lines the server wrote to stderr, joined with ` | ` (empty if none).
    pub fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.iter().cloned().collect::<Vec<_>>().join(" | ")
    }

    /// Stops the whole group (SIGTERM, grace, SIGKILL), reaps the leader and waits until
    /// the group is gone. Returns the leader's exit status.
    pub async fn terminate(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let status = stop_group(&self.server, self.pid, &mut child, self.grace).await;
        // The group is gone, so stderr is at EOF: let the forwarder take the last lines.
        if let Some(task) = self.stderr_task.take() {
            if tokio::time::timeout(STDERR_DRAIN, task).await.is_err() {
                tracing::debug!(server = %self.server, "stderr still open after the group was stopped");
            }
        }
        tracing::info!(server = %self.server, pid = self.pid, ?status, "stdio MCP server stopped");
        status
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pgid = Pid::from_raw(self.pid as i32);
        let _ = killpg(pgid, Signal::SIGTERM);
        let server = self.server.clone();
        let (pid, grace) = (self.pid, self.grace);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                // If the runtime drops the task before it is done, the guard SIGKILLs.
                let guard = KillOnDrop(pgid);
                handle.spawn(async move {
                    stop_group(&server, pid, &mut child, grace).await;
                    drop(guard);
                });
            }
            Err(_) => {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
        }
    }
}

/// SIGKILLs the group when dropped (a safety net for a cancelled termination).
struct KillOnDrop(Pid);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

async fn stop_group(
    server: &str,
    pid: u32,
    child: &mut Child,
    grace: Duration,
) -> Option<ExitStatus> {
    let pgid = Pid::from_raw(pid as i32);
    if let Err(errno) = killpg(pgid, Signal::SIGTERM) {
        tracing::debug!(server, pid, %errno, "SIGTERM to the process group");
    }
    let exited = tokio::time::timeout(grace, leader_exited(pgid))
        .await
        .is_ok();
    if !exited {
        tracing::warn!(
            server,
            pid,
            ?grace,
            "MCP server ignored SIGTERM; sending SIGKILL"
        );
    }
    // The leader is not reaped yet, so the group id is still ours.
    if let Err(errno) = killpg(pgid, Signal::SIGKILL) {
        tracing::debug!(server, pid, %errno, "SIGKILL to the process group");
    }
    let status = match child.wait().await {
        Ok(status) => Some(status),
        Err(err) => {
            tracing::error!(server, pid, ?err, "cannot reap the MCP server");
            None
        }
    };
    if tokio::time::timeout(GROUP_WAIT, group_gone(pgid))
        .await
        .is_err()
    {
        tracing::warn!(
            server,
            pgid = pid,
            "processes of the group are still alive after SIGKILL"
        );
    }
    status
}

/// Resolves once the leader has exited, without reaping it.
async fn leader_exited(pid: Pid) {
    loop {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(pid), flags) {
            Ok(WaitStatus::StillAlive) => tokio::time::sleep(POLL).await,
            // Exited (or already reaped, or not our child: nothing left to wait for).
            _ => return,
        }
    }
}

/// Resolves once no process (zombies included) is left in the group.
async fn group_gone(pgid: Pid) {
    while killpg(pgid, None).is_ok() {
        tokio::time::sleep(POLL).await;
    }
}

async fn forward_stderr(
    server: String,
    stderr: impl AsyncRead + Unpin,
    tail: Arc<Mutex<VecDeque<String>>>,
) {
    let mut reader = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match read_line_capped(&mut reader, &mut buf, MAX_LINE).await {
            Ok(0) => return,
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(server, ?err, "reading the MCP server's stderr");
                return;
            }
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        tracing::info!(server, line, "upstream stderr");
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.chars().take(TAIL_LINE_LEN).collect());
    }
}

/// Reads one line (up to `max` bytes of it kept; the rest of the line is skipped).
/// Returns the bytes consumed, 0 at EOF.
async fn read_line_capped(
    reader: &mut (impl AsyncBufReadExt + Unpin),
    out: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    let mut consumed = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(consumed);
        }
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let n = chunk.len();
        reader.consume(n);
        consumed += n;
        if done {
            return Ok(consumed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capped_lines() {
        let data: &[u8] = b"short\nthis line is long\nlast";
        let mut reader = BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        let mut lines = Vec::new();
        loop {
            buf.clear();
            if read_line_capped(&mut reader, &mut buf, 8).await.unwrap() == 0 {
                break;
            }
            lines.push(String::from_utf8(buf.clone()).unwrap());
        }
        assert_eq!(lines, ["short\n", "this lin", "last"]);
    }

    #[tokio::test]
    async fn terminate_kills_the_whole_group() {
        // The shell ignores SIGTERM and has a child of its own: both must go.
        let (mut process, _pipes) = ServerProcess::spawn(
            "t",
            "/bin/sh",
            &[
                "-c".into(),
                "trap '' TERM; echo started >&2; sleep 1000 & wait".into(),
            ],
            &BTreeMap::new(),
            Duration::from_millis(200),
        )
        .unwrap();
        let pgid = Pid::from_raw(process.pid() as i32);
        for _ in 0..500 {
            if !process.stderr_tail().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(process.stderr_tail(), "started");
        let status = process.terminate().await.expect("reaped");
        assert!(!status.success());
        assert!(killpg(pgid, None).is_err(), "the group is gone");
        assert!(process.terminate().await.is_none());
    }

    #[tokio::test]
    async fn missing_command_is_a_spawn_error() {
        let e = ServerProcess::spawn(
            "t",
            "/nonexistent/server",
            &[],
            &BTreeMap::new(),
            Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/server"), "{e}");
    }
}
