//! A sandbox's limits must not depend on the supervisor staying alive, and the server must
//! survive its spawner's death: SIGKILL the spawner, the server, or both while sandboxes
//! spin (pooled and cold, with a 5 s and a long timeout); stop the server so only the
//! sandbox's own deadline is left; SIGTERM a stdio server whose stdin stays open.
//!
//! Every test drives a real `codebox serve` over stdio with raw JSON-RPC (a reader thread
//! collects the answers) and finds the sandboxes through the host's cgroups
//! (`codebox-<server pid>-…` below this process's own), so it runs as root and rootless.
//! Deaths are asserted within generous bounds, never latencies.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::json;

use common::sandbox_available;
use common::serve_stdio::{
    children_of, is_error_with, remove_left_cgroups, sandbox_cgroups, sandbox_processes, sigkill,
    wait_until, Server, DEATH_BOUND,
};

/// The tests here each start servers with their own sandboxes; one at a time keeps the
/// machine (and the counts) calm.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Live processes of the server's sandboxes that have used over 0.7 s of CPU: the
/// spinning loops (an interpreter starting up for the pool uses far less).
/// Sandbox processes that burn CPU now: more than 30% of one core over a 400 ms window.
/// (Total CPU time would count an idle pooled interpreter that spent a second importing
/// its preload; a high share misses a spinner starved by a busy host.) Tests wait for a
/// spinner with this, then for those very pids to be gone (see [`alive`]).
fn spinning_pids(owner: i32) -> BTreeSet<i32> {
    const WINDOW: Duration = Duration::from_millis(400);
    // SAFETY: sysconf takes an integer.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let before: Vec<(i32, u64)> = sandbox_processes(owner)
        .into_iter()
        .filter_map(|pid| Some((pid, cpu_ticks(pid)?)))
        .collect();
    std::thread::sleep(WINDOW);
    let window_ticks = ticks * WINDOW.as_millis() as u64 / 1000;
    before
        .into_iter()
        .filter(|&(pid, used)| {
            cpu_ticks(pid).is_some_and(|now| (now - used.min(now)) * 10 > window_ticks * 3)
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// User + system CPU ticks of a live (not zombie) process.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3 of stat, utime 14 and stime 15.
    if fields.first() == Some(&"Z") {
        return None;
    }
    let cpu = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    Some(cpu(11).unwrap_or(0) + cpu(12).unwrap_or(0))
}

/// How many of `pids` still live (zombies count as gone).
fn alive(pids: &BTreeSet<i32>) -> usize {
    pids.iter().filter(|&&pid| cpu_ticks(pid).is_some()).count()
}

/// How many sampling windows in a row a process must spin to count as a spinner.
const STEADY_WINDOWS: u32 = 3;

/// Waits until at least `n` sandbox processes spin, and keep spinning: a process counts
/// once it burnt CPU through [`STEADY_WINDOWS`] windows in a row. A sandbox that starts
/// beside the spinners (the pool's refill, whose setup can take a few hundred ms of CPU on
/// a busy host) then goes idle is not taken for one: it would stay alive, and a test
/// waiting for the spinners' end would wait for it instead.
fn until_spinning(owner: i32, n: usize, what: &str) -> BTreeSet<i32> {
    let until = Instant::now() + Duration::from_secs(30);
    let mut streaks: HashMap<i32, u32> = HashMap::new();
    loop {
        let now = spinning_pids(owner);
        streaks.retain(|pid, _| now.contains(pid));
        for &pid in &now {
            *streaks.entry(pid).or_default() += 1;
        }
        let steady: BTreeSet<i32> = streaks
            .iter()
            .filter(|&(_, &windows)| windows >= STEADY_WINDOWS)
            .map(|(&pid, _)| pid)
            .collect();
        if steady.len() >= n {
            return steady;
        }
        assert!(
            Instant::now() < until,
            "{what}: not within 30 s; spinning in the last window: {}",
            describe(&now)
        );
    }
}

/// Each of `pids` as the test sees it: state, CPU ticks, command line and cgroup path, so
/// a failure says what it waited for.
fn describe(pids: &BTreeSet<i32>) -> String {
    let mut out = String::new();
    for &pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("gone");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .unwrap_or_default();
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|c| {
                c.lines()
                    .find(|l| l.contains("/codebox-"))
                    .map(str::to_string)
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "\n  pid {pid} state {state} ticks {:?} cmd {:?} cgroup {cgroup}",
            cpu_ticks(pid),
            cmdline.trim()
        ));
    }
    if out.is_empty() {
        out.push_str("none");
    }
    out
}

