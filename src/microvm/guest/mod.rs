//! The guest init: pid 1 of the microVM, `codebox guest-init` (the initramfs's `/init`
//! is the codebox binary itself; `microvm/mod.rs` argues why).
//!
//! One linear procedure, each step logged on the console (the host keeps its tail):
//!
//! 1. the root moved off the initramfs's own mount (`pivot_root` refuses that one),
//!    `/proc`, `/sys`, `/dev` (devtmpfs), the console on fds 0-2;
//! 2. load the modules of `/modules/order` (`finit_module`, in order);
//! 3. wait for the rootfs disk and the four ports to appear;
//! 4. mount the rootfs image read-only (erofs) at `/rootfs`, cgroup v2 at `/sys/fs/cgroup`;
//! 5. open the ports; `Hello` with this binary's build ID; wait for `Start`, restoring
//!    the trees sent before it (`/servers`, `/skills`: `trees.rs`; a deferred start
//!    binds the others empty, and the relay fills them before the `Resume`);
//! 6. set the clock and reseed the kernel's entropy from the host's seed;
//! 7. spawn the program with `sandbox::spawn` — the very code of the namespace backend:
//!    namespaces, cgroup limits, no capabilities, `no_new_privs`, landlock (as far as
//!    this kernel's ABI goes: 6.1 has ABI 3, so no TCP rules and no scopes; the status
//!    says `partially_enforced`), seccomp;
//! 8. relay its stdout, stderr and fd 3 to their ports (`relay.rs`) until it has ended;
//!    send each stream's end and `Exited` with its status and cgroup figures;
//! 9. back to 5's wait for `Start`: the host ends the VM (a guest that powered itself
//!    off could lose what it wrote last, still in the port's queue), or, for a template
//!    of the kernel stage, snapshots it here after a warm-up run.
//!
//! Any failure is reported as `Failed` when the control port is open, then the init
//! waits the same way; the host's deadline ends the VM either way.

mod relay;
mod system;
mod trees;

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use crate::execution::Host;
use crate::microvm::wire::{
    self, FrameReader, GuestMessage, HostMessage, RunSpec, PORT_CHANNEL, PORT_CONTROL, PORT_STDERR,
    PORT_STDOUT,
};
use crate::rootfs::Rootfs;
use crate::sandbox::seccomp::{CompiledFilter, SeccompProfile};
use crate::sandbox::{IdMapping, Program, SecurityPolicy};

/// Where the rootfs image is mounted in the guest.
pub const ROOTFS: &str = "/rootfs";

/// The guest's ports, opened.
pub struct Ports {
    pub control: File,
    pub stdout: File,
    pub stderr: File,
    pub channel: File,
}

