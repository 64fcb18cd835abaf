//! `codebox tools tokens`, run as a user would: the built binary against the reference
//! upstream servers (filesystem, memory, everything on Node; time on Python) that
//! `cargo xtask test` installs into `CODEBOX_TEST_UPSTREAMS` (default `target/upstreams`).
//!
//! When the servers are missing the test prints `SKIP <test>: <reason>` and passes, unless
//! `CODEBOX_TEST_STRICT=1`, where it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use common::{codebox_bin, strict};

/// The bound on codebox's own tools/list (o200k_base tokens), by default.
const OWN_TOOLS_BUDGET: u64 = 1000;
/// The bound on codebox's own tools/list with `tools = "minimal"`.
const MINIMAL_TOOLS_BUDGET: u64 = 500;

/// Tools each reference server lists (as in `tests/fixtures/tools/<server>.json`).
const EXPECTED_TOOLS: [(&str, u64); 4] = [
    ("everything", 13),
    ("filesystem", 14),
    ("memory", 9),
    ("time", 2),
];

fn upstreams() -> PathBuf {
    std::env::var_os("CODEBOX_TEST_UPSTREAMS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/upstreams"))
}

fn node_script(package: &str) -> PathBuf {
    upstreams().join(format!(
        "node/node_modules/@modelcontextprotocol/server-{package}/dist/index.js"
    ))
}

/// Whether the reference servers are installed; prints the reason when they are not.
fn servers_available(test: &str) -> bool {
    let mut needed = vec![
        PathBuf::from("/usr/bin/node"),
        PathBuf::from("/usr/bin/python3"),
        upstreams().join("python/mcp_server_time/__init__.py"),
    ];
    needed.extend(["filesystem", "memory", "everything"].map(node_script));
    let Some(missing) = needed.iter().find(|p| !p.exists()) else {
        return true;
    };
    let reason = format!(
        "{} is missing (run `cargo xtask test`, which installs the upstream test servers)",
        missing.display()
    );
    if strict() {
        panic!("{test}: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
    false
}

/// Writes `servers` as the `.mcp.json` of a `codebox.toml` in `dir`; returns the config.
fn write_config(dir: &Path, servers: Value) -> PathBuf {
    let mcp = dir.join("mcp.json");
    std::fs::write(&mcp, json!({ "mcpServers": servers }).to_string()).unwrap();
    let config = dir.join("codebox.toml");
    std::fs::write(
        &config,
        format!("mcp_config = {:?}\n", mcp.display().to_string()),
    )
    .unwrap();
    config
}

fn tools_tokens(dir: &Path, args: &[&str]) -> Output {
    Command::new(codebox_bin())
        .args(["tools", "tokens"])
        .args(args)
        .current_dir(dir)
        .env_remove("CODEBOX_MCP_CONFIG")
        .output()
        .expect("codebox runs")
}

fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("no JSON ({e}): {stdout}"))
}

fn own_tokens_are_sane(report: &Value) -> u64 {
    let own = report["codebox"]["tokens"].as_u64().unwrap();
    assert!(
        own > 0 && own <= OWN_TOOLS_BUDGET,
        "codebox's own tools/list: {own} tokens"
    );
    assert!(
        report["codebox"]["tools"].as_u64().unwrap() >= 2,
        "{report:#}"
    );
    let minimal = report["codebox_minimal"]["tokens"].as_u64().unwrap();
    assert!(
        minimal > 0 && minimal <= MINIMAL_TOOLS_BUDGET && minimal < own,
        "codebox's own tools/list with tools = \"minimal\": {minimal} tokens"
    );
    assert_eq!(report["codebox_minimal"]["tools"], 3, "{report:#}");
    own
}

