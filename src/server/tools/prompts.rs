//! codebox's MCP prompts: text a user picks in their client to start a conversation
//! with what the model needs to know. Prompts are not tools: they cost no context until
//! chosen, and `codebox tools tokens` does not count them.
//!
//! - `use_upstream_servers` (arguments `server`, `language`, both optional): the
//!   upstream MCP servers this codebox was configured with — each one's state and tool
//!   count, its Python module and TypeScript directory — and how code imports and calls
//!   their `/servers` wrappers; with `server`, that server's tools by the names code
//!   calls them and an example call. Built from the catalog when asked for, so it says
//!   what is true now.
//!
//! The list is the same for every client and does not change while the server runs:
//! `prompts/list` carries a public caching hint (2026-07-28, SEP-2549).

use rmcp::model::{
    CacheScope, GetPromptResult, ListPromptsResult, Prompt, PromptArgument, PromptMessage, Role,
};

use crate::upstream::catalog::Catalog;

/// The prompt explaining the upstream servers.
pub const UPSTREAM_SERVERS: &str = "use_upstream_servers";

/// How long a client may keep `prompts/list` (the list is fixed for the process).
pub const LIST_TTL_MS: u64 = 60 * 60 * 1000;

/// Tools of one server listed by name before the rest is left to `search_tools`.
const MAX_TOOLS_LISTED: usize = 40;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("no prompt named {name:?}; prompts/list names them")]
    NoSuchPrompt { name: String },
    #[error("no upstream server named {name:?}; configured: {known}")]
    NoSuchServer { name: String, known: String },
    #[error("language must be \"python\" or \"typescript\", not {value:?}")]
    BadLanguage { value: String },
}

impl From<Error> for rmcp::ErrorData {
    fn from(e: Error) -> Self {
        rmcp::ErrorData::invalid_params(e.to_string(), None)
    }
}

/// One configured upstream server as the prompt describes it.
#[derive(Debug, Clone)]
pub struct ServerLine {
    pub name: String,
    /// `ready`, `connecting`, `failed`, ...
    pub state: String,
    pub tool_count: usize,
    /// Why it is not ready, when it is not.
    pub note: Option<String>,
}

/// Which languages the text shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Languages {
    Python,
    TypeScript,
    Both,
}

/// `prompts/list`.
pub fn list() -> ListPromptsResult {
    let prompt = Prompt::new(
        UPSTREAM_SERVERS,
        Some(
            "How to call your configured MCP servers from execute_python / \
             execute_typescript code: each server, its tool count, and the import lines.",
        ),
        Some(vec![
            PromptArgument::new("server")
                .with_description("One upstream server to show in full (its tools and an example)")
                .with_required(false),
            PromptArgument::new("language")
                .with_description("\"python\" or \"typescript\" (default: both)")
                .with_required(false),
        ]),
    )
    .with_title("Use your MCP servers from code");
    ListPromptsResult::with_all_items(vec![prompt])
        .with_ttl_ms(LIST_TTL_MS)
        .with_cache_scope(CacheScope::Public)
}

