//! JSON Schema → TypeScript types.
//!
//! A tool file declares its input type, its output type and one named type per local
//! `$ref` target. Each named type is rendered twice: once to discover the references (and
//! name their targets), once for real. In between, the references that would make a type
//! alias circular (`type A = B | null; type B = A & {..}`: references reached without
//! passing through an object member, array element or tuple element, where TypeScript
//! defers them) are cut where a depth-first search finds a cycle, and rendered `unknown`.
//!
//! Whatever the schema, the output is valid TypeScript: unknown keywords are ignored, and
//! anything not understood (or nested deeper than [`MAX_DEPTH`]) becomes `unknown`.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::codegen::escape::{ts_doc, ts_string};
use crate::codegen::names::{is_ts_property_ident, pascal_case, Namer};
use crate::codegen::schema::{
    canonical, description, effective_types, literal_values, pointer_name, properties, reference,
    required, resolve, subschemas, MAX_DEPTH,
};

/// How tightly a rendered type binds, to know when it needs parentheses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Prec {
    Union,
    Intersection,
    Atom,
}

#[derive(Debug, Clone)]
struct Ty {
    text: String,
    prec: Prec,
}

impl Ty {
    fn atom(text: impl Into<String>) -> Ty {
        Ty {
            text: text.into(),
            prec: Prec::Atom,
        }
    }

    fn unknown() -> Ty {
        Ty::atom("unknown")
    }

    /// The text, parenthesised when it binds less tightly than `min`.
    fn at(&self, min: Prec) -> String {
        if self.prec < min {
            format!("({})", self.text)
        } else {
            self.text.clone()
        }
    }
}

fn union(members: Vec<Ty>) -> Ty {
    let mut kept: Vec<Ty> = Vec::new();
    let mut seen = HashSet::new();
    for m in members {
        if m.text == "unknown" {
            return Ty::unknown();
        }
        if m.text != "never" && seen.insert(m.text.clone()) {
            kept.push(m);
        }
    }
    match kept.len() {
        0 => Ty::atom("never"),
        1 => kept.remove(0),
        _ => Ty {
            text: kept
                .iter()
                .map(|k| k.at(Prec::Intersection))
                .collect::<Vec<_>>()
                .join(" | "),
            prec: Prec::Union,
        },
    }
}

fn intersection(parts: Vec<Ty>) -> Ty {
    let mut kept: Vec<Ty> = Vec::new();
    let mut seen = HashSet::new();
    for p in parts {
        if p.text == "never" {
            return Ty::atom("never");
        }
        if p.text != "unknown" && seen.insert(p.text.clone()) {
            kept.push(p);
        }
    }
    match kept.len() {
        0 => Ty::unknown(),
        1 => kept.remove(0),
        _ => Ty {
            text: kept
                .iter()
                .map(|k| k.at(Prec::Atom))
                .collect::<Vec<_>>()
                .join(" & "),
            prec: Prec::Intersection,
        },
    }
}

fn pad(indent: usize) -> String {
    "  ".repeat(indent)
}

/// A property name as written in a type: bare when it is an identifier, else quoted.
fn property_key(name: &str) -> String {
    if is_ts_property_ident(name) {
        name.to_string()
    } else {
        ts_string(name)
    }
}

/// The type whose only value is `value`.
fn literal(value: &Value, depth: usize) -> Ty {
    if depth > MAX_DEPTH {
        return Ty::unknown();
    }
    match value {
        Value::Null => Ty::atom("null"),
        Value::Bool(b) => Ty::atom(b.to_string()),
        Value::Number(n) => {
            let text = n.to_string();
            let prec = if text.starts_with('-') {
                Prec::Intersection
            } else {
                Prec::Atom
            };
            Ty { text, prec }
        }
        Value::String(s) => Ty::atom(ts_string(s)),
        Value::Array(items) => Ty::atom(format!(
            "[{}]",
            items
                .iter()
                .map(|v| literal(v, depth + 1).text)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let members: Vec<String> = keys
                .iter()
                .map(|k| {
                    format!(
                        "{}: {};",
                        property_key(k),
                        literal(&map[*k], depth + 1).text
                    )
                })
                .collect();
            Ty::atom(format!("{{ {} }}", members.join(" ")))
        }
    }
}

/// A named type: the input or output root of a tool, or the target of a `$ref`.
struct Target<'a> {
    document: usize,
    schema: &'a Value,
    name: String,
    doc: String,
}

