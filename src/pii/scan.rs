//! The built-in detectors: a regex finds candidates, code checks them (boundaries with
//! [`validate::isolated`], check digits, number-plan rules) and pushes [`Hit`]s.
//!
//! Each scan is linear in the text: regexes whose matches are bounded (a few dozen
//! bytes) resume one character after a rejected candidate, so a valid match starting
//! inside it is still found; the unbounded ones (EMAIL, the digit runs of CARD and
//! IPV4, the colon runs of IPV6) match maximal runs and are scanned once.
//!
//! What counts, per label:
//!
//! - EMAIL: `local@domain.tld`, local part of ASCII letters, digits and `._%+-` (leading
//!   dots dropped), domain labels of letters, digits and inner hyphens, a TLD of two or
//!   more letters.
//! - PHONE: E.164 (`+`, a non-zero digit, 8–15 digits in all, single spaces, dots or
//!   hyphens between them) and NANP (`(415) 555-0123`, `415-555-0123`, `415.555.0123`,
//!   `1-415-555-0123`, `+1 415 555 0123`; area code and exchange start with 2–9; without
//!   `+1` or parentheses both separators are the same `-` or `.`). A phone may not be
//!   glued to letters or digits, nor continue a `.`/`-` separated number (dates,
//!   versions). An E.164 run followed by more space-separated digits is also tried cut
//!   at each space, so a card after a phone number is not swallowed.
//! - SSN: `AAA-GG-SSSS` passing [`validate::ssn`], isolated.
//! - CARD: 13–19 digits passing Luhn, either one group or several groups of 3–8 digits
//!   joined by the same single separator (space or hyphen), isolated; within a longer
//!   run of space-separated numbers the longest valid card at the earliest group wins.
//! - IPV4: a dotted run of exactly four numbers, each 1–3 digits and at most 255, not
//!   glued to letters or digits (`1.2.3.4.5` and `v1.2.3.4` are not addresses).
//! - IPV6: a maximal run of hex digits, `:` and `.` with at least two colons (a single
//!   stray `:` before it or `:`/`.` after it is trimmed) that parses as
//!   [`std::net::Ipv6Addr`], is not glued to letters or digits, and: written out in full
//!   (no `::`), or compressed and holding a decimal digit and either a group of three or
//!   more hex digits or being `::1`. So `fe80::1`, `::1`, `2001:db8::8a2e:370:7334`,
//!   `::ffff:192.0.2.1` count, while times (`12:30:45`), MAC addresses, `::`, `a::b`,
//!   `dead::beef` and slices such as `x[1::2]` do not.
//! - IBAN: two uppercase letters, two check digits, 11–30 letters and digits, compact or
//!   in groups of four separated by single spaces, passing [`validate::iban`]; a run that
//!   fails is retried cut at each earlier group end.

use std::net::Ipv6Addr;
use std::sync::OnceLock;

use regex::Regex;

use super::detectors::{Hit, CARD, EMAIL, IBAN, IPV4, IPV6, PHONE, SSN, TOKEN};
use super::validate::{self, clear_after, clear_before, isolated, unglued};

/// The compiled built-in regexes, shared by every [`Detector`](super::Detector).
pub(crate) struct Builtins {
    email: Regex,
    e164: Regex,
    nanp: Regex,
    ssn: Regex,
    card: Regex,
    ipv4: Regex,
    ipv6: Regex,
    iban: Regex,
    /// Token-shaped text: `[LABEL_n]` (n up to six digits) or `[LABEL_REDACTED]`.
    pub(crate) token: Regex,
}

impl Builtins {
    pub(crate) fn get() -> &'static Builtins {
        static BUILTINS: OnceLock<Builtins> = OnceLock::new();
        BUILTINS.get_or_init(|| {
            let re = |pattern: &str| Regex::new(pattern).expect("built-in PII regex compiles");
            Builtins {
                email: re(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}"),
                e164: re(r"\+[1-9](?:[ .\-]?[0-9]){7,14}"),
                nanp: re(r"(?:\+1[ .\-]?|1[.\-])?(?:\([0-9]{3}\) ?|[0-9]{3}[ .\-])[0-9]{3}[ .\-][0-9]{4}"),
                ssn: re(r"[0-9]{3}-[0-9]{2}-[0-9]{4}"),
                card: re(r"[0-9](?:[ \-]?[0-9]){12,}"),
                ipv4: re(r"[0-9]+(?:\.[0-9]+)+"),
                ipv6: re(r"[0-9A-Fa-f.:]*:[0-9A-Fa-f.]*:[0-9A-Fa-f.:]*"),
                iban: re(r"[A-Z]{2}[0-9]{2}(?: ?[A-Za-z0-9]{4}){2,7}(?: ?[A-Za-z0-9]{1,3})?"),
                token: re(r"\[[A-Z][A-Z0-9_]{0,31}_(?:[1-9][0-9]{0,5}|REDACTED)\]"),
            }
        })
    }
}

