//! Tokens, restoring, JSON, the cap, a deterministic fuzz test and a 10 MB input.

use std::sync::Arc;

use serde_json::json;

use super::{CustomPattern, Detector, Vault, MAX_ENTRIES};

fn vault() -> Vault {
    Vault::new(Arc::new(Detector::builtin()))
}

#[test]
fn same_value_same_token_across_calls() {
    let v = vault();
    assert_eq!(
        v.tokenize("alice@example.com and bob@example.com"),
        "[EMAIL_1] and [EMAIL_2]"
    );
    assert_eq!(v.tokenize("again alice@example.com"), "again [EMAIL_1]");
    assert_eq!(
        v.tokenize("+44 20 7946 0958, 10.0.0.1, bob@example.com"),
        "[PHONE_1], [IPV4_1], [EMAIL_2]"
    );
    assert_eq!(v.len(), 4);
    assert!(!v.is_empty());
    // Another vault numbers on its own.
    let w = vault();
    assert!(w.is_empty());
    assert_eq!(w.tokenize("bob@example.com"), "[EMAIL_1]");
}

#[test]
fn nothing_found_is_unchanged() {
    let v = vault();
    for text in [
        "",
        "hello world",
        "version 1.2.3 on 2024-01-15",
        "ünïcödé ✓",
    ] {
        assert_eq!(v.tokenize(text), text);
    }
    assert!(v.is_empty());
}

#[test]
fn emails_are_case_insensitive_and_restore_to_first_spelling() {
    let v = vault();
    assert_eq!(
        v.tokenize("Alice@Example.com, alice@example.com, ALICE@EXAMPLE.COM"),
        "[EMAIL_1], [EMAIL_1], [EMAIL_1]"
    );
    assert_eq!(v.len(), 1);
    assert_eq!(v.restore("to [EMAIL_1]"), "to Alice@Example.com");
    // Other labels compare exactly.
    assert_eq!(
        v.tokenize("GB82WEST12345698765432 GB82west12345698765432"),
        "[IBAN_1] [IBAN_2]"
    );
}

#[test]
fn restore_round_trip() {
    let v = vault();
    let text = "Mail alice@example.com or call (415) 555-0123; card 4111 1111 1111 1111, \
                SSN 123-45-6789, IBAN GB82 WEST 1234 5698 7654 32, hosts 192.168.0.1 and fe80::1.";
    let tokenized = v.tokenize(text);
    for raw in [
        "alice@",
        "555-0123",
        "4111",
        "123-45-6789",
        "WEST",
        "192.168",
        "fe80",
    ] {
        assert!(!tokenized.contains(raw), "{raw} left in {tokenized}");
    }
    assert_eq!(
        tokenized,
        "Mail [EMAIL_1] or call [PHONE_1]; card [CARD_1], SSN [SSN_1], IBAN [IBAN_1], \
         hosts [IPV4_1] and [IPV6_1]."
    );
    assert_eq!(v.restore(&tokenized), text);
}

#[test]
fn restore_leaves_unknown_tokens_and_look_alikes() {
    let v = vault();
    v.tokenize("alice@example.com");
    let other = vault();
    other.tokenize("x@example.com y@example.com");
    for text in [
        "[EMAIL_2]",
        "[EMAIL_0]",
        "[EMAIL_01]",
        "[email_1]",
        "[EMAIL_1",
        "EMAIL_1]",
        "[ EMAIL_1]",
        "[PHONE_1]",
        "[EMAIL_REDACTED]",
        "{EMAIL_1}",
    ] {
        assert_eq!(v.restore(text), text);
    }
    assert_eq!(
        v.restore("[[EMAIL_1]] [EMAIL_1][EMAIL_2]"),
        "[alice@example.com] alice@example.com[EMAIL_2]"
    );
    // Tokens are per vault.
    assert_eq!(other.restore("[EMAIL_1]"), "x@example.com");
    assert_eq!(vault().restore("[EMAIL_1]"), "[EMAIL_1]");
}

#[test]
fn tokenizing_tokens_changes_nothing() {
    let v = vault();
    let once = v.tokenize("alice@example.com 4111111111111111 [EMAIL_7] [CARD_REDACTED]");
    assert_eq!(once, "[EMAIL_1] [CARD_1] [EMAIL_7] [CARD_REDACTED]");
    assert_eq!(v.tokenize(&once), once);
    assert_eq!(v.len(), 2);
}

