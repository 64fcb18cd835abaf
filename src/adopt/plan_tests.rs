//! The plan, on files held in memory: each test builds a snapshot, plans, and applies the
//! plan to the snapshot to plan again.

use std::path::Path;

use serde_json::{json, Value};

use super::*;

const EXE: &str = "/opt/bin/codebox";

fn at() -> Locations {
    Locations::new(Path::new("/h"), None, Path::new("/p")).unwrap()
}

fn launcher() -> Launcher {
    Launcher {
        exe: EXE.into(),
        rootfs: "/opt/rootfs".into(),
    }
}

fn is_me(command: &str) -> bool {
    command == EXE
}

/// A snapshot of the given files (all others of the project missing).
fn snapshot(at: &Locations, files: &[(&Path, &str)]) -> Snapshot {
    let mut s = Snapshot::default();
    for p in files_to_read(at, false)
        .into_iter()
        .chain(files_to_read(at, true))
    {
        s.insert(p, None);
    }
    for (path, text) in files {
        s.insert(
            path.to_path_buf(),
            Some(FileRead {
                bytes: text.as_bytes().to_vec(),
                mode: 0o644,
            }),
        );
    }
    s
}

fn make(action: Action<'_>, user: bool, at: &Locations, s: &Snapshot) -> Result<Plan> {
    plan(&Inputs {
        action,
        at,
        user,
        snapshot: s,
        is_me: &is_me,
    })
}

fn install(at: &Locations, s: &Snapshot) -> Result<Plan> {
    make(Action::Install(&launcher()), false, at, s)
}

fn uninstall(at: &Locations, s: &Snapshot) -> Result<Plan> {
    make(Action::Uninstall, false, at, s)
}

/// The snapshot after `plan` was carried out.
fn applied(mut s: Snapshot, plan: &Plan) -> Snapshot {
    for f in &plan.files {
        let read = f.text.as_ref().map(|t| FileRead {
            bytes: t.as_bytes().to_vec(),
            mode: f.new_mode,
        });
        s.insert(f.path.clone(), read);
    }
    s
}

/// A file's text as codebox writes a new one.
fn render(value: &Value) -> String {
    let mut text = serde_json::to_string_pretty(value).unwrap();
    text.push('\n');
    text
}

fn value(s: &Snapshot, path: &Path) -> Option<Value> {
    s.get(path)
        .map(|r| serde_json::from_slice(&r.bytes).expect("the plan writes JSON"))
}

fn project_entry() -> Value {
    json!({"command": EXE, "args": ["serve", "--rootfs", "/opt/rootfs",
                                    "--mcp-config", "/p/.codebox/mcp.json"]})
}

fn local_entry(at: &Locations) -> Value {
    json!({"command": EXE, "args": ["serve", "--rootfs", "/opt/rootfs",
        "--mcp-config", "/p/.codebox/mcp.json",
        "--mcp-config", at.local_codebox.to_str().unwrap()]})
}

const PROJECT: &str = r#"{
  "mcpServers": {
    "files": {"command": "npx", "args": ["-y", "server-filesystem", "."]},
    "api": {"type": "http", "url": "https://api.example/mcp", "headers": {"X": "${TOKEN}"}}
  },
  "other": {"kept": true}
}"#;

const CLAUDE: &str = r#"{
  "numStartups": 12,
  "mcpServers": {"everywhere": {"command": "uvx", "args": ["mcp-server-time"]}},
  "projects": {
    "/p": {"allowedTools": ["Bash"], "mcpServers": {"secret": {"command": "s", "env": {"KEY": "k"}}}},
    "/q": {"mcpServers": {"elsewhere": {"command": "e"}}}
  }
}"#;

