//! Generated Python: parsed (RustPython), and lexed into the shape the `codegen` target
//! compares.

use std::cell::RefCell;

use rustpython_parser::{lexer, Mode, Tok};

use crate::memo::{self, Memo};
use crate::{Class, Piece, Walk};

/// `source` as its tokens: words (keywords too: names may become one) and strings one
/// class, numbers another, every other token its kind (the lexer without its
/// `full-lexer` feature drops comments and non-logical newlines). Panics when `parse` is
/// set and the source is not valid Python.
pub fn shape(name: &str, source: &str, parse: bool) -> Vec<Piece> {
    thread_local! {
        static MEMO: RefCell<Memo> = RefCell::default();
    }
    memo::shape(&MEMO, source, parse, |parse| {
        walk(name, source, parse, |c| c.piece())
    })
}

/// The tokens of [`shape`], named: for a failure's message.
pub fn describe(source: &str) -> Vec<String> {
    walk("", source, false, |c| c.name())
}

fn walk<T>(
    name: &str,
    source: &str,
    parse: bool,
    mut piece: impl FnMut(Class<Tok>) -> T,
) -> Vec<T> {
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
    let mut walk = Walk::new();
    for (tok, range) in &tokens {
        let class = match tok {
            Tok::Name { .. } | Tok::String { .. } => Class::Word,
            Tok::Int { .. } | Tok::Float { .. } | Tok::Complex { .. } => Class::Number,
            other => {
                let text = &source[*range];
                if !text.is_empty() && text.chars().all(|c| c.is_alphanumeric() || c == '_') {
                    // A keyword, soft or not: names from upstream may become one.
                    Class::Word
                } else {
                    Class::Kind(other)
                }
            }
        };
        let closer = matches!(tok, Tok::Rpar | Tok::Rsqb | Tok::Rbrace);
        walk.push(piece(class), closer, matches!(tok, Tok::Comma));
    }
    walk.out
}
