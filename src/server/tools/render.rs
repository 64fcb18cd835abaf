//! An execution result as it goes on the wire: a short text a model reads first, and the
//! structured result, within a size every MCP client accepts.
//!
//! The output is in the result twice (the text content and `structuredContent`), and
//! JSON escaping can multiply it (a control byte becomes `\u0001`). The official SDKs
//! refuse a message over 1 MiB (the Python SDK's SSE event limit is 1048576 bytes), so
//! the whole result is held to [`WIRE_BUDGET`] serialized bytes: when the output does
//! not fit, stdout and stderr are cut in the middle (head and tail kept) with a visible
//! marker, and `structuredContent.wire_truncated` says how much was cut.

use crate::output::json_text::{escaped_char_len, escaped_len};
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use crate::execution::ExecutionResult;

/// Largest serialized `CallToolResult` (content plus structuredContent); the rest of the
/// 1 MiB a client accepts is left for the JSON-RPC envelope and the SSE framing (the
/// request id is at most [`crate::server::transport::framing::MAX_ID_BYTES`]).
pub const WIRE_BUDGET: usize = 1024 * 1024 - 64 * 1024;

/// The least kept of a stream that is cut, whatever else the result holds.
const MIN_KEEP: usize = 4 * 1024;

/// Longest error text of one tool call record when the records crowd the result.
const ECHO_ERROR_BYTES: usize = 512;

/// Longest error text a tool call answers (its messages may quote the client's
/// arguments: a megabyte-long `session` or `pii` value is echoed only this far).
pub const MAX_ERROR_TEXT: usize = 4096;

/// A tool call's answer with error texts (which quote the client's arguments) bounded,
/// and never larger than [`WIRE_BUDGET`].
pub fn bounded_answer(
    answer: Result<rmcp::model::CallToolResponse, rmcp::ErrorData>,
) -> Result<rmcp::model::CallToolResponse, rmcp::ErrorData> {
    use rmcp::model::CallToolResponse;
    match answer {
        Ok(CallToolResponse::Complete(mut r))
            if r.is_error == Some(true) && r.structured_content.is_none() =>
        {
            for block in &mut r.content {
                if let Some(t) = block.as_text() {
                    if t.text.len() > MAX_ERROR_TEXT {
                        *block = ContentBlock::text(bounded_to(&t.text, MAX_ERROR_TEXT));
                    }
                }
            }
            Ok(CallToolResponse::Complete(r))
        }
        Ok(CallToolResponse::Complete(r)) => {
            // Execution results are cut to fit (see `render`); any other tool's result
            // that would not fit becomes an error the model can act on.
            let size = serde_json::to_vec(&r).map_or(0, |v| v.len());
            if size <= WIRE_BUDGET {
                return Ok(CallToolResponse::Complete(r));
            }
            tracing::warn!(
                size,
                limit = WIRE_BUDGET,
                "a tool result too large for the wire was replaced"
            );
            Ok(CallToolResponse::Complete(CallToolResult::error(vec![ContentBlock::text(
                format!(
                    "the result is {size} bytes, more than the {WIRE_BUDGET} bytes an MCP client accepts in one message; ask for less (a narrower query or detail level)"
                ),
            )])))
        }
        Ok(other) => Ok(other),
        Err(mut e) => {
            if e.message.len() > MAX_ERROR_TEXT {
                e.message = bounded_to(&e.message, MAX_ERROR_TEXT).into();
            }
            Err(e)
        }
    }
}

/// `Ok` when `text` fits in one message as a resource's contents, else why not (for
/// resources, which cannot be cut without misleading the reader).
pub fn fits_wire(text: &str, what: &str) -> Result<(), String> {
    let size = escaped_len(text);
    if size <= WIRE_BUDGET {
        return Ok(());
    }
    Err(format!(
        "{what} is {size} bytes as JSON, more than the {WIRE_BUDGET} bytes an MCP client accepts in one message; read it from code instead"
    ))
}

/// At most `max` bytes of `s`, with a marker saying how much was left out.
fn bounded_to(s: &str, max: usize) -> String {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[{} more bytes]", &s[..end], s.len() - end)
}

