//! `codebox install claude-code` / `uninstall claude-code`, the real binary against
//! Claude Code configs in a temporary directory (`HOME` and `XDG_CONFIG_HOME` point into
//! it): project, local and user scopes, idempotence, backups, dry runs, bad input, and
//! one `codebox serve` started from a written entry (when sandboxes can run here).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A home, a config home, a project and a stand-in rootfs, all in one temporary directory.
struct Fixture {
    tmp: tempfile::TempDir,
    home: PathBuf,
    xdg: PathBuf,
    project: PathBuf,
    rootfs: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let (home, xdg, project, rootfs) = (
            root.join("home"),
            root.join("home/xdg"),
            root.join("work/app"),
            root.join("rootfs"),
        );
        for d in [&home, &project, &rootfs] {
            std::fs::create_dir_all(d).unwrap();
        }
        // `rootfs::locate` looks for the manifest only.
        std::fs::write(rootfs.join(".manifest"), "").unwrap();
        Fixture {
            tmp,
            home,
            xdg,
            project,
            rootfs,
        }
    }

    fn claude_json(&self) -> PathBuf {
        self.home.join(".claude.json")
    }

    fn mcp_json(&self) -> PathBuf {
        self.project.join(".mcp.json")
    }

    fn project_codebox(&self) -> PathBuf {
        self.project.join(".codebox/mcp.json")
    }

    fn user_codebox(&self) -> PathBuf {
        self.xdg.join("codebox/claude-code/user.json")
    }

    /// The one file in the local-scope directory that is not a backup.
    fn local_codebox(&self) -> Option<PathBuf> {
        let dir = self.xdg.join("codebox/claude-code/local");
        std::fs::read_dir(dir).ok()?.find_map(|e| {
            let p = e.unwrap().path();
            (!p.to_string_lossy().contains("codebox-backup")).then_some(p)
        })
    }

    fn write(&self, path: &Path, text: &str, mode: u32) {
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// `codebox ARGS` with this fixture's environment.
    fn codebox(&self, args: &[&str]) -> Output {
        Command::new(common::codebox_bin())
            .args(args)
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", &self.xdg)
            .env_remove("CODEBOX_ROOTFS")
            .current_dir(&self.project)
            .output()
            .unwrap()
    }

    fn install(&self, extra: &[&str]) -> Output {
        let mut args = vec!["install", "claude-code", "--rootfs"];
        args.push(self.rootfs.to_str().unwrap());
        args.extend(extra);
        self.codebox(&args)
    }

    fn uninstall(&self, extra: &[&str]) -> Output {
        let mut args = vec!["uninstall", "claude-code"];
        args.extend(extra);
        self.codebox(&args)
    }

    /// Every file and symlink under the fixture: path → (mode, contents or link target).
    fn tree(&self) -> BTreeMap<PathBuf, (u32, Vec<u8>)> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (u32, Vec<u8>)>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let mode = m.permissions().mode() & 0o7777;
                if m.is_dir() {
                    out.insert(p.clone(), (mode, Vec::new()));
                    walk(&p, out);
                } else if m.file_type().is_symlink() {
                    let target = std::fs::read_link(&p).unwrap();
                    out.insert(p, (0, target.to_string_lossy().as_bytes().to_vec()));
                } else {
                    out.insert(p.clone(), (mode, std::fs::read(&p).unwrap()));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(self.tmp.path(), &mut out);
        out
    }

    /// Backups of `path`, oldest first.
    fn backups(&self, path: &Path) -> Vec<PathBuf> {
        let name = format!(
            "{}.codebox-backup-",
            path.file_name().unwrap().to_string_lossy()
        );
        let mut found: Vec<PathBuf> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&name))
            .collect();
        found.sort();
        found
    }
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn failed(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(125),
        "stdout:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn parse(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn exe() -> String {
    std::fs::canonicalize(common::codebox_bin())
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

const PROJECT_SERVERS: &str = r#"{
  "mcpServers": {
    "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "."]},
    "api": {"type": "http", "url": "https://api.example/mcp", "headers": {"Authorization": "Bearer ${API_TOKEN}"}}
  },
  "someOtherKey": [1, 2.5, {"x": null}]
}
"#;

