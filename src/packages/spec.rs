//! What a call may ask to install, checked before anything runs: Python requirement
//! strings (a PEP 508 subset: a name, extras, version specifiers; no URLs, paths, options
//! or markers), and npm/jsr specifiers for TypeScript (`npm:name@range`,
//! `jsr:@scope/name@range`), the latter also collected from the code's own imports.
//!
//! A set is normalised (names lower-cased, `_`/`.` runs folded to `-` as PEP 503 does,
//! whitespace dropped, sorted, duplicates removed) so the same request always has the
//! same key, whatever its spelling.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::runtime::Language;

/// Packages one call may ask for.
pub const MAX_PACKAGES: usize = 32;
/// The longest specifier accepted.
pub const MAX_SPEC_BYTES: usize = 200;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("packages: {spec:?} is not a package {what}: {why}")]
    Bad {
        spec: String,
        what: &'static str,
        why: &'static str,
    },
    #[error("packages: at most {MAX_PACKAGES} per call ({got} given)")]
    TooMany { got: usize },
    #[error("packages: {spec:?} is a TypeScript specifier (npm:/jsr:); execute_python takes Python requirements such as \"pandas==2.2.*\"")]
    WrongLanguage { spec: String },
}

/// One requested package, normalised.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Spec {
    /// The whole specifier as the installer gets it (`scikit-learn[alldeps]>=1.4`,
    /// `npm:lodash@4`, `jsr:@std/path@1`); sets sort by it.
    pub text: String,
    /// The normalised name (`scikit-learn`, `@std/path`, `lodash`): what allow and deny
    /// lists match.
    pub name: String,
}

impl Spec {
    /// Whether the specifier names one version exactly (`six==1.17.0`, `npm:lodash@4.17.21`),
    /// so what it resolves to cannot change (a dependency's range can, but the request
    /// pinned what it asked for).
    pub fn is_exact(&self) -> bool {
        if let Some(rest) = self
            .text
            .strip_prefix("npm:")
            .or_else(|| self.text.strip_prefix("jsr:"))
        {
            // After the (scoped) name: `@1.2.3` or `@1.2.3-rc.1`.
            let after_name = rest.strip_prefix('@').unwrap_or(rest);
            let Some((_, version)) = after_name.split_once('@') else {
                return false;
            };
            // One version, not a range: `1.2.3`, `1.2.3-rc.1`, `1.2.3+build` and nothing
            // else (`1.2.3-0 || >=4` and `1.0.0 - 2.0.0` are ranges).
            if !version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'))
            {
                return false;
            }
            let core = version.split(['-', '+']).next().unwrap_or_default();
            let parts: Vec<&str> = core.split('.').collect();
            return parts.len() == 3
                && parts
                    .iter()
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
        }
        // Python: `name[extras]==1.2.3` or `===1.2.3`, one clause, no wildcard.
        let after_name = &self.text[self.name.len().min(self.text.len())..];
        let rest = match after_name.strip_prefix('[') {
            Some(r) => r.split_once(']').map_or("", |(_, r)| r),
            None => after_name,
        };
        let version = rest.strip_prefix("===").or_else(|| rest.strip_prefix("=="));
        version.is_some_and(|v| !v.is_empty() && !v.contains(['*', ',', '=']))
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A normalised, sorted, de-duplicated set of packages for one language.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PackageSet {
    pub language: Language,
    pub specs: Vec<Spec>,
}

impl PackageSet {
    /// Checks and normalises `asked` (and, for TypeScript, the `npm:`/`jsr:` imports of
    /// `code`). An empty set is `None`.
    pub fn parse(
        language: Language,
        asked: &[String],
        code: &str,
    ) -> Result<Option<PackageSet>, Error> {
        let mut specs = Vec::new();
        for text in asked {
            specs.push(match language {
                Language::Python => python(text)?,
                Language::TypeScript => javascript(text)?,
            });
        }
        if language == Language::TypeScript {
            for text in imports_in(code) {
                specs.push(javascript(&text)?);
            }
        }
        specs.sort();
        specs.dedup();
        if specs.len() > MAX_PACKAGES {
            return Err(Error::TooMany { got: specs.len() });
        }
        Ok((!specs.is_empty()).then_some(PackageSet { language, specs }))
    }

    /// A stable digest of the request (language and normalised specifiers).
    pub fn key(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.language.name().as_bytes());
        for s in &self.specs {
            h.update([0u8]);
            h.update(s.text.as_bytes());
        }
        crate::rootfs::manifest::hex(&h.finalize())
    }

    /// The set without the specifiers `keep` says are already there (`None`: nothing
    /// left to install).
    pub fn without(self, satisfied: impl Fn(&Spec) -> bool) -> Option<PackageSet> {
        let specs: Vec<Spec> = self.specs.into_iter().filter(|s| !satisfied(s)).collect();
        (!specs.is_empty()).then_some(PackageSet {
            language: self.language,
            specs,
        })
    }

    /// Whether every specifier names one version exactly.
    pub fn is_pinned(&self) -> bool {
        self.specs.iter().all(Spec::is_exact)
    }

    /// The specifiers, as the installer takes them.
    pub fn texts(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.text.clone()).collect()
    }
}

