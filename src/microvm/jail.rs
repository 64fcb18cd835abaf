//! The VMM's jail: QEMU runs as the program of a codebox sandbox, built by the very code
//! that builds the language sandboxes (`sandbox::spawn`), the way Firecracker's jailer
//! runs Firecracker:
//!
//! - its own user, mount, pid, network, IPC, UTS and cgroup namespaces; the network
//!   namespace has no interface up and the filter allows no socket (no network at all);
//! - root: `target/guest` read-only (QEMU, its libraries and firmware, the kernel, the
//!   initramfs and the rootfs image: nothing else of the host), a private `/dev` with
//!   null, zero, full, random and urandom, and `kvm` only when KVM is used (`accel.rs`),
//!   a fresh `/proc`, small private tmpfs for `/tmp` and `/dev/shm`;
//! - its own cgroup: memory = guest RAM + [`VMM_OVERHEAD_MIB`], tasks, CPU = vCPUs + one
//!   core for QEMU's own threads;
//! - no capabilities, `no_new_privs`, landlock (read-only everywhere but its tmpfs), the
//!   seccomp filter `policies/seccomp/vmm.json` (the default deny-list, and no socket of
//!   any family), then QEMU's own `-sandbox on` filter on top;
//! - descriptors: fd 3 is QMP (as a program's fd 3 is its channel to the supervisor),
//!   the four ports' sockets at the inherited slots (`sandbox::FIRST_INHERITED_FD` on),
//!   the serial console on stdout.

use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use super::jail_process::JailProcess;
use super::qemu::{Accel, Machine, PortFds, Ram};
use super::Error;
use crate::execution::Host;
use crate::sandbox::seccomp::CompiledFilter;
use crate::sandbox::{self, LandlockMode, Limits, NetworkAccess, Program, SecurityPolicy};

/// The VMM's own memory beyond guest RAM: TCG's translation cache ([`TB_SIZE_MIB`]), QEMU
/// itself and its libraries, device state, page tables.
pub const VMM_OVERHEAD_MIB: u64 = 192;
/// TCG's translation cache.
pub const TB_SIZE_MIB: u64 = 64;
/// Tasks of the jail: QEMU's main loop, one thread per vCPU, RCU, the block layer's
/// worker threads.
pub const VMM_TASKS: u64 = 96;

/// The seccomp policy of the jailed VMM.
pub fn vmm_filter() -> Result<CompiledFilter, Error> {
    static POLICY: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/policies/seccomp/vmm.json"
    ));
    CompiledFilter::from_json("vmm", POLICY.as_bytes()).map_err(Error::Seccomp)
}

/// The host's ends of the VM's sockets.
pub struct Sockets {
    pub control: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub channel: OwnedFd,
}

/// Four socketpairs: the host's ends, and QEMU's (control, stdout, stderr, channel).
fn socket_pairs() -> std::io::Result<(Sockets, [OwnedFd; 4])> {
    let pair = || {
        nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::Stream,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(std::io::Error::from)
    };
    let (control, c) = pair()?;
    let (stdout, o) = pair()?;
    let (stderr, e) = pair()?;
    let (channel, ch) = pair()?;
    Ok((
        Sockets {
            control,
            stdout,
            stderr,
            channel,
        },
        [c, o, e, ch],
    ))
}

/// A jailed QEMU, running.
pub struct Jailed {
    /// The sandbox QEMU runs in: its stdout is the serial console, its fd 3 QMP.
    pub process: JailProcess,
    pub sockets: Sockets,
    pub machine: Machine,
}

/// What the jail needs besides the machine.
#[derive(Debug, Clone)]
pub struct JailLimits {
    /// The whole VM's life, armed as the jail's own deadline (the host's driver ends it
    /// first, normally).
    pub lifetime: Duration,
}

/// The host ids of a KVM jail: as root, the unprivileged uid with `/dev/kvm`'s group when
/// that group may read and write it (supplementary groups are cleared in a root-made
/// sandbox, so the group must be the primary one); rootless, the user's own ids.
pub fn kvm_ids(ids: crate::sandbox::IdMapping) -> crate::sandbox::IdMapping {
    use std::os::unix::fs::MetadataExt;
    if !ids.privileged {
        return ids;
    }
    match std::fs::metadata("/dev/kvm") {
        Ok(m) if m.gid() != 0 && m.mode() & 0o060 == 0o060 => crate::sandbox::IdMapping {
            host_gid: m.gid(),
            ..ids
        },
        _ => ids,
    }
}

/// The supplementary groups the jail keeps: none when made by root, the user's own
/// rootless.
pub fn own_groups(ids: crate::sandbox::IdMapping) -> Vec<u32> {
    if ids.privileged {
        return Vec::new();
    }
    nix::unistd::getgroups()
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default()
}

