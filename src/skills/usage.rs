//! The usage text generated for a skill saved without one: the description, the import
//! line, and the top-level public functions and classes found in the code.

use super::SkillLanguage;

/// At most this many definitions are listed.
const MAX_DEFINITIONS: usize = 30;
/// Longer definition lines are shortened to their name.
const MAX_LINE: usize = 200;

/// Markdown telling how to import and call the skill `name`.
pub(super) fn default_usage(
    name: &str,
    description: &str,
    language: SkillLanguage,
    code: &str,
) -> String {
    let (fence, import) = match language {
        SkillLanguage::Python => ("python", language.import_line(name)),
        SkillLanguage::Typescript => ("ts", format!("{};", language.import_line(name))),
    };
    let mut out = format!("# {name}\n\n{description}\n\n```{fence}\n{import}\n```\n");
    let definitions = definitions(language, code);
    if !definitions.is_empty() {
        out.push_str(&format!("\nDefines:\n\n```{fence}\n"));
        for d in definitions {
            out.push_str(&d);
            out.push('\n');
        }
        out.push_str("```\n");
    }
    out
}

/// Top-level public definitions, one line each, without their body opener.
fn definitions(language: SkillLanguage, code: &str) -> Vec<String> {
    code.lines()
        .filter_map(|line| match language {
            SkillLanguage::Python => python_definition(line),
            SkillLanguage::Typescript => typescript_definition(line),
        })
        .take(MAX_DEFINITIONS)
        .collect()
}

fn python_definition(line: &str) -> Option<String> {
    let line = line.trim_end();
    let rest = ["def ", "async def ", "class "]
        .iter()
        .find_map(|kw| line.strip_prefix(kw))?;
    let ident: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if ident.is_empty() || ident.starts_with('_') {
        return None;
    }
    Some(shorten(
        line.strip_suffix(':').filter(|_| balanced(line)),
        line,
        &ident,
    ))
}

fn typescript_definition(line: &str) -> Option<String> {
    let line = line.trim_end();
    let rest = line.strip_prefix("export ")?;
    let rest = rest.strip_prefix("default ").unwrap_or(rest);
    let rest = rest.strip_prefix("async ").unwrap_or(rest);
    let (keyword, rest) = rest.split_once(' ')?;
    let ident: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '$')
        .collect();
    if ident.is_empty() {
        return None;
    }
    match keyword {
        "function" | "function*" | "class" | "interface" => {
            let head = line
                .strip_suffix('{')
                .map(str::trim_end)
                .filter(|_| balanced(line));
            Some(shorten(head, line, &ident))
        }
        "const" | "let" | "type" => {
            let head = line.split_once('=').map(|(h, _)| h.trim_end());
            Some(shorten(head, line, &ident))
        }
        _ => None,
    }
}

/// `head` when it is a whole, short signature; else the line up to the name plus `...`.
fn shorten(head: Option<&str>, line: &str, ident: &str) -> String {
    match head {
        Some(h) if h.len() <= MAX_LINE => h.to_string(),
        _ => {
            let end = line.find(ident).map_or(line.len(), |i| i + ident.len());
            format!("{} ...", &line[..end])
        }
    }
}

/// Whether the parentheses of a line close (the signature is on one line).
fn balanced(line: &str) -> bool {
    line.matches('(').count() == line.matches(')').count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python() {
        let code = "import math\n\ndef double(x: int) -> int:\n    return 2 * x\n\n\
                    def _private():\n    pass\n\nasync def fetch(url):\n    ...\n\n\
                    class Point:\n    def method(self):\n        pass\n\ndef long(\n    a,\n):\n";
        let u = default_usage("foo", "Numbers.", SkillLanguage::Python, code);
        assert_eq!(
            u,
            "# foo\n\nNumbers.\n\n```python\nfrom skills import foo\n```\n\nDefines:\n\n\
             ```python\ndef double(x: int) -> int\nasync def fetch(url)\nclass Point\n\
             def long ...\n```\n"
        );
    }

    #[test]
    fn typescript() {
        let code = "const hidden = 1;\nexport function add(a: number, b: number): number {\n\
                    return a + b;\n}\nexport const PI = 3.14;\nexport async function get(\n  u: string,\n) {\n}\n\
                    export interface Opts {\n}\n";
        let u = default_usage("math", "Maths.", SkillLanguage::Typescript, code);
        assert!(
            u.contains("import * as math from \"/skills/math/skill.ts\";\n"),
            "{u}"
        );
        assert!(
            u.contains(
                "```ts\nexport function add(a: number, b: number): number\nexport const PI\n\
             export async function get ...\nexport interface Opts\n```\n"
            ),
            "{u}"
        );
    }

    #[test]
    fn no_definitions() {
        let u = default_usage("x", "Y.", SkillLanguage::Python, "print(1)\n");
        assert!(!u.contains("Defines"));
    }
}
