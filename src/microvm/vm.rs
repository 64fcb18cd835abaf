//! One VM on the host: boot handshake, start, and the driver that relays its streams and
//! watches it until it ends.
//!
//! [`boot`] takes a launched jail (`jail.rs`), negotiates QMP, and waits for the guest
//! init's `Hello` (with its build ID, which must be this binary's). [`Vm::start`] sends
//! the sandbox to start and returns the [`MicroVmSandbox`]: the same shape a namespace
//! sandbox has for the layers above (stdout and stderr pipes, the fd-3 socket, a status
//! pipe carrying the init's 8-byte status record), plus the VM's ending. Behind it, the
//! driver task:
//!
//! - relays each port to its upward pipe or socket (`pump.rs`), ending each at the byte
//!   count the guest announced;
//! - reads the control port (bounded frames, `wire.rs`), writes the status record on
//!   `Exited`;
//! - watches QEMU two ways, its process (the jail's pidfd) and its state (QMP events:
//!   `STOP` is followed by `query-status`: a VMM that paused on an internal error, a
//!   guest panic or an I/O error stays alive but is useless), and kills the jail on any
//!   of them, on request, or at the VM's lifetime;
//! - then reaps the jail and reads its cgroup (an OOM kill there means the VMM filled its
//!   memory), and reports a [`VmEnding`].

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};

use super::jail::Jailed;
use super::jail_process::{JailGone, JailWatcher};
use super::pump::{pump, PumpEnd};
use super::qmp::Qmp;
use super::wire::{self, FrameReader, GuestMessage, HostMessage, RunSpec, Stream, Tree};
use super::Error;
use crate::sandbox::{self, CgroupStats, LandlockStatus, ProgramStatus};

/// The console's last bytes kept for error reports.
pub const CONSOLE_TAIL: usize = 16 * 1024;

/// The last bytes of a stream.
#[derive(Debug, Default)]
pub struct Tail {
    bytes: std::collections::VecDeque<u8>,
    total: u64,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        self.bytes.extend(chunk);
        let excess = self.bytes.len().saturating_sub(CONSOLE_TAIL);
        self.bytes.drain(..excess);
    }

    pub fn text(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let mut v = a.to_vec();
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }
}

type SharedTail = Arc<Mutex<Tail>>;

/// Why a VM ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum VmEnd {
    /// The guest reported the program's end; the host stopped the VM.
    Completed,
    /// Killed on request (timeout, cancellation).
    Killed,
    /// The VM outlived its lifetime.
    Lifetime,
    /// QEMU exited by itself (a guest reset or panic with `-no-reboot`, or a crash).
    VmmExited,
    /// The host's OOM killer ended QEMU: the VMM's cgroup (guest RAM + overhead) was full.
    VmmOutOfMemory,
    /// QEMU stopped the guest: `query-status` said why (`internal-error`,
    /// `guest-panicked`, `io-error`, ...).
    VmmStopped { status: String },
    /// The guest init reported a failure.
    GuestFailed { reason: String },
    /// The guest broke the control protocol (a garbled or oversized frame, a message out
    /// of turn).
    ProtocolViolation { reason: String },
    /// The spawner that started the jail is gone, and the jail with it (`serve`).
    SpawnerLost,
}

impl VmEnd {
    /// An end the program itself explains (it finished, or was stopped on purpose).
    pub fn is_normal(&self) -> bool {
        matches!(self, VmEnd::Completed | VmEnd::Killed)
    }

    pub fn describe(&self) -> String {
        match self {
            VmEnd::Completed => "completed".into(),
            VmEnd::Killed => "killed on request".into(),
            VmEnd::Lifetime => "the VM outlived its lifetime and was killed".into(),
            VmEnd::VmmExited => "the VMM (QEMU) exited by itself".into(),
            VmEnd::VmmOutOfMemory => {
                "the VMM (QEMU) was killed by the host's OOM killer: its cgroup's memory \
                 (guest RAM + overhead) was full"
                    .into()
            }
            VmEnd::VmmStopped { status } => {
                format!("the VMM stopped the guest ({status}) and was killed")
            }
            VmEnd::GuestFailed { reason } => format!("the guest init failed: {reason}"),
            VmEnd::ProtocolViolation { reason } => {
                format!("the guest broke the control protocol: {reason}")
            }
            VmEnd::SpawnerLost => {
                "the spawner that started the VM's jail was lost, and the VM with it".into()
            }
        }
    }
}

