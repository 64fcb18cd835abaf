//! The end of a one-shot run as its runtime reports it: `codebox/exit` on fd 3 (see the
//! `EPHEMERAL` record in [`super::boot`]).
//!
//! `{"jsonrpc":"2.0","method":"codebox/exit","params":{"status":N,"layers":[...],"end":"..."}}`
//! once the program is over and its output flushed and closed:
//!
//! - `status`: the exit status;
//! - `layers`: the optional parts of the runtime the run loaded, each a cost the fast path
//!   does not pay — Deno's Node compatibility layer (`node:timers` behind the
//!   `setTimeout` family, `node:buffer` behind `Buffer`, `node:process` for `process`,
//!   `node:` imports and npm packages) and matplotlib's backend (`matplotlib-backend`,
//!   Python);
//! - `end` (Deno): when the runtime saw the program end — `settled` (the main module
//!   settled with nothing pending), `unload` (Deno's `unload` event) or `exit` (after
//!   Node's `process.on("exit")` listeners).
//!
//! The program could write such a line itself: what it says only ever makes its own
//! result, and it is bounded here.

use std::borrow::Cow;

/// The notification's method.
pub const EXIT_METHOD: &str = "codebox/exit";

/// Most layer names kept from one notice.
const MAX_LAYERS: usize = 8;
/// Longest layer name or `end` kept, in bytes.
const MAX_NAME: usize = 32;

/// What a one-shot runtime said about its run at the end, besides the status.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct RunReport {
    /// The optional runtime layers the run loaded (none on the fast path).
    pub layers: Vec<String>,
    /// When the runtime saw the program end (Deno: `settled`, `unload` or `exit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

/// A `codebox/exit` notice's params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitNotice {
    pub status: i32,
    /// `None` when the runtime said nothing but the status (as runtimes before the report
    /// did).
    pub report: Option<RunReport>,
}

/// Reads a `codebox/exit` notice's params (`None` without an integer status). Layer names
/// and `end` are kept only when they are short words of `[a-z0-9:._-]`; at most
/// [`MAX_LAYERS`] layers.
pub fn parse_exit(params: &str) -> Option<ExitNotice> {
    #[derive(serde::Deserialize)]
    struct Raw<'a> {
        status: i32,
        #[serde(borrow, default)]
        layers: Option<Vec<Cow<'a, str>>>,
        #[serde(borrow, default)]
        end: Option<Cow<'a, str>>,
    }
    let raw: Raw = serde_json::from_str(params).ok()?;
    let name = |s: &str| {
        let ok = !s.is_empty()
            && s.len() <= MAX_NAME
            && s.bytes().all(|b| {
                b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || matches!(b, b':' | b'.' | b'_' | b'-')
            });
        ok.then(|| s.to_string())
    };
    if raw.layers.is_none() && raw.end.is_none() {
        return Some(ExitNotice {
            status: raw.status,
            report: None,
        });
    }
    let mut layers: Vec<String> = Vec::new();
    for layer in raw.layers.iter().flatten().filter_map(|l| name(l)) {
        if layers.len() == MAX_LAYERS {
            break;
        }
        if !layers.contains(&layer) {
            layers.push(layer);
        }
    }
    Some(ExitNotice {
        status: raw.status,
        report: Some(RunReport {
            layers,
            end: raw.end.as_deref().and_then(name),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_with_its_report() {
        let n = parse_exit(r#"{"status":0,"layers":[],"end":"settled"}"#).unwrap();
        assert_eq!(n.status, 0);
        let r = n.report.unwrap();
        assert_eq!(r.layers, Vec::<String>::new());
        assert_eq!(r.end.as_deref(), Some("settled"));
        let n = parse_exit(r#"{"status":3,"layers":["node:timers","node:process"]}"#).unwrap();
        let r = n.report.unwrap();
        assert_eq!((n.status, r.end), (3, None));
        assert_eq!(r.layers, ["node:timers", "node:process"]);
        // The status alone, as runtimes before the report sent it: no report.
        let n = parse_exit(r#"{"status":1}"#).unwrap();
        assert_eq!((n.status, n.report), (1, None));
    }

    #[test]
    fn hostile_notices_are_bounded_or_refused() {
        assert_eq!(parse_exit("{}"), None);
        assert_eq!(parse_exit(r#"{"status":"0"}"#), None);
        assert_eq!(parse_exit(r#"{"status":0,"layers":"node"}"#), None);
        assert_eq!(parse_exit("not json"), None);
        let many: Vec<String> = (0..1000).map(|i| format!("\"l{i}\"")).collect();
        let n = parse_exit(&format!(r#"{{"status":0,"layers":[{}]}}"#, many.join(","))).unwrap();
        assert_eq!(n.report.unwrap().layers.len(), MAX_LAYERS);
        let long = "x".repeat(MAX_NAME + 1);
        let n = parse_exit(&format!(
            r#"{{"status":0,"layers":["{long}","Node","a b","\u001b[31m","","ok","ok"],"end":"{long}"}}"#
        ))
        .unwrap()
        .report
        .unwrap();
        assert_eq!(n.layers, ["ok"]);
        assert_eq!(n.end, None);
        let n = parse_exit(r#"{"status":0,"end":"<script>"}"#).unwrap();
        assert_eq!(n.report.unwrap(), RunReport::default());
    }
}
