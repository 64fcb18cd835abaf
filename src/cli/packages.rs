//! `serve`'s packages on request: the store, the sources (configured, or the rootfs pip's
//! own index and the host npm's registry), the installer's own egress proxy (those hosts
//! only) and the installer sandbox.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use codebox::egress::{
    Egress, EgressOptions, EgressPolicy, NetworkMode, NetworkSection, SystemResolver,
};
use codebox::packages::{
    Discover, Installer, LayerStore, NamePolicy, PackagesSection, Sourced, Sources,
};
use codebox::rootfs::manifest::{Entry, Manifest};
use codebox::runtime::Language;
use codebox::server::wiring::packages::SandboxInstaller;
use codebox::spawner::wire::SpawnNetwork;
use codebox::spawner::SpawnerClient;

/// Where pip lives in the rootfs (outside the programs' `sys.path`).
const INSTALLER_DIR: &str = "opt/codebox/installer";
/// The rootfs's Deno cache (what TypeScript programs find without a layer).
const DENO_CACHE: &str = "opt/codebox/deno-cache";

/// What `serve` prepares before its runtime exists: `None` when packages on request are
/// off (by configuration, or because the rootfs has no installer).
pub struct Prepared {
    deno_cache: PathBuf,
    store: LayerStore,
    names: NamePolicy,
    discovery: Discovery,
}

/// What layers of each language are installed for: the digests of the rootfs's
/// interpreter files (`/usr/bin/python3*`, `/usr/bin/deno`) from its manifest, so that a
/// rebuilt rootfs with another interpreter never binds layers made for the old one.
/// Both from one read of the manifest.
fn runtime_identities(rootfs: &Path) -> [String; 2] {
    let path = rootfs.join(".manifest");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Default::default();
    };
    let Ok(manifest) = Manifest::parse(&text, &path) else {
        return Default::default();
    };
    ["/usr/bin/python3", "/usr/bin/deno"].map(|interpreter| {
        let mut digests: Vec<String> = manifest
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::File { path, sha256, .. } if path.starts_with(interpreter) => {
                    Some(format!("{path}:{}", codebox::rootfs::manifest::hex(sha256)))
                }
                _ => None,
            })
            .collect();
        digests.sort();
        digests.join("\n")
    })
}

pub fn prepare(
    section: &PackagesSection,
    rootfs: &Path,
    state_dir: Option<&Path>,
    sandbox_ids: (u32, u32),
) -> anyhow::Result<Option<Prepared>> {
    if !section.enabled() {
        return Ok(None);
    }
    if !rootfs.join(INSTALLER_DIR).join("pip").is_dir() {
        tracing::warn!(rootfs = %rootfs.display(), "packages on request are off: the rootfs has no installer (rebuild it with `cargo xtask rootfs`)");
        return Ok(None);
    }
    let limits = section.limits()?;
    let names = NamePolicy::new(&section.allow, &section.deny)?;
    let Some(state_dir) = state_dir else {
        anyhow::bail!("packages on request need a state directory: set state_dir (CODEBOX_STATE_DIR), or [packages] enabled = false");
    };
    let cache = section
        .cache_dir
        .clone()
        .unwrap_or_else(|| state_dir.join("layers"));
    let [python, deno] = runtime_identities(rootfs);
    let store = LayerStore::open(&cache, limits, sandbox_ids)
        .with_context(|| format!("the package cache {}", cache.display()))?
        .with_runtime(Language::Python, python)
        .with_runtime(Language::TypeScript, deno);
    tracing::info!(cache = %cache.display(), "packages on request: on (sources are found in the background)");
    Ok(Some(Prepared {
        deno_cache: rootfs.join(DENO_CACHE),
        store,
        names,
        discovery: Discovery {
            section: section.clone(),
            rootfs: rootfs.to_path_buf(),
            state_dir: state_dir.to_path_buf(),
            sandbox_ids,
        },
    }))
}

/// What finding the sources needs: asking the rootfs's pip and the host's npm for their
/// defaults (a Python and a Node start, up to half a second) and resolving the hosts.
struct Discovery {
    section: PackagesSection,
    rootfs: PathBuf,
    state_dir: PathBuf,
    sandbox_ids: (u32, u32),
}

