//! Getting a layer for a set: the policy, the store, and — when the set is new — one run
//! of the installer sandbox (`installer.py`), of which concurrent first requests of the
//! same set share one.
//!
//! The sandbox itself is started by an [`InstallRunner`] (the server's, through the
//! spawner, with the egress proxy narrowed to the configured sources): this module decides
//! what to ask and what the answer means.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;

use super::config::{Limits, NamePolicy};
use super::spec::PackageSet;
use super::store::{Layer, LayerStore};
use crate::runtime::Language;

/// The installer program (run by the sandbox's Python as `__main__`).
pub const INSTALLER: &str = include_str!("installer.py");

/// Where packages come from (URLs as configured; the egress proxy allows their hosts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    pub python_index: Option<String>,
    pub npm_registry: Option<String>,
    pub jsr_registry: Option<String>,
    /// Why a source that is not configured has no default either, by its key
    /// (`python_index`, `npm_registry`): the tool that would have said could not be asked.
    pub missing: std::collections::BTreeMap<String, String>,
}

/// Why a set cannot be had, in words the model can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("packages: {}{reason}", package.as_ref().map(|p| format!("{p}: ")).unwrap_or_default())]
pub struct InstallError {
    /// The package the failure is about, when it is about one.
    pub package: Option<String>,
    pub reason: String,
}

impl InstallError {
    fn new(package: Option<&str>, reason: impl Into<String>) -> InstallError {
        InstallError {
            package: package.map(str::to_string),
            reason: reason.into(),
        }
    }
}

/// What one installer sandbox run gave.
#[derive(Debug, Clone, Default)]
pub struct RunOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
}

/// Runs the installer program in a sandbox: `request` is `request.json`, the staging
/// directory is bound read-write at `/workspace`.
pub trait InstallRunner: Send + Sync {
    fn run(
        &self,
        request: String,
        staging: std::path::PathBuf,
        limits: Limits,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<RunOutput, String>> + Send>>;
}

/// Counters for `health`.
#[derive(Debug, Default)]
pub struct Counters {
    pub installed: AtomicU64,
    pub reused: AtomicU64,
    pub failed: AtomicU64,
    pub refused: AtomicU64,
}

/// Where packages come from, and the runner that installs from there (its egress
/// allows exactly those hosts).
pub struct Sourced {
    pub sources: Sources,
    pub runner: Arc<dyn InstallRunner>,
}

/// Finds the sources (asking the rootfs's pip and the host's npm, resolving hosts: up to
/// half a second) — run once, on the blocking pool, off the server's start-up path.
pub type Discover = Box<dyn FnOnce() -> Result<Sourced, String> + Send>;

/// Packages on request: policy, sources, store and runner.
pub struct Installer {
    store: LayerStore,
    names: NamePolicy,
    /// The sources and runner once known (or why they cannot be). Set by the discovery
    /// task, which no caller's cancellation can end.
    sourced: Arc<std::sync::OnceLock<Result<Sourced, String>>>,
    /// Until the discovery starts.
    discover: std::sync::Mutex<Option<Discover>>,
    /// Told when `sourced` is set.
    found: Arc<tokio::sync::Notify>,
    /// What the rootfs's Deno cache already holds (TypeScript sets need no install for it).
    preinstalled: Option<super::Preinstalled>,
    pub counters: Counters,
}

#[derive(Debug, Deserialize)]
struct Report {
    ok: bool,
    #[serde(default)]
    installed: Vec<String>,
    #[serde(default)]
    package: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

impl Installer {
    pub fn new(
        store: LayerStore,
        names: NamePolicy,
        sources: Sources,
        runner: Arc<dyn InstallRunner>,
    ) -> Installer {
        Installer {
            store,
            names,
            sourced: Arc::new(std::sync::OnceLock::from(Ok(Sourced { sources, runner }))),
            discover: std::sync::Mutex::new(None),
            found: Arc::default(),
            preinstalled: None,
            counters: Counters::default(),
        }
    }

