//! The question the user sees (form-mode elicitation) and how an answer is read.
//!
//! The sandboxed code chooses the arguments, and through a tool name the catalog does not
//! list even part of the name: nothing it chose may read as the dialog's own text. So
//! the message is built from fixed sentences, the name the proxy will really call, the
//! rule, and one line of arguments as compact JSON in which every control, line-breaking
//! and bidirectional/format character is escaped (`\u{202e}`), cut at
//! [`MAX_SUMMARY_BYTES`] with a marker. A fake "Approved by admin" line cannot be made:
//! no character of the arguments can start a line.
//!
//! The schema is one required boolean, `approve` (clients render a checkbox with their
//! accept/decline buttons). Only `accept` with `approve: true` approves; an accept
//! without it, or with anything else, is read as a decline.

use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema};
use serde_json::{Map, Value};

/// Longest argument summary shown, in bytes (before the marker).
pub const MAX_SUMMARY_BYTES: usize = 1024;
/// Longest name shown (a catalog name is far shorter; an unlisted one is bounded too).
pub const MAX_NAME_BYTES: usize = 256;

/// The form field the answer carries.
pub const APPROVE_FIELD: &str = "approve";

/// `text` with every character that could break a line, reorder text or hide itself
/// written as `\u{…}`; a backslash stays itself (the JSON it comes from escaped its own).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if needs_escape(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00ad}' // soft hyphen
            | '\u{061c}' // Arabic letter mark
            | '\u{115f}' | '\u{1160}' | '\u{3164}' | '\u{ffa0}' // fillers
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}' // zero-width, LRM/RLM
            | '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{202a}'..='\u{202e}' // bidi embeddings and overrides
            | '\u{2060}'..='\u{206f}' // word joiner, bidi isolates, invisible operators
            | '\u{fe00}'..='\u{fe0f}' // variation selectors
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}') // tags
}

/// `text` cut to `max` bytes at a character boundary, with a marker when cut.
pub fn clip(text: &str, max: usize) -> String {
    crate::proxy::clip(text, max).into_owned()
}

/// One line summarising `arguments`: compact JSON after `redact` (PII tokens, secrets),
/// escaped, at most [`MAX_SUMMARY_BYTES`] plus a marker.
///
/// The members are written shortest first: the code chooses the key names, and in key
/// order a long `"a"` value would push `"target":"prod"` past the cut, out of the
/// user's sight. Shortest first, what is cut is the longest values' ends.
pub fn summary(
    arguments: Option<&Map<String, Value>>,
    redact: &dyn Fn(&mut Value) -> String,
) -> String {
    let Some(arguments) = arguments.filter(|a| !a.is_empty()) else {
        return clip(
            &escape(&redact(&mut Value::Object(Map::new()))),
            MAX_SUMMARY_BYTES,
        );
    };
    let mut members: Vec<String> = arguments
        .iter()
        .map(|(k, v)| {
            let mut one = Map::new();
            one.insert(k.clone(), v.clone());
            let text = redact(&mut Value::Object(one));
            match text.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                Some(member) => member.to_string(),
                None => text,
            }
        })
        .collect();
    members.sort_by(|a, b| a.len().cmp(&b.len()).then_with(|| a.cmp(b)));
    let text = format!("{{{}}}", members.join(","));
    clip(&escape(&text), MAX_SUMMARY_BYTES)
}

/// The schema: one required boolean `approve`, default off.
pub fn schema() -> ElicitationSchema {
    ElicitationSchema::builder()
        .required_bool_property(APPROVE_FIELD, |b| {
            b.title("Approve")
                .description("Tick to let this one call go ahead, then accept")
                .with_default(false)
        })
        .build()
        .expect("a one-boolean schema is valid")
}

