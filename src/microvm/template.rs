//! Warm microVMs: a template booted once, its interpreter loaded and waiting; clones
//! restored from it copy-on-write.
//!
//! **Template.** A memory file (a sealed-later `memfd`: no name in `/dev/shm`, gone with
//! its last descriptor, so nothing can leak there) is the guest's RAM,
//! `memory-backend-file,share=on`: what the guest writes lands in the file. The guest
//! starts the program's sandbox (`Start { deferred: true }`: its deadline not armed
//! yet); the host waits for the runtime's `codebox/ready` on fd 3, stops the VM and
//! migrates its device state (RAM excluded: `x-ignore-shared`) into a second memfd. The
//! template's QEMU is then killed, and both files are sealed (`F_SEAL_WRITE`, `GROW`,
//! `SHRINK`, `SEAL`): nothing, not even a compromised clone, can change them any more.
//!
//! **Clone.** A new jailed QEMU maps the same RAM file `share=off` (`MAP_PRIVATE`: it
//! reads the template's pages from the host's page cache and copies only what it writes)
//! and waits (`-incoming defer`); the host sets `x-ignore-shared`, passes a fresh read
//! descriptor of the state (`getfd`) and `migrate-incoming`s it. Once QEMU reports the
//! guest running (bytes written to a port before the resume are lost, measured), the
//! host sends `Resume` with its clock and a 64-byte seed: the guest init sets the clock,
//! mixes the seed into the kernel's pool and forces a reseed of its generator
//! (`RNDRESEEDCRNG`), arms the program's deadline, and answers `Resumed`. Only then does
//! the boot frame go down fd 3; the runtimes reseed their own generators when it
//! arrives (`boot.py`, `boot.js`). What cannot be reseeded is said in `docs/`: see the
//! hash seed below.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncReadExt;

use super::image::GuestImage;
use super::jail::{self, Jailed};
use super::qemu::{Accel, Machine, Ram};
use super::vm::{self, MicroVmSandbox, Vm};
use super::wire::{GuestMessage, HostMessage, RunSpec};
use super::{run, Error};
use crate::execution::Host;
use crate::runtime::Language;
use crate::sandbox::LandlockStatus;

/// How long a template may take from QEMU's start to the runtime's `codebox/ready`.
pub const TEMPLATE_LIMIT: Duration = Duration::from_secs(180);
/// How long a clone may take to be restored and running.
pub const RESTORE_LIMIT: Duration = Duration::from_secs(60);
/// The longest line the template's runtime may send before `codebox/ready`.
const MAX_READY_LINE: usize = 64 * 1024;

/// How far a template gets before it is snapshot, and so what each clone starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The program's interpreter started, its runtime loaded, waiting on fd 3: a clone
    /// runs the code at once. Every clone shares what the interpreter drew at its start
    /// and cannot draw again: Python's string hash seed, V8's hash seed and
    /// `Math.random` state, the interpreter's address-space layout (as zygote-born
    /// sandboxes do, docs/ZYGOTE.md).
    Interpreter,
    /// The guest booted and its init waiting for `Start`, after a warm-up run of the
    /// same program (so its files are in the guest's page cache): each clone starts its
    /// own interpreter, with its own hash seed and layout, and pays for that start.
    Kernel,
}

/// Timings of a template.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct TemplateFigures {
    /// QEMU's start to the guest init's `Hello`.
    pub boot: Duration,
    /// `Hello` to the runtime's `codebox/ready`.
    pub ready: Duration,
    /// Stop, device state out, QEMU gone, files sealed.
    pub snapshot: Duration,
    pub state_bytes: u64,
}

/// A booted-once template: the RAM and device state its clones restore.
pub struct Template {
    pub language: Language,
    pub stage: Stage,
    /// What its sandbox runs; each clone's program is this one.
    pub spec: RunSpec,
    pub machine: Machine,
    pub landlock: Option<LandlockStatus>,
    pub figures: TemplateFigures,
    /// fd-3 bytes of the program that the guest counts but that were read before its
    /// clones are driven (the ready line an interpreter-stage template sent).
    channel_before: u64,
    ram: OwnedFd,
    state: OwnedFd,
}

fn io_err(doing: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { doing, source }
}

