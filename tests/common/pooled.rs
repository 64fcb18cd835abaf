//! A `codebox serve` with the warm pool on, shared by the tests of one binary, so a test
//! can run the same program cold (`codebox run`) and warm (a pooled sandbox over MCP)
//! and require the same result. The server ends when the test binary does (its stdin
//! closes).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};

/// A `codebox serve --pool-size 2 --pool-max 2` over stdio, initialized.
pub struct Server {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with_config(None)
    }

    /// As [`Server::start`], with `CODEBOX_CONFIG` naming `config`.
    pub fn start_with_config(config: Option<&std::path::Path>) -> Server {
        let mut command = Command::new(super::codebox_bin());
        if let Some(config) = config {
            command.env("CODEBOX_CONFIG", config);
        }
        let mut child = command
            // A fixed pool (`--pool-max 2`): tests wait for exactly 2 idle.
            .args(["serve", "--pool-size", "2", "--pool-max", "2"])
            .env("CODEBOX_ROOTFS", super::rootfs_dir())
            // Pooled sandboxes are forked from the zygote exactly in a zygote run, so
            // both sides of a cold/warm comparison are made the same way.
            .env(
                "CODEBOX_ZYGOTE",
                if super::zygote_run() { "1" } else { "0" },
            )
            // A directory without `.mcp.json`: no upstream servers.
            .current_dir(super::rootfs_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("codebox serve starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut server = Server {
            child,
            stdin,
            stdout,
            next_id: 0,
        };
        server.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "codebox-tests", "version": "0"}}),
        );
        server.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        server
    }

    fn send(&mut self, msg: &Value) {
        writeln!(self.stdin, "{msg}").expect("write to codebox serve");
        self.stdin.flush().expect("flush");
    }

    /// Sends a request and returns its response (notifications in between are skipped).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            let n = self
                .stdout
                .read_line(&mut line)
                .expect("read from codebox serve");
            assert!(n > 0, "codebox serve closed its stdout");
            let msg: Value = serde_json::from_str(&line).expect("JSON from codebox serve");
            if msg["id"] == json!(id) {
                return msg;
            }
        }
    }

    /// The `health` tool's structured result.
    pub fn health(&mut self) -> Value {
        let r = self.request("tools/call", json!({"name": "health", "arguments": {}}));
        r["result"]["structuredContent"].clone()
    }

    /// Waits until the pool holds `n` ready sandboxes of every language.
    pub fn until_pool_ready(&mut self, n: u64) {
        for _ in 0..600 {
            let h = self.health();
            let languages = h["pool"]["languages"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            if !languages.is_empty() && languages.values().all(|l| l["idle"] == json!(n)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the pool never got {n} ready sandboxes per language");
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILLs the server (no shutdown code of it runs) and reaps it.
    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap the server");
    }
}

fn server() -> &'static Mutex<Server> {
    static SERVER: OnceLock<Mutex<Server>> = OnceLock::new();
    SERVER.get_or_init(|| Mutex::new(Server::start()))
}

/// Runs `code` in a pooled sandbox through `execute_<language>`; returns the result's
/// structuredContent. Retries (after a pause for the refill) until the run was warm.
pub fn run_warm(language: &str, code: &str) -> Value {
    run_warm_with(language, json!({ "code": code }))
}

/// [`run_warm`] with the call's whole `arguments` (files, timeout ...).
pub fn run_warm_with(language: &str, arguments: Value) -> Value {
    for _ in 0..50 {
        let result = server().lock().unwrap_or_else(|e| e.into_inner()).request(
            "tools/call",
            json!({"name": format!("execute_{language}"), "arguments": arguments}),
        );
        let content = result["result"]["structuredContent"].clone();
        assert!(content.is_object(), "no result: {result:#}");
        // In a zygote run, the pool's first sandboxes start before the zygote is ready.
        let made_right = !super::zygote_run() || language != "python" || content["zygote"] == true;
        if content["start"] == "warm" && made_right {
            return content;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the pool never had a warm sandbox");
}

/// `python_ok`, cold and warm: the program must succeed and print the same in a fresh
/// sandbox and in a pooled one. Returns that output.
pub fn python_ok_cold_and_warm(code: &str) -> String {
    let cold = super::python_ok(code);
    let warm = run_warm("python", code);
    assert_eq!(warm["exit_code"], 0, "the pooled run failed: {warm:#}");
    assert_eq!(
        warm["stdout"].as_str().unwrap_or_default(),
        cold,
        "a pooled sandbox differs from a cold one"
    );
    cold
}