#[test]
fn four_real_servers_cost_more_than_codebox() {
    let test = "four_real_servers_cost_more_than_codebox";
    if !servers_available(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let config = write_config(
        tmp.path(),
        json!({
            "filesystem": {"command": "/usr/bin/node",
                           "args": [node_script("filesystem"), data]},
            "memory": {"command": "/usr/bin/node", "args": [node_script("memory")],
                       "env": {"MEMORY_FILE_PATH": tmp.path().join("memory.jsonl")}},
            "everything": {"command": "/usr/bin/node",
                           "args": [node_script("everything"), "stdio"]},
            "time": {"command": "/usr/bin/python3",
                     "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                     "env": {"PYTHONPATH": upstreams().join("python")}},
        }),
    );
    let report = json_of(&tools_tokens(
        tmp.path(),
        &["--config", config.to_str().unwrap(), "--json"],
    ));
    eprintln!("{report:#}");
    assert_eq!(report["tokenizer"], "o200k_base");

    let rows = report["servers"].as_array().unwrap();
    let counts: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["tools"].as_u64().unwrap()))
        .collect();
    assert_eq!(counts, EXPECTED_TOOLS, "{report:#}");
    let mut sum = 0;
    for r in rows {
        assert_eq!(r["state"], "ready", "{r}");
        let tokens = r["tokens"].as_u64().unwrap();
        // More than the tool names alone could take: the schemas are counted.
        assert!(tokens > 20 * r["tools"].as_u64().unwrap(), "{r}");
        sum += tokens;
    }
    let total = report["total"]["tokens"].as_u64().unwrap();
    assert_eq!(sum, total, "{report:#}");
    assert_eq!(report["total"]["tools"], 38);

    let own = own_tokens_are_sane(&report);
    let saving = &report["saving"];
    assert_eq!(
        saving["tokens"].as_i64().unwrap(),
        total as i64 - own as i64
    );
    let percent = saving["percent"].as_f64().unwrap();
    let expected = 100.0 * (total as f64 - own as f64) / total as f64;
    assert!((percent - expected).abs() < 1e-9, "{saving}");
    assert!(
        (saving["ratio"].as_f64().unwrap() - total as f64 / own as f64).abs() < 1e-9,
        "{saving}"
    );
    assert!(
        total > own,
        "four servers' tools/list must cost more than codebox's own"
    );

    // The table says the same.
    let out = tools_tokens(tmp.path(), &["--config", config.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(table.contains("annotations"), "{table}");
    assert!(table.contains("tools = \"minimal\""), "{table}");
    assert!(
        table.contains(&format!("saving: {} tokens", total - own)),
        "{table}"
    );
}

#[test]
fn no_upstream_servers_counts_codebox_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), json!({}));
    let report = json_of(&tools_tokens(
        tmp.path(),
        &["--config", config.to_str().unwrap(), "--json"],
    ));
    assert_eq!(report["servers"], json!([]));
    assert_eq!(report["total"], json!({"tools": 0, "tokens": 0}));
    let own = own_tokens_are_sane(&report);
    assert_eq!(report["saving"]["tokens"].as_i64().unwrap(), -(own as i64));
    assert_eq!(report["saving"]["percent"], Value::Null);
}

#[test]
fn a_bad_config_is_one_line_and_exit_125() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope.toml");
    let broken = tmp.path().join("mcp.json");
    std::fs::write(&broken, "{\"mcpServers\": ").unwrap();
    let config = tmp.path().join("codebox.toml");
    std::fs::write(
        &config,
        format!("mcp_config = {:?}\n", broken.display().to_string()),
    )
    .unwrap();
    for (path, says) in [(&missing, "nope.toml"), (&config, "invalid JSON")] {
        let out = tools_tokens(tmp.path(), &["--config", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("codebox: ") && stderr.contains(says),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_server_that_does_not_start_is_reported_and_fails_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(
        tmp.path(),
        json!({"ghost": {"command": tmp.path().join("no-such-server")}}),
    );
    let out = tools_tokens(
        tmp.path(),
        &["--config", config.to_str().unwrap(), "--json"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("did not connect"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &report["servers"][0];
    assert_eq!((&row["name"], &row["tools"]), (&json!("ghost"), &json!(0)));
    assert_ne!(row["state"], "ready");
    assert!(
        row["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{row}"
    );
}

#[test]
fn a_synthetic_catalog_is_counted_as_one_row() {
    let tmp = tempfile::tempdir().unwrap();
    let config = write_config(tmp.path(), json!({}));
    let report = json_of(&tools_tokens(
        tmp.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--synthetic",
            "100",
            "--json",
        ],
    ));
    let expected =
        codebox::tokens::catalog_tokens(&codebox::catalog::synthetic::synthetic_catalog(100, 0))
            as u64;
    assert_eq!(
        report["servers"],
        json!([{"name": "synthetic", "state": "synthetic", "tools": 100, "tokens": expected}])
    );
    assert_eq!(report["total"], json!({"tools": 100, "tokens": expected}));
    let own = own_tokens_are_sane(&report);
    assert!(
        expected > own,
        "100 tools cost {expected} tokens, codebox {own}"
    );
}
