//! The syntax check of a skill before it is saved: a small program, run in a throw-away
//! sandbox like any execution, that compiles the skill's code without running it and
//! prints one verdict line.
//!
//! - Python: `compile(code, "skill.py", "exec")`, the interpreter's own parser and
//!   compiler; nothing of the code runs.
//! - TypeScript: Deno loads a module importing first a module that throws and then the
//!   skill. Loading parses (and resolves) the whole module graph before anything runs,
//!   and evaluation stops at the first module, so the skill never runs: an error with
//!   the marker means it parsed, any other error is Deno's message about the skill.
//!
//! The code goes into the checker as a JSON string literal, which is also a valid
//! Python and JavaScript string literal, so no code text is ever spliced in raw.

/// The first characters of the verdict line.
const VERDICT: &str = "codebox-skill-check ";
/// Longest compiler message returned.
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// The checker program for the skill `name` (a valid skill name) with `code` in
/// `language`; `marker` is an unguessable word the TypeScript checker's stop module
/// throws.
pub fn program(language: super::SkillLanguage, name: &str, code: &str, marker: &str) -> String {
    let code = serde_json::to_string(code).expect("a string serialises");
    let marker = serde_json::to_string(marker).expect("a string serialises");
    match language {
        super::SkillLanguage::Python => format!(
            r#"import json, traceback
_src = {code}
try:
    compile(_src, "skill.py", "exec", dont_inherit=True)
    _verdict = None
except BaseException as e:
    _verdict = "".join(traceback.format_exception_only(type(e), e)).rstrip()
print({VERDICT:?} + json.dumps(_verdict))
"#
        ),
        super::SkillLanguage::Typescript => {
            let name = serde_json::to_string(name).expect("a string serialises");
            format!(
                r#"// The skill sits where it will live relative to the other skills: every
// entry of /skills is linked next to it, so "../other/skill.ts" resolves as it will.
const root = "/tmp/codebox-skill-check";
const name = {name};
const marker = {marker};
await Deno.mkdir(`${{root}}/${{name}}`, {{ recursive: true }});
await Deno.mkdir(`${{root}}/.check`, {{ recursive: true }});
try {{
  for (const e of Deno.readDirSync("/skills")) {{
    if (e.name !== name) Deno.symlinkSync(`/skills/${{e.name}}`, `${{root}}/${{e.name}}`);
  }}
}} catch {{ /* no /skills */ }}
await Deno.writeTextFile(`${{root}}/${{name}}/skill.ts`, {code});
await Deno.writeTextFile(`${{root}}/.check/stop.ts`, `throw new Error(${{JSON.stringify(marker)}});\n`);
await Deno.writeTextFile(
  `${{root}}/.check/check.ts`,
  `import "./stop.ts";\nimport "../${{name}}/skill.ts";\n`,
);
let verdict: string | null = "the checker's stop module did not run";
try {{
  await import(`file://${{root}}/.check/check.ts`);
}} catch (e) {{
  const message = String((e as Error)?.message ?? e);
  verdict = message === marker ? null : message.replaceAll(`file://${{root}}/${{name}}/`, "");
}}
console.log({VERDICT:?} + JSON.stringify(verdict));
"#
            )
        }
    }
}

/// What the checker's output says: `Ok(())` when the code compiled, else the compiler's
/// message (at most [`MAX_MESSAGE_BYTES`]). `None` when there is no verdict line (the
/// checker itself failed).
pub fn verdict(stdout: &str) -> Option<Result<(), String>> {
    let line = stdout.lines().rev().find_map(|l| l.strip_prefix(VERDICT))?;
    match serde_json::from_str::<Option<String>>(line.trim()).ok()? {
        None => Some(Ok(())),
        Some(message) => Some(Err(bounded(&message))),
    }
}

/// `text` cut to at most [`MAX_MESSAGE_BYTES`] on a character boundary.
pub fn bounded(text: &str) -> String {
    if text.len() <= MAX_MESSAGE_BYTES {
        return text.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} [cut]", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::skills::SkillLanguage;

    #[test]
    fn verdicts_parse_and_messages_are_bounded() {
        assert_eq!(verdict("noise\ncodebox-skill-check null\n"), Some(Ok(())));
        assert_eq!(
            verdict("codebox-skill-check \"SyntaxError: bad\"\n"),
            Some(Err("SyntaxError: bad".into()))
        );
        assert_eq!(verdict("nothing here\n"), None);
        assert_eq!(verdict("codebox-skill-check {not json"), None);
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_MESSAGE_BYTES + 6 && cut.ends_with("[cut]"));
    }

    #[test]
    fn the_code_is_embedded_as_a_literal_never_raw() {
        let hostile = "\"\"\"\n'''\n`${x}`\nprint(1)\n\u{2028}\\";
        for language in [SkillLanguage::Python, SkillLanguage::Typescript] {
            let p = program(language, "x", hostile, "m");
            let literal = serde_json::to_string(hostile).unwrap();
            assert!(p.contains(&literal), "{p}");
            assert!(!p.contains("\nprint(1)\n"), "raw code in {p}");
        }
    }
}
