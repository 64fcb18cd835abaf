//! Installed package sets ("layers"), kept on disk and shared read-only.
//!
//! Layout under the cache directory:
//! - `<language>/<digest>/`: one layer, named by its content (`seal.rs`: the digest of
//!   every path, kind, executable bit and byte it holds), read-only once committed
//!   (files `0444`/`0555`, directories `0555`, owned by codebox), bound read-only at
//!   `/packages` in the executions that asked for a set it resolved;
//! - `<language>/<digest>.json`: what it holds (the first request, what was installed,
//!   its size); its modification time is when the layer was last used;
//! - `<language>/requests/<key>.json`: which layer a request resolved to and when (the
//!   key: the normalised request and the interpreter it was installed for). A request
//!   that is not fully pinned resolves again after `refresh_unpinned`; when that gives
//!   the same content, the layer is the same one;
//! - `.staging-<random>/`: an install in progress, written by the installer sandbox
//!   only; never bound anywhere else, removed when the install fails or the process
//!   restarts.
//!
//! A layer is committed by one `rename` after it was checked and made read-only, so
//! nothing half-installed is ever visible. Past `cache_bytes` the least recently used
//! layers that no execution or session holds are removed.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use sha2::{Digest, Sha256};

use super::config::Limits;
use super::seal::seal;
use super::spec::PackageSet;
use crate::runtime::Language;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {doing} {}", path.display())]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the installed packages take {bytes} bytes, over the limit of {limit} (packages.max_layer_size)")]
    TooLarge { bytes: u64, limit: u64 },
    #[error("the installed packages hold {what} at {path}, which a layer may not")]
    Unexpected { what: &'static str, path: String },
    #[error("the installed packages hold more than {limit} files and directories")]
    TooManyEntries { limit: usize },
}

pub(super) type Result<T> = std::result::Result<T, Error>;

/// Maps an i/o error to [`Error::Io`] naming what was done to which path.
pub(super) fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        doing,
        path,
        source,
    }
}

/// What a layer holds, kept beside it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerMeta {
    /// The layer's content address.
    pub key: String,
    pub language: Language,
    /// The request that first installed it, normalised.
    pub requested: Vec<String>,
    /// What the installer installed (`name==version`, `npm:name@version`).
    pub installed: Vec<String>,
    pub bytes: u64,
    /// How long the install took.
    pub install_ms: u64,
}

/// Which layer a request resolved to, and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Resolution {
    layer: String,
    /// Seconds since the epoch.
    resolved_at: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A committed layer, held while an execution or a session uses it (it is never evicted
/// then).
#[derive(Debug)]
pub struct Layer {
    pub path: PathBuf,
    pub meta: LayerMeta,
    pins: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for Layer {
    fn drop(&mut self) {
        let mut pins = self.pins.lock().expect("pins lock");
        if let Some(n) = pins.get_mut(&self.meta.key) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.meta.key);
            }
        }
    }
}

/// An install in progress: its directory is removed unless it is committed.
#[derive(Debug)]
pub struct Staging {
    pub dir: PathBuf,
    committed: bool,
}

impl Staging {
    /// Where the installer writes the layer.
    pub fn layer_dir(&self) -> PathBuf {
        self.dir.join("layer")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            if let Err(e) = remove_tree(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove a failed install");
            }
        }
    }
}