/// The question for one tool call. `name` is the catalog name the proxy calls; `server`
/// and `tool` the upstream's own spelling when the catalog lists it.
pub fn tool_question(
    name: &str,
    upstream: Option<(&str, &str)>,
    rule: &str,
    summary: &str,
) -> ElicitRequestParams {
    let name = clip(&escape(name), MAX_NAME_BYTES);
    let whose = match upstream {
        Some((server, tool)) => format!(
            " (server \"{}\", tool \"{}\")",
            clip(&escape(server), MAX_NAME_BYTES),
            clip(&escape(tool), MAX_NAME_BYTES)
        ),
        None => String::new(),
    };
    // A cut summary is longer than the limit (the kept part plus the marker).
    let cut = if summary.len() > MAX_SUMMARY_BYTES {
        "Warning: the arguments are too long to show in full; the call would send all of \
         them, not only what is shown.\n"
    } else {
        ""
    };
    let message = format!(
        "codebox: code running in a sandbox wants to call the tool {name}{whose}.\n\
         Approval is required by {rule}.\n\
         Arguments (JSON, as the code sent them): {summary}\n\
         {cut}Approve only this one call with exactly these arguments?"
    );
    form(message)
}

/// The question for an egress connection to `target` (`host:port`), for the rest of the
/// execution.
pub fn host_question(target: &str, rule: &str) -> ElicitRequestParams {
    let target = clip(&escape(target), MAX_NAME_BYTES);
    let message = format!(
        "codebox: code running in a sandbox wants to connect to {target} through the egress proxy.\n\
         Approval is required by {rule}.\n\
         Approve connections to {target} for the rest of this execution?"
    );
    form(message)
}

fn form(message: String) -> ElicitRequestParams {
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message,
        requested_schema: schema(),
    }
}

/// What an answer says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Approved,
    Declined,
    Cancelled,
    /// `accept` without `approve: true` (unticked, missing, not a boolean): a decline.
    AcceptedWithoutApproval,
}

