//! The pure part of adopting: the files as read ([`Snapshot`]) → a [`Plan`]: which servers
//! move from where to where, which codebox entries are added, updated or removed, and the
//! new text of every file that changes. Nothing here touches the filesystem;
//! `execute` carries a plan out.
//!
//! Install, per scope ([`Unit`]): every server of the scope that is not codebox itself
//! moves to the scope's codebox file (one already there with the same definition only
//! leaves the scope; with a different one the whole plan is refused), and the scope's
//! `codebox` entry is added or brought up to date. The project scope is always installed
//! (with an empty codebox file when it has no servers), the local scope only when it has
//! servers or was installed before. Uninstall is the inverse: the codebox file's servers
//! go back, the entry and the codebox file go.
//!
//! Files are held as [`super::doc::Members`]: a server moves as the text it was written
//! with, and everything the plan does not change is written back as it was read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::claude_code::{self, key_path, Launcher, Locations, Scope, Unit, ENTRY_NAME};
use super::doc::{Layout, Members, Node};
use super::jsonc;
use super::{Error, Result};

/// What to do, and for install what the codebox entry starts.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    Install(&'a Launcher),
    Uninstall,
}

/// One file as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRead {
    pub bytes: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

/// The files a plan is made from: path → contents (`None`: the file does not exist).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    files: BTreeMap<PathBuf, Option<FileRead>>,
}

impl Snapshot {
    pub fn insert(&mut self, path: PathBuf, read: Option<FileRead>) {
        self.files.insert(path, read);
    }

    fn get(&self, path: &Path) -> Option<&FileRead> {
        self.files.get(path).and_then(Option::as_ref)
    }
}

/// The files a plan for the project (or the user scope) reads.
pub fn files_to_read(at: &Locations, user: bool) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for unit in claude_code::units(at, user) {
        for p in [unit.claude_file, unit.codebox_file] {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
    }
    paths
}

pub struct Inputs<'a> {
    pub action: Action<'a>,
    pub at: &'a Locations,
    /// The user scope instead of the project's scopes.
    pub user: bool,
    pub snapshot: &'a Snapshot,
    /// Whether a command (as an entry names it) is the running codebox binary.
    pub is_me: &'a dyn Fn(&str) -> bool,
}

/// What happens, in the order it is reported.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Servers that move from `from` to `to`.
    Move {
        servers: Vec<String>,
        from: String,
        to: String,
    },
    /// Servers `to` already holds with the same definition: they only leave `from`.
    AlreadyThere {
        servers: Vec<String>,
        from: String,
        to: String,
    },
    /// A scope's codebox entry.
    Entry { place: String, change: EntryChange },
}

#[derive(Debug, Clone, PartialEq)]
pub enum EntryChange {
    Added(Value),
    Updated { old: Value, new: Value },
    Removed(Value),
}

/// One file to write or remove.
#[derive(Debug, Clone, PartialEq)]
pub struct FileChange {
    pub path: PathBuf,
    /// The bytes the plan was made from (`None`: the file is new).
    pub original: Option<Vec<u8>>,
    /// The new text (`None`: the file is removed).
    pub text: Option<String>,
    /// The mode of the file when it is new (an existing file keeps its own).
    pub new_mode: u32,
    /// The mode of directories made for it.
    pub dir_mode: u32,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    /// In the order to apply: on install the codebox files first, so a run cut short
    /// leaves servers in both places, never in neither; on uninstall the Claude Code files
    /// first, for the same reason.
    pub files: Vec<FileChange>,
    pub notes: Vec<String>,
}

impl Plan {
    pub fn nothing_to_do(&self) -> bool {
        self.files.is_empty()
    }

    /// The plan in words, one line each: steps, files, notes.
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.steps.iter().map(describe_step).collect();
        for f in &self.files {
            lines.push(match (&f.original, &f.text) {
                (None, _) => format!("new file {} (mode {:04o})", f.path.display(), f.new_mode),
                (Some(_), Some(_)) => format!("rewrite {}", f.path.display()),
                (Some(_), None) => format!("remove {}", f.path.display()),
            });
        }
        lines.extend(self.notes.iter().map(|n| format!("note: {n}")));
        lines
    }
}