/// `~/.claude.json` with Claude Code state around the servers of every scope.
fn claude_json(project: &Path) -> String {
    json!({
        "numStartups": 42,
        "tipsHistory": {"a": 1},
        "mcpServers": {"clock": {"command": "uvx", "args": ["mcp-server-time"]}},
        "projects": {
            project.to_str().unwrap(): {
                "allowedTools": ["Bash(ls)"],
                "history": [{"display": "hi"}],
                "mcpServers": {"secret": {"command": "tool", "env": {"KEY": "s3cret"}}}
            },
            "/elsewhere": {"mcpServers": {"other": {"command": "o"}}}
        }
    })
    .to_string()
}

#[test]
fn project_and_local_scopes_move_behind_codebox_and_back() {
    let fx = Fixture::new();
    fx.write(&fx.mcp_json(), PROJECT_SERVERS, 0o644);
    fx.write(&fx.claude_json(), &claude_json(&fx.project), 0o600);
    let original_mcp = parse(&fx.mcp_json());
    let original_claude = parse(&fx.claude_json());
    let before = fx.tree();

    // A dry run says everything and changes nothing.
    let out = ok(&fx.install(&["--dry-run"]));
    assert!(out.contains("move files, api:"), "{out}");
    assert!(out.contains("would back up"), "{out}");
    assert!(out.contains("dry run: nothing was changed"), "{out}");
    assert_eq!(fx.tree(), before);

    let out = ok(&fx.install(&[]));
    let rootfs = fx.rootfs.to_str().unwrap();
    let project_file = fx.project_codebox();
    let local_file = fx.local_codebox().expect("a local-scope codebox file");
    assert!(
        out.contains(&format!(
            "move files, api: {} (project scope) → {}",
            fx.mcp_json().display(),
            project_file.display()
        )),
        "{out}"
    );
    assert!(out.contains("move secret:"), "{out}");
    assert!(out.contains("backed up"), "{out}");
    // The servers, in codebox's files.
    assert_eq!(
        parse(&project_file),
        json!({"mcpServers": original_mcp["mcpServers"]})
    );
    assert_eq!(
        parse(&local_file),
        json!({"mcpServers": {"secret": {"command": "tool", "env": {"KEY": "s3cret"}}}})
    );
    // The codebox entries, in Claude Code's files; nothing else changed there.
    let mut expected = original_mcp.clone();
    expected["mcpServers"] = json!({"codebox": {"command": exe(), "args": [
        "serve", "--rootfs", rootfs, "--mcp-config", project_file.to_str().unwrap()]}});
    assert_eq!(parse(&fx.mcp_json()), expected);
    let mut expected = original_claude.clone();
    expected["projects"][fx.project.to_str().unwrap()]["mcpServers"] = json!({"codebox": {"command": exe(), "args": [
            "serve", "--rootfs", rootfs,
            "--mcp-config", project_file.to_str().unwrap(),
            "--mcp-config", local_file.to_str().unwrap()]}});
    assert_eq!(parse(&fx.claude_json()), expected);
    // Backups: byte for byte the originals, with their modes; private files stay private.
    for path in [fx.mcp_json(), fx.claude_json()] {
        let backups = fx.backups(&path);
        assert_eq!(backups.len(), 1, "{backups:?}");
        assert_eq!(before[&path], fx.tree()[&backups[0]], "{}", path.display());
    }
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&fx.claude_json()), 0o600);
    assert_eq!(mode(&local_file), 0o600);
    assert_eq!(mode(local_file.parent().unwrap()), 0o700);
    assert_eq!(mode(&fx.mcp_json()), 0o644);

    // Twice is once.
    let installed = fx.tree();
    let out = ok(&fx.install(&[]));
    assert!(out.contains("nothing to do"), "{out}");
    assert_eq!(fx.tree(), installed);

    // A server added since moves alone, into the existing file.
    let mut mcp = parse(&fx.mcp_json());
    mcp["mcpServers"]["later"] = json!({"command": "later-server"});
    fx.write(&fx.mcp_json(), &mcp.to_string(), 0o644);
    let out = ok(&fx.install(&[]));
    assert!(out.contains("move later:"), "{out}");
    assert!(!out.contains("move files"), "{out}");
    let servers = parse(&project_file)["mcpServers"].clone();
    assert_eq!(
        servers.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["api", "files", "later"]
    );

    // Uninstall puts every server back where it was.
    let out = ok(&fx.uninstall(&[]));
    assert!(out.contains("remove the codebox entry"), "{out}");
    let mut expected = original_mcp.clone();
    expected["mcpServers"]["later"] = json!({"command": "later-server"});
    assert_eq!(parse(&fx.mcp_json()), expected);
    assert_eq!(parse(&fx.claude_json()), original_claude);
    assert!(!project_file.exists() && !local_file.exists());
    assert_eq!(
        fx.backups(&project_file).len(),
        2,
        "merged once, removed once"
    );
    assert_eq!(fx.backups(&local_file).len(), 1);
    let uninstalled = fx.tree();
    let out = ok(&fx.uninstall(&[]));
    assert!(out.contains("nothing to do"), "{out}");
    assert_eq!(fx.tree(), uninstalled);
}

