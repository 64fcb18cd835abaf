//! The rows of `bench-compare`: what each one runs, and the probes that skip a row this
//! codebox build cannot run yet (`exec`, `--pool-size`) with a note instead of failing.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::bench::mcp;
use crate::bench::server::{Launch, Server, Transport};
use crate::bench::Lang;

/// Warm sandboxes per language on the pooled server.
const POOL_SIZE: &str = "2";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Bare,
    Bwrap,
    Exec,
    Run,
    ServeCold,
    Pooled,
}

pub enum Probe {
    /// A process, timed from spawn to exit.
    Process(Vec<OsString>),
    /// A `tools/call` `print(1)` on the stdio session of `servers[server]`.
    Mcp { server: usize, lang: Lang },
}

pub struct Row {
    pub name: String,
    pub lang: Lang,
    pub kind: Kind,
    pub probe: Probe,
    /// Wall time per run in ms.
    pub samples: Vec<f64>,
    /// MCP rows: how many calls reported each `start` ("" when absent).
    pub starts: BTreeMap<String, usize>,
}

impl Row {
    fn new(name: impl Into<String>, lang: Lang, kind: Kind, probe: Probe) -> Row {
        Row {
            name: name.into(),
            lang,
            kind,
            probe,
            samples: Vec::new(),
            starts: BTreeMap::new(),
        }
    }
}

/// One language's program, as the bare, bwrap and exec rows run it.
struct Program {
    lang: Lang,
    label: &'static str,
    /// The argv inside the rootfs (what `codebox exec` runs).
    inside: &'static [&'static str],
    /// Run the rootfs's copy bare and under bwrap (deno is not installed on the host;
    /// python3 is).
    bare_from_rootfs: bool,
    /// The code of the `codebox run` row.
    run_code: &'static str,
}

const PROGRAMS: [Program; 2] = [
    Program {
        lang: Lang::Python,
        label: "python3 -S -c pass",
        inside: &["/usr/bin/python3", "-S", "-c", "pass"],
        bare_from_rootfs: false,
        run_code: "pass",
    },
    Program {
        lang: Lang::TypeScript,
        label: "deno eval ''",
        inside: &["/usr/bin/deno", "eval", ""],
        bare_from_rootfs: true,
        run_code: "",
    },
];

/// The rows, grouped by language; starts the two stdio servers into `servers`. Returns
/// the notes on skipped rows too.
pub fn build(
    codebox: &Path,
    rootfs: &Path,
    env: &[(&str, &OsStr)],
    servers: &mut Vec<Server>,
) -> Result<(Vec<Row>, Vec<String>)> {
    let mut notes = Vec::new();
    let (cold, pooled) = start_servers(codebox, rootfs, servers, &mut notes)?;
    let mut exec_works = true;
    let mut rows = Vec::new();
    for p in &PROGRAMS {
        let lang = p.lang;
        let row = |name: String, kind, argv| Row::new(name, lang, kind, Probe::Process(argv));
        let bare = match p.bare_from_rootfs {
            true => argv(rootfs.join(&p.inside[0][1..]).as_os_str(), &p.inside[1..]),
            false => argv(OsStr::new(p.inside[0]), &p.inside[1..]),
        };
        let mut bwrap = argv(OsStr::new(BWRAP[0]), &BWRAP[1..]);
        bwrap.extend_from_slice(&bare);
        rows.push(row(format!("{} (bare)", p.label), Kind::Bare, bare));
        let name = format!("bwrap --unshare-all {}", p.label);
        rows.push(row(name, Kind::Bwrap, bwrap));
        if exec_works {
            let exec = argv(codebox.as_os_str(), &[&["exec", "--"], p.inside].concat());
            match exec_probe(p, &exec, env, &mut notes)? {
                Some(true) => rows.push(row(format!("codebox exec {}", p.label), Kind::Exec, exec)),
                Some(false) => {}
                None => exec_works = false,
            }
        }
        let run = argv(codebox.as_os_str(), &["run", lang.name(), "-c", p.run_code]);
        let run_name = format!("codebox run {} -c '{}'", lang.name(), p.run_code);
        rows.push(row(run_name, Kind::Run, run));
        let tool = format!("MCP {} {}", lang.tool(), lang.print_one());
        let mcp = |name, kind, server| Row::new(name, lang, kind, Probe::Mcp { server, lang });
        rows.push(mcp(format!("{tool}, serve cold"), Kind::ServeCold, cold));
        if let Some(server) = pooled {
            rows.push(mcp(format!("{tool}, pooled"), Kind::Pooled, server));
        }
    }
    Ok((rows, notes))
}

