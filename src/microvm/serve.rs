//! The microVM backend in `codebox serve`: a one-shot execution in a VM of its own.
//!
//! `serve` is multi-threaded, so it cannot clone a jail itself: the spawner (forked before
//! any thread) starts QEMU's jail on a `SpawnVmm` request and hands back its descriptors
//! and the VM's four port sockets (`spawner::wire::VmmSpec`), keeping the jail's watch as
//! it keeps a language sandbox's. The VM is then driven here, as a task on the server's
//! runtime (`vm::boot`, `Vm::start`, the driver), and its fd 3 is served by the same tool
//! proxy a namespace sandbox's is (`run::capture`).
//!
//! `/servers` (the generated tool wrappers) and `/skills` go to the guest as trees: each
//! directory as one `snapshot::archive` stream on the control port, restored in the guest
//! and bound read-only in the program's sandbox (`guest/trees.rs`).
//!
//! A call takes a waiting clone of its language's template when one fits (`warm.rs`),
//! else boots its VM.
//!
//! What the microVM backend does not do yet in `serve` is refused, when the server starts
//! or per call, with the reason ([`refusal_at_start`], [`CALL_REFUSAL_SESSIONS`], the
//! packages a call asks for): sessions, proxy network mode, packages on request.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::accel::{self, AccelMode, Choice};
use super::image::{self, GuestImage};
use super::run::{self, BOOT_LIMIT};
use super::vm::{self, MicroVmSandbox};
use super::warm::{self, Launcher, WarmVms};
use super::wire::{Tree, MAX_TREE_BYTES};
use super::Error;
use crate::execution::Host;
use crate::runtime::Language;
use crate::sandbox::{Limits, SecurityPolicy};
use crate::spawner::SpawnerClient;

/// What a call that asks for a session gets on the microVM backend.
pub const CALL_REFUSAL_SESSIONS: &str = "sessions are not available on the microVM backend \
     yet: each call runs in a fresh VM (run without session_id, or serve with backend = \
     \"namespace\")";

/// The guest, its build and the accelerator `serve` runs its microVMs with, and its warm
/// clones once started.
pub struct ServeVms {
    image: GuestImage,
    build_id: String,
    choice: Choice,
    /// Clones each language keeps waiting (0: every call boots).
    warm_size: usize,
    warm: std::sync::OnceLock<Arc<WarmVms>>,
}

impl std::fmt::Debug for ServeVms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeVms")
            .field("guest", &self.image.dir)
            .field("accel", &self.choice.accel.name())
            .field("warm_size", &self.warm_size)
            .finish()
    }
}

/// How a call's VM came to run its program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmStart {
    /// A clone that was waiting for its code.
    Warm,
    /// Booted for the call.
    Cold,
}

impl ServeVms {
    /// Locates and verifies the guest tree, checks its init is this build, and chooses the
    /// accelerator. Single-threaded callers only: choosing KVM boots a probe guest in a
    /// jail cloned from this process. `warm_size`: clones each language keeps waiting
    /// once [`ServeVms::start_warm`] runs (at most [`warm::MAX_WAITING`]).
    pub fn prepare(
        host: &Host,
        guest: Option<&Path>,
        mode: AccelMode,
        cache_dir: Option<&Path>,
        warm_size: usize,
    ) -> Result<ServeVms, Error> {
        let dir = image::locate(guest)?;
        let image = image::load(&dir)?;
        let build_id = image.check_build()?;
        let choice = accel::choose(host, &image, mode, cache_dir)?;
        tracing::info!(
            guest = %image.dir.display(),
            accel = choice.accel.name(),
            reason = %choice.reason,
            warm_size,
            "microVM backend ready"
        );
        Ok(ServeVms {
            image,
            build_id,
            choice,
            warm_size: warm_size.min(warm::MAX_WAITING),
            warm: std::sync::OnceLock::new(),
        })
    }

    fn launcher(&self, spawner: &SpawnerClient) -> Launcher {
        Launcher {
            spawner: spawner.clone(),
            guest_dir: self.image.dir.clone(),
            build_id: self.build_id.clone(),
            accel: self.choice.accel,
        }
    }

