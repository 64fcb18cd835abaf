//! Upstream servers from a `.mcp.json` in Claude Code's format, read unchanged:
//!
//! ```json
//! {"mcpServers": {
//!   "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}"],
//!             "env": {"LOG": "${LOG_LEVEL:-info}"}},
//!   "api":   {"type": "http", "url": "https://${API_HOST}/mcp",
//!             "headers": {"Authorization": "Bearer ${API_TOKEN}"}}
//! }}
//! ```
//!
//! Without `type` (or with `"type": "stdio"`) a server is a command speaking MCP on its
//! stdin/stdout; `"type": "http"` is streamable HTTP. `${VAR}` and `${VAR:-default}` are
//! expanded, as Claude Code does, in `command`, `args`, `env` values, `url` and header
//! values: a variable that is set (even to the empty string) gives its value, an unset one
//! its default.
//!
//! An entry codebox cannot start — another type (the legacy `sse`, `ws`, ...), no command,
//! an unset variable without a default, a value of the wrong kind — is kept as
//! [`TransportConfig::Unusable`] with the reason (naming the file, never a value) and a
//! warning in the log: it is listed as failed wherever servers are listed, never tried,
//! and the rest of the file is used. A file that is not JSON (line and column), or whose
//! top level or `mcpServers` is not an object, is an error.
//! Keys Claude Code knows but codebox does not use (`cwd`, `oauth`, ...) are ignored with a
//! warning in the log. A file without `mcpServers` has no servers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read MCP server config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("MCP server config {path}: invalid JSON at line {line}, column {column}")]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        #[source]
        source: serde_json::Error,
    },
    #[error("MCP server config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("MCP server config {path}: server {server:?}: {message}")]
    Server {
        path: PathBuf,
        server: String,
        message: String,
    },
    #[error(
        "MCP server config {path}: server {server:?}: environment variable {var} (in {field}) is not set and has no default"
    )]
    MissingVar {
        path: PathBuf,
        server: String,
        field: String,
        var: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// One upstream server, with every `${...}` expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The key in `mcpServers`.
    pub name: String,
    pub transport: TransportConfig,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportConfig {
    /// A child process speaking MCP on stdin/stdout; `env` goes on top of codebox's own
    /// environment.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
    /// An entry codebox cannot start (a transport it does not speak, a missing command,
    /// an unset variable): listed as failed with `reason`, never tried.
    Unusable { reason: String },
}

impl TransportConfig {
    /// `stdio` or `http`, for logs and status.
    pub fn kind(&self) -> &'static str {
        match self {
            TransportConfig::Stdio { .. } => "stdio",
            TransportConfig::Http { .. } => "http",
            TransportConfig::Unusable { .. } => "none",
        }
    }
}

/// Reads `path`. A missing file is no servers when `missing_ok`, an error otherwise.
pub fn load(
    path: &Path,
    missing_ok: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ServerConfig>> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, path, env),
        Err(e) if missing_ok && e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(Error::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses the text of a `.mcp.json`; `path` names it in errors. Servers come back sorted
/// by name.
pub fn parse(
    text: &str,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ServerConfig>> {
    let root: Value = serde_json::from_str(text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        line: source.line(),
        column: source.column(),
        source,
    })?;
    let Value::Object(root) = root else {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            message: "the top level is not a JSON object".into(),
        });
    };
    let servers = match root.get("mcpServers") {
        None => return Ok(Vec::new()),
        Some(Value::Object(servers)) => servers,
        Some(_) => {
            return Err(Error::Invalid {
                path: path.to_path_buf(),
                message: "mcpServers is not an object".into(),
            })
        }
    };
    Ok(servers
        .iter()
        .map(|(name, entry)| {
            let read = Entry {
                path,
                server: name,
                env,
            }
            .server(entry);
            read.unwrap_or_else(|e| {
                // One entry codebox cannot use does not take the others down: it is
                // listed as failed, with this reason, wherever servers are listed.
                let reason = entry_error(&e);
                tracing::warn!(path = %path.display(), server = %name, reason, "skipping an MCP server entry codebox cannot start");
                ServerConfig {
                    name: name.clone(),
                    transport: TransportConfig::Unusable { reason },
                }
            })
        })
        .collect())
}