/// structuredContent plus a short text a model reads first, within [`WIRE_BUDGET`].
#[cfg(test)]
fn render(r: &ExecutionResult) -> CallToolResult {
    render_within(r, WIRE_BUDGET)
}

/// structuredContent plus a short text a model reads first, then `blocks` (output files shown as images, embedded text, links) after
/// the text; the rest of the result is cut to leave them room. Blocks that would leave
/// too little are dropped (the files stay listed, with their resources).
pub fn render_with(r: &ExecutionResult, blocks: Vec<ContentBlock>) -> CallToolResult {
    let size: usize = blocks
        .iter()
        .map(|b| serde_json::to_vec(b).map_or(0, |v| v.len()) + 1)
        .sum();
    let (budget, blocks) = if size + MIN_KEEP * 16 <= WIRE_BUDGET {
        (WIRE_BUDGET - size, blocks)
    } else {
        tracing::warn!(
            size,
            limit = WIRE_BUDGET,
            "output files shown inline would not fit in one message; listed only"
        );
        (WIRE_BUDGET, Vec::new())
    };
    let mut result = render_within(r, budget);
    result.content.extend(blocks);
    let size = serde_json::to_vec(&result).map_or(usize::MAX, |v| v.len());
    if size > WIRE_BUDGET {
        // What render_within cannot shrink (escaping beyond its estimate): the result
        // without the blocks, rather than no result.
        tracing::warn!(
            size,
            limit = WIRE_BUDGET,
            "output files dropped from a result too large for the wire"
        );
        return render_within(r, WIRE_BUDGET);
    }
    result
}

fn render_within(r: &ExecutionResult, budget: usize) -> CallToolResult {
    let mut r = r.clone();
    let stdout = std::mem::take(&mut r.stdout);
    let stderr = std::mem::take(&mut r.stderr);
    // Everything but the output must leave room for some of it: long lists (workspace
    // entries, tool calls) are halved until it does.
    let fixed = |r: &ExecutionResult| serialized_len(r) + escaped_len(&text_of(r)) + 512;
    let roomy = |r: &ExecutionResult| fixed(r) + MIN_KEEP * 4 <= budget;
    let (files_before, calls_before) = (
        r.workspace_files.as_ref().map_or(0, Vec::len),
        r.tool_calls.len(),
    );
    if !roomy(&r) {
        for call in &mut r.tool_calls {
            if let Some(e) = &mut call.error {
                if e.len() > ECHO_ERROR_BYTES {
                    *e = bounded_to(e, ECHO_ERROR_BYTES);
                }
            }
        }
    }
    while !roomy(&r) && r.workspace_files.as_ref().is_some_and(|w| !w.is_empty()) {
        let files = r.workspace_files.as_mut().expect("checked above");
        files.truncate(files.len() / 2);
        r.workspace_files_truncated = true;
    }
    while !roomy(&r) && !r.tool_calls.is_empty() {
        r.tool_calls.truncate(r.tool_calls.len() / 2);
    }
    // The output files' records (whose blocks, if any, are already counted) and the
    // skipped ones, then the last expression's value.
    while !roomy(&r) && !r.files_skipped.is_empty() {
        let keep = r.files_skipped.len() / 2;
        r.files_omitted += (r.files_skipped.len() - keep) as u64;
        r.files_skipped.truncate(keep);
    }
    while !roomy(&r) && !r.files.is_empty() {
        let keep = r.files.len() / 2;
        r.files_omitted += (r.files.len() - keep) as u64;
        r.files.truncate(keep);
    }
    while !roomy(&r) && r.value.as_ref().is_some_and(|v| v.len() > MIN_KEEP) {
        let value = r.value.take().unwrap_or_default();
        let (cut, _) = fit(&value, escaped_len(&value) / 2, "value");
        r.value = Some(cut);
    }
    let dropped = (
        files_before - r.workspace_files.as_ref().map_or(0, Vec::len),
        calls_before - r.tool_calls.len(),
    );
    // The output is there twice: in the text and in structuredContent.
    let per_copy = budget.saturating_sub(fixed(&r)) / 2;
    let out_len = escaped_len(&stdout);
    let err_len = escaped_len(&stderr);
    let mut cut = (0, 0);
    if out_len + err_len > per_copy {
        // Each stream gets a share of what is left, the smaller one no more than it needs.
        let half = per_copy / 2;
        let (out_room, err_room) = if out_len <= half {
            (out_len, per_copy - out_len)
        } else if err_len <= half {
            (per_copy - err_len, err_len)
        } else {
            (half, per_copy - half)
        };
        let (o, out_cut) = fit(&stdout, out_room.max(MIN_KEEP), "stdout");
        let (e, err_cut) = fit(&stderr, err_room.max(MIN_KEEP), "stderr");
        r.stdout = o;
        r.stderr = e;
        cut = (out_cut, err_cut);
    } else {
        r.stdout = stdout;
        r.stderr = stderr;
    }
    let text = text_of(&r);
    let mut value = serde_json::to_value(&r).unwrap_or_default();
    if cut != (0, 0) || dropped != (0, 0) {
        tracing::info!(
            stdout_cut_bytes = cut.0,
            stderr_cut_bytes = cut.1,
            workspace_files_dropped = dropped.0,
            tool_call_records_dropped = dropped.1,
            budget,
            "the result was cut to fit on the wire"
        );
        if let Some(map) = value.as_object_mut() {
            map.insert(
                "wire_truncated".into(),
                json!({
                    "stdout_bytes_cut": cut.0,
                    "stderr_bytes_cut": cut.1,
                    "workspace_files_dropped": dropped.0,
                    "tool_call_records_dropped": dropped.1,
                    "limit_bytes": budget,
                }),
            );
        }
    }
    let mut result = if r.failed() {
        CallToolResult::structured_error(value)
    } else {
        CallToolResult::structured(value)
    };
    result.content = vec![ContentBlock::text(text)];
    result
}

