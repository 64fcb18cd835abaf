//! Language runtimes: how Python and Deno start inside the sandbox, and the boot protocol
//! that hands them the user's code over fd 3.
//!
//! Boot protocol (supervisor → sandbox, on fd 3, once): the records of [`boot`] — optional
//! workspace files, then the program's source. The in-sandbox boot files
//! (`python/boot.py`, `deno/boot.js`, installed in the rootfs under `/opt/codebox/`) read
//! them and run the code as the main program. Starting the interpreter before the code is
//! known is what lets a later warm pool keep interpreters waiting.

pub mod boot;
pub mod exit;

pub use boot::{
    boot_frame, boot_frame_with_files, decode_files, ephemeral, session_boot_frame,
    session_run_message, validate_files, validate_path, with_outputs, with_value, FileContent,
    FileError, Files, FILES_METHOD, FILE_METHOD, MAX_FILES_BYTES, VALUE_METHOD,
};
pub use exit::{parse_exit, ExitNotice, RunReport, EXIT_METHOD};

use std::fmt;
use std::str::FromStr;

use crate::sandbox::{Program, Result};

/// Where the runtime files live inside the sandbox.
pub const RUNTIME_DIR: &str = "/opt/codebox";

/// The port of the egress listener inside every proxy-mode sandbox's own network
/// namespace (one listener per namespace, so one fixed port serves them all).
pub const EGRESS_PORT: u16 = 3128;

/// The Deno cache in the rootfs (`rootfs/recipe.toml` `[deno] cache_dir`): the
/// TypeScript runtime's `DENO_DIR`.
pub const DENO_CACHE: &str = "/opt/codebox/deno-cache";

/// Where the egress trust bundle is bound inside the sandbox.
pub const TRUST_DIR: &str = "/etc/codebox";

/// The trust bundle's path inside the sandbox: the host's CA roots and codebox's own CA.
pub const TRUST_BUNDLE: &str = "/etc/codebox/ca-bundle.pem";

/// The environment that points a program's HTTP clients at the egress proxy (`port` on
/// 127.0.0.1) and, with a trust bundle, at the CA roots that include codebox's own CA.
/// Upper- and lower-case forms: Python's urllib and requests take either, curl-style
/// tools only the lower-case `http_proxy`, Deno the upper-case ones. `NO_PROXY` stays
/// unset: nothing is reachable but the proxy anyway.
pub fn egress_env(port: u16, trust_bundle: bool) -> Vec<(&'static str, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env: Vec<(&'static str, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .into_iter()
    .map(|k| (k, url.clone()))
    .collect();
    if trust_bundle {
        // OpenSSL (CPython's ssl), requests, curl, Deno, and Node-compatible packages.
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "DENO_CERT",
            "NODE_EXTRA_CA_CERTS",
        ] {
            env.push((k, TRUST_BUNDLE.to_string()));
        }
    }
    env
}

/// Where an installed package layer is bound inside the sandbox.
pub const PACKAGES_DIR: &str = "/packages";

/// The environment that points a language at an installed package layer: Python's boot
/// puts `CODEBOX_PACKAGES` on `sys.path` (it runs with `-I`, which ignores PYTHONPATH);
/// Deno takes the layer as its (read-only) cache.
pub fn packages_env(language: Language) -> Vec<(&'static str, String)> {
    match language {
        Language::Python => vec![("CODEBOX_PACKAGES", format!("{PACKAGES_DIR}/site"))],
        Language::TypeScript => vec![("DENO_DIR", format!("{PACKAGES_DIR}/deno"))],
    }
}

/// The environment variable that lists, comma-separated, the modules a pooled Python
/// interpreter imports before it announces ready (`boot.py`; a profile's `[python]
/// preload`). A sandbox whose code is already waiting on fd 3 ignores it.
pub const PRELOAD_ENV: &str = "CODEBOX_PRELOAD";

/// The environment that asks a Python sandbox to preload `modules` (none when empty).
pub fn preload_env(modules: &[String]) -> Vec<(&'static str, String)> {
    if modules.is_empty() {
        return vec![];
    }
    vec![(PRELOAD_ENV, modules.join(","))]
}

/// The thread pools of numerical libraries (OpenBLAS in numpy, OpenMP in packages built
/// with it) size themselves by the host's CPU count, not by the sandbox's CPU limit: with
/// a limit, as many threads as the limit has whole cores (at least one). Without a limit,
/// nothing is set.
pub fn thread_env(cpu_millicores: Option<u64>) -> Vec<(&'static str, String)> {
    let Some(m) = cpu_millicores else {
        return vec![];
    };
    let threads = m.div_ceil(1000).max(1).to_string();
    vec![
        ("OPENBLAS_NUM_THREADS", threads.clone()),
        ("OMP_NUM_THREADS", threads),
    ]
}

/// Largest program accepted, in bytes.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;

/// A language codebox can run.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    TypeScript,
}

