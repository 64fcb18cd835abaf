//! The upstream servers of a `.mcp.json` as the commands use them: `serve` connects to
//! them, `tools tokens` measures them.

use std::path::{Path, PathBuf};

use codebox::config::{self, Config};
use codebox::upstream::{self, ServerConfig, TransportConfig};

/// The servers of the `.mcp.json` that `codebox serve --config CONFIG` would connect to:
/// the config file's `mcp_config` (after `CODEBOX_*` overrides), else `./.mcp.json`,
/// which may then be missing (no servers); entries that start codebox are skipped.
pub(crate) fn configured(config: Option<&Path>) -> anyhow::Result<Vec<ServerConfig>> {
    let env = &config::process_env;
    let (mut file, _) = Config::load(config, env)?;
    file.apply_env(env)?;
    let (path, named) = match file.mcp_config {
        Some(p) => (p, true),
        None => (PathBuf::from(".mcp.json"), false),
    };
    Ok(without_self(upstream::config::load(&path, !named, env)?))
}

/// The upstream servers, minus any entry that would start codebox itself (a `.mcp.json`
/// shared with the client usually lists codebox): it would recurse.
pub(crate) fn without_self(servers: Vec<ServerConfig>) -> Vec<ServerConfig> {
    let me = std::env::current_exe().and_then(std::fs::canonicalize).ok();
    servers
        .into_iter()
        .filter(|s| {
            let TransportConfig::Stdio { command, .. } = &s.transport else {
                return true;
            };
            let resolved = which(command).and_then(|p| std::fs::canonicalize(p).ok());
            let is_me = me.is_some() && resolved == me;
            if is_me {
                tracing::warn!(server = %s.name, "skipping an upstream that is codebox itself");
            }
            !is_me
        })
        .collect()
}

/// `command` as execvp would find it.
fn which(command: &str) -> Option<PathBuf> {
    if command.contains('/') {
        return Some(PathBuf::from(command));
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(command))
        .find(|p| p.is_file())
}
