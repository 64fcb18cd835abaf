//! A `codebox serve` started for a benchmark run, stopped by its pid.
//!
//! Each server gets its own temporary directory as working directory, with an empty
//! `codebox.toml` (passed with `--config`, so no user config applies), an `.mcp.json`
//! without servers (`CODEBOX_MCP_CONFIG`: no upstream is started) and its own skills
//! directory. stdout is the MCP channel on stdio; stderr (logs) is kept, its last lines
//! quoted when something fails.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::mcp_stdio::StdioSession;

/// Longer than serve's default drain (10 s), so a clean stop is never cut short.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Start-up runs the doctor's checks, real sandboxes included.
const START_TIMEOUT: Duration = Duration::from_secs(60);
const LOG_LINES: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Stdio,
    /// Streamable HTTP on an ephemeral loopback port.
    Http,
}

pub enum Launch {
    Up(Server),
    /// This codebox build does not know an argument (clap's complaint).
    Unsupported(String),
}

pub struct Server {
    child: Child,
    transport: Transport,
    dir: PathBuf,
    stdio: Option<StdioSession>,
    addr: Option<SocketAddr>,
    log: Arc<Mutex<VecDeque<String>>>,
    log_thread: Option<JoinHandle<()>>,
    stopped: bool,
}

impl Server {
    /// Starts `codebox serve <args>` and waits until it serves: on stdio an initialized
    /// session, over HTTP the announced address.
    pub fn start(
        codebox: &Path,
        rootfs: &Path,
        transport: Transport,
        args: &[&str],
    ) -> Result<Launch> {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "codebox-bench-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(dir.join("skills"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(dir.join("codebox.toml"), "")?;
        std::fs::write(dir.join("mcp.json"), "{\"mcpServers\":{}}\n")?;
        let mut cmd = Command::new(codebox);
        cmd.arg("serve")
            .arg("--config")
            .arg(dir.join("codebox.toml"));
        if transport == Transport::Http {
            cmd.args(["--http", "127.0.0.1:0"]);
        }
        cmd.args(args)
            .current_dir(&dir)
            .env("CODEBOX_ROOTFS", rootfs)
            .env("CODEBOX_MCP_CONFIG", dir.join("mcp.json"))
            .env("CODEBOX_SKILLS_DIR", dir.join("skills"))
            .stdin(Stdio::piped())
            .stdout(match transport {
                Transport::Stdio => Stdio::piped(),
                Transport::Http => Stdio::null(),
            })
            .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e).with_context(|| format!("cannot start {}", codebox.display()));
            }
        };
        let stderr = child.stderr.take().expect("piped");
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (addr_tx, addr_rx) = mpsc::channel();
        let log_thread = std::thread::spawn({
            let log = log.clone();
            move || keep_log(stderr, &log, addr_tx)
        });
        let mut server = Server {
            child,
            transport,
            dir,
            stdio: None,
            addr: None,
            log,
            log_thread: Some(log_thread),
            stopped: false,
        };
        let ready = match transport {
            Transport::Http => match addr_rx.recv_timeout(START_TIMEOUT) {
                Ok(addr) => {
                    server.addr = Some(addr);
                    Ok(())
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    Err(anyhow::anyhow!("not serving after {START_TIMEOUT:?}"))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    Err(anyhow::anyhow!("exited before serving"))
                }
            },
            Transport::Stdio => {
                let stdin = server.child.stdin.take().expect("piped");
                let stdout = server.child.stdout.take().expect("piped");
                StdioSession::open(stdin, stdout).map(|s| server.stdio = Some(s))
            }
        };
        match ready {
            Ok(()) => Ok(Launch::Up(server)),
            Err(e) => {
                let status = server.shutdown();
                let log = server.log_text();
                if let Some(complaint) = status.ok().and_then(|s| super::usage_error(s, &log)) {
                    return Ok(Launch::Unsupported(complaint));
                }
                Err(e).with_context(|| {
                    format!(
                        "codebox serve {} failed to start; its log:\n{log}",
                        args.join(" ")
                    )
                })
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The HTTP server's address (`None` on stdio).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The stdio session (`None` over HTTP).
    pub fn stdio(&mut self) -> Option<&mut StdioSession> {
        self.stdio.as_mut()
    }

    /// The last lines the server logged.
    pub fn log_text(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Stops the server (stdin closed; SIGTERM over HTTP) and checks it exited cleanly.
    pub fn stop(mut self) -> Result<()> {
        let status = self.shutdown()?;
        if !status.success() {
            bail!(
                "codebox serve exited with {status}; its log:\n{}",
                self.log_text()
            );
        }
        Ok(())
    }

    /// Closes stdin (a stdio server leaves at EOF), sends SIGTERM to an HTTP server (or a
    /// stdio one that did not leave within 5 s), waits, and as the last resort kills it.
    fn shutdown(&mut self) -> Result<ExitStatus> {
        if self.stopped {
            bail!("already stopped");
        }
        self.stopped = true;
        self.stdio = None;
        drop(self.child.stdin.take());
        let pid = self.child.id() as libc::pid_t;
        let terminate = || {
            // SAFETY: kill(2) on our own child, which has not been reaped yet (we reap it
            // only below), so the pid cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        };
        if self.transport == Transport::Http {
            terminate();
        }
        let started = Instant::now();
        let mut termed = self.transport == Transport::Http;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if !termed && started.elapsed() > Duration::from_secs(5) {
                terminate();
                termed = true;
            }
            if started.elapsed() > STOP_TIMEOUT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("codebox serve (pid {pid}) did not exit within {STOP_TIMEOUT:?}; killed it");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(t) = self.log_thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(status)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !self.stopped {
            if let Err(e) = self.shutdown() {
                eprintln!("warning: {e:#}");
            }
        }
    }
}

/// Keeps the last lines of the server's stderr; sends the address once it is announced.
fn keep_log(
    stderr: std::process::ChildStderr,
    log: &Mutex<VecDeque<String>>,
    addr_tx: mpsc::Sender<SocketAddr>,
) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        if let Some(addr) = line
            .split_once("serving MCP at http://")
            .and_then(|(_, rest)| rest.strip_suffix("/mcp"))
            .and_then(|a| a.parse().ok())
        {
            let _ = addr_tx.send(addr);
        }
        let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() == LOG_LINES {
            log.pop_front();
        }
        log.push_back(line);
    }
}