const SPIN: &str = "while True: pass";

/// One pooled spinner with a 5 s timeout and one cold one with a long timeout; returns
/// their request ids and the spinning processes once both spin.
fn start_spinners(server: &mut Server) -> (u64, u64, BTreeSet<i32>) {
    server.until_pool_ready();
    // The pool holds one python sandbox (a fixed pool: `--pool-max 1`, so no burst grows
    // it and no extra preloading interpreter burns CPU beside the spinners): the first
    // call takes it, the second is cold.
    let pooled = server.execute(SPIN, 5_000);
    let cold = server.execute(SPIN, 300_000);
    let spinners = until_spinning(server.pid(), 2, "two sandboxes spin");
    (pooled, cold, spinners)
}

#[test]
fn a_killed_spawner_takes_its_sandboxes_along_and_is_replaced() {
    if !sandbox_available("a_killed_spawner_takes_its_sandboxes_along_and_is_replaced") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let owner = server.pid();
    let old_spawner = server.spawner_pid();
    // A Ctrl-C or a service manager's SIGTERM to every process is the server's to handle
    // (drain): the spawner and the factory ignore it.
    for pid in [old_spawner, children_of(owner)[0]] {
        for sig in [
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::Signal::SIGHUP,
        ] {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("signal");
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.health()["spawner"]["restarts"], 0);
    let (pooled, cold, spinners) = start_spinners(&mut server);
    let before = sandbox_cgroups(owner);
    assert!(before.len() >= 2, "no sandbox cgroups found: {before:?}");

    let killed = Instant::now();
    sigkill(old_spawner);

    // Every process of the old sandboxes is gone, and so are their cgroups.
    wait_until("the spinning sandboxes die", DEATH_BOUND, || {
        alive(&spinners) == 0
    });
    let died = killed.elapsed();
    // Both executions are answered with an error naming the loss.
    for id in [pooled, cold] {
        let a = server.answer(id, DEATH_BOUND);
        assert!(is_error_with(&a, "spawner"), "answer: {a:#}");
    }
    let answered = killed.elapsed();
    wait_until(
        "the dead spawner's cgroups are removed",
        DEATH_BOUND,
        || sandbox_cgroups(owner).is_disjoint(&before),
    );
    eprintln!(
        "measured: spawner SIGKILL -> sandboxes stopped spinning {died:?}, both answered \
         {answered:?}, old cgroups gone {:?}",
        killed.elapsed()
    );
    // A new spawner serves the next execution; health tells the story.
    let id = server.execute("print(6 * 7)", 30_000);
    let a = server.answer(id, Duration::from_secs(60));
    assert_eq!(a["result"]["structuredContent"]["stdout"], "42\n", "{a:#}");
    // The program does not inherit the spawner's ignored stop signals.
    let id = server.execute(
        "print(next(l for l in open('/proc/self/status') if l.startswith('SigIgn')).split()[1])",
        30_000,
    );
    let a = server.answer(id, Duration::from_secs(60));
    let ignored = a["result"]["structuredContent"]["stdout"]
        .as_str()
        .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no SigIgn: {a:#}"));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        assert_eq!(
            ignored & (1 << (sig - 1)),
            0,
            "signal {sig} ignored: {ignored:x}"
        );
    }
    let h = server.health();
    assert_eq!(h["spawner"]["restarts"], 1, "{h:#}");
    assert_ne!(h["spawner"]["pid"], json!(old_spawner), "{h:#}");
    assert!(
        h["spawner"]["last_reason"]
            .as_str()
            .is_some_and(|r| r.contains("SIGKILL")),
        "{h:#}"
    );
    // The pool refills from the new spawner.
    server.until_pool_ready();
    let log = server.log();
    assert_eq!(
        log.matches("a new spawner started").count(),
        1,
        "one log line per event: {log}"
    );
    assert!(!log.lines().any(|l| l.contains("ERROR")), "{log}");
    assert!(!log.contains("called after complete"), "{log}");
    assert!(!log.contains("panicked"), "{log}");

    // A clean exit afterwards leaves nothing behind.
    drop(server.stdin.take());
    assert!(server.exited_within(Duration::from_secs(30)).is_some());
    assert_eq!(sandbox_cgroups(owner), BTreeSet::new());
}

