//! The model-facing output budget: how much of stdout and stderr a result carries, in
//! characters across both streams, and which part — the head and the tail, cut at line
//! ends where one is near, around a marker that says what was left out and where the
//! whole stream can be read.

/// The budget of one result, in characters across stdout and stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// What a call gets when it does not ask.
    pub default_chars: usize,
    /// The most a call may ask for.
    pub max_chars: usize,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            default_chars: 20_000,
            max_chars: 200_000,
        }
    }
}

/// The least a call may ask for: room for a marker and a few lines each side.
pub const MIN_CHARS: usize = 1_000;

impl Budget {
    /// The budget of a call that asked for `asked` characters (`None`: the default).
    pub fn for_call(&self, asked: Option<u64>) -> Result<usize, String> {
        match asked {
            None => Ok(self.default_chars),
            Some(n) if n < MIN_CHARS as u64 || n > self.max_chars as u64 => Err(format!(
                "output_budget must be between {MIN_CHARS} and {} characters (got {n})",
                self.max_chars
            )),
            Some(n) => Ok(n as usize),
        }
    }
}

/// One stream within its share of the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The text the result carries: the whole stream, or its head, a marker and its tail.
    pub text: String,
    /// What the cut left out (`None`: nothing was cut).
    pub cut: Option<Cut>,
}

/// What was left out of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Cut {
    pub left_out_bytes: usize,
    pub left_out_lines: usize,
    /// Characters of the stream in the result (head and tail, without the marker).
    pub kept_chars: usize,
}

/// Splits `chars` between the two streams (the smaller one gets what it needs, up to
/// half) and keeps each within its share. `uri(stream)` names where a cut stream can be
/// read whole.
pub fn keep(
    stdout: &str,
    stderr: &str,
    chars: usize,
    uri: impl Fn(&str) -> String,
) -> (Kept, Kept) {
    let (out_len, err_len) = (stdout.chars().count(), stderr.chars().count());
    let (out_room, err_room) = if out_len + err_len <= chars {
        (out_len, err_len)
    } else if out_len <= chars / 2 {
        (out_len, chars - out_len)
    } else if err_len <= chars / 2 {
        (chars - err_len, err_len)
    } else {
        (chars - chars / 2, chars / 2)
    };
    (
        keep_one(stdout, out_len, out_room, &uri("stdout"), "stdout"),
        keep_one(stderr, err_len, err_room, &uri("stderr"), "stderr"),
    )
}

/// The share of a result's budget the last expression's value may take; stdout and
/// stderr share what it leaves.
pub fn value_room(chars: usize) -> usize {
    chars / 4
}

/// A value's repr within `room` characters: whole, or head and tail around a marker
/// (a long list still shows where it ends). The whole repr is not kept anywhere.
pub fn keep_value(repr: &str, room: usize) -> Kept {
    let len = repr.chars().count();
    if len <= room {
        return Kept {
            text: repr.to_string(),
            cut: None,
        };
    }
    let head_end = byte_at(repr, room / 2);
    let tail_start = byte_at(repr, len - (room - room / 2));
    let middle = &repr[head_end..tail_start];
    let cut = Cut {
        left_out_bytes: middle.len(),
        left_out_lines: middle.matches('\n').count(),
        kept_chars: room,
    };
    Kept {
        text: format!(
            "{}…[codebox: {} bytes of the value left out]…{}",
            &repr[..head_end],
            cut.left_out_bytes,
            &repr[tail_start..]
        ),
        cut: Some(cut),
    }
}

/// `text` (of `len` characters) within `room` characters: whole, or 40% head and 60%
/// tail (the end of a run says most: a summary, a traceback) around the marker.
fn keep_one(text: &str, len: usize, room: usize, uri: &str, stream: &str) -> Kept {
    if len <= room {
        return Kept {
            text: text.to_string(),
            cut: None,
        };
    }
    let head_chars = room * 2 / 5;
    let tail_chars = room - head_chars;
    let mut head_end = byte_at(text, head_chars);
    let mut tail_start = byte_at(text, len - tail_chars);
    // At a line end when one is within the last (first) fifth of the kept part.
    if let Some(nl) = text[..head_end].rfind('\n') {
        if text[nl..head_end].chars().count() <= head_chars / 5 {
            head_end = nl + 1;
        }
    }
    if let Some(nl) = text[tail_start..].find('\n') {
        if text[tail_start..tail_start + nl].chars().count() <= tail_chars / 5 {
            tail_start += nl + 1;
        }
    }
    let middle = &text[head_end..tail_start];
    let cut = Cut {
        left_out_bytes: middle.len(),
        left_out_lines: middle.matches('\n').count(),
        kept_chars: text[..head_end].chars().count() + text[tail_start..].chars().count(),
    };
    let marker = format!(
        "\n[codebox: {} bytes ({} lines) of {stream} left out here; the whole {stream}: {uri}]\n",
        cut.left_out_bytes, cut.left_out_lines
    );
    Kept {
        text: format!("{}{marker}{}", &text[..head_end], &text[tail_start..]),
        cut: Some(cut),
    }
}