pub fn read_answer(result: &ElicitResult) -> Answer {
    match result.action {
        ElicitationAction::Accept => {
            let approve = result
                .content
                .as_ref()
                .and_then(Value::as_object)
                .and_then(|o| o.get(APPROVE_FIELD));
            if approve == Some(&Value::Bool(true)) {
                Answer::Approved
            } else {
                Answer::AcceptedWithoutApproval
            }
        }
        ElicitationAction::Decline => Answer::Declined,
        _ => Answer::Cancelled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message_of(p: &ElicitRequestParams) -> &str {
        match p {
            ElicitRequestParams::FormElicitationParams { message, .. } => message,
            _ => panic!("form mode"),
        }
    }

    fn plain(v: &mut Value) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn the_question_names_the_tool_the_rule_and_the_arguments() {
        let args = json!({"name": "old-repo"});
        let s = summary(args.as_object(), &plain);
        assert_eq!(s, r#"{"name":"old-repo"}"#);
        let q = tool_question(
            "github__delete_repo",
            Some(("github", "delete_repo")),
            "require_approval rule \"github__delete_*\"",
            &s,
        );
        let m = message_of(&q);
        assert!(
            m.contains("the tool github__delete_repo (server \"github\", tool \"delete_repo\")"),
            "{m}"
        );
        assert!(
            m.contains("require_approval rule \"github__delete_*\""),
            "{m}"
        );
        assert!(m.contains(r#"{"name":"old-repo"}"#), "{m}");
        assert_eq!(m.lines().count(), 4, "{m}");
        let schema = serde_json::to_value(schema()).unwrap();
        assert_eq!(schema["required"], json!(["approve"]));
        assert_eq!(schema["properties"]["approve"]["type"], "boolean");
        assert_eq!(schema["properties"]["approve"]["default"], false);
    }

    #[test]
    fn arguments_cannot_forge_lines_or_reorder_text() {
        // JSON escapes \n itself; these are the characters it leaves alone.
        let hostile = "x\u{2028}Approved by admin\u{2029}\u{202e}oper_eteled\u{200b}\u{85}";
        let args = json!({"q": hostile, "k\u{2028}ey": 1});
        let s = summary(args.as_object(), &plain);
        for c in [
            '\u{2028}', '\u{2029}', '\u{202e}', '\u{200b}', '\u{85}', '\n', '\r',
        ] {
            assert!(!s.contains(c), "{c:?} in {s}");
        }
        assert!(s.contains("\\u{2028}Approved by admin"), "{s}");
        let q = tool_question("db__drop\nApproved by admin", None, "rule", &s);
        let m = message_of(&q);
        assert_eq!(m.lines().count(), 4, "{m}");
        assert!(!m.lines().any(|l| l.starts_with("Approved")), "{m}");
        assert!(m.contains("db__drop\\u{a}Approved"), "{m}");
    }

    #[test]
    fn summaries_are_bounded_with_a_marker() {
        let args = json!({"blob": "é".repeat(5000)});
        let s = summary(args.as_object(), &plain);
        assert!(s.len() < MAX_SUMMARY_BYTES + 64, "{}", s.len());
        assert!(s.contains("…[truncated,"), "{s}");
        let none = summary(None, &plain);
        assert_eq!(none, "{}");
    }

    /// The code names the keys: a long first value must not push a short one out of the
    /// summary (key order showed `{"a":"xxx…[truncated` and hid `"target":"prod"`), and a
    /// cut summary says so in the dialog's own words.
    #[test]
    fn a_long_value_cannot_hide_a_short_one_past_the_cut() {
        let args = json!({"a": "x".repeat(5000), "target": "prod", "b": {"n": 1}});
        let s = summary(args.as_object(), &plain);
        assert!(
            s.starts_with(r#"{"b":{"n":1},"target":"prod","a":"xxx"#),
            "{s}"
        );
        assert!(s.contains("…[truncated,"), "{s}");
        let m = tool_question("db__run", None, "rule", &s);
        let m = message_of(&m);
        assert!(m.contains("\nWarning: the arguments are too long"), "{m}");
        let short = tool_question("db__run", None, "rule", r#"{"a":1}"#);
        assert!(!message_of(&short).contains("Warning"));
    }

    #[test]
    fn redaction_happens_before_the_summary() {
        let args = json!({"to": "alice@example.com"});
        let s = summary(args.as_object(), &|v: &mut Value| {
            v["to"] = json!("[EMAIL_1]");
            serde_json::to_string(v).unwrap()
        });
        assert_eq!(s, r#"{"to":"[EMAIL_1]"}"#);
    }

    #[test]
    fn only_an_accept_with_approve_true_approves() {
        let accept = |c: Option<Value>| {
            let r = ElicitResult::new(ElicitationAction::Accept);
            read_answer(&match c {
                Some(c) => r.with_content(c),
                None => r,
            })
        };
        assert_eq!(accept(Some(json!({"approve": true}))), Answer::Approved);
        for bad in [
            None,
            Some(json!({"approve": false})),
            Some(json!({"approve": "true"})),
            Some(json!({"approve": 1})),
            Some(json!({})),
            Some(json!([true])),
            Some(json!(true)),
        ] {
            assert_eq!(
                accept(bad.clone()),
                Answer::AcceptedWithoutApproval,
                "{bad:?}"
            );
        }
        assert_eq!(
            read_answer(&ElicitResult::new(ElicitationAction::Decline)),
            Answer::Declined
        );
        assert_eq!(
            read_answer(&ElicitResult::new(ElicitationAction::Cancel)),
            Answer::Cancelled
        );
    }

    #[test]
    fn the_host_question_is_for_the_execution() {
        let q = host_question("api.example.com:443", "approve rule api.example.com");
        let m = message_of(&q);
        assert!(m.contains("connect to api.example.com:443"), "{m}");
        assert!(m.contains("for the rest of this execution"), "{m}");
    }
}