#[test]
fn a_killed_server_takes_its_sandboxes_along() {
    if !sandbox_available("a_killed_server_takes_its_sandboxes_along") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for also_the_spawner in [false, true] {
        let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
        let owner = server.pid();
        let spawner = server.spawner_pid();
        start_spinners(&mut server);
        if also_the_spawner {
            sigkill(spawner);
        }
        let killed = Instant::now();
        sigkill(owner);
        let _ = server.child.wait();
        wait_until("the sandboxes die with the server", DEATH_BOUND, || {
            sandbox_processes(owner).is_empty()
        });
        let died = killed.elapsed();
        wait_until("no cgroup of the server is left", DEATH_BOUND, || {
            sandbox_cgroups(owner).is_empty()
        });
        eprintln!(
            "measured: server SIGKILL (spawner too: {also_the_spawner}) -> sandboxes gone \
             {died:?}, cgroups gone {:?}",
            killed.elapsed()
        );
    }
}

#[test]
fn a_stopped_server_cannot_stretch_a_timeout() {
    if !sandbox_available("a_stopped_server_cannot_stretch_a_timeout") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let owner = server.pid();
    server.until_pool_ready();
    // Pooled, then cold: each sandbox's init knows the run's deadline (armed at the
    // code's delivery), so it ends the run even though the server's timer cannot fire.
    // The second run asks for a session: the pool does not serve it (a workspace), so it
    // runs in a sandbox started for it. The third keeps a session's interpreter alive
    // (armed per run, not per sandbox).
    for (kind, extra) in [
        ("pooled", json!({})),
        ("cold", json!({"session": "new"})),
        ("keep-alive", json!({"session": "new", "keep_alive": true})),
    ] {
        let mut arguments = json!({"code": SPIN, "timeout_ms": 5_000});
        for (k, v) in extra.as_object().unwrap() {
            arguments[k] = v.clone();
        }
        let id = server.send(
            "tools/call",
            json!({"name": "execute_python", "arguments": arguments}),
        );
        let spinners = until_spinning(owner, 1, "a sandbox spins");
        let stop = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(owner),
            nix::sys::signal::Signal::SIGSTOP,
        );
        stop.expect("SIGSTOP the server");
        let stopped = Instant::now();
        let waited = std::panic::catch_unwind(|| {
            wait_until(
                "the sandbox ends itself while the server is stopped",
                DEATH_BOUND,
                || alive(&spinners) == 0,
            )
        });
        eprintln!(
            "measured: 5 s timeout, {} sandbox, server stopped -> it ended {:?} after the stop",
            kind,
            stopped.elapsed()
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(owner),
            nix::sys::signal::Signal::SIGCONT,
        )
        .expect("SIGCONT the server");
        if let Err(e) = waited {
            let left: BTreeSet<i32> = spinners
                .iter()
                .copied()
                .filter(|&pid| cpu_ticks(pid).is_some())
                .collect();
            eprintln!(
                "still alive of the spinners: {}\nspinning now: {}",
                describe(&left),
                describe(&spinning_pids(owner))
            );
            std::panic::resume_unwind(e);
        }
        let a = server.answer(id, Duration::from_secs(30));
        assert!(a["result"].is_object(), "{a:#}");
    }
}

