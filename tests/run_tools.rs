//! `codebox run --mcp-config`: a program that calls MCP servers' tools from the CLI, as
//! `serve` runs it (the run goes through a `codebox serve` of its own), with the CLI's
//! exit codes and streams, its whole output, and clear refusals of what only `run`'s own
//! sandbox has.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// A `.mcp.json` with tests/upstream/hostile_server.py (raw JSON-RPC over stdio, no SDK:
/// `echo(text)` among its tools) as server `hostile`.
fn mcp_config(dir: &Path) -> PathBuf {
    // A copy beside the config: the rootless pass's user may not read the checkout.
    let server = dir.join("hostile_server.py");
    std::fs::write(&server, include_str!("upstream/hostile_server.py")).unwrap();
    let path = dir.join("mcp.json");
    std::fs::write(
        &path,
        serde_json::json!({"mcpServers": {"hostile": {"command": "/usr/bin/python3", "args": [server]}}})
            .to_string(),
    )
    .unwrap();
    path
}

fn run(config: &Path, args: &[&str]) -> Output {
    Command::new(codebox_bin())
        .arg("run")
        .arg("--mcp-config")
        .arg(config)
        .args(args)
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env_remove("CODEBOX_CONFIG")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_run_calls_tools_and_keeps_the_clis_streams_and_exit_codes() {
    let test = "a_run_calls_tools_and_keeps_the_clis_streams_and_exit_codes";
    if !sandbox_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = mcp_config(dir.path());
    // Python: a typed wrapper, and stderr apart from stdout.
    let out = run(
        &config,
        &[
            "python",
            "-c",
            "import sys\nfrom servers.hostile import echo\nprint(echo(text='hi from a tool'))\nprint('to stderr', file=sys.stderr)",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi from a tool\n");
    assert!(
        text(&out.stderr).contains("to stderr\n"),
        "{}",
        text(&out.stderr)
    );
    // TypeScript, and the program's own exit status.
    let out = run(
        &config,
        &[
            "typescript",
            "-c",
            "import h from \"/servers/hostile/index.ts\";\nconsole.log(await h.echo({ text: \"ts\" }));\nDeno.exit(3);",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ts\n");
    // Output far over a result's budget comes whole, and a timeout is 124 with its hint.
    let out = run(&config, &["python", "-c", "print('x' * 300000)"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(out.stdout.len(), 300_001);
    let out = run(
        &config,
        &["--timeout", "1s", "python", "-c", "while True: pass"],
    );
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("timed out"),
        "{}",
        text(&out.stderr)
    );
    // --json: the result as serve gives it, with the tool call recorded.
    let out = run(
        &config,
        &[
            "--json",
            "python",
            "-c",
            "from servers.hostile import echo\necho(text='x')",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tool_calls"][0]["name"], "hostile__echo", "{v:#}");
    assert_eq!(v["exit_code"], 0);
}

#[test]
fn files_reach_a_run_with_tools_byte_for_byte() {
    let test = "files_reach_a_run_with_tools_byte_for_byte";
    if !sandbox_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = mcp_config(dir.path());
    let bin = dir.path().join("blob.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    std::fs::write(&bin, &bytes).unwrap();
    let out = run(
        &config,
        &[
            "--file",
            &format!("blob.bin={}", bin.display()),
            "python",
            "-c",
            "import zlib\nb = open('blob.bin', 'rb').read()\nprint(len(b), zlib.crc32(b))",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let crc = crc32(&bytes);
    assert_eq!(text(&out.stdout), format!("70000 {crc}\n"));
}

#[test]
fn what_only_runs_own_sandbox_has_is_refused_with_the_way_to_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = mcp_config(dir.path());
    for (flags, says) in [
        (vec!["--memory", "64M"], "--profile"),
        (vec!["--pids", "10"], "--profile"),
        (vec!["--workspace", "/tmp"], "no host directory"),
        (vec!["--allow-host", "example.com"], "--config"),
        (vec!["--zygote"], "zygote"),
    ] {
        let mut args = flags.clone();
        args.extend(["python", "-c", "1"]);
        let out = run(&config, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flags:?}: {err}");
        assert!(
            err.contains("cannot go with --mcp-config") && err.contains(says),
            "{flags:?}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // A configuration that does not exist: the server's own error, and 125.
    let out = run(Path::new("/nonexistent/mcp.json"), &["python", "-c", "1"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("/nonexistent/mcp.json"),
        "{}",
        text(&out.stderr)
    );
}

/// zlib's CRC-32 (what the program prints), bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