#[test]
fn json_in_place() {
    let v = vault();
    let mut value = json!({
        "alice@example.com": "alice@example.com",
        "list": ["call +14155550123", 4111111111111111u64, null, true, {"ip": "10.0.0.1"}],
        "nested": {"deeper": [[["bob@example.com"]]]},
        "n": 1.5
    });
    v.tokenize_json(&mut value);
    assert_eq!(
        value,
        json!({
            "alice@example.com": "[EMAIL_1]",
            "list": ["call [PHONE_1]", 4111111111111111u64, null, true, {"ip": "[IPV4_1]"}],
            "nested": {"deeper": [[["[EMAIL_2]"]]]},
            "n": 1.5
        })
    );
    let mut args = json!({"to": ["[EMAIL_2]", "[EMAIL_9]"], "[EMAIL_1]": {"cc": "[EMAIL_1]"}});
    v.restore_json(&mut args);
    assert_eq!(
        args,
        json!({"to": ["bob@example.com", "[EMAIL_9]"], "[EMAIL_1]": {"cc": "alice@example.com"}})
    );
    let mut scalar = json!("mail alice@example.com");
    v.tokenize_json(&mut scalar);
    assert_eq!(scalar, json!("mail [EMAIL_1]"));
}

#[test]
fn deeply_nested_json_does_not_overflow() {
    let mut value = json!("bob@example.com");
    for _ in 0..20_000 {
        value = serde_json::Value::Array(vec![value]);
    }
    let v = vault();
    v.tokenize_json(&mut value);
    v.restore_json(&mut value);
    let mut inner = &value;
    while let serde_json::Value::Array(items) = inner {
        inner = &items[0];
    }
    assert_eq!(inner, &json!("bob@example.com"));
    // Dropping a deep value recurses in serde_json; unwind it by hand.
    let mut cur = value;
    while let serde_json::Value::Array(mut items) = cur {
        cur = items.pop().unwrap_or(serde_json::Value::Null);
    }
}

#[test]
fn custom_labels_make_tokens() {
    let d = Detector::new(&[CustomPattern {
        label: "EMPLOYEE_ID".into(),
        regex: r"\bE-[0-9]{6}\b".into(),
    }])
    .unwrap();
    let v = Vault::new(Arc::new(d));
    let t = v.tokenize("E-123456, E-654321, E-123456");
    assert_eq!(t, "[EMPLOYEE_ID_1], [EMPLOYEE_ID_2], [EMPLOYEE_ID_1]");
    assert_eq!(v.restore(&t), "E-123456, E-654321, E-123456");
}

#[test]
fn cap_redacts_new_values() {
    let v = vault();
    let text: String = (0..MAX_ENTRIES)
        .map(|i| format!("u{i}@example.com "))
        .collect();
    let tokenized = v.tokenize(&text);
    assert_eq!(v.len(), MAX_ENTRIES);
    assert!(tokenized.ends_with(&format!("[EMAIL_{MAX_ENTRIES}] ")));
    // Known values keep their tokens; new ones are redacted, whatever the label.
    assert_eq!(
        v.tokenize("u7@example.com new@example.com 4111111111111111"),
        "[EMAIL_8] [EMAIL_REDACTED] [CARD_REDACTED]"
    );
    assert_eq!(v.len(), MAX_ENTRIES);
    assert_eq!(
        v.restore("[EMAIL_REDACTED] [EMAIL_8]"),
        "[EMAIL_REDACTED] u7@example.com"
    );
}

