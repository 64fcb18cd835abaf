//! Configuration that explains itself, through the binary (`codebox tools tokens` reads
//! the MCP server config exactly as `serve` does, without starting a sandbox):
//! `--mcp-config` (missing, repeated, a name twice), the default `./.mcp.json` missing,
//! files that are not JSON or TOML (line and column), relative paths in `codebox.toml`
//! (against the file's directory), and entries codebox cannot start (listed as failed,
//! the rest used).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::codebox_bin;
use serde_json::{json, Value};

fn tokens(cwd: &Path, args: &[&str]) -> Output {
    Command::new(codebox_bin())
        .args(["tools", "tokens", "--json"])
        .args(args)
        .current_dir(cwd)
        .env_remove("CODEBOX_MCP_CONFIG")
        .env_remove("CODEBOX_CONFIG")
        .env("HOME", cwd)
        .output()
        .expect("codebox runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn write(path: &Path, servers: Value) {
    std::fs::write(path, json!({ "mcpServers": servers }).to_string()).unwrap();
}

/// A server that cannot start (no such command): enough to see a row per server without
/// running any upstream.
fn ghost(dir: &Path) -> Value {
    json!({"command": dir.join("no-such-server")})
}

fn rows(out: &Output) -> Vec<Value> {
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", stderr(out)));
    report["servers"].as_array().unwrap().clone()
}

#[test]
fn a_named_config_that_does_not_exist_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tokens(tmp.path(), &["--mcp-config", "missing.json"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("missing.json"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn the_default_config_missing_is_a_notice_naming_where_codebox_looked() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tokens(tmp.path(), &[]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let looked = tmp.path().join(".mcp.json");
    assert!(
        err.contains(&looked.display().to_string()) && err.contains("no upstream servers"),
        "{err}"
    );
    assert!(rows(&out).is_empty());
}

#[test]
fn several_configs_merge_and_a_name_in_two_is_an_error_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    write(&a, json!({"one": ghost(tmp.path())}));
    write(&b, json!({"two": ghost(tmp.path())}));
    let out = tokens(
        tmp.path(),
        &["--mcp-config", "a.json", "--mcp-config", "b.json"],
    );
    let names: Vec<Value> = rows(&out).iter().map(|r| r["name"].clone()).collect();
    assert_eq!(names, [json!("one"), json!("two")], "{}", stderr(&out));

    write(&b, json!({"one": ghost(tmp.path())}));
    let out = tokens(
        tmp.path(),
        &["--mcp-config", "a.json", "--mcp-config", "b.json"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("\"one\"") && err.contains("a.json") && err.contains("b.json"),
        "{err}"
    );
}

#[test]
fn files_that_do_not_parse_say_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("bad.json"),
        "{\n  \"mcpServers\": {\n    \"a\": [,]\n",
    )
    .unwrap();
    let out = tokens(tmp.path(), &["--mcp-config", "bad.json"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("bad.json") && err.contains("line 3"), "{err}");

    std::fs::write(
        tmp.path().join("codebox.toml"),
        "pool_size = 2\nqueue = = 3\n",
    )
    .unwrap();
    let out = tokens(tmp.path(), &["--config", "codebox.toml"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("codebox.toml") && err.contains("line 2, column"),
        "{err}"
    );
}

#[test]
fn relative_paths_in_the_config_file_are_relative_to_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let etc = tmp.path().join("etc");
    std::fs::create_dir(&etc).unwrap();
    write(
        &etc.join("servers.json"),
        json!({"relative": ghost(tmp.path())}),
    );
    std::fs::write(etc.join("codebox.toml"), "mcp_config = \"servers.json\"\n").unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let config = etc.join("codebox.toml");
    let out = tokens(&elsewhere, &["--config", config.to_str().unwrap()]);
    let found = rows(&out);
    assert_eq!(found.len(), 1, "{}", stderr(&out));
    assert_eq!(found[0]["name"], "relative");
}

#[test]
fn entries_codebox_cannot_start_are_listed_as_failed_and_the_rest_is_used() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        &tmp.path().join(".mcp.json"),
        json!({
            "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
            "socket": {"type": "ws", "url": "ws://127.0.0.1:9"},
            "unset": {"command": "${CODEBOX_TEST_SURELY_UNSET}"},
            "empty": {"args": []},
            "ghost": ghost(tmp.path()),
        }),
    );
    let out = tokens(tmp.path(), &[]);
    let err = stderr(&out);
    let found = rows(&out);
    assert_eq!(found.len(), 5, "{err}");
    let row = |name: &str| {
        found
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {found:?}"))
            .clone()
    };
    for (name, says) in [
        ("legacy", "\"sse\""),
        ("socket", "\"ws\""),
        ("unset", "CODEBOX_TEST_SURELY_UNSET"),
        ("empty", "no command"),
    ] {
        let r = row(name);
        assert_ne!(r["state"], "ready", "{r}");
        let error = r["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{name}: {r}");
        // The warning names the entry and why.
        assert!(err.contains(name) && err.contains("skipping"), "{err}");
    }
    // The entry that can be tried was tried.
    assert!(row("ghost")["error"]
        .as_str()
        .unwrap()
        .contains("no-such-server"));
}

/// `upstream_wait = "0s"` is documented as "never wait" (a call to a server that is not
/// ready fails at once with its state): `serve` must take it.
#[test]
fn upstream_wait_zero_means_never_wait_and_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("codebox.toml"), "upstream_wait = \"0s\"\n").unwrap();
    for (config, env) in [(Some("codebox.toml"), None), (None, Some("0ms"))] {
        let mut serve = Command::new(codebox_bin());
        serve
            .arg("serve")
            .current_dir(tmp.path())
            .env_remove("CODEBOX_MCP_CONFIG")
            .env_remove("CODEBOX_CONFIG")
            .env_remove("CODEBOX_UPSTREAM_WAIT")
            .env("HOME", tmp.path())
            .stdin(std::process::Stdio::null());
        if let Some(config) = config {
            serve.args(["--config", config]);
        }
        if let Some(wait) = env {
            serve.env("CODEBOX_UPSTREAM_WAIT", wait);
        }
        let out = serve.output().expect("codebox runs");
        let err = stderr(&out);
        assert!(!err.contains("upstream_wait"), "{config:?} {env:?}: {err}");
    }
}

