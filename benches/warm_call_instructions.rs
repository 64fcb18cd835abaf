//! The supervisor's side of a warm call, in instructions: how many the supervisor process
//! executes for one warm `execute_python print(1)` over MCP, counted by valgrind's
//! callgrind (`cargo xtask instructions`; `benches/instruction_budgets.toml` holds the
//! budget). Instruction counts repeat from run to run where seconds do not, so a budget can
//! be checked on a busy machine.
//!
//! Two processes:
//! - this program, natively: verifies the rootfs, forks the spawner (single-threaded, as
//!   `codebox serve` does), then runs itself again under
//!   `valgrind --tool=callgrind` with the spawner's socket, and waits. The spawner, the
//!   zygote and every sandbox stay outside valgrind: the sandbox side runs at its own
//!   speed and is not counted;
//! - the same program under callgrind (`--measure FD`): a `CodeboxServer` built as
//!   `serve` builds it with no configuration (`Settings::defaults`; pool fixed at 1 per
//!   language, so demand never changes its size), on a single-threaded tokio runtime,
//!   served over `stdio_guard` on in-process pipes. A JSON-RPC client in the same
//!   process initializes, makes warm-up calls, then [`CALLS`] measured calls. Each starts
//!   once the server has settled (nothing running, the pool full) and ends once it has
//!   settled again: `measured_call` covers the request's line in, the server's whole work
//!   (admission, pool take, boot frame, output, result, audit-free answer) and everything
//!   the call causes afterwards (the spawner's exit report, the pool's refill up to ready).
//!
//! callgrind counts only while `measured_call` is on the stack (`--toggle-collect`) and
//! writes one dump per call (`--dump-after`); this program prints each call's count and
//! their median as the last line of its output, `instructions <median> <count>...`.
//!
//! Run it with `cargo xtask instructions` (which builds it, finds valgrind, and checks the
//! budget); by hand: `CODEBOX_ROOTFS=target/rootfs target/debug/deps/warm_call_instructions-*`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use codebox::execution::Host;
use codebox::profile::Profile;
use codebox::sandbox::idmap::DEFAULT_ROOT_HOST_ID;
use codebox::sandbox::IdMapping;
use codebox::server::{CodeboxServer, Layers, Settings};
use codebox::spawner::SpawnerClient;
use codebox::upstream::Upstreams;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Calls measured, and warm-up calls before them (first-call work: lazy statics, the
/// first wrapper tree, the zygote's first children).
const CALLS: usize = 7;
const WARM_UP: usize = 3;
/// How long the server may take to settle (the pool refilled) before the run fails.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("--measure") => {
            let fd: i32 = args
                .get(2)
                .and_then(|a| a.parse().ok())
                .expect("--measure FD");
            measure(fd)
        }
        // `cargo bench` passes `--bench`: this is no criterion bench.
        Some("--bench") => {
            println!("warm_call_instructions: run it with `cargo xtask instructions`");
            ExitCode::SUCCESS
        }
        _ => parent(),
    }
}

/// Natively: the spawner, then this program again under callgrind.
fn parent() -> ExitCode {
    let out = std::env::var("CODEBOX_CALLGRIND_OUT").unwrap_or_else(|_| {
        std::env::temp_dir()
            .join(format!(
                "codebox-warm-call.{}.callgrind",
                std::process::id()
            ))
            .display()
            .to_string()
    });
    let dir = match codebox::rootfs::locate(None)
        .and_then(|d| codebox::rootfs::verify(&d, codebox::rootfs::default_stamp_dir().as_deref()))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warm_call_instructions: the rootfs: {e}");
            return ExitCode::from(2);
        }
    };
    let mut host = Host::new(dir, IdMapping::for_current_process(DEFAULT_ROOT_HOST_ID));
    host.zygote = true;
    // SAFETY: no thread exists yet in this process (no runtime has been built).
    let (spawner, sock) = match unsafe { codebox::spawner::start(&host) } {
        Ok(s) => s,
        Err(e) => {
            eprintln!("warm_call_instructions: the spawner: {e}");
            return ExitCode::from(2);
        }
    };
    // The socket must reach the measured process: not close-on-exec.
    if let Err(e) = nix::fcntl::fcntl(
        &sock,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    ) {
        eprintln!("warm_call_instructions: the spawner's socket: {e}");
        return ExitCode::from(2);
    }
    let exe = std::env::current_exe().expect("this program's path");
    let status = Command::new(std::env::var("VALGRIND").unwrap_or_else(|_| "valgrind".into()))
        .arg("--tool=callgrind")
        .arg("--quiet")
        .arg(format!("--callgrind-out-file={out}"))
        .arg("--toggle-collect=warm_call_instructions::measured_call")
        .arg("--dump-after=warm_call_instructions::measured_call")
        .arg("--collect-atstart=no")
        .arg(&exe)
        .arg("--measure")
        .arg(sock.as_raw_fd().to_string())
        .status();
    // The spawner ends (killing and removing what is left) once no process holds the socket.
    drop(sock);
    let _ = nix::sys::wait::waitpid(spawner, None);
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("warm_call_instructions: the measured run failed ({s})");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("warm_call_instructions: cannot run valgrind: {e}");
            return ExitCode::from(2);
        }
    }
    match dumps(&out) {
        Ok(mut counts) if counts.len() == CALLS => {
            let line = counts
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" ");
            counts.sort_unstable();
            println!("instructions {} {line}", counts[CALLS / 2]);
            ExitCode::SUCCESS
        }
        Ok(counts) => {
            eprintln!(
                "warm_call_instructions: {} dumps in {out}.*, not {CALLS}",
                counts.len()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("warm_call_instructions: reading {out}.*: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The instruction count of each dump `out.N` (N from 1), in order; the files are removed.
fn dumps(out: &str) -> std::io::Result<Vec<u64>> {
    let mut counts = Vec::new();
    for n in 1.. {
        let path = format!("{out}.{n}");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(e),
        };
        let total = text
            .lines()
            .find_map(|l| l.strip_prefix("summary: ").or(l.strip_prefix("totals: ")))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("{path} has no summary line")))?;
        counts.push(total);
        let _ = std::fs::remove_file(&path);
    }
    // The final dump at exit (everything after the last call, collected nowhere).
    let _ = std::fs::remove_file(out);
    Ok(counts)
}

