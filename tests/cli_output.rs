//! What the CLI writes to stdout: a reader that goes away early ends codebox quietly,
//! never with a panic; help lists every tool `serve` serves.

mod common;

use std::process::{Command, Stdio};

use common::*;

/// Runs `cmd` with a stdout pipe whose reader is closed before codebox writes, so its
/// first write fails with EPIPE; returns the exit code and stderr.
fn with_closed_stdout(cmd: &mut Command) -> (Option<i32>, String) {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let out = cmd
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_closed_stdout_ends_every_printing_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(".mcp.json"), r#"{"mcpServers": {}}"#).unwrap();
    let empty_log = dir.path().join("audit.jsonl");
    std::fs::write(&empty_log, "").unwrap();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        (
            "tools tokens --json",
            vec!["tools", "tokens", "--json", "--synthetic", "50"],
        ),
        ("tools tokens", vec!["tools", "tokens", "--synthetic", "50"]),
        (
            "audit verify",
            vec!["audit", "verify", empty_log.to_str().unwrap()],
        ),
    ];
    for (what, args) in cases {
        let (code, stderr) = with_closed_stdout(
            Command::new(codebox_bin())
                .args(&args)
                .current_dir(dir.path())
                .env_remove("CODEBOX_CONFIG"),
        );
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
        assert_eq!(stderr, "", "{what}: quiet");
        assert_eq!(code, Some(128 + libc::SIGPIPE), "{what}");
    }
}

#[test]
fn run_json_into_a_closed_stdout_is_quiet() {
    if !sandbox_available("run_json_into_a_closed_stdout_is_quiet") {
        return;
    }
    let (code, stderr) = with_closed_stdout(
        Command::new(codebox_bin())
            .args(["run", "--json", "python", "-c", "print(1)"])
            .env("CODEBOX_ROOTFS", rootfs_dir()),
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(code, Some(128 + libc::SIGPIPE), "{stderr}");
}

#[test]
fn help_lists_every_tool_serve_serves() {
    let tools: Vec<String> = codebox::server::CodeboxServer::tool_definitions()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(tools.len() >= 11, "{tools:?}");
    for args in [&["serve", "--help"][..], &["help", "serve"], &["--help"]] {
        let out = Command::new(codebox_bin()).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        for tool in &tools {
            assert!(
                help.contains(tool.as_str()),
                "{args:?} lacks {tool}:\n{help}"
            );
        }
    }
}
