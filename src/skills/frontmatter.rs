//! `SKILL.md`: a YAML-ish front matter and a markdown body.
//!
//! Written as
//!
//! ```text
//! ---
//! name: foo
//! description: "<JSON-escaped string>"
//! language: python
//! ---
//! <usage markdown>
//! ```
//!
//! The parser accepts that and what a person writes by hand: plain `key: value` lines,
//! values unquoted, in double quotes (JSON escapes) or single quotes (`''` for a quote),
//! blank lines, `#` comments and unknown keys (ignored). It is not a YAML parser: block
//! scalars and nested values are refused.

use super::SkillLanguage;

/// The front matter of a skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Header {
    pub name: String,
    pub description: String,
    pub language: SkillLanguage,
}

/// `usage` without leading blank lines and trailing whitespace, as stored (leading
/// spaces of the first line are kept: they may start an indented code block).
pub(super) fn tidy(usage: &str) -> &str {
    let mut start = 0;
    for line in usage.split_inclusive('\n') {
        if !line.trim().is_empty() {
            break;
        }
        start += line.len();
    }
    usage[start..].trim_end()
}

/// The text of `SKILL.md` for `header` and `usage` (tidied, then ended by a newline).
pub(super) fn render(header: &Header, usage: &str) -> String {
    let description =
        serde_json::to_string(&header.description).expect("a string always serialises");
    format!(
        "---\nname: {}\ndescription: {description}\nlanguage: {}\n---\n{}\n",
        header.name,
        header.language,
        tidy(usage)
    )
}

/// Parses `SKILL.md` into its header and usage (tidied); the error says what is wrong.
pub(super) fn parse(text: &str) -> Result<(Header, String), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let opening = lines.next().unwrap_or_default();
    if opening.trim_end() != "---" {
        return Err("SKILL.md does not start with front matter (a \"---\" line)".into());
    }
    let mut offset = opening.len();
    let (mut name, mut description, mut language) = (None, None, None);
    let mut closed = false;
    for (i, raw) in lines.enumerate() {
        offset += raw.len();
        let line = raw.trim_end();
        let number = i + 2;
        if line == "---" {
            closed = true;
            break;
        }
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            return Err(format!(
                "SKILL.md line {number} is indented; the front matter takes one `key: value` \
                 per line"
            ));
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(format!("SKILL.md line {number} is not `key: value`"));
        };
        let slot = match key.trim() {
            "name" => &mut name,
            "description" => &mut description,
            "language" => &mut language,
            _ => continue,
        };
        if slot.is_some() {
            return Err(format!("SKILL.md line {number} repeats `{}`", key.trim()));
        }
        *slot =
            Some(unquote(value.trim()).map_err(|why| format!("SKILL.md line {number}: {why}"))?);
    }
    if !closed {
        return Err("the front matter of SKILL.md is not closed by a \"---\" line".into());
    }
    let missing = |key: &str| format!("the front matter of SKILL.md has no `{key}`");
    let name = name
        .filter(|n| !n.is_empty())
        .ok_or_else(|| missing("name"))?;
    let description = description
        .filter(|d| !d.trim().is_empty())
        .ok_or_else(|| missing("description"))?;
    let language = language
        .ok_or_else(|| missing("language"))?
        .parse::<SkillLanguage>()
        .map_err(|e| format!("SKILL.md: {e}"))?;
    let usage = tidy(&text[offset..]).to_string();
    Ok((
        Header {
            name,
            description,
            language,
        },
        usage,
    ))
}

/// A value as written: `"json"`, `'single ''quoted'''` or plain.
fn unquote(value: &str) -> Result<String, String> {
    if value.starts_with('"') {
        serde_json::from_str::<String>(value)
            .map_err(|e| format!("bad double-quoted value ({e}); escape as in JSON"))
    } else if let Some(inner) = value.strip_prefix('\'') {
        let inner = inner
            .strip_suffix('\'')
            .ok_or("a single-quoted value does not end with a quote")?;
        Ok(inner.replace("''", "'"))
    } else if value.starts_with(['|', '>']) {
        Err("block scalars (| or >) are not supported; put the value on one line".into())
    } else {
        Ok(value.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(description: &str) -> Header {
        Header {
            name: "foo".into(),
            description: description.into(),
            language: SkillLanguage::Python,
        }
    }

    #[test]
    fn round_trip() {
        for d in [
            "Doubles a number",
            "quotes \" and \\ and: colons",
            "ünïcode — 'x' # y",
        ] {
            let text = render(&header(d), "\n# Usage\n\ncall it\n\n");
            let (h, usage) = parse(&text).unwrap();
            assert_eq!(h, header(d));
            assert_eq!(usage, "# Usage\n\ncall it");
        }
        let text = render(&header("d"), " \n\n    indented code\n  \n");
        assert_eq!(parse(&text).unwrap().1, "    indented code");
        assert_eq!(
            render(&header("a \"b\""), "body"),
            "---\nname: foo\ndescription: \"a \\\"b\\\"\"\nlanguage: python\n---\nbody\n"
        );
    }

    #[test]
    fn hand_written() {
        let text = "---\r\n# my skill\r\nname: csv_tools\r\ndescription: Parse CSV: fast\r\n\
                    language: TS\r\nversion: 2\r\n\r\n---\r\nUse it.\r\n";
        let (h, usage) = parse(text).unwrap();
        assert_eq!(h.name, "csv_tools");
        assert_eq!(h.description, "Parse CSV: fast");
        assert_eq!(h.language, SkillLanguage::Typescript);
        assert_eq!(usage, "Use it.");
        let (h, usage) =
            parse("---\nname: 'x'\ndescription: 'it''s'\nlanguage: \"python\"\n---\n").unwrap();
        assert_eq!(
            (h.name.as_str(), h.description.as_str(), usage.as_str()),
            ("x", "it's", "")
        );
    }

    #[test]
    fn refused() {
        let cases = [
            ("name: foo\n", "does not start with front matter"),
            ("", "does not start with front matter"),
            ("---\nname: foo\n", "not closed"),
            (
                "---\nname: foo\nlanguage: python\n---\n",
                "no `description`",
            ),
            ("---\nname: foo\ndescription: x\n---\n", "no `language`"),
            ("---\ndescription: x\nlanguage: python\n---\n", "no `name`"),
            (
                "---\nname: foo\ndescription: x\nlanguage: rust\n---\n",
                "not a skill language",
            ),
            ("---\nname: foo\nname: bar\n---\n", "repeats `name`"),
            ("---\nname foo\n---\n", "not `key: value`"),
            ("---\ndescription: >\n  folded\n---\n", "block scalars"),
            (
                "---\ndescription: \"unterminated\n---\n",
                "bad double-quoted",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).expect_err(text);
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
