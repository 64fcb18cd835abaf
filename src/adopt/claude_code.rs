//! Claude Code's MCP configuration as codebox adopts it.
//!
//! Claude Code keeps servers in three scopes; each becomes a [`Unit`]: the scope's servers
//! (where they live) and the codebox file they move to.
//!
//! | scope | Claude Code keeps it in | codebox file |
//! |---|---|---|
//! | project | `DIR/.mcp.json` `mcpServers` | `DIR/.codebox/mcp.json` |
//! | local (private to the user, per project) | `~/.claude.json` `projects["DIR"].mcpServers` | `$XDG_CONFIG_HOME/codebox/claude-code/local/<dirname>-<hash>.json` (0600) |
//! | user | `~/.claude.json` `mcpServers` | `$XDG_CONFIG_HOME/codebox/claude-code/user.json` (0600) |
//!
//! Every codebox file has `.mcp.json`'s format (`{"mcpServers": {...}}`). For the same
//! name, Claude Code lets local scope shadow project scope and both shadow user scope, so
//! the local-scope codebox entry serves the project's file and the local one.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::{Error, Result};

/// The name of the codebox entry in Claude Code's `mcpServers`.
pub const ENTRY_NAME: &str = "codebox";

/// Claude Code's scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Project,
    Local,
    User,
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scope::Project => "project scope",
            Scope::Local => "local scope",
            Scope::User => "user scope",
        })
    }
}

/// Every file involved, as absolute paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locations {
    /// The project directory, canonical (Claude Code's key in `projects`).
    pub project_dir: PathBuf,
    /// `DIR/.mcp.json`.
    pub project_mcp: PathBuf,
    /// `DIR/.codebox/mcp.json`.
    pub project_codebox: PathBuf,
    /// `~/.claude.json`.
    pub claude_json: PathBuf,
    /// The user-private file for the project's local-scope servers.
    pub local_codebox: PathBuf,
    /// The user-private file for the user-scope servers.
    pub user_codebox: PathBuf,
}

impl Locations {
    /// `home` is `$HOME`; `config_home` is `$XDG_CONFIG_HOME` (else `home/.config`);
    /// `project_dir` must be absolute and canonical already.
    pub fn new(home: &Path, config_home: Option<&Path>, project_dir: &Path) -> Result<Self> {
        utf8(project_dir)?;
        let config = match config_home {
            Some(c) if c.is_absolute() => c.to_path_buf(),
            _ => home.join(".config"),
        };
        let claude_code = config.join("codebox").join("claude-code");
        let at = Locations {
            project_dir: project_dir.to_path_buf(),
            project_mcp: project_dir.join(".mcp.json"),
            project_codebox: project_dir.join(".codebox").join("mcp.json"),
            claude_json: home.join(".claude.json"),
            local_codebox: claude_code.join("local").join(local_file_name(project_dir)),
            user_codebox: claude_code.join("user.json"),
        };
        for p in [&at.project_codebox, &at.local_codebox, &at.user_codebox] {
            utf8(p)?;
        }
        Ok(at)
    }

    /// The project's key in `~/.claude.json`'s `projects`.
    pub fn project_key(&self) -> String {
        self.project_dir.to_string_lossy().into_owned()
    }
}

/// `<dirname>-<first 12 hex digits of SHA-256 of the absolute path>.json`: readable, and
/// unique per project directory.
pub fn local_file_name(project_dir: &Path) -> String {
    let name: String = project_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let digest = Sha256::digest(project_dir.as_os_str().as_bytes());
    let hash = crate::rootfs::manifest::hex(&digest[..6]);
    format!("{name}-{hash}.json")
}

fn utf8(path: &Path) -> Result<&str> {
    path.to_str().ok_or_else(|| Error::NotUtf8 {
        path: path.to_path_buf(),
    })
}

/// One scope being adopted: where its servers live and where they move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub scope: Scope,
    /// The Claude Code file holding the scope's servers.
    pub claude_file: PathBuf,
    /// The keys from the top of that file to the object holding `mcpServers`.
    pub at: Vec<String>,
    /// The codebox file the servers move to.
    pub codebox_file: PathBuf,
    /// The `--mcp-config` files of the scope's codebox entry.
    pub entry_configs: Vec<PathBuf>,
}

impl Unit {
    /// The scope's servers, for messages: `/p/.mcp.json (project scope)`,
    /// `/h/.claude.json projects["/p"] (local scope)`.
    pub fn place(&self) -> String {
        match self.at.is_empty() {
            true => format!("{} ({})", self.claude_file.display(), self.scope),
            false => format!(
                "{} {} ({})",
                self.claude_file.display(),
                key_path(&self.at),
                self.scope
            ),
        }
    }
}

