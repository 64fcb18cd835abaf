//! The checks that turn regex candidates into detections: check digits (Luhn, ISO 13616
//! mod-97), number-plan rules (US SSN, NANP) and the boundary rule of the numeric
//! detectors. Pure functions over ASCII; none of them panics on any input.

/// Letters, digits (of any script) and `_`: what glues a number into a longer token.
pub(crate) fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether nothing glues `text[..start]` to what follows: the character before is not a
/// word character, nor a `.` or `-` that continues a number (`1.` or `2024-`).
pub(crate) fn clear_before(text: &str, start: usize) -> bool {
    let mut before = text[..start].chars().rev();
    match before.next() {
        Some(c) if is_word(c) => false,
        Some('.' | '-') => !before.next().is_some_and(|c| c.is_ascii_digit()),
        _ => true,
    }
}

/// Whether nothing glues `text[end..]` to what precedes: the character after is not a word
/// character, nor a `.` or `-` followed by a digit (`.5`, `-2024`).
pub(crate) fn clear_after(text: &str, end: usize) -> bool {
    let mut after = text[end..].chars();
    match after.next() {
        Some(c) if is_word(c) => false,
        Some('.' | '-') => !after.next().is_some_and(|c| c.is_ascii_digit()),
        _ => true,
    }
}

/// `text[start..end]` stands alone: [`clear_before`] and [`clear_after`].
pub(crate) fn isolated(text: &str, start: usize, end: usize) -> bool {
    clear_before(text, start) && clear_after(text, end)
}

/// No word character touches `text[start..end]` on either side; unlike [`isolated`],
/// separators do not matter (`10.0.0.1-10.0.0.9` is two addresses).
pub(crate) fn unglued(text: &str, start: usize, end: usize) -> bool {
    !text[..start].chars().next_back().is_some_and(is_word)
        && !text[end..].chars().next().is_some_and(is_word)
}