    /// Starts the warm clones (a template per language, made in the background) for
    /// programs under `limits` (the profile's) and `policy`; `longest_run`: the longest
    /// timeout a call may ask for. On the server's runtime; once.
    pub fn start_warm(
        &self,
        spawner: &SpawnerClient,
        limits: &Limits,
        policy: &SecurityPolicy,
        longest_run: Duration,
    ) -> Result<(), Error> {
        if self.warm_size == 0 || self.warm.get().is_some() {
            return Ok(());
        }
        let specs = [Language::Python, Language::TypeScript]
            .into_iter()
            .map(|l| Ok((l, run::run_spec(l, limits, policy)?)))
            .collect::<Result<Vec<_>, Error>>()?;
        let warm = WarmVms::start(self.launcher(spawner), specs, self.warm_size, longest_run);
        let _ = self.warm.set(warm);
        Ok(())
    }

    /// Whether the warm clones (if any) are all waiting.
    pub fn warm_full(&self) -> bool {
        self.warm.get().is_none_or(|w| w.is_full())
    }

    /// Kills the waiting clones and stops making more.
    pub async fn shutdown(&self) {
        if let Some(w) = self.warm.get() {
            w.shutdown().await;
        }
    }

    /// The backend's part of `health`.
    pub fn health(&self) -> serde_json::Value {
        serde_json::json!({
            "guest": self.image.dir.display().to_string(),
            "kernel": self.image.description.kernel_release,
            "accel": self.choice.accel.name(),
            "accel_reason": self.choice.reason,
            "warm": self.warm.get().map(|w| w.health()),
        })
    }

    /// A VM for `language` under `limits` and `policy` whose program runs, with `trees`
    /// bound read-only ([`capture_tree`]): a waiting clone when one fits, else booted now;
    /// returns once the program runs (its boot frame not yet written). `held` (the call's
    /// admission) is released once the spawner reports the VM's jail gone.
    pub async fn start(
        &self,
        spawner: &SpawnerClient,
        language: Language,
        limits: &Limits,
        policy: &SecurityPolicy,
        trees: &[(Tree, Vec<u8>)],
        held: impl std::any::Any + Send,
    ) -> Result<(MicroVmSandbox, VmStart), Error> {
        let spec = run::run_spec(language, limits, policy)?;
        let mut held: Option<Box<dyn std::any::Any + Send>> = Some(Box::new(held));
        if let Some(clone) = self.warm.get().and_then(|w| w.take(language, &spec)) {
            // The VM lives at most the run and a margin; the driver ends it sooner.
            let lifetime = limits.timeout + Duration::from_secs(30);
            match clone
                .hand_out(trees, limits.timeout, lifetime, &mut held)
                .await
            {
                Ok(sb) => return Ok((sb, VmStart::Warm)),
                // A clone that died or broke while it waited: this call boots one.
                Err(e) => {
                    tracing::warn!(error = %e, %language, "a waiting microVM clone failed; booting one");
                    if held.is_none() {
                        return Err(e);
                    }
                }
            }
        }
        let held = held.expect("the admission is still here");
        self.boot(spawner, language, spec, limits, trees, held)
            .await
            .map(|sb| (sb, VmStart::Cold))
    }

    /// Boots a fresh VM and starts `spec` in it.
    async fn boot(
        &self,
        spawner: &SpawnerClient,
        language: Language,
        spec: super::wire::RunSpec,
        limits: &Limits,
        trees: &[(Tree, Vec<u8>)],
        held: Box<dyn std::any::Any + Send>,
    ) -> Result<MicroVmSandbox, Error> {
        let machine = run::machine_for(limits, self.choice.accel);
        // The VM lives at most its boot, the run and a margin; the driver ends it sooner.
        let lifetime = BOOT_LIMIT + limits.timeout + Duration::from_secs(30);
        let launched = Instant::now();
        let mut jailed = self.launcher(spawner).jail(machine, lifetime, None).await?;
        // What the call holds (its admission slot) is released only once the spawner
        // reports the jail gone, whichever way the VM ends: the admission limit bounds
        // the VMs that exist.
        jailed.process.hold_until_gone(held);
        let mut vm = vm::boot(jailed, &self.build_id, launched, BOOT_LIMIT).await?;
        tracing::debug!(
            boot_ms = vm.boot_time.as_millis() as u64,
            %language,
            "microVM booted"
        );
        // The trees and the program's start within what is left of the boot limit: a
        // guest that stops reading is not waited for until the jail's lifetime.
        let left = BOOT_LIMIT.saturating_sub(launched.elapsed());
        match tokio::time::timeout(left, async {
            vm.send_trees(trees).await?;
            vm.start(spec, lifetime).await
        })
        .await
        {
            Ok(started) => started,
            Err(_) => Err(Error::VmGone(format!(
                "the guest did not start the program within {BOOT_LIMIT:?} of the VM's launch"
            ))),
        }
    }
}