/// The short text: how it ended, the hints (before stderr, whose tracebacks may run to
/// kilobytes), stdout, a truncation note, stderr.
fn text_of(r: &ExecutionResult) -> String {
    let mut text = format!("{} in {:.0} ms\n", r.ending(), r.duration_ms);
    if let Some(state) = r
        .session
        .as_ref()
        .and_then(|s| s.get("state"))
        .and_then(|s| s.as_str())
    {
        text.push_str(&resumed_line(state));
    }
    for hint in &r.hints {
        text.push_str("hint: ");
        text.push_str(hint);
        text.push('\n');
    }
    if !r.stdout.is_empty() {
        text.push_str(&r.stdout);
        if !r.stdout.ends_with('\n') {
            text.push('\n');
        }
    }
    if r.stdout_truncated {
        text.push_str(&format!(
            "[stdout truncated: {} bytes in total]\n",
            r.stdout_total_bytes
        ));
    }
    if !r.stderr.is_empty() {
        text.push_str("--- stderr ---\n");
        text.push_str(&r.stderr);
        if !r.stderr.ends_with('\n') {
            text.push('\n');
        }
    }
    if !r.files.is_empty() || !r.files_skipped.is_empty() || r.files_omitted > 0 {
        text.push_str(&files_lines(r));
    }
    if let Some(value) = &r.value {
        // As a REPL shows it, after what the program printed.
        text.push_str("--- value ---\n");
        text.push_str(value);
        text.push('\n');
    }
    if let Some(n) = &r.network {
        text.push_str(&network_lines(n));
    }
    text
}

/// What a session resumed from a pause holds, in words (`state` is its snapshot's).
pub fn resumed_line(state: &str) -> String {
    match state {
        "files" => "session resumed from a pause (state: files): its /workspace files are back; the interpreter started afresh, so variables and imports of earlier runs are gone\n".into(),
        other => format!("session resumed from a pause (state: {other})\n"),
    }
}

