//! [`Detector`]: the built-in detectors of `scan` plus the custom patterns of the
//! configuration, and the rule that turns their candidates into non-overlapping matches.
//!
//! # Overlaps
//!
//! Candidates are placed in three rounds; a candidate that overlaps one already placed is
//! dropped:
//!
//! 1. text shaped like a token (`[LABEL_12]`, `[LABEL_REDACTED]`), so tokenizing twice
//!    changes nothing; these are not reported;
//! 2. the detectors with check digits, CARD (Luhn) and IBAN (mod-97): when a card, a
//!    phone number and an IBAN compete for the same digits, validation decides;
//! 3. everything else (EMAIL, PHONE, SSN, IPV4, IPV6, custom patterns).
//!
//! Within a round the earliest start wins, then the longest, then the detector listed
//! first ([`BUILTIN_LABELS`] order, then custom patterns in configuration order).

use std::fmt;

use regex::{Regex, RegexBuilder};

use super::scan::{self, Builtins};
use super::{CustomPattern, Error, Match, Result, BUILTIN_LABELS};

/// Most bytes a custom pattern may compile to (`RegexBuilder::size_limit`).
const CUSTOM_SIZE_LIMIT: usize = 1 << 20;

/// Index of a detector: built-ins first ([`BUILTIN_LABELS`] order), then custom patterns.
pub(crate) type Kind = usize;
pub(crate) const EMAIL: Kind = 0;
pub(crate) const PHONE: Kind = 1;
pub(crate) const SSN: Kind = 2;
pub(crate) const CARD: Kind = 3;
pub(crate) const IPV4: Kind = 4;
pub(crate) const IPV6: Kind = 5;
pub(crate) const IBAN: Kind = 6;
/// Token-shaped text: placed first, never reported.
pub(crate) const TOKEN: Kind = usize::MAX;

/// A candidate or a detection: byte offsets and the detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hit {
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

/// The compiled detectors: built once from the configuration, shared by every session
/// (`Send + Sync`; cloning is cheap).
#[derive(Clone)]
pub struct Detector {
    builtins: &'static Builtins,
    /// Label and regex of each custom pattern; its kind is `BUILTIN_LABELS.len() + index`.
    custom: Vec<(String, Regex)>,
}

impl fmt::Debug for Detector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let labels: Vec<&str> = (0..self.kinds()).map(|k| self.label(k)).collect();
        f.debug_struct("Detector").field("labels", &labels).finish()
    }
}

impl Detector {
    /// The built-in detectors and `custom`, checked: labels `^[A-Z][A-Z0-9_]{0,31}$`, not
    /// built-in, not repeated; regexes that compile within 1 MiB and cannot match the
    /// empty string.
    pub fn new(custom: &[CustomPattern]) -> Result<Detector> {
        let mut compiled: Vec<(String, Regex)> = Vec::with_capacity(custom.len());
        for p in custom {
            check_label(&p.label)?;
            if compiled.iter().any(|(label, _)| *label == p.label) {
                return Err(Error::BadLabel {
                    label: p.label.clone(),
                    reason: "is defined twice",
                });
            }
            compiled.push((p.label.clone(), compile(p)?));
        }
        Ok(Detector {
            builtins: Builtins::get(),
            custom: compiled,
        })
    }

    /// The built-in detectors only.
    pub fn builtin() -> Detector {
        Detector {
            builtins: Builtins::get(),
            custom: Vec::new(),
        }
    }

    /// The PII in `text`: non-overlapping, sorted by start, byte offsets on character
    /// boundaries. Text shaped like a token is never reported.
    pub fn find(&self, text: &str) -> Vec<Match> {
        self.hits(text)
            .into_iter()
            .map(|h| Match {
                kind: self.label(h.kind).to_string(),
                start: h.start,
                end: h.end,
            })
            .collect()
    }

    /// [`Detector::find`] with detector indices instead of labels.
    pub(crate) fn hits(&self, text: &str) -> Vec<Hit> {
        let mut cands = Vec::new();
        scan::all(self.builtins, text, &mut cands);
        for (i, (_, re)) in self.custom.iter().enumerate() {
            let kind = BUILTIN_LABELS.len() + i;
            cands.extend(re.find_iter(text).filter(|m| !m.is_empty()).map(|m| Hit {
                start: m.start(),
                end: m.end(),
                kind,
            }));
        }
        resolve(cands)
    }