/// An entry's error without the file and server (they are said where it is shown).
fn entry_error(e: &Error) -> String {
    match e {
        Error::Server { path, message, .. } => {
            format!("its entry in {} is not usable: {message}", path.display())
        }
        Error::MissingVar {
            path, field, var, ..
        } => format!(
            "its entry in {} is not usable: environment variable {var} (in {field}) is not set and has no default",
            path.display()
        ),
        other => other.to_string(),
    }
}

/// One entry of `mcpServers` being read.
struct Entry<'a> {
    path: &'a Path,
    server: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
}

const STDIO_KEYS: &[&str] = &["type", "command", "args", "env"];
const HTTP_KEYS: &[&str] = &["type", "url", "headers"];

impl Entry<'_> {
    fn server(&self, entry: &Value) -> Result<ServerConfig> {
        let Value::Object(entry) = entry else {
            return Err(self.invalid("not a JSON object"));
        };
        let kind = match entry.get("type") {
            None => "stdio",
            Some(Value::String(t)) => t.as_str(),
            Some(_) => return Err(self.invalid("type is not a string")),
        };
        let transport = match kind {
            "stdio" => {
                self.ignore_unknown(entry, STDIO_KEYS);
                let command = match entry.get("command") {
                    Some(Value::String(c)) if !c.is_empty() => self.expand("command", c)?,
                    Some(Value::String(_)) => return Err(self.invalid("command is empty")),
                    Some(_) => return Err(self.invalid("command is not a string")),
                    None if entry.contains_key("url") => {
                        return Err(self.invalid(
                            "no command (a URL needs \"type\": \"http\" for streamable HTTP)",
                        ))
                    }
                    None => return Err(self.invalid("no command")),
                };
                let args = self
                    .strings(entry, "args")?
                    .iter()
                    .enumerate()
                    .map(|(i, a)| self.expand(&format!("args[{i}]"), a))
                    .collect::<Result<_>>()?;
                let env = self.string_map(entry, "env")?;
                TransportConfig::Stdio { command, args, env }
            }
            "http" => {
                self.ignore_unknown(entry, HTTP_KEYS);
                let (written, url) = match entry.get("url") {
                    Some(Value::String(u)) => (u, self.expand("url", u)?),
                    Some(_) => return Err(self.invalid("url is not a string")),
                    None => return Err(self.invalid("no url")),
                };
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(self.invalid(&not_http(written, &url)));
                }
                let headers = self.string_map(entry, "headers")?;
                TransportConfig::Http { url, headers }
            }
            "sse" => {
                return Err(self.invalid(
                    "transport type \"sse\" (the legacy HTTP+SSE transport) is not supported: \
                     codebox speaks \"stdio\" and \"http\" (streamable HTTP, which most SSE \
                     servers also serve, often at /mcp)",
                ))
            }
            other => {
                return Err(self.invalid(&format!(
                "transport type {other:?} is not supported (codebox speaks \"stdio\" and \"http\")"
            )))
            }
        };
        Ok(ServerConfig {
            name: self.server.to_string(),
            transport,
        })
    }

    fn invalid(&self, message: &str) -> Error {
        Error::Server {
            path: self.path.to_path_buf(),
            server: self.server.to_string(),
            message: message.to_string(),
        }
    }

    fn ignore_unknown(&self, entry: &Map<String, Value>, known: &[&str]) {
        for key in entry.keys().filter(|k| !known.contains(&k.as_str())) {
            tracing::warn!(
                path = %self.path.display(),
                server = self.server,
                key,
                "ignoring a key codebox does not use in the MCP server config"
            );
        }
    }

    /// An optional array of strings.
    fn strings(&self, entry: &Map<String, Value>, key: &str) -> Result<Vec<String>> {
        match entry.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(self.invalid(&format!("{key} must hold only strings"))),
                })
                .collect(),
            Some(_) => Err(self.invalid(&format!("{key} is not an array of strings"))),
        }
    }

    /// An optional object of strings, values expanded.
    fn string_map(
        &self,
        entry: &Map<String, Value>,
        key: &str,
    ) -> Result<BTreeMap<String, String>> {
        match entry.get(key) {
            None => Ok(BTreeMap::new()),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), self.expand(&format!("{key}.{k}"), s)?)),
                    _ => Err(self.invalid(&format!("{key}.{k} is not a string"))),
                })
                .collect(),
            Some(_) => Err(self.invalid(&format!("{key} is not an object of strings"))),
        }
    }

    fn expand(&self, field: &str, text: &str) -> Result<String> {
        expand_vars(text, self.env).map_err(|var| Error::MissingVar {
            path: self.path.to_path_buf(),
            server: self.server.to_string(),
            field: field.to_string(),
            var,
        })
    }
}

