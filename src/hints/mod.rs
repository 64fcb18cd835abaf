//! What a failed run's result says besides how it ended: the limit it met, with its value
//! and the knob that moves it, and the likely cause of errors a newcomer meets first (the
//! network is off, a package is not installed, a name from an earlier call is gone).
//!
//! A hint is one line of plain text; the MCP result shows the hints right under its first
//! line (before a fork bomb's kilobytes of tracebacks) and in `structuredContent.hints`,
//! `codebox run` prints them on stderr. Deciding them is pure: a finished result and a
//! [`Context`] (the limits in force and where each is set, the network mode, whether
//! packages can be asked for) in, lines out, so every rule is unit-tested here. Hints read
//! what the program printed only to recognise an error class; they never quote it, so
//! they carry nothing the program controls but a module or variable name, clipped.

use std::time::Duration;

use crate::egress::NetworkMode;
use crate::execution::ExecutionResult;
use crate::runtime::Language;

/// Where the run came from, which decides how a knob is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// A tool call of `codebox serve`: arguments (`timeout_ms`), `codebox.toml`, profiles.
    Mcp,
    /// `codebox run`: flags (`--timeout`, `--memory`, `--pids`).
    Cli,
}

/// Whether a call could ask for packages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packages {
    /// The `packages` argument installs from the configured index.
    OnRequest,
    /// The server has packages on request off (`[packages] enabled = false`, or no
    /// installer in the rootfs).
    Off,
    /// `codebox run` has no packages on request.
    NotHere,
}

/// What the run was allowed and where each allowance is set.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    pub surface: Surface,
    pub language: Language,
    /// The profile's name (`default`, or a file's stem).
    pub profile: &'a str,
    pub timeout: Duration,
    /// The most a call may ask for (`max_timeout`); `None` for the CLI.
    pub max_timeout: Option<Duration>,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub network: NetworkMode,
    pub packages: Packages,
    /// The run was a keep-alive session's (names of earlier runs are kept).
    pub kept_interpreter: bool,
    /// Whether this server offers sessions (the microVM backend does not yet): a hint
    /// never points to what the server refuses.
    pub sessions: bool,
}

/// The hints for `r`, most important first; none for a run that succeeded.
pub fn for_result(r: &ExecutionResult, cx: &Context<'_>) -> Vec<String> {
    let mut hints = Vec::new();
    if r.timed_out {
        hints.push(timeout(cx));
    }
    if r.oom_killed {
        hints.push(memory(r, cx));
    }
    if r.pids_limited {
        hints.push(pids(cx));
    }
    if !r.failed() || r.timed_out || r.oom_killed {
        return hints;
    }
    let stderr = r.stderr.as_str();
    if cx.network == NetworkMode::None && network_refused(stderr) {
        hints.push(network_off(cx));
    }
    if let Some(hint) = missing_module(stderr, cx) {
        hints.push(hint);
    }
    if !cx.kept_interpreter {
        if let Some(name) = undefined_name(stderr, cx.language) {
            hints.push(fresh_interpreter(&name, cx));
        }
    }
    hints
}

fn timeout(cx: &Context<'_>) -> String {
    let value = duration_words(cx.timeout);
    match cx.surface {
        Surface::Cli => format!(
            "timed out: the run was killed at its time limit, {value} (--timeout; the profile {:?} sets the default)",
            cx.profile
        ),
        Surface::Mcp => {
            let max = cx.max_timeout.unwrap_or(cx.timeout);
            let more = if cx.timeout >= max {
                format!(
                    "that is the most this server allows (max_timeout in codebox.toml, {} ms); do less per call, e.g. split the work over several calls{}",
                    max.as_millis(),
                    if cx.sessions { " or a session" } else { "" }
                )
            } else {
                format!(
                    "pass a larger timeout_ms (this server allows up to {} ms), or do less per call",
                    max.as_millis()
                )
            };
            format!(
                "timed out: the run was killed at its time limit, {value} (timeout_ms = {}): {more}",
                cx.timeout.as_millis()
            )
        }
    }
}

fn memory(r: &ExecutionResult, cx: &Context<'_>) -> String {
    let limit = match cx.memory_bytes {
        Some(b) => bytes_words(b),
        None => "its memory limit".to_string(),
    };
    let peak = r
        .peak_memory_bytes
        .map(|b| format!(" (peak {})", bytes_words(b)))
        .unwrap_or_default();
    let knob = match cx.surface {
        Surface::Cli => "--memory raises it".to_string(),
        Surface::Mcp => format!(
            "the profile {:?} sets it ([limits] memory); an operator raises it with a profile of their own (profile = \"/path/to/profile.toml\" in codebox.toml)",
            cx.profile
        ),
    };
    format!(
        "the sandbox ran out of memory{peak} and was killed: its limit is {limit}; {knob}. Work on the data in pieces (e.g. pandas' chunksize) or keep less of it at once"
    )
}

fn pids(cx: &Context<'_>) -> String {
    let limit = match cx.pids {
        Some(n) => format!("{n} processes and threads"),
        None => "its process and thread limit".to_string(),
    };
    let knob = match cx.surface {
        Surface::Cli => "--pids raises it".to_string(),
        Surface::Mcp => format!("the profile {:?} sets it ([limits] pids)", cx.profile),
    };
    format!(
        "the sandbox reached its task limit, {limit}, so creating another process or thread failed (the errors below are that); {knob}. Use fewer threads or workers (e.g. a pool of 4)"
    )
}