/// Under callgrind: the server, the client, the calls.
fn measure(fd: i32) -> ExitCode {
    // SAFETY: the parent passed its open socket at this number for this process to own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let result = rt.block_on(async {
        let client = SpawnerClient::new(sock)?;
        let profile = Profile::load("default")?;
        let ids = IdMapping::for_current_process(DEFAULT_ROOT_HOST_ID);
        let mut settings = Settings::defaults(profile, (ids.host_uid, ids.host_gid))?;
        settings.pool = codebox::pool::Bounds::fixed(1);
        let server = CodeboxServer::new(
            client.clone(),
            settings,
            Layers::new(vec![], false),
            Upstreams::empty(),
        )?;
        anyhow::Ok((client, server))
    });
    let (client, server) = match result {
        Ok(v) => v,
        Err(e) => {
            eprintln!("warm_call_instructions: building the server: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let mut session = rt.block_on(Session::open(&server));
    if let Err(e) = rt.block_on(settle(&server)) {
        eprintln!("warm_call_instructions: the first fill of the pool: {e}");
        return ExitCode::FAILURE;
    }
    for _ in 0..WARM_UP {
        if let Err(e) = rt.block_on(session.call_settled(&server)) {
            eprintln!("warm_call_instructions: a warm-up call: {e}");
            return ExitCode::FAILURE;
        }
    }
    for i in 0..CALLS {
        if let Err(e) = rt.block_on(settle(&server)) {
            eprintln!("warm_call_instructions: before call {i}: {e}");
            return ExitCode::FAILURE;
        }
        if let Err(e) = measured_call(&rt, &mut session, &server) {
            eprintln!("warm_call_instructions: call {i}: {e}");
            return ExitCode::FAILURE;
        }
    }
    rt.block_on(async {
        client.stop();
        server.shutdown().await;
    });
    ExitCode::SUCCESS
}

/// One warm call and everything it causes until the server has settled again: what
/// callgrind counts (see the module documentation).
#[inline(never)]
fn measured_call(
    rt: &tokio::runtime::Runtime,
    session: &mut Session,
    server: &CodeboxServer,
) -> Result<(), String> {
    rt.block_on(session.call_settled(server))
}

/// Waits until nothing runs and the pool is full.
async fn settle(server: &CodeboxServer) -> Result<(), String> {
    let start = Instant::now();
    while !server.settled() {
        if start.elapsed() > SETTLE_LIMIT {
            return Err("the server did not settle (pool full, nothing running)".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// The client's side of an MCP session over in-process pipes, through `stdio_guard` as
/// `codebox serve` reads stdin and writes stdout.
struct Session {
    to_server: tokio::io::DuplexStream,
    from_server: BufReader<tokio::io::DuplexStream>,
    next_id: u64,
    _service: tokio::task::JoinHandle<()>,
}

impl Session {
    async fn open(server: &CodeboxServer) -> Session {
        use rmcp::ServiceExt;
        let (to_server, server_in) = tokio::io::duplex(1 << 20);
        let (server_out, from_server) = tokio::io::duplex(1 << 20);
        let transport = codebox::server::transport::stdio_guard::guard(server_in, server_out);
        let server = server.clone();
        let service = tokio::spawn(async move {
            if let Ok(running) = server.serve(transport).await {
                let _ = running.waiting().await;
            }
        });
        let mut s = Session {
            to_server,
            from_server: BufReader::new(from_server),
            next_id: 1,
            _service: service,
        };
        let init = s
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "warm-call-instructions", "version": "1"},
                }),
            )
            .await
            .expect("initialize");
        assert!(init.get("result").is_some(), "initialize: {init}");
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await
            .expect("initialized");
        s
    }

    async fn send(&mut self, message: &Value) -> Result<(), String> {
        let mut line = serde_json::to_vec(message).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.to_server
            .write_all(&line)
            .await
            .map_err(|e| e.to_string())
    }

    async fn request(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await?;
        let mut line = String::new();
        loop {
            line.clear();
            if self
                .from_server
                .read_line(&mut line)
                .await
                .map_err(|e| e.to_string())?
                == 0
            {
                return Err("the server closed its output".into());
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| format!("{e}: {line}"))?;
            if v.get("id") == Some(&json!(id)) {
                return Ok(v);
            }
        }
    }

    /// `execute_python print(1)`, checked to be warm and right, then the wait until the
    /// server has settled.
    async fn call_settled(&mut self, server: &CodeboxServer) -> Result<(), String> {
        let v = self
            .request(
                "tools/call",
                json!({"name": "execute_python", "arguments": {"code": "print(1)"}}),
            )
            .await?;
        let sc = &v["result"]["structuredContent"];
        if sc["stdout"] != "1\n" || sc["exit_code"] != 0 {
            return Err(format!("print(1) failed: {v}"));
        }
        if sc["start"] != "warm" {
            return Err(format!("the call was not warm: {}", sc["start"]));
        }
        settle(server).await
    }
}
