//! `/metrics` end to end: a real `codebox serve` runs Python and TypeScript executions
//! (ok, error, timeout, refused) and a real Prometheus (Debian's `prometheus`) scrapes
//! its `--metrics` listener every second; the values its HTTP API returns must be the
//! executions that were run. Also: the executions-in-flight gauge while one runs,
//! series that stay bounded under calls to unknown tools, bad requests to both
//! listeners, and `/metrics` behind the bearer token on the MCP listener.
//!
//! The server is driven over stdio with raw JSON-RPC (a reader thread collects the
//! answers); HTTP is spoken by hand over loopback (HTTP/1.0, so no response is chunked).
//! Prometheus and codebox are stopped by pid when the test ends, however it ends.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{sandbox_available, strict};

/// The tests here each start a server with its own sandboxes; one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A `codebox serve` on stdio; killed when dropped.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    answers: mpsc::Receiver<Value>,
    pending: HashMap<u64, Value>,
    next_id: u64,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    fn start(extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(common::codebox_bin())
            .arg("serve")
            .args(extra)
            .env("CODEBOX_ROOTFS", common::rootfs_dir())
            .env("RUST_LOG", "codebox=info")
            .envs(env.iter().copied())
            // A directory without `.mcp.json`: no upstream servers.
            .current_dir(common::rootfs_dir())
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

    /// `initialize` and `notifications/initialized` over stdio.
    fn initialize(&mut self) {
        let id = self.send(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "codebox-metrics-tests", "version": "0"}}),
        );
        self.answer(id, Duration::from_secs(60));
        self.write(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    }

    fn write(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").expect("write to codebox serve");
        stdin.flush().expect("flush");
    }

    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    fn answer(&mut self, id: u64, within: Duration) -> Value {
        let until = Instant::now() + within;
        loop {
            if let Some(v) = self.pending.remove(&id) {
                return v;
            }
            let left = until
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no answer to request {id} within {within:?}"));
            if let Ok(v) = self.answers.recv_timeout(left) {
                let got = v["id"].as_u64().unwrap_or_default();
                self.pending.insert(got, v);
            }
        }
    }

    fn execute(&mut self, tool: &str, arguments: Value) -> u64 {
        self.send("tools/call", json!({"name": tool, "arguments": arguments}))
    }

    /// Runs a call to its end; its result.
    fn run(&mut self, tool: &str, arguments: Value) -> Value {
        let id = self.execute(tool, arguments);
        self.answer(id, Duration::from_secs(120))["result"].clone()
    }

    /// The address a line `codebox: serving <what> at http://ADDR/...` names.
    fn listening(&self, what: &str) -> SocketAddr {
        let marker = format!("serving {what} at http://");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let log = self.stderr.lock().unwrap().clone();
            if let Some(rest) = log.split(&marker).nth(1) {
                let addr = rest.split('/').next().unwrap();
                return addr.parse().expect("an address");
            }
            assert!(
                Instant::now() < until,
                "codebox never said where it serves {what}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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

/// A Prometheus with its storage in a temporary directory; killed and removed when
/// dropped.
struct Prometheus {
    child: Child,
    web: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `target` every second.
    fn start(target: SocketAddr) -> Prometheus {
        let dir = tempfile::Builder::new()
            .prefix("codebox-test-prometheus-")
            .tempdir()
            .expect("temporary directory");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: codebox\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let web = free_port();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts");
        let p = Prometheus {
            child,
            web,
            _dir: dir,
        };
        wait_until("prometheus is ready", Duration::from_secs(60), || {
            http(p.web, "GET", "/-/ready", &[]).is_ok_and(|r| r.status == 200)
        });
        p
    }

    /// An instant query's result vector.
    fn query(&self, promql: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", percent(promql));
        let r = http(self.web, "GET", &path, &[]).expect("the Prometheus API answers");
        assert_eq!(r.status, 200, "{}", r.body);
        let v: Value = serde_json::from_str(&r.body).expect("JSON");
        assert_eq!(v["status"], "success", "{v}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn percent(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn wait_until(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let until = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < until, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Answer {
    status: u16,
    headers: String,
    body: String,
}

/// One HTTP/1.0 request (the server closes the connection after the answer).
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("{method} {path} HTTP/1.0\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok(Answer {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_string(),
    })
}

/// The samples of an exposition: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

fn scrape(addr: SocketAddr) -> BTreeMap<String, f64> {
    let r = http(addr, "GET", "/metrics", &[]).expect("/metrics answers");
    assert_eq!(r.status, 200, "{}", r.body);
    samples(&r.body)
}

/// Whether Prometheus is here; missing is a failure under `CODEBOX_TEST_STRICT=1`.
fn prometheus_available(test: &str) -> bool {
    if Path::new(PROMETHEUS).exists() {
        return true;
    }
    let why = format!("{PROMETHEUS} is missing (Debian package prometheus)");
    assert!(!strict(), "{test}: required tool missing: {why}");
    eprintln!("SKIP {test}: {why}");
    false
}

/// `sum by (language, outcome)` of `codebox_executions_total` as Prometheus has it, the
/// series at 0 left out.
fn executions_in_prometheus(p: &Prometheus) -> BTreeMap<(String, String), u64> {
    p.query("sum by (language, outcome) (codebox_executions_total) > 0")
        .iter()
        .map(|s| {
            let m = &s["metric"];
            let value: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
            (
                (
                    m["language"].as_str().unwrap().to_string(),
                    m["outcome"].as_str().unwrap().to_string(),
                ),
                value as u64,
            )
        })
        .collect()
}

#[test]
fn prometheus_scrapes_what_was_run() {
    let test = "prometheus_scrapes_what_was_run";
    if !sandbox_available(test) || !prometheus_available(test) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&["--metrics", "127.0.0.1:0", "--pool-size", "1"], &[]);
    server.initialize();
    let metrics = server.listening("metrics");
    let prometheus = Prometheus::start(metrics);

    // What is run, and what each should count as.
    let runs: [(&str, Value, (&str, &str)); 7] = [
        (
            "execute_python",
            json!({"code": "print(1)"}),
            ("python", "ok"),
        ),
        (
            "execute_python",
            json!({"code": "print(2)"}),
            ("python", "ok"),
        ),
        (
            "execute_python",
            json!({"code": "1/0"}),
            ("python", "error"),
        ),
        (
            "execute_python",
            json!({"code": "while True: pass", "timeout_ms": 1000}),
            ("python", "timeout"),
        ),
        (
            "execute_python",
            json!({"code": "print(1)", "timeout_ms": 0}),
            ("python", "refused"),
        ),
        (
            "execute_typescript",
            json!({"code": "console.log(1)"}),
            ("typescript", "ok"),
        ),
        (
            "execute_typescript",
            json!({"code": "throw new Error('no')"}),
            ("typescript", "error"),
        ),
    ];
    let mut expected: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (tool, arguments, (language, outcome)) in runs {
        let r = server.run(tool, arguments.clone());
        assert_eq!(
            r["isError"].as_bool().unwrap_or(false),
            outcome != "ok",
            "{tool} {arguments}: {r}"
        );
        *expected
            .entry((language.to_string(), outcome.to_string()))
            .or_default() += 1;
    }

    // The gauge the autoscaler reads: 1 while a program runs, 0 after its answer.
    let sleeping = server.execute(
        "execute_python",
        json!({"code": "import time; time.sleep(3)"}),
    );
    wait_until("in flight while running", Duration::from_secs(30), || {
        scrape(metrics).get("codebox_executions_in_flight") == Some(&1.0)
    });
    server.answer(sleeping, Duration::from_secs(60));
    *expected.entry(("python".into(), "ok".into())).or_default() += 1;
    assert_eq!(scrape(metrics)["codebox_executions_in_flight"], 0.0);

    // Our own scrape has exactly these, summed over starts.
    let own = scrape(metrics);
    let mut summed: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (series, v) in &own {
        let Some(labels) = series.strip_prefix("codebox_executions_total{") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches(['"', '}']).to_string())
                .unwrap()
        };
        if *v > 0.0 {
            *summed
                .entry((label("language"), label("outcome")))
                .or_default() += *v as u64;
        }
    }
    assert_eq!(summed, expected, "codebox's own exposition");
    assert_eq!(
        own[r#"codebox_admission_refusals_total{reason="invalid_arguments"}"#],
        1.0
    );
    assert!(own[r#"codebox_sandbox_cpu_seconds_total{language="python"}"#] > 0.0);
    assert_eq!(
        own[r#"codebox_sandbox_memory_peak_bytes_count{language="typescript"}"#],
        2.0
    );

    // Prometheus sees the same, from a scrape after the last execution.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let seen = executions_in_prometheus(&prometheus);
        if seen == expected {
            break;
        }
        assert!(
            Instant::now() < until,
            "Prometheus has {seen:?}, expected {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let up = prometheus.query("up{job=\"codebox\"}");
    assert_eq!(up[0]["value"][1], "1", "{up:?}");
    // The floor as configured; the target follows demand between it and the ceiling.
    let floor = prometheus.query("codebox_pool_floor{language=\"python\"}");
    assert_eq!(floor[0]["value"][1], "1", "{floor:?}");
    let ceiling = prometheus.query("codebox_pool_ceiling{language=\"python\"}");
    assert_eq!(ceiling[0]["value"][1], "8", "{ceiling:?}");
    let p99 = prometheus.query(
        "histogram_quantile(0.99, sum by (le) (codebox_execution_duration_seconds_bucket{language=\"python\"}))",
    );
    let p99: f64 = p99[0]["value"][1].as_str().unwrap().parse().unwrap();
    // The 1 s timeout and the 3 s sleep are among the calls.
    assert!(p99 >= 1.0, "p99 {p99}");
}

#[test]
fn series_stay_bounded_and_bad_requests_get_clear_answers() {
    let test = "series_stay_bounded_and_bad_requests_get_clear_answers";
    if !sandbox_available(test) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let token = "metrics-test-token";
    let server = Server::start(
        &[
            "--http",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--pool-size",
            "0",
        ],
        &[("CODEBOX_HTTP_TOKEN", token)],
    );
    let mcp = server.listening("MCP");
    let metrics = server.listening("metrics");
    let bearer = format!("Bearer {token}");

    // The MCP listener's /metrics: the token, the Host check, GET only.
    let r = http(mcp, "GET", "/metrics", &[]).unwrap();
    assert_eq!(r.status, 401, "{}", r.body);
    let r = http(mcp, "GET", "/metrics", &[("Authorization", "Bearer wrong")]).unwrap();
    assert_eq!(r.status, 401);
    let r = http(mcp, "GET", "/metrics", &[("Authorization", &bearer)]).unwrap();
    assert_eq!(r.status, 200);
    assert!(
        r.headers
            .contains("content-type: text/plain; version=0.0.4"),
        "{}",
        r.headers
    );
    assert!(r.body.contains("# TYPE codebox_executions_in_flight gauge"));
    let r = http(
        mcp,
        "GET",
        "/metrics",
        &[
            ("Authorization", &bearer),
            ("Accept", "application/openmetrics-text;version=1.0.0"),
        ],
    )
    .unwrap();
    assert!(
        r.headers
            .contains("content-type: application/openmetrics-text"),
        "{}",
        r.headers
    );
    assert!(r.body.ends_with("# EOF\n"));
    let r = http(
        mcp,
        "GET",
        "/metrics",
        &[("Authorization", &bearer), ("Host", "rebound.example:80")],
    )
    .unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    let r = http(mcp, "POST", "/metrics", &[("Authorization", &bearer)]).unwrap();
    assert_eq!(r.status, 405, "{}", r.body);

    // The plain listener: /metrics and the probes, GET only, no token needed; huge
    // headers refused. /readyz says its status only, whatever the token.
    assert_eq!(http(metrics, "GET", "/metrics", &[]).unwrap().status, 200);
    let r = http(metrics, "GET", "/healthz", &[]).unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    for headers in [&[][..], &[("Authorization", bearer.as_str())][..]] {
        let r = http(metrics, "GET", "/readyz", headers).unwrap();
        assert!(r.status == 200 || r.status == 503, "{}", r.status);
        let value: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(
            value.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["draining", "ready"],
            "{value}"
        );
    }
    assert_eq!(http(metrics, "POST", "/readyz", &[]).unwrap().status, 405);
    assert_eq!(http(metrics, "POST", "/metrics", &[]).unwrap().status, 405);
    assert_eq!(
        http(metrics, "DELETE", "/metrics", &[]).unwrap().status,
        405
    );
    assert_eq!(http(metrics, "GET", "/mcp", &[]).unwrap().status, 404);
    assert_eq!(http(metrics, "GET", "/health", &[]).unwrap().status, 404);
    let huge = "x".repeat(1 << 20);
    let r = http(metrics, "GET", "/metrics", &[("X-Filler", &huge)]);
    assert!(
        r.as_ref().is_err() || r.as_ref().is_ok_and(|r| r.status == 431),
        "a 1 MiB header is refused: {:?}",
        r.map(|r| r.status)
    );
    let before = scrape(metrics).len();

    // Thousands of calls naming unknown tools and servers, and of unknown MCP tools: no
    // series appears.
    let mut stdio = Server::start(&["--metrics", "127.0.0.1:0", "--pool-size", "0"], &[]);
    stdio.initialize();
    let stdio_metrics = stdio.listening("metrics");
    let stdio_before = scrape(stdio_metrics);
    let r = stdio.run(
        "execute_python",
        json!({"code": "import codebox\nn = 0\nfor i in range(900):\n    try:\n        codebox.call_tool(f'server{i}__tool{i}', {})\n    except Exception:\n        n += 1\nprint(n)"}),
    );
    assert!(
        r["structuredContent"]["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("900"),
        "{r}"
    );
    for i in 0..2000 {
        stdio.execute(&format!("no_such_tool_{i}"), json!({}));
    }
    let last = stdio.execute("no_such_tool_last", json!({}));
    stdio.answer(last, Duration::from_secs(60));
    let stdio_after = scrape(stdio_metrics);
    let names = |m: &BTreeMap<String, f64>| m.keys().cloned().collect::<Vec<_>>();
    // Only the execution's own histogram series (one language, one start) are new.
    let new: Vec<String> = names(&stdio_after)
        .into_iter()
        .filter(|k| !stdio_before.contains_key(k))
        .collect();
    assert!(
        new.iter()
            .all(|k| k.starts_with("codebox_execution_duration_seconds")
                || k.starts_with("codebox_sandbox_memory_peak_bytes")),
        "{new:?}"
    );
    assert!(new.len() <= 2 * (16 + 2), "{new:?}");
    // The HTTP server's series did not move either.
    assert_eq!(scrape(metrics).len(), before);
}
