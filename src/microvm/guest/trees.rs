//! The trees the host sends before a `Start` (`/servers`: the generated tool wrappers,
//! `/skills`: the client's skills), as a namespace sandbox gets them by bind mounts; or,
//! for a deferred start (a template's program, a pooled clone's), after it: the sandbox
//! then binds empty mounts that those trees fill before the program gets its code
//! ([`LateTrees`]).
//!
//! Each arrives on the control port as a `snapshot::archive` stream in bounded parts
//! ([`Assembler`]: at most [`MAX_TREE_BYTES`] a tree, parts only while the tree is open),
//! is restored into a tmpfs of its own (the archive's restore makes every
//! entry anew and never follows a link), that tmpfs is made read-only, and the sandbox of
//! the next `Start` binds it read-only where the namespace backend binds the host's
//! directory.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use nix::mount::{mount, MsFlags};

use crate::microvm::wire::{Tree, MAX_TREE_BYTES};
use crate::sandbox::SandboxSpec;

/// Where the trees are mounted in the guest.
const TREES_DIR: &str = "/run/codebox-trees";

/// Collects trees' parts; a tree is complete after its `end` part.
#[derive(Debug, Default)]
pub struct Assembler {
    open: HashMap<Tree, Vec<u8>>,
    complete: HashMap<Tree, Vec<u8>>,
}

impl Assembler {
    /// Takes one part (base64). Returns the tree's whole stream with its last part.
    pub fn push(&mut self, tree: Tree, data: &str, end: bool) -> Result<Option<Vec<u8>>> {
        use base64::Engine;
        if self.complete.contains_key(&tree) {
            bail!("{} sent again before the Start", tree.name());
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .with_context(|| format!("a part of {} that is not base64", tree.name()))?;
        let stream = self.open.entry(tree).or_default();
        if stream.len() + bytes.len() > MAX_TREE_BYTES {
            bail!(
                "{} is over {} bytes: not taken",
                tree.name(),
                MAX_TREE_BYTES
            );
        }
        stream.extend_from_slice(&bytes);
        if !end {
            return Ok(None);
        }
        let whole = self.open.remove(&tree).unwrap_or_default();
        self.complete.insert(tree, Vec::new());
        Ok(Some(whole))
    }

    /// Whether a tree is still missing its last part.
    pub fn unfinished(&self) -> Option<Tree> {
        self.open.keys().next().copied()
    }

    /// Forgets everything: the next `Start` gets the trees sent after this one.
    pub fn reset(&mut self) {
        self.open.clear();
        self.complete.clear();
    }
}

/// The trees restored for the next `Start`.
#[derive(Debug, Default)]
pub struct Trees {
    assembler: Assembler,
    mounted: HashMap<Tree, PathBuf>,
}

impl Trees {
    /// Takes one `Tree` part; restores the tree when it is whole.
    pub fn take(&mut self, tree: Tree, data: &str, end: bool) -> Result<()> {
        if let Some(stream) = self.assembler.push(tree, data, end)? {
            let at = mount_tmpfs(tree)?;
            fill(&at, tree, &stream)?;
            make_read_only(&at, tree)?;
            self.mounted.insert(tree, at);
        }
        Ok(())
    }

    /// Binds the restored trees in `spec`'s sandbox (read-only, as on the host); refuses a
    /// tree still open. For a deferred start (`late`), every tree not sent yet is bound
    /// as an empty tmpfs that [`LateTrees`] fills before the program gets its code. The
    /// trees stay mounted until the VM ends.
    pub fn bind(&mut self, spec: &mut SandboxSpec, late: bool) -> Result<LateTrees> {
        if let Some(tree) = self.assembler.unfinished() {
            bail!("{} did not arrive whole before the Start", tree.name());
        }
        let mut empty = HashMap::new();
        if late {
            for tree in [Tree::Servers, Tree::Skills] {
                if let std::collections::hash_map::Entry::Vacant(slot) = self.mounted.entry(tree) {
                    let at = mount_tmpfs(tree)?;
                    slot.insert(at.clone());
                    empty.insert(tree, at);
                }
            }
        }
        spec.servers = self.mounted.get(&Tree::Servers).cloned();
        spec.skills = self.mounted.get(&Tree::Skills).cloned();
        self.assembler.reset();
        self.mounted.clear();
        Ok(LateTrees {
            assembler: Assembler::default(),
            empty,
            sealed: false,
        })
    }
}

/// The trees of a deferred start that come after it: each fills the empty mount its
/// sandbox already binds, once; all are made read-only at the `Resume`, before the
/// program gets its code. (The program cannot write them at any time: its binds are
/// read-only.)
#[derive(Debug, Default)]
pub struct LateTrees {
    assembler: Assembler,
    /// The mounts still to fill, bound empty in the sandbox.
    empty: HashMap<Tree, PathBuf>,
    sealed: bool,
}

impl LateTrees {
    /// Takes one `Tree` part after the start; restores the tree into its mount when it
    /// is whole. A tree that was not bound empty, or a part after the `Resume`, is
    /// refused.
    pub fn take(&mut self, tree: Tree, data: &str, end: bool) -> Result<()> {
        if self.sealed {
            bail!("{} sent after the Resume", tree.name());
        }
        if !self.empty.contains_key(&tree) {
            bail!(
                "{} sent after a Start that did not leave it to come later",
                tree.name()
            );
        }
        if let Some(stream) = self.assembler.push(tree, data, end)? {
            let at = self.empty.remove(&tree).expect("checked above");
            fill(&at, tree, &stream)?;
            make_read_only(&at, tree)?;
        }
        Ok(())
    }