#[test]
fn debug_prints_counts_not_values() {
    let v = vault();
    v.tokenize("alice@example.com 4111 1111 1111 1111");
    let dbg = format!("{v:?}");
    assert!(dbg.contains("entries: 2"), "{dbg}");
    assert!(!dbg.contains("alice") && !dbg.contains("4111"), "{dbg}");
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Vault>();
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Pieces of PII and of near misses, glued at random with separators and random bytes:
/// inputs that exercise every detector and its boundaries. No upper-case letters in
/// emails, so no two emails differ only in case.
fn fuzz_input(rng: &mut Rng) -> String {
    const PIECES: &[&str] = &[
        "4111", "1111", "5555", "4444", "0123", "415", "555", "+1", "+44", "20", "7946", "0958",
        "123", "45", "6789", "000", "10", "0", "255", "256", "1", "9", "fe80", "ffff", "db8",
        "2001", "a", "beef", "GB82", "WEST", "1234", "5698", "7654", "32", "DE89", "3704", "0044",
        "0532", "0130", "00", "user", "x.y", "@", "example", "com", "io", "E-123456",
    ];
    const GLUE: &[u8] = b" .-:@+()_%[]\n\t,;/";
    let mut bytes = Vec::new();
    for _ in 0..rng.below(40) {
        match rng.below(8) {
            0 => bytes.push(rng.next() as u8),
            1 | 2 => bytes.push(GLUE[rng.below(GLUE.len())]),
            3 => bytes.extend_from_slice(b"::"),
            _ => bytes.extend_from_slice(PIECES[rng.below(PIECES.len())].as_bytes()),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn fuzz_never_panics_and_round_trips() {
    let detector = Arc::new(
        Detector::new(&[CustomPattern {
            label: "EMPLOYEE_ID".into(),
            regex: r"E-[0-9]{6}".into(),
        }])
        .unwrap(),
    );
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut detections = 0;
    for i in 0..4000 {
        let s = if i % 4 == 0 {
            let len = rng.below(300);
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        } else {
            fuzz_input(&mut rng)
        };
        let v = Vault::new(detector.clone());
        let t = v.tokenize(&s);
        detections += v.len();
        // Tokenizing again keeps the tokens (it may find more: text glued to a value
        // can stand alone once the value is a token), and restoring undoes both.
        let t2 = v.tokenize(&t);
        if !s.contains('[') {
            assert_eq!(v.restore(&t), s, "round trip: {s:?}");
            assert_eq!(v.restore(&t2), s, "round trip twice: {s:?}");
        }
        for m in detector.find(&s) {
            assert!(m.start < m.end && s.is_char_boundary(m.start) && s.is_char_boundary(m.end));
        }
    }
    // The alphabet is meant to produce detections; make sure it does.
    assert!(detections > 100, "only {detections} detections");
}

#[test]
fn ten_megabytes() {
    let line = |i: usize| {
        format!(
            "{i:07} user{}@example.com called +1 415 555 {:04} from 10.0.{}.{} at 12:30:45 \
             on 2024-01-15 (v1.2.3); nothing else here, just some words to pad the line.\n",
            i % 5000,
            i % 10_000,
            i % 250,
            i % 199
        )
    };
    let mut text = String::with_capacity(10 << 20);
    let mut lines = 0;
    while text.len() < 10 << 20 {
        text.push_str(&line(lines));
        lines += 1;
    }
    let v = vault();
    let t = v.tokenize(&text);
    assert_eq!(t.matches("[EMAIL_").count(), lines);
    assert_eq!(t.matches("[PHONE_").count(), lines);
    assert_eq!(t.matches("[IPV4_").count(), lines);
    assert!(!t.contains("@example.com") && !t.contains("415 555"));
    assert_eq!(t.lines().count(), lines);
    let first = t.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        "0000000 [EMAIL_1] called [PHONE_1] from [IPV4_1] at 12:30:45 on 2024-01-15 (v1.2.3); \
         nothing else here, just some words to pad the line."
    );
    assert_eq!(v.restore(&t), text);
}

/// Long runs that keep candidates coming (timed in release by hand: each 10 MB variant
/// of these takes well under a second; debug builds of `regex` are too slow to time).
#[test]
fn hostile_runs() {
    let v = vault();
    for unit in [
        "1-1.1:1 ",
        "9",
        "a:",
        "222-222-2222-",
        "+1111111111111111",
        "GB82 WEST ",
        "1 ",
    ] {
        let text = unit.repeat((1 << 18) / unit.len());
        assert_eq!(v.tokenize(&text), text, "{unit:?}");
    }
    let text = "1.1.1.1 ".repeat(1 << 15);
    let t = v.tokenize(&text);
    assert_eq!(t, "[IPV4_1] ".repeat(1 << 15));
    assert_eq!(v.restore(&t), text);
}

/// Found by fuzzing (fuzz/regressions/pii): a value that lost a shared character to a
/// neighbour of higher precedence was left as it was; tokenizing again found it.
#[test]
fn a_value_beside_a_hit_of_higher_precedence_is_tokenized_too() {
    let v = vault();
    for text in [
        "ip 10.0.0.1+1 415 555 0100, call me",
        "ip 10.0.0.1::1 and more",
        "at 2001:db8::1 and 10.0.0.1",
    ] {
        let once = v.tokenize(text);
        assert_eq!(v.tokenize(&once), once, "{text:?} -> {once:?}");
        assert_eq!(v.restore(&once), text);
    }
    let once = v.tokenize("ip 10.0.0.1+1 415 555 0100, call me");
    assert!(!once.contains("415"), "{once}");
}

/// Found by fuzzing: an E.164 number whose `+` follows a digit is glued, and free once the
/// number before it is a token, so a chain of them needs a detection round per link. A
/// short chain is tokenized link by link; a long one fails closed, redacted whole.
#[test]
fn a_chain_of_glued_phone_numbers_never_leaves_one_in_clear() {
    let chain = |links: usize| {
        let mut text = String::from("phones: ");
        for i in 0..links {
            text.push_str(&format!("+44 20 7946 {:04}", 100 + i));
        }
        text
    };
    let v = vault();
    let short = chain(4);
    let once = v.tokenize(&short);
    assert_eq!(once, "phones: [PHONE_1][PHONE_2][PHONE_3][PHONE_4]");
    assert_eq!(v.restore(&once), short);
    for links in [9, 40] {
        let long = chain(links);
        let once = v.tokenize(&long);
        assert_eq!(once, "[PHONE_REDACTED]", "{links} links");
        assert_eq!(v.tokenize(&once), once);
        assert!(!v.restore(&once).contains("7946"));
    }
    let mut json = serde_json::json!({"a": chain(12), "b": ["alice@example.com"]});
    v.tokenize_json(&mut json);
    assert_eq!(json["a"], "[PHONE_REDACTED]");
    assert_eq!(json["b"][0], "[EMAIL_1]");
}
