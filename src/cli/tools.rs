//! `codebox tools tokens`: what the upstream tool definitions would cost a model's context
//! if the client connected to every upstream server itself, against codebox's own
//! `tools/list`, counted with a real tokenizer (see `codebox::tokens`).

use super::out::outln;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use codebox::catalog::synthetic::synthetic_catalog;
use codebox::server::{CodeboxServer, ToolSet};
use codebox::tokens;
use codebox::upstream::{ServerState, UpstreamOptions, Upstreams};

use super::upstreams;
use super::EXIT_CODEBOX_FAILED;

#[derive(Debug, Args)]
pub struct ToolsArgs {
    #[command(subcommand)]
    command: ToolsCommand,
}

#[derive(Debug, Subcommand)]
enum ToolsCommand {
    /// Tokens of every upstream server's tools/list against codebox's own (o200k_base).
    Tokens(TokensArgs),
}

#[derive(Debug, Args)]
pub struct TokensArgs {
    /// Config file naming the .mcp.json, as for `codebox serve` [default: $CODEBOX_CONFIG,
    /// ./codebox.toml, ~/.config/codebox/config.toml; then ./.mcp.json].
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// An MCP server config (`.mcp.json` format) naming the upstream servers, instead of
    /// the config file's `mcp_config`; repeat it to merge several.
    #[arg(long = "mcp-config", value_name = "PATH")]
    mcp_config: Vec<PathBuf>,
    /// Also count a synthetic catalog of N tools (a stand-in for a large deployment).
    #[arg(long, value_name = "N")]
    synthetic: Option<usize>,
    /// Print the figures as one JSON object.
    #[arg(long)]
    json: bool,
}

/// The seed of the synthetic catalog: the same N gives the same tools on every run.
const SYNTHETIC_SEED: u64 = 0;

/// The table's row of codebox's minimal tools/list.
const MINIMAL_ROW: &str = "codebox, tools = \"minimal\"";

const WHAT_IS_COUNTED: &str = "the tools array of each tools/list result as compact JSON; \
upstream tools are rebuilt from name, title, description, inputSchema and outputSchema \
(annotations, icons and _meta are not included, so upstream figures are a lower bound)";

#[derive(Debug, Serialize)]
struct Report {
    tokenizer: &'static str,
    counted: &'static str,
    /// One row per configured server, plus one for the synthetic catalog.
    servers: Vec<Row>,
    total: Figures,
    /// codebox's own tools/list by default (`tools = "full"`).
    codebox: Figures,
    /// codebox's own tools/list with `tools = "minimal"`.
    codebox_minimal: Figures,
    /// Against the default list.
    saving: Saving,
}

#[derive(Debug, Serialize)]
struct Row {
    name: String,
    /// The connection state, or `synthetic`.
    state: String,
    tools: usize,
    tokens: usize,
    /// Why the server is not ready (its tools are then not counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Figures {
    tools: usize,
    tokens: usize,
}

#[derive(Debug, Serialize)]
struct Saving {
    /// Total minus codebox's own (negative when codebox costs more).
    tokens: i64,
    /// The saving as a share of the total, in percent.
    percent: Option<f64>,
    /// Total divided by codebox's own.
    ratio: Option<f64>,
}

pub fn run(args: ToolsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ToolsCommand::Tokens(args) => tokens_command(args),
    }
}

fn tokens_command(args: TokensArgs) -> anyhow::Result<ExitCode> {
    let servers = upstreams::configured(args.config.as_deref(), &args.mcp_config)?;
    // About one server per 20 tools (see `codebox::catalog::synthetic`).
    let synthetic = args.synthetic.map(|n| synthetic_catalog(n, SYNTHETIC_SEED));
    let mut rows = upstream_rows(servers)?;
    let unready = rows.iter().filter(|r| r.error.is_some()).count();
    if let Some(catalog) = synthetic {
        rows.push(Row {
            name: "synthetic".into(),
            state: "synthetic".into(),
            tools: catalog.tools.len(),
            tokens: tokens::catalog_tokens(&catalog),
            error: None,
        });
    }
    let report = report(rows);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        print_table(&report)?;
    }
    if unready > 0 {
        eprintln!(
            "codebox: {unready} upstream server(s) did not connect; their tools are not counted"
        );
        return Ok(ExitCode::from(EXIT_CODEBOX_FAILED));
    }
    Ok(ExitCode::SUCCESS)
}

