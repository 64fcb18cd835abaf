//! The microVM backend in `codebox serve`: a one-shot execution in a fresh VM.
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
//! What the microVM backend does not do yet in `serve` is refused, when the server starts
//! or per call, with the reason ([`refusal_at_start`], [`CALL_REFUSAL_SESSIONS`]): the
//! warm pool, sessions, proxy network mode and packages.

use std::path::Path;
use std::time::{Duration, Instant};

use super::accel::{self, AccelMode, Choice};
use super::image::{self, GuestImage};
use super::run::{self, BOOT_LIMIT};
use super::vm::{self, MicroVmSandbox};
use super::wire::{Tree, MAX_TREE_BYTES};
use super::Error;
use crate::execution::Host;
use crate::runtime::Language;
use crate::sandbox::{Limits, SecurityPolicy};
use crate::spawner::wire::VmmSpec;
use crate::spawner::SpawnerClient;

/// What a call that asks for a session gets on the microVM backend.
pub const CALL_REFUSAL_SESSIONS: &str = "sessions are not available on the microVM backend \
     yet: each call runs in a fresh VM (run without session_id, or serve with backend = \
     \"namespace\")";

/// The guest, its build and the accelerator `serve` runs its microVMs with.
#[derive(Debug)]
pub struct ServeVms {
    image: GuestImage,
    build_id: String,
    choice: Choice,
}

impl ServeVms {
    /// Locates and verifies the guest tree, checks its init is this build, and chooses the
    /// accelerator. Single-threaded callers only: choosing KVM boots a probe guest in a
    /// jail cloned from this process.
    pub fn prepare(
        host: &Host,
        guest: Option<&Path>,
        mode: AccelMode,
        cache_dir: Option<&Path>,
    ) -> Result<ServeVms, Error> {
        let dir = image::locate(guest)?;
        let image = image::load(&dir)?;
        let build_id = image.check_build()?;
        let choice = accel::choose(host, &image, mode, cache_dir)?;
        tracing::info!(
            guest = %image.dir.display(),
            accel = choice.accel.name(),
            reason = %choice.reason,
            "microVM backend ready"
        );
        Ok(ServeVms {
            image,
            build_id,
            choice,
        })
    }

    /// The backend's part of `health`.
    pub fn health(&self) -> serde_json::Value {
        serde_json::json!({
            "guest": self.image.dir.display().to_string(),
            "kernel": self.image.description.kernel_release,
            "accel": self.choice.accel.name(),
            "accel_reason": self.choice.reason,
            "warm": false,
        })
    }

    /// Boots a fresh VM for `language` under `limits` and `policy` and starts the program
    /// in it, with `trees` bound read-only ([`capture_tree`]); returns once the program
    /// runs (its boot frame not yet written).
    pub async fn start(
        &self,
        spawner: &SpawnerClient,
        language: Language,
        limits: &Limits,
        policy: &SecurityPolicy,
        trees: &[(Tree, Vec<u8>)],
    ) -> Result<MicroVmSandbox, Error> {
        let spec = run::run_spec(language, limits, policy)?;
        let machine = run::machine_for(limits, self.choice.accel);
        // The VM lives at most its boot, the run and a margin; the driver ends it sooner.
        let lifetime = BOOT_LIMIT + limits.timeout + Duration::from_secs(30);
        let launched = Instant::now();
        let (jail, ports) = spawner
            .spawn_vmm(VmmSpec {
                guest_dir: self.image.dir.clone(),
                machine: machine.clone(),
                lifetime_ms: u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX),
            })
            .await
            .map_err(|e| Error::VmGone(format!("the VMM's jail could not be started: {e}")))?;
        let [control, stdout, stderr, channel] = ports;
        let jailed = super::jail::Jailed {
            process: super::jail_process::JailProcess::Remote(jail),
            sockets: super::jail::Sockets {
                control,
                stdout,
                stderr,
                channel,
            },
            machine,
        };
        let mut vm = vm::boot(jailed, &self.build_id, launched, BOOT_LIMIT).await?;
        vm.send_trees(trees).await?;
        tracing::debug!(
            boot_ms = vm.boot_time.as_millis() as u64,
            %language,
            "microVM booted"
        );
        vm.start(spec, lifetime).await
    }
}

/// `dir` as one `snapshot::archive` stream (what the guest restores at `/servers` or
/// `/skills`), at most [`MAX_TREE_BYTES`]. Blocking: it reads the whole tree.
pub fn capture_tree(dir: &Path) -> Result<Vec<u8>, Error> {
    use std::os::fd::AsFd;
    let io = |doing| move |source| Error::Io { doing, source };
    let root = std::fs::File::open(dir).map_err(io("opening a tree for the guest"))?;
    let mut out = Bounded(Vec::new());
    crate::snapshot::archive::capture(root.as_fd(), &mut out).map_err(|e| {
        Error::Unsupported(format!(
            "{} for the guest: {e} (the most a tree may hold is {MAX_TREE_BYTES} bytes)",
            dir.display()
        ))
    })?;
    Ok(out.0)
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

/// Why `serve` cannot start with the microVM backend and this configuration, if it
/// cannot: what the backend does not do yet is refused, not silently done another way.
pub fn refusal_at_start(network: crate::egress::NetworkMode, packages_on: bool) -> Option<String> {
    let mut missing = Vec::new();
    if network == crate::egress::NetworkMode::Proxy {
        missing.push("network mode \"proxy\" (controlled egress)");
    }
    if packages_on {
        missing.push("packages on request ([packages] enabled)");
    }
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "backend microvm: `codebox serve` does not offer {} on the microVM backend yet; \
         turn it off or serve with backend = \"namespace\"",
        missing.join(" or ")
    ))
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
        let stream = capture_tree(t.path()).unwrap();
        let back = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(back.path()).unwrap();
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        crate::snapshot::archive::restore(&mut &stream[..], std::os::fd::AsFd::as_fd(&dir), me)
            .unwrap();
        assert_eq!(
            std::fs::read(back.path().join("memory/__init__.py")).unwrap(),
            b"def f(): pass\n"
        );
        // A tree over the bound is refused, not cut.
        let big = tempfile::tempdir().unwrap();
        std::fs::write(big.path().join("big"), vec![1u8; MAX_TREE_BYTES + 1]).unwrap();
        let err = capture_tree(big.path()).unwrap_err().to_string();
        assert!(err.contains("most a tree may hold"), "{err}");
        assert!(capture_tree(Path::new("/nonexistent-codebox-tree")).is_err());
    }

    #[test]
    fn what_the_backend_cannot_do_yet_is_named_at_start() {
        assert_eq!(refusal_at_start(NetworkMode::None, false), None);
        assert_eq!(refusal_at_start(NetworkMode::Loopback, false), None);
        let both = refusal_at_start(NetworkMode::Proxy, true).unwrap();
        assert!(
            both.contains("\"proxy\"") && both.contains("[packages]"),
            "{both}"
        );
        assert!(both.contains("backend = \"namespace\""), "{both}");
    }
}
