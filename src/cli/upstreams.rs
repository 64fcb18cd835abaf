//! The upstream servers of a `.mcp.json` as the commands use them: `serve` connects to
//! them, `tools tokens` measures them.

use std::path::{Path, PathBuf};

use codebox::config::{self, Config};
use codebox::upstream::{self, ServerConfig, TransportConfig};

/// The servers `codebox serve --config CONFIG [--mcp-config PATH]...` would connect to:
/// `--mcp-config` files when given, else the config file's `mcp_config` (after
/// `CODEBOX_*` overrides), else `./.mcp.json`, which may then be missing (no servers);
/// entries that start codebox are skipped.
pub(crate) fn configured(
    config: Option<&Path>,
    mcp_configs: &[PathBuf],
) -> anyhow::Result<Vec<ServerConfig>> {
    let env = &config::process_env;
    let (mut file, _) = Config::load(config, env)?;
    file.apply_env(env)?;
    load(&McpConfigs::choose(mcp_configs, file.mcp_config))
}

/// Which `.mcp.json` files name the upstream servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct McpConfigs {
    pub paths: Vec<PathBuf>,
    /// Named by a flag or the config: each must exist. Otherwise the default
    /// `./.mcp.json`, which may be missing.
    pub named: bool,
}

impl McpConfigs {
    /// Flags win over the config file's `mcp_config`; neither: `./.mcp.json`.
    pub fn choose(flags: &[PathBuf], from_config: Option<PathBuf>) -> McpConfigs {
        match (flags, from_config) {
            ([], Some(p)) => McpConfigs {
                paths: vec![p],
                named: true,
            },
            ([], None) => McpConfigs {
                paths: vec![PathBuf::from(".mcp.json")],
                named: false,
            },
            (flags, _) => McpConfigs {
                paths: flags.to_vec(),
                named: true,
            },
        }
    }
}

/// Reads every file; a named one that is missing is an error naming it, the default one
/// missing is a notice naming where codebox looked. A server name in two files is an
/// error naming both.
pub(crate) fn load(configs: &McpConfigs) -> anyhow::Result<Vec<ServerConfig>> {
    let env = &config::process_env;
    let mut servers: Vec<(ServerConfig, &Path)> = Vec::new();
    for path in &configs.paths {
        if !configs.named && !path.exists() {
            let looked = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            tracing::warn!(
                looked = %looked.display(),
                "no MCP server config here: no upstream servers (name one with --mcp-config or mcp_config)"
            );
            continue;
        }
        for server in upstream::config::load(path, false, env)? {
            if let Some((_, first)) = servers.iter().find(|(s, _)| s.name == server.name) {
                anyhow::bail!(
                    "MCP server {:?} is named in both {} and {}: rename one of them",
                    server.name,
                    first.display(),
                    path.display()
                );
            }
            servers.push((server, path));
        }
    }
    Ok(without_self(servers.into_iter().map(|(s, _)| s).collect()))
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