/// Every built-in candidate in `text`, overlapping, in no particular order.
pub(crate) fn all(b: &Builtins, text: &str, out: &mut Vec<Hit>) {
    let hit = |start, end, kind| Hit { start, end, kind };
    out.extend(
        b.token
            .find_iter(text)
            .map(|m| hit(m.start(), m.end(), TOKEN)),
    );
    email(b, text, out);
    e164(b, text, out);
    let mut accept = |s: usize, e: usize, kind, ok: bool| {
        ok.then(|| {
            out.push(hit(s, e, kind));
            e
        })
    };
    bounded(&b.nanp, text, |s, e| accept(s, e, PHONE, nanp(text, s, e)));
    bounded(&b.ssn, text, |s, e| {
        let ok = isolated(text, s, e) && validate::ssn(&text[s..e]);
        accept(s, e, SSN, ok)
    });
    for m in b.card.find_iter(text) {
        cards(text, m.start(), m.end(), out);
    }
    for m in b.ipv4.find_iter(text) {
        if ipv4(text, m.start(), m.end()) {
            out.push(hit(m.start(), m.end(), IPV4));
        }
    }
    for m in b.ipv6.find_iter(text) {
        if let Some((s, e)) = ipv6(text, m.start(), m.end()) {
            out.push(hit(s, e, IPV6));
        }
    }
    bounded(&b.iban, text, |s, e| {
        let end = iban(text, s, e)?;
        out.push(hit(s, end, IBAN));
        Some(end)
    });
}

/// Runs `re` (whose matches are short) over `text`; `accept` checks each candidate and
/// returns the end of what it accepted (the candidate or a prefix of it). The search
/// resumes there, or one character after the start of a rejected candidate.
fn bounded(re: &Regex, text: &str, mut accept: impl FnMut(usize, usize) -> Option<usize>) {
    let mut pos = 0;
    while let Some(m) = re.find_at(text, pos) {
        pos = match accept(m.start(), m.end()) {
            Some(end) => end,
            None => m.start() + text[m.start()..].chars().next().map_or(1, char::len_utf8),
        };
    }
}

fn email(b: &Builtins, text: &str, out: &mut Vec<Hit>) {
    for m in b.email.find_iter(text) {
        let at = m.start() + m.as_str().find('@').unwrap_or(0);
        let mut start = m.start();
        while start + 1 < at && text.as_bytes()[start] == b'.' {
            start += 1;
        }
        if text.as_bytes()[start] != b'.' {
            out.push(Hit {
                start,
                end: m.end(),
                kind: EMAIL,
            });
        }
    }
}

/// E.164 candidates: the whole match and its cuts at spaces that keep 8 or more digits.
fn e164(b: &Builtins, text: &str, out: &mut Vec<Hit>) {
    let bytes = text.as_bytes();
    for m in b.e164.find_iter(text) {
        let (s, e) = (m.start(), m.end());
        if !clear_before(text, s) {
            continue;
        }
        let mut digits = 0;
        for i in s + 1..e {
            if !bytes[i].is_ascii_digit() {
                continue;
            }
            digits += 1;
            let cut = i + 1 == e || bytes[i + 1] == b' ';
            if cut && digits >= 8 && clear_after(text, i + 1) {
                out.push(Hit {
                    start: s,
                    end: i + 1,
                    kind: PHONE,
                });
            }
        }
    }
}

/// Whether the NANP candidate `text[s..e]` is a phone number (see the module docs).
fn nanp(text: &str, s: usize, e: usize) -> bool {
    if !isolated(text, s, e) {
        return false;
    }
    let cand = &text.as_bytes()[s..e];
    let (prefixed, rest) = if let Some(rest) = cand.strip_prefix(b"+1") {
        (true, rest.strip_prefix(b" ").unwrap_or(rest))
    } else if cand.first() == Some(&b'1') && cand.get(1).is_some_and(|c| !c.is_ascii_digit()) {
        (false, &cand[2..])
    } else {
        (false, cand)
    };
    // `+1-`, `+1.`: the separator after the prefix.
    let rest = match rest.first() {
        Some(b'-' | b'.') if prefixed => &rest[1..],
        _ => rest,
    };
    if rest.first() != Some(&b'(') {
        // `AAA?BBB?CCCC`: one kind of separator; spaces only after `+1`.
        if rest.len() != 12 || rest[3] != rest[7] || (!prefixed && rest[3] == b' ') {
            return false;
        }
    }
    let digits: Vec<u8> = rest.iter().copied().filter(u8::is_ascii_digit).collect();
    validate::nanp(&digits)
}