/// Runs the guest init; never returns.
pub fn run() -> ! {
    let mut control: Option<File> = None;
    if let Err(e) = main(&mut control) {
        let reason = format!("{e:#}");
        eprintln!("codebox guest-init: {reason}");
        if let Some(c) = control.as_mut() {
            let mut reason = reason;
            reason.truncate(4096);
            let _ = c.write_all(&wire::encode(&GuestMessage::Failed { reason }));
        }
    }
    // 9. The host ends the VM.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn main(control_out: &mut Option<File>) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut clock = system::BootClock::start();
    // 1.
    system::leave_initramfs_root().context("leaving the initramfs's root mount")?;
    system::mount_early().context("mounting /proc, /sys and /dev")?;
    system::console_stdio();
    clock.step("mounts");
    // 2.
    let loaded = system::load_modules(Path::new("/modules")).context("loading modules")?;
    clock.step("modules");
    // 3.
    let ports = system::wait_for_devices(
        &[PORT_CONTROL, PORT_STDOUT, PORT_STDERR, PORT_CHANNEL],
        Duration::from_secs(20),
    )
    .context("waiting for the disk and the ports")?;
    clock.step("devices");
    // 4.
    system::mount_rootfs(ROOTFS).context("mounting the rootfs image")?;
    system::mount_cgroup2().context("mounting cgroup2")?;
    clock.step("rootfs");
    // 5.
    let mut ports = Ports {
        control: system::open_port(&ports, PORT_CONTROL)?,
        stdout: system::open_port(&ports, PORT_STDOUT)?,
        stderr: system::open_port(&ports, PORT_STDERR)?,
        channel: system::open_port(&ports, PORT_CHANNEL)?,
    };
    *control_out = Some(ports.control.try_clone()?);
    let build_id = crate::microvm::build_id::own().unwrap_or_default();
    ports
        .control
        .write_all(&wire::encode(&GuestMessage::Hello { build_id }))?;
    eprintln!(
        "codebox guest-init: up ({} modules) in {}",
        loaded,
        clock.summary()
    );
    let host = guest_host()?;
    // One sandbox per Start. A VM normally runs one and is ended by the host after its
    // Exited; a kernel-stage template runs a warm-up program first and is snapshot here,
    // waiting for the Start each of its clones gets.
    let mut trees = trees::Trees::default();
    loop {
        let (spec, time_ns, seed, deferred) = loop {
            match read_message(&mut ports.control)? {
                HostMessage::Tree { tree, data, end } => trees.take(tree, &data, end)?,
                HostMessage::Start {
                    spec,
                    time_ns,
                    seed,
                    deferred,
                } => break (spec, time_ns, seed, deferred),
                other => anyhow::bail!("expected Start, got {other:?}"),
            }
        };
        // 6.
        system::set_clock(time_ns).context("setting the clock")?;
        system::reseed(&seed).context("reseeding the kernel's entropy")?;
        // 7.
        let (program, policy, limits) = sandbox_parts(spec.as_ref())?;
        let mut sandbox_spec = host.spec(program, None, &limits, &policy);
        let late_trees = trees.bind(&mut sandbox_spec, deferred)?;
        let sandbox = crate::sandbox::spawn(&sandbox_spec, host.cgroups.as_ref())
            .context("starting the sandbox")?;
        // 8.
        relay::run(sandbox, &limits, &mut ports, deferred.then_some(late_trees))?;
    }
}

/// Reads one whole control message (blocking).
pub fn read_message(control: &mut File) -> anyhow::Result<HostMessage> {
    let mut reader = FrameReader::default();
    let mut buf = [0u8; 4096];
    loop {
        let want = reader.want().min(buf.len());
        let n = control.read(&mut buf[..want])?;
        if n == 0 {
            anyhow::bail!("the control port closed");
        }
        let (_, message) = reader.push::<HostMessage>(&buf[..n])?;
        if let Some(m) = message {
            return Ok(m);
        }
    }
}

/// The guest as a sandbox host: the rootfs image (verified on the host: its file's hash
/// is in the guest tree's manifest, and it was made from a fully checked tree), the
/// guest's cgroups, root mapping the sandbox user to an unprivileged id.
fn guest_host() -> anyhow::Result<Host> {
    let rootfs = Rootfs::checked_elsewhere(ROOTFS.into());
    Ok(Host::new(
        rootfs,
        IdMapping::for_current_process(crate::sandbox::idmap::DEFAULT_ROOT_HOST_ID),
    ))
}

/// The program, its policy and its limits from what the host sent.
pub fn sandbox_parts(
    spec: &RunSpec,
) -> anyhow::Result<(Program, SecurityPolicy, crate::sandbox::Limits)> {
    let argv: Vec<&str> = spec.argv.iter().map(String::as_str).collect();
    let mut program = Program::new(&spec.path, &argv, &[], &spec.cwd)?;
    for entry in &spec.env {
        let (k, v) = entry
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("environment entry without '=': {entry:?}"))?;
        program.set_env(&[(k, v)])?;
    }
    let profile: SeccompProfile = spec.seccomp.parse()?;
    let policy = SecurityPolicy {
        landlock: spec.landlock,
        network: spec.network,
        seccomp: Some(CompiledFilter::for_profile(profile)?),
    };
    Ok((program, policy, spec.limits.clone()))
}
