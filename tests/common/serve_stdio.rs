//! A real `codebox serve` over stdio driven with raw JSON-RPC (a reader thread collects
//! the answers, another the log), and what the lifecycle tests look at from outside:
//! its children, its sandboxes' cgroups and processes.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Generous bound for "dies promptly".
pub const DEATH_BOUND: Duration = Duration::from_secs(15);

pub struct Server {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    answers: mpsc::Receiver<Value>,
    pending: HashMap<u64, Value>,
    next_id: u64,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `codebox serve EXTRA` and initializes it.
    pub fn start(extra: &[&str]) -> Server {
        let mut server = Server::spawn(extra, &[]);
        server.initialize();
        server
    }

    /// Starts `codebox serve EXTRA` with `env` added, without initializing it.
    pub fn spawn(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(super::codebox_bin())
            .arg("serve")
            .args(extra)
            .envs(env.iter().copied())
            .env("CODEBOX_ROOTFS", super::rootfs_dir())
            .env("RUST_LOG", "codebox=info")
            // A directory without `.mcp.json`: no upstream servers.
            .current_dir(super::rootfs_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("codebox serve starts");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if v.get("id").is_some() && tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().expect("stderr");
        let log = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let stdin = child.stdin.take();
        Server {
            child,
            stdin,
            answers,
            pending: HashMap::new(),
            next_id: 0,
            stderr,
        }
    }

    /// The MCP handshake.
    pub fn initialize(&mut self) {
        let id = self.send(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "codebox-lifecycle-tests", "version": "0"}}),
        );
        self.answer(id, Duration::from_secs(60));
        self.notify("notifications/initialized");
    }

    pub fn write(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").expect("write to codebox serve");
        stdin.flush().expect("flush");
    }

    pub fn notify(&mut self, method: &str) {
        self.write(&json!({"jsonrpc": "2.0", "method": method}));
    }

    /// Sends a request; its answer is collected by [`Self::answer`].
    pub fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    pub fn try_answer(&mut self, id: u64, within: Duration) -> Option<Value> {
        let until = Instant::now() + within;
        loop {
            if let Some(v) = self.pending.remove(&id) {
                return Some(v);
            }
            let left = until.checked_duration_since(Instant::now())?;
            match self.answers.recv_timeout(left) {
                Ok(v) => {
                    let got = v["id"].as_u64().unwrap_or_default();
                    self.pending.insert(got, v);
                }
                Err(_) => return None,
            }
        }
    }

    pub fn answer(&mut self, id: u64, within: Duration) -> Value {
        self.try_answer(id, within)
            .unwrap_or_else(|| panic!("no answer to request {id} within {within:?}"))
    }

    pub fn execute(&mut self, code: &str, timeout_ms: u64) -> u64 {
        self.send(
            "tools/call",
            json!({"name": "execute_python",
                   "arguments": {"code": code, "timeout_ms": timeout_ms}}),
        )
    }

    pub fn health(&mut self) -> Value {
        let id = self.send("tools/call", json!({"name": "health", "arguments": {}}));
        let r = self.answer(id, Duration::from_secs(30));
        r["result"]["structuredContent"].clone()
    }

    pub fn until_pool_ready(&mut self) {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            let h = self.health();
            let python = &h["pool"]["languages"]["python"];
            if python["idle"].as_u64().unwrap_or(0) >= 1 {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the pool never got a ready python sandbox");
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn spawner_pid(&mut self) -> i32 {
        let h = self.health();
        h["spawner"]["pid"]
            .as_i64()
            .expect("health names the spawner") as i32
    }

    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for the server to exit, up to `within`; its exit status.
    pub fn exited_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn sigkill(pid: i32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL");
}

/// Sandbox cgroups of the server `owner` (below this process's own cgroups), by path.
pub fn sandbox_cgroups(owner: i32) -> BTreeSet<String> {
    super::sandbox_cgroups(|pid| pid == owner)
        .into_iter()
        .collect()
}

/// Host pids of the live processes in the server's sandboxes (by their cgroup).
pub fn sandbox_processes(owner: i32) -> Vec<i32> {
    let marker = format!("/codebox-{owner}-");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        // A zombie is dead: its reaping is up to whichever process inherited it (the
        // host's init, for an orphaned sandbox init), which may take its time.
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')));
        if let Ok(cg) = std::fs::read_to_string(entry.path().join("cgroup")) {
            if cg.contains(&marker) && !zombie {
                found.push(pid);
            }
        }
    }
    found
}

/// Pids whose parent is `pid`.
pub fn children_of(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}

pub fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < until, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn is_error_with(answer: &Value, words: &str) -> bool {
    answer["result"]["isError"] == json!(true)
        && answer["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains(words))
}

/// Removes the (empty) sandbox cgroups a killed `owner` left, waiting for them to empty.
pub fn remove_left_cgroups(owner: i32) {
    wait_until("the left cgroups can be removed", DEATH_BOUND, || {
        for dir in sandbox_cgroups(owner) {
            let _ = std::fs::remove_dir(&dir);
        }
        sandbox_cgroups(owner).is_empty()
    });
}
