//! `codebox run --mcp-config FILE`: one program that may call the tools of MCP servers.
//!
//! The upstream connections, the tool channel's proxy, the generated `/servers` wrappers,
//! approvals, PII handling and the audit live in `codebox serve`; rather than a second
//! copy of them here, the run starts a `codebox serve` of its own on a pipe (no warm
//! pool, the same profile, rootfs, config and id mapping) and is its one MCP client:
//! `initialize`, one `tools/call execute_python|execute_typescript`, then each cut
//! stream read whole from its resource pages, so the terminal gets all the output the
//! sandbox kept. The server ends when its stdin closes.
//!
//! What only `run`'s own sandbox has is refused with the way to get it: `--workspace`
//! (a served sandbox has no host directory), `--memory`/`--pids`/`--output-limit` (a
//! profile's limits), `--allow-host`/`--allow-private` (`[network]` of a config),
//! `--zygote` (serve forks Python from its zygote anyway).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

use codebox::runtime::Language;

use super::passthrough::exit_status;

/// What the served run needs from `codebox run`'s arguments.
pub struct ServedRun<'a> {
    pub language: Language,
    pub code: String,
    pub files: codebox::runtime::Files,
    pub mcp_configs: &'a [std::path::PathBuf],
    pub config: Option<&'a std::path::Path>,
    pub profile: Option<&'a str>,
    pub rootfs: Option<&'a std::path::Path>,
    pub root_host_id: Option<u32>,
    pub timeout: Option<Duration>,
    pub json: bool,
}

/// Why a flag of `run` cannot go with `--mcp-config`, or `None`.
pub fn refused_with_tools(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "--workspace" => "a run with --mcp-config has no host directory at /workspace",
        "--memory" | "--pids" | "--output-limit" => {
            "with --mcp-config the limits are a profile's: give one with --profile FILE"
        }
        "--allow-host" | "--allow-private" => {
            "with --mcp-config the network is the config's [network]: give it with --config FILE"
        }
        "--zygote" => "with --mcp-config Python sandboxes are forked from a zygote already",
        _ => return None,
    })
}

/// Runs the program through a `codebox serve` started for it; the exit code as `run`'s.
pub fn run(r: ServedRun<'_>) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find codebox's own executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--pool-size", "0"]);
    for c in r.mcp_configs {
        cmd.arg("--mcp-config").arg(c);
    }
    if let Some(c) = r.config {
        cmd.arg("--config").arg(c);
    }
    if let Some(p) = r.profile {
        cmd.args(["--profile", p]);
    }
    if let Some(p) = r.rootfs {
        cmd.arg("--rootfs").arg(p);
    }
    if let Some(id) = r.root_host_id {
        cmd.args(["--root-host-id", &id.to_string()]);
    }
    if let Some(t) = r.timeout {
        // The server refuses a timeout over its maximum: this one's is the run's.
        cmd.args(["--max-timeout", &format!("{}ms", t.as_millis().max(1))]);
    }
    // The server's log is the run's stderr: its warnings and errors only, unless RUST_LOG
    // asks for more (rmcp's own warning for each error answer, such as the page past the
    // last of a kept stream, says nothing to a run's user).
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "warn,rmcp::service=error");
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start codebox serve for a run with --mcp-config")?;
    let stdin = child.stdin.take().expect("piped");
    let stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut client = Client {
        stdin,
        stdout,
        next_id: 0,
    };
    let outcome = served(&mut client, &r);
    drop(client);
    finish(&mut child);
    let result = outcome?;
    report(&result, r.json)
}