#[test]
fn user_scope_moves_behind_codebox_and_back() {
    let fx = Fixture::new();
    fx.write(&fx.claude_json(), &claude_json(&fx.project), 0o600);
    let original = parse(&fx.claude_json());
    let before = fx.tree();
    ok(&fx.install(&["--user", "--dry-run"]));
    assert_eq!(fx.tree(), before);

    let out = ok(&fx.install(&["--user"]));
    assert!(out.contains("move clock:"), "{out}");
    assert_eq!(
        parse(&fx.user_codebox()),
        json!({"mcpServers": {"clock": {"command": "uvx", "args": ["mcp-server-time"]}}})
    );
    let claude = parse(&fx.claude_json());
    assert_eq!(
        claude["mcpServers"],
        json!({"codebox": {"command": exe(), "args": ["serve", "--rootfs", fx.rootfs.to_str().unwrap(),
            "--mcp-config", fx.user_codebox().to_str().unwrap()]}})
    );
    assert_eq!(claude["projects"], original["projects"]);
    let mode = std::fs::metadata(fx.user_codebox())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    let installed = fx.tree();
    assert!(ok(&fx.install(&["--user"])).contains("nothing to do"));
    assert_eq!(fx.tree(), installed);

    ok(&fx.uninstall(&["--user"]));
    assert_eq!(parse(&fx.claude_json()), original);
    assert!(!fx.user_codebox().exists());
    assert!(ok(&fx.uninstall(&["--user"])).contains("nothing to do"));
}

#[test]
fn nothing_to_move_installs_codebox_with_an_empty_file() {
    let fx = Fixture::new();
    let out = ok(&fx.install(&["--project", fx.project.to_str().unwrap()]));
    assert!(out.contains("no servers to move"), "{out}");
    assert_eq!(parse(&fx.project_codebox()), json!({"mcpServers": {}}));
    assert!(parse(&fx.mcp_json())["mcpServers"]["codebox"].is_object());
    assert!(
        !fx.claude_json().exists(),
        "no local servers: ~/.claude.json untouched"
    );
    ok(&fx.uninstall(&[]));
    assert!(!fx.mcp_json().exists() && !fx.project_codebox().exists());
}

#[test]
fn comments_are_read_and_the_backup_keeps_them() {
    let fx = Fixture::new();
    let text = "{\n  // my servers\n  \"mcpServers\": {\n    \"a\": {\"command\": \"a\"}, /* old */\n  },\n}\n";
    fx.write(&fx.mcp_json(), text, 0o644);
    let out = ok(&fx.install(&[]));
    assert!(
        out.contains("has 2 comments and 2 trailing commas; the rewrite does not keep them"),
        "{out}"
    );
    let backups = fx.backups(&fx.mcp_json());
    assert_eq!(std::fs::read_to_string(&backups[0]).unwrap(), text);
    assert_eq!(
        parse(&fx.project_codebox()),
        json!({"mcpServers": {"a": {"command": "a"}}})
    );
}