/// PEP 503 normalisation: lower case, runs of `-`, `_`, `.` become one `-`.
pub fn normalise_python_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
            continue;
        }
        if sep && !out.is_empty() {
            out.push('-');
        }
        sep = false;
        out.push(c.to_ascii_lowercase());
    }
    out
}

fn bad(spec: &str, what: &'static str, why: &'static str) -> Error {
    Error::Bad {
        spec: spec.chars().take(MAX_SPEC_BYTES).collect(),
        what,
        why,
    }
}

/// `name[extra,...] <specifiers>`: specifiers made only of version characters, so no
/// URL (`@ https://...`), path, option (`--index-url`), marker (`; python_version`) or
/// hash can ride along.
fn python(text: &str) -> Result<Spec, Error> {
    const WHAT: &str = "requirement";
    if text.len() > MAX_SPEC_BYTES {
        return Err(bad(text, WHAT, "it is longer than 200 characters"));
    }
    if text.trim_start().starts_with("npm:") || text.trim_start().starts_with("jsr:") {
        return Err(Error::WrongLanguage {
            spec: text.chars().take(MAX_SPEC_BYTES).collect(),
        });
    }
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(bad(text, WHAT, "it is empty"));
    }
    if trimmed.starts_with('-') {
        return Err(bad(text, WHAT, "options are not accepted"));
    }
    // The name and the extras are taken as written (no whitespace inside them); the
    // version specifiers may be spaced (`pandas == 2.2.*`).
    let name_end = trimmed
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        .unwrap_or(trimmed.len());
    let name = &trimmed[..name_end];
    let after_name = trimmed[name_end..].trim_start();
    let extras_end = match after_name.strip_prefix('[') {
        Some(inner) => match inner.find(']') {
            Some(i) if !inner[..i].contains(char::is_whitespace) => i + 2,
            Some(_) => return Err(bad(text, WHAT, "extras are names separated by commas")),
            None => return Err(bad(text, WHAT, "an extra's [ is not closed")),
        },
        None => 0,
    };
    let compact: String = format!(
        "{name}{}{}",
        &after_name[..extras_end],
        after_name[extras_end..]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
    );
    if name.is_empty()
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(bad(
            text,
            WHAT,
            "a name starts and ends with a letter or digit (e.g. pandas==2.2.*)",
        ));
    }
    let mut rest = &compact[name_end..];
    let mut extras = String::new();
    if let Some(after) = rest.strip_prefix('[') {
        let close = after
            .find(']')
            .ok_or_else(|| bad(text, WHAT, "an extra's [ is not closed"))?;
        let list = &after[..close];
        if list.is_empty()
            || !list.split(',').all(|e| {
                !e.is_empty()
                    && e.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            })
        {
            return Err(bad(text, WHAT, "extras are names separated by commas"));
        }
        let mut names: Vec<String> = list.split(',').map(normalise_python_name).collect();
        names.sort();
        names.dedup();
        extras = format!("[{}]", names.join(","));
        rest = &after[close + 1..];
    }
    if rest.contains('@') || rest.contains(';') || rest.contains('/') || rest.contains(':') {
        return Err(bad(
            text,
            WHAT,
            "only version specifiers may follow the name (no URLs, paths or markers)",
        ));
    }
    if !rest.is_empty() {
        for clause in rest.split(',') {
            let version = clause.trim_start_matches(['=', '!', '<', '>', '~']);
            let op = &clause[..clause.len() - version.len()];
            if !matches!(op, "==" | "!=" | "<=" | ">=" | "<" | ">" | "~=" | "===")
                || version.is_empty()
                || !version
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '*' | '+' | '-' | '_'))
            {
                return Err(bad(
                    text,
                    WHAT,
                    "version specifiers look like ==2.2.*, >=1.4,<2 or ~=3.1",
                ));
            }
        }
    }
    let name = normalise_python_name(name);
    Ok(Spec {
        text: format!("{name}{extras}{rest}"),
        name,
    })
}

