//! True and false positives of every detector, overlaps and custom patterns.

use super::{CustomPattern, Detector, Error};

/// `(label, matched text)` of everything the built-in detectors find in `text`.
fn found(text: &str) -> Vec<(String, String)> {
    found_with(&Detector::builtin(), text)
}

fn found_with(d: &Detector, text: &str) -> Vec<(String, String)> {
    d.find(text)
        .into_iter()
        .map(|m| (m.kind, text[m.start..m.end].to_string()))
        .collect()
}

/// Asserts that `text` holds exactly one detection, of `label`, covering `value`.
#[track_caller]
fn one(text: &str, label: &str, value: &str) {
    assert_eq!(
        found(text),
        vec![(label.to_string(), value.to_string())],
        "in {text:?}"
    );
}

#[track_caller]
fn none(text: &str) {
    assert_eq!(found(text), vec![], "in {text:?}");
}

#[test]
fn email() {
    one("mail alice@example.com today", "EMAIL", "alice@example.com");
    one(
        "<Bob.Smith+tag@mail.example.co.uk>",
        "EMAIL",
        "Bob.Smith+tag@mail.example.co.uk",
    );
    one(
        "x_y%z-1@sub-domain.example.org.",
        "EMAIL",
        "x_y%z-1@sub-domain.example.org",
    );
    one("see: ...carol@example.com", "EMAIL", "carol@example.com");
    one("\"to\":\"dave@example.io\"", "EMAIL", "dave@example.io");
    for text in [
        "a@b",
        "@foo.com",
        "user@localhost",
        "user@example.c",
        "user@-example.com",
        "user@.com",
        "...@example.com",
        "ratio 3@4.5",
    ] {
        none(text);
    }
}

#[test]
fn phone_e164() {
    one("call +44 20 7946 0958 now", "PHONE", "+44 20 7946 0958");
    one("+14155550123", "PHONE", "+14155550123");
    one("tel:+33-1-23-45-67-89;", "PHONE", "+33-1-23-45-67-89");
    one("(+49.30.1234567)", "PHONE", "+49.30.1234567");
    for text in [
        "+1234567",           // 7 digits
        "+1234567890123456",  // 16 digits
        "+0123456789",        // no country code starts with 0
        "a+14155550123",      // glued to a word
        "3+14155550123",      // arithmetic
        "+14155550123-45678", // 16 digits
        "+1 2",
    ] {
        none(text);
    }
}

#[test]
fn phone_nanp() {
    for (text, phone) in [
        ("(415) 555-0123", "(415) 555-0123"),
        ("call 415-555-0123.", "415-555-0123"),
        ("415.555.0123", "415.555.0123"),
        ("1-415-555-0123", "1-415-555-0123"),
        ("+1 415 555 0123", "+1 415 555 0123"),
        ("+1 (415) 555-0123", "+1 (415) 555-0123"),
        ("+1-415-555-0123", "+1-415-555-0123"),
    ] {
        one(text, "PHONE", phone);
    }
    for text in [
        "115-555-0123",      // area code starts with 1
        "415-155-0123",      // exchange starts with 1
        "415-555.0123",      // mixed separators
        "415 555 0123",      // spaces need +1
        "4155550123",        // a plain digit run
        "21-415-555-0123",   // inside a longer hyphenated run
        "415-555-0123-4567", // continued
        "x415-555-0123",
        "415-555-01234",
    ] {
        none(text);
    }
}

#[test]
fn not_phones_or_addresses() {
    for text in [
        "2024-01-15",
        "on 2024-01-15 at 12:30:45",
        "12:30:45.123",
        "version 1.2.3",
        "v1.2.3",
        "1.2.3",
        "123456789012345",
        "98765432109876543210",
        "ISBN 978-3-16-148410-0",
        "pi 3.14159265358979",
        "2024-01-15T12:30:45Z",
        "id 1234-5678",
    ] {
        none(text);
    }
}

#[test]
fn ssn() {
    one("SSN 123-45-6789.", "SSN", "123-45-6789");
    one("ssn:078-05-1120", "SSN", "078-05-1120");
    for text in [
        "000-12-3456",
        "666-12-3456",
        "900-12-3456",
        "123-00-4567",
        "123-45-0000",
        "1123-45-6789",
        "123-45-67890",
        "a123-45-6789",
        "123-45-6789-1",
        "123 45 6789",
    ] {
        none(text);
    }
}

