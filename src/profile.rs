//! Sandbox profiles: limits and policy layers as data (`policies/profiles/*.toml`).
//!
//! The shipped profiles are compiled into the binary, so an installed `codebox` does not
//! depend on the source tree; `--profile PATH.toml` loads one from a file. Every key is
//! required and unknown keys are refused, so a typo cannot silently weaken a profile.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::egress::{NetworkMode, NetworkSection};
use crate::sandbox::seccomp::{CompiledFilter, SeccompProfile};
use crate::sandbox::{LandlockMode, Limits, NetworkAccess, SecurityPolicy};
use crate::units::{parse_duration, parse_size};

/// Profiles shipped with codebox: (name, TOML).
pub const BUILTIN: &[(&str, &str)] = &[
    ("default", include_str!("../policies/profiles/default.toml")),
    ("network", include_str!("../policies/profiles/network.toml")),
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown profile {name:?}: expected one of {known} or a path to a .toml file")]
    Unknown { name: String, known: String },
    #[error("cannot read profile {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("profile {name} is invalid: {reason}")]
    Invalid { name: String, reason: String },
}

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    description: String,
    /// `namespace` (the default when absent) or `microvm`.
    #[serde(default)]
    backend: crate::microvm::Backend,
    limits: LimitsSection,
    seccomp: SeccompSection,
    landlock: LandlockSection,
    #[serde(default)]
    network: NetworkSection,
    #[serde(default)]
    python: PythonSection,
}

/// `[python]`: what a pooled Python interpreter does before it is ready.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PythonSection {
    /// Modules imported before the sandbox announces ready, so that the program's own
    /// import finds them in `sys.modules`. Only a pooled sandbox (its code is not there
    /// yet) imports them; a cold run does not pay for them.
    #[serde(default)]
    preload: Vec<String>,
}

/// At most this many modules to preload.
const MAX_PRELOAD: usize = 64;