#[test]
fn a_project_install_moves_project_and_local_servers_and_a_second_run_does_nothing() {
    let at = at();
    let s = snapshot(
        &at,
        &[(&at.project_mcp, PROJECT), (&at.claude_json, CLAUDE)],
    );
    let p = install(&at, &s).unwrap();
    let files: Vec<&Path> = p.files.iter().map(|f| f.path.as_path()).collect();
    assert_eq!(
        files,
        [
            at.project_codebox.as_path(),
            &at.local_codebox,
            &at.project_mcp,
            &at.claude_json
        ],
        "codebox files first"
    );
    let after = applied(s.clone(), &p);
    assert_eq!(
        value(&after, &at.project_codebox).unwrap(),
        json!({"mcpServers": {
            "files": {"command": "npx", "args": ["-y", "server-filesystem", "."]},
            "api": {"type": "http", "url": "https://api.example/mcp", "headers": {"X": "${TOKEN}"}}
        }})
    );
    assert_eq!(
        value(&after, &at.project_mcp).unwrap(),
        json!({"mcpServers": {"codebox": project_entry()}, "other": {"kept": true}})
    );
    assert_eq!(
        value(&after, &at.local_codebox).unwrap(),
        json!({"mcpServers": {"secret": {"command": "s", "env": {"KEY": "k"}}}})
    );
    let claude = value(&after, &at.claude_json).unwrap();
    let mut expected: Value = serde_json::from_str(CLAUDE).unwrap();
    expected["projects"]["/p"]["mcpServers"] = json!({"codebox": local_entry(&at)});
    assert_eq!(claude, expected, "nothing else of ~/.claude.json changes");
    let local = p.files.iter().find(|f| f.path == at.local_codebox).unwrap();
    assert_eq!((local.new_mode, local.dir_mode), (0o600, 0o700));
    let project = p
        .files
        .iter()
        .find(|f| f.path == at.project_codebox)
        .unwrap();
    assert_eq!((project.new_mode, project.dir_mode), (0o644, 0o755));

    let lines = p.describe();
    assert!(
        lines.contains(
            &"move files, api: /p/.mcp.json (project scope) → /p/.codebox/mcp.json".to_string()
        ),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("move secret: /h/.claude.json projects[\"/p\"] (local scope) → /h/.config/codebox/claude-code/local/p-")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("add the codebox entry to /p/.mcp.json (project scope): /opt/bin/codebox serve --rootfs /opt/rootfs --mcp-config /p/.codebox/mcp.json")),
        "{lines:#?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("lays out")),
        "files laid out as codebox writes JSON come back as they were, but for the edits: {lines:#?}"
    );

    let again = install(&at, &after).unwrap();
    assert!(again.nothing_to_do(), "{:#?}", again.describe());
    assert!(again.steps.is_empty());
}

#[test]
fn servers_added_later_are_moved_and_merged() {
    let at = at();
    let s = snapshot(&at, &[(&at.project_mcp, PROJECT)]);
    let mut after = applied(s.clone(), &install(&at, &s).unwrap());
    let mut mcp = value(&after, &at.project_mcp).unwrap();
    mcp["mcpServers"]["new"] = json!({"command": "new-server"});
    after = applied(
        after,
        &Plan {
            files: vec![FileChange {
                path: at.project_mcp.clone(),
                original: None,
                text: Some(render(&mcp)),
                new_mode: 0o644,
                dir_mode: 0o755,
            }],
            ..Plan::default()
        },
    );
    let p = install(&at, &after).unwrap();
    assert_eq!(
        p.steps,
        [Step::Move {
            servers: vec!["new".into()],
            from: "/p/.mcp.json (project scope)".into(),
            to: "/p/.codebox/mcp.json".into()
        }]
    );
    assert!(
        !p.notes.iter().any(|n| n.contains("lays out")),
        "a file codebox wrote keeps its layout: {:?}",
        p.notes
    );
    let after = applied(after, &p);
    let file = super::super::doc::Members::parse(&text_of(&after, &at.project_codebox)).unwrap();
    let servers = file.get("mcpServers").unwrap().members().unwrap();
    assert_eq!(
        servers.keys().collect::<Vec<_>>(),
        ["files", "api", "new"],
        "in the order they came in"
    );
}

