//! The microVM backend: the same sandbox behind a hypervisor boundary.
//!
//! ```text
//!  supervisor ──────────────── stdout/stderr pipes, fd-3 socket, status pipe ─────────┐
//!     │ (same shape as a namespace sandbox)                                            │
//!     │ vm.rs: driver (pumps, control frames, QMP watch)                               │
//!     ├── QMP (the jail's fd 3) ── jailed QEMU (jail.rs: a codebox sandbox) ───────────┤
//!     └── control/stdout/stderr/channel sockets ══ virtio-serial ports ══╗             │
//!                                                                        ▼             │
//!  guest: cloud kernel + initramfs (modules, codebox as /init) + erofs rootfs (image.rs)
//!         guest/: the guest init spawns the program with `sandbox::spawn` (namespaces,
//!         cgroups, no capabilities, no_new_privs, landlock, seccomp) and relays it
//! ```
//!
//! # Layout
//! - [`image`]: the guest tree `cargo xtask guest` builds: located, verified, described
//! - [`qemu`]: QEMU's command line as data (`-M microvm`, no network, `-sandbox on`)
//! - [`jail`]: QEMU as the program of a codebox sandbox, with `policies/seccomp/vmm.json`
//! - [`jail_process`]: that jail's process, cloned here (`run`) or by the spawner (`serve`)
//! - [`qmp`]: a bounded QMP client with descriptor passing
//! - [`wire`]: the control port's frames (bounded, hostile-input safe)
//! - [`pump`]: port → pipe relays with fixed buffers and announced byte counts
//! - [`vm`]: boot handshake, start, the driver, how a VM ended
//! - [`run`]: one execution on a fresh VM (`codebox run --backend microvm`)
//! - [`serve`]: the same in `codebox serve`, the jail started by the spawner
//! - [`warm`]: `serve`'s warm clones: a template per language, clones waiting for code
//! - [`accel`]: KVM when a probe boots the guest under it, else TCG; and why (`doctor`)
//! - [`tsc`]: the host's TSC frequency, which a TCG guest cannot calibrate on microvm
//! - [`guest`]: the guest init (runs inside the VM)
//! - [`build_id`]: this binary's GNU build ID
//!
//! # The guest init is this binary
//!
//! The initramfs's `/init` is the codebox binary itself (stripped), run as
//! `/init guest-init`, with its loader and its three libraries (libc, libm, libgcc_s)
//! beside it — the same Debian files the rootfs carries. The alternatives were a static
//! build (a second build of the whole crate with other flags, and no guarantee the two
//! builds agree) or a separate small init binary (a second implementation of the
//! sandbox layers, or a second crate they must be split into). One binary means the
//! program inside the guest is confined by exactly the code that confines a namespace
//! sandbox, and host and guest always speak the same protocol: the guest says its build
//! ID in its `Hello` and the host refuses any other (`cargo xtask guest` records it, so
//! a stale guest is refused before it boots). The cost is the initramfs's size (the
//! stripped debug binary is ~55 MB, the release one ~25 MB), loaded by QEMU from the
//! host's page cache and, for clones, shared with the template.
//!
//! # Streams
//!
//! stdout, stderr and fd 3 each have their own virtio-serial port, control has a fourth:
//! nothing the program writes can be taken for a control message, and each stream has
//! its own flow control. The control port carries bounded frames only (`wire.rs`); each
//! stream's end is announced there with its byte count.

pub mod accel;
pub mod build_id;
pub mod guest;
pub mod image;
pub mod jail;
pub mod jail_process;
pub mod pump;
pub mod qemu;
pub mod qmp;
pub mod run;
pub mod serve;
pub mod template;
pub mod tsc;
pub mod vm;
pub mod warm;
pub mod wire;

use crate::sandbox;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no microVM guest found (looked in {looked}); build it with `cargo xtask guest`")]
    NoGuest { looked: String },
    #[error("the microVM guest tree is invalid: {0}")]
    GuestInvalid(String),
    #[error(
        "the microVM guest's init is build {guest} but this codebox is build {host}: \
         rebuild the guest with `cargo xtask guest`"
    )]
    BuildMismatch { guest: String, host: String },
    #[error("{doing}")]
    Io {
        doing: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(sandbox::Error),
    #[error("the VMM's seccomp policy")]
    Seccomp(#[source] sandbox::seccomp::Error),
    #[error(transparent)]
    Qmp(qmp::Error),
    #[error(
        "the microVM did not boot: {reason}{}",
        tail_note(console, qemu_stderr)
    )]
    Boot {
        reason: String,
        console: String,
        qemu_stderr: String,
    },
    #[error("the guest init failed: {reason}{}", tail_note(console, ""))]
    GuestFailed { reason: String, console: String },
    #[error("the microVM is gone: {0}")]
    VmGone(String),
    #[error("the guest broke the control protocol: {0}")]
    Protocol(String),
    #[error("not supported on the microVM backend: {0}")]
    Unsupported(String),
}

/// The last lines of the console and of QEMU's stderr, for an error message.
fn tail_note(console: &str, qemu: &str) -> String {
    let last = |s: &str, n: usize| {
        let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    };
    let mut out = String::new();
    if !console.trim().is_empty() {
        out.push_str(&format!(" (console: {})", last(console, 6)));
    }
    if !qemu.trim().is_empty() {
        out.push_str(&format!(" (qemu: {})", last(qemu, 4)));
    }
    out
}

pub type Result<T> = std::result::Result<T, Error>;

/// Which backend runs a sandbox.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Fresh Linux namespaces on the host kernel.
    #[default]
    Namespace,
    /// The same sandbox inside a microVM (QEMU), behind a hypervisor boundary.
    Microvm,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Namespace => "namespace",
            Backend::Microvm => "microvm",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "namespace" => Ok(Backend::Namespace),
            "microvm" => Ok(Backend::Microvm),
            other => Err(format!(
                "unknown backend {other:?}: expected namespace or microvm"
            )),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_and_print() {
        for b in [Backend::Namespace, Backend::Microvm] {
            assert_eq!(b.name().parse::<Backend>().unwrap(), b);
        }
        assert!("vm"
            .parse::<Backend>()
            .unwrap_err()
            .contains("namespace or microvm"));
    }

    #[test]
    fn error_notes_keep_the_last_lines() {
        let console = (0..20).map(|i| format!("line {i}\n")).collect::<String>();
        let note = tail_note(&console, "qemu: boom\n");
        assert!(
            note.contains("line 19") && !note.contains("line 10 "),
            "{note}"
        );
        assert!(note.contains("qemu: boom"));
    }
}