    /// An installer whose sources are found by `discover` when first needed (or when
    /// [`Installer::discover_now`] runs it early).
    pub fn discovering(store: LayerStore, names: NamePolicy, discover: Discover) -> Installer {
        Installer {
            store,
            names,
            sourced: Arc::default(),
            discover: std::sync::Mutex::new(Some(discover)),
            found: Arc::default(),
            preinstalled: None,
            counters: Counters::default(),
        }
    }

    /// The sources and runner, found now if they are not yet.
    async fn sourced(&self) -> Result<&Sourced, InstallError> {
        let found = loop {
            let notified = self.found.notified();
            tokio::pin!(notified);
            // Registered before looking, so a discovery ending in between still wakes us.
            notified.as_mut().enable();
            if let Some(found) = self.sourced.get() {
                break found;
            }
            self.start_discovery();
            notified.await;
        };
        found.as_ref().map_err(|why| {
            InstallError::new(None, format!("packages on request are unavailable: {why}"))
        })
    }

    /// Starts finding the sources (once): in a task of its own, so a caller that stops
    /// waiting (a cancelled request) does not end it and lose the discovery.
    fn start_discovery(&self) {
        let Some(discover) = self
            .discover
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        else {
            return;
        };
        let (sourced, found) = (self.sourced.clone(), self.found.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let result = tokio::task::spawn_blocking(discover)
                .await
                .unwrap_or_else(|e| Err(format!("finding the sources panicked: {e}")));
            match &result {
                Ok(s) => {
                    tracing::info!(sources = ?s.sources, ms = started.elapsed().as_millis() as u64, "package sources found")
                }
                Err(why) => tracing::error!(why, "packages on request are unavailable"),
            }
            let _ = sourced.set(result);
            found.notify_waiters();
        });
    }

    /// Finds the sources now, in the background, so the first install does not wait.
    pub fn discover_now(self: &Arc<Self>) {
        self.start_discovery();
    }

    /// Specifiers the rootfs's Deno cache satisfies need no layer.
    pub fn with_preinstalled(mut self, preinstalled: super::Preinstalled) -> Installer {
        self.preinstalled = Some(preinstalled);
        self
    }

    /// The part of `set` that needs installing (`None`: the rootfs has it all).
    pub fn needed(&self, set: PackageSet) -> Option<PackageSet> {
        match (&self.preinstalled, set.language) {
            (Some(p), Language::TypeScript) => set.without(|s| p.satisfies(s)),
            _ => Some(set),
        }
    }

    pub fn store(&self) -> &LayerStore {
        &self.store
    }

    /// The sources once found: `Ok(None)` while they are being found, `Err` when they
    /// cannot be.
    pub fn sources(&self) -> Result<Option<&Sources>, String> {
        match self.sourced.get() {
            None => Ok(None),
            Some(Ok(s)) => Ok(Some(&s.sources)),
            Some(Err(why)) => Err(why.clone()),
        }
    }

    /// What must hold before any install is tried: every name allowed, a source for
    /// every registry asked for (once the sources are known; [`Installer::layer`] checks
    /// again then). Cheap: checked with the call's other arguments.
    pub fn check(&self, set: &PackageSet) -> Result<(), InstallError> {
        let sources = match self.sourced.get() {
            None => None,
            Some(Ok(s)) => Some(&s.sources),
            Some(Err(why)) => {
                return Err(InstallError::new(
                    None,
                    format!("packages on request are unavailable: {why}"),
                ))
            }
        };
        for spec in &set.specs {
            if let Some(why) = self.names.refuses(&spec.name) {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                return Err(InstallError::new(Some(&spec.text), why));
            }
            let Some(sources) = sources else { continue };
            let (source, key) = match set.language {
                Language::Python => (&sources.python_index, "python_index"),
                Language::TypeScript if spec.text.starts_with("jsr:") => {
                    (&sources.jsr_registry, "jsr_registry")
                }
                Language::TypeScript => (&sources.npm_registry, "npm_registry"),
            };
            if source.is_none() {
                let reason = match sources.missing.get(key) {
                    Some(why) => format!(
                        "this server has no {key}: none is configured and {why}; set {key} in [packages] of codebox.toml, or restart codebox to ask again"
                    ),
                    None => format!("this server has no {key} configured ([packages] in codebox.toml)"),
                };
                return Err(InstallError::new(Some(&spec.text), reason));
            }
        }
        Ok(())
    }