#[test]
fn a_name_already_moved_is_dropped_when_the_same_and_refused_when_different() {
    let at = at();
    let codebox = r#"{"mcpServers": {"files": {"command": "npx", "args": ["-y", "server-filesystem", "."]},
                                      "api": {"type": "http", "url": "https://other/mcp"}}}"#;
    let s = snapshot(
        &at,
        &[(&at.project_mcp, PROJECT), (&at.project_codebox, codebox)],
    );
    let e = install(&at, &s).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("\"api\"")
            && text.contains("/p/.codebox/mcp.json")
            && text.contains("/p/.mcp.json (project scope)")
            && text.contains("nothing was changed"),
        "{text}"
    );
    let codebox = r#"{"mcpServers": {"files": {"command": "npx", "args": ["-y", "server-filesystem", "."]}}}"#;
    let s = snapshot(
        &at,
        &[(&at.project_mcp, PROJECT), (&at.project_codebox, codebox)],
    );
    let p = install(&at, &s).unwrap();
    assert!(p.steps.contains(&Step::AlreadyThere {
        servers: vec!["files".into()],
        from: "/p/.mcp.json (project scope)".into(),
        to: "/p/.codebox/mcp.json".into()
    }));
    assert!(p.steps.contains(&Step::Move {
        servers: vec!["api".into()],
        from: "/p/.mcp.json (project scope)".into(),
        to: "/p/.codebox/mcp.json".into()
    }));
}

#[test]
fn codebox_itself_is_not_moved_and_its_entry_is_brought_up_to_date() {
    let at = at();
    let mcp = r#"{"mcpServers": {
        "codebox": {"command": "/old/codebox", "args": ["serve", "--tools", "minimal", "--rootfs", "/old/rootfs"]},
        "sandbox": {"command": "/opt/bin/codebox", "args": ["serve"]},
        "time": {"command": "uvx", "args": ["mcp-server-time"]}
    }}"#;
    let s = snapshot(&at, &[(&at.project_mcp, mcp)]);
    let p = install(&at, &s).unwrap();
    let after = applied(s, &p);
    let servers = value(&after, &at.project_mcp).unwrap()["mcpServers"].clone();
    let mut entry = project_entry();
    entry["args"]
        .as_array_mut()
        .unwrap()
        .extend([json!("--tools"), json!("minimal")]);
    assert_eq!(servers["codebox"], entry);
    assert_eq!(
        servers["sandbox"],
        json!({"command": "/opt/bin/codebox", "args": ["serve"]})
    );
    assert!(servers.get("time").is_none());
    assert_eq!(
        value(&after, &at.project_codebox).unwrap()["mcpServers"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["time"]
    );
    let lines = p.describe();
    assert!(
        lines.iter().any(|l| l.starts_with("update the codebox entry in /p/.mcp.json (project scope): /old/codebox serve --tools minimal --rootfs /old/rootfs → /opt/bin/codebox serve")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"sandbox\" starts codebox itself: left in place")),
        "{lines:#?}"
    );
}

#[test]
fn an_unrelated_server_named_codebox_moves_and_comes_back() {
    let at = at();
    let mcp = r#"{"mcpServers": {"codebox": {"command": "my-codebox-tool"}}}"#;
    let s = snapshot(&at, &[(&at.project_mcp, mcp)]);
    let after = applied(s.clone(), &install(&at, &s).unwrap());
    assert_eq!(
        value(&after, &at.project_codebox).unwrap(),
        json!({"mcpServers": {"codebox": {"command": "my-codebox-tool"}}})
    );
    assert_eq!(
        value(&after, &at.project_mcp).unwrap(),
        json!({"mcpServers": {"codebox": project_entry()}})
    );
    let back = applied(after.clone(), &uninstall(&at, &after).unwrap());
    assert_eq!(value(&back, &at.project_mcp), value(&s, &at.project_mcp));
}

