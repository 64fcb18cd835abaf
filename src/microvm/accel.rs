//! Which accelerator a microVM gets here, and why: KVM when a probe boots the real guest
//! under it, TCG otherwise. Never assumed from `/dev/kvm`'s presence: a nested or
//! paravirtualised KVM (PVM, `kvm_pvm`, no vmx/svm flags) opens and answers its API but
//! kills a stock guest in its instruction emulator.
//!
//! 1. `--accel tcg` (or `kvm`) is taken as asked (`kvm` still needs the checks below).
//! 2. No `/dev/kvm`, or not openable read-write by this user, or a KVM API other than
//!    12: TCG, with the reason and the fix (the `kvm` group).
//! 3. Else the probe: the guest tree booted in the jail (with `/dev/kvm` bound in) under
//!    KVM until the guest init's `Hello`, within [`PROBE_LIMIT`]. Its verdict is cached in
//!    the user's cache directory, keyed by this boot of the host, the host's kernel, the
//!    QEMU version and the guest's build, so later runs do not pay for it.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::image::GuestImage;
use super::qemu::Accel;
use super::{jail, run, vm, Error};
use crate::execution::Host;

/// How long the probe gives the guest to come up under KVM.
pub const PROBE_LIMIT: Duration = Duration::from_secs(30);

/// What the operator asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccelMode {
    /// KVM if the probe boots a guest, else TCG.
    #[default]
    Auto,
    Kvm,
    Tcg,
}

impl std::str::FromStr for AccelMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AccelMode::Auto),
            "kvm" => Ok(AccelMode::Kvm),
            "tcg" => Ok(AccelMode::Tcg),
            _ => Err(format!(
                "unknown accelerator {s:?}: expected auto, kvm or tcg"
            )),
        }
    }
}

/// The accelerator chosen, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    pub accel: Accel,
    pub reason: String,
    /// How to get KVM, when it is TCG for a reason the operator can fix.
    pub fix: Option<String>,
}

/// `KVM_GET_API_VERSION`: `_IO(0xAE, 0x00)`.
const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;

/// Whether a process with host ids `uid`, `gid` and supplementary `groups` may open a
/// node of `mode` owned by `owner`:`group` read-write (root gets no exception: the jail's
/// user never is host root).
pub fn may_open_rw(mode: u32, owner: u32, group: u32, uid: u32, gid: u32, groups: &[u32]) -> bool {
    if uid == owner {
        mode & 0o600 == 0o600
    } else if gid == group || groups.contains(&group) {
        mode & 0o060 == 0o060
    } else {
        mode & 0o006 == 0o006
    }
}

/// Whether the jail's user (host ids `uid`, `gid`, `groups`) can use `/dev/kvm` at all,
/// before any probe.
pub fn kvm_usable(uid: u32, gid: u32, groups: &[u32]) -> Result<(), (String, Option<String>)> {
    use std::os::unix::fs::MetadataExt;
    let path = Path::new("/dev/kvm");
    let Ok(meta) = std::fs::metadata(path) else {
        return Err((
            "this host has no /dev/kvm (no hardware virtualisation exposed)".into(),
            None,
        ));
    };
    if !may_open_rw(meta.mode(), meta.uid(), meta.gid(), uid, gid, groups) {
        return Err((
            format!(
                "the VMM's jail runs as host uid {uid} gid {gid}, which may not open /dev/kvm \
                 (mode {:o}, owner {}:{})",
                meta.mode() & 0o777,
                meta.uid(),
                meta.gid()
            ),
            Some(
                "give /dev/kvm to a group with read-write access (udev: GROUP=\"kvm\", \
                 MODE=\"0660\"): the jail then runs with that group (as root), or the user \
                 is in it (rootless)"
                    .into(),
            ),
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| {
            (
                format!("/dev/kvm is not usable by this user: {e}"),
                Some("add the user to the group owning /dev/kvm (usually `kvm`)".to_string()),
            )
        })?;
    // SAFETY: KVM_GET_API_VERSION returns an integer; its argument must be 0 (KVM refuses
    // anything else), passed explicitly rather than left to the variadic call.
    let version = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            KVM_GET_API_VERSION as _,
            0 as libc::c_ulong,
        )
    };
    if version != 12 {
        return Err((format!("/dev/kvm answers KVM API {version}, not 12"), None));
    }
    Ok(())
}

/// What `/proc/cpuinfo` and the loaded modules say about KVM here, for messages.
pub fn kvm_flavour(cpuinfo: &str, modules: &str) -> &'static str {
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or("");
    let hw = flags.split_whitespace().any(|f| f == "vmx" || f == "svm");
    let pvm = modules.lines().any(|l| l.starts_with("kvm_pvm "));
    match (hw, pvm) {
        (_, true) => "PVM (kvm_pvm: paravirtualised nested KVM, no vmx/svm)",
        (true, false) => "hardware virtualisation (vmx/svm)",
        (false, false) => "no vmx/svm flags",
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Cached {
    key: String,
    choice: Choice,
}

/// What a cached verdict is valid for.
fn cache_key(image: &GuestImage) -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    format!(
        "{}|{}|{}|{}",
        read("/proc/sys/kernel/random/boot_id"),
        read("/proc/sys/kernel/osrelease"),
        image.description.qemu,
        image.description.init_build_id
    )
}

fn cache_path(dir: &Path) -> PathBuf {
    dir.join("microvm-accel.json")
}

