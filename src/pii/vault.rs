//! [`Vault`]: one session's map between raw values and their tokens.
//!
//! Detection runs outside the lock; the mutex is held only while tokens are looked up,
//! issued or restored, so concurrent executions of a session wait little on each other.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::detectors::{Detector, Hit, EMAIL};
use super::MAX_ENTRIES;

/// Detection rounds over one text (see [`Vault::tokenize`]); a second round is rare, a
/// third rarer still. A text still yielding new values after this many is redacted whole.
const MAX_ROUNDS: usize = 8;

/// One session's token map: `[EMAIL_1]` ↔ `alice@example.com`. `Send + Sync`; the map
/// sits behind a mutex. Its `Debug` shows counts, never values.
pub struct Vault {
    detector: Arc<Detector>,
    state: Mutex<State>,
}

struct State {
    /// Per detector: the value (lower-cased for EMAIL) -> its token. Token numbers are
    /// the map's length at the time, so they count from 1 per label.
    tokens: Vec<HashMap<String, String>>,
    /// Token -> the value as first seen.
    values: HashMap<String, String>,
    /// Whether reaching [`MAX_ENTRIES`] has been logged.
    full_logged: bool,
}

impl fmt::Debug for Vault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Vault");
        // `try_lock`: formatting must not wait on (or deadlock with) a tokenization.
        match self.state.try_lock() {
            Ok(state) => d.field("entries", &state.values.len()),
            Err(_) => d.field("entries", &format_args!("(busy)")),
        };
        d.field("detector", &self.detector).finish()
    }
}

impl Vault {
    /// An empty vault detecting with `detector`.
    pub fn new(detector: Arc<Detector>) -> Vault {
        let state = State {
            tokens: vec![HashMap::new(); detector.kinds()],
            values: HashMap::new(),
            full_logged: false,
        };
        Vault {
            detector,
            state: Mutex::new(state),
        }
    }

    /// `text` with its PII replaced by tokens: the same value gets the same token for the
    /// vault's lifetime (emails regardless of case); once the vault is full, new values
    /// become `[<LABEL>_REDACTED]`. Token-shaped text is left as it is. A text whose
    /// detection does not settle (values glued into a long chain) becomes one
    /// `[<LABEL>_REDACTED]` as a whole (see `tokenize_str`).
    pub fn tokenize(&self, text: &str) -> String {
        self.tokenize_str(text).unwrap_or_else(|| text.to_owned())
    }

    /// Tokenizes every string in `value` in place (array items and object values at any
    /// depth); object keys, numbers, booleans and nulls are left alone.
    pub fn tokenize_json(&self, value: &mut serde_json::Value) {
        for_each_string(value, |s| {
            if let Some(t) = self.tokenize_str(s) {
                *s = t;
            }
        });
    }

    /// `text` with the tokens this vault issued replaced by their values; unknown tokens,
    /// `[<LABEL>_REDACTED]` and look-alikes stay as they are.
    pub fn restore(&self, text: &str) -> String {
        self.restore_str(text).unwrap_or_else(|| text.to_owned())
    }

    /// Restores every string in `value` in place, as [`Vault::restore`] (keys unchanged).
    pub fn restore_json(&self, value: &mut serde_json::Value) {
        for_each_string(value, |s| {
            if let Some(r) = self.restore_str(s) {
                *s = r;
            }
        });
    }

    /// How many values the vault holds.
    pub fn len(&self) -> usize {
        self.state().values.len()
    }