fn describe_step(step: &Step) -> String {
    match step {
        Step::Move { servers, from, to } => {
            format!("move {}: {from} → {to}", servers.join(", "))
        }
        Step::AlreadyThere { servers, from, to } => format!(
            "drop {} from {from}: already in {to} with the same definition",
            servers.join(", ")
        ),
        Step::Entry { place, change } => match change {
            EntryChange::Added(e) => format!(
                "add the codebox entry to {place}: {}",
                claude_code::command_line(e)
            ),
            EntryChange::Updated { old, new } => format!(
                "update the codebox entry in {place}: {} → {}",
                claude_code::command_line(old),
                claude_code::command_line(new)
            ),
            EntryChange::Removed(e) => format!(
                "remove the codebox entry from {place}: {}",
                claude_code::command_line(e)
            ),
        },
    }
}

/// Makes the plan, or refuses it whole.
pub fn plan(inputs: &Inputs<'_>) -> Result<Plan> {
    let units = claude_code::units(inputs.at, inputs.user);
    let mut docs = Docs::default();
    let project_mode = inputs.snapshot.get(&inputs.at.project_mcp).map(|r| r.mode);
    for unit in &units {
        let private = unit.scope != Scope::Project;
        let claude_mode = if private { 0o600 } else { 0o644 };
        docs.load(inputs.snapshot, &unit.claude_file, true, claude_mode)?;
        let codebox_mode = if private {
            0o600
        } else {
            project_mode.unwrap_or(0o644)
        };
        docs.load(inputs.snapshot, &unit.codebox_file, false, codebox_mode)?;
    }
    let mut out = Plan::default();
    for unit in &units {
        match inputs.action {
            Action::Install(launcher) => {
                let always = unit.scope != Scope::Local;
                install_unit(&mut docs, unit, launcher, inputs.is_me, always, &mut out)?;
            }
            Action::Uninstall => uninstall_unit(&mut docs, unit, inputs.is_me, &mut out)?,
        }
    }
    if let Action::Install(_) = inputs.action {
        if inputs.user {
            if out.steps.iter().any(|s| matches!(s, Step::Entry { .. })) {
                out.notes.push(format!(
                    "in a project with a codebox entry of its own (project or local scope), that entry shadows this one: the servers of {} are not reachable there",
                    inputs.at.user_codebox.display()
                ));
            }
        } else {
            check_scopes_apart(&docs, &units)?;
            shadow_note(&docs, inputs, &mut out);
        }
    }
    let claude_first = matches!(inputs.action, Action::Uninstall);
    docs.finish(claude_first, &mut out);
    Ok(out)
}