/// Keys from the top of a file, as a path: `projects["/p"]`.
pub fn key_path(keys: &[String]) -> String {
    keys.iter().enumerate().fold(String::new(), |s, (i, k)| {
        if i == 0 {
            k.clone()
        } else {
            format!("{s}[{k:?}]")
        }
    })
}

/// A project's units (project scope, then local scope), or the user scope's.
pub fn units(at: &Locations, user: bool) -> Vec<Unit> {
    if user {
        return vec![Unit {
            scope: Scope::User,
            claude_file: at.claude_json.clone(),
            at: Vec::new(),
            codebox_file: at.user_codebox.clone(),
            entry_configs: vec![at.user_codebox.clone()],
        }];
    }
    vec![
        Unit {
            scope: Scope::Project,
            claude_file: at.project_mcp.clone(),
            at: Vec::new(),
            codebox_file: at.project_codebox.clone(),
            entry_configs: vec![at.project_codebox.clone()],
        },
        Unit {
            scope: Scope::Local,
            claude_file: at.claude_json.clone(),
            at: vec!["projects".into(), at.project_key()],
            codebox_file: at.local_codebox.clone(),
            entry_configs: vec![at.project_codebox.clone(), at.local_codebox.clone()],
        },
    ]
}

/// What the codebox entry starts: this binary with this rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    pub exe: String,
    pub rootfs: String,
}

impl Launcher {
    pub fn new(exe: &Path, rootfs: &Path) -> Result<Self> {
        Ok(Launcher {
            exe: utf8(exe)?.to_string(),
            rootfs: utf8(rootfs)?.to_string(),
        })
    }
}

/// The options the codebox entry sets; the others of an existing entry are kept.
const OWN_OPTIONS: &[&str] = &["--rootfs", "--mcp-config"];