    /// The layer of `set`: the kept one, or a new install (one per set at a time).
    pub async fn layer(&self, set: &PackageSet) -> Result<Arc<Layer>, InstallError> {
        self.sourced().await?;
        self.check(set)?;
        if let Some(layer) = self.store.get(set) {
            self.counters.reused.fetch_add(1, Ordering::Relaxed);
            return Ok(layer);
        }
        let lock = self.store.install_lock(set);
        let _installing = lock.lock().await;
        if let Some(layer) = self.store.get(set) {
            // Another request installed it while this one waited.
            self.counters.reused.fetch_add(1, Ordering::Relaxed);
            return Ok(layer);
        }
        let started = Instant::now();
        let result = self.install(set).await;
        let ms = started.elapsed().as_millis() as u64;
        if let Err(e) = &result {
            // Resolving an unpinned set again failed: what it resolved to before still
            // serves (an index that is down must not take away what worked).
            if let Some(layer) = self.store.get_stale(set) {
                tracing::warn!(error = %e, requested = ?set.texts(), "resolving the packages again failed; using the layer they resolved to before");
                self.counters.reused.fetch_add(1, Ordering::Relaxed);
                return Ok(layer);
            }
        }
        match &result {
            Ok(layer) => {
                self.counters.installed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(key = %layer.meta.key, installed = ?layer.meta.installed, bytes = layer.meta.bytes, ms, "package layer installed");
            }
            Err(e) => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(error = %e, requested = ?set.texts(), ms, "package install failed");
            }
        }
        result
    }

    async fn install(&self, set: &PackageSet) -> Result<Arc<Layer>, InstallError> {
        let internal = |what: &str, e: &dyn std::fmt::Display| {
            tracing::error!(error = %e, what, "package install failed inside codebox");
            InstallError::new(
                None,
                format!("the install could not run ({what}); the server log says why"),
            )
        };
        let Sourced { sources, runner } = self.sourced().await?;
        let staging = self.store.staging().map_err(|e| internal("staging", &e))?;
        let request = serde_json::json!({
            "language": set.language,
            "specs": set.texts(),
            "python_index": sources.python_index,
            "npm_registry": sources.npm_registry,
            "jsr_registry": sources.jsr_registry,
        });
        let limits = self.store.limits().clone();
        let started = Instant::now();
        let out = runner
            .run(request.to_string(), staging.dir.clone(), limits.clone())
            .await
            .map_err(|e| internal("sandbox", &e))?;
        let report = interpret(&out, &limits)?;
        let installed = report.installed;
        for name in &installed {
            let bare = installed_name(name, set.language);
            if let Some(why) = self.names.refuses(&bare) {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                return Err(InstallError::new(
                    Some(name),
                    format!("a dependency is refused: {why}"),
                ));
            }
        }
        let ms = started.elapsed().as_millis() as u64;
        let set = set.clone();
        let store_commit = {
            // The walk and the rename touch the disk: off the async threads.
            let store = &self.store;
            tokio::task::block_in_place(|| store.commit(staging, &set, installed, ms))
        };
        let (layer, fresh) = store_commit.map_err(|e| match e {
            super::store::Error::TooLarge { .. }
            | super::store::Error::TooManyEntries { .. }
            | super::store::Error::Unexpected { .. } => InstallError::new(None, e.to_string()),
            other => internal("commit", &other),
        })?;
        if !fresh {
            tracing::info!(key = %layer.meta.key, requested = ?set.texts(), "the install gave a layer that was already kept: reusing it");
        }
        Ok(layer)
    }
}