#[test]
fn card() {
    one(
        "card 4111 1111 1111 1111 exp",
        "CARD",
        "4111 1111 1111 1111",
    );
    one("4111111111111111", "CARD", "4111111111111111");
    one("5555-5555-5555-4444", "CARD", "5555-5555-5555-4444");
    one("amex 3782 822463 10005", "CARD", "3782 822463 10005");
    one(
        "order 12 4111 1111 1111 1111",
        "CARD",
        "4111 1111 1111 1111",
    );
    one("4111 1111 1111 1111 and 7", "CARD", "4111 1111 1111 1111");
    for text in [
        "4111 1111 1111 1112",  // Luhn fails
        "1234567812345678",     // Luhn fails
        "4111-1111 1111-1111",  // mixed separators
        "41111111111111111111", // 20 digits
        "x4111111111111111",    // glued to a word
        "4111111111111111y",
        "1.4111111111111111",            // a decimal
        "4111  1111  1111  1111",        // double spaces
        "1 2 3 4 5 6 7 8 9 1 2 3 0 0 0", // a list of small numbers
        "000000000000",                  // 12 digits
    ] {
        none(text);
    }
}

#[test]
fn ipv4() {
    one("host 192.168.1.10:8080", "IPV4", "192.168.1.10");
    one("10.0.0.1.", "IPV4", "10.0.0.1");
    one("(255.255.255.0)", "IPV4", "255.255.255.0");
    one("net 10.0.0.0/8", "IPV4", "10.0.0.0");
    assert_eq!(
        found("from 10.0.0.1-10.0.0.9"),
        vec![
            ("IPV4".to_string(), "10.0.0.1".to_string()),
            ("IPV4".to_string(), "10.0.0.9".to_string())
        ]
    );
    for text in [
        "1.2.3.4.5",
        "256.1.1.1",
        "1.2.3",
        "1.2.3.1234",
        "v1.2.3.4",
        "1.2.3.4a",
        "version 10.0.19041.1",
    ] {
        none(text);
    }
}