#[test]
fn nothing_to_move_still_installs_codebox_with_an_empty_file() {
    let at = at();
    let s = snapshot(&at, &[(&at.claude_json, r#"{"projects": {}}"#)]);
    let p = install(&at, &s).unwrap();
    let files: Vec<&Path> = p.files.iter().map(|f| f.path.as_path()).collect();
    assert_eq!(files, [at.project_codebox.as_path(), &at.project_mcp]);
    let after = applied(s, &p);
    assert_eq!(
        value(&after, &at.project_codebox).unwrap(),
        json!({"mcpServers": {}})
    );
    assert!(
        p.notes.iter().any(|n| n.contains("no servers to move")),
        "{:?}",
        p.notes
    );
    // Uninstalling leaves no .mcp.json behind that would hold nothing.
    let back = applied(after.clone(), &uninstall(&at, &after).unwrap());
    assert_eq!(value(&back, &at.project_mcp), None);
    assert_eq!(value(&back, &at.project_codebox), None);
    assert!(uninstall(&at, &back).unwrap().nothing_to_do());
}

#[test]
fn uninstall_puts_every_server_back_where_it_was() {
    let at = at();
    let s = snapshot(
        &at,
        &[(&at.project_mcp, PROJECT), (&at.claude_json, CLAUDE)],
    );
    let after = applied(s.clone(), &install(&at, &s).unwrap());
    let p = uninstall(&at, &after).unwrap();
    let files: Vec<&Path> = p.files.iter().map(|f| f.path.as_path()).collect();
    assert_eq!(
        files,
        [
            at.project_mcp.as_path(),
            &at.claude_json,
            &at.project_codebox,
            &at.local_codebox
        ],
        "Claude Code's files first"
    );
    let back = applied(after, &p);
    for path in [&at.project_mcp, &at.claude_json] {
        assert_eq!(value(&back, path), value(&s, path), "{}", path.display());
    }
    assert_eq!(value(&back, &at.project_codebox), None);
    assert_eq!(value(&back, &at.local_codebox), None);
    let lines = p.describe();
    assert!(
        lines
            .iter()
            .any(|l| l == "move files, api: /p/.codebox/mcp.json → /p/.mcp.json (project scope)"),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(
            "remove the codebox entry from /h/.claude.json projects[\"/p\"] (local scope)"
        )),
        "{lines:#?}"
    );
    assert!(uninstall(&at, &back).unwrap().nothing_to_do());
}

#[test]
fn uninstall_refuses_a_name_taken_since_by_another_definition() {
    let at = at();
    let s = snapshot(&at, &[(&at.project_mcp, PROJECT)]);
    let after = applied(s.clone(), &install(&at, &s).unwrap());
    let mut mcp = value(&after, &at.project_mcp).unwrap();
    mcp["mcpServers"]["files"] = json!({"command": "another"});
    let mut changed = after.clone();
    changed.insert(
        at.project_mcp.clone(),
        Some(FileRead {
            bytes: render(&mcp).into_bytes(),
            mode: 0o644,
        }),
    );
    let e = uninstall(&at, &changed).unwrap_err();
    assert!(
        matches!(e, Error::Conflict { ref server, .. } if server == "files"),
        "{e}"
    );
}

#[test]
fn user_scope_round_trip() {
    let at = at();
    let s = snapshot(&at, &[(&at.claude_json, CLAUDE)]);
    let p = make(Action::Install(&launcher()), true, &at, &s).unwrap();
    let after = applied(s.clone(), &p);
    assert_eq!(
        value(&after, &at.user_codebox).unwrap(),
        json!({"mcpServers": {"everywhere": {"command": "uvx", "args": ["mcp-server-time"]}}})
    );
    let claude = value(&after, &at.claude_json).unwrap();
    assert_eq!(
        claude["mcpServers"],
        json!({"codebox": {"command": EXE, "args": ["serve", "--rootfs", "/opt/rootfs",
            "--mcp-config", "/h/.config/codebox/claude-code/user.json"]}})
    );
    assert_eq!(
        claude["projects"],
        serde_json::from_str::<Value>(CLAUDE).unwrap()["projects"],
        "local scopes are not the user scope's business"
    );
    assert!(
        p.notes.iter().any(|n| n.contains("shadows this one")),
        "{:?}",
        p.notes
    );
    assert!(make(Action::Install(&launcher()), true, &at, &after)
        .unwrap()
        .nothing_to_do());
    // A project install then notes the shadowing.
    let p = install(&at, &after).unwrap();
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("is shadowed in this project")),
        "{:?}",
        p.notes
    );
    let back = applied(
        after.clone(),
        &make(Action::Uninstall, true, &at, &after).unwrap(),
    );
    assert_eq!(value(&back, &at.claude_json), value(&s, &at.claude_json));
    assert_eq!(value(&back, &at.user_codebox), None);
}