/// The layers of one cache directory.
#[derive(Debug)]
pub struct LayerStore {
    root: PathBuf,
    limits: Limits,
    /// Host uid and gid the installer sandbox writes as (its staging directory is theirs).
    sandbox_ids: (u32, u32),
    pins: Arc<Mutex<HashMap<String, usize>>>,
    /// What each language's layers were installed for (e.g. the interpreter's digest):
    /// part of every request's key, so a rebuilt rootfs never binds layers built for
    /// another interpreter.
    runtimes: HashMap<Language, String>,
    /// One install per key at a time; later callers wait and then find the layer.
    installing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl LayerStore {
    /// Opens (creating) the cache directory; installs a crashed process left are removed.
    pub fn open(root: &Path, limits: Limits, sandbox_ids: (u32, u32)) -> Result<LayerStore> {
        for dir in [
            root.to_path_buf(),
            root.join("python"),
            root.join("typescript"),
            root.join("python/requests"),
            root.join("typescript/requests"),
        ] {
            std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
            // The sandbox user passes through to the layer it binds.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                .map_err(io("set the mode of", &dir))?;
        }
        for entry in std::fs::read_dir(root).map_err(io("list", root))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(".staging-") {
                let _ = remove_tree(&entry.path());
            }
        }
        Ok(LayerStore {
            root: root.to_path_buf(),
            limits,
            sandbox_ids,
            pins: Arc::default(),
            runtimes: HashMap::new(),
            installing: Mutex::default(),
        })
    }

