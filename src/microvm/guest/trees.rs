//! The trees the host sends before a `Start` (`/servers`: the generated tool wrappers,
//! `/skills`: the client's skills), as a namespace sandbox gets them by bind mounts.
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
            let at = restore(tree, &stream)?;
            self.mounted.insert(tree, at);
        }
        Ok(())
    }

    /// Binds the restored trees in `spec`'s sandbox (read-only, as on the host); refuses a
    /// tree still open. The trees stay mounted until the VM ends.
    pub fn bind(&mut self, spec: &mut SandboxSpec) -> Result<()> {
        if let Some(tree) = self.assembler.unfinished() {
            bail!("{} did not arrive whole before the Start", tree.name());
        }
        spec.servers = self.mounted.get(&Tree::Servers).cloned();
        spec.skills = self.mounted.get(&Tree::Skills).cloned();
        self.assembler.reset();
        self.mounted.clear();
        Ok(())
    }
}

/// Restores `stream` into a fresh tmpfs for `tree`, then makes that tmpfs read-only.
fn restore(tree: Tree, stream: &[u8]) -> Result<PathBuf> {
    use std::os::fd::AsFd;
    // A fresh directory per tree and Start: nothing of an earlier tree is reused.
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
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), &at, Some("tmpfs"), flags, Some("mode=0755"))
        .with_context(|| format!("mounting a tmpfs for {}", tree.name()))?;
    let dir = std::fs::File::open(&at).with_context(|| format!("opening {}", at.display()))?;
    crate::snapshot::archive::restore(&mut &stream[..], dir.as_fd(), (0, 0))
        .with_context(|| format!("restoring {}", tree.name()))?;
    mount(
        None::<&str>,
        &at,
        None::<&str>,
        flags | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .with_context(|| format!("making {} read-only", tree.name()))?;
    Ok(at)
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
}