#[test]
fn sigterm_on_stdio_drains_answers_and_exits_with_stdin_open() {
    if !sandbox_available("sigterm_on_stdio_drains_answers_and_exits_with_stdin_open") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&[
        "--pool-size",
        "1",
        "--pool-max",
        "1",
        "--drain-timeout",
        "1s",
    ]);
    let owner = server.pid();
    let (pooled, cold, _) = start_spinners(&mut server);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(owner),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let termed = Instant::now();
    // stdin stays open (`server.stdin` is held): the process must exit anyway.
    for id in [pooled, cold] {
        let a = server.answer(id, Duration::from_secs(20));
        assert!(is_error_with(&a, "server is stopping"), "answer: {a:#}");
    }
    let answered = termed.elapsed();
    let status = server.exited_within(Duration::from_secs(20));
    assert!(status.is_some(), "the server did not exit with stdin open");
    eprintln!(
        "measured: SIGTERM with a 1 s drain bound -> answered {answered:?}, exited {:?}",
        termed.elapsed()
    );
    assert!(server.stdin.is_some());
    assert!(sandbox_processes(owner).is_empty());
    assert_eq!(sandbox_cgroups(owner), BTreeSet::new());
    std::thread::sleep(Duration::from_millis(200));
    let log = server.log();
    assert!(
        !log.lines().any(|l| l.contains("ERROR")),
        "a normal shutdown logs no ERROR: {log}"
    );
}

#[test]
fn a_spawner_that_cannot_be_replaced_ends_the_server_with_a_clear_error() {
    if !sandbox_available("a_spawner_that_cannot_be_replaced_ends_the_server_with_a_clear_error") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let owner = server.pid();
    let spawner = server.spawner_pid();
    start_spinners(&mut server);
    // The factory is the server's only child; without it no spawner can be forked.
    let factory = children_of(owner);
    assert_eq!(factory.len(), 1, "the server's children: {factory:?}");
    sigkill(factory[0]);
    sigkill(spawner);
    let status = server
        .exited_within(Duration::from_secs(30))
        .expect("the server exits when it cannot get a spawner");
    assert_eq!(status.code(), Some(70), "{status:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        server.log().contains("cannot be replaced"),
        "{}",
        server.log()
    );
    wait_until("the sandboxes die", DEATH_BOUND, || {
        sandbox_processes(owner).is_empty()
    });
    // Nobody was left to remove their (now empty) cgroups; the next start of codebox
    // would. Remove them so the test leaves nothing behind.
    remove_left_cgroups(owner);
}