/// The installer's report, or the limit that ended it.
fn interpret(out: &RunOutput, limits: &Limits) -> Result<Report, InstallError> {
    if out.timed_out {
        return Err(InstallError::new(
            None,
            format!(
                "the install took longer than {} s (packages.install_timeout); ask for fewer or smaller packages",
                limits.install_timeout.as_secs()
            ),
        ));
    }
    if out.oom_killed {
        return Err(InstallError::new(
            None,
            "the install ran out of memory (the packages are too large for packages.max_layer_size)",
        ));
    }
    let line = out
        .stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("CODEBOX-INSTALL "));
    let Some(line) = line else {
        let tail: String = out
            .stderr
            .chars()
            .rev()
            .take(800)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        tracing::warn!(exit = ?out.exit_code, stderr = %tail, "the package installer gave no report");
        return Err(InstallError::new(
            None,
            format!(
                "the installer ended without a report (exit {:?}): {tail}",
                out.exit_code
            ),
        ));
    };
    let report: Report = serde_json::from_str(line).map_err(|e| {
        InstallError::new(None, format!("the installer's report does not parse: {e}"))
    })?;
    if !report.ok {
        return Err(InstallError::new(
            report.package.as_deref(),
            report.reason.unwrap_or_else(|| "the install failed".into()),
        ));
    }
    Ok(report)
}