/// The Luhn (mod 10) check over the ASCII digits of `s`; other characters (separators)
/// are skipped. False when `s` has no digits.
pub(crate) fn luhn(s: &str) -> bool {
    let mut sum = 0u32;
    let mut count = 0usize;
    for (i, b) in s.bytes().rev().filter(u8::is_ascii_digit).enumerate() {
        let mut d = u32::from(b - b'0');
        if i % 2 == 1 {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
        count += 1;
    }
    count > 0 && sum % 10 == 0
}

/// The ISO 13616 check of an IBAN written without spaces: two uppercase letters, check
/// digits 02 to 98, 11 to 30 letters and digits; moved-to-the-end and letters-as-numbers
/// mod 97 is 1. (The scanner uses [`iban_prefixes`], which tries every cut at once.)
#[cfg(test)]
fn iban(compact: &[u8]) -> bool {
    iban_prefixes(compact).last().copied().unwrap_or(false)
}

/// For each `n` in `0..=compact.len()`, whether `compact[..n]` passes [`iban`]: one pass
/// (the remainder of the BBAN grows a character at a time; the six digits of the country
/// code and check digits are appended for each length), so trying every cut of a
/// candidate costs no more than checking it once.
pub(crate) fn iban_prefixes(compact: &[u8]) -> Vec<bool> {
    let mut valid = vec![false; compact.len() + 1];
    let header_ok = compact.len() >= 4
        && compact[..2].iter().all(u8::is_ascii_uppercase)
        && compact[2..4].iter().all(u8::is_ascii_digit)
        && !matches!(&compact[2..4], b"00" | b"01" | b"99");
    if !header_ok {
        return valid;
    }
    // Letters count as two digits (A = 10 ... Z = 35), so the header is six digits.
    let letter = |c: u8| u32::from(c.to_ascii_uppercase() - b'A') + 10;
    let header = (letter(compact[0]) * 100 + letter(compact[1])) * 100
        + u32::from(compact[2] - b'0') * 10
        + u32::from(compact[3] - b'0');
    let mut bban = 0u32;
    for (i, &c) in compact.iter().enumerate().skip(4) {
        bban = match c {
            b'0'..=b'9' => (bban * 10 + u32::from(c - b'0')) % 97,
            c if c.is_ascii_alphabetic() => (bban * 100 + letter(c)) % 97,
            _ => return valid,
        };
        let n = i + 1;
        valid[n] = (15..=34).contains(&n) && (bban * 1_000_000 + header) % 97 == 1;
    }
    valid
}

/// A US SSN `AAA-GG-SSSS` that could be issued: area not 000, 666 or 900–999, group not
/// 00, serial not 0000. False for anything not in that shape.
pub(crate) fn ssn(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 11 || b[3] != b'-' || b[6] != b'-' {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if !(digits(0..3) && digits(4..6) && digits(7..11)) {
        return false;
    }
    let area = &b[0..3];
    area != b"000" && area != b"666" && area[0] != b'9' && &b[4..6] != b"00" && &b[7..11] != b"0000"
}

/// A NANP number of ten ASCII digits (area code, exchange, line): area code and exchange
/// start with 2–9.
pub(crate) fn nanp(digits: &[u8]) -> bool {
    digits.len() == 10
        && digits.iter().all(u8::is_ascii_digit)
        && (b'2'..=b'9').contains(&digits[0])
        && (b'2'..=b'9').contains(&digits[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn luhn_accepts_test_cards_and_rejects_others() {
        for ok in [
            "4111111111111111",
            "4111 1111 1111 1111",
            "5555-5555-5555-4444",
            "378282246310005",
            "6011111111111117",
            "79927398713",
        ] {
            assert!(luhn(ok), "{ok}");
        }
        for bad in [
            "4111111111111112",
            "1234567812345678",
            "79927398710",
            "",
            "--",
        ] {
            assert!(!luhn(bad), "{bad}");
        }
    }

    #[test]
    fn iban_mod97() {
        assert!(iban(b"GB82WEST12345698765432"));
        assert!(iban(b"DE89370400440532013000"));
        assert!(iban(b"FR1420041010050500013M02606"));
        assert!(iban(b"GB82west12345698765432"));
        assert!(!iban(b"GB83WEST12345698765432"));
        assert!(!iban(b"gb82WEST12345698765432"));
        assert!(!iban(b"GB82WEST1234569876543"));
        assert!(!iban(b"GB82 WEST12345698765432"));
        assert!(!iban(b""));
        assert!(!iban(b"GB82"));
        assert!(!iban(b"GB82WEST12345698765432!"));
        let prefixes = iban_prefixes(b"GB82WEST12345698765432ABCD");
        let valid: Vec<usize> = (0..prefixes.len()).filter(|&n| prefixes[n]).collect();
        assert_eq!(valid, [22]);
    }

    #[test]
    fn ssn_rules() {
        assert!(ssn("123-45-6789"));
        assert!(ssn("899-01-0001"));
        for bad in [
            "000-12-3456",
            "666-12-3456",
            "900-12-3456",
            "999-12-3456",
            "123-00-4567",
            "123-45-0000",
            "123456789",
            "12-345-6789",
            "abc-de-fghi",
        ] {
            assert!(!ssn(bad), "{bad}");
        }
    }

    #[test]
    fn nanp_rules() {
        assert!(nanp(b"4155550123"));
        assert!(!nanp(b"1155550123"));
        assert!(!nanp(b"0155550123"));
        assert!(!nanp(b"4151550123"));
        assert!(!nanp(b"415555012"));
    }

    #[test]
    fn boundaries() {
        let t = "a1 2.3 x-4 5-6 é7_ (8)";
        // "1" after "a": glued.
        assert!(!clear_before(t, 1));
        // "3" after "2.": a continued number.
        assert!(!clear_before(t, 5));
        // "4" after "x-": fine.
        assert!(clear_before(t, 9));
        // "5" before "-6": continued.
        assert!(!clear_after(t, 12));
        // "7" after "é": glued; before "_": glued.
        let seven = t.find('7').unwrap();
        assert!(!clear_before(t, seven));
        assert!(!clear_after(t, seven + 1));
        let eight = t.find('8').unwrap();
        assert!(isolated(t, eight, eight + 1));
        assert!(isolated("", 0, 0));
        assert!(unglued("1-2", 2, 3) && !unglued("a2", 1, 2) && !unglued("2_", 0, 1));
    }
}