/// The codebox entry: `{"command": EXE, "args": ["serve", "--rootfs", ROOTFS,
/// "--mcp-config", FILE...]}`. An existing entry keeps its other keys (`env`) and the
/// other options it gives `serve` (`--tools minimal`), after these.
pub fn codebox_entry(launcher: &Launcher, existing: Option<&Value>, configs: &[PathBuf]) -> Value {
    let mut args = vec![
        "serve".to_string(),
        "--rootfs".into(),
        launcher.rootfs.clone(),
    ];
    for c in configs {
        args.push("--mcp-config".into());
        args.push(c.to_string_lossy().into_owned());
    }
    let mut entry = match existing {
        Some(Value::Object(e)) => e.clone(),
        _ => Map::new(),
    };
    let old_args: Vec<&str> = match entry.get("args") {
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if old_args.first() == Some(&"serve") {
        let mut rest = old_args[1..].iter();
        while let Some(arg) = rest.next() {
            if OWN_OPTIONS.contains(arg) {
                rest.next();
            } else if !OWN_OPTIONS
                .iter()
                .any(|o| arg.starts_with(&format!("{o}=")))
            {
                args.push(arg.to_string());
            }
        }
    }
    entry.insert("command".into(), json!(launcher.exe));
    entry.insert("args".into(), json!(args));
    Value::Object(entry)
}

/// Whether an `mcpServers` entry starts codebox itself: a stdio command that is this
/// binary (`is_me`), or any program named `codebox` run as `codebox serve`.
pub fn is_codebox(entry: &Value, is_me: &dyn Fn(&str) -> bool) -> bool {
    let Value::Object(e) = entry else {
        return false;
    };
    if !matches!(e.get("type").and_then(Value::as_str), None | Some("stdio")) {
        return false;
    }
    let Some(command) = e.get("command").and_then(Value::as_str) else {
        return false;
    };
    let first_arg = e
        .get("args")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    is_me(command)
        || (Path::new(command).file_name() == Some("codebox".as_ref())
            && first_arg == Some("serve"))
}

/// An entry as a command line, for messages.
pub fn command_line(entry: &Value) -> String {
    let mut words = vec![entry["command"].as_str().unwrap_or("?").to_string()];
    if let Some(args) = entry["args"].as_array() {
        words.extend(args.iter().map(|a| a.as_str().unwrap_or("?").to_string()));
    }
    words.join(" ")
}

/// Whether `command`, found as execvp would find it, is the running executable.
pub fn runs_this_binary(command: &str) -> bool {
    let me = std::env::current_exe().and_then(std::fs::canonicalize).ok();
    let found = if command.contains('/') {
        Some(PathBuf::from(command))
    } else {
        std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(command))
                .find(|p| p.is_file())
        })
    };
    me.is_some() && found.and_then(|p| std::fs::canonicalize(p).ok()) == me
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launcher() -> Launcher {
        Launcher {
            exe: "/opt/codebox/bin/codebox".into(),
            rootfs: "/opt/codebox/rootfs".into(),
        }
    }

    #[test]
    fn locations_follow_xdg_and_name_the_project() {
        let at = Locations::new(
            Path::new("/home/u"),
            Some(Path::new("/home/u/.xdg")),
            Path::new("/src/my app"),
        )
        .unwrap();
        assert_eq!(at.project_mcp, Path::new("/src/my app/.mcp.json"));
        assert_eq!(
            at.project_codebox,
            Path::new("/src/my app/.codebox/mcp.json")
        );
        assert_eq!(at.claude_json, Path::new("/home/u/.claude.json"));
        assert_eq!(
            at.user_codebox,
            Path::new("/home/u/.xdg/codebox/claude-code/user.json")
        );
        let local = at.local_codebox.to_str().unwrap();
        assert!(
            local.starts_with("/home/u/.xdg/codebox/claude-code/local/my_app-"),
            "{local}"
        );
        assert_eq!(
            local.len(),
            "/home/u/.xdg/codebox/claude-code/local/my_app-".len() + 17
        );
        // A relative XDG_CONFIG_HOME is ignored, as the spec says.
        let at = Locations::new(Path::new("/h"), Some(Path::new("rel")), Path::new("/p")).unwrap();
        assert_eq!(
            at.user_codebox,
            Path::new("/h/.config/codebox/claude-code/user.json")
        );
        assert_ne!(
            local_file_name(Path::new("/a/x")),
            local_file_name(Path::new("/b/x"))
        );
        assert!(local_file_name(Path::new("/")).starts_with("root-"));
    }

    #[test]
    fn units_and_places() {
        let at = Locations::new(Path::new("/h"), None, Path::new("/p")).unwrap();
        let project = units(&at, false);
        assert_eq!(project[0].place(), "/p/.mcp.json (project scope)");
        assert_eq!(
            project[1].place(),
            "/h/.claude.json projects[\"/p\"] (local scope)"
        );
        assert_eq!(
            project[1].entry_configs,
            vec![at.project_codebox.clone(), at.local_codebox.clone()]
        );
        assert_eq!(units(&at, true)[0].place(), "/h/.claude.json (user scope)");
    }

    #[test]
    fn the_entry_is_built_and_an_existing_one_keeps_its_own_options() {
        let configs = [PathBuf::from("/p/.codebox/mcp.json")];
        let fresh = codebox_entry(&launcher(), None, &configs);
        assert_eq!(
            fresh,
            json!({"command": "/opt/codebox/bin/codebox",
                   "args": ["serve", "--rootfs", "/opt/codebox/rootfs",
                            "--mcp-config", "/p/.codebox/mcp.json"]})
        );
        let old = json!({"command": "codebox", "env": {"RUST_LOG": "debug"},
            "args": ["serve", "--tools", "minimal", "--rootfs", "/old", "--mcp-config=/x.json"]});
        assert_eq!(
            codebox_entry(&launcher(), Some(&old), &configs),
            json!({"command": "/opt/codebox/bin/codebox", "env": {"RUST_LOG": "debug"},
                   "args": ["serve", "--rootfs", "/opt/codebox/rootfs",
                            "--mcp-config", "/p/.codebox/mcp.json", "--tools", "minimal"]})
        );
        assert_eq!(codebox_entry(&launcher(), Some(&fresh), &configs), fresh);
        assert_eq!(
            command_line(&fresh),
            "/opt/codebox/bin/codebox serve --rootfs /opt/codebox/rootfs --mcp-config /p/.codebox/mcp.json"
        );
    }

    #[test]
    fn codebox_itself_is_recognised() {
        let me = |c: &str| c == "/usr/local/bin/cb";
        assert!(is_codebox(
            &json!({"command": "/usr/local/bin/cb", "args": []}),
            &me
        ));
        assert!(is_codebox(
            &json!({"command": "codebox", "args": ["serve"]}),
            &me
        ));
        assert!(is_codebox(
            &json!({"type": "stdio", "command": "/old/codebox", "args": ["serve", "--tools", "minimal"]}),
            &me
        ));
        assert!(!is_codebox(
            &json!({"command": "codebox", "args": ["run"]}),
            &me
        ));
        assert!(!is_codebox(
            &json!({"command": "npx", "args": ["codebox"]}),
            &me
        ));
        assert!(!is_codebox(
            &json!({"type": "http", "url": "http://codebox"}),
            &me
        ));
        assert!(!is_codebox(&json!("codebox"), &me));
    }
}