/// How a VM ended, as the driver saw it.
#[derive(Debug, Clone)]
pub struct VmEnding {
    pub end: VmEnd,
    /// The program's status, when the guest reported one.
    pub status: Option<ProgramStatus>,
    /// The guest's cgroup figures of the program's sandbox.
    pub guest_cgroup: Option<CgroupStats>,
    /// The jail's cgroup figures (QEMU's memory, CPU).
    pub vmm_cgroup: Option<CgroupStats>,
    /// The serial console's and QEMU's stderr's last bytes.
    pub console: String,
    pub qemu_stderr: String,
}

/// A booted VM whose guest init waits for `Start` (or a clone being restored).
pub struct Vm {
    pub(super) jailed: Jailed,
    pub(super) qmp: Qmp,
    control: UnixStream,
    reader: FrameReader,
    console: SharedTail,
    qemu_stderr: SharedTail,
    /// From the launch to the guest's `Hello`.
    pub boot_time: Duration,
    /// Bytes of the program's fd 3 read here before the VM is driven (a template's or a
    /// waiting clone's `codebox/ready`): the guest counts them in fd 3's end, the
    /// driver's pump does not see them.
    pub(super) channel_read_before_drive: u64,
}

fn io_err(doing: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { doing, source }
}

fn tokio_stream(fd: OwnedFd) -> std::io::Result<UnixStream> {
    let s = std::os::unix::net::UnixStream::from(fd);
    s.set_nonblocking(true)?;
    UnixStream::from_std(s)
}

fn pipe_reader(fd: OwnedFd) -> std::io::Result<tokio::net::unix::pipe::Receiver> {
    sandbox::set_nonblocking(std::os::fd::AsFd::as_fd(&fd), true)?;
    tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
}

/// Reads a stream into a tail until it ends.
fn keep_tail(fd: OwnedFd, tail: SharedTail) -> std::io::Result<()> {
    let mut rx = pipe_reader(fd)?;
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n) = rx.read(&mut buf).await {
            if n == 0 {
                break;
            }
            tail.lock().expect("tail").push(&buf[..n]);
        }
    });
    Ok(())
}

/// Reads one control message, within `deadline`.
async fn read_message(
    control: &mut UnixStream,
    reader: &mut FrameReader,
) -> Result<GuestMessage, Error> {
    let mut buf = [0u8; 4096];
    loop {
        let want = reader.want().min(buf.len());
        let n = control
            .read(&mut buf[..want])
            .await
            .map_err(io_err("reading the control port"))?;
        if n == 0 {
            return Err(Error::VmGone("the control port closed".into()));
        }
        match reader.push::<GuestMessage>(&buf[..n]) {
            Ok((_, Some(m))) => return Ok(m),
            Ok((_, None)) => {}
            Err(e) => return Err(Error::Protocol(e.to_string())),
        }
    }
}

