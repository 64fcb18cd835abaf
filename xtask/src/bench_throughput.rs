//! `cargo xtask bench-throughput`: one `codebox serve --http` under K concurrent clients.
//!
//! Each client is its own MCP session on its own loopback HTTP connection (a hand-written
//! HTTP/1.1 client, `bench::http`) calling `print(1)` in a loop for T seconds, every
//! result checked. Prints executions per second, latency (median, p90, p99, max), errors,
//! "busy" refusals and the fraction of warm starts. Around the load, a leak check: the
//! server's process tree, its cgroups, the host's mounts and its fds once it has settled
//! again, compared with before; after it stops, none of its processes or cgroups may be
//! left. A leak, an error or a wrong result fails the command; the figures never do.

mod leakcheck;
mod load;

use std::ffi::OsString;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::bench::leaks::Snapshot;
use crate::bench::mcp;
use crate::bench::mcp_http::HttpSession;
use crate::bench::server::{Launch, Server, Transport};
use crate::bench::stats::Summary;
use crate::bench::Lang;

const HELP: &str = "\
cargo xtask bench-throughput [--clients K] [--seconds T] [--pool N]
                             [--language python|typescript] [--concurrency C] [--queue Q]
                             [--no-build]

Starts one `codebox serve --http 127.0.0.1:<ephemeral port> --pool-size N`, runs K
clients (each its own MCP session) calling execute_python print(1) (or
execute_typescript console.log(1)) in a loop for T seconds, and prints executions per
second, latency, errors, busy refusals and warm starts, then checks the server for leaks.

  --clients K      concurrent clients (default 8)
  --seconds T      length of the load (default 10)
  --pool N         warm sandboxes per language (default 4; 0: every start cold)
  --language L     python (default) or typescript
  --concurrency C  the server's --concurrency (default: the server's, 2 x cores)
  --queue Q        the server's --queue (default: the server's, 32); beyond C + Q
                   executions at once, requests are refused busy (counted apart)
  --no-build       use the existing target/release/codebox and target/rootfs
";

struct Options {
    clients: usize,
    seconds: u64,
    pool: usize,
    lang: Lang,
    concurrency: Option<usize>,
    queue: Option<usize>,
    build: bool,
}

fn parse(args: &[OsString]) -> Result<Option<Options>> {
    let mut o = Options {
        clients: 8,
        seconds: 10,
        pool: 4,
        lang: Lang::Python,
        concurrency: None,
        queue: None,
        build: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| -> Result<&str> {
            it.next()
                .and_then(|v| v.to_str())
                .with_context(|| format!("{a:?} needs {what}"))
        };
        let number = |v: &str| -> Result<usize> {
            v.parse()
                .with_context(|| format!("{a:?}: {v:?} is not a number"))
        };
        match a.to_str() {
            Some("--clients") => o.clients = number(value("a number")?)?.max(1),
            Some("--seconds") => o.seconds = number(value("a number")?)?.max(1) as u64,
            Some("--pool") => o.pool = number(value("a number")?)?,
            Some("--concurrency") => o.concurrency = Some(number(value("a number")?)?),
            Some("--queue") => o.queue = Some(number(value("a number")?)?),
            Some("--language") => {
                let v = value("python or typescript")?;
                o.lang = Lang::parse(v)
                    .with_context(|| format!("--language {v:?}: python or typescript"))?;
            }
            Some("--no-build") => o.build = false,
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(None);
            }
            _ => bail!("unknown option {a:?}; see `cargo xtask bench-throughput --help`"),
        }
    }
    Ok(Some(o))
}

