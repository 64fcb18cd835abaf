//! Which upstream tools one execution may call.
//!
//! An allowlist is a set of patterns over catalog names (`<server>__<tool>`): an exact
//! name (`filesystem__read_text_file`), a glob with `*` matching any run of characters
//! (`filesystem__*`, `*__read_*`), or `*` alone for every tool. An empty allowlist allows
//! nothing. Patterns are checked when the allowlist is built, so a typo is an error the
//! caller sees rather than a silently useless rule.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("allowed_tools pattern {pattern:?} is invalid: {why}")]
    BadPattern { pattern: String, why: &'static str },
}

/// The tools one execution may call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<String>", into = "Vec<String>")]
pub struct AllowList {
    patterns: Vec<String>,
    /// Further lists a name must also match (see [`AllowList::narrowed_by`]).
    narrowing: Vec<Vec<String>>,
}

impl AllowList {
    /// Allows nothing.
    pub fn none() -> AllowList {
        AllowList::default()
    }

    /// Allows every tool.
    pub fn all() -> AllowList {
        AllowList {
            patterns: vec!["*".into()],
            narrowing: Vec::new(),
        }
    }

    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<AllowList, Error> {
        let mut out = Vec::with_capacity(patterns.len());
        for p in patterns {
            let p = p.as_ref();
            let bad = |why| Error::BadPattern {
                pattern: p.chars().take(100).collect(),
                why,
            };
            if p.is_empty() {
                return Err(bad("it is empty"));
            }
            if p.len() > 200 {
                return Err(bad("it is longer than 200 characters"));
            }
            if !p
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'*')
            {
                return Err(bad(
                    "only letters, digits, _ and * are allowed (names look like server__tool)",
                ));
            }
            out.push(p.to_string());
        }
        Ok(AllowList {
            patterns: out,
            narrowing: Vec::new(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether `name` matches one of the patterns (and of every narrowing list).
    pub fn allows(&self, name: &str) -> bool {
        std::iter::once(&self.patterns)
            .chain(&self.narrowing)
            .all(|list| list.iter().any(|p| glob_match(p, name)))
    }

    /// What both lists allow: a request's `allowed_tools` can only narrow the server's.
    pub fn narrowed_by(mut self, other: &AllowList) -> AllowList {
        self.narrowing.push(other.patterns.clone());
        self.narrowing.extend(other.narrowing.iter().cloned());
        self
    }
}

impl TryFrom<Vec<String>> for AllowList {
    type Error = Error;
    fn try_from(v: Vec<String>) -> Result<Self, Error> {
        AllowList::new(&v)
    }
}

impl From<AllowList> for Vec<String> {
    fn from(a: AllowList) -> Vec<String> {
        a.patterns
    }
}

/// `*` matches any run of characters (including none); everything else matches itself.
/// Iterative with one backtrack point, so it is linear-ish and never recurses.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_allows_nothing_and_star_everything() {
        assert!(!AllowList::none().allows("filesystem__read_text_file"));
        assert!(AllowList::all().allows("filesystem__read_text_file"));
        assert!(AllowList::all().allows(""));
    }

    #[test]
    fn exact_names_and_server_globs() {
        let a = AllowList::new(&["filesystem__*", "memory__read_graph"]).unwrap();
        assert!(a.allows("filesystem__read_text_file"));
        assert!(a.allows("filesystem__"));
        assert!(a.allows("memory__read_graph"));
        assert!(!a.allows("memory__create_entities"));
        assert!(!a.allows("memory__read_graph_x"));
        assert!(!a.allows("filesystems__read"));
        assert!(!a.allows("xfilesystem__read"));
    }

    #[test]
    fn stars_anywhere() {
        let a = AllowList::new(&["*__read_*"]).unwrap();
        assert!(a.allows("filesystem__read_text_file"));
        assert!(a.allows("memory__read_graph"));
        assert!(!a.allows("memory__create_entities"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(glob_match("a*b*c", "abc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("**", "x"));
        // Pathological backtracking stays cheap.
        let long = "a".repeat(10_000);
        assert!(!glob_match("*a*a*a*a*a*b", &long));
    }

    #[test]
    fn a_request_can_only_narrow_the_server_list() {
        let server = AllowList::new(&["filesystem__*", "time__*"]).unwrap();
        let asked = AllowList::new(&["filesystem__read_*", "memory__*"]).unwrap();
        let both = server.clone().narrowed_by(&asked);
        assert!(both.allows("filesystem__read_text_file"));
        assert!(!both.allows("filesystem__write_file"));
        assert!(
            !both.allows("memory__read_graph"),
            "the request cannot widen"
        );
        assert!(!both.allows("time__get_current_time"));
        assert!(!server.narrowed_by(&AllowList::none()).allows("time__x"));
    }

    #[test]
    fn bad_patterns_are_refused_with_the_reason() {
        for (p, why) in [
            ("", "empty"),
            ("filesystem/read", "only letters"),
            ("a?b", "only letters"),
            ("fs__[ab]", "only letters"),
        ] {
            let err = AllowList::new(&[p]).unwrap_err();
            assert!(err.to_string().contains(why), "{p}: {err}");
        }
        assert!(AllowList::new(&["x".repeat(201)]).is_err());
    }

    #[test]
    fn deserializes_from_a_list_and_checks_it() {
        let a: AllowList = serde_json::from_str(r#"["time__*"]"#).unwrap();
        assert!(a.allows("time__get_current_time"));
        assert!(serde_json::from_str::<AllowList>(r#"["bad name"]"#).is_err());
    }
}
