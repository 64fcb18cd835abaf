//! The wrapper generator: from the [`Catalog`] of upstream tools, the tree mounted
//! read-only at `/servers` in the sandbox.
//!
//! ```text
//! /servers/client.ts                       the runtime client (src/runtime/deno/client.ts)
//! /servers/<server_ident>/<tool_ident>.ts  one module per tool (`typescript`)
//! /servers/<server_ident>/index.ts         re-exports every tool of the server
//! /servers/__init__.py                     the Python package `servers` (`python`)
//! /servers/<server_ident>/__init__.py      one Python function per tool
//! ```
//!
//! so that `import { readTextFile } from "/servers/filesystem/index.ts"` and
//! `from servers.filesystem import read_text_file` both work. Everything is rendered in
//! memory first (the catalog is checked before anything is written), then written into an
//! empty or new directory: directories 0755, files 0644, for the sandbox's unprivileged user.
//!
//! A server whose identifier is a Python keyword (`class`) gets its Python package in a
//! directory of its own (`class_/__init__.py`); the TypeScript files stay in `class/`.
//!
//! [`tool_names`] says where each tool lands and what it is called; [`describe`] renders
//! one tool's signatures and example calls for tool search, with the same code.

pub mod describe;
mod escape;
pub mod names;
mod python;
mod schema;
mod tool_names;
mod typescript;
pub mod wrapper_dir;
pub mod wrapper_views;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::upstream::catalog::{Catalog, CatalogTool};

pub use tool_names::{tool_names, ToolNames};

/// The runtime client every tool module imports as `../client.ts`.
const CLIENT_TS: &str = include_str!("../runtime/deno/client.ts");

const DIR_MODE: u32 = 0o755;
const FILE_MODE: u32 = 0o644;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tool {name}: {what} {ident:?} is not an identifier ([A-Za-z0-9_]+)")]
    InvalidIdent {
        name: String,
        what: &'static str,
        ident: String,
    },
    #[error("tool {tool:?} of server {server:?} appears twice in the catalog")]
    Duplicate { server: String, tool: String },
    #[error("output directory {path} is not empty")]
    NotEmpty { path: PathBuf },
    #[error("cannot read output directory {path}")]
    ReadOutput {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}")]
    WriteFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// What [`generate`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GenerateStats {
    pub servers: usize,
    pub tools: usize,
    pub files: usize,
    pub bytes: u64,
}

/// The rendered tree: relative path → contents (directories are implied).
type Tree = BTreeMap<PathBuf, String>;

fn is_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks the identifiers (they become file names) and groups the tools by server,
/// sorted by identifiers.
fn by_server(catalog: &Catalog) -> Result<BTreeMap<&str, Vec<&CatalogTool>>> {
    let mut seen = BTreeSet::new();
    for tool in &catalog.tools {
        for (what, ident) in [
            ("server_ident", &tool.server_ident),
            ("tool_ident", &tool.tool_ident),
        ] {
            if !is_ident(ident) {
                let (name, ident) = (tool.name.clone(), ident.clone());
                return Err(Error::InvalidIdent { name, what, ident });
            }
        }
        if !seen.insert((&tool.server_ident, &tool.tool_ident)) {
            let (server, tool) = (tool.server.clone(), tool.tool.clone());
            return Err(Error::Duplicate { server, tool });
        }
    }
    Ok(tool_names::group(catalog))
}

/// The TypeScript files of one server, under `dir`.
fn render_typescript(
    tree: &mut Tree,
    ident: &str,
    server: &str,
    tools: &[&CatalogTool],
    names: &[ToolNames],
) {
    let dir = Path::new(ident);
    let mut modules = Vec::new();
    for (tool, n) in tools.iter().zip(names) {
        let module = typescript::tool_module(tool, &n.ts_function, &n.ts_type_base);
        tree.insert(dir.join(format!("{}.ts", n.ts_stem)), module.text.clone());
        modules.push(module);
    }
    let index: Vec<(&str, &typescript::ToolModule)> = names
        .iter()
        .map(|n| n.ts_stem.as_str())
        .zip(&modules)
        .collect();
    tree.insert(
        dir.join("index.ts"),
        typescript::index_module(server, ident, &index),
    );
}