    /// Names what `language`'s layers are installed for (see [`LayerStore::runtimes`]).
    pub fn with_runtime(mut self, language: Language, identity: impl Into<String>) -> Self {
        self.runtimes.insert(language, identity.into());
        self
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn layer_path(&self, language: Language, key: &str) -> PathBuf {
        self.root.join(language.name()).join(key)
    }

    fn meta_path(&self, language: Language, key: &str) -> PathBuf {
        self.root.join(language.name()).join(format!("{key}.json"))
    }

    /// The request's key: the normalised set and the runtime it is installed for.
    fn request_key(&self, set: &PackageSet) -> String {
        let mut h = Sha256::new();
        h.update(
            self.runtimes
                .get(&set.language)
                .map_or("", String::as_str)
                .as_bytes(),
        );
        h.update([0u8]);
        h.update(set.key().as_bytes());
        crate::rootfs::manifest::hex(&h.finalize())
    }

    fn resolution_path(&self, set: &PackageSet) -> PathBuf {
        self.root
            .join(set.language.name())
            .join("requests")
            .join(format!("{}.json", self.request_key(set)))
    }

    /// The committed layer `set` resolved to, pinned and marked used; `None` if there is
    /// none, or if the set is not fully pinned and resolved longer ago than
    /// `refresh_unpinned` (it is then installed again, to the same layer if nothing
    /// changed).
    pub fn get(&self, set: &PackageSet) -> Option<Arc<Layer>> {
        self.resolved(set, false)
    }

    /// The layer `set` last resolved to, however long ago (when resolving it again
    /// failed: an index that is down must not take away what worked).
    pub fn get_stale(&self, set: &PackageSet) -> Option<Arc<Layer>> {
        self.resolved(set, true)
    }

    fn resolved(&self, set: &PackageSet, stale_ok: bool) -> Option<Arc<Layer>> {
        let text = std::fs::read_to_string(self.resolution_path(set)).ok()?;
        let resolution: Resolution = serde_json::from_str(&text).ok()?;
        let age = now_secs().saturating_sub(resolution.resolved_at);
        if !stale_ok && !set.is_pinned() && age > self.limits.refresh_unpinned.as_secs() {
            return None;
        }
        self.open_layer(set.language, &resolution.layer)
    }

    /// The layer named `key`, pinned and marked used.
    fn open_layer(&self, language: Language, key: &str) -> Option<Arc<Layer>> {
        let meta_path = self.meta_path(language, key);
        let text = std::fs::read_to_string(&meta_path).ok()?;
        let meta: LayerMeta = serde_json::from_str(&text).ok()?;
        let path = self.layer_path(language, key);
        if meta.key != key || !path.is_dir() {
            return None;
        }
        // Used now: the eviction order.
        let _ = std::fs::File::options()
            .append(true)
            .open(&meta_path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        *self
            .pins
            .lock()
            .expect("pins lock")
            .entry(key.to_string())
            .or_insert(0) += 1;
        Some(Arc::new(Layer {
            path,
            meta,
            pins: self.pins.clone(),
        }))
    }

    /// The lock that makes concurrent first requests of one set install it once.
    pub fn install_lock(&self, set: &PackageSet) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.installing.lock().expect("installing lock");
        // Forget locks nobody holds or waits for.
        map.retain(|_, l| Arc::strong_count(l) > 1);
        map.entry(self.request_key(set)).or_default().clone()
    }

    /// A new staging directory, writable by the installer sandbox's user.
    pub fn staging(&self) -> Result<Staging> {
        let mut raw = [0u8; 8];
        getrandom::fill(&mut raw).map_err(|e| Error::Io {
            doing: "get randomness for",
            path: self.root.clone(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let name: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let dir = self.root.join(format!(".staging-{name}"));
        std::fs::create_dir(&dir).map_err(io("create", &dir))?;
        let staging = Staging {
            dir,
            committed: false,
        };
        std::fs::set_permissions(&staging.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io("set the mode of", &staging.dir))?;
        let (uid, gid) = self.sandbox_ids;
        if nix::unistd::geteuid().as_raw() != uid {
            std::os::unix::fs::chown(&staging.dir, Some(uid), Some(gid))
                .map_err(io("hand to the installer", &staging.dir))?;
        }
        Ok(staging)
    }

    /// Checks the staged layer (regular files, directories and links within it only;
    /// at most `max_layer_bytes`), makes it codebox's and read-only, and moves it into
    /// place under its content address — or, when a layer with the same content is
    /// there already, drops it and uses that one; records what `set` resolved to; then
    /// evicts what no longer fits. The second value says whether the layer was new.
    pub fn commit(
        &self,
        mut staging: Staging,
        set: &PackageSet,
        installed: Vec<String>,
        install_ms: u64,
    ) -> Result<(Arc<Layer>, bool)> {
        let layer = staging.layer_dir();
        // An install of nothing leaves no directory; anything there is `seal`'s to check
        // (never followed: it may be a link).
        if std::fs::symlink_metadata(&layer).is_err() {
            std::fs::create_dir(&layer).map_err(io("create", &layer))?;
        }
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let sealed = seal(&layer, me, self.limits.max_layer_bytes)?;
        let key = sealed.digest;
        let dest = self.layer_path(set.language, &key);
        let meta_path = self.meta_path(set.language, &key);
        // A directory without its metadata is a layer whose eviction was cut short (the
        // metadata goes first): never trusted, replaced.
        if dest.exists() && !meta_path.exists() {
            tracing::warn!(layer = %dest.display(), "replacing a layer directory without metadata");
            remove_tree(&dest).map_err(io("remove", &dest))?;
        }
        // The metadata before the directory: a directory without it is then always an
        // eviction cut short (above), never a commit in progress.
        if !meta_path.exists() {
            let meta = LayerMeta {
                key: key.clone(),
                language: set.language,
                requested: set.texts(),
                installed,
                bytes: sealed.bytes,
                install_ms,
            };
            write_json(&meta_path, &meta)?;
        }
        let fresh = match std::fs::rename(&layer, &dest) {
            Ok(()) => {
                super::seal::finish_root(&dest)?;
                staging.committed = true;
                let _ = remove_tree(&staging.dir);
                true
            }
            // The same content is there already (another request that resolved alike,
            // or another process sharing the cache): keep that one.
            Err(e)
                if dest.is_dir()
                    && matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) =>
            {
                drop(staging);
                false
            }
            Err(e) => return Err(io("move into place", &dest)(e)),
        };
        let resolution = Resolution {
            layer: key.clone(),
            resolved_at: now_secs(),
        };
        write_json(&self.resolution_path(set), &resolution)?;
        let got = self
            .open_layer(set.language, &key)
            .ok_or_else(|| Error::Io {
                doing: "find the layer just committed at",
                path: dest.clone(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            })?;
        self.evict();
        Ok((got, fresh))
    }

    /// Every committed layer: (language, key, bytes, last used).
    fn layers(&self) -> Vec<(Language, String, u64, SystemTime)> {
        let mut out = Vec::new();
        for language in Language::ALL {
            let dir = self.root.join(language.name());
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(key) = name.strip_suffix(".json") else {
                    continue;
                };
                let Ok(text) = std::fs::read_to_string(e.path()) else {
                    continue;
                };
                let Ok(meta) = serde_json::from_str::<LayerMeta>(&text) else {
                    continue;
                };
                let used = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                out.push((language, key.to_string(), meta.bytes, used));
            }
        }
        out
    }

    /// Bytes of all committed layers.
    pub fn total_bytes(&self) -> u64 {
        self.layers().iter().map(|l| l.2).sum()
    }

    /// Removes the least recently used layers nobody holds until the rest fit.
    pub fn evict(&self) {
        let mut layers = self.layers();
        let mut total: u64 = layers.iter().map(|l| l.2).sum();
        if total <= self.limits.cache_bytes {
            return;
        }
        layers.sort_by_key(|l| l.3);
        for (language, key, bytes, _) in layers {
            if total <= self.limits.cache_bytes {
                break;
            }
            if self.pins.lock().expect("pins lock").contains_key(&key) {
                continue;
            }
            // Metadata first: a half-removed layer is then never found.
            let _ = std::fs::remove_file(self.meta_path(language, &key));
            match remove_tree(&self.layer_path(language, &key)) {
                Ok(()) => {
                    tracing::info!(%key, bytes, "package layer evicted (least recently used)");
                    total = total.saturating_sub(bytes);
                }
                Err(e) => tracing::warn!(%key, error = %e, "cannot remove a package layer"),
            }
        }
        self.forget_resolutions_of_removed_layers();
    }

    /// Removes the records of requests whose layer is gone.
    fn forget_resolutions_of_removed_layers(&self) {
        for language in Language::ALL {
            let dir = self.root.join(language.name()).join("requests");
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let gone = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|t| serde_json::from_str::<Resolution>(&t).ok())
                    .is_none_or(|r| !self.meta_path(language, &r.layer).exists());
                if gone {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// Writes `value` as JSON to `path` by a rename: readers see the old or the new file.
/// The temporary name is this writer's own (two commits of one layer may race).
fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("json.{}-{n}.tmp", std::process::id()));
    let text = serde_json::to_vec_pretty(value).expect("metadata serialises");
    std::fs::write(&tmp, text).map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("write", path))
}

/// Removes a tree whose directories may be read-only (a committed layer's are).
pub fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(m) if !m.is_dir() => return std::fs::remove_file(path),
        Ok(_) => {}
    }
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    std::fs::remove_dir_all(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> PackageSet {
        let asked: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        PackageSet::parse(Language::Python, &asked, "")
            .unwrap()
            .unwrap()
    }

    fn me() -> (u32, u32) {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    }

    fn stage(store: &LayerStore, files: &[(&str, usize)]) -> Staging {
        let s = store.staging().unwrap();
        for (name, size) in files {
            let p = s.layer_dir().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, vec![b'x'; *size]).unwrap();
        }
        s
    }

    #[test]
    fn a_committed_layer_is_read_only_found_again_and_staging_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path(), Limits::default(), me()).unwrap();
        let s = set(&["six"]);
        assert!(store.get(&s).is_none());
        let staged = stage(&store, &[("site/six.py", 10), ("site/pkg/__init__.py", 5)]);
        let staging_dir = staged.dir.clone();
        let (layer, fresh) = store
            .commit(staged, &s, vec!["six==1.16.0".into()], 12)
            .unwrap();
        assert!(fresh);
        assert!(!staging_dir.exists());
        assert_eq!(layer.meta.bytes, 15);
        let file = layer.path.join("site/six.py");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o444
        );
        assert_eq!(
            std::fs::metadata(layer.path.join("site"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o555
        );
        assert_eq!(
            std::fs::metadata(&layer.path).unwrap().permissions().mode() & 0o777,
            0o555,
            "the root too, once in place"
        );
        let again = store.get(&s).unwrap();
        assert_eq!(again.meta.installed, ["six==1.16.0"]);
        assert_eq!(store.total_bytes(), 15);
    }

    #[test]
    fn an_oversized_or_odd_layer_is_refused_and_nothing_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_layer_bytes: 1 << 20,
            ..Limits::default()
        };
        let store = LayerStore::open(dir.path(), limits, me()).unwrap();
        let staged = stage(&store, &[("site/big.bin", (1 << 20) + 1)]);
        let err = store.commit(staged, &set(&["big"]), vec![], 1).unwrap_err();
        assert!(matches!(err, Error::TooLarge { .. }), "{err}");
        let staged = stage(&store, &[("site/a.py", 1)]);
        std::os::unix::fs::symlink("/etc/passwd", staged.layer_dir().join("site/evil")).unwrap();
        let err = store
            .commit(staged, &set(&["evil"]), vec![], 1)
            .unwrap_err();
        assert!(err.to_string().contains("outside the layer"), "{err}");
        let staged = stage(&store, &[("site/a.py", 1)]);
        std::os::unix::fs::symlink("../../../x", staged.layer_dir().join("site/up")).unwrap();
        assert!(store.commit(staged, &set(&["up"]), vec![], 1).is_err());
        let staged = stage(&store, &[("site/a.py", 1)]);
        std::os::unix::fs::symlink("a.py", staged.layer_dir().join("site/ok")).unwrap();
        store.commit(staged, &set(&["ok"]), vec![], 1).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".staging"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn the_least_recently_used_unheld_layers_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_layer_bytes: 1 << 20,
            cache_bytes: 1 << 20,
            ..Limits::default()
        };
        let store = LayerStore::open(dir.path(), limits, me()).unwrap();
        let half = 1 << 19;
        let (a, _) = store
            .commit(stage(&store, &[("a", half)]), &set(&["a"]), vec![], 1)
            .unwrap();
        drop(a);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (held, _) = store
            .commit(stage(&store, &[("b", half)]), &set(&["b"]), vec![], 1)
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // A third one does not fit with both: a (least recently used, unheld) goes.
        let (c, _) = store
            .commit(stage(&store, &[("c", half)]), &set(&["c"]), vec![], 1)
            .unwrap();
        assert!(store.get(&set(&["a"])).is_none());
        assert!(store.get(&set(&["b"])).is_some());
        drop(c);
        // b is held: d evicts c instead, though b was used earlier.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let _d = store
            .commit(stage(&store, &[("d", half)]), &set(&["d"]), vec![], 1)
            .unwrap();
        assert!(store.get(&set(&["b"])).is_some());
        assert!(store.get(&set(&["c"])).is_none());
        drop(held);
        assert!(store.total_bytes() <= 1 << 20);
    }

    #[test]
    fn leftover_staging_is_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let left = dir.path().join(".staging-dead");
        std::fs::create_dir_all(left.join("layer/x")).unwrap();
        std::fs::set_permissions(left.join("layer"), std::fs::Permissions::from_mode(0o555))
            .unwrap();
        LayerStore::open(dir.path(), Limits::default(), me()).unwrap();
        assert!(!left.exists());
    }

    #[test]
    fn requests_that_resolve_to_the_same_content_share_one_layer() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path(), Limits::default(), me()).unwrap();
        let files = [("site/six.py", 10)];
        let (first, fresh) = store
            .commit(stage(&store, &files), &set(&["six"]), vec![], 1)
            .unwrap();
        assert!(fresh);
        let (second, fresh) = store
            .commit(stage(&store, &files), &set(&["six==1.17.0"]), vec![], 1)
            .unwrap();
        assert!(!fresh, "the same content is the same layer");
        assert_eq!(first.path, second.path);
        assert_eq!(store.get(&set(&["six==1.17.0"])).unwrap().path, first.path);
        // A different content under a request another one already named does not
        // replace that one's layer: it is a layer of its own.
        let (other, fresh) = store
            .commit(
                stage(&store, &[("site/six.py", 11)]),
                &set(&["six==1.16.0"]),
                vec![],
                1,
            )
            .unwrap();
        assert!(fresh);
        assert_ne!(other.path, first.path);
        assert_eq!(store.get(&set(&["six"])).unwrap().path, first.path);
        assert_eq!(store.total_bytes(), 21);
    }

    #[test]
    fn an_unpinned_request_resolves_again_after_refresh_unpinned_a_pinned_one_never() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            refresh_unpinned: std::time::Duration::ZERO,
            ..Limits::default()
        };
        let store = LayerStore::open(dir.path(), limits, me()).unwrap();
        for asked in [&["six"][..], &["six==1.17.0"]] {
            store
                .commit(
                    stage(&store, &[("site/six.py", 10)]),
                    &set(asked),
                    vec![],
                    1,
                )
                .unwrap();
        }
        // Resolved "now": still fresh within the same second for both.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert!(store.get(&set(&["six"])).is_none(), "stale: resolve again");
        assert!(store.get(&set(&["six==1.17.0"])).is_some(), "pinned: kept");
    }

    #[test]
    fn another_runtime_does_not_see_the_layers_of_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path(), Limits::default(), me())
            .unwrap()
            .with_runtime(Language::Python, "cpython-a");
        store
            .commit(
                stage(&store, &[("site/six.py", 10)]),
                &set(&["six==1.17.0"]),
                vec![],
                1,
            )
            .unwrap();
        let rebuilt = LayerStore::open(dir.path(), Limits::default(), me())
            .unwrap()
            .with_runtime(Language::Python, "cpython-b");
        assert!(rebuilt.get(&set(&["six==1.17.0"])).is_none());
        assert!(store.get(&set(&["six==1.17.0"])).is_some());
    }

    #[test]
    fn evicting_a_layer_forgets_the_requests_that_resolved_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            max_layer_bytes: 1 << 20,
            cache_bytes: 1 << 20,
            ..Limits::default()
        };
        let store = LayerStore::open(dir.path(), limits, me()).unwrap();
        let big = 3 << 18;
        drop(
            store
                .commit(stage(&store, &[("a", big)]), &set(&["a"]), vec![], 1)
                .unwrap(),
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(
            store
                .commit(stage(&store, &[("b", big)]), &set(&["b"]), vec![], 1)
                .unwrap(),
        );
        let requests = dir.path().join("python/requests");
        assert_eq!(std::fs::read_dir(&requests).unwrap().count(), 1);
        assert!(store.get(&set(&["a"])).is_none());
        assert!(store.get(&set(&["b"])).is_some());
    }

    #[test]
    fn a_layer_directory_without_metadata_is_replaced_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path(), Limits::default(), me()).unwrap();
        let files = [("site/six.py", 10), ("site/pkg/__init__.py", 5)];
        let (first, _) = store
            .commit(stage(&store, &files), &set(&["six"]), vec![], 1)
            .unwrap();
        let path = first.path.clone();
        drop(first);
        // An eviction cut short: the metadata went first, then part of the tree.
        std::fs::remove_file(path.with_extension("json")).unwrap();
        std::fs::set_permissions(
            path.join("site/pkg"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::remove_file(path.join("site/pkg/__init__.py")).unwrap();
        let (again, fresh) = store
            .commit(stage(&store, &files), &set(&["six==1.17.0"]), vec![], 1)
            .unwrap();
        assert!(fresh);
        assert_eq!(again.path, path);
        assert!(again.path.join("site/pkg/__init__.py").exists());
    }

    #[test]
    fn a_staged_layer_that_is_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path(), Limits::default(), me()).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        let staged = store.staging().unwrap();
        std::os::unix::fs::symlink("../outside", staged.layer_dir()).unwrap();
        let err = store.commit(staged, &set(&["six"]), vec![], 1).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
        assert!(store.get(&set(&["six"])).is_none());
        let mode = std::fs::metadata(outside.join("secret"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o200, 0o200, "still writable: never sealed");
    }
}