/// Why a URL is not usable, without the URL itself: it may hold a secret (a key in its
/// query, a password), from a variable or written in the file, and the reason is shown
/// to the model and to sandboxed code. Only a scheme made of scheme characters is named.
fn not_http(written: &str, url: &str) -> String {
    let scheme = url.split_once("://").map(|(s, _)| s).filter(|s| {
        !s.is_empty()
            && s.len() <= 16
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    });
    let expanded = if written.contains("${") {
        " (after expanding variables)"
    } else {
        ""
    };
    match scheme {
        Some(scheme) => format!(
            "url is {scheme}://…{expanded}: codebox speaks http:// and https:// only"
        ),
        None => format!(
            "url does not start with http:// or https://{expanded} (it is not shown: it may hold a secret)"
        ),
    }
}

/// Expands `${VAR}` and `${VAR:-default}` as Claude Code does: the value when the variable
/// is set (even empty), else the default; `Err(VAR)` when it is unset without a default.
/// `$VAR` without braces and an unterminated `${` stay as written; defaults are literal.
pub fn expand_vars(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start + 2..].find('}') else {
            break;
        };
        let inner = &rest[start + 2..start + 2 + len];
        if inner.is_empty() {
            // `${}` is not a reference (Claude Code's pattern needs a name): keep it.
            out.push_str(&rest[..start + 3]);
            rest = &rest[start + 3..];
            continue;
        }
        out.push_str(&rest[..start]);
        let (var, default) = match inner.split_once(":-") {
            Some((var, default)) => (var, Some(default)),
            None => (inner, None),
        };
        match (env(var), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => return Err(var.to_string()),
        }
        rest = &rest[start + 2 + len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env_of;

    fn parse_with(text: &str, pairs: &[(&str, &str)]) -> Result<Vec<ServerConfig>> {
        parse(text, Path::new("/p/.mcp.json"), &env_of(pairs))
    }

    #[test]
    fn stdio_and_http_servers() {
        let servers = parse_with(
            r#"{"mcpServers": {
                "fs": {"command": "npx", "args": ["-y", "pkg", "${HOME}/x"], "env": {"A": "1"}},
                "typed": {"type": "stdio", "command": "srv"},
                "api": {"type": "http", "url": "https://h/mcp", "headers": {"X-Key": "k"}}
            }}"#,
            &[("HOME", "/home/u")],
        )
        .unwrap();
        let by_name: BTreeMap<_, _> = servers.iter().map(|s| (s.name.as_str(), s)).collect();
        assert_eq!(
            by_name["fs"].transport,
            TransportConfig::Stdio {
                command: "npx".into(),
                args: vec!["-y".into(), "pkg".into(), "/home/u/x".into()],
                env: [("A".to_string(), "1".to_string())].into(),
            }
        );
        assert_eq!(by_name["typed"].transport.kind(), "stdio");
        assert_eq!(
            by_name["api"].transport,
            TransportConfig::Http {
                url: "https://h/mcp".into(),
                headers: [("X-Key".to_string(), "k".to_string())].into(),
            }
        );
    }

    #[test]
    fn expansion_everywhere_with_defaults() {
        let servers = parse_with(
            r#"{"mcpServers": {
                "s": {"command": "${BIN:-/usr/bin/srv}", "args": ["--port=${PORT:-8}"],
                      "env": {"TOKEN": "${TOKEN}", "EMPTY": "${EMPTY:-unused}"}},
                "h": {"type": "http", "url": "http://${HOST}:${P:-80}/mcp",
                      "headers": {"Authorization": "Bearer ${TOKEN}"}}
            }}"#,
            &[("TOKEN", "t0k"), ("EMPTY", ""), ("HOST", "example")],
        )
        .unwrap();
        let TransportConfig::Http { url, headers } = &servers[0].transport else {
            panic!("{servers:?}");
        };
        assert_eq!(url, "http://example:80/mcp");
        assert_eq!(headers["Authorization"], "Bearer t0k");
        let TransportConfig::Stdio { command, args, env } = &servers[1].transport else {
            panic!("{servers:?}");
        };
        assert_eq!(command, "/usr/bin/srv");
        assert_eq!(args, &["--port=8"]);
        assert_eq!(env["TOKEN"], "t0k");
        // Set but empty is a value, as in Claude Code.
        assert_eq!(env["EMPTY"], "");
    }

    #[test]
    fn expansion_edge_cases() {
        let env = env_of(&[("A", "x")]);
        assert_eq!(expand_vars("$A ${A}${A}", &env).unwrap(), "$A xx");
        assert_eq!(expand_vars("${A", &env).unwrap(), "${A");
        assert_eq!(expand_vars("${B:-a:-b}", &env).unwrap(), "a:-b");
        assert_eq!(expand_vars("${B:-}", &env).unwrap(), "");
        assert_eq!(expand_vars("${B:-${A}", &env).unwrap(), "${A");
        assert_eq!(expand_vars("${}${A}", &env).unwrap(), "${}x");
        assert_eq!(expand_vars("${B}", &env).unwrap_err(), "B");
    }

    /// The one server of `text`, which must be kept as unusable: its name and reason.
    fn unusable(text: &str) -> (String, String) {
        let servers = parse_with(text, &[]).unwrap();
        assert_eq!(servers.len(), 1, "{text}");
        match &servers[0].transport {
            TransportConfig::Unusable { reason } => (servers[0].name.clone(), reason.clone()),
            other => panic!("{text}: usable: {other:?}"),
        }
    }

    #[test]
    fn a_missing_variable_makes_the_entry_unusable_naming_the_variable() {
        for text in [
            r#"{"mcpServers": {"srv": {"command": "x", "env": {"K": "${NOPE}"}}}}"#,
            r#"{"mcpServers": {"srv": {"command": "x", "args": ["${NOPE}"]}}}"#,
            r#"{"mcpServers": {"srv": {"command": "${NOPE}"}}}"#,
            r#"{"mcpServers": {"srv": {"type": "http", "url": "http://${NOPE}/"}}}"#,
            r#"{"mcpServers": {"srv": {"type": "http", "url": "http://h/", "headers": {"H": "${NOPE}"}}}}"#,
        ] {
            let (name, reason) = unusable(text);
            assert_eq!(name, "srv");
            assert!(
                reason.contains("NOPE") && reason.contains(".mcp.json"),
                "{reason}"
            );
        }
    }

    #[test]
    fn an_unsupported_type_is_unusable_and_the_rest_is_kept() {
        let servers = parse_with(
            r#"{"mcpServers": {"old": {"type": "sse", "url": "http://h/sse"},
                               "ok": {"command": "x"},
                               "ws": {"type": "ws", "url": "ws://h"}}}"#,
            &[],
        )
        .unwrap();
        let kinds: Vec<(&str, &str)> = servers
            .iter()
            .map(|s| (s.name.as_str(), s.transport.kind()))
            .collect();
        assert_eq!(kinds, [("ok", "stdio"), ("old", "none"), ("ws", "none")]);
        let (_, reason) =
            unusable(r#"{"mcpServers": {"old": {"type": "sse", "url": "http://h/sse"}}}"#);
        assert!(
            reason.contains("\"sse\"") && reason.contains("streamable HTTP"),
            "{reason}"
        );
    }

    #[test]
    fn malformed_entries_are_unusable_and_malformed_files_are_errors() {
        for (text, want) in [
            (r#"{"mcpServers": {"a": {"args": []}}}"#, "no command"),
            (r#"{"mcpServers": {"a": {"url": "http://h/"}}}"#, "type"),
            (r#"{"mcpServers": {"a": {"command": 1}}}"#, "command"),
            (
                r#"{"mcpServers": {"a": {"command": "x", "args": [1]}}}"#,
                "args",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}"#,
                "env.K",
            ),
            (r#"{"mcpServers": {"a": {"type": "http"}}}"#, "no url"),
            (
                r#"{"mcpServers": {"a": {"type": "http", "url": "ftp://h"}}}"#,
                "ftp",
            ),
            (r#"{"mcpServers": {"a": 3}}"#, "not a JSON object"),
        ] {
            let (name, reason) = unusable(text);
            assert_eq!(name, "a");
            assert!(reason.contains(want), "{text}: {reason}");
        }
        for (text, want) in [
            (r#"{"mcpServers": []}"#, "mcpServers"),
            (r#"[]"#, "top level"),
        ] {
            let e = parse_with(text, &[]).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// The reason of an unusable entry reaches the model and sandboxed code
    /// (`list_servers`, `health`, a call's error): it never holds a variable's value.
    #[test]
    fn an_unusable_url_does_not_show_expanded_values() {
        for url in [
            "${SERVICE_URL}",
            "${SERVICE_URL:-x}",
            "ws://${HOST}/mcp?key=${KEY}",
        ] {
            let text =
                format!(r#"{{"mcpServers": {{"api": {{"type": "http", "url": "{url}"}}}}}}"#);
            let env = [
                ("SERVICE_URL", "api.example/mcp?key=s3cr3t"),
                ("HOST", "h"),
                ("KEY", "s3cr3t"),
            ];
            let servers = parse_with(&text, &env).unwrap();
            let TransportConfig::Unusable { reason } = &servers[0].transport else {
                panic!("{servers:?}");
            };
            assert!(!reason.contains("s3cr3t"), "{reason}");
            assert!(reason.contains("http://"), "{reason}");
        }
    }

    #[test]
    fn bad_json_gives_path_and_line() {
        let e = parse_with("{\n  \"mcpServers\": {\n    \"a\": {,}\n  }\n}\n", &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("/p/.mcp.json") && e.contains("line 3"), "{e}");
    }

    #[test]
    fn empty_and_missing_files() {
        assert!(parse_with("{}", &[]).unwrap().is_empty());
        assert!(parse_with(r#"{"mcpServers": {}}"#, &[]).unwrap().is_empty());
        let env = env_of(&[]);
        let missing = Path::new("/nonexistent/.mcp.json");
        assert!(load(missing, true, &env).unwrap().is_empty());
        let e = load(missing, false, &env).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/.mcp.json"), "{e}");
    }

    #[test]
    fn unused_claude_code_keys_are_ignored() {
        let servers = parse_with(
            r#"{"mcpServers": {"a": {"command": "x", "cwd": "/tmp"}}, "other": 1}"#,
            &[],
        )
        .unwrap();
        assert_eq!(servers.len(), 1);
    }
}
