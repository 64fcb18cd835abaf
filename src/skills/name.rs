//! Skill names: `^[a-z][a-z0-9_]{0,63}$`, not reserved in Python or TypeScript, not `skills`.
//!
//! A name is a directory below the store root and an identifier in an import
//! (`from skills import foo`, `import * as foo from "/skills/foo/skill.ts"`), so the rules
//! rule out every path trick (`..`, `/`, NUL, dot files such as the store's own `.tmp-*`)
//! and every name that would not parse as an import in either language.

use super::{Error, Result};

/// Longest name, in bytes (all names are ASCII).
pub const MAX_NAME_LEN: usize = 64;

const RULE: &str = "use 1-64 lowercase letters, digits and underscores, starting with a letter";

/// Checks that `name` can name a skill; the error says why not and what to use instead.
pub fn validate(name: &str) -> Result<()> {
    let bad = |why: String| {
        Err(Error::BadName {
            name: name.to_string(),
            why,
        })
    };
    let mut chars = name.chars();
    let well_formed = name.len() <= MAX_NAME_LEN
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !well_formed {
        return match suggestion(name) {
            Some(s) => bad(format!("{RULE}, e.g. {s:?}")),
            None => bad(RULE.to_string()),
        };
    }
    if name == "skills" {
        return bad("\"skills\" is the package that holds all skills; choose another name".into());
    }
    // The same lists the generated wrappers avoid: Python keywords, and words
    // reserved in TypeScript modules (where `import * as <name>` would not parse).
    if crate::codegen::names::is_reserved(name) {
        return bad(format!(
            "it is reserved in Python or TypeScript, so importing it as `{name}` would not \
             parse; choose another name such as \"{name}_skill\""
        ));
    }
    Ok(())
}

/// A valid name close to an invalid one (`My-Tool` → `my_tool`), if there is an obvious one.
fn suggestion(name: &str) -> Option<String> {
    let mut s: String = name
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' | '_' => c,
            '-' | ' ' | '.' => '_',
            _ => '\0',
        })
        .collect();
    if s.contains('\0') {
        return None;
    }
    s = s
        .trim_start_matches(|c: char| c == '_' || c.is_ascii_digit())
        .to_string();
    (s != name && validate(&s).is_ok()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names() {
        for n in ["a", "foo", "csv_to_json", "x1", "a_", &"a".repeat(64)] {
            validate(n).unwrap_or_else(|e| panic!("{n}: {e}"));
        }
    }

    #[test]
    fn bad_names_are_refused_with_a_reason() {
        for n in [
            "", "..", ".", ".hidden", "a/b", "/etc", "A", "Foo", "1x", "_x", "__x", "__init__",
            "x\0", "x y", "é", "a-b", "class", "import", "type", "skills", "function", "new",
            "delete",
        ] {
            let err = validate(n).expect_err(n).to_string();
            assert!(
                err.starts_with(&format!("skill name {n:?} is invalid: ")),
                "{err}"
            );
        }
        let long = "a".repeat(65);
        assert!(validate(&long)
            .unwrap_err()
            .to_string()
            .contains("1-64 lowercase"));
    }

    #[test]
    fn messages_suggest_a_fix() {
        let e = validate("../x").unwrap_err().to_string();
        assert_eq!(
            e,
            "skill name \"../x\" is invalid: use 1-64 lowercase letters, digits and \
             underscores, starting with a letter"
        );
        assert!(validate("My-Tool")
            .unwrap_err()
            .to_string()
            .ends_with("e.g. \"my_tool\""));
        assert!(validate("class")
            .unwrap_err()
            .to_string()
            .contains("reserved in Python"));
        assert!(validate("x\0")
            .unwrap_err()
            .to_string()
            .contains("\"x\\0\""));
    }
}