impl Discovery {
    /// The sources and the installer's own egress proxy (those hosts only).
    fn run(self) -> anyhow::Result<(Sources, Egress)> {
        let section = &self.section;
        let mut missing = std::collections::BTreeMap::new();
        let (default_index, default_files) = match section.python_index {
            Some(_) => (None, None),
            None => pip_defaults(&self.rootfs).unwrap_or_else(|why| {
                missing.insert("python_index".to_string(), why);
                (None, None)
            }),
        };
        let python_index = section.python_index.clone().or(default_index);
        let python_files = match (&section.python_files, &section.python_index) {
            (Some(f), _) => f.clone(),
            (None, None) => default_files.into_iter().collect(),
            (None, Some(_)) => Vec::new(),
        };
        let npm = match &section.npm_registry {
            Some(url) => Some(url.clone()),
            None => npm_registry().unwrap_or_else(|why| {
                missing.insert("npm_registry".to_string(), why);
                None
            }),
        };
        let sources = Sources {
            python_index,
            npm_registry: npm,
            jsr_registry: section.jsr_registry.clone(),
            missing,
        };
        let mut hosts = Vec::new();
        for url in [
            &sources.python_index,
            &sources.npm_registry,
            &sources.jsr_registry,
        ]
        .into_iter()
        .flatten()
        .chain(python_files.iter())
        {
            hosts.push(
                host_rule(url)
                    .with_context(|| format!("packages: {url:?} is not an http(s) URL"))?,
            );
        }
        // The sources are trusted by name: the addresses they resolve to now are allowed
        // even when they are not public (a private mirror; a registry behind the host's
        // own gateway). Nothing else non-public is.
        let mut allow_private = section.allow_private.clone();
        for host in &hosts {
            allow_private.extend(resolved(host));
        }
        let policy = EgressPolicy::from_section(
            &NetworkSection {
                mode: Some(NetworkMode::Proxy),
                allow: hosts.clone(),
                allow_private,
                // A private index's CA: the installer's trust bundle (what pip checks
                // the index against through its tunnel) holds it.
                extra_roots: section.extra_roots.clone(),
                ..NetworkSection::default()
            },
            &codebox::config::process_env,
        )
        .context("the package installer's egress policy")?;
        let egress = Egress::new(
            policy,
            EgressOptions {
                state_dir: self.state_dir.join("installer"),
                resolver: Arc::new(SystemResolver),
            },
        )
        .context("the package installer's egress proxy")?;
        codebox::server::reachable_by(
            egress.trust_dir(),
            self.sandbox_ids,
            "state_dir (CODEBOX_STATE_DIR)",
        )
        .map_err(|why| anyhow::anyhow!("the installer cannot read its trust bundle: {why}"))?;
        tracing::info!(hosts = ?hosts, "package installer's hosts");
        Ok((sources, egress))
    }
}

impl Prepared {
    /// The installer, once the spawner client exists; its sources are found in the
    /// background from now on (the first install waits for them if it comes first).
    pub fn start(
        self,
        spawner: SpawnerClient,
        profile: &codebox::profile::Profile,
    ) -> Arc<Installer> {
        let profile_source = profile.source.clone();
        let base_limits = profile.limits.clone();
        let discovery = self.discovery;
        let discover: Discover = Box::new(move || {
            let (sources, egress) = discovery.run().map_err(|e| format!("{e:#}"))?;
            let runner = SandboxInstaller {
                spawner,
                profile: profile_source,
                base_limits,
                network: SpawnNetwork::Proxy {
                    trust: Some(egress.trust_dir().to_path_buf()),
                },
                egress: Arc::new(egress),
            };
            Ok(Sourced {
                sources,
                runner: Arc::new(runner),
            })
        });
        let installer = Arc::new(
            Installer::discovering(self.store, self.names, discover)
                .with_preinstalled(codebox::packages::Preinstalled::new(&self.deno_cache)),
        );
        installer.discover_now();
        installer
    }
}

/// The non-public addresses `host:port` resolves to, as `allow_private` rules.
fn resolved(host: &str) -> Vec<String> {
    use std::net::ToSocketAddrs;
    let addrs = match host.to_socket_addrs() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(%host, error = %e, "cannot resolve a package source now; its addresses must be public");
            return Vec::new();
        }
    };
    let mut rules: Vec<String> = addrs.map(|a| a.to_string()).collect();
    rules.sort();
    rules.dedup();
    rules
}

/// `https://host[:port]/...` → `host:port` (the port the scheme implies when none).
fn host_rule(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    Some(
        if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
            && !authority.ends_with(']')
        {
            authority.to_string()
        } else {
            format!("{authority}:{port}")
        },
    )
}

/// The index and file host of the rootfs's own pip (its built-in defaults), asked of it
/// on the host: the rootfs holds the very pip the installer runs. `Err`: why it could not
/// be asked.
fn pip_defaults(rootfs: &Path) -> Result<(Option<String>, Option<String>), String> {
    let dir = rootfs.join(INSTALLER_DIR);
    let code = format!(
        "import sys; sys.path.insert(0, {:?}); from pip._internal.models.index import PyPI; \
         print(PyPI.simple_url); print('https://' + PyPI.file_storage_domain)",
        dir.display().to_string()
    );
    let out = ask("the rootfs's pip for its default index", || {
        let mut python = Command::new("/usr/bin/python3");
        python.args(["-I", "-S", "-c", &code]);
        python
    });
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let mut lines = text.lines().map(|l| l.trim().to_string());
            Ok((lines.next(), lines.next()))
        }
        other => {
            let why = match other {
                Ok(o) => format!(
                    "asking the rootfs's pip for its default index failed ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(why) => why,
            };
            tracing::warn!(
                why,
                "cannot read the rootfs pip's default index; set [packages] python_index"
            );
            Err(why)
        }
    }
}