    /// The label of a detector index from [`Detector::hits`].
    pub(crate) fn label(&self, kind: Kind) -> &str {
        match BUILTIN_LABELS.get(kind) {
            Some(label) => label,
            None => &self.custom[kind - BUILTIN_LABELS.len()].0,
        }
    }

    /// How many detectors there are (built-in and custom).
    pub(crate) fn kinds(&self) -> usize {
        BUILTIN_LABELS.len() + self.custom.len()
    }

    /// The regex of token-shaped text (`[LABEL_n]`, `[LABEL_REDACTED]`).
    pub(crate) fn token_regex(&self) -> &Regex {
        &self.builtins.token
    }
}

fn check_label(label: &str) -> Result<()> {
    let b = label.as_bytes();
    let shaped = (1..=32).contains(&b.len())
        && b[0].is_ascii_uppercase()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_');
    if !shaped {
        return Err(Error::BadLabel {
            label: label.to_string(),
            reason:
                "must be 1 to 32 of A-Z, 0-9 and _, starting with a letter (^[A-Z][A-Z0-9_]{0,31}$)",
        });
    }
    if BUILTIN_LABELS.contains(&label) {
        return Err(Error::BadLabel {
            label: label.to_string(),
            reason: "is a built-in label (EMAIL, PHONE, SSN, CARD, IPV4, IPV6, IBAN)",
        });
    }
    Ok(())
}

/// Texts on which a pattern that can match the empty string does so at some position
/// (`x*`, `(abc)?`, `\b\w*`, `(?m)$`); [`Detector::hits`] skips the empty matches of
/// any pattern that slips through.
const EMPTY_PROBES: [&str; 6] = ["", " ", "a ", " 0", "-\n_", "aZ9_-. @\t\n"];

fn compile(p: &CustomPattern) -> Result<Regex> {
    let re = RegexBuilder::new(&p.regex)
        .size_limit(CUSTOM_SIZE_LIMIT)
        .build()
        .map_err(|error| match error {
            regex::Error::CompiledTooBig(limit) => Error::RegexTooBig {
                label: p.label.clone(),
                limit,
            },
            error => Error::BadRegex {
                label: p.label.clone(),
                regex: p.regex.clone(),
                error,
            },
        })?;
    let matches_empty = EMPTY_PROBES.iter().any(|probe| {
        (0..=probe.len())
            .filter(|&i| probe.is_char_boundary(i))
            .any(|i| re.find_at(probe, i).is_some_and(|m| m.is_empty()))
    });
    if matches_empty {
        return Err(Error::MatchesEmpty {
            label: p.label.clone(),
            regex: p.regex.clone(),
        });
    }
    Ok(re)
}

/// The round a candidate is placed in (see the module documentation).
fn round(kind: Kind) -> u8 {
    match kind {
        TOKEN => 0,
        CARD | IBAN => 1,
        _ => 2,
    }
}

/// Non-overlapping hits from overlapping candidates, sorted by start, tokens left out.
fn resolve(mut cands: Vec<Hit>) -> Vec<Hit> {
    cands.sort_unstable_by_key(|h| (round(h.kind), h.start, std::cmp::Reverse(h.end), h.kind));
    // The hits of the rounds so far: sorted, disjoint.
    let mut placed: Vec<Hit> = Vec::new();
    let mut rest = cands.as_slice();
    while let Some(first) = rest.first() {
        let r = round(first.kind);
        let (this, later) = rest.split_at(rest.partition_point(|h| round(h.kind) == r));
        rest = later;
        let mut added: Vec<Hit> = Vec::new();
        // Candidates come by start, so the first placed hit that could overlap only moves on.
        let mut p = 0;
        for &h in this {
            if added.last().is_some_and(|last| h.start < last.end) {
                continue;
            }
            while p < placed.len() && placed[p].end <= h.start {
                p += 1;
            }
            if p < placed.len() && placed[p].start < h.end {
                continue;
            }
            added.push(h);
        }
        placed = merge(placed, added);
    }
    placed.retain(|h| h.kind != TOKEN);
    placed
}

/// Two sorted lists of disjoint hits, disjoint from each other, as one sorted list.
fn merge(a: Vec<Hit>, b: Vec<Hit>) -> Vec<Hit> {
    if a.is_empty() {
        return b;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.start <= y.start => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        };
        match next {
            Some(h) => out.push(h),
            None => return out,
        }
    }
}