pub fn run(args: &[OsString]) -> Result<()> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    let (codebox, rootfs) = crate::bench::prepare(o.build)?;
    let pool = o.pool.to_string();
    let passed = [("--concurrency", o.concurrency), ("--queue", o.queue)]
        .into_iter()
        .filter_map(|(flag, v)| Some((flag, v?.to_string())))
        .collect::<Vec<_>>();
    let extra: Vec<&str> = passed
        .iter()
        .flat_map(|(flag, v)| [*flag, v.as_str()])
        .collect();
    // The pool grows with the load (up to its ceiling) and keeps that for
    // `--pool-shrink-after`: a short one lets it return to its size before the leak
    // check counts processes, cgroups and descriptors again.
    let with_pool = [
        &["--pool-size", &pool, "--pool-shrink-after", "1s"][..],
        &extra,
    ]
    .concat();
    let server = match Server::start(&codebox, &rootfs, Transport::Http, &with_pool)? {
        Launch::Up(s) => s,
        Launch::Unsupported(why) => {
            println!("note: serve has no --pool-size ({why}); running with its default");
            match Server::start(&codebox, &rootfs, Transport::Http, &extra)? {
                Launch::Up(s) => s,
                Launch::Unsupported(why) => bail!("codebox serve refused to start: {why}"),
            }
        }
    };
    let pid = server.pid();
    let measured = measure(&server, &o);
    // The tree as it is just before the stop: none of it may outlive the server.
    let tree = Snapshot::take(pid).processes;
    let stopped = server.stop();
    let left = leakcheck::leftovers(pid, &tree);
    match left.is_empty() {
        true => println!("after the stop: no process of its tree and none of its cgroups left"),
        false => println!("after the stop, left:\n  {}", left.join("\n  ")),
    }
    let (errors, mut leaks) = measured?;
    stopped?;
    leaks.extend(left);
    if !leaks.is_empty() {
        bail!("leaked:\n  {}", leaks.join("\n  "));
    }
    if errors > 0 {
        bail!("{errors} executions failed or returned a wrong result");
    }
    Ok(())
}

/// The load and the leak check around it; returns the error count and what leaked.
fn measure(server: &Server, o: &Options) -> Result<(usize, Vec<String>)> {
    let addr = server.addr().context("an HTTP server")?;
    let pid = server.pid();
    let mut control = HttpSession::open(addr).context("the control session")?;
    mcp::check_tools(&mut control)?;
    // One execution before the snapshot: what the server opens once, on a client's first
    // execution, and keeps (its skills directories, two fds) is not a leak of the load.
    mcp::execute_print_one(&mut control, o.lang).context("the warm-up execution")?;
    if !mcp::wait_pools_full(&mut control, &[o.lang], Duration::from_secs(30))? {
        println!("note: the pool was not full after 30 s; measuring anyway");
    }
    let health = mcp::health(&mut control)?;
    let before = Snapshot::take(pid);

    let tally = load::run(addr, o.lang, o.clients, Duration::from_secs(o.seconds));
    print_load(o, &health, &tally);

    let (after, grown) = leakcheck::settle(&mut control, pid, o.lang, &before)?;
    let ok = tally.latencies.len().max(1) as f64;
    let cpu = after.tree_cpu_ms.saturating_sub(before.tree_cpu_ms);
    println!(
        "  CPU            {cpu} ms for the server and its sandboxes, load and refill = {:.2} ms \
         per execution (at most {:.0} executions/s on {} cores)",
        cpu as f64 / ok,
        ok * available_cores() as f64 * 1000.0 / cpu.max(1) as f64,
        available_cores()
    );
    println!("\nleak check (server pid {pid}), before the load and once settled after it:");
    before.print_against(&after);
    control.close().context("closing the control session")?;
    Ok((tally.errors, grown))
}

fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn print_load(o: &Options, health: &serde_json::Value, t: &load::Tally) {
    let concurrency = health["concurrency"].as_u64();
    let pool = health["pool"]["languages"][o.lang.name()]["size"]
        .as_u64()
        .unwrap_or(0);
    println!(
        "\n{} clients x {} s, {} {}, pool {pool} per language, server concurrency {}",
        o.clients,
        o.seconds,
        o.lang.tool(),
        o.lang.print_one(),
        concurrency.map_or("?".into(), |c| c.to_string()),
    );
    if let Some(c) = concurrency.filter(|c| (o.clients as u64) > *c) {
        println!(
            "  ({} clients beyond the concurrency wait in the server's queue; past its --queue \
             they are refused busy)",
            o.clients as u64 - c
        );
    }
    let ok = t.latencies.len();
    let s = Summary::of(&t.latencies);
    println!(
        "  executions     {ok} ok in {:.2} s = {:.1} per second",
        t.elapsed.as_secs_f64(),
        load::rate(t)
    );
    println!(
        "  latency ms     median {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
        s.median, s.p90, s.p99, s.max
    );
    let pct = |n: usize| 100.0 * n as f64 / ok.max(1) as f64;
    println!(
        "  starts         warm {} ({:.1}%), cold {} ({:.1}%){}",
        t.warm,
        pct(t.warm),
        t.cold,
        pct(t.cold),
        match t.unreported {
            0 => String::new(),
            n => format!(", not reported {n}"),
        }
    );
    println!("  busy refusals  {}", t.busy);
    if let Some(m) = &t.busy_example {
        println!("    e.g. {m}");
    }
    println!("  errors         {}", t.errors);
    for e in &t.error_examples {
        println!("    {e}");
    }
}