/// `npm:name@range`, `npm:@scope/name@range`, `jsr:@scope/name@range` (the range
/// optional); a bare name means npm.
fn javascript(text: &str) -> Result<Spec, Error> {
    const WHAT: &str = "specifier";
    if text.len() > MAX_SPEC_BYTES {
        return Err(bad(text, WHAT, "it is longer than 200 characters"));
    }
    let text = text.trim();
    let (registry, rest) = match text.split_once(':') {
        Some(("npm", r)) => ("npm", r),
        Some(("jsr", r)) => ("jsr", r),
        Some(_) => {
            return Err(bad(
                text,
                WHAT,
                "only npm: and jsr: packages can be installed",
            ))
        }
        None => ("npm", text),
    };
    // A path inside the package (`npm:preact@10/hooks`) is the import's business: the
    // package is what is installed.
    let (scope, after_scope) = match rest.strip_prefix('@') {
        Some(r) => {
            let (scope, tail) = r
                .split_once('/')
                .ok_or_else(|| bad(text, WHAT, "a scoped name is @scope/name"))?;
            (Some(scope), tail)
        }
        None if registry == "jsr" => {
            return Err(bad(text, WHAT, "jsr packages are @scope/name"));
        }
        None => (None, rest),
    };
    let base = after_scope.split('/').next().unwrap_or_default();
    let (name, range) = match base.split_once('@') {
        Some((n, r)) => (n, Some(r)),
        None => (base, None),
    };
    let part_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 100
            && s.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
            })
            && !s.starts_with('.')
            && !s.starts_with('_')
    };
    if !part_ok(name) || scope.is_some_and(|s| !part_ok(s)) {
        return Err(bad(
            text,
            WHAT,
            "names are lower-case letters, digits, - _ . (e.g. npm:lodash@4, jsr:@std/path)",
        ));
    }
    if let Some(r) = range {
        if r.is_empty()
            || !r.chars().all(|c| {
                c.is_ascii_alphanumeric()
                    || matches!(
                        c,
                        '.' | '*' | '^' | '~' | '<' | '>' | '=' | '-' | '+' | '|' | ' '
                    )
            })
        {
            return Err(bad(
                text,
                WHAT,
                "a version range looks like 4, ^4.17, ~1.2.3 or 1.x",
            ));
        }
    }
    let full = match scope {
        Some(s) => format!("@{s}/{name}"),
        None => name.to_string(),
    };
    Ok(Spec {
        text: match range {
            Some(r) => format!("{registry}:{full}@{}", r.trim()),
            None => format!("{registry}:{full}"),
        },
        name: full,
    })
}