/// A secret codebox takes from its environment (`env:VAR`: here the snapshot key) is not
/// passed on to the upstream servers it starts, which otherwise inherit its environment
/// (a variable that is no secret still reaches them). An upstream that writes its
/// environment to a file and reads its stdin to the end stands in for any third-party
/// server.
#[test]
fn secrets_codebox_reads_from_its_environment_do_not_reach_upstream_servers() {
    let tmp = tempfile::tempdir().unwrap();
    let dumped = tmp.path().join("upstream-env.txt");
    let config = tmp.path().join("mcp.json");
    write(
        &config,
        json!({"env-dump": {
            "command": "/bin/sh",
            "args": ["-c", format!("env > {}.part && mv {0}.part {0} && exec cat > /dev/null", dumped.display())],
        }}),
    );
    let key = "0f1e2d3c4b5a69788796a5b4c3d2e1f0".repeat(2);
    let state = tmp.path().join("state");
    let mut server = common::serve_stdio::Server::spawn(
        &["--mcp-config", config.to_str().unwrap()],
        &[
            ("CODEBOX_STATE_DIR", state.to_str().unwrap()),
            (
                "CODEBOX_SESSIONS_SNAPSHOT_KEY",
                "env:CODEBOX_TEST_SECRET_KEY",
            ),
            ("CODEBOX_TEST_SECRET_KEY", key.as_str()),
            ("CODEBOX_TEST_NOT_SECRET", "still-here"),
        ],
    );
    server.initialize();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !dumped.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let env = std::fs::read_to_string(&dumped).unwrap_or_else(|e| {
        panic!(
            "the upstream never wrote its environment ({e}): {}",
            server.log()
        )
    });
    // Stopped as a client stops it: codebox ends its upstreams (the stand-in also ends
    // when its stdin closes).
    drop(server.stdin.take());
    assert!(server
        .exited_within(std::time::Duration::from_secs(30))
        .is_some());
    assert!(env.contains("CODEBOX_TEST_NOT_SECRET=still-here"), "{env}");
    assert!(
        !env.contains(&key),
        "the snapshot key reached an upstream server:\n{env}"
    );
    assert!(
        !env.lines()
            .any(|l| l.starts_with("CODEBOX_TEST_SECRET_KEY=")),
        "{env}"
    );
}