/// `prompts/get` of `name` with `arguments`, against the current catalog and servers.
pub fn get(
    name: &str,
    arguments: Option<&serde_json::Map<String, serde_json::Value>>,
    servers: &[ServerLine],
    catalog: &Catalog,
) -> Result<GetPromptResult, Error> {
    if name != UPSTREAM_SERVERS {
        return Err(Error::NoSuchPrompt {
            name: crate::server::transport::framing::bounded(name).into_owned(),
        });
    }
    let argument = |key: &str| {
        arguments
            .and_then(|a| a.get(key))
            .and_then(|v| v.as_str())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let languages = match argument("language").map(str::to_ascii_lowercase).as_deref() {
        None => Languages::Both,
        Some("python" | "py") => Languages::Python,
        Some("typescript" | "ts") => Languages::TypeScript,
        Some(other) => {
            return Err(Error::BadLanguage {
                value: crate::server::transport::framing::bounded(other).into_owned(),
            })
        }
    };
    let focus = match argument("server") {
        None => None,
        Some(name) => match servers.iter().find(|s| s.name == name) {
            Some(s) => Some(s),
            None => {
                return Err(Error::NoSuchServer {
                    name: crate::server::transport::framing::bounded(name).into_owned(),
                    known: known_names(servers),
                })
            }
        },
    };
    let text = guide(servers, catalog, languages, focus);
    Ok(
        GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
            .with_description("codebox and the upstream MCP servers it was configured with"),
    )
}

/// Argument values starting with `prefix` (`completion/complete`): server names, or the
/// two languages.
pub fn complete(argument: &str, prefix: &str, servers: &[ServerLine]) -> Vec<String> {
    let candidates: Vec<String> = match argument {
        "server" => servers.iter().map(|s| s.name.clone()).collect(),
        "language" => vec!["python".into(), "typescript".into()],
        _ => Vec::new(),
    };
    candidates
        .into_iter()
        .filter(|c| c.starts_with(prefix))
        .take(100)
        .collect()
}

fn known_names(servers: &[ServerLine]) -> String {
    if servers.is_empty() {
        return "none".into();
    }
    servers
        .iter()
        .map(|s| s.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Python module and TypeScript directory of server `name` (its ident when its tools
/// are not known: the tree names such a server's module that way too).
fn where_is(catalog: &Catalog, names: &NamesByTool, name: &str) -> (String, String) {
    let ident = catalog
        .servers
        .iter()
        .find(|s| s.name == name)
        .map_or_else(|| name.to_string(), |s| s.ident.clone());
    catalog
        .tools
        .iter()
        .filter(|t| t.server == name)
        .find_map(|t| names.get(&t.name))
        .map_or_else(
            || (ident.clone(), ident.clone()),
            |n| (n.py_module.clone(), n.ts_dir.clone()),
        )
}

type NamesByTool = std::collections::HashMap<String, crate::codegen::ToolNames>;

fn guide(
    servers: &[ServerLine],
    catalog: &Catalog,
    languages: Languages,
    focus: Option<&ServerLine>,
) -> String {
    use std::fmt::Write;
    let names = crate::codegen::tool_names(catalog);
    let python = languages != Languages::TypeScript;
    let typescript = languages != Languages::Python;
    let mut t = String::new();
    t.push_str(
        "You can run programs with codebox: execute_python (Python 3.11) and \
         execute_typescript (Deno 2), each in a fresh sandbox. Inside, every MCP server \
         configured for codebox is a module under /servers whose functions call that \
         server's tools. Call tools from code rather than one by one: filter, join and \
         summarize their results in the program and print only what matters — only \
         stdout/stderr come back to the conversation.\n\n",
    );
    if servers.is_empty() {
        t.push_str(
            "No upstream MCP servers are configured (codebox reads them from .mcp.json or \
             --mcp-config), so /servers is empty; the sandboxes still run code.\n",
        );
        return t;
    }
    let _ = writeln!(t, "Upstream servers ({}):", servers.len());
    for s in servers {
        let (module, dir) = where_is(catalog, &names, &s.name);
        let _ = write!(t, "- {} ({}): {} tools", s.name, s.state, s.tool_count);
        if python {
            let _ = write!(t, "; Python `servers.{module}`");
        }
        if typescript {
            let _ = write!(t, "; TypeScript \"/servers/{dir}/index.ts\"");
        }
        if let Some(note) = &s.note {
            let _ = write!(t, " — {note}");
        }
        t.push('\n');
    }
    t.push('\n');
    if python {
        t.push_str(
            "Python: functions take the required arguments by position or name, optional \
             ones by name, and return the tool's result (its structured value, parsed JSON or \
             text; `.text` has the text it came with):\n\
             \x20   from servers.<module> import <function>\n\
             \x20   rows = <function>(required, option=...)\n",
        );
    }
    if typescript {
        t.push_str(
            "TypeScript: functions take one object and return a Promise:\n\
             \x20   import { <function> } from \"/servers/<directory>/index.ts\";\n\
             \x20   const rows = await <function>({ arg: ... });\n",
        );
    }
    t.push_str(
        "\nFind tools with search_tools (a query; `server` narrows it) and a tool's full \
         signature with get_tool; list_servers says which servers are ready.\n",
    );
    if let Some(server) = focus {
        let tools: Vec<_> = catalog
            .tools
            .iter()
            .filter(|tool| tool.server == server.name)
            .collect();
        let _ = writeln!(t, "\nTools of {} ({}):", server.name, tools.len());
        for tool in tools.iter().take(MAX_TOOLS_LISTED) {
            let Some(n) = names.get(&tool.name) else {
                continue;
            };
            let mut called = Vec::new();
            if python {
                called.push(n.py_function.clone());
            }
            if typescript {
                called.push(n.ts_function.clone());
            }
            let summary = tool
                .description
                .as_deref()
                .and_then(|d| d.lines().next())
                .map(|d| crate::server::transport::framing::bounded(d).into_owned())
                .unwrap_or_default();
            let _ = writeln!(t, "- {}: {summary}", called.join(" / "));
        }
        if tools.len() > MAX_TOOLS_LISTED {
            let _ = writeln!(
                t,
                "- … and {} more: search_tools with server={:?}",
                tools.len() - MAX_TOOLS_LISTED,
                server.name
            );
        }
        if let Some((tool, n)) = tools
            .first()
            .and_then(|tool| Some((*tool, names.get(&tool.name)?)))
        {
            t.push_str("\nFor example:\n");
            if python {
                let _ = writeln!(t, "{}", crate::codegen::describe::example_python(tool, n));
            }
            if typescript {
                let _ = writeln!(
                    t,
                    "{}",
                    crate::codegen::describe::example_typescript(tool, n)
                );
            }
        }
    }
    t
}

impl crate::server::CodeboxServer {
    /// The configured upstream servers as the prompt describes them.
    fn server_lines(&self) -> Vec<ServerLine> {
        self.state
            .backend
            .upstreams()
            .servers()
            .into_iter()
            .map(|s| ServerLine {
                note: s.note(),
                name: s.name,
                state: s.state.to_string(),
                tool_count: s.tool_count,
            })
            .collect()
    }

    /// `prompts/get`, with PII handling's tokens where server notes carry them.
    pub(in crate::server) fn prompt_now(
        &self,
        request: rmcp::model::GetPromptRequestParams,
    ) -> Result<rmcp::model::GetPromptResponse, rmcp::ErrorData> {
        use crate::proxy::ToolBackend;
        let catalog = self.state.backend.catalog();
        get(
            &request.name,
            request.arguments.as_ref(),
            &self.server_lines(),
            &catalog,
        )
        .map(Into::into)
        .map_err(|e| {
            tracing::debug!(error = %e, "prompts/get refused");
            e.into()
        })
    }

    /// `completion/complete` for an argument of one of codebox's prompts.
    pub(in crate::server) fn complete_now(
        &self,
        request: rmcp::model::CompleteRequestParams,
    ) -> Result<rmcp::model::CompleteResult, rmcp::ErrorData> {
        use rmcp::model::{CompleteResult, CompletionInfo, Reference};
        let prompt = match &request.r#ref {
            Reference::Prompt(p) => p.name.as_str(),
            _ => {
                return Err(rmcp::ErrorData::invalid_params(
                    "codebox has no resource templates to complete",
                    None,
                ))
            }
        };
        if prompt != UPSTREAM_SERVERS {
            return Err(Error::NoSuchPrompt {
                name: crate::server::transport::framing::bounded(prompt).into_owned(),
            }
            .into());
        }
        let values = complete(
            &request.argument.name,
            &request.argument.value,
            &self.server_lines(),
        );
        let info = CompletionInfo::with_all_values(values)
            .map_err(|e| rmcp::ErrorData::internal_error(e, None))?;
        Ok(CompleteResult::new(info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::catalog::{CatalogServer, CatalogTool};

    fn tool(server: &str, name: &str) -> CatalogTool {
        CatalogTool {
            name: format!("{server}__{name}"),
            server: server.into(),
            tool: name.into(),
            server_ident: server.into(),
            tool_ident: name.into(),
            title: None,
            description: Some(format!("Does {name}.\nMore text.")),
            input_schema: serde_json::json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"]
            }),
            output_schema: None,
            annotations: None,
        }
    }

    fn setup() -> (Vec<ServerLine>, Catalog) {
        let catalog = Catalog {
            version: 3,
            tools: vec![tool("files", "read_text_file"), tool("files", "list_dir")],
            servers: vec![
                CatalogServer {
                    name: "files".into(),
                    ident: "files".into(),
                },
                CatalogServer {
                    name: "mail".into(),
                    ident: "mail".into(),
                },
            ],
        };
        let servers = vec![
            ServerLine {
                name: "files".into(),
                state: "ready".into(),
                tool_count: 2,
                note: None,
            },
            ServerLine {
                name: "mail".into(),
                state: "failed".into(),
                tool_count: 0,
                note: Some("its command exited".into()),
            },
        ];
        (servers, catalog)
    }

    fn text(result: &GetPromptResult) -> String {
        serde_json::to_value(&result.messages[0]).unwrap()["content"]["text"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn the_guide_names_every_server_and_both_import_forms() {
        let (servers, catalog) = setup();
        let t = text(&get(UPSTREAM_SERVERS, None, &servers, &catalog).unwrap());
        assert!(t.contains("- files (ready): 2 tools; Python `servers.files`; TypeScript \"/servers/files/index.ts\""), "{t}");
        assert!(
            t.contains("- mail (failed): 0 tools") && t.contains("its command exited"),
            "{t}"
        );
        assert!(t.contains("from servers.<module> import <function>"), "{t}");
        assert!(t.contains("<function>(required, option=...)"), "{t}");
        assert!(t.contains("await <function>({ arg: ... })"), "{t}");
        assert!(!t.contains("Tools of"), "{t}");
    }

    #[test]
    fn one_server_in_one_language_lists_its_tools_with_an_example() {
        let (servers, catalog) = setup();
        let args = serde_json::json!({"server": "files", "language": "python"});
        let result = get(UPSTREAM_SERVERS, args.as_object(), &servers, &catalog).unwrap();
        let t = text(&result);
        assert!(t.contains("Tools of files (2):"), "{t}");
        assert!(t.contains("- read_text_file: Does read_text_file."), "{t}");
        assert!(
            t.contains("from servers.files import read_text_file\nread_text_file(\"...\")"),
            "{t}"
        );
        assert!(!t.contains("index.ts"), "{t}");
    }

    #[test]
    fn bad_arguments_and_names_are_refused_by_name() {
        let (servers, catalog) = setup();
        let args = serde_json::json!({"server": "nope"});
        let e = get(UPSTREAM_SERVERS, args.as_object(), &servers, &catalog).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no upstream server named \"nope\"; configured: files, mail"
        );
        let args = serde_json::json!({"language": "rust"});
        let e = get(UPSTREAM_SERVERS, args.as_object(), &servers, &catalog).unwrap_err();
        assert!(matches!(e, Error::BadLanguage { .. }));
        let e = get("test_simple_prompt", None, &servers, &catalog).unwrap_err();
        assert!(matches!(e, Error::NoSuchPrompt { .. }));
    }

    #[test]
    fn without_servers_the_guide_says_so() {
        let t = text(&get(UPSTREAM_SERVERS, None, &[], &Catalog::default()).unwrap());
        assert!(t.contains("No upstream MCP servers are configured"), "{t}");
    }

    #[test]
    fn the_list_is_cacheable_and_completion_offers_servers_and_languages() {
        let list = serde_json::to_value(list()).unwrap();
        assert_eq!(list["prompts"][0]["name"], UPSTREAM_SERVERS);
        assert_eq!(list["cacheScope"], "public");
        assert_eq!(list["ttlMs"], LIST_TTL_MS);
        let (servers, _) = setup();
        assert_eq!(complete("server", "f", &servers), vec!["files"]);
        assert_eq!(complete("language", "t", &servers), vec!["typescript"]);
        assert!(complete("other", "", &servers).is_empty());
    }
}
