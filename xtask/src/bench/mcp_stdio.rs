//! An MCP session over a `codebox serve` child's stdin/stdout: newline-delimited
//! JSON-RPC, one request at a time.

use std::io::{BufRead, BufReader, Write};
use std::process::{ChildStdin, ChildStdout};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::mcp::{self, Rpc};

pub struct StdioSession {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl StdioSession {
    /// Initializes the session (initialize, then `notifications/initialized`) and checks
    /// the tools.
    pub fn open(stdin: ChildStdin, stdout: ChildStdout) -> Result<StdioSession> {
        let mut s = StdioSession {
            stdin,
            stdout: BufReader::new(stdout),
            next_id: 1,
        };
        s.rpc("initialize", mcp::initialize_params())
            .context("initialize")?;
        s.send(&mcp::initialized_notification())?;
        mcp::check_tools(&mut s)?;
        Ok(s)
    }

    fn send(&mut self, msg: &Value) -> Result<()> {
        let mut line = serde_json::to_vec(msg)?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .and_then(|()| self.stdin.flush())
            .context("cannot write to the server's stdin")
    }
}

impl Rpc for StdioSession {
    fn rpc(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&mcp::request(id, method, params))?;
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                bail!("the server closed its stdout before answering {method}");
            }
            let msg: Value = serde_json::from_str(&line)
                .with_context(|| format!("the server wrote a line that is not JSON: {line:?}"))?;
            // Notifications (logging, list changes) may come first.
            if let Some(result) = mcp::response_to(&msg, id) {
                return result.with_context(|| format!("{method} failed"));
            }
        }
    }
}