/// A `memfd` of `size` bytes that can be sealed later.
fn memfd(name: &std::ffi::CStr, size: u64) -> std::io::Result<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name and flags; returns a new descriptor.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by no one else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::unistd::ftruncate(&fd, size as i64)?;
    Ok(fd)
}

/// Seals a memfd against every change.
fn seal(fd: &OwnedFd) -> std::io::Result<()> {
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
    // SAFETY: fcntl(F_ADD_SEALS) with an integer argument on a descriptor we own.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A new open file description of a memfd (its own offset), read-only.
fn reopen_read(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(OwnedFd::from(std::fs::File::open(path)?))
}

/// The template's machine: file-backed RAM the guest writes through.
fn template_machine(spec: &RunSpec, accel: Accel) -> Machine {
    let mut m = run::machine_for(&spec.limits, accel);
    m.ram = Ram::File {
        fd: -1,
        share: true,
    };
    m
}

/// A template's machine for `spec` and its RAM file (to be passed to its jail).
pub fn machine_and_ram(spec: &RunSpec, accel: Accel) -> Result<(Machine, OwnedFd), Error> {
    let machine = template_machine(spec, accel);
    let ram = memfd(c"codebox-template-ram", machine.memory_mib << 20)
        .map_err(io_err("creating the template's RAM file"))?;
    Ok((machine, ram))
}

/// How long a template's jail may live.
pub const TEMPLATE_LIFETIME: Duration = Duration::from_secs(TEMPLATE_LIMIT.as_secs() + 60);

/// Starts a template's QEMU (single-threaded callers only): its jail and its RAM file.
pub fn launch(
    host: &Host,
    image: &GuestImage,
    accel: Accel,
    spec: &RunSpec,
) -> Result<(Jailed, OwnedFd), Error> {
    let (machine, ram) = machine_and_ram(spec, accel)?;
    let jailed = jail::launch(
        host,
        &image.dir,
        machine,
        Some(&ram),
        &jail::JailLimits {
            lifetime: TEMPLATE_LIFETIME,
        },
    )?;
    Ok((jailed, ram))
}

/// Reads fd 3's first line from the template's program (through its port), which must
/// be `codebox/ready`; the bytes read (which the guest counts in fd 3's end).
async fn wait_ready(channel: &OwnedFd) -> Result<u64, Error> {
    let dup = channel.try_clone().map_err(io_err("the channel port"))?;
    let std = std::os::unix::net::UnixStream::from(dup);
    std.set_nonblocking(true)
        .map_err(io_err("the channel port"))?;
    let mut s = tokio::net::UnixStream::from_std(std).map_err(io_err("the channel port"))?;
    let mut line = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        // Byte counts only: nothing past the first newline is read.
        let n = s
            .read(&mut buf[..1])
            .await
            .map_err(io_err("reading the template's fd 3"))?;
        if n == 0 {
            return Err(Error::VmGone(
                "the template's fd 3 closed before ready".into(),
            ));
        }
        if buf[0] == b'\n' {
            break;
        }
        line.push(buf[0]);
        if line.len() > MAX_READY_LINE {
            return Err(Error::Protocol("an endless first line on fd 3".into()));
        }
    }
    let text = String::from_utf8_lossy(&line);
    if !text.contains("\"codebox/ready\"") {
        return Err(Error::Protocol(format!(
            "the template's runtime said {text:.200} instead of ready"
        )));
    }
    Ok(line.len() as u64 + 1)
}

