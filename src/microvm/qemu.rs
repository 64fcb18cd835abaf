//! The QEMU command line, as data.
//!
//! - `-M microvm`: no PCI, no firmware tables beyond a small ACPI DSDT that names the
//!   virtio-mmio devices (the cloud kernel has no `virtio_mmio.device=` command-line
//!   support, ACPI is how it finds them), an ISA serial port for the console.
//! - Devices: the rootfs image on virtio-blk (read-only), one virtio-serial controller
//!   with four ports (control, stdout, stderr, fd 3) on sockets QEMU inherits, virtio-rng
//!   fed from the jail's `/dev/urandom`. No network device, no display, no USB, no
//!   defaults (`-nodefaults`), no user config file.
//! - QMP on an inherited socket; the serial console on QEMU's stdout (a pipe the host
//!   keeps the tail of).
//! - `-sandbox on` with every optional group denied: QEMU's own seccomp filter, on top of
//!   the jail's (`policies/seccomp/vmm.json`).
//! - TCG's translation cache is bounded (`tb-size`): it is part of the VMM's memory, and
//!   QEMU's default (1 GiB) would not fit the jail's cgroup.
//!
//! Paths are those of the jail (`target/guest` is its root, see `jail.rs`).

use std::os::fd::RawFd;

/// How guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization (needs `/dev/kvm` in the jail).
    Kvm,
    /// QEMU's binary translator: slower, needs nothing from the host.
    Tcg,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Where guest RAM comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Ram {
    /// QEMU's own anonymous memory.
    Anonymous,
    /// A memory file QEMU inherits at descriptor `fd` (opened through `/proc/self/fd`):
    /// `share`: the template writes its RAM into the file; a clone maps it private
    /// (copy-on-write) and reads only what it touches.
    File { fd: RawFd, share: bool },
}

/// The descriptors QEMU inherits for QMP and the four ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortFds {
    pub qmp: RawFd,
    pub control: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    pub channel: RawFd,
}

/// One VM's machine (sent to the spawner with a `SpawnVmm` request).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Machine {
    pub accel: Accel,
    pub memory_mib: u64,
    pub vcpus: u32,
    /// TCG's translation cache, MiB.
    pub tb_size_mib: u64,
    pub ram: Ram,
    /// Wait for a migration stream (`migrate-incoming` over QMP) instead of booting.
    pub incoming: bool,
    /// The host's TSC frequency (`tsc.rs`), given to the guest kernel under TCG.
    pub tsc_khz: Option<u64>,
    pub fds: PortFds,
}

/// Inside the jail.
pub const QEMU: &str = "/usr/bin/qemu-system-x86_64";
pub const KERNEL: &str = "/boot/vmlinuz";
pub const INITRAMFS: &str = "/boot/initramfs.cpio";
pub const ROOTFS_IMAGE: &str = "/boot/rootfs.erofs";

/// The kernel command line: console on the serial port, quiet, reboot (and so end QEMU,
/// `-no-reboot`) at once on a panic; under TCG the TSC's frequency (see `tsc.rs`); then
/// `/init guest-init`.
pub fn cmdline(accel: Accel, tsc_khz: Option<u64>) -> String {
    let mut c = String::from("console=ttyS0 quiet panic=-1");
    if let (Accel::Tcg, Some(khz)) = (accel, tsc_khz) {
        c.push_str(&format!(" tsc_early_khz={khz} tsc=reliable"));
    }
    c.push_str(" -- guest-init");
    c
}