/// The `npm:`/`jsr:` specifiers of a program's static and dynamic imports and exports
/// (`from "npm:x"`, `import("jsr:@a/b")`, `import "npm:x"`), without the path inside the
/// package.
pub fn imports_in(code: &str) -> Vec<String> {
    static PATTERN: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = PATTERN.get_or_init(|| {
        regex::Regex::new(r#"(?:\bfrom|\bimport)\s*\(?\s*["']((?:npm|jsr):[^"'\s]{1,200})["']"#)
            .expect("a valid pattern")
    });
    let mut out: Vec<String> = re.captures_iter(code).map(|c| package_of(&c[1])).collect();
    out.sort();
    out.dedup();
    out
}

/// `npm:@scope/name@1/sub/path` → `npm:@scope/name@1`.
fn package_of(specifier: &str) -> String {
    let (registry, rest) = specifier.split_once(':').unwrap_or(("npm", specifier));
    let keep = if rest.starts_with('@') { 2 } else { 1 };
    let package: Vec<&str> = rest.splitn(keep + 1, '/').take(keep).collect();
    format!("{registry}:{}", package.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(asked: &[&str]) -> Result<Option<PackageSet>, Error> {
        let asked: Vec<String> = asked.iter().map(|s| s.to_string()).collect();
        PackageSet::parse(Language::Python, &asked, "")
    }

    fn texts(set: Option<PackageSet>) -> Vec<String> {
        set.map(|s| s.texts()).unwrap_or_default()
    }

    #[test]
    fn exact_pins_are_told_from_ranges() {
        for exact in [
            &["six==1.17.0"][..],
            &["Six == 1.17.0", "attrs[tests]===23.1.0"],
        ] {
            assert!(py(exact).unwrap().unwrap().is_pinned(), "{exact:?}");
        }
        for loose in [
            &["six"][..],
            &["six==1.*"],
            &["six>=1.16"],
            &["six==1.17.0,!=1.16"],
            &["six==1.17.0", "rich"],
            &["attrs[tests]"],
        ] {
            assert!(!py(loose).unwrap().unwrap().is_pinned(), "{loose:?}");
        }
        let ts = |asked: &[&str]| {
            let asked: Vec<String> = asked.iter().map(|s| s.to_string()).collect();
            PackageSet::parse(Language::TypeScript, &asked, "")
                .unwrap()
                .unwrap()
                .is_pinned()
        };
        assert!(ts(&["npm:lodash@4.17.21", "npm:@types/node@22.1.0-rc.1"]));
        assert!(ts(&["jsr:@std/path@1.0.8"]));
        for loose in [
            "npm:lodash",
            "npm:lodash@4",
            "npm:lodash@^4.17.21",
            "npm:@s/n@1.x.0",
            "npm:lodash@4.17.21-0 || >=4",
            "npm:x@1.0.0-0 - 9.9.9",
        ] {
            assert!(!ts(&[loose]), "{loose}");
        }
    }

    #[test]
    fn python_requirements_are_normalised_and_sorted() {
        let set = py(&[
            "Rich",
            "pandas == 2.2.*",
            "Scikit_Learn[AllDeps,alldeps]>=1.4,<2",
            "rich",
        ])
        .unwrap();
        assert_eq!(
            texts(set),
            ["pandas==2.2.*", "rich", "scikit-learn[alldeps]>=1.4,<2"]
        );
        assert_eq!(normalise_python_name("Foo__Bar.baz"), "foo-bar-baz");
        assert!(py(&[]).unwrap().is_none());
    }

    #[test]
    fn the_same_set_has_the_same_key_whatever_its_spelling() {
        let a = py(&["numpy", "Pandas"]).unwrap().unwrap();
        let b = py(&["pandas", "NumPy", "numpy"]).unwrap().unwrap();
        assert_eq!(a.key(), b.key());
        let c = py(&["pandas"]).unwrap().unwrap();
        assert_ne!(a.key(), c.key());
        let ts = PackageSet::parse(Language::TypeScript, &["npm:pandas".into()], "")
            .unwrap()
            .unwrap();
        assert_ne!(ts.key(), c.key(), "the language is part of the key");
    }

    #[test]
    fn anything_but_a_name_and_versions_is_refused() {
        for bad in [
            "",
            "--index-url=https://evil.example/simple",
            "-e .",
            "pkg @ https://evil.example/pkg.whl",
            "pkg@https://evil.example/x",
            "./local/path",
            "/abs/path.whl",
            "pkg; python_version<'4'",
            "pkg==1.0 --hash=sha256:00",
            "pkg===",
            "pkg=>1",
            "pkg[",
            "pkg[a b]",
            "-pkg",
            "pkg-",
            "git+https://evil.example/x.git",
            "file:///etc/passwd",
        ] {
            assert!(py(&[bad]).is_err(), "{bad:?} was accepted");
        }
        let long = "a".repeat(300);
        assert!(py(&[&long]).is_err());
        let many: Vec<String> = (0..40).map(|i| format!("p{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(matches!(py(&many), Err(Error::TooMany { .. })));
        assert!(matches!(
            py(&["npm:lodash"]),
            Err(Error::WrongLanguage { .. })
        ));
    }

    #[test]
    fn javascript_specifiers_and_imports() {
        let asked = vec![
            "npm:Lodash@4".to_string(),
            "jsr:@std/path@1".into(),
            "chalk".into(),
        ];
        assert!(
            PackageSet::parse(Language::TypeScript, &asked, "").is_err(),
            "upper case"
        );
        let asked = vec![
            "npm:lodash@4".to_string(),
            "jsr:@std/path@^1.0".into(),
            "chalk".into(),
        ];
        let code = r#"
import _ from "npm:lodash@4/fp";
import { join } from 'jsr:@std/path@^1.0';
const m = await import("npm:@scope/pkg@1.2.3/sub/file.js");
export * from "npm:zod";
import x from "./local.ts";
"#;
        let set = PackageSet::parse(Language::TypeScript, &asked, code)
            .unwrap()
            .unwrap();
        assert_eq!(
            set.texts(),
            [
                "jsr:@std/path@^1.0",
                "npm:@scope/pkg@1.2.3",
                "npm:chalk",
                "npm:lodash@4",
                "npm:zod"
            ]
        );
        for bad in [
            "https://evil.example/mod.ts",
            "npm:../x",
            "jsr:path",
            "npm:@scope",
            "npm:x@$(id)",
            "npm:x@",
            "node:fs",
        ] {
            assert!(
                PackageSet::parse(Language::TypeScript, &[bad.to_string()], "").is_err(),
                "{bad:?} was accepted"
            );
        }
        // Code without npm:/jsr: imports asks for nothing.
        assert!(
            PackageSet::parse(Language::TypeScript, &[], "import x from './a.ts'")
                .unwrap()
                .is_none()
        );
    }
}