fn argv(first: &OsStr, rest: &[&str]) -> Vec<OsString> {
    let mut v = vec![first.to_owned()];
    v.extend(rest.iter().map(OsString::from));
    v
}

/// Whether `codebox exec` runs the program: `Some(true)` yes, `Some(false)` deno failed
/// (skipped with a note: it may need an environment exec does not give it), `None` this
/// build has no `exec` (noted). Python failing under exec fails the run.
fn exec_probe(
    p: &Program,
    exec: &[OsString],
    env: &[(&str, &OsStr)],
    notes: &mut Vec<String>,
) -> Result<Option<bool>> {
    let shown = p.label;
    match probe(exec, env)? {
        Probed::Works => Ok(Some(true)),
        Probed::Unsupported(why) => {
            notes.push(format!(
                "codebox exec rows skipped: this build refuses it ({why})"
            ));
            Ok(None)
        }
        Probed::Failed(why) if p.lang == Lang::TypeScript => {
            notes.push(format!(
                "codebox exec {shown} skipped: it fails under exec ({why})"
            ));
            Ok(Some(false))
        }
        Probed::Failed(why) => bail!("codebox exec {shown} failed: {why}"),
    }
}

/// `bwrap --unshare-all` with a read-only host root, as a peer sandbox would run it.
const BWRAP: &[&str] = &[
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--",
];

/// Starts the pool-off server and the pooled one (skipped with a note when this build has
/// no `--pool-size`; the cold one then runs without the flag); returns their indices.
fn start_servers(
    codebox: &Path,
    rootfs: &Path,
    servers: &mut Vec<Server>,
    notes: &mut Vec<String>,
) -> Result<(usize, Option<usize>)> {
    let start = |args: &[&str]| Server::start(codebox, rootfs, Transport::Stdio, args);
    let (cold, has_pool) = match start(&["--pool-size", "0"])? {
        Launch::Up(s) => (s, true),
        Launch::Unsupported(why) => {
            notes.push(format!(
                "serve has no --pool-size ({why}): \"serve cold\" ran without it, \"pooled\" rows skipped"
            ));
            match start(&[])? {
                Launch::Up(s) => (s, false),
                Launch::Unsupported(why) => bail!("codebox serve refused to start: {why}"),
            }
        }
    };
    servers.push(cold);
    let cold = servers.len() - 1;
    if !has_pool {
        return Ok((cold, None));
    }
    let mut pooled = match start(&["--pool-size", POOL_SIZE])? {
        Launch::Up(s) => s,
        Launch::Unsupported(why) => bail!("--pool-size 0 was accepted, {POOL_SIZE} not: {why}"),
    };
    let session = pooled.stdio().context("a stdio server")?;
    let langs = [Lang::Python, Lang::TypeScript];
    if !mcp::wait_pools_full(session, &langs, Duration::from_secs(30))? {
        notes.push("the pooled server's pools were not full after 30 s".into());
    }
    servers.push(pooled);
    Ok((cold, Some(servers.len() - 1)))
}

enum Probed {
    Works,
    /// clap refused the command line: the subcommand or flag does not exist yet.
    Unsupported(String),
    Failed(String),
}

/// Runs `argv` once (stderr kept) to learn whether this build can run it.
fn probe(argv: &[OsString], env: &[(&str, &OsStr)]) -> Result<Probed> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("cannot start {}", argv[0].to_string_lossy()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    Ok(if out.status.success() {
        Probed::Works
    } else if let Some(why) = crate::bench::usage_error(out.status, &stderr) {
        Probed::Unsupported(why)
    } else {
        Probed::Failed(format!("{}: {}", out.status, stderr.trim()))
    })
}
