//! A pooled sandbox's own `/servers`: a directory that follows the upstream catalog while
//! the sandbox waits in the pool, and stops following when an execution takes it.
//!
//! Without it a catalog change (every upstream coming up after start-up, every
//! `list_changed`) meant new pool templates, and every idle sandbox was retired: the calls
//! of the next seconds ran cold. With it the pool keeps its sandboxes and their `/servers`
//! is brought up to date in place, and a running program still never sees its `/servers`
//! change: the view is frozen when the sandbox is handed out, before the code is sent.
//!
//! A view is a 0755 directory of its own below the wrappers' base (what the sandbox binds
//! read-only at `/servers`), filled with hard links to the files of the current version's
//! tree ([`crate::codegen::wrapper_dir::WrapperDir`], immutable): a few syscalls per file, no copy.
//! Bringing it to a new version stages the new tree beside it, then swaps each top-level
//! entry (a server's directory, `__init__.py`, `client.ts`) with `renameat2(
//! RENAME_EXCHANGE)` (or renames it in when new, or out when gone): a program that looked
//! into a server's directory saw one version of it. All under the view's lock, which
//! [`View::freeze`] takes too. The pool freezes a view when it hands the sandbox out,
//! after bringing it to the catalog of that moment (the background follower may not have
//! got to it yet).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use nix::fcntl::{renameat, renameat2, RenameFlags};

use crate::codegen::wrapper_dir::{WrapperDir, PREFIX};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {doing} {path}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, Error>;

fn io<'a>(doing: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io {
        doing,
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug)]
struct ViewState {
    /// The catalog version the view holds (`None`: nothing yet).
    version: Option<u64>,
    /// Handed out: it no longer follows the catalog.
    frozen: bool,
}

/// One pooled sandbox's `/servers`.
#[derive(Debug)]
pub struct View {
    dir: tempfile::TempDir,
    state: Mutex<ViewState>,
}

impl View {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Stops following the catalog (waits for an update under way to finish).
    pub fn freeze(&self) {
        self.state.lock().expect("view lock").frozen = true;
    }

    /// The catalog version it holds.
    pub fn version(&self) -> Option<u64> {
        self.state.lock().expect("view lock").version
    }
}

/// The views alive, to bring up to date when the catalog changes.
#[derive(Debug)]
pub struct Views {
    base: PathBuf,
    live: Mutex<Vec<Weak<View>>>,
}

impl Views {
    pub fn new(base: PathBuf) -> Views {
        Views {
            base,
            live: Mutex::new(Vec::new()),
        }
    }

    /// A new view holding `tree`.
    pub fn view(&self, tree: &WrapperDir) -> Result<Arc<View>> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-view-", std::process::id()))
            .tempdir_in(&self.base)
            .map_err(io("create a /servers view in", &self.base))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(io("open up", dir.path()))?;
        let view = Arc::new(View {
            dir,
            state: Mutex::new(ViewState {
                version: None,
                frozen: false,
            }),
        });
        self.update(&view, tree)?;
        let mut live = self.live.lock().expect("views lock");
        live.retain(|v| v.strong_count() > 0);
        live.push(Arc::downgrade(&view));
        Ok(view)
    }

    /// Brings every view that is not frozen to `tree`; returns how many it updated. A view
    /// that fails is logged and left as it was (its sandbox still runs, with the tools
    /// it had).
    pub fn follow(&self, tree: &WrapperDir) -> usize {
        let views: Vec<Arc<View>> = {
            let mut live = self.live.lock().expect("views lock");
            live.retain(|v| v.strong_count() > 0);
            live.iter().filter_map(Weak::upgrade).collect()
        };
        let mut updated = 0;
        for view in views {
            match self.update(&view, tree) {
                Ok(true) => updated += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    view = %view.path().display(),
                    version = tree.version,
                    err = crate::error_chain::error_chain(&e),
                    "a pooled sandbox's /servers could not be brought up to date"
                ),
            }
        }
        updated
    }

    /// Puts `tree` into `view` unless it is frozen or holds it already; returns whether
    /// it did. (A sandbox is taken right after a catalog change: its view is brought up to
    /// date here before it is frozen, whichever of this and [`Views::follow`] comes first.)
    pub fn update(&self, view: &View, tree: &WrapperDir) -> Result<bool> {
        {
            let st = view.state.lock().expect("view lock");
            if st.frozen || st.version == Some(tree.version) {
                return Ok(false);
            }
        }
        // Staged outside the view (a sandbox sees the view's own entries only).
        let stage = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-stage-", std::process::id()))
            .tempdir_in(&self.base)
            .map_err(io("stage a /servers view in", &self.base))?;
        link_tree(tree.path(), stage.path())?;
        let mut st = view.state.lock().expect("view lock");
        if st.frozen {
            return Ok(false);
        }
        swap_in(stage.path(), view.path())?;
        st.version = Some(tree.version);
        Ok(true)
        // `stage` now holds the old entries and goes with them.
    }
}