/// Boots the guest under KVM in its jail until `Hello`; the reason it did not, if not.
/// Single-threaded callers only (the jail is cloned).
pub fn probe_kvm(host: &Host, image: &GuestImage) -> Result<Duration, String> {
    let build_id = image.check_build().map_err(|e| e.to_string())?;
    let mut machine = run::machine_for(&crate::sandbox::Limits::default(), Accel::Kvm);
    machine.memory_mib = 256 + run::GUEST_OVERHEAD_MIB;
    let started = Instant::now();
    let jailed = jail::launch(
        host,
        &image.dir,
        machine,
        None,
        &jail::JailLimits {
            lifetime: PROBE_LIMIT + Duration::from_secs(10),
        },
    )
    .map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        match vm::boot(jailed, &build_id, started, PROBE_LIMIT).await {
            Ok(vm) => Ok(vm.boot_time),
            Err(e) => Err(e.to_string()),
        }
    })
}

/// Chooses the accelerator (see the module documentation). `cache_dir`: where a probe's
/// verdict is kept (`None`: probe every time).
pub fn choose(
    host: &Host,
    image: &GuestImage,
    mode: AccelMode,
    cache_dir: Option<&Path>,
) -> Result<Choice, Error> {
    if mode == AccelMode::Tcg {
        return Ok(Choice {
            accel: Accel::Tcg,
            reason: "asked for (--accel tcg)".into(),
            fix: None,
        });
    }
    let ids = jail::kvm_ids(host.id_mapping);
    if let Err((reason, fix)) = kvm_usable(
        ids.host_uid,
        ids.host_gid,
        &jail::own_groups(host.id_mapping),
    ) {
        if mode == AccelMode::Kvm {
            return Err(Error::Unsupported(format!("--accel kvm: {reason}")));
        }
        let reason = if Path::new("/dev/kvm").exists() {
            format!(
                "{reason}; its KVM: {}",
                kvm_flavour(
                    &std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default(),
                    &std::fs::read_to_string("/proc/modules").unwrap_or_default(),
                )
            )
        } else {
            reason
        };
        return Ok(Choice {
            accel: Accel::Tcg,
            reason,
            fix,
        });
    }
    let key = cache_key(image);
    if let Some(dir) = cache_dir {
        if let Ok(text) = std::fs::read_to_string(cache_path(dir)) {
            if let Ok(c) = serde_json::from_str::<Cached>(&text) {
                if c.key == key {
                    return finish(mode, c.choice);
                }
            }
        }
    }
    let flavour = kvm_flavour(
        &std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default(),
        &std::fs::read_to_string("/proc/modules").unwrap_or_default(),
    );
    let choice = match probe_kvm(host, image) {
        Ok(boot) => Choice {
            accel: Accel::Kvm,
            reason: format!(
                "a probe booted the guest under KVM in {:.0} ms ({flavour})",
                boot.as_secs_f64() * 1000.0
            ),
            fix: None,
        },
        Err(why) => Choice {
            accel: Accel::Tcg,
            reason: format!(
                "/dev/kvm is there ({flavour}) but a probe did not boot the guest under it: {why}"
            ),
            fix: None,
        },
    };
    if let Some(dir) = cache_dir {
        let _ = std::fs::create_dir_all(dir);
        let cached = Cached {
            key,
            choice: choice.clone(),
        };
        if let Ok(text) = serde_json::to_string(&cached) {
            let tmp = cache_path(dir).with_extension("tmp");
            if std::fs::write(&tmp, text).is_ok() {
                let _ = std::fs::rename(&tmp, cache_path(dir));
            }
        }
    }
    finish(mode, choice)
}

fn finish(mode: AccelMode, choice: Choice) -> Result<Choice, Error> {
    if mode == AccelMode::Kvm && choice.accel != Accel::Kvm {
        return Err(Error::Unsupported(format!(
            "--accel kvm: {}",
            choice.reason
        )));
    }
    Ok(choice)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("auto".parse::<AccelMode>().unwrap(), AccelMode::Auto);
        assert_eq!("tcg".parse::<AccelMode>().unwrap(), AccelMode::Tcg);
        assert!("hvf".parse::<AccelMode>().is_err());
    }

    #[test]
    fn the_kvm_flavour_is_named() {
        let pvm_modules = "kvm_pvm 123 0 - Live 0x0\nkvm 1 1 kvm_pvm, Live 0x0\n";
        assert!(kvm_flavour("flags : fpu sse\n", pvm_modules).starts_with("PVM"));
        assert!(kvm_flavour("flags : fpu vmx\n", "kvm_intel 1 0\n").starts_with("hardware"));
        assert_eq!(kvm_flavour("flags : fpu\n", ""), "no vmx/svm flags");
    }

    #[test]
    fn device_permissions_are_read_as_the_kernel_does() {
        // 0600 root:root (this machine's /dev/kvm): nobody but root.
        assert!(!may_open_rw(0o20600, 0, 0, 65534, 65534, &[]));
        // 0660 root:kvm: the kvm group, as primary or supplementary group.
        assert!(may_open_rw(0o20660, 0, 108, 65534, 108, &[]));
        assert!(may_open_rw(0o20660, 0, 108, 1000, 1000, &[108]));
        assert!(!may_open_rw(0o20660, 0, 108, 1000, 1000, &[27]));
        // The owner's bits decide for the owner, even when others may.
        assert!(!may_open_rw(0o20066, 1000, 0, 1000, 1000, &[]));
        assert!(may_open_rw(0o20666, 0, 0, 1000, 1000, &[]));
    }

    #[test]
    fn a_cached_tcg_verdict_refuses_an_explicit_kvm() {
        let tcg = Choice {
            accel: Accel::Tcg,
            reason: "probe failed".into(),
            fix: None,
        };
        assert!(finish(AccelMode::Kvm, tcg.clone()).is_err());
        assert_eq!(finish(AccelMode::Auto, tcg.clone()).unwrap(), tcg);
    }
}
