//! MCP round trips through a real `codebox serve`, measured by criterion:
//! `cargo bench --bench mcp`.
//!
//! - `mcp/execute_python print(1) warm`: one `tools/call execute_python` from an rmcp
//!   client over the server's stdio, served by a pooled sandbox. A sample starts when the
//!   pool is full again (checked with `health`, untimed), so each timed call is warm.
//! - `proxy/call_tool trivial echo`: sandbox → codebox's tool proxy → an upstream MCP
//!   server → back, timed inside the sandbox around `codebox.call_tool` (one execution
//!   makes all the calls of a sample). The upstream is this bench binary itself, started
//!   by codebox with `CODEBOX_BENCH_UPSTREAM=1`: an rmcp server whose one tool echoes its
//!   argument, so the figure is codebox's proxy path, not an SDK's or a tool's work.
//!
//! Skips with the reason when there is no rootfs (`cargo xtask rootfs`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use criterion::Criterion;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{tool, tool_router, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

/// Set in the upstream's environment: run as the trivial upstream server.
const UPSTREAM_ENV: &str = "CODEBOX_BENCH_UPSTREAM";
const POOL_SIZE: u64 = 2;

fn main() {
    if std::env::var_os(UPSTREAM_ENV).is_some() {
        return serve_echo();
    }
    let rootfs = std::env::var_os("CODEBOX_ROOTFS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/rootfs")
        });
    if !rootfs.join(".manifest").exists() {
        eprintln!(
            "SKIP mcp bench: no rootfs at {} (run `cargo xtask rootfs`)",
            rootfs.display()
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = tempfile::tempdir().expect("temp dir");
    let server = rt.block_on(Codebox::start(&rootfs, dir.path()));
    let mut c = Criterion::default()
        .sample_size(50)
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    execute_python_warm(&mut c, &rt, &server);
    proxy_round_trip(&mut c, &rt, &server);
    c.final_summary();
    rt.block_on(server.stop());
}

/// A `codebox serve --pool-size 2` child with the trivial upstream, and an rmcp client
/// on its stdio.
struct Codebox {
    client: RunningService<RoleClient, ()>,
    child: tokio::process::Child,
    stderr_log: std::path::PathBuf,
}

impl Codebox {
    async fn start(rootfs: &std::path::Path, dir: &std::path::Path) -> Codebox {
        let upstream = std::env::current_exe().expect("this bench's path");
        let mcp_config = dir.join("mcp.json");
        let servers = json!({"mcpServers": {"trivial": {
            "command": upstream,
            "env": {UPSTREAM_ENV: "1"},
        }}});
        std::fs::write(&mcp_config, servers.to_string()).expect("write mcp.json");
        let stderr_log = dir.join("codebox-serve.log");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_codebox"))
            .args(["serve", "--pool-size", &POOL_SIZE.to_string()])
            .env("CODEBOX_ROOTFS", rootfs)
            .env("CODEBOX_MCP_CONFIG", &mcp_config)
            .env("CODEBOX_MAX_TOOL_CALLS", "10000000")
            // An empty directory: no ./codebox.toml or ./.mcp.json of the caller's.
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_log).expect("log file"))
            .kill_on_drop(true)
            .spawn()
            .expect("codebox serve starts");
        let io = (
            child.stdout.take().expect("stdout"),
            child.stdin.take().expect("stdin"),
        );
        let client = match ().serve(io).await {
            Ok(c) => c,
            Err(e) => panic!("MCP initialize failed: {e}\n{}", log(&stderr_log)),
        };
        let server = Codebox {
            client,
            child,
            stderr_log,
        };
        server.until_ready().await;
        server
    }

    async fn call(&self, tool: &str, arguments: Value) -> Value {
        let Value::Object(arguments) = arguments else {
            unreachable!("arguments are an object")
        };
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let result = match self.client.call_tool(params).await {
            Ok(r) => r,
            Err(e) => panic!("{tool} failed: {e}\n{}", log(&self.stderr_log)),
        };
        assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
        result.structured_content.unwrap_or(Value::Null)
    }

    /// Until the trivial upstream is connected and the pool holds `POOL_SIZE` Python
    /// sandboxes.
    async fn until_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let health = self.call("health", json!({})).await;
            let idle = &health["pool"]["languages"]["python"]["idle"];
            let upstream = health["upstreams"].as_array().is_some_and(|servers| {
                servers
                    .iter()
                    .any(|s| s["name"] == "trivial" && s["tool_count"] == 1)
            });
            if idle.as_u64() == Some(POOL_SIZE) && upstream {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "codebox serve never got ready: {health:#}\n{}",
                log(&self.stderr_log)
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Closes the client (codebox serve's stdin ends) and waits for the server to exit.
    async fn stop(mut self) {
        let _ = self.client.cancel().await;
        match tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(status) => eprintln!("codebox serve ended badly: {status:?}"),
            Err(_) => {
                eprintln!("codebox serve did not exit 20 s after its stdin closed; killing it");
                let _ = self.child.kill().await;
            }
        }
    }
}

fn log(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn execute_python_warm(c: &mut Criterion, rt: &Runtime, server: &Codebox) {
    c.bench_function("mcp/execute_python print(1) warm", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    server.until_ready().await;
                    let start = Instant::now();
                    let r = server
                        .call("execute_python", json!({"code": "print(1)"}))
                        .await;
                    total += start.elapsed();
                    assert_eq!(r["stdout"], "1\n", "{r:#}");
                    assert_eq!(r["start"], "warm", "{r:#}");
                }
                total
            })
        })
    });
}

fn proxy_round_trip(c: &mut Criterion, rt: &Runtime, server: &Codebox) {
    c.bench_function("proxy/call_tool trivial echo", |b| {
        b.iter_custom(|iters| {
            // The first call, outside the timing, checks the answer and loads the
            // generated wrappers.
            let code = format!(
                "import codebox, time\n\
                 r = codebox.call_tool('trivial__echo', {{'message': 'ping'}})\n\
                 assert 'ping' in str(r), r\n\
                 t = time.perf_counter_ns()\n\
                 for _ in range({iters}):\n    \
                     codebox.call_tool('trivial__echo', {{'message': 'ping'}})\n\
                 print(time.perf_counter_ns() - t)\n"
            );
            let r = rt.block_on(server.call(
                "execute_python",
                json!({"code": code, "timeout_ms": 300_000}),
            ));
            let nanos: u64 = r["stdout"]
                .as_str()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or_else(|| panic!("no timing from the sandbox: {r:#}"));
            Duration::from_nanos(nanos)
        })
    });
}

// ---------------------------------------------------------------------------------------
// The trivial upstream

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct EchoParams {
    message: String,
}

#[derive(Clone)]
struct Echo;

#[tool_router(server_handler)]
impl Echo {
    #[tool(description = "Returns its message.")]
    fn echo(&self, Parameters(EchoParams { message }): Parameters<EchoParams>) -> String {
        message
    }
}

/// Serves `echo` on stdin/stdout until the client goes away.
fn serve_echo() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let running = Echo
            .serve(rmcp::transport::stdio())
            .await
            .expect("the echo server initializes");
        let _ = running.waiting().await;
    });
}