#[test]
fn a_killed_cli_takes_its_sandbox_along() {
    if !sandbox_available("a_killed_cli_takes_its_sandbox_along") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cli = Command::new(common::codebox_bin())
        .args(["run", "--timeout", "5m", "python", "-c", SPIN])
        .env("CODEBOX_ROOTFS", common::rootfs_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("codebox run starts");
    let owner = cli.id() as i32;
    until_spinning(owner, 1, "the program spins");
    cli.kill().expect("SIGKILL codebox run");
    cli.wait().expect("reap codebox run");
    wait_until("the sandbox dies with its supervisor", DEATH_BOUND, || {
        sandbox_processes(owner).is_empty()
    });
    // Its empty cgroup is left for the next codebox start to remove (a killed process
    // runs no clean-up); remove it here so the test leaves nothing behind.
    remove_left_cgroups(owner);
}

#[test]
fn sandboxes_die_with_their_spawner_on_their_own() {
    if !sandbox_available("sandboxes_die_with_their_spawner_on_their_own") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let owner = server.pid();
    let spawner = server.spawner_pid();
    let factory = children_of(owner)[0];
    let (pooled, cold, _) = start_spinners(&mut server);
    // Nobody may help: the server and the factory are stopped, so only the sandboxes'
    // own parent-death signal and lifeline can end them.
    let signal = |pid: i32, sig| {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("signal");
    };
    signal(owner, nix::sys::signal::Signal::SIGSTOP);
    signal(factory, nix::sys::signal::Signal::SIGSTOP);
    let killed = Instant::now();
    sigkill(spawner);
    let waited = std::panic::catch_unwind(|| {
        wait_until("the sandboxes die on their own", DEATH_BOUND, || {
            sandbox_processes(owner).is_empty()
        })
    });
    eprintln!(
        "measured: spawner SIGKILL, server and factory stopped -> sandboxes gone {:?}",
        killed.elapsed()
    );
    signal(factory, nix::sys::signal::Signal::SIGCONT);
    signal(owner, nix::sys::signal::Signal::SIGCONT);
    if let Err(e) = waited {
        std::panic::resume_unwind(e);
    }
    for id in [pooled, cold] {
        let a = server.answer(id, DEATH_BOUND);
        assert!(is_error_with(&a, "spawner"), "answer: {a:#}");
    }
    drop(server.stdin.take());
    assert!(server.exited_within(Duration::from_secs(30)).is_some());
    assert_eq!(sandbox_cgroups(owner), BTreeSet::new());
}

/// A one-shot run ends when the runtime says so on fd 3 (`codebox/exit`, once stdout and
/// stderr are closed), before the kernel has torn the process down. A program can send
/// that line itself and go on spinning: it only ends its own run sooner. Its answer
/// carries the status it claimed (its to choose anyway), and the sandbox is killed.
#[test]
fn a_program_that_claims_its_end_is_ended() {
    if !sandbox_available("a_program_that_claims_its_end_is_ended") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut server = Server::start(&["--pool-size", "1", "--pool-max", "1"]);
    let owner = server.pid();
    server.until_pool_ready();
    let claim = r#"
import os, time
print("before", flush=True)
os.close(1); os.close(2)
os.write(3, b'{"jsonrpc":"2.0","method":"codebox/exit","params":{"status":7}}\n')
t = time.time()
while True:
    pass
"#;
    for _ in 0..2 {
        let asked = Instant::now();
        let id = server.execute(claim, 60_000);
        let a = server.answer(id, Duration::from_secs(30));
        let sc = &a["result"]["structuredContent"];
        assert_eq!(sc["stdout"], "before\n", "{a:#}");
        assert_eq!(sc["exit_code"], 7, "{a:#}");
        assert_eq!(sc["timed_out"], false, "{a:#}");
        assert!(asked.elapsed() < Duration::from_secs(20), "{a:#}");
        // (A refill preloading its imports spins for a second, then idles.)
        wait_until("the claiming sandbox is killed", DEATH_BOUND, || {
            spinning_pids(owner).is_empty()
        });
    }
    // A claim with the output still open is not the end: the run goes on to its own
    // exit, whose output is all there.
    let id = server.execute(
        "import os\nos.write(3, b'{\"jsonrpc\":\"2.0\",\"method\":\"codebox/exit\",\"params\":{\"status\":0}}\\n')\n\
         print('after the claim')\nraise SystemExit(3)",
        30_000,
    );
    let a = server.answer(id, Duration::from_secs(30));
    let sc = &a["result"]["structuredContent"];
    assert_eq!(sc["stdout"], "after the claim\n", "{a:#}");
    // Its status is the claimed 0 or the real 3, whichever the supervisor saw first:
    // both are the program's own choice.
    assert_eq!(sc["timed_out"], false, "{a:#}");
    server.until_pool_ready();
    drop(server.stdin.take());
    assert!(server.exited_within(Duration::from_secs(30)).is_some());
    assert_eq!(sandbox_cgroups(owner), BTreeSet::new());
}
