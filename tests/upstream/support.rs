//! What the upstream tests share: where the test servers are, their configs, waiting,
//! and looking for processes in /proc.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use codebox::upstream::{
    ServerConfig, ServerState, ServerStatus, TransportConfig, UpstreamOptions, Upstreams,
};
use rmcp::model::CallToolResult;
use serde_json::{Map, Value};

/// Generous: the first start of a Node server on a loaded CI machine can take seconds.
pub const PATIENCE: Duration = Duration::from_secs(60);
pub const CALL: Duration = Duration::from_secs(60);

const DYNAMIC_SERVER: &str = include_str!("dynamic_server.py");
const HOSTILE_SERVER: &str = include_str!("hostile_server.py");

pub fn strict() -> bool {
    std::env::var_os("CODEBOX_TEST_STRICT").is_some_and(|v| v == "1")
}

/// Where the test servers are, or `None` (after printing why) when they are not there.
pub struct Fixtures {
    pub upstreams: PathBuf,
    pub pydeps: PathBuf,
    pub node: PathBuf,
    pub python: PathBuf,
    /// Removed at the end of the test.
    pub tmp: tempfile::TempDir,
}

pub fn fixtures(test: &str) -> Option<Fixtures> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let upstreams = std::env::var_os("CODEBOX_TEST_UPSTREAMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/upstreams"));
    let pydeps = std::env::var_os("CODEBOX_TEST_PYDEPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/mcp-pydeps"));
    let node = PathBuf::from("/usr/bin/node");
    let python = PathBuf::from("/usr/bin/python3");
    let mut needed = vec![
        node.clone(),
        python.clone(),
        upstreams.join("python/mcp_server_time/__init__.py"),
        pydeps.join("mcp/__init__.py"),
    ];
    for p in ["filesystem", "memory", "everything"] {
        needed.push(upstreams.join(format!(
            "node/node_modules/@modelcontextprotocol/server-{p}/dist/index.js"
        )));
    }
    if let Some(missing) = needed.iter().find(|p| !p.exists()) {
        let reason = format!(
            "{} is missing (run `cargo xtask test`, which installs the upstream test servers)",
            missing.display()
        );
        if strict() {
            panic!("{test}: {reason}");
        }
        eprintln!("SKIP {test}: {reason}");
        return None;
    }
    Some(Fixtures {
        upstreams,
        pydeps,
        node,
        python,
        tmp: tempfile::tempdir().expect("temp dir"),
    })
}