/// `initialize`, the call, and the cut streams read whole.
fn served(client: &mut Client, r: &ServedRun<'_>) -> anyhow::Result<Value> {
    client.request(
        "initialize",
        json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "codebox-run", "version": env!("CARGO_PKG_VERSION")},
        }),
    )?;
    client.notify("notifications/initialized", json!({}))?;
    let tool = match r.language {
        Language::Python => "execute_python",
        Language::TypeScript => "execute_typescript",
    };
    let mut arguments = json!({ "code": r.code });
    if let Some(t) = r.timeout {
        arguments["timeout_ms"] = json!(t.as_millis());
    }
    if !r.files.is_empty() {
        let files: serde_json::Map<String, Value> = r
            .files
            .iter()
            .map(|(path, bytes)| {
                let content = match std::str::from_utf8(bytes) {
                    Ok(text) => json!(text),
                    Err(_) => json!({ "base64": base64_of(bytes) }),
                };
                (path.clone(), content)
            })
            .collect();
        arguments["files"] = Value::Object(files);
    }
    let answer = client.request("tools/call", json!({"name": tool, "arguments": arguments}))?;
    let Some(mut result) = answer.get("structuredContent").cloned() else {
        // A refusal before the program ran (invalid arguments, the host, packages ...).
        let text: Vec<&str> = answer["content"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["text"].as_str())
            .collect();
        bail!("{}", text.join("\n"));
    };
    // A stream the result had to cut is kept whole as a resource, in pages.
    for stream in ["stdout", "stderr"] {
        if let Some(uri) = result["output"][stream]["resource"].as_str() {
            let whole = client.read_whole(uri)?;
            result[stream] = json!(whole);
        }
    }
    Ok(result)
}

/// Prints what `run` prints, from the served result.
fn report(result: &Value, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        super::out::write(format_args!("{}\n", serde_json::to_string(result)?))?;
    } else {
        if let Some(out) = result["stdout"].as_str() {
            super::out::write(format_args!("{out}"))?;
        }
        if let Some(err) = result["stderr"].as_str() {
            eprint!("{err}");
        }
        for hint in result["hints"].as_array().into_iter().flatten() {
            if let Some(h) = hint.as_str() {
                eprintln!("codebox: {h}");
            }
        }
    }
    let timed_out = result["timed_out"].as_bool().unwrap_or(false);
    let exit_code = result["exit_code"].as_i64().map(|c| c as i32);
    let signal = result["signal"].as_i64().map(|s| s as i32);
    Ok(ExitCode::from(exit_status(timed_out, exit_code, signal)))
}

/// Closes the server's stdin (it drains and exits) and reaps it; killed after 10 s.
fn finish(child: &mut Child) {
    drop(child.stdin.take());
    for _ in 0..100 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::warn!("the run's codebox serve did not end; killing it");
    let _ = child.kill();
    let _ = child.wait();
}

/// A minimal MCP client over the server's stdio: one request at a time, notifications
/// (logs, progress) skipped.
struct Client {
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl Client {
    fn notify(&mut self, method: &str, params: Value) -> anyhow::Result<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.stdin
            .write_all(&line)
            .and_then(|_| self.stdin.flush())
            .context("the run's codebox serve is gone")
    }

    /// Sends a request and waits for its answer's `result` (an error answer is an error).
    fn request(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        let mut line = String::new();
        loop {
            line.clear();
            let n = self
                .stdout
                .read_line(&mut line)
                .context("reading the run's codebox serve")?;
            if n == 0 {
                bail!("the run's codebox serve ended before it answered {method} (its log above says why)");
            }
            let Ok(message) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if message.get("id").and_then(Value::as_u64) != Some(id) {
                continue; // a notification, or a request of the server's (none is declared)
            }
            if let Some(error) = message.get("error") {
                bail!(
                    "{method}: {}",
                    error["message"]
                        .as_str()
                        .unwrap_or("an error without a message")
                );
            }
            return Ok(message.get("result").cloned().unwrap_or(Value::Null));
        }
    }

    /// A kept stream, every page of it (`?page=1`, `?page=2` ... until the server says
    /// "there are N pages").
    fn read_whole(&mut self, uri: &str) -> anyhow::Result<String> {
        let mut whole = String::new();
        for page in 1.. {
            let read = self.request(
                "resources/read",
                json!({ "uri": format!("{uri}?page={page}") }),
            );
            match read {
                Ok(answer) => {
                    whole.push_str(answer["contents"][0]["text"].as_str().unwrap_or_default())
                }
                Err(e) if page > 1 && e.to_string().contains("pages") => break,
                Err(e) => return Err(e),
            }
        }
        Ok(whole)
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