/// Polls `query-migrate` until `completed` (or fails).
async fn migration_done(qmp: &super::qmp::Qmp, limit: Duration) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        let v = qmp
            .execute("query-migrate", None)
            .await
            .map_err(Error::Qmp)?;
        match v.get("status").and_then(|s| s.as_str()).unwrap_or("") {
            "completed" => return Ok(()),
            "failed" | "cancelled" => {
                return Err(Error::VmGone(format!(
                    "migration {}: {}",
                    v["status"],
                    v.get("error-desc").and_then(|d| d.as_str()).unwrap_or("")
                )))
            }
            _ => {}
        }
        if start.elapsed() > limit {
            return Err(Error::VmGone(format!("migration not done after {limit:?}")));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs an empty program through the started runtime and waits for the guest to report
/// its end:
/// the program's files are then in the guest's page cache, and the guest init waits for
/// the next `Start`.
async fn warm_up(vm: &mut Vm) -> Result<(), Error> {
    use tokio::io::AsyncWriteExt;
    let frame = crate::runtime::ephemeral(crate::runtime::boot_frame(""));
    let mut drains = Vec::new();
    for fd in [
        &vm.jailed.sockets.stdout,
        &vm.jailed.sockets.stderr,
        &vm.jailed.sockets.channel,
    ] {
        let dup = fd.try_clone().map_err(io_err("a port socket"))?;
        let std = std::os::unix::net::UnixStream::from(dup);
        std.set_nonblocking(true).map_err(io_err("a port socket"))?;
        let mut s = tokio::net::UnixStream::from_std(std).map_err(io_err("a port socket"))?;
        drains.push(tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
        }));
    }
    {
        let dup = vm
            .jailed
            .sockets
            .channel
            .try_clone()
            .map_err(io_err("the channel port"))?;
        let std = std::os::unix::net::UnixStream::from(dup);
        std.set_nonblocking(true)
            .map_err(io_err("the channel port"))?;
        let mut s = tokio::net::UnixStream::from_std(std).map_err(io_err("the channel port"))?;
        s.write_all(&frame)
            .await
            .map_err(io_err("writing the warm-up code"))?;
    }
    let result = loop {
        match vm.message().await {
            Ok(GuestMessage::Eof { .. }) => {}
            Ok(GuestMessage::Exited { status, .. }) => {
                break match status {
                    Some(crate::sandbox::ProgramStatus::Exited(0)) => Ok(()),
                    other => Err(Error::VmGone(format!("the warm-up run ended {other:?}"))),
                };
            }
            Ok(GuestMessage::Failed { reason }) => break Err(Error::VmGone(reason)),
            Ok(other) => break Err(Error::Protocol(format!("{other:?} during the warm-up"))),
            Err(e) => break Err(e),
        }
    };
    for d in drains {
        d.abort();
    }
    result
}

async fn ignore_shared(qmp: &super::qmp::Qmp) -> Result<(), Error> {
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]})),
    )
    .await
    .map_err(Error::Qmp)?;
    Ok(())
}