/// Takes the jail's console and stderr into tails, negotiates QMP and opens the control
/// port; the guest may not be up yet (a clone is not even running).
pub(super) async fn connect(mut jailed: Jailed, launched: Instant) -> Result<Vm, Error> {
    let console = SharedTail::default();
    let qemu_stderr = SharedTail::default();
    let streams = jailed
        .process
        .take_streams()
        .map_err(io_err("taking the jail's streams"))?;
    keep_tail(streams.console, console.clone()).map_err(io_err("reading the console"))?;
    keep_tail(streams.stderr, qemu_stderr.clone()).map_err(io_err("reading QEMU's stderr"))?;
    let qmp_fd = streams.qmp;
    let control_fd = jailed
        .sockets
        .control
        .try_clone()
        .map_err(io_err("duplicating the control socket"))?;
    let qmp = match Qmp::connect(qmp_fd).await {
        Ok(q) => q,
        Err(e) => {
            // QEMU usually says why on its stderr before it closes QMP.
            tokio::task::yield_now().await;
            return Err(Error::Boot {
                reason: Error::Qmp(e).to_string(),
                console: console.lock().expect("tail").text(),
                qemu_stderr: qemu_stderr.lock().expect("tail").text(),
            });
        }
    };
    let control = tokio_stream(control_fd).map_err(io_err("the control socket"))?;
    Ok(Vm {
        jailed,
        qmp,
        control,
        reader: FrameReader::default(),
        console,
        qemu_stderr,
        boot_time: launched.elapsed(),
        channel_read_before_drive: 0,
    })
}

impl Vm {
    /// A boot failure with the console's and QEMU's last words.
    pub(super) fn failure(&self, e: Error) -> Error {
        Error::Boot {
            reason: e.to_string(),
            console: self.console.lock().expect("tail").text(),
            qemu_stderr: self.qemu_stderr.lock().expect("tail").text(),
        }
    }

    /// Reads one control message.
    pub(super) async fn message(&mut self) -> Result<GuestMessage, Error> {
        read_message(&mut self.control, &mut self.reader).await
    }

    /// Writes one control message.
    pub(super) async fn send(&mut self, m: &HostMessage) -> Result<(), Error> {
        self.control
            .write_all(&wire::encode(m))
            .await
            .map_err(io_err("writing to the control port"))
    }
}

/// QMP, then the guest init's `Hello`, within `limit` of `launched`.
pub async fn boot(
    jailed: Jailed,
    expected_build_id: &str,
    launched: Instant,
    limit: Duration,
) -> Result<Vm, Error> {
    let left = limit.saturating_sub(launched.elapsed());
    let mut vm = match tokio::time::timeout(left, connect(jailed, launched)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::VmGone(format!(
                "QEMU did not answer QMP within {limit:?}"
            )))
        }
    };
    let left = limit.saturating_sub(launched.elapsed());
    let hello = match tokio::time::timeout(left, vm.message()).await {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return Err(vm.failure(e)),
        Err(_) => {
            return Err(vm.failure(Error::VmGone(format!(
                "the guest did not come up within {limit:?}"
            ))))
        }
    };
    match hello {
        GuestMessage::Hello { build_id } if build_id == expected_build_id => {}
        GuestMessage::Hello { build_id } => {
            return Err(Error::BuildMismatch {
                guest: build_id,
                host: expected_build_id.to_string(),
            })
        }
        other => return Err(vm.failure(Error::Protocol(format!("expected Hello, got {other:?}")))),
    }
    vm.boot_time = launched.elapsed();
    Ok(vm)
}

/// Asks a VM's driver to kill it; clonable, idempotent.
#[derive(Clone, Debug, Default)]
pub struct KillHandle(Arc<tokio::sync::Notify>);

impl KillHandle {
    pub fn kill(&self) {
        // A stored permit: the driver sees it even if it is not waiting right now.
        self.0.notify_one();
    }

    async fn killed(&self) {
        self.0.notified().await
    }
}

/// The running program in its VM, as the layers above see any sandbox.
pub struct MicroVmSandbox {
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The supervisor's end of the program's fd 3.
    pub channel: OwnedFd,
    /// The init's status record (`sandbox::report::STATUS_LEN` bytes) once the program
    /// ended; end of file without it when the VM ended without one.
    pub status: OwnedFd,
    pub landlock: Option<LandlockStatus>,
    kill: KillHandle,
    ending: oneshot::Receiver<VmEnding>,
    ended: Option<VmEnding>,
}

impl MicroVmSandbox {
    /// Asks the driver to kill the VM (idempotent).
    pub fn kill(&self) {
        self.kill.kill();
    }

