//! The names code sees: `<server_ident>__<tool_ident>`.
//!
//! Both parts are identifiers (`[A-Za-z0-9_]`, never starting with a digit, never a
//! Python or JavaScript reserved word), so the code generator can use them as module,
//! function and file names. A server identifier holds no `__` and neither starts nor ends
//! with `_`, so the first `__` of an exposed name is always the split: [`split`] gives the
//! server back from any exposed name, even one whose tools are not in the catalog.
//!
//! Collisions get `_2`, `_3`, ...: between servers in the order given (the config's,
//! sorted by name); between tools of one server, a tool whose name already is its
//! identifier keeps it, and the others are served in the order of their upstream names,
//! so the names do not depend on the order of `tools/list`.

use std::collections::HashSet;

// Reserved in TypeScript or Python: not usable as a function or module name there.
use crate::codegen::names::is_reserved;

/// `<server_ident>__<tool_ident>`.
pub fn exposed(server_ident: &str, tool_ident: &str) -> String {
    format!("{server_ident}__{tool_ident}")
}

/// An exposed name back to (server identifier, tool identifier).
pub fn split(name: &str) -> Option<(&str, &str)> {
    let (server, tool) = name.split_once("__")?;
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

/// Identifiers for the servers, in the order given; unique.
pub fn server_idents<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    let bases: Vec<String> = names.iter().map(|n| server_base(n.as_ref())).collect();
    unique(&bases, &(0..bases.len()).collect::<Vec<_>>())
}

/// Identifiers for one server's tools, index for index; unique within the server.
pub fn tool_idents<S: AsRef<str>>(tools: &[S]) -> Vec<String> {
    let bases: Vec<String> = tools.iter().map(|t| tool_base(t.as_ref())).collect();
    // Tools already spelt as identifiers first, then the rest by upstream name.
    let mut order: Vec<usize> = (0..tools.len()).collect();
    order.sort_by_key(|&i| {
        (
            bases[i] != tools[i].as_ref(),
            tools[i].as_ref().to_string(),
            i,
        )
    });
    unique(&bases, &order)
}

/// Gives each base its name, suffixing `_2`, `_3`, ... on collision, visiting in `order`.
fn unique(bases: &[String], order: &[usize]) -> Vec<String> {
    let mut taken: HashSet<String> = HashSet::new();
    let mut out = vec![String::new(); bases.len()];
    for &i in order {
        let base = &bases[i];
        let mut name = base.clone();
        let mut n = 2;
        while taken.contains(&name) {
            name = format!("{base}_{n}");
            n += 1;
        }
        taken.insert(name.clone());
        out[i] = name;
    }
    out
}

fn replace_invalid(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn server_base(name: &str) -> String {
    let replaced = replace_invalid(name);
    let mut collapsed = String::with_capacity(replaced.len());
    for c in replaced.chars() {
        if !(c == '_' && collapsed.ends_with('_')) {
            collapsed.push(c);
        }
    }
    let trimmed = collapsed.trim_matches('_');
    if trimmed.is_empty() {
        return "server".into();
    }
    // Leading `_` is allowed here: the split looks for `__`, which this never makes.
    guard_start(trimmed, "_")
}

fn tool_base(name: &str) -> String {
    let replaced = replace_invalid(name);
    if replaced.is_empty() {
        return "tool".into();
    }
    guard_start(&replaced, "_")
}

/// Prefixes identifiers that start with a digit or are reserved words.
fn guard_start(ident: &str, prefix: &str) -> String {
    if ident.starts_with(|c: char| c.is_ascii_digit()) || is_reserved(ident) {
        format!("{prefix}{ident}")
    } else {
        ident.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_ident(s: &str) -> bool {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && !is_reserved(s)
    }

    #[test]
    fn plain_names_are_kept() {
        assert_eq!(
            server_idents(&["filesystem", "time"]),
            ["filesystem", "time"]
        );
        assert_eq!(
            tool_idents(&["read_text_file", "get_current_time"]),
            ["read_text_file", "get_current_time"]
        );
        assert_eq!(
            exposed("filesystem", "read_text_file"),
            "filesystem__read_text_file"
        );
    }

    #[test]
    fn servers_are_sanitised_without_double_underscores() {
        let got = server_idents(&[
            "my-server",
            "a__b",
            "_x_",
            "1pass",
            "",
            "-.-",
            "ünï",
            "class",
        ]);
        assert_eq!(
            got,
            [
                "my_server",
                "a_b",
                "x",
                "_1pass",
                "server",
                "server_2",
                "n",
                "_class"
            ]
        );
        for s in &got {
            assert!(is_ident(s) && !s.contains("__") && !s.ends_with('_'), "{s}");
        }
    }

    #[test]
    fn tools_are_sanitised() {
        let got = tool_idents(&["get-sum", "2fa", "a.b c", "", "import", "__init__"]);
        assert_eq!(
            got,
            ["get_sum", "_2fa", "a_b_c", "tool", "_import", "__init__"]
        );
        assert!(got.iter().all(|t| is_ident(t)));
    }

    #[test]
    fn collisions_get_stable_suffixes() {
        // Between servers: config order.
        assert_eq!(
            server_idents(&["a-b", "a_b", "a.b"]),
            ["a_b", "a_b_2", "a_b_3"]
        );
        // Between tools: the exact identifier wins, the rest by upstream name, whatever the
        // order of tools/list.
        let one = tool_idents(&["x.y", "x_y", "x-y"]);
        assert_eq!(one, ["x_y_3", "x_y", "x_y_2"]);
        let other = tool_idents(&["x-y", "x.y", "x_y"]);
        assert_eq!(other, ["x_y_2", "x_y_3", "x_y"]);
        // A suffix never takes a name a tool already has.
        assert_eq!(
            tool_idents(&["a-b", "a_b", "a_b_2"]),
            ["a_b_3", "a_b", "a_b_2"]
        );
    }

    #[test]
    fn split_is_unambiguous() {
        let servers = server_idents(&["a_", "a", "_b", "x__y"]);
        for s in &servers {
            for t in tool_idents(&["__t", "_u", "v__w", "z"]) {
                assert_eq!(split(&exposed(s, &t)), Some((s.as_str(), t.as_str())));
            }
        }
        assert_eq!(split("nounderscores"), None);
        assert_eq!(split("__x"), None);
        assert_eq!(split("x__"), None);
    }
}