    /// Whether the vault holds no values yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; were it poisoned, the map is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The tokenized text, or `None` when nothing was found.
    ///
    /// Detection runs again over its own output until it finds nothing: a value that
    /// overlapped a hit of higher precedence (`10.0.0.1+1 415 555 0100`: the address wins
    /// the shared `1`), or that was glued to its neighbour (`…7946+44 20 7946 0958`), is
    /// whole once that neighbour became a token, and must not reach the model as it is
    /// (both found by fuzzing: tokenizing twice changed the text). Each round turns raw
    /// text into tokens, which later rounds leave alone.
    ///
    /// A chain of values each freed by the one before needs a round per link, and each
    /// round reads the whole text; so the rounds are bounded, and a text that still
    /// yields values after [`MAX_ROUNDS`] fails closed: it becomes one
    /// `[<LABEL>_REDACTED]` (the label of its first remaining value), which nothing
    /// detects again and which restores to nothing.
    fn tokenize_str(&self, text: &str) -> Option<String> {
        let mut current: Option<String> = None;
        for round in 0..=MAX_ROUNDS {
            let source = current.as_deref().unwrap_or(text);
            let hits = self.detector.hits(source);
            let Some(first) = hits.first() else {
                break;
            };
            if round == MAX_ROUNDS {
                let label = self.detector.label(first.kind);
                // Sizes and counts only: never a value, never a token.
                tracing::warn!(
                    label,
                    bytes = text.len(),
                    rounds = MAX_ROUNDS,
                    "PII detection did not settle; the whole text is redacted"
                );
                return Some(format!("[{label}_REDACTED]"));
            }
            let mut out = String::with_capacity(source.len());
            let mut last = 0;
            let mut state = self.state();
            for Hit { start, end, kind } in hits {
                out.push_str(&source[last..start]);
                let label = self.detector.label(kind);
                out.push_str(&state.token(kind, label, &source[start..end]));
                last = end;
            }
            out.push_str(&source[last..]);
            current = Some(out);
        }
        current
    }

    /// The restored text, or `None` when it holds no token of this vault.
    fn restore_str(&self, text: &str) -> Option<String> {
        if !text.contains('[') {
            return None;
        }
        let state = self.state();
        if state.values.is_empty() {
            return None;
        }
        let mut out: Option<String> = None;
        let mut last = 0;
        for m in self.detector.token_regex().find_iter(text) {
            if let Some(value) = state.values.get(m.as_str()) {
                let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
                out.push_str(&text[last..m.start()]);
                out.push_str(value);
                last = m.end();
            }
        }
        let mut out = out?;
        out.push_str(&text[last..]);
        Some(out)
    }
}

impl State {
    /// The token of `value` found by detector `kind`, issuing one if it is new.
    fn token(&mut self, kind: usize, label: &str, value: &str) -> Cow<'_, str> {
        let key = if kind == EMAIL && value.bytes().any(|c| c.is_ascii_uppercase()) {
            Cow::Owned(value.to_ascii_lowercase())
        } else {
            Cow::Borrowed(value)
        };
        if self.tokens[kind].contains_key(key.as_ref()) {
            return Cow::Borrowed(&self.tokens[kind][key.as_ref()]);
        }
        if self.values.len() >= MAX_ENTRIES {
            if !self.full_logged {
                self.full_logged = true;
                // Counts only: never a value, never a token.
                tracing::warn!(
                    entries = MAX_ENTRIES,
                    "PII vault is full; new values are redacted, not tokenized"
                );
            }
            return Cow::Owned(format!("[{label}_REDACTED]"));
        }
        let token = format!("[{label}_{}]", self.tokens[kind].len() + 1);
        self.values.insert(token.clone(), value.to_owned());
        self.tokens[kind].insert(key.into_owned(), token.clone());
        Cow::Owned(token)
    }
}

/// Calls `f` on every string value in `value` in document order (so tokens are numbered
/// as a reader would), without recursion (a deeply nested document cannot overflow the
/// stack).
fn for_each_string(value: &mut serde_json::Value, mut f: impl FnMut(&mut String)) {
    use serde_json::Value;
    let mut stack: Vec<&mut Value> = vec![value];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => f(s),
            Value::Array(items) => stack.extend(items.iter_mut().rev()),
            Value::Object(map) => stack.extend(map.values_mut().rev()),
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}