    /// The `Resume`: refuses a tree still open, makes the mounts nobody filled
    /// read-only (they stay empty), and takes no part any more.
    pub fn seal(&mut self) -> Result<()> {
        if let Some(tree) = self.assembler.unfinished() {
            bail!("{} did not arrive whole before the Resume", tree.name());
        }
        for (tree, at) in self.empty.drain() {
            make_read_only(&at, tree)?;
        }
        self.sealed = true;
        Ok(())
    }
}

const TREE_MOUNT_FLAGS: MsFlags = MsFlags::MS_NOSUID
    .union(MsFlags::MS_NODEV)
    .union(MsFlags::MS_NOEXEC);

/// A fresh, writable tmpfs for `tree`. A fresh directory per tree and Start: nothing of
/// an earlier tree is reused.
fn mount_tmpfs(tree: Tree) -> Result<PathBuf> {
    let at = PathBuf::from(format!(
        "{TREES_DIR}/{}-{}",
        tree.name(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&at).with_context(|| format!("creating {}", at.display()))?;
    // tmpfs's own bound (half the guest's RAM): a tree takes a page per file however
    // small, so a size from the stream's length was too small for many small files (a
    // hundred skills); the host bounds the stream, and the tmpfs is read-only once made.
    mount(
        Some("tmpfs"),
        &at,
        Some("tmpfs"),
        TREE_MOUNT_FLAGS,
        Some("mode=0755"),
    )
    .with_context(|| format!("mounting a tmpfs for {}", tree.name()))?;
    Ok(at)
}

/// Restores `stream` into the tmpfs at `at` (the archive's restore makes every entry
/// anew and never follows a link).
fn fill(at: &std::path::Path, tree: Tree, stream: &[u8]) -> Result<()> {
    use std::os::fd::AsFd;
    let dir = std::fs::File::open(at).with_context(|| format!("opening {}", at.display()))?;
    crate::snapshot::archive::restore(&mut &stream[..], dir.as_fd(), (0, 0))
        .with_context(|| format!("restoring {}", tree.name()))?;
    Ok(())
}

/// Makes the tmpfs at `at` read-only: its superblock, so every bind of it too.
fn make_read_only(at: &std::path::Path, tree: Tree) -> Result<()> {
    mount(
        None::<&str>,
        at,
        None::<&str>,
        TREE_MOUNT_FLAGS | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| format!("making {} read-only", tree.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;

    fn b64(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    #[test]
    fn a_tree_is_whole_after_its_last_part() {
        let mut a = Assembler::default();
        assert_eq!(a.push(Tree::Servers, &b64(b"ab"), false).unwrap(), None);
        assert_eq!(a.unfinished(), Some(Tree::Servers));
        assert_eq!(
            a.push(Tree::Servers, &b64(b"cd"), true).unwrap(),
            Some(b"abcd".to_vec())
        );
        assert_eq!(a.unfinished(), None);
        // Once whole, the same tree again before the Start is refused.
        let again = a.push(Tree::Servers, &b64(b"x"), true).unwrap_err();
        assert!(again.to_string().contains("again"), "{again}");
        a.reset();
        assert!(a.push(Tree::Servers, &b64(b"x"), true).is_ok());
    }

    #[test]
    fn oversized_and_garbled_parts_are_refused() {
        let mut a = Assembler::default();
        let big = vec![0u8; 1024 * 1024];
        for _ in 0..MAX_TREE_BYTES / big.len() {
            a.push(Tree::Skills, &b64(&big), false).unwrap();
        }
        let over = a.push(Tree::Skills, &b64(b"x"), false).unwrap_err();
        assert!(over.to_string().contains("over"), "{over}");
        let bad = a.push(Tree::Servers, "%%%", true).unwrap_err();
        assert!(bad.to_string().contains("base64"), "{bad}");
    }

    #[test]
    fn late_trees_fill_only_their_empty_mounts_and_only_before_the_resume() {
        let mut late = LateTrees::default();
        // No empty mount for it: a tree the Start already bound, or a run not deferred.
        let unasked = late.take(Tree::Servers, &b64(b"x"), true).unwrap_err();
        assert!(
            unasked.to_string().contains("did not leave it"),
            "{unasked}"
        );
        late.seal().unwrap();
        let after = late.take(Tree::Skills, &b64(b"x"), true).unwrap_err();
        assert!(after.to_string().contains("after the Resume"), "{after}");
        // A second Resume seals nothing new.
        late.seal().unwrap();
    }
}