    pub fn kill_handle(&self) -> KillHandle {
        self.kill.clone()
    }

    /// Waits for the VM's end (the jail reaped, its cgroup read and removed). Cancel-safe.
    pub async fn ended(&mut self) -> VmEnding {
        if let Some(e) = &self.ended {
            return e.clone();
        }
        let e = (&mut self.ending).await.unwrap_or_else(|_| VmEnding {
            end: VmEnd::VmmExited,
            status: None,
            guest_cgroup: None,
            vmm_cgroup: None,
            console: String::new(),
            qemu_stderr: String::new(),
        });
        self.ended = Some(e.clone());
        e
    }
}

impl Drop for MicroVmSandbox {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The upward end of an output stream: a pipe (the layers above read pipes).
fn upward_pipe() -> std::io::Result<(OwnedFd, tokio::net::unix::pipe::Sender)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    sandbox::set_nonblocking(std::os::fd::AsFd::as_fd(&w), true)?;
    Ok((r, tokio::net::unix::pipe::Sender::from_owned_fd(w)?))
}

impl Vm {
    /// Sends trees (`snapshot::archive` streams) the next `Start`'s sandbox binds
    /// read-only (`guest/trees.rs`).
    pub async fn send_trees(&mut self, trees: &[(Tree, Vec<u8>)]) -> Result<(), Error> {
        for (tree, stream) in trees {
            for frame in wire::tree_frames(*tree, stream) {
                self.control
                    .write_all(&frame)
                    .await
                    .map_err(io_err("writing to the control port"))?;
            }
        }
        Ok(())
    }

    /// Starts the program; returns once the guest reported it exec'd.
    pub async fn start(
        mut self,
        spec: RunSpec,
        lifetime: Duration,
    ) -> Result<MicroVmSandbox, Error> {
        let time_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut seed = [0u8; 64];
        getrandom::fill(&mut seed).map_err(|e| Error::Io {
            doing: "drawing the guest's seed",
            source: std::io::Error::other(e.to_string()),
        })?;
        let seed: String = seed.iter().map(|b| format!("{b:02x}")).collect();
        self.control
            .write_all(&wire::encode(&HostMessage::Start {
                spec: Box::new(spec),
                time_ns,
                seed,
                deferred: false,
            }))
            .await
            .map_err(io_err("writing to the control port"))?;
        let landlock = match read_message(&mut self.control, &mut self.reader).await {
            Ok(GuestMessage::Started { landlock }) => landlock,
            Ok(GuestMessage::Failed { reason }) => {
                return Err(Error::GuestFailed {
                    reason,
                    console: self.console.lock().expect("tail").text(),
                })
            }
            Ok(other) => return Err(Error::Protocol(format!("expected Started, got {other:?}"))),
            Err(e) => return Err(e),
        };
        self.drive(landlock, lifetime)
    }

