//! Generated Python: parsed, and lexed into the shape the `codegen` target compares.

use rustpython_parser::{lexer, Mode, Tok};

/// `source` as its tokens, with words (keywords too: names may become one) and strings
/// as one class, numbers as another (the lexer without its
/// `full-lexer` feature drops comments and non-logical newlines). Panics when `parse` is set and the source is not valid Python.
const CLOSERS: [&str; 3] = ["Rpar", "Rsqb", "Rbrace"];
const COMMA: &str = "Comma";

pub fn shape(name: &str, source: &str, parse: bool) -> Vec<String> {
    // One lexing pass serves the parse and the shape.
    let tokens: Vec<lexer::Spanned> = lexer::lex(source, Mode::Module)
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("generated {name} does not lex ({e:?}):\n{source}"));
    if parse {
        let lexed = tokens.iter().cloned().map(Ok);
        if let Err(e) = rustpython_parser::parse_tokens(lexed, Mode::Module, name) {
            panic!("generated {name} is not valid Python ({e}):\n{source}");
        }
    }
    let mut part: Vec<String> = Vec::new();
    for (tok, range) in tokens {
        let word = match &tok {
            Tok::Name { .. } | Tok::String { .. } => "word".to_string(),
            Tok::Int { .. } | Tok::Float { .. } | Tok::Complex { .. } => "number".to_string(),
            other => {
                let text = &source[range];
                if text.chars().all(|c| c.is_alphanumeric() || c == '_') && !text.is_empty() {
                    // A keyword, soft or not: names from upstream may become one.
                    "word".to_string()
                } else {
                    format!("{other:?}")
                }
            }
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