fn network_off(cx: &Context<'_>) -> String {
    match cx.surface {
        Surface::Cli => "the network is off in this sandbox (the profile's network mode is \"none\"): --allow-host HOST lets the program reach HOST over HTTP(S) through codebox's egress proxy".to_string(),
        Surface::Mcp => "the network is off in this sandbox (network mode \"none\"): no connection can be made. An operator lets programs reach chosen hosts over HTTP(S) with [network] mode = \"proxy\" and allow = [\"api.example.com\"] in codebox.toml; data from the configured MCP servers is reachable through their tools instead (search_tools)".to_string(),
    }
}

/// Whether stderr shows a refused socket or a failed name lookup, in either runtime.
fn network_refused(stderr: &str) -> bool {
    const LOOKUP: &[&str] = &[
        "socket.gaierror",
        "Name or service not known",
        "Temporary failure in name resolution",
        "NameResolutionError",
        "failed to lookup address",
        "dns error",
    ];
    const SOCKET: &[&str] = &["socket.py", "socket.socket", "deno_net", "Deno.connect"];
    LOOKUP.iter().any(|s| stderr.contains(s))
        || (stderr.contains("Operation not permitted") && SOCKET.iter().any(|s| stderr.contains(s)))
}

/// The hint for Python's `ModuleNotFoundError: No module named 'x'`.
fn missing_module(stderr: &str, cx: &Context<'_>) -> Option<String> {
    if cx.language != Language::Python {
        return None;
    }
    let name = last_quoted_after(stderr, "ModuleNotFoundError: No module named '")?;
    let top = name.split('.').next().unwrap_or(&name).to_string();
    if !is_identifier(&top) {
        return None;
    }
    match top.as_str() {
        "servers" => {
            let server = name.split('.').nth(1).unwrap_or("");
            return Some(format!(
                "no configured MCP server has the Python module servers.{server}: list_servers shows each server's module name"
            ));
        }
        "skills" | "codebox" => return None,
        _ => {}
    }
    let dist = distribution_of(&top);
    Some(match cx.packages {
        Packages::OnRequest => format!(
            "{top} is not installed in this sandbox; if the package index has it, call again with packages: [\"{dist}\"] and it is installed for that call"
        ),
        Packages::Off => format!(
            "{top} is not installed in this sandbox, and packages on request are off on this server ([packages] enabled in codebox.toml)"
        ),
        Packages::NotHere => format!(
            "{top} is not installed in this sandbox; codebox serve installs packages on request (packages: [\"{dist}\"]), codebox run does not"
        ),
    })
}

/// The package that provides an import name, where the two differ; else the name.
fn distribution_of(module: &str) -> String {
    const KNOWN: &[(&str, &str)] = &[
        ("sklearn", "scikit-learn"),
        ("skimage", "scikit-image"),
        ("cv2", "opencv-python-headless"),
        ("PIL", "pillow"),
        ("yaml", "pyyaml"),
        ("bs4", "beautifulsoup4"),
        ("dateutil", "python-dateutil"),
        ("dotenv", "python-dotenv"),
        ("docx", "python-docx"),
        ("pptx", "python-pptx"),
        ("jwt", "pyjwt"),
        ("Crypto", "pycryptodome"),
        ("OpenSSL", "pyopenssl"),
        ("fitz", "pymupdf"),
        ("git", "gitpython"),
        ("serial", "pyserial"),
        ("zmq", "pyzmq"),
        ("attr", "attrs"),
        ("google.protobuf", "protobuf"),
        ("magic", "python-magic"),
        ("Levenshtein", "levenshtein"),
        ("sentencepiece", "sentencepiece"),
        ("tensorflow", "tensorflow-cpu"),
    ];
    KNOWN
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, d)| d.to_string())
        .unwrap_or_else(|| module.replace('_', "-"))
}

/// The name of a `NameError` (Python) or `ReferenceError` (TypeScript) that ended the run.
fn undefined_name(stderr: &str, language: Language) -> Option<String> {
    let name = match language {
        Language::Python => last_quoted_after(stderr, "NameError: name '")?,
        Language::TypeScript => {
            let at = stderr.rfind("ReferenceError: ")? + "ReferenceError: ".len();
            let (name, _) = stderr[at..].split_once(" is not defined")?;
            name.to_string()
        }
    };
    is_identifier(&name).then_some(name)
}

fn fresh_interpreter(name: &str, cx: &Context<'_>) -> String {
    match cx.surface {
        Surface::Cli => format!(
            "{name} is not defined: every codebox run starts a fresh interpreter"
        ),
        Surface::Mcp if !cx.sessions => format!(
            "{name} is not defined here. If it came from an earlier call: each call runs in a fresh interpreter, so nothing defined before is kept, and this server offers no sessions (its microVM backend does not keep them yet): define what the program needs in the same call"
        ),
        Surface::Mcp => format!(
            "{name} is not defined here. If it came from an earlier call: each call runs in a fresh interpreter, so nothing defined before is kept. To keep names between calls run them in a session: session: \"new\", keep_alive: true on the first call, then the session id the result gives on the next ones"
        ),
    }
}

/// The text between `prefix` and the next `'` at the last occurrence of `prefix`.
fn last_quoted_after(text: &str, prefix: &str) -> Option<String> {
    let at = text.rfind(prefix)? + prefix.len();
    let rest = &text[at..];
    let end = rest.find('\'')?;
    let name = &rest[..end];
    (!name.is_empty() && name.len() <= 100).then(|| name.to_string())
}

/// A dotted or plain identifier of at most 100 ASCII characters (nothing a program could
/// use to put text of its choice into a hint).
fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == '$')
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        })
}

fn duration_words(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 60_000 == 0 && ms >= 60_000 {
        format!("{} min", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

fn bytes_words(b: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if b >= GIB && b % GIB == 0 {
        format!("{} GiB", b / GIB)
    } else if b >= MIB {
        format!("{} MiB", b / MIB)
    } else {
        format!("{} KiB", b.div_ceil(1024))
    }
}

#[cfg(test)]
mod tests;
