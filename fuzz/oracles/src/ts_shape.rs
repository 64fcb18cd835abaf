//! Generated TypeScript: parsed (oxc), and lexed into the shape the `codegen` target
//! compares.

use std::cell::RefCell;

use oxc_allocator::Allocator;
use oxc_parser::config::TokensParserConfig;
use oxc_parser::{Kind, Parser};
use oxc_span::SourceType;

use crate::memo::{self, Memo};
use crate::{Class, Piece, Walk};

thread_local! {
    /// One arena for every parse of this thread, reset before each.
    static ARENA: RefCell<Allocator> = RefCell::new(Allocator::default());
}

/// `source` as its tokens: words (keywords too) and strings one class, numbers another,
/// every other token its kind; comments are not tokens. Panics when `parse` is set and
/// the source is not valid TypeScript.
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
    mut piece: impl FnMut(Class<Kind>) -> T,
) -> Vec<T> {
    ARENA.with_borrow_mut(|arena| {
        arena.reset();
        let ret = Parser::new(arena, source, SourceType::ts())
            .with_config(TokensParserConfig)
            .parse();
        if parse && (ret.panicked || !ret.diagnostics.is_empty()) {
            let errors: Vec<String> = ret.diagnostics.iter().map(|d| d.to_string()).collect();
            panic!("generated {name} is not valid TypeScript ({errors:?}):\n{source}");
        }
        let mut walk = Walk::new();
        for token in ret.tokens.iter() {
            let kind = token.kind();
            let span = token.span();
            let text = &source[span.start as usize..span.end as usize];
            let class = match kind {
                Kind::Eof => continue,
                Kind::Str
                | Kind::NoSubstitutionTemplate
                | Kind::TemplateHead
                | Kind::TemplateMiddle
                | Kind::TemplateTail => Class::Word,
                _ if kind.is_number() => Class::Number,
                _ if !text.is_empty()
                    && text
                        .chars()
                        .all(|c| c.is_alphanumeric() || c == '_' || c == '$') =>
                {
                    Class::Word
                }
                _ => Class::Kind(&kind),
            };
            let closer = matches!(kind, Kind::RParen | Kind::RBrack | Kind::RCurly);
            walk.push(piece(class), closer, kind == Kind::Comma);
        }
        walk.out
    })
}
