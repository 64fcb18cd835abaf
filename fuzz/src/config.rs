//! Configuration parsers: `codebox.toml` (`codebox::config::Config::parse`), sandbox
//! profiles (`codebox::profile::Profile::parse`) and `.mcp.json`
//! (`codebox::upstream::config::parse`, with `${VAR}` expansion).
//!
//! A configuration file is the user's, but it is often copied from elsewhere (a
//! project's `.mcp.json` that Claude Code also reads, a profile from a colleague), and
//! one that is wrong must be refused with a clear message, never crash the server.
//!
//! Input: one byte choosing the parser (`% 3`), then the file's text.
//!
//! Properties: no panic, a refusal says where and why in a bounded message, `.mcp.json`
//! servers come back sorted by name with no name twice, expansion never loops, and
//! memory stays within a fixed multiple of the text.

use std::path::Path;

use codebox::upstream::config::TransportConfig;

use crate::budget;

/// A fixed environment for `${VAR}` expansion: a value that names another variable
/// must not be expanded again.
fn env(var: &str) -> Option<String> {
    match var {
        "HOME" => Some("/home/u".into()),
        "LOOP" => Some("${LOOP}".into()),
        "EMPTY" => Some(String::new()),
        _ => None,
    }
}

pub fn run(data: &[u8]) {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match choice % 3 {
        0 => {
            let (parsed, peak) = budget::peak_during(|| {
                codebox::config::Config::parse(text, Path::new("codebox.toml"))
            });
            budget::assert_within("codebox.toml", peak, text.len(), 128, 1 << 20);
            if let Err(e) = parsed {
                assert_message(&e.to_string(), text.len());
            }
        }
        1 => {
            let (parsed, peak) =
                budget::peak_during(|| codebox::profile::Profile::parse("fuzzed", text));
            budget::assert_within("profile", peak, text.len(), 128, 1 << 20);
            if let Err(e) = parsed {
                assert_message(&e.to_string(), text.len());
            }
        }
        _ => {
            let (parsed, peak) = budget::peak_during(|| {
                codebox::upstream::config::parse(text, Path::new(".mcp.json"), &env)
            });
            budget::assert_within(".mcp.json", peak, text.len(), 128, 1 << 20);
            match parsed {
                Err(e) => assert_message(&e.to_string(), text.len()),
                Ok(servers) => {
                    for pair in servers.windows(2) {
                        assert!(pair[0].name < pair[1].name, "servers not sorted and unique");
                    }
                    for s in &servers {
                        if let TransportConfig::Stdio { command, .. } = &s.transport {
                            assert!(!command.is_empty(), "a stdio server without a command");
                        }
                    }
                }
            }
        }
    }
}

/// A refusal says something, and does not grow beyond the text it quotes.
fn assert_message(message: &str, text_len: usize) {
    assert!(!message.trim().is_empty(), "an empty error message");
    assert!(
        message.len() <= 2 * text_len + 4096,
        "an error message of {} bytes for {} bytes of text",
        message.len(),
        text_len
    );
}
