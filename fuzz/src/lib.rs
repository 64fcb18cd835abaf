//! Coverage-guided fuzz targets for codebox's parsers of untrusted input.
//!
//! Each target is a function `run(&[u8])` in a module of its own; it feeds the input to
//! codebox's real parser and asserts properties of the outcome (answers carry the
//! request's id, generated code parses, round trips hold, memory stays within a fixed
//! multiple of the input), panicking when one fails. `fuzz_targets/<name>.rs` wraps it
//! in `afl::fuzz!` for `cargo afl`; `replay_tests.rs` runs it, uninstrumented, over the
//! committed seeds and every crash input kept in `regressions/<name>/` (`cargo test --lib`).
//!
//! Inputs come from three untrusted directions:
//! - MCP clients: [`jsonrpc`] (the JSON-RPC checks), [`stdio`] (the stdio transport's
//!   framing), [`http_body`] (the HTTP listener's body and bearer checks);
//! - sandboxed code: [`proxy_channel`] (the fd-3 channel: framing, requests, output
//!   file chunks), [`boot_frame`] (the files and code a client gives, as the frame
//!   carries them), [`pii`] (the detectors and the token vault over output text);
//! - upstream servers and configuration: [`codegen`] (tool names, descriptions and
//!   schemas that become TypeScript and Python), [`config`] (`codebox.toml`, profiles,
//!   `.mcp.json`), [`seccomp_policy`], [`egress_head`] (the egress proxy's first request).

pub mod budget;
pub mod oracle;

pub mod boot_frame;
pub mod codegen;
pub mod config;
pub mod egress_head;
pub mod http_body;
pub mod jsonrpc;
pub mod pii;
pub mod proxy_channel;
pub mod seccomp_policy;
pub mod stdio;

#[cfg(test)]
mod replay_tests;

/// A fuzz target: takes any bytes, panics when a property fails.
pub type Target = fn(&[u8]);

/// Every target by name (the name of its `fuzz_targets/` binary, corpus and dictionary).
pub const TARGETS: &[(&str, Target)] = &[
    ("jsonrpc", jsonrpc::run),
    ("stdio", stdio::run),
    ("http_body", http_body::run),
    ("proxy_channel", proxy_channel::run),
    ("boot_frame", boot_frame::run),
    ("pii", pii::run),
    ("codegen", codegen::run),
    ("config", config::run),
    ("seccomp_policy", seccomp_policy::run),
    ("egress_head", egress_head::run),
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// One current-thread tokio runtime per thread, reused across inputs (building one per
/// input would cost more than most targets).
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
    }
    RUNTIME.with(|rt| rt.block_on(future))
}