impl Machine {
    /// `argv[1..]` of QEMU.
    pub fn args(&self) -> Vec<String> {
        let f = &self.fds;
        let mut a: Vec<String> = Vec::new();
        let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
        push(&["-nodefaults", "-no-user-config", "-display", "none"]);
        push(&["-no-reboot"]);
        push(&["-M", "microvm,x-option-roms=on,rtc=on,isa-serial=on"]);
        let accel = match self.accel {
            Accel::Kvm => "kvm".to_string(),
            Accel::Tcg => format!("tcg,tb-size={}", self.tb_size_mib),
        };
        push(&["-accel", &accel]);
        push(&[
            "-cpu",
            match self.accel {
                // `host` aborts on some hosts (a PVM host's arch-capabilities).
                Accel::Kvm => "host,-arch-capabilities",
                Accel::Tcg => "max",
            },
        ]);
        push(&["-smp", &self.vcpus.to_string()]);
        let mem = format!("{}M", self.memory_mib);
        push(&["-m", &mem]);
        if let Ram::File { fd, share } = &self.ram {
            let object = format!(
                "memory-backend-file,id=ram,size={mem},mem-path=/proc/self/fd/{fd},share={},prealloc=off",
                if *share { "on" } else { "off" }
            );
            push(&["-object", &object, "-machine", "memory-backend=ram"]);
        }
        let cmdline = cmdline(self.accel, self.tsc_khz);
        push(&["-kernel", KERNEL, "-initrd", INITRAMFS, "-append", &cmdline]);
        let drive = format!("file={ROOTFS_IMAGE},if=none,id=rootfs,format=raw,readonly=on");
        push(&[
            "-drive",
            &drive,
            "-device",
            "virtio-blk-device,drive=rootfs",
        ]);
        push(&[
            "-object",
            "rng-random,id=rng,filename=/dev/urandom",
            "-device",
            "virtio-rng-device,rng=rng",
        ]);
        // Port 0 is kept for a console port: four ports need five.
        push(&["-device", "virtio-serial-device,max_ports=5"]);
        for (id, fd, name) in [
            ("control", f.control, super::wire::PORT_CONTROL),
            ("stdout", f.stdout, super::wire::PORT_STDOUT),
            ("stderr", f.stderr, super::wire::PORT_STDERR),
            ("channel", f.channel, super::wire::PORT_CHANNEL),
        ] {
            let chardev = format!("socket,id={id},fd={fd}");
            let port = format!("virtserialport,chardev={id},name={name}");
            push(&["-chardev", &chardev, "-device", &port]);
        }
        let qmp = format!("socket,id=qmp,fd={}", f.qmp);
        push(&["-chardev", &qmp, "-mon", "chardev=qmp,mode=control"]);
        push(&[
            "-chardev",
            "stdio,id=console,signal=off",
            "-serial",
            "chardev:console",
        ]);
        push(&[
            "-sandbox",
            "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ]);
        if self.incoming {
            push(&["-incoming", "defer"]);
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> Machine {
        Machine {
            accel: Accel::Tcg,
            memory_mib: 768,
            vcpus: 1,
            tb_size_mib: 64,
            ram: Ram::Anonymous,
            incoming: false,
            tsc_khz: Some(2_596_144),
            fds: PortFds {
                qmp: 13,
                control: 14,
                stdout: 15,
                stderr: 16,
                channel: 17,
            },
        }
    }

    fn joined(m: &Machine) -> String {
        m.args().join(" ")
    }

    #[test]
    fn no_network_no_defaults_and_qemus_own_sandbox() {
        let a = joined(&machine());
        assert!(a.contains("-nodefaults -no-user-config"));
        assert!(!a.contains("netdev") && !a.contains("-net ") && !a.contains("-nic"));
        assert!(a.contains(
            "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
        ));
        assert!(a.contains("readonly=on"));
    }

    #[test]
    fn ports_and_qmp_use_the_inherited_descriptors() {
        let a = joined(&machine());
        for (fd, name) in [
            (14, "codebox.control"),
            (15, "codebox.stdout"),
            (16, "codebox.stderr"),
            (17, "codebox.channel"),
        ] {
            assert!(a.contains(&format!("fd={fd} ")), "{a}");
            assert!(a.contains(&format!("name={name}")), "{a}");
        }
        assert!(a.contains("socket,id=qmp,fd=13 -mon chardev=qmp,mode=control"));
    }

    #[test]
    fn accelerators_and_memory() {
        let mut m = machine();
        let a = joined(&m);
        assert!(a.contains("-accel tcg,tb-size=64 -cpu max"));
        assert!(a.contains("panic=-1 tsc_early_khz=2596144 tsc=reliable -- guest-init"));
        assert!(a.contains("-m 768M"));
        assert!(!a.contains("memory-backend"));
        m.accel = Accel::Kvm;
        m.ram = Ram::File {
            fd: 18,
            share: false,
        };
        m.incoming = true;
        let a = joined(&m);
        assert!(a.contains("-accel kvm -cpu host,-arch-capabilities"));
        assert!(!a.contains("tsc_early_khz"), "KVM guests have kvmclock");
        assert!(a.contains("mem-path=/proc/self/fd/18,share=off"));
        assert!(a.contains("-machine memory-backend=ram"));
        assert!(a.ends_with("-incoming defer"));
    }
}