#[test]
fn codebox_itself_is_not_moved_and_its_entry_is_updated() {
    let fx = Fixture::new();
    let mcp = json!({"mcpServers": {
        "codebox": {"command": "/old/place/codebox", "args": ["serve", "--rootfs", "/old/rootfs", "--tools", "minimal"]},
        "twin": {"command": exe(), "args": ["serve"]},
        "time": {"command": "uvx", "args": ["mcp-server-time"]}
    }});
    fx.write(&fx.mcp_json(), &mcp.to_string(), 0o644);
    let out = ok(&fx.install(&[]));
    assert!(out.contains("update the codebox entry"), "{out}");
    assert!(
        out.contains("\"twin\" starts codebox itself: left in place"),
        "{out}"
    );
    let servers = parse(&fx.mcp_json())["mcpServers"].clone();
    assert_eq!(servers["twin"], mcp["mcpServers"]["twin"]);
    assert_eq!(servers["codebox"]["command"], json!(exe()));
    let args = servers["codebox"]["args"].as_array().unwrap();
    assert_eq!(args[2], json!(fx.rootfs.to_str().unwrap()));
    assert_eq!(&args[5..], [json!("--tools"), json!("minimal")]);
    assert_eq!(
        parse(&fx.project_codebox())["mcpServers"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["time"]
    );
}

/// `~/.claude.json` as Claude Code lays it out (2 spaces, its own key order, no sorting),
/// with values whose text a parse and re-serialisation would change: floats that are not
/// the shortest text of their double, integers past u64, exponents, escapes, odd spacing.
fn claude_json_exact(project: &Path) -> String {
    let project = serde_json::to_string(project.to_str().unwrap()).unwrap();
    format!(
        r#"{{
  "numStartups": 18446744073709551616,
  "tipsHistory": {{"cost": 0.30000000000000004, "tiny": 1e-7, "big": 123456789.123456789}},
  "mcpServers": {{
    "clock": {{
      "command": "uvx",
      "args": ["mcp-server-time"],
      "timeoutSeconds": 2.50
    }}
  }},
  "projects": {{
    {project}: {{
      "allowedTools": [],
      "lastCost": 0.1e1,
      "mcpServers": {{
        "secret": {{
          "command": "tool",
          "env": {{
            "KEY": "caf\u00e9 \/ s3cret"
          }}
        }}
      }},
      "durations": [212.91890726713459,479.60756426982596 , -0.0, 1E+2]
    }},
    "/elsewhere": {{"mcpServers": {{"other": {{"command": "o"}}}}, "lastCost": 92.42132512813595}}
  }},
  "autoUpdates": false,
  "firstStartTime": "2025-01-01T00:00:00.000Z"
}}"#
    )
}

#[test]
fn values_install_does_not_change_keep_their_text_and_order() {
    let fx = Fixture::new();
    let original = claude_json_exact(&fx.project);
    fx.write(&fx.claude_json(), &original, 0o600);
    let mcp = "{\n  \"mcpServers\": {\n    \"files\": {\"command\": \"npx\", \"args\": [\"-y\", \"server\"]}\n  },\n  \"ratio\": 0.30000000000000004\n}\n";
    fx.write(&fx.mcp_json(), mcp, 0o644);
    let unchanged = [
        "\"numStartups\": 18446744073709551616,",
        "\"tipsHistory\": {\"cost\": 0.30000000000000004, \"tiny\": 1e-7, \"big\": 123456789.123456789},",
        "\"lastCost\": 0.1e1,",
        "\"durations\": [212.91890726713459,479.60756426982596 , -0.0, 1E+2]",
        "\"/elsewhere\": {\"mcpServers\": {\"other\": {\"command\": \"o\"}}, \"lastCost\": 92.42132512813595}",
    ];
    let top_keys = [
        "numStartups",
        "tipsHistory",
        "mcpServers",
        "projects",
        "autoUpdates",
        "firstStartTime",
    ];
    let in_order = |text: &str| {
        let at: Vec<usize> = top_keys
            .iter()
            .map(|k| text.find(&format!("\n  \"{k}\": ")).unwrap())
            .collect();
        at.is_sorted()
    };

    for user in [false, true] {
        let scope: &[&str] = if user { &["--user"] } else { &[] };
        let out = ok(&fx.install(scope));
        assert!(!out.contains("lays out"), "{out}");
        let installed = std::fs::read_to_string(fx.claude_json()).unwrap();
        for text in unchanged {
            assert!(installed.contains(text), "{text} in\n{installed}");
        }
        assert!(in_order(&installed), "{installed}");
        let moved = match user {
            true => std::fs::read_to_string(fx.user_codebox()).unwrap(),
            false => std::fs::read_to_string(fx.local_codebox().unwrap()).unwrap(),
        };
        let secret = "    \"secret\": {\n      \"command\": \"tool\",\n      \"env\": {\n        \"KEY\": \"caf\\u00e9 \\/ s3cret\"\n      }\n    }\n";
        let clock = "    \"clock\": {\n      \"command\": \"uvx\",\n      \"args\": [\"mcp-server-time\"],\n      \"timeoutSeconds\": 2.50\n    }\n";
        let expected = if user { clock } else { secret };
        assert!(moved.contains(expected), "{expected} in\n{moved}");
        if !user {
            let mcp_now = std::fs::read_to_string(fx.mcp_json()).unwrap();
            assert!(
                mcp_now.ends_with("\n  },\n  \"ratio\": 0.30000000000000004\n}\n"),
                "{mcp_now}"
            );
            assert!(std::fs::read_to_string(fx.project_codebox())
                .unwrap()
                .contains(
                    "    \"files\": {\"command\": \"npx\", \"args\": [\"-y\", \"server\"]}\n"
                ));
        }

        ok(&fx.uninstall(scope));
        assert_eq!(
            std::fs::read_to_string(fx.claude_json()).unwrap(),
            original,
            "user: {user}"
        );
    }
    assert_eq!(std::fs::read_to_string(fx.mcp_json()).unwrap(), mcp);
}