/// Connects to every server, counts each one's tools and disconnects.
fn upstream_rows(servers: Vec<codebox::upstream::ServerConfig>) -> anyhow::Result<Vec<Row>> {
    if servers.is_empty() {
        return Ok(Vec::new());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (catalog, statuses) = rt.block_on(async {
        let upstreams = Upstreams::connect(servers, UpstreamOptions::default()).await;
        let seen = (upstreams.catalog(), upstreams.servers());
        upstreams.shutdown().await;
        seen
    });
    let counted = tokens::per_server(&catalog);
    Ok(statuses
        .into_iter()
        .map(|s| {
            let (tools, tokens) = counted
                .iter()
                .find(|c| c.server == s.name)
                .map_or((0, 0), |c| (c.tools, c.tokens));
            let error = (s.state != ServerState::Ready)
                .then(|| s.last_error.unwrap_or_else(|| s.state.to_string()));
            Row {
                name: s.name,
                state: s.state.to_string(),
                tools,
                tokens,
                error,
            }
        })
        .collect())
}

/// codebox's own tools/list under the `tools` setting `set`.
fn own_figures(set: ToolSet) -> Figures {
    let own: Vec<serde_json::Value> = CodeboxServer::tool_definitions_for(set)
        .iter()
        .map(|t| serde_json::to_value(t).expect("a tool definition serialises"))
        .collect();
    Figures {
        tools: own.len(),
        tokens: tokens::tools_list_tokens(&own),
    }
}

fn report(servers: Vec<Row>) -> Report {
    let codebox = own_figures(ToolSet::Full);
    let codebox_minimal = own_figures(ToolSet::Minimal);
    let total = Figures {
        tools: servers.iter().map(|r| r.tools).sum(),
        tokens: servers.iter().map(|r| r.tokens).sum(),
    };
    let saving = Saving {
        tokens: total.tokens as i64 - codebox.tokens as i64,
        percent: (total.tokens > 0)
            .then(|| 100.0 * (total.tokens as f64 - codebox.tokens as f64) / total.tokens as f64),
        ratio: (codebox.tokens > 0).then(|| total.tokens as f64 / codebox.tokens as f64),
    };
    Report {
        tokenizer: "o200k_base",
        counted: WHAT_IS_COUNTED,
        servers,
        total,
        codebox,
        codebox_minimal,
        saving,
    }
}

fn print_table(r: &Report) -> anyhow::Result<()> {
    let width = r
        .servers
        .iter()
        .map(|s| s.name.len())
        .chain([MINIMAL_ROW.len()])
        .max()
        .unwrap_or(0);
    outln!("Tokens of tools/list ({}): {}\n", r.tokenizer, r.counted)?;
    outln!(
        "  {:width$}  {:>12}  {:>6}  {:>8}",
        "server",
        "state",
        "tools",
        "tokens"
    )?;
    for s in &r.servers {
        outln!(
            "  {:width$}  {:>12}  {:>6}  {:>8}",
            s.name,
            s.state,
            s.tools,
            s.tokens
        )?;
        if let Some(e) = &s.error {
            outln!("  {:width$}  {e}", "")?;
        }
    }
    if r.servers.is_empty() {
        outln!("  (no upstream servers are configured)")?;
    }
    let line = |name: &str, f: &Figures| {
        outln!(
            "  {name:width$}  {:>12}  {:>6}  {:>8}",
            "",
            f.tools,
            f.tokens
        )
    };
    line("total", &r.total)?;
    line("codebox (own tools/list)", &r.codebox)?;
    line(MINIMAL_ROW, &r.codebox_minimal)?;
    let mut saving = format!("\nsaving: {} tokens", r.saving.tokens);
    if let Some(p) = r.saving.percent {
        saving.push_str(&format!(" ({p:.1}% of the total"));
        if let Some(x) = r.saving.ratio {
            saving.push_str(&format!("; codebox's list is {x:.1}× smaller"));
        }
        saving.push(')');
    }
    outln!("{saving}")
}