/// The byte offset of character `n` of `s` (its length past the end).
fn byte_at(s: &str, n: usize) -> usize {
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(stream: &str) -> String {
        format!("codebox://executions/x/{stream}")
    }

    #[test]
    fn what_fits_is_kept_whole() {
        let (o, e) = keep("hello\n", "warn\n", 100, uri);
        assert_eq!((o.text.as_str(), o.cut), ("hello\n", None));
        assert_eq!((e.text.as_str(), e.cut), ("warn\n", None));
    }

    #[test]
    fn a_long_stream_keeps_head_and_tail_at_line_ends_with_a_marker() {
        let lines: Vec<String> = (0..10_000).map(|i| format!("line {i}")).collect();
        let text = lines.join("\n") + "\nthe final line\n";
        let (o, e) = keep(&text, "", 2_000, uri);
        let cut = o.cut.expect("cut");
        assert!(o.text.starts_with("line 0\nline 1\n"));
        assert!(o.text.ends_with("\nthe final line\n"));
        assert!(o.text.contains(&format!(
            "[codebox: {} bytes ({} lines) of stdout left out here; the whole stdout: codebox://executions/x/stdout]",
            cut.left_out_bytes, cut.left_out_lines
        )));
        // Cut at line ends: the kept lines are whole.
        let marker_at = o.text.find("\n[codebox").unwrap();
        assert!(o.text[..marker_at + 1].ends_with('\n'));
        assert!(cut.kept_chars <= 2_000);
        assert_eq!(
            cut.left_out_bytes + o.text.len() - marker_len(&o.text),
            text.len()
        );
        assert_eq!(e.cut, None);
    }

    fn marker_len(kept: &str) -> usize {
        let start = kept.find("\n[codebox").unwrap();
        let end = kept[start + 1..].find("]\n").unwrap() + start + 3;
        end - start
    }

    #[test]
    fn the_smaller_stream_gets_what_it_needs_and_the_other_the_rest() {
        let out = "o".repeat(50_000);
        let err = "traceback\n".repeat(100);
        let (o, e) = keep(&out, &err, 20_000, uri);
        assert_eq!(e.cut, None, "stderr (1,000 chars) fits whole");
        assert!(o.cut.unwrap().kept_chars <= 19_000);
        let (o, e) = keep(&out, &out, 20_000, uri);
        assert!(o.cut.unwrap().kept_chars <= 10_000 && e.cut.unwrap().kept_chars <= 10_000);
    }

    #[test]
    fn characters_not_bytes_and_never_a_split_character() {
        let text = "é".repeat(30_000);
        let (o, _) = keep(&text, "", 1_000, uri);
        let cut = o.cut.unwrap();
        assert_eq!(cut.kept_chars, 1_000);
        assert_eq!(cut.left_out_bytes, (30_000 - 1_000) * 2);
    }

    #[test]
    fn a_long_value_keeps_both_ends_within_its_room() {
        let repr = format!(
            "[{}]",
            (0..100_000)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let kept = keep_value(&repr, value_room(20_000));
        let cut = kept.cut.expect("cut");
        assert!(kept.text.starts_with("[0, 1, 2"));
        assert!(kept.text.ends_with("99998, 99999]"));
        assert_eq!(cut.kept_chars, 5_000);
        assert_eq!(kept.text.chars().count() - marker_chars(&kept.text), 5_000);
        assert_eq!(cut.left_out_bytes + 5_000, repr.len());
        let short = keep_value("42", 5_000);
        assert_eq!((short.text.as_str(), short.cut), ("42", None));
    }

    fn marker_chars(kept: &str) -> usize {
        let start = kept.find("…[codebox").unwrap();
        let end = kept.find("]…").unwrap() + "]…".len();
        kept[start..end].chars().count()
    }

    #[test]
    fn a_call_asks_within_the_bounds() {
        let b = Budget::default();
        assert_eq!(b.for_call(None), Ok(20_000));
        assert_eq!(b.for_call(Some(5_000)), Ok(5_000));
        assert!(b
            .for_call(Some(10))
            .unwrap_err()
            .contains("between 1000 and 200000"));
        assert!(b.for_call(Some(1 << 40)).is_err());
    }
}
