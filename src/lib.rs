//! # codebox
//!
//! A code-execution sandbox for AI agents: Python and TypeScript run in throw-away Linux
//! sandboxes (fresh user/mount/pid/net/ipc/uts/cgroup namespaces over a read-only minimal
//! rootfs), served over MCP.
//!
//! # Layout
//!
//! - [`sandbox`]: everything between fork and exec, and supervising the running sandbox
//! - [`runtime`]: how Python and Deno start inside the sandbox, and the boot protocol on
//!   fd 3 that hands them the code
//! - [`rootfs`]: locating the rootfs and verifying it against its manifest
//! - [`profile`]: sandbox profiles (limits and policy layers) from `policies/profiles/`
//! - [`config`]: `codebox.toml` with environment overrides and `env:VAR` secrets
//! - [`doctor`]: host checks, layer by layer (`codebox doctor`, health)
//! - [`server`]: the MCP server (rmcp): execute_python, execute_typescript, health
//! - [`spawner`]: the single-threaded process that creates sandboxes for the async server
//! - [`execution`]: one execution end to end: language + code → sandbox → result
//! - [`hints`]: what a failed result says besides how it ended: the limit met with its
//!   value and knob, the network being off, a missing package, a name from an earlier call
//! - [`microvm`]: the microVM backend: the same sandbox inside a jailed QEMU, the guest
//!   init, warm clones
//! - [`egress`]: the egress proxy of `proxy` network mode: host allowlist, SSRF checks,
//!   credentials added at the boundary (TLS interception by a per-installation CA),
//!   limits and a record of every connection
//! - [`proxy`]: the sandbox's tool channel (fd 3): JSON-RPC to upstream tools, checked
//!   against the execution's allowlist and limits, every call recorded
//! - [`approval`]: approval gates: which tool calls and egress hosts wait for the user's
//!   approval (elicitation through the MCP client), one execution's gate and its bounds
//! - [`catalog`]: tool search over the catalog (BM25), pages, and tools at three levels
//!   of detail with their generated signatures
//! - [`codegen`]: the `/servers` tree: typed TypeScript and Python wrappers of the
//!   upstream tools, generated from the catalog
//! - [`line_reader`]: newline-delimited messages with a size cap
//! - [`upstream`]: the upstream MCP servers of `.mcp.json` (stdio or streamable HTTP):
//!   connections, reconnects, the catalog of their tools, calls
//!
//! - [`pii`]: PII detectors and the per-session token vault
//! - [`skills`]: the skills store (`/skills`)
//! - [`session`]: sessions: workspaces with quotas, idle TTL, live interpreters; pause,
//!   resume and fork
//! - [`snapshot`]: paused sessions on disk: encrypted, authenticated, atomic snapshots with
//!   typed parts (workspace now, the microVM's memory and devices later), the ledger
//! - [`audit`]: the hash-chained audit log
//! - [`ratelimit`]: per-client rate limits
//! - [`stopwatch`]: per-step timings for the debug events of the cold path
//! - [`tempdirs`]: per-process temporary directories, and removing those of dead processes
//! - [`workspace`]: listing what a program left in its workspace, never following symlinks
//! - [`adopt`]: `codebox install claude-code` / `uninstall`: Claude Code's MCP servers
//!   moved into codebox's upstream configuration and back (a pure plan, then one procedure)
//! - [`tokens`]: token counts (o200k_base) of `tools/list` payloads: upstream catalogs vs
//!   codebox's own tools
//!
//! `docs/ARCHITECTURE.md` is the code map.

pub mod adopt;
pub mod approval;
pub mod audit;
pub mod catalog;
pub mod codegen;
pub mod config;
pub mod doctor;
pub mod egress;
pub mod error_chain;
pub mod execution;
pub mod hints;
pub mod line_reader;
pub mod metrics;
pub mod microvm;
pub mod output;
pub mod packages;
pub mod pii;
pub mod pool;
pub mod profile;
pub mod proxy;
pub mod ratelimit;
pub mod replica;
pub mod rootfs;
pub mod runtime;
pub mod sandbox;
pub mod server;
pub mod session;
pub mod skills;
pub mod snapshot;
pub mod spawner;
pub mod stopwatch;
pub mod tasks;
pub mod tempdirs;
pub mod tokens;
pub mod units;
pub mod upstream;
pub mod workspace;