#[test]
fn a_user_install_without_claude_json_creates_it_private() {
    let at = at();
    let s = snapshot(&at, &[]);
    let p = make(Action::Install(&launcher()), true, &at, &s).unwrap();
    let claude = p.files.iter().find(|f| f.path == at.claude_json).unwrap();
    assert_eq!((claude.original.as_ref(), claude.new_mode), (None, 0o600));
}

#[test]
fn the_same_name_in_project_and_local_scope_is_refused() {
    let at = at();
    let claude = r#"{"projects": {"/p": {"mcpServers": {"files": {"command": "mine"}}}}}"#;
    let s = snapshot(
        &at,
        &[(&at.project_mcp, PROJECT), (&at.claude_json, claude)],
    );
    let e = install(&at, &s).unwrap_err();
    assert!(
        matches!(e, Error::SameNameInTwoScopes { ref server, .. } if server == "files"),
        "{e}"
    );
    assert!(e.to_string().contains("shadow"), "{e}");
}

#[test]
fn without_local_servers_there_is_no_local_entry_and_claude_json_is_untouched() {
    let at = at();
    let claude = r#"{"projects": {"/p": {"mcpServers": {}}}}"#;
    let s = snapshot(
        &at,
        &[(&at.project_mcp, PROJECT), (&at.claude_json, claude)],
    );
    let p = install(&at, &s).unwrap();
    assert!(p
        .files
        .iter()
        .all(|f| f.path != at.claude_json && f.path != at.local_codebox));
}

#[test]
fn other_transports_move_with_a_note() {
    let at = at();
    let mcp = r#"{"mcpServers": {"old": {"type": "sse", "url": "http://h/sse"}}}"#;
    let s = snapshot(&at, &[(&at.project_mcp, mcp)]);
    let p = install(&at, &s).unwrap();
    assert!(
        p.notes
            .iter()
            .any(|n| n.contains("\"old\" is of type \"sse\"")),
        "{:?}",
        p.notes
    );
    assert!(p
        .steps
        .iter()
        .any(|s| matches!(s, Step::Move { servers, .. } if servers == &["old"])));
}

#[test]
fn comments_are_read_and_their_loss_is_said() {
    let at = at();
    let mcp = "{\n  // my servers\n  \"mcpServers\": {\"a\": {\"command\": \"a\"},},\n}\n";
    let s = snapshot(&at, &[(&at.project_mcp, mcp)]);
    let p = install(&at, &s).unwrap();
    assert!(
        p.notes.iter().any(|n| n.contains(
            "/p/.mcp.json has 1 comment and 2 trailing commas; the rewrite does not keep them"
        )),
        "{:?}",
        p.notes
    );
}

