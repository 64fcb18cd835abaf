//! The generated tool wrappers a sandbox sees at `/servers`, one directory per catalog
//! version.
//!
//! The supervisor generates the wrappers (`codegen`) from the live catalog into a private
//! temporary directory, world-readable (the sandbox user may be an unprivileged host id)
//! and never writable by a sandbox (it is bound read-only). A new catalog version gets a
//! new directory, so a running sandbox never sees its `/servers` change under it; a
//! directory is removed when the last execution holding it ends. Directories left by a
//! supervisor that died are removed at start-up.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::codegen;
use crate::upstream::catalog::Catalog;

/// Name prefix of the directories: `codebox-servers-<pid>-<random>`.
pub(crate) const PREFIX: &str = "codebox-servers-";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create a directory for the tool wrappers in {dir}")]
    TempDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot generate the tool wrappers")]
    Generate(#[from] codegen::Error),
}

/// One generated tree; removed when dropped.
#[derive(Debug)]
pub struct WrapperDir {
    pub version: u64,
    dir: tempfile::TempDir,
}

impl WrapperDir {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The current wrappers, regenerated when the catalog version moves, and the pooled
/// sandboxes' views of them ([`crate::codegen::wrapper_views`]).
#[derive(Debug)]
pub struct Wrappers {
    base: PathBuf,
    current: Mutex<Option<Arc<WrapperDir>>>,
    views: crate::codegen::wrapper_views::Views,
}

impl Wrappers {
    /// Wrappers under `base` (the system temporary directory in production); removes
    /// what dead supervisors left there.
    pub fn new(base: PathBuf) -> Wrappers {
        crate::tempdirs::remove_of_dead_processes(&base, PREFIX);
        Wrappers {
            views: crate::codegen::wrapper_views::Views::new(base.clone()),
            base,
            current: Mutex::new(None),
        }
    }

    /// The pooled sandboxes' `/servers` views.
    pub fn views(&self) -> &crate::codegen::wrapper_views::Views {
        &self.views
    }

    /// The wrappers for `catalog`, generated if its version is new; `None` when no server
    /// is configured (nothing to mount).
    pub fn for_catalog(&self, catalog: &Catalog) -> Result<Option<Arc<WrapperDir>>, Error> {
        // No server configured: nothing to mount. Servers whose tools are not known yet
        // (connecting, or failed) still get modules that call by name.
        if catalog.tools.is_empty() && catalog.servers.is_empty() {
            return Ok(None);
        }
        let mut current = self.current.lock().expect("wrappers lock");
        if let Some(w) = current.as_ref().filter(|w| w.version == catalog.version) {
            return Ok(Some(w.clone()));
        }
        let started = std::time::Instant::now();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir_in(&self.base)
            .map_err(|source| Error::TempDir {
                dir: self.base.clone(),
                source,
            })?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).map_err(
            |source| Error::TempDir {
                dir: dir.path().to_path_buf(),
                source,
            },
        )?;
        codegen::generate(catalog, dir.path())?;
        tracing::info!(
            version = catalog.version,
            tools = catalog.tools.len(),
            dir = %dir.path().display(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "generated the tool wrappers"
        );
        let w = Arc::new(WrapperDir {
            version: catalog.version,
            dir,
        });
        *current = Some(w.clone());
        Ok(Some(w))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::catalog::CatalogTool;

    fn catalog(version: u64) -> Catalog {
        Catalog {
            version,
            tools: vec![CatalogTool {
                name: "time__get_current_time".into(),
                server: "time".into(),
                tool: "get_current_time".into(),
                server_ident: "time".into(),
                tool_ident: "get_current_time".into(),
                title: None,
                description: Some("The time.".into()),
                input_schema: serde_json::json!({"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}),
                output_schema: None,
                annotations: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn one_directory_per_version_removed_when_unused() {
        let base = tempfile::tempdir().unwrap();
        let w = Wrappers::new(base.path().to_path_buf());
        assert!(w.for_catalog(&Catalog::default()).unwrap().is_none());
        let v1 = w.for_catalog(&catalog(1)).unwrap().unwrap();
        let again = w.for_catalog(&catalog(1)).unwrap().unwrap();
        assert_eq!(v1.path(), again.path());
        let mode = std::fs::metadata(v1.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(v1.path().join("time").is_dir());
        let old = v1.path().to_path_buf();
        let v2 = w.for_catalog(&catalog(2)).unwrap().unwrap();
        assert_ne!(v2.path(), old);
        assert!(old.exists(), "still held by running executions");
        drop((v1, again));
        assert!(!old.exists(), "removed with its last holder");
    }

    /// Right after start the configured servers are still connecting and no tool is
    /// known: code must still find a module per server (one that calls by name and
    /// waits for the server), not `ModuleNotFoundError`.
    #[test]
    fn servers_without_known_tools_still_get_a_tree() {
        let base = tempfile::tempdir().unwrap();
        let w = Wrappers::new(base.path().to_path_buf());
        let connecting = Catalog {
            version: 0,
            tools: Vec::new(),
            servers: vec![crate::upstream::catalog::CatalogServer {
                name: "slow".into(),
                ident: "slow".into(),
            }],
        };
        let tree = w.for_catalog(&connecting).unwrap().expect("a tree");
        assert!(tree.path().join("slow/__init__.py").is_file());
        assert!(tree.path().join("slow/index.ts").is_file());
    }

    #[test]
    fn stale_directories_of_dead_supervisors_are_removed() {
        let base = tempfile::tempdir().unwrap();
        // pid_max is at most 2^22, so this pid cannot be alive.
        let dead = base.path().join(format!("{PREFIX}99999999-abc"));
        let mine = base
            .path()
            .join(format!("{PREFIX}{}-abc", std::process::id()));
        let other = base.path().join("unrelated");
        for d in [&dead, &mine, &other] {
            std::fs::create_dir(d).unwrap();
        }
        let _w = Wrappers::new(base.path().to_path_buf());
        assert!(!dead.exists());
        assert!(mine.exists() && other.exists());
    }
}
