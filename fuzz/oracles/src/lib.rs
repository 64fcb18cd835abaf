//! The oracles of codebox's fuzz targets: what a target checks the code under test
//! against, independent of it.
//!
//! - [`bpf`]: the kernel's rules for a classic-BPF seccomp program, and an interpreter
//!   that runs one on a `struct seccomp_data` (the `seccomp_policy` target);
//! - [`ts_shape`], [`python_shape`]: generated TypeScript and Python parsed (oxc,
//!   RustPython) and lexed into the token shape the `codegen` target compares.
//!
//! A crate of its own so that `cargo xtask fuzz` can build it, and the parsers it uses,
//! without AFL++'s coverage instrumentation (`xtask/src/fuzz/rustc_wrapper.rs`): their
//! branches say nothing about codebox, would fill the coverage map with noise and cost a
//! call on every edge of every execution. Nothing here is generic over codebox's types,
//! so no code under test is compiled in this crate.

pub mod bpf;
mod memo;
pub mod python_shape;
pub mod ts_shape;

/// One token of a shape: words (identifiers, keywords, strings) are one class, numbers
/// another; every other token is its kind. Compared, never printed: `describe` in each
/// shape module names the tokens for a failure's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece(u64);

impl Piece {
    const WORD: Piece = Piece(0);
    const NUMBER: Piece = Piece(1);

    /// The piece of a token of kind `kind` (an enum value: its variant decides).
    fn kind<T>(kind: &T) -> Piece {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same code for the same variant in every process.
        let mut h = std::hash::DefaultHasher::new();
        std::mem::discriminant(kind).hash(&mut h);
        Piece(h.finish() | 2)
    }
}

/// Token classes as the shape walk sees them.
enum Class<'t, K> {
    Word,
    Number,
    Kind(&'t K),
}

impl<K: std::fmt::Debug> Class<'_, K> {
    /// The class as a shape's piece.
    fn piece(self) -> Piece {
        match self {
            Class::Word => Piece::WORD,
            Class::Number => Piece::NUMBER,
            Class::Kind(kind) => Piece::kind(kind),
        }
    }

    /// The class named, for a failure's message.
    fn name(self) -> String {
        match self {
            Class::Word => "word".to_string(),
            Class::Number => "number".to_string(),
            Class::Kind(kind) => format!("{kind:?}"),
        }
    }
}

/// A shape from a token walk: `class` per token, with a trailing comma before a closing
/// bracket dropped (it comes and goes with line wrapping: a longer text, a signature over
/// several lines — not a difference in the code).
struct Walk<T> {
    out: Vec<T>,
    last_comma: bool,
}

impl<T> Walk<T> {
    fn new() -> Walk<T> {
        Walk {
            out: Vec::new(),
            last_comma: false,
        }
    }

    fn push(&mut self, item: T, closer: bool, comma: bool) {
        if closer && self.last_comma {
            self.out.pop();
        }
        self.out.push(item);
        self.last_comma = comma;
    }
}

#[cfg(test)]
mod tests {
    use super::{python_shape, ts_shape};

    #[test]
    fn typescript_texts_and_comments_do_not_change_a_shape_but_a_breakout_does() {
        let shape = |s: &str| ts_shape::shape("t.ts", s, true);
        let plain = shape("/** p00001 */\nconst x = \"p00002\";\nf(x, `p00003`);\n");
        assert_eq!(
            plain,
            shape("/** any text */\nconst x = \"a \\\" b\";\nf(x, `c`);\n")
        );
        assert_ne!(
            plain,
            shape("/** */ evil(); /** */\nconst x = \"p\";\nf(x, `p`);\n")
        );
        assert_ne!(
            plain,
            shape("/** p */\nconst x = \"p\"; evil(\"\");\nf(x, `p`);\n")
        );
        // A trailing comma comes and goes with line wrapping.
        assert_eq!(shape("f(a, b);\n"), shape("f(\n  a,\n  b,\n);\n"));
        assert_eq!(ts_shape::describe("f(1);").len(), shape("f(1);").len());
    }

    #[test]
    fn python_texts_and_comments_do_not_change_a_shape_but_a_breakout_does() {
        let shape = |s: &str| python_shape::shape("t.py", s, true);
        let plain = shape("# p00001\nx = 'p00002'\nf(x, \"\"\"p00003\"\"\")\n");
        assert_eq!(
            plain,
            shape("# any ' text\nx = 'a \\' b'\nf(x, \"\"\"c\nd\"\"\")\n")
        );
        assert_ne!(plain, shape("# p\nx = 'p'; evil()\nf(x, \"\"\"p\"\"\")\n"));
        assert_ne!(plain, shape("# p\nx = 'p'\nf(x, \"\"\"p\"\"\", evil)\n"));
        assert_eq!(shape("f(a, b)\n"), shape("f(\n    a,\n    b,\n)\n"));
        assert_eq!(
            python_shape::describe("f(1)\n").len(),
            shape("f(1)\n").len()
        );
    }

    #[test]
    #[should_panic(expected = "not valid TypeScript")]
    fn invalid_typescript_is_refused() {
        ts_shape::shape("t.ts", "const = ;", true);
    }

    #[test]
    #[should_panic(expected = "not valid Python")]
    fn invalid_python_is_refused() {
        python_shape::shape("t.py", "def f(:\n    pass\n)\n", true);
    }
}
