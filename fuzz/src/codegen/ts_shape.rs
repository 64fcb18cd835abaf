//! Generated TypeScript: parsed, and lexed into the shape the `codegen` target compares.

use oxc_allocator::Allocator;
use oxc_parser::config::TokensParserConfig;
use oxc_parser::{Kind, Parser};
use oxc_span::SourceType;

/// `source` as its tokens, with words (keywords too) and strings as one class, numbers as another (comments are not tokens). Panics when
/// `parse` is set and the source is not valid TypeScript.
const CLOSERS: [&str; 3] = ["RParen", "RBrack", "RCurly"];
const COMMA: &str = "Comma";

pub fn shape(name: &str, source: &str, parse: bool) -> Vec<String> {
    let allocator = Allocator::default();
    let ret = Parser::new(&allocator, source, SourceType::ts())
        .with_config(TokensParserConfig)
        .parse();
    if parse && (ret.panicked || !ret.diagnostics.is_empty()) {
        let errors: Vec<String> = ret.diagnostics.iter().map(|d| d.to_string()).collect();
        panic!("generated {name} is not valid TypeScript ({errors:?}):\n{source}");
    }
    let mut part: Vec<String> = Vec::new();
    for token in ret.tokens.iter() {
        let kind = token.kind();
        let span = token.span();
        let text = &source[span.start as usize..span.end as usize];
        let word = match kind {
            Kind::Eof => continue,
            Kind::Str
            | Kind::NoSubstitutionTemplate
            | Kind::TemplateHead
            | Kind::TemplateMiddle
            | Kind::TemplateTail => "word".to_string(),
            _ if kind.is_number() => "number".to_string(),
            _ if !text.is_empty()
                && text
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '$') =>
            {
                "word".to_string()
            }
            _ => format!("{kind:?}"),
        };
        // A trailing comma comes and goes with line wrapping (a longer text, a
        // signature over several lines): not a difference in the code.
        if CLOSERS.contains(&word.as_str()) && part.last().is_some_and(|w| w == COMMA) {
            part.pop();
        }
        part.push(word);
    }
    part
}
