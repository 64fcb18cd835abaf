//! [`ClientSkills`]: every client its own skills, plus an operator's shared set.
//!
//! # Layout on the host
//!
//! ```text
//! <root>/by-client/<key>/     one directory per client (0755); <key> is the first 32 hex
//!   own/                      digits of the SHA-256 of the owner (see [`owner_of`]), never
//!                             a path taken from the client
//!     foo/ ...                the client's skills: a [`SkillStore`]
//!   view/                     what the client's sandboxes see at /skills: its own skills
//!     foo/ ... bar/ ...       and the shared ones, copied (own ones win)
//!   view.json                 which version of which skill the view holds
//! <skills_shared>/            the operator's shared set: a [`SkillStore`] this module only
//!   bar/ ...                  reads
//! ```
//!
//! # Rules
//!
//! - A client sees, lists, reads and imports its own skills and the shared ones; never
//!   another client's.
//! - Shared skills are read-only to clients: saving a new skill under a shared name, or
//!   deleting a shared skill, is refused ([`Error::ReadOnly`]). A client's skill saved
//!   before the operator added a shared one of the same name stays the client's and
//!   shadows the shared one for that client (it may still replace or delete it).
//! - Sandboxes bind one directory at `/skills`: a client without skills of its own gets
//!   the shared set itself (or nothing), which is what the warm pool's sandboxes bind, so
//!   such runs are served from the pool. A client with skills of its own gets its view,
//!   brought up to date before each run ([`ClientSkills::bind_dir`]); its runs start
//!   cold sandboxes, since a pooled one was made before anyone knew whose it would be.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{Error, NewSkill, Result, Skill, SkillStore, SkillSummary};

/// The directory below the root holding the clients' directories (not a valid skill
/// name, so it never meets a skill of the layout before per-client skills).
const BY_CLIENT: &str = "by-client";
/// Which version of which skill a view holds.
const VIEW_INDEX: &str = "view.json";

/// Where a listed skill comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Saved by this client.
    Own,
    /// The operator's shared set: read-only.
    Shared,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::Own => "own",
            Origin::Shared => "shared",
        })
    }
}

/// A skill as `list_skills` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ListedSkill {
    #[serde(flatten)]
    pub summary: SkillSummary,
    pub origin: Origin,
}

/// Who owns the skills of the caller `identity` (as `server::client` names callers):
/// a bearer token's client and stdio are themselves; unauthenticated HTTP connections
/// (loopback only) are one anonymous owner, `http`, since a connection's name does not
/// outlive it and nothing tells two of them apart.
pub fn owner_of(identity: &str) -> &str {
    if identity.starts_with("http:") {
        "http"
    } else {
        identity
    }
}

/// One client's stores.
#[derive(Debug)]
struct ClientDir {
    dir: PathBuf,
    own: SkillStore,
    view: SkillStore,
    /// Serialises bringing the view up to date.
    syncing: Mutex<()>,
}

/// The skills of every client and the shared set. `Send + Sync`.
#[derive(Debug)]
pub struct ClientSkills {
    root: PathBuf,
    shared: Option<SkillStore>,
    clients: Mutex<HashMap<String, Arc<ClientDir>>>,
}