/// The cards in the digit run `text[s..e]` (13 or more digits joined by single spaces or
/// hyphens): at each group, the longest valid candidate starting there.
fn cards(text: &str, s: usize, e: usize, out: &mut Vec<Hit>) {
    let bytes = text.as_bytes();
    // (start, end) of each group of digits.
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut i = s;
    while i < e {
        let g = i;
        while i < e && bytes[i].is_ascii_digit() {
            i += 1;
        }
        groups.push((g, i));
        i += 1;
    }
    let len = |k: usize| groups[k].1 - groups[k].0;
    let joinable = |k: usize| (3..=8).contains(&len(k));
    let mut first = 0;
    while first < groups.len() {
        // The furthest group a card starting at `first` may reach.
        let mut last = first;
        let mut digits = len(first);
        if joinable(first) {
            while last + 1 < groups.len()
                && joinable(last + 1)
                && digits + len(last + 1) <= 19
                && bytes[groups[last].1] == bytes[groups[first].1]
            {
                last += 1;
                digits += len(last);
            }
        }
        let found = (first..=last).rev().find(|&k| {
            let (cs, ce) = (groups[first].0, groups[k].1);
            let n: usize = (first..=k).map(len).sum();
            (13..=19).contains(&n) && isolated(text, cs, ce) && validate::luhn(&text[cs..ce])
        });
        match found {
            Some(k) => {
                out.push(Hit {
                    start: groups[first].0,
                    end: groups[k].1,
                    kind: CARD,
                });
                first = k + 1;
            }
            None => first += 1,
        }
    }
}

/// Whether the dotted run `text[s..e]` is an IPv4 address.
fn ipv4(text: &str, s: usize, e: usize) -> bool {
    if !unglued(text, s, e) {
        return false;
    }
    let mut parts = 0;
    for part in text[s..e].split('.') {
        parts += 1;
        if parts > 4 || part.len() > 3 || part.parse::<u8>().is_err() {
            return false;
        }
    }
    parts == 4
}

/// The IPv6 address in the run `text[s..e]` of hex digits, colons and dots, if any.
fn ipv6(text: &str, mut s: usize, mut e: usize) -> Option<(usize, usize)> {
    let b = text.as_bytes();
    if b[s] == b':' && b.get(s + 1) != Some(&b':') {
        s += 1;
    }
    if e - s > 2 && (b[e - 1] == b'.' || (b[e - 1] == b':' && b[e - 2] != b':')) {
        e -= 1;
    }
    let cand = &text[s..e];
    let compressed = cand.contains("::");
    // Written out in full an address has seven colons, or six before an IPv4 suffix.
    let plausible = compressed || cand.bytes().filter(|&c| c == b':').count() >= 6;
    if !plausible || cand.len() > 45 || !unglued(text, s, e) || cand.parse::<Ipv6Addr>().is_err() {
        return None;
    }
    if !compressed {
        return Some((s, e));
    }
    let has_digit = cand.bytes().any(|c| c.is_ascii_digit());
    let long_group = cand
        .split([':', '.'])
        .any(|g| g.len() >= 3 && g.bytes().all(|c| c.is_ascii_hexdigit()));
    (has_digit && (long_group || cand == "::1")).then_some((s, e))
}

/// The end of the longest valid IBAN starting at `s` within the candidate `text[s..e]`.
fn iban(text: &str, s: usize, e: usize) -> Option<usize> {
    if !clear_before(text, s) {
        return None;
    }
    let bytes = &text.as_bytes()[..e];
    let mut compact: Vec<u8> = Vec::with_capacity(e - s);
    // (end offset, compact length) after each alphanumeric.
    let mut ends: Vec<(usize, usize)> = Vec::with_capacity(e - s);
    for (i, &c) in bytes.iter().enumerate().skip(s) {
        if c != b' ' {
            compact.push(c);
            ends.push((i + 1, compact.len()));
        }
    }
    let valid = validate::iban_prefixes(&compact);
    ends.into_iter()
        .rev()
        .find(|&(end, n)| valid[n] && clear_after(text, end))
        .map(|(end, _)| end)
}