#[test]
fn bad_files_are_refused_by_name() {
    let at = at();
    let cases: &[(&Path, &str, &str)] = &[
        (
            &at.project_mcp,
            "{\n  \"mcpServers\": {\n    \"a\": }\n}",
            "/p/.mcp.json is not valid JSON at line 3, column 10",
        ),
        (
            &at.project_mcp,
            "[]",
            "/p/.mcp.json: the top level is not a JSON object",
        ),
        (
            &at.project_mcp,
            r#"{"mcpServers": []}"#,
            "/p/.mcp.json (project scope): mcpServers is not an object",
        ),
        (
            &at.project_mcp,
            r#"{"mcpServers": {"a": "npx a"}}"#,
            "/p/.mcp.json (project scope): server \"a\" is not a JSON object",
        ),
        (
            &at.claude_json,
            r#"{"projects": {"/p": []}}"#,
            "/h/.claude.json projects[\"/p\"] (local scope): projects[\"/p\"] is not an object",
        ),
        (
            &at.claude_json,
            r#"{"projects": {"/p": {"mcpServers": 1}}}"#,
            "(local scope): mcpServers is not an object",
        ),
        (
            &at.project_codebox,
            r#"{"mcpServers": {"x": 1}}"#,
            "/p/.codebox/mcp.json: server \"x\" is not a JSON object",
        ),
    ];
    for (path, text, expected) in cases {
        let s = snapshot(&at, &[(path, text)]);
        let e = install(&at, &s).unwrap_err().to_string();
        assert!(e.contains(expected), "{text}: {e}");
        assert!(e.contains("nothing was changed"), "{e}");
    }
    // A file of another scope is not read for its servers: a broken user scope does not
    // stop a project install.
    let s = snapshot(&at, &[(&at.claude_json, r#"{"mcpServers": 1}"#)]);
    assert!(install(&at, &s).is_ok());
}

/// `~/.claude.json` as Claude Code lays it out (2 spaces, its own key order), with values
/// whose text a parse and re-serialisation would change.
const CLAUDE_EXACT: &str = r#"{
  "numStartups": 18446744073709551616,
  "tipsHistory": {"cost": 0.30000000000000004, "tiny": 1e-7},
  "mcpServers": {
    "clock": {
      "command": "uvx",
      "args": ["mcp-server-time"],
      "timeoutSeconds": 2.50
    }
  },
  "projects": {
    "/p": {
      "allowedTools": [],
      "lastCost": 123456789.123456789,
      "mcpServers": {
        "secret": {
          "command": "s",
          "env": {
            "KEY": "caf\u00e9 \/ \"k\""
          },
          "weight": 985.6906946328695
        },
        "other": {"command": "o",   "args": [ "-x" ] }
      },
      "durations": [212.91890726713459,479.60756426982596 , -0.0, 1E+2]
    },
    "/q": {"mcpServers": {"elsewhere": {"command": "e"}}, "lastCost": 92.42132512813595}
  },
  "autoUpdates": false,
  "firstStartTime": "2025-01-01T00:00:00.000Z"
}"#;

/// The texts of CLAUDE_EXACT that a parse and re-serialisation would change.
const EXACT_TEXTS: &[&str] = &[
    "\"numStartups\": 18446744073709551616,",
    "\"tipsHistory\": {\"cost\": 0.30000000000000004, \"tiny\": 1e-7},",
    "\"timeoutSeconds\": 2.50",
    "\"lastCost\": 123456789.123456789,",
    "\"KEY\": \"caf\\u00e9 \\/ \\\"k\\\"\"",
    "\"weight\": 985.6906946328695",
    "\"other\": {\"command\": \"o\",   \"args\": [ \"-x\" ] }",
    "\"durations\": [212.91890726713459,479.60756426982596 , -0.0, 1E+2]",
    "\"/q\": {\"mcpServers\": {\"elsewhere\": {\"command\": \"e\"}}, \"lastCost\": 92.42132512813595}",
];

fn text_of(s: &Snapshot, path: &Path) -> String {
    String::from_utf8(s.get(path).unwrap().bytes.clone()).unwrap()
}

#[test]
fn values_not_changed_keep_their_text_and_key_order_through_install_and_uninstall() {
    let at = at();
    for user in [false, true] {
        let s = snapshot(&at, &[(&at.claude_json, CLAUDE_EXACT)]);
        let p = make(Action::Install(&launcher()), user, &at, &s).unwrap();
        assert!(
            !p.notes.iter().any(|n| n.contains("lays out")),
            "{:?}",
            p.notes
        );
        let after = applied(s.clone(), &p);
        let installed = text_of(&after, &at.claude_json);
        let keys = [
            "\"numStartups\"",
            "\"tipsHistory\"",
            "\"mcpServers\"",
            "\"projects\"",
            "\"autoUpdates\"",
            "\"firstStartTime\"",
        ];
        let places: Vec<usize> = keys.iter().map(|k| installed.find(k).unwrap()).collect();
        assert!(
            places.is_sorted(),
            "top-level keys in their order:\n{installed}"
        );
        // The values that moved are in the codebox file as written, re-indented.
        let moved = match user {
            true => text_of(&after, &at.user_codebox),
            false => text_of(&after, &at.local_codebox),
        };
        let expected: &[&str] = match user {
            true => &[
                "\"mcpServers\": {\n    \"clock\": {\n      \"command\": \"uvx\",\n      \"args\": [\"mcp-server-time\"],\n      \"timeoutSeconds\": 2.50\n    }\n  }",
            ],
            false => &[
                "    \"secret\": {\n      \"command\": \"s\",\n      \"env\": {\n        \"KEY\": \"caf\\u00e9 \\/ \\\"k\\\"\"\n      },\n      \"weight\": 985.6906946328695\n    },\n",
                "    \"other\": {\"command\": \"o\",   \"args\": [ \"-x\" ] }\n",
            ],
        };
        for text in expected {
            assert!(moved.contains(text), "{text} in\n{moved}");
        }
        for text in EXACT_TEXTS {
            assert!(
                installed.contains(text) || moved.contains(text),
                "{text} in\n{installed}"
            );
        }
        // The new entry reads as Claude Code writes one.
        let entry = match user {
            true => "  \"mcpServers\": {\n    \"codebox\": {\n      \"command\": \"/opt/bin/codebox\",\n      \"args\": [\n        \"serve\",",
            false => "      \"mcpServers\": {\n        \"codebox\": {\n          \"command\": \"/opt/bin/codebox\",\n          \"args\": [\n            \"serve\",",
        };
        assert!(installed.contains(entry), "{installed}");
        let p = make(Action::Uninstall, user, &at, &after).unwrap();
        let back = applied(after, &p);
        assert_eq!(
            text_of(&back, &at.claude_json),
            CLAUDE_EXACT,
            "user: {user}"
        );
    }
}

#[test]
fn a_file_laid_out_otherwise_keeps_its_values_and_says_its_layout_changes() {
    let at = at();
    let mcp = r#"{"z":[0.1,1e400e0],"mcpServers":{"a":{"command":"a","args":["1"]}},"big":18446744073709551616}"#
        .replace("1e400e0", "5e-324");
    let s = snapshot(&at, &[(&at.project_mcp, &mcp)]);
    let p = install(&at, &s).unwrap();
    assert!(
        p.notes.iter().any(|n| n.starts_with(
            "/p/.mcp.json: the rewrite keeps every value it does not change as written, but lays out"
        )),
        "{:?}",
        p.notes
    );
    let after = applied(s.clone(), &p);
    let text = text_of(&after, &at.project_mcp);
    assert!(
        text.starts_with("{\n  \"z\": [0.1,5e-324],\n  \"mcpServers\": {\n    \"codebox\": {\n")
            && text.ends_with("  },\n  \"big\": 18446744073709551616\n}"),
        "{text}"
    );
    assert_eq!(
        text_of(&after, &at.project_codebox),
        "{\n  \"mcpServers\": {\n    \"a\": {\"command\":\"a\",\"args\":[\"1\"]}\n  }\n}\n"
    );
    let back = applied(after.clone(), &uninstall(&at, &after).unwrap());
    assert_eq!(
        text_of(&back, &at.project_mcp),
        "{\n  \"z\": [0.1,5e-324],\n  \"mcpServers\": {\n    \"a\": {\"command\":\"a\",\"args\":[\"1\"]}\n  },\n  \"big\": 18446744073709551616\n}"
    );
}