/// A root schema to declare under `name`, with `doc` before its declaration.
pub struct Root<'a> {
    pub schema: &'a Value,
    pub name: String,
    pub doc: String,
}

/// One declared type of a tool file.
pub struct Decl {
    pub name: String,
    pub text: String,
    /// `{}` is a value of it: an interface without required members, or `unknown`.
    pub accepts_empty: bool,
}

struct Graph<'a> {
    documents: Vec<&'a Value>,
    targets: Vec<Target<'a>>,
    index: HashMap<(usize, String), usize>,
    discovering: bool,
    /// References outside any object member / array element, as (from, to).
    bare_edges: Vec<(usize, usize)>,
    /// The bare references that close a cycle: rendered as `unknown`.
    broken: HashSet<(usize, usize)>,
    /// One line, no doc comments (see [`inline`]).
    compact: bool,
}

struct Conv<'g, 'a> {
    graph: &'g mut Graph<'a>,
    namer: &'g mut Namer,
    from: usize,
}

/// Whether a schema is declared as an `interface` (a plain object type).
fn is_interface(schema: &Value) -> bool {
    schema.is_object()
        && reference(schema).is_none()
        && literal_values(schema).is_none()
        && ["anyOf", "oneOf", "allOf"]
            .iter()
            .all(|k| schema.get(k).is_none())
        && effective_types(schema) == ["object"]
}