/// The sandbox spec of the VMM: see the module documentation.
pub fn spec(
    host: &Host,
    guest_dir: &std::path::Path,
    machine: &Machine,
    inherit: Vec<i32>,
) -> Result<sandbox::SandboxSpec, Error> {
    let mut argv = vec!["qemu-system-x86_64".to_string()];
    argv.extend(machine.args());
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut program = Program::new(super::qemu::QEMU, &argv_ref, &[("LANG", "C")], "/")
        .map_err(Error::Sandbox)?;
    program.inherit = inherit;
    let ram_bytes = machine.memory_mib * 1024 * 1024;
    let limits = Limits {
        timeout: Duration::from_secs(3600),
        stdout_cap: 64 * 1024,
        stderr_cap: 64 * 1024,
        tmpfs_bytes: 1024 * 1024,
        shm_bytes: 1024 * 1024,
        open_files: 256,
        // QEMU writes no file; a memory file it is given is sized before.
        file_size_bytes: ram_bytes,
        memory_bytes: Some(ram_bytes + VMM_OVERHEAD_MIB * 1024 * 1024),
        pids: Some(VMM_TASKS),
        cpu_millicores: Some((u64::from(machine.vcpus) + 1) * 1000),
    };
    let mut spec = host.spec(
        program,
        None,
        &limits,
        &SecurityPolicy {
            landlock: Some(LandlockMode::BestEffort),
            network: NetworkAccess::None,
            seccomp: Some(vmm_filter()?),
        },
    );
    spec.rootfs = guest_dir.to_path_buf();
    spec.hostname = "codebox-vmm".into();
    if machine.accel == Accel::Kvm {
        spec.id_mapping = kvm_ids(spec.id_mapping);
    }
    Ok(spec)
}

/// Starts QEMU in its jail. Single-threaded callers only (`sandbox::spawn` clones).
pub fn launch(
    host: &Host,
    guest_dir: &std::path::Path,
    mut machine: Machine,
    ram: Option<&OwnedFd>,
    limits: &JailLimits,
) -> Result<Jailed, Error> {
    let (sockets, theirs) = socket_pairs().map_err(|source| Error::Io {
        doing: "creating the VM's sockets",
        source,
    })?;
    let first = sandbox::FIRST_INHERITED_FD;
    let mut inherit: Vec<i32> = theirs.iter().map(|fd| fd.as_raw_fd()).collect();
    machine.fds = PortFds {
        qmp: sandbox::PROGRAM_CHANNEL_FD,
        control: first,
        stdout: first + 1,
        stderr: first + 2,
        channel: first + 3,
    };
    match (&mut machine.ram, ram) {
        (Ram::File { fd, .. }, Some(file)) => {
            *fd = first + 4;
            inherit.push(file.as_raw_fd());
        }
        (Ram::Anonymous, None) => {}
        _ => {
            return Err(Error::Unsupported(
                "a memory file without a file-backed machine, or the reverse".into(),
            ))
        }
    }
    let spec = spec(host, guest_dir, &machine, inherit)?;
    // /dev/kvm only when KVM is used; landlock lets QEMU open it (`VMM_DEVICES`).
    let devices: &[&str] = match machine.accel {
        Accel::Kvm => &["kvm"],
        Accel::Tcg => &[],
    };
    let sandbox = sandbox::spawn_with_devices(&spec, host.cgroups.as_ref(), devices)
        .map_err(Error::Sandbox)?;
    if let Err(e) = sandbox.watch.arm(limits.lifetime) {
        tracing::warn!(?e, "arming the VMM jail's deadline failed");
    }
    // QEMU holds its ends now; ours would keep its sockets open after it died.
    drop(theirs);
    Ok(Jailed {
        process: JailProcess::Local(sandbox),
        sockets,
        machine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::microvm::qemu::PortFds;

    fn machine(accel: Accel) -> Machine {
        Machine {
            accel,
            memory_mib: 704,
            vcpus: 1,
            tb_size_mib: TB_SIZE_MIB,
            ram: Ram::Anonymous,
            incoming: false,
            tsc_khz: None,
            fds: PortFds {
                qmp: 3,
                control: 13,
                stdout: 14,
                stderr: 15,
                channel: 16,
            },
        }
    }

    fn host() -> Host {
        let rootfs = crate::rootfs::Rootfs::checked_elsewhere("/r".into());
        Host {
            rootfs,
            id_mapping: crate::sandbox::IdMapping::rootless(1000, 1000),
            cgroups: None,
            python_preload: None,
            zygote: false,
        }
    }

    #[test]
    fn the_vmm_policy_compiles_and_refuses_every_socket() {
        let f = vmm_filter().unwrap();
        assert_eq!(f.policy(), "vmm");
        let json: serde_json::Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/policies/seccomp/vmm.json"
        )))
        .unwrap();
        let socket_rules: Vec<&serde_json::Value> = json["eperm"]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["syscall"] == "socket")
            .collect();
        assert_eq!(socket_rules.len(), 1);
        assert!(socket_rules[0].get("args").is_none(), "unconditional");
    }

    #[test]
    fn the_jail_is_a_sandbox_of_the_guest_tree_with_its_limits() {
        let m = machine(Accel::Tcg);
        let s = spec(&host(), std::path::Path::new("/g"), &m, vec![7, 8]).unwrap();
        s.validate().unwrap();
        assert_eq!(s.rootfs, std::path::Path::new("/g"));
        assert_eq!(s.hostname, "codebox-vmm");
        assert_eq!(s.program.inherit, [7, 8]);
        assert_eq!(s.program.path.to_str().unwrap(), super::super::qemu::QEMU);
        assert!(s.program.argv.iter().any(|a| a.to_str() == Ok("-sandbox")));
        assert_eq!(
            s.limits.memory_bytes,
            Some((704 + VMM_OVERHEAD_MIB) * 1024 * 1024)
        );
        assert_eq!(s.limits.cpu_millicores, Some(2000));
        assert_eq!(s.policy.network, NetworkAccess::None);
        assert_eq!(s.policy.seccomp.as_ref().unwrap().policy(), "vmm");
        assert!(s.workspace.is_none() && s.servers.is_none() && s.packages.is_none());
    }
}