/// Boots the template to `codebox/ready`, saves its device state, ends its QEMU and
/// seals both files.
///
/// `build_id`: the guest init's build the host expects in its `Hello`
/// (`GuestImage::check_build` for the codebox binary itself).
pub async fn make(
    jailed: Jailed,
    ram: OwnedFd,
    build_id: &str,
    language: Language,
    spec: RunSpec,
    stage: Stage,
    launched: Instant,
) -> Result<Template, Error> {
    let machine = jailed.machine.clone();
    let mut vm = vm::boot(jailed, build_id, launched, TEMPLATE_LIMIT).await?;
    let boot = vm.boot_time;
    vm.send(&HostMessage::Start {
        spec: Box::new(spec.clone()),
        time_ns: now_ns(),
        seed: seed_hex()?,
        // An interpreter-stage program is handed out in each clone (its trees come then).
        deferred: stage == Stage::Interpreter,
    })
    .await?;
    let landlock = match vm.message().await {
        Ok(GuestMessage::Started { landlock }) => landlock,
        Ok(GuestMessage::Failed { reason }) => {
            return Err(vm.failure(Error::VmGone(format!("the guest failed: {reason}"))))
        }
        Ok(other) => return Err(Error::Protocol(format!("expected Started, got {other:?}"))),
        Err(e) => return Err(vm.failure(e)),
    };
    let left = TEMPLATE_LIMIT.saturating_sub(launched.elapsed());
    let ready_bytes = match tokio::time::timeout(left, wait_ready(&vm.jailed.sockets.channel)).await
    {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(vm.failure(e)),
        Err(_) => {
            return Err(vm.failure(Error::VmGone(
                "the template's runtime never got ready".into(),
            )))
        }
    };
    if stage == Stage::Kernel {
        let left = TEMPLATE_LIMIT.saturating_sub(launched.elapsed());
        match tokio::time::timeout(left, warm_up(&mut vm)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(vm.failure(e)),
            Err(_) => return Err(vm.failure(Error::VmGone("the warm-up run did not end".into()))),
        }
    }
    let ready = launched.elapsed().saturating_sub(boot);
    let snap_started = Instant::now();
    ignore_shared(&vm.qmp).await?;
    vm.qmp.execute("stop", None).await.map_err(Error::Qmp)?;
    // The device state: a few hundred KiB; the file grows as QEMU writes it.
    let state = memfd(c"codebox-template-state", 0).map_err(io_err("creating the state file"))?;
    vm.qmp
        .execute_with_fd(
            "getfd",
            Some(json!({"fdname": "state"})),
            Some(std::os::fd::AsFd::as_fd(&state)),
        )
        .await
        .map_err(Error::Qmp)?;
    vm.qmp
        .execute("migrate", Some(json!({"uri": "fd:state"})))
        .await
        .map_err(Error::Qmp)?;
    migration_done(&vm.qmp, Duration::from_secs(60)).await?;
    // The template's QEMU is done: kill and reap it before sealing (a writable shared
    // mapping of the RAM file would keep F_SEAL_WRITE from taking).
    let Vm { jailed, .. } = vm;
    // On this thread for a local jail: a killed QEMU is reaped at once, and a
    // blocking-pool thread would make this process multi-threaded, where no later jail
    // may be cloned.
    jailed.process.finish().await;
    seal(&ram).map_err(io_err("sealing the template's RAM"))?;
    let state_bytes = std::fs::metadata(format!("/proc/self/fd/{}", state.as_raw_fd()))
        .map(|m| m.len())
        .unwrap_or(0);
    seal(&state).map_err(io_err("sealing the template's state"))?;
    Ok(Template {
        language,
        stage,
        spec,
        machine,
        landlock,
        // An interpreter-stage clone's relay counted the ready line read here; a kernel
        // stage's program ended with the warm-up, and each clone's relay starts at 0.
        channel_before: match stage {
            Stage::Interpreter => ready_bytes,
            Stage::Kernel => 0,
        },
        figures: TemplateFigures {
            boot,
            ready,
            snapshot: snap_started.elapsed(),
            state_bytes,
        },
        ram,
        state,
    })
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn seed_hex() -> Result<String, Error> {
    let mut b = [0u8; 64];
    getrandom::fill(&mut b).map_err(|e| Error::Io {
        doing: "drawing a clone's seed",
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl Template {
    /// A clone's machine: the template's RAM file mapped copy-on-write ([`Self::ram`]),
    /// waiting for the template's state.
    pub fn clone_machine(&self) -> Machine {
        let mut machine = self.machine.clone();
        machine.ram = Ram::File {
            fd: -1,
            share: false,
        };
        machine.incoming = true;
        machine
    }

    /// The sealed RAM file each clone maps.
    pub fn ram(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.ram)
    }

    /// How long a clone's jail may live when its program's timeout is `timeout`.
    pub fn clone_lifetime(timeout: Duration) -> Duration {
        RESTORE_LIMIT + timeout + Duration::from_secs(60)
    }

    /// Starts a clone's QEMU, waiting for the template's state (single-threaded callers
    /// only).
    pub fn launch_clone(&self, host: &Host, image: &GuestImage) -> Result<Jailed, Error> {
        jail::launch(
            host,
            &image.dir,
            self.clone_machine(),
            Some(&self.ram),
            &jail::JailLimits {
                lifetime: Self::clone_lifetime(self.spec.limits.timeout),
            },
        )
    }

    /// Restores a launched clone and hands it over like any sandbox: its program waits
    /// for the boot frame on fd 3. `lifetime`: the VM's longest life from now.
    pub async fn restore(
        &self,
        jailed: Jailed,
        launched: Instant,
        lifetime: Duration,
    ) -> Result<(MicroVmSandbox, Duration), Error> {
        self.restore_for(jailed, launched, lifetime, None, &[])
            .await
    }

    /// [`Self::restore`] of a clone with `trees` bound read-only in its sandbox and, for
    /// a kernel-stage clone, whose program is `spec` (the template's own when `None`: a
    /// call's differs by its timeout). An interpreter-stage clone runs the template's
    /// program as it is: its trees fill the empty mounts that program was started with.
    pub async fn restore_for(
        &self,
        jailed: Jailed,
        launched: Instant,
        lifetime: Duration,
        spec: Option<RunSpec>,
        trees: &[(super::wire::Tree, Vec<u8>)],
    ) -> Result<(MicroVmSandbox, Duration), Error> {
        if self.stage == Stage::Interpreter && spec.is_some() {
            return Err(Error::Unsupported(
                "another program for an interpreter-stage clone".into(),
            ));
        }
        let spec = self.program_for(spec)?;
        let mut vm = vm::connect(jailed, launched).await?;
        let restore = async {
            self.resume_state(&mut vm).await?;
            match self.stage {
                // The program waits for its code: the trees, the clock and entropy first.
                Stage::Interpreter => {
                    vm.channel_read_before_drive = self.channel_before;
                    vm.send_trees(trees).await?;
                    resume(&mut vm, None).await.map(|()| self.landlock)
                }
                // The guest init waits for Start: the program is started now, after the
                // clock and the kernel's entropy are set (as in a cold VM).
                Stage::Kernel => {
                    vm.send_trees(trees).await?;
                    start(&mut vm, &spec, false).await
                }
            }
        };
        let landlock = match tokio::time::timeout(RESTORE_LIMIT, restore).await {
            Ok(Ok(landlock)) => landlock,
            Ok(Err(e)) => return Err(vm.failure(e)),
            Err(_) => {
                return Err(vm.failure(Error::VmGone("the clone did not resume in time".into())))
            }
        };
        let took = launched.elapsed();
        Ok((vm.drive(landlock, lifetime)?, took))
    }

    /// Restores a launched clone to a program waiting to be handed out (what a warm pool
    /// keeps): an interpreter-stage clone as its template left it; a kernel-stage one
    /// with the template's program started (deferred: no deadline, its trees to come)
    /// and its `codebox/ready` read. [`WaitingClone::hand_out`] then gives it its trees,
    /// its clock, entropy and deadline.
    pub async fn restore_waiting(
        &self,
        jailed: Jailed,
        launched: Instant,
    ) -> Result<WaitingClone, Error> {
        let mut vm = match tokio::time::timeout(RESTORE_LIMIT, vm::connect(jailed, launched)).await
        {
            Ok(vm) => vm?,
            Err(_) => {
                return Err(Error::VmGone(format!(
                    "a clone's QEMU did not answer QMP within {RESTORE_LIMIT:?}"
                )))
            }
        };
        let restore = async {
            self.resume_state(&mut vm).await?;
            match self.stage {
                Stage::Interpreter => {
                    vm.channel_read_before_drive = self.channel_before;
                    Ok(self.landlock)
                }
                Stage::Kernel => {
                    let landlock = start(&mut vm, &self.spec, true).await?;
                    let ready = wait_ready(&vm.jailed.sockets.channel).await?;
                    vm.channel_read_before_drive = ready;
                    Ok(landlock)
                }
            }
        };
        match tokio::time::timeout(RESTORE_LIMIT, restore).await {
            Ok(Ok(landlock)) => Ok(WaitingClone {
                vm,
                landlock,
                restored: launched.elapsed(),
            }),
            Ok(Err(e)) => Err(vm.failure(e)),
            Err(_) => Err(vm.failure(Error::VmGone("the clone did not resume in time".into()))),
        }
    }

    /// The program a clone runs: `spec` if it differs from the template's by the
    /// timeout only.
    fn program_for(&self, spec: Option<RunSpec>) -> Result<RunSpec, Error> {
        if let Some(s) = &spec {
            if !self.runs(s) {
                return Err(Error::Unsupported(
                    "a clone whose program differs from its template's beyond the timeout".into(),
                ));
            }
        }
        Ok(spec.unwrap_or_else(|| self.spec.clone()))
    }

    /// Whether a clone of this template can run `spec`: the machine and the sandbox are
    /// the template's, only the timeout may differ.
    pub fn runs(&self, spec: &RunSpec) -> bool {
        let mut same = spec.clone();
        same.limits.timeout = self.spec.limits.timeout;
        same == self.spec
    }

    /// Brings a launched clone's QEMU from the template's state to running.
    async fn resume_state(&self, vm: &mut Vm) -> Result<(), Error> {
        ignore_shared(&vm.qmp).await?;
        let state = reopen_read(&self.state).map_err(io_err("reopening the state"))?;
        vm.qmp
            .execute_with_fd(
                "getfd",
                Some(json!({"fdname": "state"})),
                Some(std::os::fd::AsFd::as_fd(&state)),
            )
            .await
            .map_err(Error::Qmp)?;
        vm.qmp
            .execute("migrate-incoming", Some(json!({"uri": "fd:state"})))
            .await
            .map_err(Error::Qmp)?;
        // The template was stopped before its state was saved, and the global state
        // section carries that: the clone arrives paused and is continued here. Running
        // means resumed: the port's bytes are not lost from here on.
        migration_done(&vm.qmp, RESTORE_LIMIT).await?;
        vm.qmp.execute("cont", None).await.map_err(Error::Qmp)?;
        loop {
            let status = vm.qmp.status().await.map_err(Error::Qmp)?;
            match status.as_str() {
                "running" => return Ok(()),
                "paused" => {}
                other => return Err(Error::VmGone(format!("the clone is {other}"))),
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// `Start`s `spec` in a guest init waiting for it; the landlock status it reports.
async fn start(
    vm: &mut Vm,
    spec: &RunSpec,
    deferred: bool,
) -> Result<Option<LandlockStatus>, Error> {
    vm.send(&HostMessage::Start {
        spec: Box::new(spec.clone()),
        time_ns: now_ns(),
        seed: seed_hex()?,
        deferred,
    })
    .await?;
    match vm.message().await? {
        GuestMessage::Started { landlock } => Ok(landlock),
        GuestMessage::Failed { reason } => {
            Err(Error::VmGone(format!("the clone failed: {reason}")))
        }
        other => Err(Error::Protocol(format!("expected Started, got {other:?}"))),
    }
}

/// Hands a deferred program out: its clock, the kernel's entropy and its deadline
/// (`timeout`, else its spec's), answered by `Resumed`.
async fn resume(vm: &mut Vm, timeout: Option<Duration>) -> Result<(), Error> {
    vm.send(&HostMessage::Resume {
        time_ns: now_ns(),
        seed: seed_hex()?,
        timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    })
    .await?;
    match vm.message().await? {
        GuestMessage::Resumed => Ok(()),
        GuestMessage::Failed { reason } => {
            Err(Error::VmGone(format!("the clone failed: {reason}")))
        }
        other => Err(Error::Protocol(format!("expected Resumed, got {other:?}"))),
    }
}

/// How long handing out a waiting clone may take (trees, `Resume`, `Resumed`), beyond
/// a second per MiB of trees.
pub const HAND_OUT_LIMIT: Duration = Duration::from_secs(10);

/// [`HAND_OUT_LIMIT`] for `tree_bytes` of trees.
pub fn hand_out_limit(tree_bytes: usize) -> Duration {
    HAND_OUT_LIMIT + Duration::from_secs(tree_bytes.div_ceil(1 << 20) as u64)
}

/// A restored clone whose program waits to be handed out ([`Template::restore_waiting`]).
pub struct WaitingClone {
    vm: Vm,
    landlock: Option<LandlockStatus>,
    /// From its launch to waiting.
    pub restored: Duration,
}

impl WaitingClone {
    /// Hands the clone out: `trees` fill its sandbox's empty mounts, its clock, entropy
    /// and deadline (`timeout`) are set, and it is driven like any sandbox for at most
    /// `lifetime`. `held` (the call's admission) moves into the jail, released when the
    /// spawner reports it gone, once the guest answered; on an error before that it is
    /// left in place, and the clone is reaped before this returns.
    pub async fn hand_out(
        mut self,
        trees: &[(super::wire::Tree, Vec<u8>)],
        timeout: Duration,
        lifetime: Duration,
        held: &mut Option<Box<dyn std::any::Any + Send>>,
    ) -> Result<MicroVmSandbox, Error> {
        let limit = hand_out_limit(trees.iter().map(|(_, t)| t.len()).sum());
        let exchange = async {
            self.vm.send_trees(trees).await?;
            resume(&mut self.vm, Some(timeout)).await
        };
        let failed = match tokio::time::timeout(limit, exchange).await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(self.vm.failure(e)),
            Err(_) => Some(self.vm.failure(Error::VmGone(format!(
                "a waiting clone did not take its code within {limit:?}"
            )))),
        };
        if let Some(e) = failed {
            // Gone before the caller boots another VM under the same admission.
            self.finish().await;
            return Err(e);
        }
        if let Some(h) = held.take() {
            self.vm.jailed.process.hold_until_gone(h);
        }
        self.vm.drive(self.landlock, lifetime)
    }

    /// Kills the clone and waits until its jail is reaped.
    pub async fn finish(self) {
        self.vm.jailed.process.finish().await;
    }
}