#[test]
fn ipv6() {
    for (text, addr) in [
        ("loopback ::1 ok", "::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("[2001:db8::1]:8080", "2001:db8::1"),
        (
            "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
            "2001:0db8:85a3:0000:0000:8a2e:0370:7334",
        ),
        ("at 2001:db8::8a2e:370:7334.", "2001:db8::8a2e:370:7334"),
        ("ip:fe80::1", "fe80::1"),
        ("addr fe80:: up", "fe80::"),
    ] {
        one(text, "IPV6", addr);
    }
    // IPv4-suffixed: one IPV6 match, not an IPV4 inside it.
    one("::ffff:192.0.2.1", "IPV6", "::ffff:192.0.2.1");
    for text in [
        "12:30:45",
        "a::b",
        "std::vector<int>",
        "dead::beef",
        "x[1::2]",
        "y[::2]",
        "::",
        "00:1a:2b:3c:4d:5e",
        "fe80::1x",
        "gfe80::1",
        "1:2:3",
    ] {
        none(text);
    }
}

#[test]
fn iban() {
    one(
        "IBAN GB82 WEST 1234 5698 7654 32, thanks",
        "IBAN",
        "GB82 WEST 1234 5698 7654 32",
    );
    one("DE89370400440532013000", "IBAN", "DE89370400440532013000");
    one(
        "FR14 2004 1010 0505 0001 3M02 606",
        "IBAN",
        "FR14 2004 1010 0505 0001 3M02 606",
    );
    one(
        "GB82 WEST 1234 5698 7654 32 ABCD",
        "IBAN",
        "GB82 WEST 1234 5698 7654 32",
    );
    // A valid prefix is taken and the search goes on after it.
    assert_eq!(
        found("BE68 5390 0754 7034 GB82 WEST 1234 5698 7654 32"),
        vec![
            ("IBAN".to_string(), "BE68 5390 0754 7034".to_string()),
            (
                "IBAN".to_string(),
                "GB82 WEST 1234 5698 7654 32".to_string()
            )
        ]
    );
    for text in [
        "GB83 WEST 1234 5698 7654 32", // wrong check digits
        "gb82 WEST 1234 5698 7654 32", // lower-case country
        "XGB82WEST12345698765432",     // glued
        "GB82WEST12345698765432X",
        "GB82  WEST 1234 5698 7654 32",
    ] {
        none(text);
    }
}

#[test]
fn overlaps_prefer_validation_then_earliest_longest() {
    // A phone number followed by a card: the E.164 run is cut before the card.
    assert_eq!(
        found("+14155550123 4111 1111 1111 1111"),
        vec![
            ("PHONE".to_string(), "+14155550123".to_string()),
            ("CARD".to_string(), "4111 1111 1111 1111".to_string())
        ]
    );
    // Matches come sorted and disjoint.
    let text = "a@b.io 10.0.0.1 123-45-6789 +44 20 7946 0958 fe80::1 GB82WEST12345698765432";
    let d = Detector::builtin();
    let ms = d.find(text);
    let kinds: Vec<&str> = ms.iter().map(|m| m.kind.as_str()).collect();
    assert_eq!(kinds, ["EMAIL", "IPV4", "SSN", "PHONE", "IPV6", "IBAN"]);
    assert!(ms.windows(2).all(|w| w[0].end <= w[1].start));
}

#[test]
fn tokens_are_not_detected() {
    none("[EMAIL_1] [PHONE_12] [CARD_REDACTED] [EMPLOYEE_ID_3]");
    let d = Detector::new(&[CustomPattern {
        label: "CODE".into(),
        regex: r"[A-Z]+_[0-9]+".into(),
    }])
    .unwrap();
    assert_eq!(found_with(&d, "[EMAIL_1]"), vec![]);
    assert_eq!(
        found_with(&d, "ABC_1 [EMAIL_1]"),
        vec![("CODE".to_string(), "ABC_1".to_string())]
    );
}

#[test]
fn custom_patterns() {
    let d = Detector::new(&[
        CustomPattern {
            label: "EMPLOYEE_ID".into(),
            regex: r"\bE-[0-9]{6}\b".into(),
        },
        CustomPattern {
            label: "PROJECT".into(),
            regex: r"(?i)project [a-z]+".into(),
        },
    ])
    .unwrap();
    assert_eq!(
        found_with(&d, "E-123456 on Project Falcon, bob@example.com"),
        vec![
            ("EMPLOYEE_ID".to_string(), "E-123456".to_string()),
            ("PROJECT".to_string(), "Project Falcon".to_string()),
            ("EMAIL".to_string(), "bob@example.com".to_string())
        ]
    );
    // Built-ins come first on equal spans.
    let d = Detector::new(&[CustomPattern {
        label: "MAIL".into(),
        regex: r"\S+@\S+".into(),
    }])
    .unwrap();
    assert_eq!(
        found_with(&d, "bob@example.com"),
        vec![("EMAIL".to_string(), "bob@example.com".to_string())]
    );
    assert!(format!("{d:?}").contains("MAIL"));
}

fn refused(label: &str, regex: &str) -> String {
    let err = Detector::new(&[CustomPattern {
        label: label.into(),
        regex: regex.into(),
    }])
    .unwrap_err();
    err.to_string()
}

#[test]
fn bad_custom_patterns_are_explained() {
    for label in [
        "",
        "employee",
        "1ABC",
        "A-B",
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456",
        "É",
    ] {
        let msg = refused(label, "x");
        assert!(msg.contains("^[A-Z][A-Z0-9_]{0,31}$"), "{msg}");
    }
    assert_eq!(
        refused("EMAIL", "x"),
        "custom PII label \"EMAIL\" is a built-in label (EMAIL, PHONE, SSN, CARD, IPV4, IPV6, IBAN)"
    );
    let msg = refused("ORDER", "ORD-(");
    assert!(
        msg.starts_with("custom PII pattern ORDER: regex \"ORD-(\" does not compile: "),
        "{msg}"
    );
    assert!(msg.contains("unclosed group"), "{msg}");
    let msg = refused("BIG", r"\w{1000}\w{1000}\w{1000}");
    assert!(
        msg.contains("BIG") && msg.contains("1048576 bytes"),
        "{msg}"
    );
    for regex in ["x*", "(abc)?", r"\b\w*", "(?m)$", "a|", r"\s*"] {
        let msg = refused("EMPTY", regex);
        assert!(msg.contains("matches the empty string"), "{regex}: {msg}");
    }
    let twice = Detector::new(&[
        CustomPattern {
            label: "A".into(),
            regex: "x".into(),
        },
        CustomPattern {
            label: "A".into(),
            regex: "y".into(),
        },
    ])
    .unwrap_err();
    assert!(matches!(twice, Error::BadLabel { .. }));
    assert!(twice.to_string().contains("defined twice"));
    // A 32-character label is fine.
    refused_not("ABCDEFGHIJKLMNOPQRSTUVWXYZ012345");
}

fn refused_not(label: &str) {
    Detector::new(&[CustomPattern {
        label: label.into(),
        regex: "x".into(),
    }])
    .unwrap();
}

#[test]
fn detector_is_send_sync_and_debug_shows_labels() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Detector>();
    let dbg = format!("{:?}", Detector::builtin());
    assert!(dbg.contains("EMAIL") && dbg.contains("IBAN"), "{dbg}");
}

#[test]
fn offsets_are_char_boundaries_in_unicode_text() {
    let text = "é✓ alice@example.com 日本 +44 20 7946 0958 ü fe80::1 😀";
    for m in Detector::builtin().find(text) {
        assert!(text.is_char_boundary(m.start) && text.is_char_boundary(m.end));
    }
    assert_eq!(found(text).len(), 3);
}