    /// Hands the streams upward and starts the driver.
    pub(super) fn drive(
        self,
        landlock: Option<LandlockStatus>,
        lifetime: Duration,
    ) -> Result<MicroVmSandbox, Error> {
        let Vm {
            jailed,
            qmp,
            control,
            reader,
            console,
            qemu_stderr,
            channel_read_before_drive,
            ..
        } = self;
        let Jailed {
            process, sockets, ..
        } = jailed;
        let (stdout_up, stdout_tx) = upward_pipe().map_err(io_err("the stdout pipe"))?;
        let (stderr_up, stderr_tx) = upward_pipe().map_err(io_err("the stderr pipe"))?;
        let (status_up, status_tx) = upward_pipe().map_err(io_err("the status pipe"))?;
        let (channel_up, channel_ours) =
            std::os::unix::net::UnixStream::pair().map_err(io_err("the fd-3 socketpair"))?;
        channel_ours
            .set_nonblocking(true)
            .map_err(io_err("the fd-3 socketpair"))?;
        let channel_ours =
            UnixStream::from_std(channel_ours).map_err(io_err("the fd-3 socketpair"))?;
        let port = |fd: OwnedFd| tokio_stream(fd).map_err(io_err("a port socket"));
        let stdout_port = port(sockets.stdout)?;
        let stderr_port = port(sockets.stderr)?;
        let (chan_port_r, chan_port_w) = port(sockets.channel)?.into_split();
        let (chan_ours_r, chan_ours_w) = channel_ours.into_split();
        // The driver reads its own duplicate (`control`).
        drop(sockets.control);

        let (out_limit_tx, out_limit) = watch::channel(None);
        let (err_limit_tx, err_limit) = watch::channel(None);
        let (up_limit_tx, up_limit) = watch::channel(None);
        let stdout_task = tokio::spawn(pump(stdout_port, stdout_tx, out_limit));
        let stderr_task = tokio::spawn(pump(stderr_port, stderr_tx, err_limit));
        let up_task = tokio::spawn(pump(chan_port_r, chan_ours_w, up_limit));
        // Upper → guest: no count to wait for; its end (the supervisor closed fd 3) is
        // announced to the guest with the bytes sent.
        let (down_done_tx, down_done) = mpsc::channel::<u64>(1);
        let (_never, never_limit) = watch::channel(None);
        tokio::spawn(async move {
            let end = pump(chan_ours_r, chan_port_w, never_limit).await;
            let _ = down_done_tx.send(end.bytes()).await;
            // Keep the sender's twin alive until the pump is done.
            drop(_never);
        });

        let kill = KillHandle::default();
        let (ending_tx, ending_rx) = oneshot::channel();
        let driver = Driver {
            jail: Some(process.watcher()),
            qmp,
            control,
            reader,
            console,
            qemu_stderr,
            status_tx: Some(status_tx),
            limits: [out_limit_tx, err_limit_tx, up_limit_tx],
            outputs: Some((stdout_task, stderr_task)),
            up: up_task,
            channel_before: channel_read_before_drive,
        };
        tokio::spawn(driver.run(kill.clone(), down_done, lifetime, ending_tx));
        Ok(MicroVmSandbox {
            stdout: stdout_up,
            stderr: stderr_up,
            channel: OwnedFd::from(channel_up),
            status: status_up,
            landlock,
            kill,
            ending: ending_rx,
            ended: None,
        })
    }
}

/// What the driver does on a QMP event of a running VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OnEvent {
    Nothing,
    /// The VM stopped (an internal error, a guest panic, an I/O error, or someone's
    /// `stop`): QEMU is alive but the guest is not running; `query-status` says why.
    AskStatus,
    /// The guest reset or shut down (with `-no-reboot` QEMU then exits).
    Ended,
}

pub(super) fn on_event(name: &str) -> OnEvent {
    match name {
        "STOP" | "GUEST_PANICKED" | "BLOCK_IO_ERROR" => OnEvent::AskStatus,
        "SHUTDOWN" | "RESET" => OnEvent::Ended,
        _ => OnEvent::Nothing,
    }
}

/// A `query-status` answer that ends the VM: anything but running.
pub(super) fn on_status(status: &str) -> Option<VmEnd> {
    (status != "running").then(|| VmEnd::VmmStopped {
        status: status.to_string(),
    })
}

/// A VMM that died or stopped with its cgroup's OOM kill recorded filled its memory.
pub(super) fn with_vmm_figures(end: VmEnd, vmm: Option<&CgroupStats>) -> VmEnd {
    match end {
        VmEnd::VmmExited | VmEnd::VmmStopped { .. } if vmm.is_some_and(|c| c.oom_killed) => {
            VmEnd::VmmOutOfMemory
        }
        other => other,
    }
}