impl<'a> Conv<'_, 'a> {
    fn document(&self) -> usize {
        self.graph.targets[self.from].document
    }

    fn ty(&mut self, schema: &'a Value, depth: usize, guarded: bool, indent: usize) -> Ty {
        if depth > MAX_DEPTH {
            return Ty::unknown();
        }
        match schema {
            Value::Bool(false) => return Ty::atom("never"),
            Value::Object(_) => {}
            _ => return Ty::unknown(),
        }
        let mut parts = Vec::new();
        if let Some(r) = reference(schema) {
            parts.push(self.reference(r, guarded));
        }
        if let Some(values) = literal_values(schema) {
            parts.push(union(
                values.into_iter().map(|v| literal(v, depth + 1)).collect(),
            ));
        } else {
            let types = effective_types(schema);
            if !types.is_empty() {
                let members = types
                    .into_iter()
                    .map(|t| self.of_type(t, schema, depth, indent))
                    .collect();
                parts.push(union(members));
            }
        }
        for keyword in ["anyOf", "oneOf"] {
            let subs = subschemas(schema, keyword);
            if !subs.is_empty() {
                let members = subs
                    .iter()
                    .map(|s| self.ty(s, depth + 1, guarded, indent))
                    .collect();
                parts.push(union(members));
            }
        }
        for s in subschemas(schema, "allOf") {
            parts.push(self.ty(s, depth + 1, guarded, indent));
        }
        intersection(parts)
    }

    fn of_type(&mut self, t: &str, schema: &'a Value, depth: usize, indent: usize) -> Ty {
        match t {
            "string" => Ty::atom("string"),
            "number" | "integer" => Ty::atom("number"),
            "boolean" => Ty::atom("boolean"),
            "null" => Ty::atom("null"),
            "object" => {
                let (members, _) = self.members(schema, depth, indent + 1);
                if self.graph.compact {
                    Ty::atom(format!("{{ {} }}", members.join("; ")))
                } else {
                    Ty::atom(format!("{{\n{}\n{}}}", members.join("\n"), pad(indent)))
                }
            }
            "array" => self.array(schema, depth, indent),
            _ => Ty::unknown(),
        }
    }

    /// The members of an object type at `indent`, and how many are required. In compact
    /// mode a member is just `key: type`, without doc, indentation or `;`.
    fn members(&mut self, schema: &'a Value, depth: usize, indent: usize) -> (Vec<String>, usize) {
        let props = properties(schema);
        let required = required(schema);
        // Sets, not scans: a schema may list thousands of properties and required names.
        let required_set: HashSet<&str> = required.iter().copied().collect();
        let prop_names: HashSet<&str> = props.iter().map(|(n, _)| *n).collect();
        let compact = self.graph.compact;
        let p = if compact { String::new() } else { pad(indent) };
        let end = if compact { "" } else { ";" };
        let mut out = Vec::new();
        for (name, sub) in &props {
            let t = self.ty(sub, depth + 1, true, indent);
            let optional = if required_set.contains(name) { "" } else { "?" };
            let doc = if compact {
                String::new()
            } else {
                ts_doc(&member_doc(sub), &p)
            };
            out.push(format!(
                "{doc}{p}{}{optional}: {}{end}",
                property_key(name),
                t.text
            ));
        }
        for name in required.iter().filter(|r| !prop_names.contains(*r)) {
            out.push(format!("{p}{}: unknown{end}", property_key(name)));
        }
        let count = required.len();
        let index = match schema.get("additionalProperties") {
            Some(Value::Bool(false)) => out.is_empty().then(|| "never".to_string()),
            Some(extra @ Value::Object(_)) if out.is_empty() => {
                Some(self.ty(extra, depth + 1, true, indent).text)
            }
            Some(_) => Some("unknown".to_string()),
            None if out.is_empty() || schema.get("patternProperties").is_some() => {
                Some("unknown".to_string())
            }
            None => None,
        };
        if let Some(index) = index {
            out.push(format!("{p}[key: string]: {index}{end}"));
        }
        (out, count)
    }

    /// An array or tuple; TypeScript defers element types, so references there are guarded.
    fn array(&mut self, schema: &'a Value, depth: usize, indent: usize) -> Ty {
        let (prefix, rest) = match (schema.get("prefixItems"), schema.get("items")) {
            (Some(Value::Array(prefix)), rest) => (Some(prefix), rest),
            (_, Some(Value::Array(prefix))) => (Some(prefix), schema.get("additionalItems")),
            (_, rest) => (None, rest),
        };
        let element =
            |conv: &mut Self, s: &'a Value| conv.ty(s, depth + 1, true, indent).at(Prec::Atom);
        let rest = match rest {
            Some(Value::Bool(false)) => None,
            Some(s) => Some(element(self, s)),
            None => Some("unknown".to_string()),
        };
        let Some(prefix) = prefix else {
            return Ty::atom(rest.map_or("[]".to_string(), |r| format!("{r}[]")));
        };
        let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let mut elements: Vec<String> = prefix
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let optional = if (i as u64) < min { "" } else { "?" };
                format!("{}{optional}", element(self, s))
            })
            .collect();
        if let Some(r) = rest {
            elements.push(format!("...{r}[]"));
        }
        Ty::atom(format!("[{}]", elements.join(", ")))
    }

    fn reference(&mut self, r: &str, guarded: bool) -> Ty {
        let document = self.document();
        let Some(pointer) = canonical(r) else {
            return Ty::unknown();
        };
        let key = (document, pointer);
        let to = match self.graph.index.get(&key) {
            Some(&to) => to,
            None if self.graph.discovering => {
                let Some(schema) = resolve(self.graph.documents[document], r) else {
                    return Ty::unknown();
                };
                let name = self.namer.claim(&pascal_case(&pointer_name(&key.1)));
                let doc = description(schema).unwrap_or_default().to_string();
                self.graph.targets.push(Target {
                    document,
                    schema,
                    name,
                    doc,
                });
                self.graph.index.insert(key, self.graph.targets.len() - 1);
                self.graph.targets.len() - 1
            }
            None => return Ty::unknown(),
        };
        if !guarded {
            if self.graph.discovering {
                self.graph.bare_edges.push((self.from, to));
            } else if self.graph.broken.contains(&(self.from, to)) {
                return Ty::unknown();
            }
        }
        Ty::atom(self.graph.targets[to].name.clone())
    }

    fn declaration(&mut self) -> Decl {
        let target = &self.graph.targets[self.from];
        let (schema, name) = (target.schema, target.name.clone());
        let doc = ts_doc(&target.doc, "");
        if is_interface(schema) {
            let (members, required) = self.members(schema, 0, 1);
            let text = format!(
                "{doc}export interface {name} {{\n{}\n}}\n",
                members.join("\n")
            );
            Decl {
                name,
                text,
                accepts_empty: required == 0,
            }
        } else {
            let t = self.ty(schema, 0, false, 0);
            let text = format!("{doc}export type {name} = {};\n", t.text);
            Decl {
                name,
                text,
                accepts_empty: t.text == "unknown",
            }
        }
    }
}