/// Installs one scope: its servers to its codebox file, its codebox entry up to date.
/// `always`: also when the scope has no servers and was never installed.
fn install_unit(
    docs: &mut Docs,
    unit: &Unit,
    launcher: &Launcher,
    is_me: &dyn Fn(&str) -> bool,
    always: bool,
    out: &mut Plan,
) -> Result<()> {
    let place = unit.place();
    let to = unit.codebox_file.display().to_string();
    // What the scope holds: servers to move, and the codebox entry if there is one.
    let mut moving: Vec<Server> = Vec::new();
    let mut entry = None;
    for server in docs.servers(&unit.claude_file, &unit.at, &place)? {
        let name = &server.name;
        if !claude_code::is_codebox(&server.def, is_me) {
            moving.push(server);
        } else if name == ENTRY_NAME {
            entry = Some(server);
        } else {
            out.notes.push(format!(
                "{place}: server {name:?} starts codebox itself: left in place (remove it if the codebox entry replaces it)"
            ));
        }
    }
    let codebox_exists = docs.get(&unit.codebox_file).after.is_some();
    if !always && moving.is_empty() && !codebox_exists && entry.is_none() {
        return Ok(());
    }
    // Where each goes: new to the codebox file, or already there; a different definition
    // under the same name refuses the whole plan.
    let held = docs.servers(&unit.codebox_file, &[], &to)?;
    let (mut moved, mut already) = (Vec::new(), Vec::new());
    for Server { name, def, .. } in &moving {
        match held.iter().find(|h| h.name == *name) {
            None => moved.push(name.clone()),
            Some(h) if h.def == *def => already.push(name.clone()),
            Some(_) => {
                return Err(Error::Conflict {
                    server: name.clone(),
                    first: to,
                    second: place,
                })
            }
        }
    }
    // The codebox file gets the servers, each as written; it exists afterwards even when
    // empty, since the entry names it.
    let target = docs.servers_mut(&unit.codebox_file, &[], &to)?;
    for server in &moving {
        if moved.contains(&server.name) {
            target.insert(server.name.clone(), server.node.clone().moved());
        }
    }
    // The scope keeps the codebox entry only.
    let old = entry.as_ref().map(|e| &e.def);
    let desired = claude_code::codebox_entry(launcher, old, &unit.entry_configs);
    let source = docs.servers_mut(&unit.claude_file, &unit.at, &place)?;
    for server in &moving {
        source.remove(&server.name);
    }
    if old != Some(&desired) {
        let node = entry_node(entry.as_ref().map(|e| &e.node), &desired);
        source.insert(ENTRY_NAME.into(), node);
    }

    for Server { name, def, .. } in &moving {
        if let Some(kind) = def.get("type").and_then(Value::as_str) {
            if kind != "stdio" && kind != "http" {
                out.notes.push(format!(
                    "server {name:?} is of type {kind:?}, which codebox does not speak: `codebox serve` lists it as failed, with the reason, and never starts it; it moves with the others so nothing is lost (`codebox uninstall claude-code` puts it back)"
                ));
            }
        }
    }
    if moving.is_empty() && !codebox_exists {
        out.notes.push(format!(
            "{place} has no servers to move: {to} starts empty; add servers to it (same format as .mcp.json), or to the scope and run install again"
        ));
    }
    if !moved.is_empty() {
        out.steps.push(Step::Move {
            servers: moved,
            from: place.clone(),
            to: to.clone(),
        });
    }
    if !already.is_empty() {
        out.steps.push(Step::AlreadyThere {
            servers: already,
            from: place.clone(),
            to,
        });
    }
    let change = match entry.map(|e| e.def) {
        None => Some(EntryChange::Added(desired)),
        Some(old) if old != desired => Some(EntryChange::Updated { old, new: desired }),
        Some(_) => None,
    };
    if let Some(change) = change {
        out.steps.push(Step::Entry { place, change });
    }
    Ok(())
}

/// The codebox entry to write: an existing one's members in their order and text, with
/// `command` and `args` set (first, in that order, in a new one).
fn entry_node(existing: Option<&Node>, desired: &Value) -> Node {
    let mut members = existing.and_then(Node::members).unwrap_or_default();
    for key in ["command", "args"] {
        members.insert(key.into(), Node::Value(desired[key].clone()));
    }
    Node::Object(members)
}

/// Uninstalls one scope: the codebox file's servers back, the entry and the file gone.
fn uninstall_unit(
    docs: &mut Docs,
    unit: &Unit,
    is_me: &dyn Fn(&str) -> bool,
    out: &mut Plan,
) -> Result<()> {
    let place = unit.place();
    let from = unit.codebox_file.display().to_string();
    let codebox_exists = docs.get(&unit.codebox_file).after.is_some();
    let held = docs.servers(&unit.codebox_file, &[], &from)?;
    let mut present = docs.servers(&unit.claude_file, &unit.at, &place)?;
    // A server named `codebox` that is not codebox itself is the user's own: it stays.
    let entry = present
        .iter()
        .find(|s| s.name == ENTRY_NAME && claude_code::is_codebox(&s.def, is_me))
        .map(|s| s.def.clone());
    if entry.is_some() {
        present.retain(|s| s.name != ENTRY_NAME);
    }
    if !codebox_exists && entry.is_none() {
        return Ok(());
    }
    let (mut restored, mut already) = (Vec::new(), Vec::new());
    for Server { name, def, .. } in &held {
        match present.iter().find(|p| p.name == *name) {
            None => restored.push(name.clone()),
            Some(p) if p.def == *def => already.push(name.clone()),
            Some(_) => {
                return Err(Error::Conflict {
                    server: name.clone(),
                    first: from,
                    second: place,
                })
            }
        }
    }
    if entry.is_some() || !restored.is_empty() {
        let scope = docs.servers_mut(&unit.claude_file, &unit.at, &place)?;
        if entry.is_some() {
            scope.remove(ENTRY_NAME);
        }
        for server in held.iter().filter(|s| restored.contains(&s.name)) {
            scope.insert(server.name.clone(), server.node.clone().moved());
        }
    }
    let claude = docs.get_mut(&unit.claude_file);
    let left = claude.after.as_ref().map(Members::to_value);
    if unit.scope == Scope::Project && left == Some(json!({"mcpServers": {}})) {
        claude.after = None;
        out.notes.push(format!(
            "{} would hold nothing but an empty mcpServers: it is removed",
            unit.claude_file.display()
        ));
    }
    docs.get_mut(&unit.codebox_file).after = None;

    if let Some(e) = entry {
        out.steps.push(Step::Entry {
            place: place.clone(),
            change: EntryChange::Removed(e),
        });
    }
    if !restored.is_empty() {
        out.steps.push(Step::Move {
            servers: restored,
            from: from.clone(),
            to: place.clone(),
        });
    }
    if !already.is_empty() {
        out.steps.push(Step::AlreadyThere {
            servers: already,
            from,
            to: place,
        });
    }
    Ok(())
}