/// Recreates the tree at `from` under `to` (which exists): directories made, files hard
/// linked. Anything but a directory or a regular file is refused (codegen makes none).
fn link_tree(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).map_err(io("read", from))? {
        let entry = entry.map_err(io("read", from))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(io("look at", &src))?;
        if kind.is_dir() {
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(&dst)
                .map_err(io("create", &dst))?;
            link_tree(&src, &dst)?;
        } else if kind.is_file() {
            std::fs::hard_link(&src, &dst).map_err(io("link", &dst))?;
        } else {
            return Err(Error::Io {
                doing: "link (neither a file nor a directory)",
                path: src,
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
    }
    Ok(())
}

/// Makes `view`'s top-level entries those of `stage`: each one there swapped in (or
/// renamed in), each one only in `view` moved out to `stage`; `stage` ends up with what
/// `view` held.
fn swap_in(stage: &Path, view: &Path) -> Result<()> {
    let names = |dir: &Path| -> Result<Vec<std::ffi::OsString>> {
        std::fs::read_dir(dir)
            .map_err(io("read", dir))?
            .map(|e| e.map(|e| e.file_name()).map_err(io("read", dir)))
            .collect()
    };
    let open = |dir: &Path| std::fs::File::open(dir).map_err(io("open", dir));
    let (stage_fd, view_fd) = (open(stage)?, open(view)?);
    let new = names(stage)?;
    let old = names(view)?;
    for name in &new {
        let name = name.as_os_str();
        let swapped = if old.iter().any(|o| o == name) {
            renameat2(
                &stage_fd,
                name,
                &view_fd,
                name,
                RenameFlags::RENAME_EXCHANGE,
            )
        } else {
            renameat(&stage_fd, name, &view_fd, name)
        };
        swapped.map_err(|e| Error::Io {
            doing: "swap in",
            path: view.join(name),
            source: e.into(),
        })?;
    }
    for name in old.iter().filter(|n| !new.contains(n)) {
        let name = name.as_os_str();
        renameat(&view_fd, name, &stage_fd, name).map_err(|e| Error::Io {
            doing: "move out",
            path: view.join(name),
            source: e.into(),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codegen::wrapper_dir::Wrappers;
    use crate::upstream::catalog::{Catalog, CatalogServer, CatalogTool};

    fn tool(server: &str, name: &str) -> CatalogTool {
        CatalogTool {
            name: format!("{server}__{name}"),
            server: server.into(),
            tool: name.into(),
            server_ident: server.into(),
            tool_ident: name.into(),
            title: None,
            description: Some("A tool.".into()),
            input_schema: serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            output_schema: None,
            annotations: None,
        }
    }

    fn catalog(version: u64, tools: Vec<CatalogTool>) -> Catalog {
        Catalog {
            version,
            tools,
            servers: ["fs", "slow"]
                .iter()
                .map(|s| CatalogServer {
                    name: s.to_string(),
                    ident: s.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_view_follows_the_catalog_until_it_is_frozen() {
        let base = tempfile::tempdir().unwrap();
        let wrappers = Wrappers::new(base.path().to_path_buf());
        let views = Views::new(base.path().to_path_buf());
        // At start-up: "slow" is still connecting (a module that calls by name).
        let v1 = wrappers
            .for_catalog(&catalog(1, vec![tool("fs", "read")]))
            .unwrap()
            .unwrap();
        let waiting = views.view(&v1).unwrap();
        let taken = views.view(&v1).unwrap();
        let mode = std::fs::metadata(waiting.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(waiting.path().join("fs/read.ts").is_file());
        assert!(!waiting.path().join("slow/write.ts").exists());
        taken.freeze();
        // "slow" came up with a tool, and "fs" lost one: the waiting view has exactly
        // the new tree, the frozen one the old.
        let v2 = wrappers
            .for_catalog(&catalog(2, vec![tool("fs", "list"), tool("slow", "write")]))
            .unwrap()
            .unwrap();
        assert_eq!(views.follow(&v2), 1);
        assert_eq!((waiting.version(), taken.version()), (Some(2), Some(1)));
        assert!(waiting.path().join("slow/write.ts").is_file());
        assert!(waiting.path().join("fs/list.ts").is_file());
        assert!(!waiting.path().join("fs/read.ts").exists());
        assert!(taken.path().join("fs/read.ts").is_file());
        assert!(!taken.path().join("slow/write.ts").exists());
        // Same tree file by file, and nothing staged is left beside it.
        let files = |root: &Path| {
            let mut out = Vec::new();
            let mut stack = vec![root.to_path_buf()];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        out.push((
                            p.strip_prefix(root).unwrap().to_path_buf(),
                            std::fs::read(&p).unwrap(),
                        ));
                    }
                }
            }
            out.sort();
            out
        };
        assert_eq!(files(waiting.path()), files(v2.path()));
        // The old version's directory goes with its last holder; the view keeps its files.
        drop(v1);
        assert!(taken.path().join("fs/read.ts").is_file());
        let stages = std::fs::read_dir(base.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains("-stage-")
            })
            .count();
        assert_eq!(stages, 0);
        // A view that is gone is forgotten, and its directory removed.
        let path = waiting.path().to_path_buf();
        drop(waiting);
        assert!(!path.exists());
        let v3 = wrappers
            .for_catalog(&catalog(3, vec![tool("fs", "stat")]))
            .unwrap()
            .unwrap();
        assert_eq!(views.follow(&v3), 0, "only the frozen view is left");
    }
}