impl Fixtures {
    pub fn node_server(&self, name: &str, package: &str, args: &[&str]) -> ServerConfig {
        let script = self.upstreams.join(format!(
            "node/node_modules/@modelcontextprotocol/server-{package}/dist/index.js"
        ));
        let mut all = vec![script.display().to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        stdio(name, &self.node.display().to_string(), all, BTreeMap::new())
    }

    pub fn filesystem(&self, dir: &Path) -> ServerConfig {
        self.node_server("filesystem", "filesystem", &[dir.to_str().unwrap()])
    }

    pub fn memory(&self) -> ServerConfig {
        let mut s = self.node_server("memory", "memory", &[]);
        // Otherwise it writes next to its own code.
        set_env(
            &mut s,
            "MEMORY_FILE_PATH",
            &self.tmp.path().join("memory.jsonl").display().to_string(),
        );
        s
    }

    pub fn everything(&self) -> ServerConfig {
        self.node_server("everything", "everything", &["stdio"])
    }

    pub fn time(&self) -> ServerConfig {
        let mut s = stdio(
            "time",
            &self.python.display().to_string(),
            vec![
                "-m".into(),
                "mcp_server_time".into(),
                "--local-timezone=UTC".into(),
            ],
            BTreeMap::new(),
        );
        let path = self.upstreams.join("python").display().to_string();
        set_env(&mut s, "PYTHONPATH", &path);
        s
    }

    pub fn dynamic(&self) -> ServerConfig {
        let script = self.tmp.path().join("dynamic_server.py");
        std::fs::write(&script, DYNAMIC_SERVER).unwrap();
        let mut s = stdio(
            "dynamic",
            &self.python.display().to_string(),
            vec![script.display().to_string()],
            BTreeMap::new(),
        );
        set_env(&mut s, "PYTHONPATH", &self.pydeps.display().to_string());
        s
    }
}

// Only some test binaries use it.
#[allow(dead_code)]
impl Fixtures {
    /// `tests/upstream/hostile_server.py`: raw JSON-RPC that answers badly on request.
    pub fn hostile(&self) -> ServerConfig {
        let script = self.tmp.path().join("hostile_server.py");
        std::fs::write(&script, HOSTILE_SERVER).unwrap();
        stdio(
            "hostile",
            &self.python.display().to_string(),
            vec![script.display().to_string()],
            BTreeMap::new(),
        )
    }
}

pub fn stdio(
    name: &str,
    command: &str,
    args: Vec<String>,
    env: BTreeMap<String, String>,
) -> ServerConfig {
    ServerConfig {
        name: name.into(),
        transport: TransportConfig::Stdio {
            command: command.into(),
            args,
            env,
        },
    }
}

pub fn set_env(server: &mut ServerConfig, key: &str, value: &str) {
    if let TransportConfig::Stdio { env, .. } = &mut server.transport {
        env.insert(key.into(), value.into());
    }
}

pub fn options() -> UpstreamOptions {
    UpstreamOptions {
        connect_timeout: PATIENCE,
        backoff_initial: Duration::from_millis(200),
        backoff_max: Duration::from_secs(2),
        kill_grace: Duration::from_secs(2),
        ..UpstreamOptions::default()
    }
}

pub fn args(v: Value) -> Option<Map<String, Value>> {
    match v {
        Value::Object(m) => Some(m),
        _ => panic!("arguments must be an object"),
    }
}

pub fn text(result: &CallToolResult) -> String {
    assert_ne!(result.is_error, Some(true), "tool error: {result:?}");
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn status(u: &Upstreams, name: &str) -> ServerStatus {
    u.servers()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no server {name}"))
}

/// Waits (on catalog changes, up to PATIENCE) until `done` holds.
/// SIGKILLs the ready server `name`'s process and waits until its supervisor noticed;
/// returns the pid it had.
pub async fn kill_and_wait_for_loss(u: &Upstreams, name: &str) -> u32 {
    let pid = status(u, name).pid.expect("a ready stdio server has a pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until(u, "the loss is noticed", |u| {
        status(u, name).state != ServerState::Ready
    })
    .await;
    pid
}

pub async fn wait_until(u: &Upstreams, what: &str, done: impl Fn(&Upstreams) -> bool) {
    let mut rx = u.subscribe();
    let deadline = Instant::now() + PATIENCE;
    while !done(u) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting until {what}: {:#?}",
            u.servers()
        );
        // Status changes without a catalog change (failed → reconnecting) need polling too.
        let _ = tokio::time::timeout(Duration::from_millis(100), rx.changed()).await;
    }
}

/// Pids whose process group is `pgid` (zombies included), from /proc.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if rest.split_whitespace().nth(2).and_then(|g| g.parse().ok()) == Some(pgid) {
            pids.push(pid);
        }
    }
    pids
}

pub fn stdio_pids(u: &Upstreams) -> Vec<u32> {
    u.servers().iter().filter_map(|s| s.pid).collect()
}

/// Shuts down and asserts that none of `pgids` has a process left.
pub async fn shutdown_and_check(u: &Upstreams, pgids: &[u32]) {
    u.shutdown().await;
    for &pgid in pgids {
        let left = group_members(pgid);
        assert!(left.is_empty(), "process group {pgid} still has {left:?}");
    }
}

/// server-everything in streamable HTTP mode, started here and stopped on drop.
pub struct HttpEverything {
    pub child: std::process::Child,
    pub port: u16,
}

impl HttpEverything {
    pub fn start(fx: &Fixtures) -> HttpEverything {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        HttpEverything::start_on(fx, port)
    }

    pub fn start_on(fx: &Fixtures, port: u16) -> HttpEverything {
        use std::os::unix::process::CommandExt;
        let script = fx
            .upstreams
            .join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
        let child = std::process::Command::new(&fx.node)
            .arg(script)
            .arg("streamableHttp")
            .env("PORT", port.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let server = HttpEverything { child, port };
        let deadline = Instant::now() + PATIENCE;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "server-everything did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for HttpEverything {
    fn drop(&mut self) {
        let pgid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}
