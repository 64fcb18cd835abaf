//! No helper process's death may leave `codebox serve` refusing work for the rest of its
//! life, and a stop signal ends it at any moment. Each test drives a real `codebox serve`
//! over stdio (`common::serve_stdio`), kills one of the processes it forks — found by the
//! pid `health` names, then checked from outside — and requires the next execution to
//! work and `health` to tell what happened:
//!
//! - the sandbox checker, killed twice before it finished (the test hook
//!   `CODEBOX_TEST_CHECKER_DELAY_MS` holds each checker back so the kill cannot miss):
//!   retried, nothing refused, the checks pass in the end;
//! - the workspace keeper: replaced, and the open session keeps its files;
//! - a Python zygote: counted, Python runs go on (cold, then from a new zygote);
//! - the spawner factory: reported, executions go on with the current spawner;
//! - SIGTERM and SIGINT before and after `initialize`, stdin held open: the process exits.
//!
//! Runs as root and rootless (`cargo xtask test --rootless-only lifecycle`).

mod common;

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Value};

use common::sandbox_available;
use common::serve_stdio::{children_of, sandbox_cgroups, sigkill, wait_until, Server};

/// One server at a time keeps the machine (and the counts) calm.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Generous bound for a state `health` should reach.
const STATE_BOUND: Duration = Duration::from_secs(60);

/// How long each checker waits before its checks (the test hook): ample time to find it
/// in `health` and kill it on a busy host.
const CHECKER_DELAY_MS: &str = "10000";

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// `print(6 * 7)` answers 42.
fn assert_python_runs(server: &mut Server, extra: Value) {
    let mut arguments = json!({"code": "print(6 * 7)", "timeout_ms": 30_000});
    for (k, v) in extra.as_object().unwrap() {
        arguments[k] = v.clone();
    }
    let id = server.send(
        "tools/call",
        json!({"name": "execute_python", "arguments": arguments}),
    );
    let a = server.answer(id, STATE_BOUND);
    assert_eq!(a["result"]["structuredContent"]["stdout"], "42\n", "{a:#}");
}