/// `dir` as one `snapshot::archive` stream (what the guest restores at `/servers` or
/// `/skills`), at most [`MAX_TREE_BYTES`]: only what host user `reader` (the sandbox
/// user's host ids) may read by the mode bits, as a bind mount would show it to the
/// sandbox, and nothing made readable on the way. Blocking: it reads the whole tree. A
/// tree that changes while it is read (a client's skills view being brought up to date)
/// is read again, up to three times.
pub fn capture_tree(dir: &Path, reader: (u32, u32)) -> Result<Vec<u8>, Error> {
    use crate::snapshot::archive::{capture_readable_by, ArchiveError};
    use std::os::fd::AsFd;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let root = std::fs::File::open(dir).map_err(|source| Error::Io {
            doing: "opening a tree for the guest",
            source,
        })?;
        let mut out = Bounded(Vec::new());
        match capture_readable_by(root.as_fd(), &mut out, reader) {
            Ok(_) => return Ok(out.0),
            Err(ArchiveError::Changed { .. }) if attempt < 3 => continue,
            Err(e) => {
                // The host path is the operator's to read, not the client's.
                tracing::warn!(dir = %dir.display(), error = %e, "a tree for the guest could not be read");
                return Err(Error::Unsupported(format!(
                    "a tree for the guest ({e}; the most a tree may hold is {MAX_TREE_BYTES} bytes)"
                )));
            }
        }
    }
}

/// A writer that refuses to grow past [`MAX_TREE_BYTES`].
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_TREE_BYTES {
            return Err(std::io::Error::other("the tree is too large"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Why `serve` cannot start with the microVM backend and this network mode, if it
/// cannot: what the backend does not do yet is refused, not silently done another way.
/// (Packages on request are off on this backend, and a call asking for them is told so.)
pub fn refusal_at_start(network: crate::egress::NetworkMode) -> Option<String> {
    (network == crate::egress::NetworkMode::Proxy).then(|| {
        "backend microvm: `codebox serve` does not offer network mode \"proxy\" (controlled \
         egress) on the microVM backend yet; choose another [network] mode or serve with \
         backend = \"namespace\""
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::NetworkMode;

    #[test]
    fn trees_are_captured_whole_and_bounded() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("memory")).unwrap();
        std::fs::write(t.path().join("memory/__init__.py"), b"def f(): pass\n").unwrap();
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let stream = capture_tree(t.path(), me).unwrap();
        let back = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(back.path()).unwrap();
        crate::snapshot::archive::restore(&mut &stream[..], std::os::fd::AsFd::as_fd(&dir), me)
            .unwrap();
        assert_eq!(
            std::fs::read(back.path().join("memory/__init__.py")).unwrap(),
            b"def f(): pass\n"
        );
        // A tree over the bound is refused, not cut.
        let big = tempfile::tempdir().unwrap();
        std::fs::write(big.path().join("big"), vec![1u8; MAX_TREE_BYTES + 1]).unwrap();
        let err = capture_tree(big.path(), me).unwrap_err().to_string();
        assert!(err.contains("most a tree may hold"), "{err}");
        assert!(!err.contains(&big.path().display().to_string()), "{err}");
        assert!(capture_tree(Path::new("/nonexistent-codebox-tree"), me).is_err());
    }

    #[test]
    fn what_the_backend_cannot_do_yet_is_named_at_start() {
        assert_eq!(refusal_at_start(NetworkMode::None), None);
        assert_eq!(refusal_at_start(NetworkMode::Loopback), None);
        let proxy = refusal_at_start(NetworkMode::Proxy).unwrap();
        assert!(proxy.contains("\"proxy\""), "{proxy}");
        assert!(proxy.contains("backend = \"namespace\""), "{proxy}");
    }
}