/// The local-scope entry serves the project's codebox file and the local one together,
/// and `codebox serve` refuses a name found in two files.
fn check_scopes_apart(docs: &Docs, units: &[Unit]) -> Result<()> {
    let [project, local] = units else {
        return Ok(());
    };
    let names = |unit: &Unit| -> Vec<String> {
        docs.get(&unit.codebox_file)
            .after
            .as_ref()
            .and_then(|top| top.get("mcpServers"))
            .and_then(Node::members)
            .map(|m| m.keys().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let in_project = names(project);
    let Some(server) = names(local).into_iter().find(|n| in_project.contains(n)) else {
        return Ok(());
    };
    let at = |unit: &Unit| {
        format!(
            "{} (codebox file {})",
            unit.place(),
            unit.codebox_file.display()
        )
    };
    Err(Error::SameNameInTwoScopes {
        server,
        project: at(project),
        local: at(local),
    })
}

/// A user-scope codebox entry is shadowed in this project by the project's own.
fn shadow_note(docs: &Docs, inputs: &Inputs<'_>, out: &mut Plan) {
    let user_entry = docs
        .get(&inputs.at.claude_json)
        .after
        .as_ref()
        .and_then(|top| top.get("mcpServers"))
        .and_then(Node::members)
        .and_then(|m| m.get(ENTRY_NAME).map(Node::to_value));
    if user_entry.is_some_and(|e| claude_code::is_codebox(&e, inputs.is_me))
        && out.steps.iter().any(|s| matches!(s, Step::Entry { .. }))
    {
        out.notes.push(format!(
            "the user-scope codebox entry in {} is shadowed in this project by the project's own: the servers of {} are not reachable from codebox here",
            inputs.at.claude_json.display(),
            inputs.at.user_codebox.display()
        ));
    }
}

/// One entry of an `mcpServers`: its text as read, and its value.
struct Server {
    name: String,
    node: Node,
    def: Value,
}

/// A file being planned: as read, and as it will be.
struct Doc {
    path: PathBuf,
    read: Option<FileRead>,
    parsed: Option<jsonc::Parsed>,
    /// `None`: the file does not exist, or is to be removed. Values the plan does not
    /// change keep their text ([`super::doc`]).
    after: Option<Members>,
    layout: Layout,
    /// A Claude Code file (else a codebox file).
    claude: bool,
    new_mode: u32,
}

#[derive(Default)]
struct Docs(Vec<Doc>);

impl Docs {
    /// Parses `path` from the snapshot, once.
    fn load(
        &mut self,
        snapshot: &Snapshot,
        path: &Path,
        claude: bool,
        new_mode: u32,
    ) -> Result<()> {
        if self.0.iter().any(|d| d.path == path) {
            return Ok(());
        }
        let read = snapshot.get(path).cloned();
        let parsed = match &read {
            None => None,
            Some(r) => Some(jsonc::parse(&r.bytes).map_err(|e| Error::Json {
                path: path.to_path_buf(),
                line: e.line,
                column: e.column,
                message: e.message,
            })?),
        };
        let after = match &parsed {
            None => None,
            Some(p) => Some(Members::parse(&p.text).ok_or_else(|| Error::Shape {
                place: path.display().to_string(),
                message: "the top level is not a JSON object".into(),
            })?),
        };
        self.0.push(Doc {
            path: path.to_path_buf(),
            after,
            layout: parsed
                .as_ref()
                .filter(|p| !p.empty)
                .map(|p| Layout::of(&p.text))
                .unwrap_or_default(),
            read,
            parsed,
            claude,
            new_mode,
        });
        Ok(())
    }

    fn get(&self, path: &Path) -> &Doc {
        self.0
            .iter()
            .find(|d| d.path == path)
            .expect("every unit's files are loaded first")
    }

    fn get_mut(&mut self, path: &Path) -> &mut Doc {
        self.0
            .iter_mut()
            .find(|d| d.path == path)
            .expect("every unit's files are loaded first")
    }

    /// The entries of the `mcpServers` below the keys `at`, in the file's order (none when
    /// any level is absent), every level and every entry checked to be an object.
    fn servers(&self, path: &Path, at: &[String], place: &str) -> Result<Vec<Server>> {
        let Some(top) = self.get(path).after.as_ref() else {
            return Ok(Vec::new());
        };
        let shape = |message: String| Error::Shape {
            place: place.to_string(),
            message,
        };
        let mut below: Option<Members> = None;
        for (i, key) in at.iter().enumerate() {
            let node = match below.as_ref().unwrap_or(top).get(key) {
                None => return Ok(Vec::new()),
                Some(node) => node,
            };
            let members = node
                .members()
                .ok_or_else(|| shape(format!("{} is not an object", key_path(&at[..=i]))))?;
            below = Some(members);
        }
        let servers = match below.as_ref().unwrap_or(top).get("mcpServers") {
            None => return Ok(Vec::new()),
            Some(node) => node
                .members()
                .ok_or_else(|| shape("mcpServers is not an object".into()))?,
        };
        servers
            .iter()
            .map(|(name, node)| {
                let def = node.to_value();
                if !def.is_object() {
                    return Err(shape(format!("server {name:?} is not a JSON object")));
                }
                Ok(Server {
                    name: name.to_string(),
                    node: node.clone(),
                    def,
                })
            })
            .collect()
    }

    /// The `mcpServers` below `at`, opened for editing; made (with the file) where missing.
    fn servers_mut(&mut self, path: &Path, at: &[String], place: &str) -> Result<&mut Members> {
        let shape = |message: String| Error::Shape {
            place: place.to_string(),
            message,
        };
        let mut members = self
            .get_mut(path)
            .after
            .get_or_insert_with(Members::default);
        for key in at.iter().map(String::as_str).chain(["mcpServers"]) {
            members = members
                .object_mut(key)
                .map_err(|_| shape(format!("{key} is not an object")))?;
        }
        Ok(members)
    }

    /// The files that change, in the order to apply, and what their rewrite cannot keep.
    fn finish(self, claude_first: bool, out: &mut Plan) {
        let (first, second): (Vec<Doc>, Vec<Doc>) =
            self.0.into_iter().partition(|d| d.claude == claude_first);
        for doc in first.into_iter().chain(second) {
            let before = doc.parsed.as_ref().map(|p| &p.value);
            if before != doc.after.as_ref().map(Members::to_value).as_ref() {
                push_change(doc, out);
            }
        }
    }
}

/// A file that changes: its new text, and what the rewrite does not keep.
fn push_change(doc: Doc, out: &mut Plan) {
    let text = doc.after.as_ref().map(|top| doc.layout.render(top));
    if let (Some(_), Some(read), Some(parsed)) = (&text, &doc.read, &doc.parsed) {
        if let Some(dropped) = parsed.dropped() {
            out.notes.push(format!(
                "{} has {dropped}; the rewrite does not keep them (the backup does)",
                doc.path.display()
            ));
        } else if !parsed.empty {
            // The file as read, written back: its own text unless its layout differs
            // from the one codebox writes.
            let as_read = Members::parse(&parsed.text).expect("parsed before");
            if doc.layout.render(&as_read).as_bytes() != read.bytes {
                out.notes.push(format!(
                    "{}: the rewrite keeps every value it does not change as written, but lays out the top level and the objects it edits anew (one member a line); the backup keeps the original layout",
                    doc.path.display()
                ));
            }
        }
    }
    out.files.push(FileChange {
        path: doc.path,
        original: doc.read.map(|r| r.bytes),
        text,
        new_mode: doc.new_mode,
        dir_mode: if doc.new_mode & 0o077 == 0 {
            0o700
        } else {
            0o755
        },
    });
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