/// Polls `health` until `found` picks something from it.
fn until_health<T>(
    server: &mut Server,
    what: &str,
    mut found: impl FnMut(&Value) -> Option<T>,
) -> T {
    let until = std::time::Instant::now() + STATE_BOUND;
    loop {
        let h = server.health();
        if let Some(t) = found(&h) {
            return t;
        }
        assert!(
            std::time::Instant::now() < until,
            "{what}: not within {STATE_BOUND:?}; health: {h:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn error_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("ERROR")).collect()
}

/// Ends the server by closing stdin; it must leave no sandbox cgroup.
fn close_cleanly(mut server: Server) {
    let owner = server.pid();
    drop(server.stdin.take());
    assert!(server.exited_within(Duration::from_secs(30)).is_some());
    assert_eq!(sandbox_cgroups(owner), BTreeSet::new());
}

/// The operator's finding: SIGKILL the deferred sandbox checker within the first moments
/// of `serve` and every execution was refused for the life of the process ("this host
/// cannot run the default profile: sandbox checks: the checker ended: Signaled(…)").
/// A checker that dies says nothing about the host: it is retried; executions run
/// meanwhile; the first checker that finishes decides.
#[test]
fn a_killed_sandbox_checker_is_retried_and_refuses_nothing() {
    if !sandbox_available("a_killed_sandbox_checker_is_retried_and_refuses_nothing") {
        return;
    }
    let _one = one_at_a_time();
    let mut server = Server::spawn(
        &["--pool-size", "1", "--pool-max", "1"],
        &[("CODEBOX_TEST_CHECKER_DELAY_MS", CHECKER_DELAY_MS)],
    );
    server.initialize();
    let mut killed = Vec::new();
    for round in 1..=2u64 {
        let (pid, h) = until_health(&mut server, "a checker runs", |h| {
            let c = &h["sandbox_checker"];
            let pid = c["pid"].as_i64()? as i32;
            (c["running"] == true && !killed.contains(&pid)).then(|| (pid, h.clone()))
        });
        // Only the test's kills end checkers early.
        assert_eq!(
            h["sandbox_checker"]["unfinished"],
            json!(round - 1),
            "{h:#}\n{}",
            server.log()
        );
        // It is the checker: named so, and a child of the spawner factory (serve's child).
        assert_eq!(
            comm(pid),
            "codebox-checks",
            "round {round}, pid {pid}: {}",
            server.log()
        );
        let factory = parent_of(pid).expect("the checker's parent");
        assert_eq!(parent_of(factory), Some(server.pid()));
        sigkill(pid);
        killed.push(pid);
        let h = until_health(&mut server, "the kill is seen", |h| {
            (h["sandbox_checker"]["unfinished"] == json!(round)).then(|| h.clone())
        });
        let state = h["ready"]["sandbox_checks"]["unfinished"]
            .as_str()
            .unwrap_or_default();
        assert!(
            state.contains("SIGKILL") && state.contains("not refused"),
            "round {round}: the state is {:#}\nthe checker: {:#}\n{}",
            h["ready"]["sandbox_checks"],
            h["sandbox_checker"],
            server.log()
        );
        assert_eq!(h["ready"]["ready"], false, "{h:#}");
    }
    // Nothing is refused while the checks are retried (the third checker is held back).
    assert_python_runs(&mut server, json!({}));
    let h = until_health(&mut server, "the checks pass", |h| {
        (h["ready"]["sandbox_checks"] == "passed").then(|| h.clone())
    });
    let c = &h["sandbox_checker"];
    assert_eq!(
        (c["attempts"].as_u64(), c["unfinished"].as_u64()),
        (Some(3), Some(2)),
        "{h:#}"
    );
    assert!(
        c["last_reason"]
            .as_str()
            .is_some_and(|r| r.contains("killed by SIGKILL")),
        "{h:#}"
    );
    assert!(h["layers"].as_array().is_some_and(|l| l
        .iter()
        .any(|l| l["layer"] == "python in sandbox" && l["status"] == "ok")));
    assert_python_runs(&mut server, json!({}));
    // Its dead checkers are reaped (no zombie left under the factory).
    for pid in killed {
        assert!(
            parent_of(pid).is_none(),
            "checker {pid} still in the process table"
        );
    }
    let log = server.log();
    assert_eq!(
        log.matches("a sandbox checker did not finish").count(),
        2,
        "one WARN line per event: {log}"
    );
    assert_eq!(error_lines(&log), Vec::<&str>::new(), "{log}");
    close_cleanly(server);
}

/// The keeper makes each session's workspace filesystem and copies it for every run. A
/// killed keeper is replaced by the next request (in the dead one's namespaces), and the
/// open session's next run finds its files.
#[test]
fn a_killed_workspace_keeper_is_replaced_and_sessions_keep_their_files() {
    if !sandbox_available("a_killed_workspace_keeper_is_replaced_and_sessions_keep_their_files") {
        return;
    }
    let _one = one_at_a_time();
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let owner = server.pid();
    let id = server.send(
        "tools/call",
        json!({"name": "execute_python", "arguments": {
            "code": "open('/workspace/kept.txt', 'w').write('still here')",
            "session": "new"}}),
    );
    let a = server.answer(id, STATE_BOUND);
    let session = a["result"]["structuredContent"]["session"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {a:#}"))
        .to_string();
    // The keeper: serve's child other than the factory (the spawner's parent), named so
    // (an older codebox left it the forking thread's name).
    let spawner = server.spawner_pid();
    let factory = parent_of(spawner).expect("the spawner's parent");
    let keepers: Vec<i32> = children_of(owner)
        .into_iter()
        .filter(|&p| {
            p != factory && ["codebox-keeper", "tokio-rt-worker"].contains(&comm(p).as_str())
        })
        .collect();
    assert_eq!(
        keepers.len(),
        1,
        "serve's children besides the factory: {keepers:?}"
    );
    let keeper = keepers[0];
    sigkill(keeper);
    wait_until("the keeper dies", Duration::from_secs(15), || {
        std::fs::read_to_string(format!("/proc/{keeper}/stat")).map_or(true, |s| {
            s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z'))
        })
    });
    let id = server.send(
        "tools/call",
        json!({"name": "execute_python", "arguments": {
            "code": "print(open('/workspace/kept.txt').read())", "session": session}}),
    );
    let a = server.answer(id, STATE_BOUND);
    assert_eq!(
        a["result"]["structuredContent"]["stdout"], "still here\n",
        "{a:#}"
    );
    let h = server.health();
    let k = &h["sessions"]["keeper"];
    assert_eq!(k["restarts"], 1, "{h:#}");
    assert_eq!(k["alive"], true, "{h:#}");
    assert_ne!(k["pid"], json!(keeper), "{h:#}");
    assert!(
        k["last_reason"]
            .as_str()
            .is_some_and(|r| r.contains("SIGKILL")),
        "{h:#}"
    );
    // A new session works too.
    assert_python_runs(&mut server, json!({"session": "new"}));
    let log = server.log();
    assert_eq!(
        log.matches("the workspace keeper died").count(),
        1,
        "one WARN line per event: {log}"
    );
    assert_eq!(error_lines(&log), Vec::<&str>::new(), "{log}");
    close_cleanly(server);
}

/// A zygote (the Python interpreter pooled sandboxes are forked from) that is killed
/// takes its children along; Python runs go on cold, a new zygote follows later, and
/// `health` counts the death with how it ended.
#[test]
fn a_killed_zygote_is_counted_and_python_runs_go_on() {
    if !sandbox_available("a_killed_zygote_is_counted_and_python_runs_go_on") {
        return;
    }
    let _one = one_at_a_time();
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let zygote = until_health(&mut server, "a zygote runs", |h| {
        h["spawner"]["zygotes"]["live"][0]
            .as_i64()
            .map(|p| p as i32)
    });
    // It is one of the server's sandboxes (its cgroup says so).
    let cgroup = std::fs::read_to_string(format!("/proc/{zygote}/cgroup")).unwrap_or_default();
    assert!(
        cgroup.contains(&format!("/codebox-{}-", server.pid())),
        "{cgroup}"
    );
    sigkill(zygote);
    let h = until_health(&mut server, "the zygote's death is counted", |h| {
        (h["spawner"]["zygotes"]["died"] == 1).then(|| h.clone())
    });
    let z = &h["spawner"]["zygotes"];
    assert!(
        z["last_death_reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{h:#}"
    );
    assert!(
        !z["live"].as_array().unwrap().contains(&json!(zygote)),
        "{h:#}"
    );
    assert_python_runs(&mut server, json!({}));
    server.until_pool_ready();
    assert_python_runs(&mut server, json!({}));
    let log = server.log();
    assert_eq!(
        log.matches("a zygote died").count(),
        1,
        "one WARN line per event: {log}"
    );
    assert_eq!(error_lines(&log), Vec::<&str>::new(), "{log}");
    close_cleanly(server);
}

/// The factory cannot be re-forked once the server runs threads: its death is reported
/// (health, one ERROR line), executions go on with the current spawner, and only when
/// that spawner dies too does the server exit (70), naming the factory.
#[test]
fn a_killed_factory_is_reported_and_executions_go_on() {
    if !sandbox_available("a_killed_factory_is_reported_and_executions_go_on") {
        return;
    }
    let _one = one_at_a_time();
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let owner = server.pid();
    let spawner = server.spawner_pid();
    let factory = parent_of(spawner).expect("the spawner's parent");
    assert_eq!(parent_of(factory), Some(owner));
    sigkill(factory);
    let h = until_health(&mut server, "the factory's death is seen", |h| {
        (h["spawner"]["factory"]["alive"] == false).then(|| h.clone())
    });
    let f = &h["spawner"]["factory"];
    assert_eq!(f["pid"], json!(factory), "{h:#}");
    assert!(
        f["died"]["how"]
            .as_str()
            .is_some_and(|r| r.contains("SIGKILL")),
        "{h:#}"
    );
    assert_python_runs(&mut server, json!({}));
    let log = server.log();
    let errors = error_lines(&log);
    assert_eq!(errors.len(), 1, "{log}");
    assert!(errors[0].contains("spawner factory died"), "{log}");

    sigkill(spawner);
    let status = server
        .exited_within(Duration::from_secs(30))
        .expect("the server exits when its spawner cannot be replaced");
    assert_eq!(status.code(), Some(70), "{status:?}");
    std::thread::sleep(Duration::from_millis(200));
    let log = server.log();
    assert!(
        log.contains("cannot be replaced") && log.contains("spawner factory"),
        "{log}"
    );
    common::serve_stdio::remove_left_cgroups(owner);
}

/// The operator's finding: `codebox serve` on stdio, stdin open, ignored SIGTERM and
/// SIGINT until a client initialized. Both end it before and after `initialize`, stdin
/// held open all along (during an execution: `lifecycle.rs`).
#[test]
fn stop_signals_end_serve_before_and_after_initialize() {
    if !sandbox_available("stop_signals_end_serve_before_and_after_initialize") {
        return;
    }
    let _one = one_at_a_time();
    for initialized in [false, true] {
        for signal in [
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::Signal::SIGINT,
        ] {
            let mut server = Server::spawn(&["--pool-size", "1", "--pool-max", "1"], &[]);
            let owner = server.pid();
            // Serving: its runtime (and with it the signal handling) is up once the
            // sandbox checks report (a signal before that ends it by default).
            wait_until("serve is up", STATE_BOUND, || {
                server.log().contains("sandbox checks passed")
            });
            if initialized {
                server.initialize();
            }
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(owner), signal).expect("signal");
            let status = server.exited_within(Duration::from_secs(20));
            assert!(
                status.is_some(),
                "{signal} {}: still running with stdin open; log: {}",
                if initialized {
                    "after initialize"
                } else {
                    "before initialize"
                },
                server.log()
            );
            assert!(server.stdin.is_some());
            std::thread::sleep(Duration::from_millis(200));
            let log = server.log();
            assert_eq!(error_lines(&log), Vec::<&str>::new(), "{log}");
            assert_eq!(sandbox_cgroups(owner), BTreeSet::new());
        }
    }
}
