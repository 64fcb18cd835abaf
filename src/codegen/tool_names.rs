//! Where each tool lands in the generated tree and what it is called there: one place
//! for the names, so [`generate`](super::generate) and the search results
//! ([`describe`](super::describe)) cannot disagree.
//!
//! Names are unique per server: a file stem per tool (`index` reserved), a TypeScript
//! function and type-name base, a Python function (the module's own names reserved); and
//! one Python module per server.

use std::collections::{BTreeMap, HashMap};

use crate::codegen::names::{allocate, camel_case, pascal_case, py_ident, ts_value_ident, Namer};
use crate::codegen::python;
use crate::upstream::catalog::{Catalog, CatalogTool};

/// One tool's names in the generated `/servers` tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolNames {
    /// The server's TypeScript directory: `/servers/<ts_dir>/index.ts`.
    pub ts_dir: String,
    /// The tool's module: `/servers/<ts_dir>/<ts_stem>.ts`.
    pub ts_stem: String,
    /// The exported function (`readTextFile`).
    pub ts_function: String,
    /// The base of its type names (`ReadTextFile` → `ReadTextFileInput`).
    pub ts_type_base: String,
    /// The Python module: `servers.<py_module>`.
    pub py_module: String,
    /// The Python function (`read_text_file`).
    pub py_function: String,
}

/// The Python module of each server, for server identifiers in sorted order.
pub(super) fn module_names(server_idents: &[&str]) -> Vec<String> {
    allocate(&mut Namer::new("_", &[]), server_idents, |s| {
        py_ident(s, false)
    })
}

/// The names of one server's tools, given in the order of the generated files (sorted by
/// `tool_ident`).
pub(super) fn server_names(
    server_ident: &str,
    py_module: &str,
    tools: &[&CatalogTool],
) -> Vec<ToolNames> {
    let idents: Vec<&str> = tools.iter().map(|t| t.tool_ident.as_str()).collect();
    let stems = allocate(&mut Namer::new("_", &["index"]), &idents, str::to_string);
    let upstream: Vec<&str> = tools.iter().map(|t| t.tool.as_str()).collect();
    let functions = allocate(&mut Namer::new("", &["callMCPTool"]), &upstream, |t| {
        ts_value_ident(&camel_case(t))
    });
    let mut py_namer = Namer::new("_", python::MODULE_RESERVED);
    let py_functions = allocate(&mut py_namer, &idents, |s| py_ident(s, false));
    let mut type_bases = Namer::new("", &[]);
    stems
        .into_iter()
        .zip(functions)
        .zip(py_functions)
        .map(|((ts_stem, ts_function), py_function)| ToolNames {
            ts_dir: server_ident.to_string(),
            ts_type_base: type_bases.claim(&pascal_case(&ts_function)),
            ts_stem,
            ts_function,
            py_module: py_module.to_string(),
            py_function,
        })
        .collect()
}

/// The tools grouped by server identifier, each group sorted by `tool_ident`.
pub(super) fn group(catalog: &Catalog) -> BTreeMap<&str, Vec<&CatalogTool>> {
    let mut servers: BTreeMap<&str, Vec<&CatalogTool>> = BTreeMap::new();
    for tool in &catalog.tools {
        servers.entry(&tool.server_ident).or_default().push(tool);
    }
    for tools in servers.values_mut() {
        tools.sort_by(|a, b| a.tool_ident.cmp(&b.tool_ident));
    }
    servers
}

/// Every tool's names, by catalog name, as [`generate`](super::generate) lays them out.
pub fn tool_names(catalog: &Catalog) -> HashMap<String, ToolNames> {
    let servers = group(catalog);
    let idents: Vec<&str> = servers.keys().copied().collect();
    let mut out = HashMap::with_capacity(catalog.tools.len());
    for ((ident, tools), module) in servers.iter().zip(module_names(&idents)) {
        for (tool, names) in tools.iter().zip(server_names(ident, &module, tools)) {
            out.insert(tool.name.clone(), names);
        }
    }
    out
}