/// Attempts at asking a tool for a default when it dies by a signal (killed, crashed):
/// such an end says nothing about the answer.
const ASK_ATTEMPTS: u32 = 3;

/// Runs the command `make` builds (see [`output_within`]); one that dies by a signal is
/// asked again, [`ASK_ATTEMPTS`] times in all with a short back-off, one WARN line each.
/// `Err`: why there is no answer, naming `what` was asked.
fn ask(what: &str, make: impl Fn() -> Command) -> Result<std::process::Output, String> {
    use std::os::unix::process::ExitStatusExt;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let out =
            output_within(make(), ASK_BOUND).map_err(|e| format!("asking {what} failed: {e}"))?;
        let Some(signal) = out.status.signal() else {
            return Ok(out);
        };
        let signal = nix::sys::signal::Signal::try_from(signal)
            .map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_string());
        if attempt >= ASK_ATTEMPTS {
            return Err(format!(
                "asking {what} was ended by {signal} {attempt} times in a row"
            ));
        }
        tracing::warn!(
            what,
            signal,
            attempt,
            "a tool asked for a default was ended by a signal; asking again"
        );
        std::thread::sleep(Duration::from_millis(200 * u64::from(attempt)));
    }
}

/// How long asking the rootfs's pip or the host's npm for a default may take: a tool that
/// hangs (a broken npm configuration, a stalled home directory) must not keep every
/// package install waiting.
const ASK_BOUND: Duration = Duration::from_secs(15);

/// `cmd`'s output (stdin empty), or `TimedOut` once `bound` passes, its process group
/// killed and reaped.
fn output_within(mut cmd: Command, bound: Duration) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn()?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + bound;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let group = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer within {} s", bound.as_secs_f64()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// The host npm's registry (`npm config get registry`): `Ok(None)` when npm answers
/// without one, `Err` when it cannot be asked (not installed, killed again and again).
fn npm_registry() -> Result<Option<String>, String> {
    let out = ask("the host's npm for its registry", || {
        let mut npm = Command::new("npm");
        npm.args(["config", "get", "registry"]);
        npm
    })
    .inspect_err(|why| {
        tracing::warn!(
            why,
            "cannot ask npm for its registry; set [packages] npm_registry"
        )
    })?;
    let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && url.starts_with("http")).then_some(url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asking_a_tool_that_hangs_gives_up_at_the_bound() {
        let mut hang = Command::new("/bin/sh");
        hang.args(["-c", "sleep 30 & echo $!; wait"]);
        let started = Instant::now();
        let e = output_within(hang, Duration::from_millis(300)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let mut echo = Command::new("/bin/echo");
        echo.arg("answer");
        let out = output_within(echo, Duration::from_secs(10)).unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"answer\n");
    }

    /// A tool killed while it is asked (an operator's `kill`, the OOM killer) is asked
    /// again; one killed every time is a clear error naming the tool and the signal.
    #[test]
    fn a_tool_killed_while_asked_is_asked_again() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("asked");
        // Killed by SIGKILL on the first attempt, answers on the second.
        let script = format!(
            "if [ -e {m} ]; then echo answer; else touch {m}; kill -KILL $$; fi",
            m = marker.display()
        );
        let out = ask("a test tool", || {
            let mut sh = Command::new("/bin/sh");
            sh.args(["-c", &script]);
            sh
        })
        .unwrap();
        assert_eq!(out.stdout, b"answer\n");
        let why = ask("a test tool", || {
            let mut sh = Command::new("/bin/sh");
            sh.args(["-c", "kill -KILL $$"]);
            sh
        })
        .unwrap_err();
        assert!(
            why.contains("a test tool") && why.contains("SIGKILL") && why.contains("3 times"),
            "{why}"
        );
        let why = ask("a missing tool", || Command::new("/nonexistent/tool")).unwrap_err();
        assert!(why.contains("a missing tool"), "{why}");
    }

    #[test]
    fn host_rules_from_urls() {
        assert_eq!(
            host_rule("https://index.example/simple").as_deref(),
            Some("index.example:443")
        );
        assert_eq!(
            host_rule("http://127.0.0.1:8080/simple/").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(host_rule("https://[::1]/x").as_deref(), Some("[::1]:443"));
        assert_eq!(
            host_rule("https://[::1]:8443/x").as_deref(),
            Some("[::1]:8443")
        );
        assert!(host_rule("ftp://x").is_none());
        assert!(host_rule("https://user:pw@x/").is_none());
        assert!(host_rule("https:///x").is_none());
    }
}