impl Language {
    pub const ALL: [Language; 2] = [Language::Python, Language::TypeScript];

    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::TypeScript => "typescript",
        }
    }

    /// The fixed environment of the language's interpreter inside the sandbox (nothing
    /// of the caller's environment is inherited). `codebox exec` uses Python's.
    pub fn env(self) -> Vec<(&'static str, &'static str)> {
        let common = [
            ("PATH", "/usr/bin"),
            ("HOME", "/workspace"),
            ("LANG", "C.UTF-8"),
            ("TMPDIR", "/tmp"),
        ];
        let extra: &[(&str, &str)] = match self {
            Language::Python => &[
                ("PYTHONDONTWRITEBYTECODE", "1"),
                // matplotlib: Agg, with figures shown (plt.show()) or left open saved
                // as PNG under /workspace/out (codebox_mpl.py), and its config and font
                // cache in the sandbox's /tmp (HOME is /workspace, the user's).
                ("MPLBACKEND", "module://codebox_mpl"),
                ("MPLCONFIGDIR", "/tmp/.matplotlib"),
            ],
            Language::TypeScript => &[
                // The rootfs's read-only Deno cache (the recipe's [deno] packages). Deno
                // would retry writing its emit cache there with growing sleeps (~150 ms
                // per start, measured) and try to open its SQLite caches: no emit cache,
                // SQLite caches in memory (what a fresh /tmp gave before, at the same cost).
                ("DENO_DIR", DENO_CACHE),
                ("DENO_EMIT_CACHE_MODE", "disable"),
                ("DENO_CACHE_DB_MODE", "memory"),
                ("DENO_NO_UPDATE_CHECK", "1"),
                ("DENO_NO_PROMPT", "1"),
                ("NO_COLOR", "1"),
            ],
        };
        common.into_iter().chain(extra.iter().copied()).collect()
    }

    /// The interpreter command line and environment inside the sandbox.
    pub fn program(self) -> Result<Program> {
        let env = self.env();
        match self {
            Language::Python => {
                // -I: ignore PYTHON* variables and user site; -S: no site module (the
                // rootfs has no site-packages; boot.py installs exit/quit); -B: no .pyc
                // writes on the read-only rootfs.
                Program::new(
                    "/usr/bin/python3",
                    &["python3", "-I", "-S", "-B", "/opt/codebox/python/boot.py"],
                    &env,
                    "/workspace",
                )
            }
            Language::TypeScript => {
                // Deno's own permission system is not the boundary here (the kernel is),
                // and the boot file needs FFI to read fd 3, so everything is allowed.
                // --cached-only: packages come from the rootfs's cache (or a package
                // layer), never from the network at import time.
                Program::new(
                    "/usr/bin/deno",
                    &[
                        "deno",
                        "run",
                        "--allow-all",
                        "--no-prompt",
                        "--no-config",
                        "--no-lock",
                        "--cached-only",
                        "/opt/codebox/deno/boot.js",
                    ],
                    &env,
                    "/workspace",
                )
            }
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown language name.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown language {0:?}: expected python or typescript")]
pub struct UnknownLanguage(pub String);

impl FromStr for Language {
    type Err = UnknownLanguage;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "python" | "py" | "python3" => Ok(Language::Python),
            "typescript" | "ts" | "deno" => Ok(Language::TypeScript),
            _ => Err(UnknownLanguage(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_parse_with_aliases() {
        assert_eq!("python".parse::<Language>().unwrap(), Language::Python);
        assert_eq!("TS".parse::<Language>().unwrap(), Language::TypeScript);
        let err = "ruby".parse::<Language>().unwrap_err();
        assert!(err.to_string().contains("python or typescript"));
    }

    #[test]
    fn programs_have_fixed_small_environment() {
        for lang in Language::ALL {
            let p = lang.program().unwrap();
            let env: Vec<_> = p
                .env
                .iter()
                .map(|e| e.to_str().unwrap().to_string())
                .collect();
            assert!(env.iter().any(|e| e == "PATH=/usr/bin"));
            assert!(env.iter().any(|e| e == "HOME=/workspace"));
            assert!(env.len() <= 10, "{env:?}");
            assert_eq!(p.cwd.to_str().unwrap(), "/workspace");
            assert!(
                !env.iter().any(|e| e.to_lowercase().contains("proxy")),
                "{env:?}"
            );
        }
    }

    #[test]
    fn preload_and_thread_environments() {
        assert!(preload_env(&[]).is_empty());
        let mods = vec!["numpy".to_string(), "matplotlib.pyplot".to_string()];
        assert_eq!(
            preload_env(&mods),
            [(PRELOAD_ENV, "numpy,matplotlib.pyplot".to_string())]
        );
        assert!(thread_env(None).is_empty());
        let t = |m| thread_env(Some(m))[0].1.clone();
        assert_eq!(
            (t(1), t(1000), t(1500), t(4000)),
            ("1".into(), "1".into(), "2".into(), "4".into())
        );
        let py = Language::Python.env();
        assert!(
            py.contains(&("MPLBACKEND", "module://codebox_mpl")),
            "{py:?}"
        );
        let ts = Language::TypeScript.env();
        assert!(ts.contains(&("DENO_DIR", DENO_CACHE)), "{ts:?}");
        let args = Language::TypeScript.program().unwrap().argv;
        assert!(
            args.iter().any(|a| a.to_str() == Ok("--cached-only")),
            "{args:?}"
        );
    }

    #[test]
    fn egress_environment_points_at_the_proxy_and_the_bundle() {
        let env = egress_env(3128, true);
        let get = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        for k in ["HTTP_PROXY", "https_proxy", "ALL_PROXY"] {
            assert_eq!(get(k), Some("http://127.0.0.1:3128"), "{k}");
        }
        assert_eq!(get("SSL_CERT_FILE"), Some(TRUST_BUNDLE));
        assert_eq!(get("DENO_CERT"), Some(TRUST_BUNDLE));
        assert_eq!(get("NO_PROXY"), None);
        assert!(TRUST_BUNDLE.starts_with(TRUST_DIR));
        let bare = egress_env(3128, false);
        assert!(!bare.iter().any(|(k, _)| *k == "SSL_CERT_FILE"));
    }
}