/// The doc comment of a property: its description and its default.
fn member_doc(schema: &Value) -> String {
    let mut doc = description(schema).unwrap_or_default().to_string();
    if let Some(default) = schema.get("default") {
        if !doc.is_empty() {
            doc.push('\n');
        }
        doc.push_str(&format!("@default {default}"));
    }
    doc
}

/// The bare references to break so that no type alias refers to itself: the back edges
/// of a depth-first search (in target order), which leave the rest of the graph acyclic.
fn back_edges(targets: usize, edges: &[(usize, usize)]) -> HashSet<(usize, usize)> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        New,
        OnStack,
        Done,
    }
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); targets];
    for &(from, to) in edges {
        next[from].push(to);
    }
    let mut state = vec![State::New; targets];
    let mut broken = HashSet::new();
    for start in 0..targets {
        if state[start] != State::New {
            continue;
        }
        state[start] = State::OnStack;
        // (node, how many of its edges have been followed)
        let mut stack = vec![(start, 0)];
        while let Some((node, followed)) = stack.last_mut() {
            let node = *node;
            let Some(&to) = next[node].get(*followed) else {
                state[node] = State::Done;
                stack.pop();
                continue;
            };
            *followed += 1;
            match state[to] {
                State::New => {
                    state[to] = State::OnStack;
                    stack.push((to, 0));
                }
                State::OnStack => {
                    broken.insert((node, to));
                }
                State::Done => {}
            }
        }
    }
    broken
}

/// Declares `roots` (in order) and every type they reference (sorted by name after
/// them). Names of referenced types are claimed from `namer`; the roots' names must
/// already be claimed there.
pub fn declare(roots: &[Root<'_>], namer: &mut Namer) -> Vec<Decl> {
    let mut graph = Graph {
        documents: roots.iter().map(|r| r.schema).collect(),
        targets: Vec::new(),
        index: HashMap::new(),
        discovering: true,
        bare_edges: Vec::new(),
        broken: HashSet::new(),
        compact: false,
    };
    for (i, root) in roots.iter().enumerate() {
        let own = root
            .schema
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let doc = [root.doc.as_str(), own]
            .iter()
            .filter(|d| !d.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("\n\n");
        graph.targets.push(Target {
            document: i,
            schema: root.schema,
            name: root.name.clone(),
            doc,
        });
        graph.index.insert((i, String::new()), i);
    }
    let mut from = 0;
    while from < graph.targets.len() {
        Conv {
            graph: &mut graph,
            namer,
            from,
        }
        .declaration();
        from += 1;
    }
    graph.discovering = false;
    graph.broken = back_edges(graph.targets.len(), &graph.bare_edges);
    let mut decls: Vec<Decl> = (0..graph.targets.len())
        .map(|from| {
            Conv {
                graph: &mut graph,
                namer,
                from,
            }
            .declaration()
        })
        .collect();
    decls[roots.len()..].sort_by(|a, b| a.name.cmp(&b.name));
    decls
}

/// A schema's type as one line of TypeScript without doc comments, for summaries:
/// `{ path: string; head?: number }`. `$ref` targets appear by name (undeclared); the
/// document itself is `root_name`.
pub struct Inline {
    pub text: String,
    /// `{}` is a value of it, as [`Decl::accepts_empty`].
    pub accepts_empty: bool,
}

/// See [`Inline`].
pub fn inline(schema: &Value, root_name: &str) -> Inline {
    let mut namer = Namer::new("", &[]);
    let name = namer.claim(root_name);
    let mut graph = Graph {
        documents: vec![schema],
        targets: vec![Target {
            document: 0,
            schema,
            name,
            doc: String::new(),
        }],
        index: HashMap::from([((0, String::new()), 0)]),
        discovering: true,
        bare_edges: Vec::new(),
        broken: HashSet::new(),
        compact: true,
    };
    let mut conv = Conv {
        graph: &mut graph,
        namer: &mut namer,
        from: 0,
    };
    let text = conv.ty(schema, 0, true, 0).text;
    let accepts_empty = if is_interface(schema) {
        required(schema).is_empty()
    } else {
        text == "unknown"
    };
    Inline {
        text,
        accepts_empty,
    }
}

#[cfg(test)]
#[path = "types_tests.rs"]
mod tests;