/// `~/.claude.json` with these local-scope servers for the fixture's project.
fn claude(fx: &Fixture, servers: Value) -> String {
    json!({"projects": {fx.project.to_str().unwrap(): {"mcpServers": servers}}}).to_string()
}

#[test]
fn bad_input_is_refused_by_name_and_nothing_changes() {
    type Case = (
        &'static str,
        fn(&Fixture) -> (PathBuf, String),
        &'static str,
    );
    let cases: &[Case] = &[
        (
            "invalid JSON",
            |fx| {
                (fx.mcp_json(), "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"a\"}\n    \"b\": {}\n  }\n}".into())
            },
            "is not valid JSON at line 4, column 5",
        ),
        (
            "unclosed comment",
            |fx| (fx.mcp_json(), "{\"mcpServers\": {}}\n/* to do".into()),
            "is not valid JSON at line 2, column 1: a /* comment is never closed",
        ),
        (
            "mcpServers not an object",
            |fx| (fx.mcp_json(), r#"{"mcpServers": ["a"]}"#.into()),
            "(project scope): mcpServers is not an object",
        ),
        (
            "an entry not an object",
            |fx| (fx.claude_json(), claude(fx, json!({"a": "npx a"}))),
            "(local scope): server \"a\" is not a JSON object",
        ),
        (
            "a name taken in the codebox file",
            |fx| {
                (
                    fx.project_codebox(),
                    r#"{"mcpServers": {"files": {"command": "other"}}}"#.into(),
                )
            },
            "server \"files\" is in",
        ),
        (
            "the same name in project and local scope",
            |fx| {
                (
                    fx.claude_json(),
                    claude(fx, json!({"api": {"command": "mine"}})),
                )
            },
            "would be in both",
        ),
    ];
    for (what, setup, expected) in cases {
        let fx = Fixture::new();
        fx.write(&fx.mcp_json(), PROJECT_SERVERS, 0o644);
        let (path, text) = setup(&fx);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        fx.write(&path, &text, 0o600);
        let before = fx.tree();
        let err = failed(&fx.install(&[]));
        assert!(err.contains(expected), "{what}: {err}");
        assert!(
            err.contains(path.to_str().unwrap()),
            "{what} names the file: {err}"
        );
        assert_eq!(fx.tree(), before, "{what}: nothing changed");
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
    }
}

#[test]
fn a_symlinked_claude_json_is_written_through_and_a_dangling_one_refused() {
    let fx = Fixture::new();
    let dotfiles = fx.home.join("dotfiles");
    std::fs::create_dir(&dotfiles).unwrap();
    let target = dotfiles.join("claude.json");
    fx.write(&target, &claude_json(&fx.project), 0o600);
    std::os::unix::fs::symlink(&target, fx.claude_json()).unwrap();
    let out = ok(&fx.install(&["--user"]));
    assert!(out.contains("is a symlink: writing through to"), "{out}");
    assert!(std::fs::symlink_metadata(fx.claude_json())
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(parse(&target)["mcpServers"]["codebox"].is_object());
    assert_eq!(fx.backups(&target).len(), 1);

    std::fs::remove_file(&target).unwrap();
    let before = fx.tree();
    let err = failed(&fx.install(&["--user"]));
    assert!(
        err.contains("is a symlink to") && err.contains("does not exist"),
        "{err}"
    );
    assert_eq!(fx.tree(), before);
}

/// `codebox serve` started exactly as the local-scope entry says lists the servers moved
/// from both scopes (two copies of the raw JSON-RPC test server), and the SSE one that
/// moved with them as failed.
#[test]
fn the_written_entry_serves_the_moved_servers() {
    if !common::sandbox_available("the_written_entry_serves_the_moved_servers") {
        return;
    }
    let fx = Fixture::new();
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream/hostile_server.py");
    let stdio = json!({"command": "python3", "args": [server]});
    // An entry serve cannot start (legacy SSE) moves too, and serve lists it as failed.
    let sse = json!({"type": "sse", "url": "http://127.0.0.1:9/sse"});
    fx.write(
        &fx.mcp_json(),
        &json!({"mcpServers": {"shared": stdio, "legacy": sse}}).to_string(),
        0o644,
    );
    fx.write(
        &fx.claude_json(),
        &json!({"projects": {fx.project.to_str().unwrap(): {"mcpServers": {"mine": stdio}}}})
            .to_string(),
        0o600,
    );
    let rootfs = common::rootfs_dir().canonicalize().unwrap();
    let out = fx.codebox(&[
        "install",
        "claude-code",
        "--rootfs",
        rootfs.to_str().unwrap(),
    ]);
    assert!(ok(&out).contains("\"legacy\" is of type \"sse\""));
    let entry = &parse(&fx.claude_json())["projects"][fx.project.to_str().unwrap()]["mcpServers"]
        ["codebox"];
    let args: Vec<&str> = entry["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let mut child = KillOnDrop(
        Command::new(entry["command"].as_str().unwrap())
            .args(&args)
            .env("CODEBOX_POOL_SIZE", "0")
            .current_dir(&fx.home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let child = &mut child.0;
    let mut stdin = child.stdin.take().unwrap();
    let (tx, answers) = std::sync::mpsc::channel::<Value>();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v.get("id").is_some() && tx.send(v).is_err() {
                    break;
                }
            }
        }
    });
    let mut send = |msg: Value| writeln!(&mut stdin, "{msg}").unwrap();
    let answer = |id: u64| -> Value {
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let v = answers
                .recv_timeout(left)
                .expect("an answer from codebox serve");
            if v["id"] == json!(id) {
                return v;
            }
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "install-test", "version": "0"}}}),
    );
    answer(1);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    // serve is ready at once and connects its upstream servers in the background: ask
    // until none is still connecting.
    let statuses = |listed: &Value| -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = listed["result"]["structuredContent"]["servers"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"))
            .iter()
            .map(|s| {
                let field = |k: &str| s[k].as_str().unwrap().to_string();
                (field("name"), field("status"))
            })
            .collect();
        all.sort();
        all
    };
    let until = Instant::now() + Duration::from_secs(60);
    let mut id = 2;
    let listed = loop {
        send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "list_servers", "arguments": {}}}));
        let listed = answer(id);
        let connecting = statuses(&listed).iter().any(|(_, s)| s == "connecting");
        if !connecting || Instant::now() > until {
            break listed;
        }
        std::thread::sleep(Duration::from_millis(100));
        id += 1;
    };
    // End of input: the server stops.
    drop(stdin);
    let status = |name: &str, status: &str| (name.to_string(), status.to_string());
    assert_eq!(
        statuses(&listed),
        [
            status("legacy", "failed"),
            status("mine", "ready"),
            status("shared", "ready")
        ],
        "{listed}"
    );
    let text = listed["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("\"sse\""), "the reason is said: {text}");
    let until = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        child.try_wait().unwrap().is_some(),
        "codebox serve did not exit when its stdin closed"
    );
}

/// A child process that a failing test does not leave behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}