/// The output files in words: each one's type, size and how it is shown (the records are
/// in structuredContent).
fn files_lines(r: &ExecutionResult) -> String {
    const SHOWN: usize = 20;
    let mut text = String::from("--- files ---\n");
    for f in r.files.iter().take(SHOWN) {
        let how = match f.shown {
            crate::output::files::Shown::Image => "shown below as an image",
            crate::output::files::Shown::Embedded => "embedded below",
            crate::output::files::Shown::Link => "linked below: read it as a resource",
            crate::output::files::Shown::Withheld => {
                "withheld: binary content cannot be checked for personal data, or too large to keep"
            }
        };
        text.push_str(&format!(
            "{} ({}, {} bytes): {how}\n",
            clip(&f.path),
            f.mime,
            f.bytes
        ));
    }
    if r.files.len() > SHOWN {
        text.push_str(&format!("… and {} more files\n", r.files.len() - SHOWN));
    }
    for k in r.files_skipped.iter().take(SHOWN) {
        text.push_str(&format!(
            "not returned: {}: {}\n",
            clip(&k.path),
            clip(&k.why)
        ));
    }
    let more = r.files_omitted + r.files_skipped.len().saturating_sub(SHOWN) as u64;
    if more > 0 {
        text.push_str(&format!(
            "{more} more files not returned (over the count returned)\n"
        ));
    }
    text
}

fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    crate::proxy::clip(s, 300)
}

/// Denied connections and a reached limit, in words (the records are in
/// structuredContent): the model reads why a request failed without digging.
fn network_lines(n: &crate::egress::EgressReport) -> String {
    const SHOWN: usize = 5;
    if n.denied == 0 && n.limit_reached.is_none() {
        return String::new();
    }
    let mut text = format!(
        "--- network: {} allowed, {} denied ---\n",
        n.allowed, n.denied
    );
    for c in n.connections.iter().filter(|c| !c.allowed).take(SHOWN) {
        let target = if c.host.is_empty() {
            "(no host)".to_string()
        } else {
            format!("{}:{}", c.host, c.port)
        };
        let why = c.reason.as_deref().unwrap_or("denied");
        let why = if why.len() > 300 {
            bounded_to(why, 300)
        } else {
            why.to_string()
        };
        text.push_str(&format!("denied {target}: {why}\n"));
    }
    if let Some(limit) = &n.limit_reached {
        text.push_str(&format!("limit reached: {limit}\n"));
    }
    text
}

fn serialized_len(r: &ExecutionResult) -> usize {
    serde_json::to_vec(r).map_or(0, |v| v.len())
}