impl ClientSkills {
    /// Opens the skills root (created 0755 if missing) and the shared set, when given.
    pub fn open(root: &Path, shared: Option<&Path>) -> Result<ClientSkills> {
        make_dir(root, false)?;
        make_dir(&root.join(BY_CLIENT), true)?;
        if let Some(dir) = shared {
            // The operator's directory: used as it is, never created.
            if !dir.is_dir() {
                return Err(Error::Io {
                    doing: "open the shared skills directory",
                    path: dir.to_path_buf(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
        }
        let shared = shared.map(SkillStore::open).transpose()?;
        // Skills saved before per-client skills sit directly in the root: nobody owns
        // them now. Say so once rather than hand them to an arbitrary client.
        if let Ok(old) = SkillStore::open(root).and_then(|s| s.names()) {
            if !old.is_empty() {
                tracing::warn!(
                    root = %root.display(),
                    count = old.len(),
                    "skills saved before per-client skills are no longer served; move them \
                     into skills_shared or a client's by-client/<key>/own directory"
                );
            }
        }
        Ok(ClientSkills {
            root: root.to_path_buf(),
            shared,
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// The skills root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The shared set's directory, if there is one.
    pub fn shared_root(&self) -> Option<&Path> {
        self.shared.as_ref().map(SkillStore::root)
    }

    /// The directory of the owner of `identity`: `<root>/by-client/<key>`.
    pub fn client_dir(&self, identity: &str) -> PathBuf {
        self.root.join(BY_CLIENT).join(key_of(owner_of(identity)))
    }

    /// The stores of `identity`'s owner, opened (and created) on first use.
    fn client(&self, identity: &str) -> Result<Arc<ClientDir>> {
        let owner = owner_of(identity);
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(owner) {
            return Ok(c.clone());
        }
        let dir = self.client_dir(identity);
        make_dir(&dir, true)?;
        let c = Arc::new(ClientDir {
            own: SkillStore::open(&dir.join("own"))?,
            view: SkillStore::open(&dir.join("view"))?,
            dir,
            syncing: Mutex::new(()),
        });
        clients.insert(owner.to_string(), c.clone());
        Ok(c)
    }

    /// The client's own skills and the shared ones it does not shadow, sorted by name.
    pub fn list(&self, identity: &str, query: Option<&str>) -> Result<Vec<ListedSkill>> {
        let own = self.client(identity)?.own.list(query)?;
        let mut out: BTreeMap<String, ListedSkill> = BTreeMap::new();
        if let Some(shared) = &self.shared {
            for summary in shared.list(query)? {
                let name = summary.name.clone();
                let origin = Origin::Shared;
                out.insert(name, ListedSkill { summary, origin });
            }
        }
        for summary in own {
            let name = summary.name.clone();
            let origin = Origin::Own;
            out.insert(name, ListedSkill { summary, origin });
        }
        Ok(out.into_values().collect())
    }

    /// The store that answers for `name` for this client: its own, else the shared set.
    fn holder(&self, identity: &str, name: &str) -> Result<(Arc<ClientDir>, Origin)> {
        super::name::validate(name)?;
        let c = self.client(identity)?;
        if has(&c.own, name)? {
            return Ok((c, Origin::Own));
        }
        match &self.shared {
            Some(shared) if has(shared, name)? => Ok((c, Origin::Shared)),
            _ => Err(Error::NotFound { name: name.into() }),
        }
    }

    fn store<'a>(&'a self, c: &'a ClientDir, origin: Origin) -> &'a SkillStore {
        match (origin, &self.shared) {
            (Origin::Shared, Some(shared)) => shared,
            _ => &c.own,
        }
    }

    /// One skill in full, and where it comes from.
    pub fn get(&self, identity: &str, name: &str) -> Result<(Skill, Origin)> {
        let (c, origin) = self.holder(identity, name)?;
        Ok((self.store(&c, origin).get(name)?, origin))
    }

    /// The files of one skill (see [`SkillStore::files`]).
    pub fn files(&self, identity: &str, name: &str) -> Result<Vec<String>> {
        let (c, origin) = self.holder(identity, name)?;
        self.store(&c, origin).files(name)
    }

    /// One file of one skill (see [`SkillStore::read_file`]).
    pub fn read_file(&self, identity: &str, name: &str, file: &str) -> Result<String> {
        let (c, origin) = self.holder(identity, name)?;
        self.store(&c, origin).read_file(name, file)
    }

    /// Whether saving `name` would be refused because it is shared (and the client has
    /// no skill of its own by that name). Checked before the (costly) syntax check.
    pub fn check_writable(&self, identity: &str, name: &str, doing: &'static str) -> Result<()> {
        super::name::validate(name)?;
        let c = self.client(identity)?;
        if has(&c.own, name)? {
            return Ok(());
        }
        match &self.shared {
            Some(shared) if has(shared, name)? => Err(Error::ReadOnly {
                name: name.into(),
                doing,
            }),
            _ => Ok(()),
        }
    }

    /// Saves one of the client's own skills (see [`SkillStore::save`]); a shared name is
    /// [`Error::ReadOnly`] unless the client already has its own skill of that name.
    pub fn save(&self, identity: &str, skill: NewSkill) -> Result<Skill> {
        self.check_writable(identity, &skill.name, "replace")?;
        let c = self.client(identity)?;
        let saved = c.own.save(skill)?;
        self.refresh_view(&c);
        Ok(saved)
    }

    /// Deletes one of the client's own skills; a shared one is [`Error::ReadOnly`].
    pub fn delete(&self, identity: &str, name: &str) -> Result<()> {
        let (c, origin) = self.holder(identity, name)?;
        match origin {
            Origin::Own => {
                c.own.delete(name)?;
                self.refresh_view(&c);
                Ok(())
            }
            Origin::Shared => Err(Error::ReadOnly {
                name: name.into(),
                doing: "delete",
            }),
        }
    }

    /// Brings the view up to date after a save or delete, so that the live interpreters
    /// of the client's sessions, which bind it, see the change at once. A failure is
    /// logged; the next run retries.
    fn refresh_view(&self, c: &ClientDir) {
        if let Err(err) = self.sync_view(c) {
            tracing::warn!(%err, dir = %c.dir.display(), "cannot update a client's skills view");
        }
    }

    /// The host directory to bind at `/skills` for a run of `identity`: its view, brought
    /// up to date, when it has skills of its own or `view` is asked for (a session's
    /// sandbox, never pooled, whose live interpreter must see skills saved later); else
    /// the shared set (or nothing), as the warm pool binds. Blocking (it may copy skills).
    pub fn bind_dir(&self, identity: &str, view: bool) -> Result<Option<PathBuf>> {
        if !self.binds_view(identity, view)? {
            return Ok(self.shared_root().map(Path::to_path_buf));
        }
        let c = self.client(identity)?;
        self.sync_view(&c)?;
        Ok(Some(c.view.root().to_path_buf()))
    }

    /// Whether a run of `identity` binds its view ([`bind_dir`] then copies what
    /// changed); when not, it binds [`shared_root`]. Cheap: one directory read.
    ///
    /// [`bind_dir`]: ClientSkills::bind_dir
    /// [`shared_root`]: ClientSkills::shared_root
    pub fn binds_view(&self, identity: &str, view: bool) -> Result<bool> {
        Ok(view || !self.client(identity)?.own.names()?.is_empty())
    }

    /// Makes the client's view hold exactly its own skills and the shared ones it does
    /// not shadow, copying only what changed since the last time.
    fn sync_view(&self, c: &ClientDir) -> Result<()> {
        let _turn = c.syncing.lock().unwrap_or_else(|e| e.into_inner());
        let mut want: BTreeMap<String, (Origin, String)> = BTreeMap::new();
        if let Some(shared) = &self.shared {
            for name in shared.names()? {
                match shared.fingerprint(&name) {
                    Ok(fp) => drop(want.insert(name, (Origin::Shared, format!("shared {fp}")))),
                    Err(err) => tracing::warn!(%err, skill = name, "skipping a shared skill"),
                }
            }
        }
        for name in c.own.names()? {
            let fp = c.own.fingerprint(&name)?;
            want.insert(name, (Origin::Own, format!("own {fp}")));
        }
        let index_path = c.dir.join(VIEW_INDEX);
        let have: BTreeMap<String, String> = std::fs::read(&index_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut now: BTreeMap<String, String> = BTreeMap::new();
        for (name, (origin, fp)) in &want {
            if have.get(name) == Some(fp) && has(&c.view, name)? {
                now.insert(name.clone(), fp.clone());
                continue;
            }
            let copied = self.store(c, *origin).get(name).and_then(|s| {
                c.view.save(NewSkill {
                    name: s.name,
                    description: s.description,
                    language: s.language,
                    code: s.code,
                    usage: Some(s.usage),
                })
            });
            match copied {
                Ok(_) => drop(now.insert(name.clone(), fp.clone())),
                Err(err) => {
                    tracing::warn!(%err, skill = name, %origin, "cannot copy a skill into a client's view");
                }
            }
        }
        for name in c.view.names()? {
            if !now.contains_key(&name) {
                if let Err(err) = c.view.delete(&name) {
                    tracing::warn!(%err, skill = name, "cannot remove a skill from a client's view");
                }
            }
        }
        let text = serde_json::to_vec(&now).unwrap_or_default();
        let temp = c.dir.join(format!("{VIEW_INDEX}.tmp"));
        std::fs::write(&temp, text)
            .and_then(|()| std::fs::rename(&temp, &index_path))
            .map_err(|source| Error::Io {
                doing: "write",
                path: index_path,
                source,
            })
    }
}

/// Whether `store` has an entry named `name` (whole or corrupt).
fn has(store: &SkillStore, name: &str) -> Result<bool> {
    match store.fingerprint(name) {
        Ok(_) => Ok(true),
        Err(Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The directory name of an owner: 32 hex digits of the SHA-256 of its name, so no
/// client-chosen text ever becomes part of a path.
fn key_of(owner: &str) -> String {
    let digest = Sha256::digest(owner.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates `dir` if missing and makes it 0755 (the sandbox user passes through it):
/// always when `ours`, else only when it was created here.
fn make_dir(dir: &Path, ours: bool) -> Result<()> {
    let existed = dir.symlink_metadata().is_ok();
    let io = |doing, source| Error::Io {
        doing,
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::create_dir_all(dir) {
        Ok(()) => {}
        Err(e) => return Err(io("create", e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| io("inspect", e))?;
    if !meta.is_dir() {
        let source = std::io::Error::other("not a directory");
        return Err(io("use", source));
    }
    if (ours || !existed) && meta.permissions().mode() & 0o7777 != 0o755 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io("set the mode of", e))?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) fn key_for_tests(owner: &str) -> String {
    key_of(owner)
}
