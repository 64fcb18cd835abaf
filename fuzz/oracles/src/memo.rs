//! Shapes already computed in this process, by source text.
//!
//! A fuzzing process runs input after input, and most mutations of an input leave most
//! of the generated tree as it was: the same `__init__.py`, the same module of a server
//! whose tools did not change. Parsing is most of an execution of the `codegen` target
//! (RustPython's lexer and parser alone were 45 % of it), and a shape is a function of
//! the text alone, so each text is lexed, and parsed, once.
//!
//! Only successes are kept (an invalid text panics before it is stored), so a hit never
//! hides a failure. The memo lives here, uninstrumented, so that a hit and a miss take
//! the same path through the code AFL++ watches.

use std::cell::RefCell;
use std::collections::HashMap;
use std::thread::LocalKey;

use crate::Piece;

/// Source bytes kept at most; past it the memo starts again empty.
const MAX_BYTES: usize = 32 << 20;

#[derive(Default)]
pub(crate) struct Memo {
    /// Text to its shape, and whether that text was also parsed (not only lexed).
    shapes: HashMap<Box<str>, (Box<[Piece]>, bool)>,
    bytes: usize,
}

/// The shape of `source` from `memo`, or from `compute(parse)` (stored when it returns).
/// A text known only as lexed is computed again when a parse is asked for.
pub(crate) fn shape(
    memo: &'static LocalKey<RefCell<Memo>>,
    source: &str,
    parse: bool,
    compute: impl FnOnce(bool) -> Vec<Piece>,
) -> Vec<Piece> {
    let known = memo.with_borrow(|m| {
        m.shapes
            .get(source)
            .filter(|(_, parsed)| *parsed || !parse)
            .map(|(shape, _)| shape.to_vec())
    });
    if let Some(shape) = known {
        return shape;
    }
    let shape = compute(parse);
    memo.with_borrow_mut(|m| {
        if m.bytes + source.len() > MAX_BYTES {
            *m = Memo::default();
        }
        m.bytes += source.len();
        m.shapes
            .insert(source.into(), (shape.clone().into_boxed_slice(), parse));
    });
    shape
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static TEST_MEMO: RefCell<Memo> = RefCell::default();
    }

    #[test]
    fn a_text_is_computed_once_and_parsed_when_asked() {
        let calls = std::cell::Cell::new(Vec::new());
        let compute = |parse: bool| {
            let mut c = calls.take();
            c.push(parse);
            calls.set(c);
            vec![Piece::WORD]
        };
        assert_eq!(shape(&TEST_MEMO, "x", false, compute), [Piece::WORD]);
        assert_eq!(shape(&TEST_MEMO, "x", false, compute), [Piece::WORD]);
        // Lexed only so far: a parse is not taken for granted.
        shape(&TEST_MEMO, "x", true, compute);
        shape(&TEST_MEMO, "x", true, compute);
        shape(&TEST_MEMO, "x", false, compute);
        assert_eq!(calls.take(), [false, true]);
    }

    #[test]
    fn a_failure_is_not_remembered() {
        let fails = |_| -> Vec<Piece> { panic!("not valid") };
        assert!(std::panic::catch_unwind(|| shape(&TEST_MEMO, "bad", true, fails)).is_err());
        assert!(std::panic::catch_unwind(|| shape(&TEST_MEMO, "bad", true, fails)).is_err());
    }
}