struct Driver {
    jail: Option<JailWatcher>,
    qmp: Qmp,
    control: UnixStream,
    reader: FrameReader,
    console: SharedTail,
    qemu_stderr: SharedTail,
    status_tx: Option<tokio::net::unix::pipe::Sender>,
    /// The announced byte counts of stdout, stderr and fd 3 (guest → host).
    limits: [watch::Sender<Option<u64>>; 3],
    outputs: Option<(
        tokio::task::JoinHandle<PumpEnd>,
        tokio::task::JoinHandle<PumpEnd>,
    )>,
    /// fd 3, guest → host: what the program wrote last (a value, output files' last
    /// chunks, `codebox/exit`) is let through before QEMU is killed ([`UP_DRAIN`]).
    up: tokio::task::JoinHandle<PumpEnd>,
    /// fd-3 bytes read before the pump started ([`Vm::channel_read_before_drive`]):
    /// not in the pump's count of the end the guest announces.
    channel_before: u64,
}

/// How long a completed VM's fd 3 may take to deliver what the guest still sends after
/// the program's end (the guest waits as long for it to leave the program's socket).
pub(super) const UP_DRAIN: Duration = Duration::from_secs(2);

impl Driver {
    /// Waits, within [`UP_DRAIN`], for fd 3's upward pump to have passed on everything
    /// the guest announced.
    async fn drain_up(&mut self) {
        if tokio::time::timeout(UP_DRAIN, &mut self.up).await.is_err() {
            tracing::debug!("fd 3 of a completed microVM did not end within the drain bound");
        }
    }