/// At most [`MAX_PRELOAD`] dotted module names.
fn check_preload(modules: &[String]) -> std::result::Result<(), String> {
    if modules.len() > MAX_PRELOAD {
        return Err(format!(
            "python.preload lists more than {MAX_PRELOAD} modules"
        ));
    }
    match modules.iter().find(|m| !is_module_name(m)) {
        Some(bad) => Err(format!(
            "python.preload: {bad:?} is not a dotted module name"
        )),
        None => Ok(()),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsSection {
    memory: String,
    pids: u64,
    cpu: f64,
    timeout: String,
    tmpfs: String,
    shm: String,
    output: String,
    open_files: u64,
    file_size: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SeccompSection {
    policy: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LandlockSection {
    required: bool,
}

/// A loaded, validated profile.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: String,
    /// What [`Profile::load`] takes to load this profile again (in the spawner): the
    /// shipped name, or the file's absolute path.
    pub source: String,
    pub description: String,
    /// Where its sandboxes run: fresh namespaces, or the same sandbox in a microVM.
    pub backend: crate::microvm::Backend,
    pub limits: Limits,
    /// The seccomp policy (`policies/seccomp/<name>.json`) the profile names; proxy mode
    /// runs under `egress` instead (see [`Profile::set_network`]).
    pub seccomp: SeccompProfile,
    pub policy: SecurityPolicy,
    /// `[network]` as written (the server's `codebox.toml` may replace it).
    pub network: NetworkSection,
    /// The mode `network` asks for.
    pub network_mode: NetworkMode,
    /// `[python] preload`: dotted module names a pooled Python interpreter imports before
    /// it is ready (see `runtime::PRELOAD_ENV`).
    pub preload: Vec<String>,
}

impl Profile {
    /// A shipped profile by name, or a profile file by path (anything containing `/` or
    /// ending in `.toml`).
    pub fn load(name_or_path: &str) -> Result<Profile> {
        if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
            let text = std::fs::read_to_string(name_or_path).map_err(|source| Error::Read {
                path: name_or_path.to_string(),
                source,
            })?;
            let name = Path::new(name_or_path)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| name_or_path.to_string());
            let mut profile = Profile::parse(&name, &text)?;
            profile.source = std::path::absolute(name_or_path)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|_| name_or_path.to_string());
            return Ok(profile);
        }
        match BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            Some((name, text)) => Profile::parse(name, text),
            None => Err(Error::Unknown {
                name: name_or_path.to_string(),
                known: BUILTIN
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// Parses and validates profile TOML.
    pub fn parse(name: &str, text: &str) -> Result<Profile> {
        let invalid = |reason: String| Error::Invalid {
            name: name.to_string(),
            reason,
        };
        let file: File = toml::from_str(text).map_err(|e| invalid(e.message().to_string()))?;
        let l = &file.limits;
        let size = |field: &str, v: &str| {
            parse_size(v).map_err(|e| invalid(format!("limits.{field}: {e}")))
        };
        let memory = size("memory", &l.memory)?;
        if memory < 16 << 20 {
            return Err(invalid("limits.memory must be at least 16M".into()));
        }
        if l.pids < 4 {
            return Err(invalid("limits.pids must be at least 4".into()));
        }
        if !(l.cpu > 0.0 && l.cpu <= 1024.0) {
            return Err(invalid(
                "limits.cpu must be a positive number of cores".into(),
            ));
        }
        let timeout: Duration =
            parse_duration(&l.timeout).map_err(|e| invalid(format!("limits.timeout: {e}")))?;
        let output = size("output", &l.output)?;
        let limits = Limits {
            timeout,
            stdout_cap: usize::try_from(output).unwrap_or(usize::MAX),
            stderr_cap: usize::try_from(output).unwrap_or(usize::MAX),
            tmpfs_bytes: size("tmpfs", &l.tmpfs)?,
            shm_bytes: size("shm", &l.shm)?,
            open_files: l.open_files,
            file_size_bytes: size("file_size", &l.file_size)?,
            memory_bytes: Some(memory),
            pids: Some(l.pids),
            cpu_millicores: Some((l.cpu * 1000.0).round() as u64),
        };
        check_preload(&file.python.preload).map_err(invalid)?;
        let seccomp: SeccompProfile = file
            .seccomp
            .policy
            .parse()
            .map_err(|e| invalid(format!("seccomp.policy: {e}")))?;
        // Compiled here, once, long before any fork; a broken policy stops the profile.
        let filter = CompiledFilter::for_profile(seccomp)
            .map_err(|e| invalid(format!("seccomp.policy {seccomp}: {e}")))?;
        let mut profile = Profile {
            name: name.to_string(),
            source: name.to_string(),
            description: file.description,
            backend: file.backend,
            limits,
            seccomp,
            policy: SecurityPolicy {
                landlock: Some(if file.landlock.required {
                    LandlockMode::Required
                } else {
                    LandlockMode::BestEffort
                }),
                network: NetworkAccess::None,
                seccomp: Some(filter),
            },
            network: NetworkSection::default(),
            network_mode: NetworkMode::None,
            preload: file.python.preload,
        };
        profile.set_network(file.network).map_err(invalid)?;
        Ok(profile)
    }

    /// Replaces `[python] preload` (the server's `codebox.toml` may set it).
    pub fn set_preload(&mut self, modules: Vec<String>) -> std::result::Result<(), String> {
        check_preload(&modules)?;
        self.preload = modules;
        Ok(())
    }

    /// Makes `section` this profile's network: the mode and its kernel layers. `none`
    /// keeps the profile's seccomp policy and denies all TCP (landlock); `loopback` needs
    /// a policy with IP sockets (`network`); `proxy` runs under the `egress` policy (TCP
    /// only) with landlock's one connect rule, whatever the profile names. The host rules
    /// are the egress proxy's business (`egress::EgressPolicy`), checked by the caller.
    pub fn set_network(&mut self, section: NetworkSection) -> std::result::Result<(), String> {
        let mode = section.effective_mode().map_err(|e| e.to_string())?;
        let profile_filter = || {
            CompiledFilter::for_profile(self.seccomp)
                .map_err(|e| format!("seccomp.policy {}: {e}", self.seccomp))
        };
        let (access, filter) = match mode {
            NetworkMode::None => (NetworkAccess::None, profile_filter()?),
            NetworkMode::Loopback => {
                if self.seccomp == SeccompProfile::Default {
                    return Err(format!(
                        "network mode loopback needs IP sockets: set seccomp.policy = \"network\" (it is \"{}\")",
                        self.seccomp
                    ));
                }
                (NetworkAccess::Loopback, profile_filter()?)
            }
            NetworkMode::Proxy => (
                NetworkAccess::Proxy {
                    port: crate::runtime::EGRESS_PORT,
                },
                CompiledFilter::for_profile(SeccompProfile::Egress)
                    .map_err(|e| format!("seccomp.policy egress: {e}"))?,
            ),
        };
        if mode != NetworkMode::Proxy
            && (!section.allow.is_empty()
                || !section.deny.is_empty()
                || !section.allow_private.is_empty()
                || !section.credentials.is_empty())
        {
            return Err(format!(
                "network: allow, deny, allow_private and credentials need mode = \"proxy\" (the mode is {})",
                mode
            ));
        }
        self.policy.network = access;
        self.policy.seccomp = Some(filter);
        self.network = section;
        self.network_mode = mode;
        Ok(())
    }
}

/// `pkg.sub.mod`: ASCII identifiers joined by dots (what goes into the sandbox's
/// environment and to `__import__`, nothing else).
fn is_module_name(name: &str) -> bool {
    name.len() <= 200
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_load() {
        let d = Profile::load("default").unwrap();
        assert_eq!(d.limits.memory_bytes, Some(512 << 20));
        assert_eq!(d.limits.pids, Some(128));
        assert_eq!(d.limits.cpu_millicores, Some(1000));
        assert_eq!(d.limits.timeout, Duration::from_secs(30));
        assert_eq!(d.seccomp, SeccompProfile::Default);
        assert_eq!(d.policy.network, NetworkAccess::None);
        assert_eq!(d.network_mode, NetworkMode::None);
        let n = Profile::load("network").unwrap();
        assert_eq!(n.policy.network, NetworkAccess::Loopback);
        assert_eq!(n.seccomp, SeccompProfile::Network);
        assert_eq!(n.network_mode, NetworkMode::Loopback);
    }

    #[test]
    fn the_backend_is_namespace_unless_a_profile_says_microvm() {
        use crate::microvm::Backend;
        assert_eq!(
            Profile::load("default").unwrap().backend,
            Backend::Namespace
        );
        let text = BUILTIN[0].1;
        let without: String = text
            .lines()
            .filter(|l| !l.starts_with("backend") && !l.starts_with("                      #"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            Profile::parse("x", &without).unwrap().backend,
            Backend::Namespace
        );
        let vm = text.replace("backend = \"namespace\"", "backend = \"microvm\"");
        assert_eq!(Profile::parse("x", &vm).unwrap().backend, Backend::Microvm);
        let bad = text.replace("backend = \"namespace\"", "backend = \"vm\"");
        assert!(Profile::parse("x", &bad).is_err());
    }

    #[test]
    fn network_modes_bring_their_layers() {
        let with = |network: &str| {
            let text = BUILTIN[0].1.split("[network]").next().unwrap().to_string() + network;
            assert_ne!(
                text, BUILTIN[0].1,
                "the default profile's network section moved"
            );
            Profile::parse("x", &text)
        };
        let p = with("[network]\nmode = \"proxy\"\nallow = [\"api.example.com\"]").unwrap();
        assert_eq!(p.network_mode, NetworkMode::Proxy);
        assert_eq!(
            p.policy.network,
            NetworkAccess::Proxy {
                port: crate::runtime::EGRESS_PORT
            }
        );
        assert_eq!(p.policy.seccomp.as_ref().unwrap().policy(), "egress");
        assert_eq!(p.network.allow, ["api.example.com"]);
        // A section with no key is mode none.
        let p = with("[network]").unwrap();
        assert_eq!(p.policy.network, NetworkAccess::None);
        // Loopback needs IP sockets from the seccomp policy.
        let err = with("[network]\nmode = \"loopback\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("seccomp.policy = \"network\""), "{err}");
        // Host rules without proxy mode would silently do nothing: refused.
        let err = with("[network]\nallow = [\"x.example\"]")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode = \"proxy\""), "{err}");
        let err = with("[network]\nmode = \"none\"\nenabled = false")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not both"), "{err}");
        let err = with("[network]\nmode = \"everywhere\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("everywhere"), "{err}");
        // Back from proxy to none: the profile's own filter again.
        let mut p = with("[network]\nmode = \"proxy\"").unwrap();
        p.set_network(NetworkSection::default()).unwrap();
        assert_eq!(p.policy.seccomp.as_ref().unwrap().policy(), "default");
        assert_eq!(p.policy.network, NetworkAccess::None);
    }

    #[test]
    fn python_preload_is_checked() {
        let d = Profile::load("default").unwrap();
        assert!(d.preload.iter().any(|m| m == "pandas"), "{:?}", d.preload);
        let with = |python: &str| {
            let text = BUILTIN[0].1.split("[python]").next().unwrap().to_string() + python;
            Profile::parse("x", &text)
        };
        assert!(with("").unwrap().preload.is_empty());
        assert!(with("[python]").unwrap().preload.is_empty());
        let p = with("[python]\npreload = [\"numpy\", \"matplotlib.pyplot\", \"_x1\"]").unwrap();
        assert_eq!(p.preload, ["numpy", "matplotlib.pyplot", "_x1"]);
        for bad in ["os,sys", "a..b", "1abc", "", "a.b;c", "é"] {
            let err = with(&format!("[python]\npreload = [{bad:?}]"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("not a dotted module name"), "{bad}: {err}");
        }
        let many: Vec<String> = (0..65).map(|i| format!("\"m{i}\"")).collect();
        let err = with(&format!("[python]\npreload = [{}]", many.join(",")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than 64"), "{err}");
        let err = with("[python]\nimports = []").unwrap_err().to_string();
        assert!(err.contains("imports"), "{err}");
    }

    #[test]
    fn unknown_keys_and_names_are_refused() {
        let text = BUILTIN[0].1.replace("[network]", "[network]\nbogus = 1");
        let err = Profile::parse("x", &text).unwrap_err().to_string();
        assert!(err.contains("bogus"), "{err}");
        let err = Profile::load("nope").unwrap_err().to_string();
        assert!(err.contains("default, network"), "{err}");
    }

    #[test]
    fn missing_keys_and_bad_values_are_refused() {
        let text = BUILTIN[0].1.replace("pids = 128", "");
        assert!(Profile::parse("x", &text)
            .unwrap_err()
            .to_string()
            .contains("pids"));
        let text = BUILTIN[0]
            .1
            .replace("memory = \"512M\"", "memory = \"lots\"");
        assert!(Profile::parse("x", &text)
            .unwrap_err()
            .to_string()
            .contains("limits.memory"));
        let text = BUILTIN[0].1.replace("cpu = 1.0", "cpu = -1.0");
        assert!(Profile::parse("x", &text).is_err());
        let text = BUILTIN[0]
            .1
            .replace("policy = \"default\"", "policy = \"../etc\"");
        assert!(Profile::parse("x", &text).is_err());
    }

    #[test]
    fn profiles_load_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tight.toml");
        std::fs::write(
            &path,
            BUILTIN[0]
                .1
                .replace("timeout = \"30s\"", "timeout = \"2s\""),
        )
        .unwrap();
        let p = Profile::load(path.to_str().unwrap()).unwrap();
        assert_eq!(p.name, "tight");
        assert_eq!(p.limits.timeout, Duration::from_secs(2));
        // The spawner loads it again from its source: the path, not the name.
        assert_eq!(p.source, path.to_str().unwrap());
        assert_eq!(Profile::load(&p.source).unwrap().limits, p.limits);
        assert_eq!(Profile::load("default").unwrap().source, "default");
        assert!(Profile::load("/nonexistent/p.toml").is_err());
    }
}