/// `s` within `room` escaped bytes: whole, or its head and tail around a marker. Returns
/// the text and how many bytes of `s` were cut.
pub fn fit(s: &str, room: usize, stream: &str) -> (String, usize) {
    if escaped_len(s) <= room {
        return (s.to_string(), 0);
    }
    // The marker's figures are at most 20 digits; measure it with the widest.
    let marker = |cut: usize| {
        format!(
            "\n[codebox: {cut} bytes of {stream} cut here: the result is limited to {WIRE_BUDGET} bytes]\n"
        )
    };
    let room = room.saturating_sub(escaped_len(&marker(usize::MAX)));
    let head_room = room / 2;
    let mut head_end = 0;
    let mut used = 0;
    for (i, c) in s.char_indices() {
        let n = escaped_char_len(c);
        if used + n > head_room {
            break;
        }
        used += n;
        head_end = i + c.len_utf8();
    }
    let tail_room = room - used;
    let mut tail_start = s.len();
    let mut used = 0;
    for (i, c) in s[head_end..].char_indices().rev() {
        let n = escaped_char_len(c);
        if used + n > tail_room {
            break;
        }
        used += n;
        tail_start = head_end + i;
    }
    let cut = tail_start - head_end;
    let mut out = String::with_capacity(head_end + (s.len() - tail_start) + 128);
    out.push_str(&s[..head_end]);
    out.push_str(&marker(cut));
    out.push_str(&s[tail_start..]);
    (out, cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Language;

    fn result(stdout: &str, stderr: &str) -> ExecutionResult {
        ExecutionResult {
            stdout: stdout.into(),
            stderr: stderr.into(),
            exit_code: Some(0),
            stdout_total_bytes: stdout.len() as u64,
            stderr_total_bytes: stderr.len() as u64,
            duration_ms: 1.0,
            ..ExecutionResult::blank(Language::Python)
        }
    }

    fn wire_len(r: &CallToolResult) -> usize {
        serde_json::to_vec(r).unwrap().len()
    }

    #[test]
    fn file_blocks_come_after_the_text_and_the_output_leaves_them_room() {
        let image = ContentBlock::image("A".repeat(600 * 1024), "image/png");
        let r = render_with(&result(&"x".repeat(900 * 1024), ""), vec![image]);
        assert!(wire_len(&r) <= WIRE_BUDGET, "{}", wire_len(&r));
        assert_eq!(r.content.len(), 2);
        assert!(r.content[0].as_text().is_some() && r.content[1].as_image().is_some());
        // Blocks that would crowd everything else out are dropped, never the result.
        let huge = ContentBlock::image("A".repeat(WIRE_BUDGET), "image/png");
        let r = render_with(&result("hi\n", ""), vec![huge]);
        assert_eq!(r.content.len(), 1);
        assert!(wire_len(&r) <= WIRE_BUDGET);
    }

    #[test]
    fn long_file_records_and_values_are_cut_never_the_result() {
        let mut r = result("important result: 42\n", "");
        r.value = Some("\u{1}".repeat(200_000));
        r.files_skipped = (0..200)
            .map(|i| crate::output::files::Skipped {
                path: format!("out/{i}{}", "\"".repeat(900)),
                why: "a symlink (never followed)".into(),
            })
            .collect();
        let image = ContentBlock::image("A".repeat(500 * 1024), "image/png");
        let rendered = render_with(&r, vec![image]);
        assert!(
            wire_len(&rendered) <= WIRE_BUDGET,
            "{}",
            wire_len(&rendered)
        );
        assert_ne!(rendered.is_error, Some(true));
        let sc = rendered.structured_content.as_ref().unwrap();
        assert_eq!(sc["stdout"], "important result: 42\n");
        assert!(sc["files_omitted"].as_u64().unwrap() > 0);
        assert!(rendered.content.iter().any(|b| b.as_image().is_some()));
    }

    #[test]
    fn small_output_is_whole_in_both_places() {
        let r = render(&result("hello\n", "warn\n"));
        let s = r.structured_content.as_ref().unwrap();
        assert_eq!(s["stdout"], "hello\n");
        assert_eq!(s["stderr"], "warn\n");
        assert!(s.get("wire_truncated").is_none());
        let text = r.content[0].as_text().unwrap().text.clone();
        assert!(text.starts_with("exit 0 in 1 ms\nhello\n"), "{text}");
    }

    #[test]
    fn large_output_of_any_kind_fits_the_wire() {
        let big_ascii = "x".repeat(5 << 20);
        let control = "\u{1}".repeat(2 << 20);
        let quotes = "\"".repeat(3 << 20);
        let multibyte = "é€😀".repeat(300_000);
        let line = format!("{}\n", "y".repeat(600_000));
        for (out, err) in [
            (line.as_str(), ""),
            (big_ascii.as_str(), ""),
            ("", big_ascii.as_str()),
            (control.as_str(), quotes.as_str()),
            (multibyte.as_str(), "short\n"),
        ] {
            let r = render(&result(out, err));
            let n = wire_len(&r);
            assert!(n <= WIRE_BUDGET, "{n} bytes on the wire");
            let s = r.structured_content.as_ref().unwrap();
            let cut = &s["wire_truncated"];
            assert!(cut["stdout_bytes_cut"].as_u64().unwrap() > 0 || out.len() < 1000);
            let text = r.content[0].as_text().unwrap().text.clone();
            assert!(text.contains("cut here"), "a visible marker");
            // Head and tail are kept.
            if !out.is_empty() {
                let so = s["stdout"].as_str().unwrap();
                let head: String = out.chars().take(20).collect();
                let tail: String = out
                    .chars()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                assert!(so.starts_with(&head) && so.ends_with(&tail));
                // Most of the room is used: the cut is not needlessly deep.
                assert!(n > WIRE_BUDGET * 3 / 4, "{n}");
            }
        }
    }

    #[test]
    fn long_listings_and_call_records_leave_room_for_the_output() {
        let mut r = result(&"o".repeat(2 << 20), "");
        let entry = crate::workspace::Entry {
            path: "d/".repeat(2000),
            kind: crate::workspace::Kind::File,
            size: Some(1),
            link: None,
        };
        r.workspace_files = Some(vec![entry; 1000]);
        let call = crate::proxy::ToolCallRecord {
            name: "s__t".into(),
            ok: false,
            duration_ms: 1.0,
            bytes_in: 1,
            bytes_out: 1,
            error: Some("e".repeat(10_000)),
            error_kind: Some("upstream"),
        };
        r.tool_calls = vec![call; 1000];
        let rendered = render(&r);
        assert!(
            wire_len(&rendered) <= WIRE_BUDGET,
            "{}",
            wire_len(&rendered)
        );
        let s = rendered.structured_content.unwrap();
        let cut = &s["wire_truncated"];
        assert!(
            cut["workspace_files_dropped"].as_u64().unwrap() > 0,
            "{cut}"
        );
        assert_eq!(s["workspace_files_truncated"], true);
        assert!(s["stdout"].as_str().unwrap().len() >= 4096);
    }

    #[test]
    fn cut_counts_add_up() {
        let s = "a".repeat(10_000);
        let (out, cut) = fit(&s, 1_000, "stdout");
        assert!(escaped_len(&out) <= 1_000);
        let kept = out.chars().filter(|&c| c == 'a').count();
        assert_eq!(kept + cut, 10_000);
        assert!(out.contains(&format!("{cut} bytes of stdout cut here")));
    }

    #[test]
    fn long_tool_errors_are_bounded_and_results_are_not() {
        use rmcp::model::CallToolResponse;
        let long = format!("no session \"{}\"", "Z".repeat(1 << 20));
        let answer = bounded_answer(Ok(
            CallToolResult::error(vec![ContentBlock::text(long)]).into()
        ));
        let Ok(CallToolResponse::Complete(r)) = answer else {
            panic!("a result")
        };
        let text = &r.content[0].as_text().unwrap().text;
        assert!(
            text.len() < MAX_ERROR_TEXT + 64 && text.ends_with("more bytes]"),
            "{}",
            text.len()
        );
        let ok = render(&result(&"x".repeat(100_000), ""));
        let Ok(CallToolResponse::Complete(r)) = bounded_answer(Ok(ok.into())) else {
            panic!("a result")
        };
        assert_eq!(
            r.structured_content.unwrap()["stdout"]
                .as_str()
                .unwrap()
                .len(),
            100_000
        );
        let e = bounded_answer(Err(rmcp::ErrorData::invalid_params(
            "y".repeat(10_000),
            None,
        )));
        assert!(e.unwrap_err().message.len() < MAX_ERROR_TEXT + 64);
    }

    #[test]
    fn resources_that_do_not_fit_are_refused_by_escaped_size() {
        assert!(fits_wire("small", "x").is_ok());
        // Under the budget in bytes, over it once escaped.
        let control = "\u{1}".repeat(WIRE_BUDGET / 4);
        let e = fits_wire(&control, "\"a.txt\"").unwrap_err();
        assert!(
            e.starts_with("\"a.txt\" is ") && e.contains("read it from code"),
            "{e}"
        );
    }

    #[test]
    fn the_end_is_described_without_a_made_up_signal() {
        let mut r = result("", "");
        r.exit_code = None;
        assert_eq!(r.ending(), "ended without an exit status");
        r.signal = Some(9);
        assert_eq!(r.ending(), "killed by signal 9 (SIGKILL)");
        r.signal = Some(200);
        assert_eq!(r.ending(), "killed by signal 200");
        r.signal = None;
        r.exit_code = Some(3);
        assert_eq!(r.ending(), "exit 3");
    }
}