    async fn run(
        mut self,
        kill: KillHandle,
        mut down_done: mpsc::Receiver<u64>,
        lifetime: Duration,
        report: oneshot::Sender<VmEnding>,
    ) {
        let mut jail = self.jail.take().expect("the driver runs once");
        let deadline = tokio::time::sleep(lifetime);
        tokio::pin!(deadline);
        let mut status: Option<ProgramStatus> = None;
        let mut guest_cgroup = None;
        let mut exited = false;
        // Both output streams ended upward (their announced counts went through, or QEMU
        // closed them).
        let (outputs_tx, mut outputs_rx) = oneshot::channel::<()>();
        if let Some((out, err)) = self.outputs.take() {
            tokio::spawn(async move {
                let _ = out.await;
                let _ = err.await;
                let _ = outputs_tx.send(());
            });
        }
        let mut outputs_done = false;
        // The down pump reports fd 3's end once, then its channel is closed: a closed
        // channel is ready at every poll, so it is not polled again (it spun a core for
        // the rest of the run when the proxy closed fd 3 early).
        let mut down_open = true;
        let mut buf = [0u8; 4096];
        let end = loop {
            let want = self.reader.want().min(buf.len());
            tokio::select! {
                _ = &mut outputs_rx, if !outputs_done => {
                    outputs_done = true;
                    if exited {
                        self.drain_up().await;
                        break VmEnd::Completed;
                    }
                }
                _ = kill.killed() => break VmEnd::Killed,
                _ = &mut deadline => break VmEnd::Lifetime,
                gone = jail.exited() => break match gone {
                    JailGone::Exited => VmEnd::VmmExited,
                    JailGone::SpawnerLost => VmEnd::SpawnerLost,
                },
                bytes = down_done.recv(), if down_open => {
                    down_open = false;
                    if let Some(bytes) = bytes {
                        let msg = wire::encode(&HostMessage::Eof { stream: Stream::Channel, bytes });
                        if self.control.write_all(&msg).await.is_err() {
                            break VmEnd::VmmExited;
                        }
                    }
                }
                event = self.qmp.next_event() => match event.map(|e| on_event(&e.name)) {
                    None | Some(OnEvent::Ended) => break VmEnd::VmmExited,
                    Some(OnEvent::AskStatus) => {
                        let s = self.qmp.status().await.unwrap_or_else(|e| e.to_string());
                        if let Some(end) = on_status(&s) {
                            break end;
                        }
                    }
                    Some(OnEvent::Nothing) => {}
                },
                n = self.control.read(&mut buf[..want]) => {
                    let n = match n {
                        Ok(0) | Err(_) => break VmEnd::VmmExited,
                        Ok(n) => n,
                    };
                    match self.reader.push::<GuestMessage>(&buf[..n]) {
                        Err(e) => break VmEnd::ProtocolViolation { reason: e.to_string() },
                        Ok((_, None)) => {}
                        Ok((_, Some(message))) => match message {
                            GuestMessage::Eof { stream, bytes } => {
                                let i = match stream {
                                    Stream::Stdout => 0,
                                    Stream::Stderr => 1,
                                    Stream::Channel => 2,
                                };
                                if self.limits[i].borrow().is_some() {
                                    break VmEnd::ProtocolViolation {
                                        reason: format!("{stream:?} ended twice"),
                                    };
                                }
                                let bytes = match stream {
                                    Stream::Channel => bytes.saturating_sub(self.channel_before),
                                    _ => bytes,
                                };
                                let _ = self.limits[i].send(Some(bytes));
                            }
                            GuestMessage::Exited { .. } if exited => {
                                break VmEnd::ProtocolViolation {
                                    reason: "the program ended twice".into(),
                                };
                            }
                            GuestMessage::Exited { status: s, cgroup } => {
                                status = s;
                                guest_cgroup = cgroup;
                                if let (Some(s), Some(mut tx)) = (s, self.status_tx.take()) {
                                    let _ = tx.write_all(&sandbox::report::encode_status(s)).await;
                                }
                                exited = true;
                                if outputs_done {
                                    self.drain_up().await;
                        break VmEnd::Completed;
                                }
                            }
                            GuestMessage::Failed { reason } => {
                                break VmEnd::GuestFailed { reason };
                            }
                            other => {
                                break VmEnd::ProtocolViolation {
                                    reason: format!("{other:?} out of turn"),
                                };
                            }
                        },
                    }
                }
            }
        };
        // The status pipe ends now either way: a reader learns there is no status.
        self.status_tx = None;
        let vmm_cgroup = jail.finish().await;
        let end = with_vmm_figures(end, vmm_cgroup.as_ref());
        if !end.is_normal() {
            tracing::warn!(end = %end.describe(), "the microVM ended abnormally");
        }
        let ending = VmEnding {
            end,
            status,
            guest_cgroup,
            vmm_cgroup,
            console: self.console.lock().expect("tail").text(),
            qemu_stderr: self.qemu_stderr.lock().expect("tail").text(),
        };
        let _ = report.send(ending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vmm_that_pauses_is_asked_why_and_ended() {
        assert_eq!(on_event("STOP"), OnEvent::AskStatus);
        assert_eq!(on_event("GUEST_PANICKED"), OnEvent::AskStatus);
        assert_eq!(on_event("SHUTDOWN"), OnEvent::Ended);
        assert_eq!(on_event("RTC_CHANGE"), OnEvent::Nothing);
        // KVM's emulation failure leaves QEMU alive, paused, in internal-error.
        assert_eq!(
            on_status("internal-error"),
            Some(VmEnd::VmmStopped {
                status: "internal-error".into()
            })
        );
        assert_eq!(on_status("running"), None);
    }

    #[test]
    fn a_vmm_killed_by_its_cgroup_filled_its_memory() {
        let oom = CgroupStats {
            oom_killed: true,
            ..Default::default()
        };
        assert_eq!(
            with_vmm_figures(VmEnd::VmmExited, Some(&oom)),
            VmEnd::VmmOutOfMemory
        );
        assert_eq!(
            with_vmm_figures(VmEnd::VmmExited, Some(&CgroupStats::default())),
            VmEnd::VmmExited
        );
        // A VM killed on request stays that, whatever its cgroup says.
        assert_eq!(with_vmm_figures(VmEnd::Killed, Some(&oom)), VmEnd::Killed);
    }

    #[test]
    fn tails_keep_the_last_bytes() {
        let mut t = Tail::default();
        t.push(&vec![b'a'; CONSOLE_TAIL]);
        t.push(b"end");
        assert_eq!(t.text().len(), CONSOLE_TAIL);
        assert!(t.text().ends_with("aend"));
    }
}