/// Renders the whole tree in memory: a module for every configured server, those
/// without known tools (still connecting, or failed) as modules that call by name.
fn render(catalog: &Catalog) -> Result<(Tree, usize)> {
    let mut servers = by_server(catalog)?;
    let mut unknown: BTreeMap<&str, &str> = BTreeMap::new();
    for s in &catalog.servers {
        if !is_ident(&s.ident) {
            return Err(Error::InvalidIdent {
                name: s.name.clone(),
                what: "server_ident",
                ident: s.ident.clone(),
            });
        }
        if !servers.contains_key(s.ident.as_str()) {
            unknown.insert(&s.ident, &s.name);
        }
    }
    for ident in unknown.keys() {
        servers.insert(ident, Vec::new());
    }
    let mut tree = Tree::new();
    tree.insert(PathBuf::from("client.ts"), CLIENT_TS.to_string());
    let idents: Vec<&str> = servers.keys().copied().collect();
    let modules = tool_names::module_names(&idents);
    let mut listing = Vec::new();
    for ((ident, tools), module) in servers.iter().zip(modules) {
        let path = PathBuf::from(&module).join("__init__.py");
        if let Some(server) = unknown.get(ident) {
            tree.insert(
                Path::new(ident).join("index.ts"),
                typescript::unknown_index_module(server, ident),
            );
            tree.insert(path, python::unknown_server_module(server, ident));
            listing.push((module, server.to_string(), 0));
            continue;
        }
        let server = tools[0].server.as_str();
        let names = tool_names::server_names(ident, &module, tools);
        render_typescript(&mut tree, ident, server, tools, &names);
        let functions = names.iter().map(|n| n.py_function.clone());
        let pairs: Vec<(&CatalogTool, String)> = tools.iter().copied().zip(functions).collect();
        tree.insert(path, python::server_module(server, &pairs));
        listing.push((module, server.to_string(), tools.len()));
    }
    tree.insert(PathBuf::from("__init__.py"), python::package_init(&listing));
    Ok((tree, servers.len()))
}

fn create_dir(path: &Path) -> Result<()> {
    let err = |source| Error::CreateDir {
        path: path.to_path_buf(),
        source,
    };
    match DirBuilder::new().mode(DIR_MODE).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => {}
        Err(e) => return Err(err(e)),
    }
    // The umask may have narrowed the mode; the sandbox user must be able to read.
    fs::set_permissions(path, Permissions::from_mode(DIR_MODE)).map_err(err)
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    let err = |source| Error::WriteFile {
        path: path.to_path_buf(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(err)?;
    file.write_all(contents.as_bytes()).map_err(err)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))
        .map_err(err)
}

/// `out` must be an empty directory or not exist; it is created (with its parents) if needed.
fn prepare_output(out: &Path) -> Result<()> {
    match fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::NotEmpty {
                    path: out.to_path_buf(),
                });
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::create_dir_all(parent).map_err(|source| Error::CreateDir {
                    path: parent.to_path_buf(),
                    source,
                })?;
            }
        }
        Err(source) => {
            return Err(Error::ReadOutput {
                path: out.to_path_buf(),
                source,
            })
        }
    }
    create_dir(out)
}

/// The `/servers` tree for `catalog`, in memory: each file's path (relative to
/// `/servers`) and contents; what [`generate`] writes.
pub fn render_tree(catalog: &Catalog) -> Result<BTreeMap<PathBuf, String>> {
    render(catalog).map(|(tree, _)| tree)
}

/// Generates the `/servers` tree for `catalog` into `out` (an empty directory, or a path
/// that does not exist yet).
pub fn generate(catalog: &Catalog, out: &Path) -> Result<GenerateStats> {
    let (tree, servers) = render(catalog)?;
    prepare_output(out)?;
    let mut stats = GenerateStats {
        servers,
        tools: catalog.tools.len(),
        ..Default::default()
    };
    let mut dirs = BTreeSet::new();
    for (rel, contents) in &tree {
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            if dirs.insert(parent.to_path_buf()) {
                create_dir(&out.join(parent))?;
            }
        }
        write_file(&out.join(rel), contents)?;
        stats.files += 1;
        stats.bytes += contents.len() as u64;
    }
    tracing::debug!(?stats, out = %out.display(), "generated /servers");
    Ok(stats)
}

#[cfg(test)]
mod tests;