/// `Name==1.0` → `name`; `npm:@s/n@1` → `@s/n`.
fn installed_name(item: &str, language: Language) -> String {
    match language {
        Language::Python => {
            super::spec::normalise_python_name(item.split("==").next().unwrap_or(item))
        }
        Language::TypeScript => {
            let rest = item.split_once(':').map_or(item, |(_, r)| r);
            match rest.strip_prefix('@') {
                Some(r) => format!("@{}", r.split('@').next().unwrap_or(r)),
                None => rest.split('@').next().unwrap_or(rest).to_string(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A runner that writes files into the staging layer and reports as the installer
    /// does, counting its runs.
    struct Fake {
        runs: AtomicU64,
        stdout: Mutex<String>,
        files: Vec<(&'static str, usize)>,
        delay_ms: u64,
    }

    impl InstallRunner for Fake {
        fn run(
            &self,
            _request: String,
            staging: std::path::PathBuf,
            _limits: Limits,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<RunOutput, String>> + Send>>
        {
            self.runs.fetch_add(1, Ordering::SeqCst);
            for (name, size) in &self.files {
                let p = staging.join("layer").join(name);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, vec![b'x'; *size]).unwrap();
            }
            let stdout = self.stdout.lock().unwrap().clone();
            let delay = self.delay_ms;
            Box::pin(async move {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                Ok(RunOutput {
                    stdout,
                    exit_code: Some(0),
                    ..Default::default()
                })
            })
        }
    }

    fn installer(fake: Arc<Fake>, deny: &[&str]) -> (Installer, tempfile::TempDir) {
        installer_with(fake, deny, Limits::default())
    }

    fn installer_with(
        fake: Arc<Fake>,
        deny: &[&str],
        limits: Limits,
    ) -> (Installer, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let store = LayerStore::open(dir.path(), limits, me).unwrap();
        let deny: Vec<String> = deny.iter().map(|s| s.to_string()).collect();
        let names = NamePolicy::new(&[], &deny).unwrap();
        let sources = Sources {
            python_index: Some("http://127.0.0.1:9/simple".into()),
            ..Default::default()
        };
        (Installer::new(store, names, sources, fake), dir)
    }

    fn set(names: &[&str]) -> PackageSet {
        let asked: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        PackageSet::parse(Language::Python, &asked, "")
            .unwrap()
            .unwrap()
    }

    fn fake(stdout: &str, delay_ms: u64) -> Arc<Fake> {
        Arc::new(Fake {
            runs: AtomicU64::new(0),
            stdout: Mutex::new(stdout.into()),
            files: vec![("site/six.py", 100)],
            delay_ms,
        })
    }

    /// The first call to need the sources finds them; a client that gives up on that
    /// call (a cancelled request, a timeout) must not take the sources with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_cancelled_while_the_sources_are_found_does_not_lose_them() {
        let f = fake(
            "CODEBOX-INSTALL {\"ok\": true, \"installed\": [\"six==1.17.0\"]}",
            0,
        );
        let dir = tempfile::tempdir().unwrap();
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let store = LayerStore::open(dir.path(), Limits::default(), me).unwrap();
        let names = NamePolicy::new(&[], &[]).unwrap();
        let runner: Arc<dyn InstallRunner> = f.clone();
        let discover: Discover = Box::new(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            Ok(Sourced {
                sources: Sources {
                    python_index: Some("http://127.0.0.1:9/simple".into()),
                    ..Default::default()
                },
                runner,
            })
        });
        let inst = Installer::discovering(store, names, discover);
        let s = set(&["six"]);
        let gave_up =
            tokio::time::timeout(std::time::Duration::from_millis(50), inst.layer(&s)).await;
        assert!(gave_up.is_err(), "the sources took 300 ms to find");
        let layer = inst.layer(&s).await;
        assert!(layer.is_ok(), "{:?}", layer.err().map(|e| e.to_string()));
        assert!(matches!(inst.sources(), Ok(Some(_))));
    }

    /// Sources that cannot be found (an error, or a panic while finding them) make every
    /// install fail with the reason, and `check` and `sources` say the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sources_that_cannot_be_found_fail_installs_with_the_reason() {
        let discoveries: [(Discover, &str); 2] = [
            (Box::new(|| Err("npm is broken".into())), "npm is broken"),
            (Box::new(|| panic!("boom")), "panicked"),
        ];
        for (discover, why) in discoveries {
            let dir = tempfile::tempdir().unwrap();
            let me = (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            );
            let store = LayerStore::open(dir.path(), Limits::default(), me).unwrap();
            let names = NamePolicy::new(&[], &[]).unwrap();
            let inst = Arc::new(Installer::discovering(store, names, discover));
            let s = set(&["six"]);
            // Before the sources are known, a request is not refused for them.
            assert!(inst.check(&s).is_ok());
            assert!(matches!(inst.sources(), Ok(None)));
            inst.discover_now();
            let e = inst.layer(&s).await.expect_err("no sources").to_string();
            assert!(e.contains("unavailable") && e.contains(why), "{e}");
            let e = inst.check(&s).expect_err("no sources").to_string();
            assert!(e.contains(why), "{e}");
            assert!(inst.sources().is_err_and(|e| e.contains(why)));
        }
    }

    /// A default that could not be asked (its tool was killed every time) is named in the
    /// refusal, with what to do; an unconfigured one without such a story is as before.
    #[test]
    fn a_source_whose_tool_could_not_be_asked_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let store = LayerStore::open(dir.path(), Limits::default(), me).unwrap();
        let names = NamePolicy::new(&[], &[]).unwrap();
        let mut sources = Sources::default();
        sources.missing.insert(
            "python_index".into(),
            "asking the rootfs's pip for its default index was ended by SIGKILL 3 times in a row"
                .into(),
        );
        let inst = Installer::new(store, names, sources, fake("", 0));
        let e = inst.check(&set(&["six"])).unwrap_err().to_string();
        assert!(
            e.contains("SIGKILL 3 times")
                && e.contains("set python_index")
                && e.contains("restart"),
            "{e}"
        );
        let ts = PackageSet::parse(Language::TypeScript, &["npm:left-pad".into()], "")
            .unwrap()
            .unwrap();
        let e = inst.check(&ts).unwrap_err().to_string();
        assert!(e.contains("no npm_registry configured"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_first_requests_install_once_then_reuse() {
        let f = fake(
            "noise\nCODEBOX-INSTALL {\"ok\": true, \"installed\": [\"six==1.17.0\"]}\n",
            200,
        );
        let (inst, _dir) = installer(f.clone(), &[]);
        let inst = Arc::new(inst);
        let s = set(&["six"]);
        let (a, b) = tokio::join!(inst.layer(&s), inst.layer(&s));
        assert_eq!(a.unwrap().path, b.unwrap().path);
        assert_eq!(f.runs.load(Ordering::SeqCst), 1);
        let c = inst.layer(&s).await.unwrap();
        assert_eq!(c.meta.installed, ["six==1.17.0"]);
        assert_eq!(f.runs.load(Ordering::SeqCst), 1);
        assert_eq!(inst.counters.installed.load(Ordering::SeqCst), 1);
        assert_eq!(inst.counters.reused.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stale_unpinned_set_keeps_its_layer_when_resolving_it_again_fails() {
        let f = fake(
            "CODEBOX-INSTALL {\"ok\": true, \"installed\": [\"six==1.17.0\"]}",
            0,
        );
        let limits = Limits {
            refresh_unpinned: std::time::Duration::ZERO,
            ..Limits::default()
        };
        let (inst, _dir) = installer_with(f.clone(), &[], limits);
        let first = inst.layer(&set(&["six"])).await.unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        // The index is down now.
        *f.stdout.lock().unwrap() =
            "CODEBOX-INSTALL {\"ok\": false, \"reason\": \"the index could not be asked\"}".into();
        let again = inst.layer(&set(&["six"])).await.unwrap();
        assert_eq!(again.path, first.path);
        assert_eq!(
            f.runs.load(Ordering::SeqCst),
            2,
            "it did try to resolve again"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_requests_of_the_same_content_at_once_both_get_it() {
        for _ in 0..20 {
            let f = fake(
                "CODEBOX-INSTALL {\"ok\": true, \"installed\": [\"six==1.17.0\"]}",
                30,
            );
            let (inst, _dir) = installer(f.clone(), &[]);
            let (loose, pinned) = (set(&["six"]), set(&["six==1.17.0"]));
            let (a, b) = tokio::join!(inst.layer(&loose), inst.layer(&pinned));
            assert_eq!(a.unwrap().path, b.unwrap().path);
            assert_eq!(f.runs.load(Ordering::SeqCst), 2);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failures_name_the_package_and_leave_nothing() {
        let f = fake(
            "CODEBOX-INSTALL {\"ok\": false, \"package\": \"nope\", \"reason\": \"no such package on the index\"}",
            0,
        );
        let (inst, dir) = installer(f, &[]);
        let err = inst.layer(&set(&["nope"])).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "packages: nope: no such package on the index"
        );
        assert!(inst.store().get(&set(&["nope"])).is_none());
        let staging: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".staging"))
            .collect();
        assert!(staging.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn denied_names_and_denied_dependencies_are_refused() {
        let f = fake(
            "CODEBOX-INSTALL {\"ok\": true, \"installed\": [\"good==1\", \"Evil_Dep==2\"]}",
            0,
        );
        let (inst, _dir) = installer(f.clone(), &["evil-*"]);
        let err = inst.layer(&set(&["evil-pkg"])).await.unwrap_err();
        assert!(err.to_string().contains("evil-*"), "{err}");
        assert_eq!(
            f.runs.load(Ordering::SeqCst),
            0,
            "refused before any install"
        );
        let err = inst.layer(&set(&["good"])).await.unwrap_err();
        assert!(err.to_string().contains("dependency"), "{err}");
        assert!(inst.store().get(&set(&["good"])).is_none());
    }

    #[test]
    fn limits_and_silent_installers_are_named() {
        let limits = Limits::default();
        let out = RunOutput {
            timed_out: true,
            ..Default::default()
        };
        assert!(interpret(&out, &limits)
            .unwrap_err()
            .reason
            .contains("install_timeout"));
        let out = RunOutput {
            stderr: "Traceback: boom".into(),
            exit_code: Some(1),
            ..Default::default()
        };
        assert!(interpret(&out, &limits)
            .unwrap_err()
            .reason
            .contains("boom"));
        assert_eq!(
            installed_name("Scikit_Learn==1.4", Language::Python),
            "scikit-learn"
        );
        assert_eq!(installed_name("npm:@s/n@1.2", Language::TypeScript), "@s/n");
        assert_eq!(
            installed_name("npm:lodash@4", Language::TypeScript),
            "lodash"
        );
    }

    #[tokio::test]
    async fn a_registry_without_a_source_is_refused() {
        let (inst, _dir) = installer(fake("", 0), &[]);
        let ts = PackageSet::parse(Language::TypeScript, &["jsr:@std/path".into()], "")
            .unwrap()
            .unwrap();
        let err = inst.layer(&ts).await.unwrap_err();
        assert!(err.to_string().contains("jsr_registry"), "{err}");
    }
}
