//! The supervisor's side of the spawner: async requests, and a sandbox whose program
//! I/O is driven by tokio.

mod run;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch, Notify};

use super::factory::{Factory, Forked};
pub use super::restart::SpawnerStatus;
use super::restart::{replace_when_dead, REPLACEMENT_WAIT};
use super::wire::{self, Request, Response, SpawnSpec, VmmSpec};
use super::{Error, Result};
use crate::sandbox::{Ending, LandlockStatus};

/// How long a sandbox whose fd 3 closed before ready may take to report its exit before
/// it counts as lost with its spawner (a report normally follows within milliseconds).
const LOSS_GRACE: Duration = Duration::from_secs(2);
/// How long a run that ended by its status still reads what the program left on fd 3.
const CHANNEL_DRAIN: Duration = Duration::from_millis(500);

/// What the spawner said of a sandbox it made (see [`Response::Spawned`]).
struct Spawned {
    landlock: Option<LandlockStatus>,
    cgroups: Vec<PathBuf>,
    /// The egress listener came along.
    egress: bool,
    zygote: bool,
    /// A microVM's jail: its four port sockets come last.
    vmm_ports: bool,
    fds: Vec<OwnedFd>,
}

/// A spawned sandbox, or the spawner's error.
type SpawnReply = std::result::Result<Spawned, String>;

#[derive(Default)]
struct Waiters {
    spawned: HashMap<u64, oneshot::Sender<SpawnReply>>,
    exited: HashMap<u64, oneshot::Sender<Ending>>,
    /// Set when the spawner is gone; every waiter is failed.
    closed: bool,
}

/// One spawner process: its socket and who waits for what from it.
pub(super) struct Inner {
    sock: AsyncFd<OwnedFd>,
    /// Its pid, when known (a spawner from the factory).
    pub(super) pid: Option<Pid>,
    waiters: Mutex<Waiters>,
    /// Notified (once, with a stored permit) when its socket reaches end of file.
    pub(super) gone: Notify,
    /// Shared with the client: set on a deliberate shutdown (nothing to report then).
    stopping: Arc<AtomicBool>,
    /// The client's status, where the spawner's zygote events are counted.
    status: Arc<Mutex<SpawnerStatus>>,
}

pub(super) struct Shared {
    pub(super) current: RwLock<Arc<Inner>>,
    next_id: AtomicU64,
    pub(super) stopping: Arc<AtomicBool>,
    /// Whether a dead spawner is replaced (a client made with a factory).
    replaceable: AtomicBool,
    /// Bumped after every replacement.
    pub(super) replaced: watch::Sender<u64>,
    pub(super) status: Arc<Mutex<SpawnerStatus>>,
    /// The factory, for `health` (with one).
    factory: std::sync::OnceLock<Arc<Factory>>,
}

/// A handle on the spawner process. Cheap to clone. With a [`Factory`] (see
/// [`SpawnerClient::with_factory`]) a spawner that dies is replaced: its sandboxes die
/// with it (their inits' lifeline and parent-death signal), the factory removes their
/// cgroups, executions that ran on it get [`Error::Lost`], and later spawns go to the new
/// one (a spawn asked for meanwhile waits for it).
#[derive(Clone)]
pub struct SpawnerClient {
    shared: Arc<Shared>,
}

impl Inner {
    pub(super) fn new(
        sock: OwnedFd,
        pid: Option<Pid>,
        stopping: Arc<AtomicBool>,
        status: Arc<Mutex<SpawnerStatus>>,
    ) -> Result<Arc<Inner>> {
        crate::sandbox::set_nonblocking(sock.as_fd(), true).map_err(|source| Error::Io {
            doing: "setting up the spawner socket",
            source,
        })?;
        let inner = Arc::new(Inner {
            // SAFETY: an OwnedFd's raw descriptor is valid, open and unchanging for as
            // long as the OwnedFd lives, which is as long as the AsyncFd that owns it.
            sock: unsafe { AsyncFd::register(sock) }.map_err(|e| Error::Io {
                doing: "registering the spawner socket",
                source: e.into_parts().1,
            })?,
            pid,
            waiters: Mutex::new(Waiters::default()),
            gone: Notify::new(),
            stopping,
            status,
        });
        tokio::spawn(read_responses(inner.clone()));
        Ok(inner)
    }

    fn closed(&self) -> bool {
        self.waiters.lock().expect("waiters lock").closed
    }

    async fn send(&self, req: &Request) -> Result<()> {
        self.send_with(req, &[]).await
    }

    /// Sends `req` with descriptors (which must stay open until this returns).
    async fn send_with(&self, req: &Request, fds: &[std::os::fd::RawFd]) -> Result<()> {
        loop {
            let mut guard = self.sock.writable().await.map_err(|source| Error::Io {
                doing: "waiting to write to the spawner",
                source,
            })?;
            match guard.try_io(|s| wire::send(s.get_ref().as_fd(), req, fds)) {
                Ok(r) => {
                    return r.map_err(|source| {
                        if matches!(
                            source.raw_os_error(),
                            Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)
                        ) {
                            Error::Gone
                        } else {
                            Error::Io {
                                doing: "writing to the spawner",
                                source,
                            }
                        }
                    })
                }
                Err(_would_block) => continue,
            }
        }
    }

    /// Sends a request without awaiting (for `Drop`): one non-blocking sendmsg.
    fn send_now(&self, req: &Request) {
        let _ = wire::send(self.sock.get_ref().as_fd(), req, &[]);
    }
}

impl SpawnerClient {
    /// Wraps the supervisor's end of the spawner socket; must be called inside a tokio
    /// runtime. Starts the task that routes the spawner's responses. A spawner that dies
    /// stays dead: every later spawn fails with [`Error::Gone`].
    pub fn new(sock: OwnedFd) -> Result<SpawnerClient> {
        Self::build(sock, None)
    }

    /// As [`Self::new`], for a spawner from `factory`; when it dies, the factory forks a
    /// replacement. If that fails three times the process exits with
    /// an error (status 70), for a service manager to restart it: a server that can no
    /// longer create sandboxes should not look alive.
    pub fn with_factory(first: Forked, factory: Arc<Factory>) -> Result<SpawnerClient> {
        let client = Self::build(first.sock, Some(first.pid))?;
        client.shared.replaceable.store(true, Ordering::SeqCst);
        let _ = client.shared.factory.set(factory.clone());
        tokio::spawn(super::factory::watch(
            factory.clone(),
            client.shared.stopping.clone(),
        ));
        tokio::spawn(replace_when_dead(Arc::downgrade(&client.shared), factory));
        Ok(client)
    }

    fn build(sock: OwnedFd, pid: Option<Pid>) -> Result<SpawnerClient> {
        let stopping = Arc::new(AtomicBool::new(false));
        let status = Arc::new(Mutex::new(SpawnerStatus {
            pid: pid.map(Pid::as_raw),
            ..Default::default()
        }));
        let inner = Inner::new(sock, pid, stopping.clone(), status.clone())?;
        Ok(SpawnerClient {
            shared: Arc::new(Shared {
                current: RwLock::new(inner),
                next_id: AtomicU64::new(1),
                stopping,
                replaceable: AtomicBool::new(false),
                replaced: watch::Sender::new(0),
                status,
                factory: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The spawner's state, for `health`.
    pub fn status(&self) -> SpawnerStatus {
        let mut status = self.shared.status.lock().expect("status lock").clone();
        status.factory = self.shared.factory.get().map(|f| f.status());
        status
    }

    /// A deliberate shutdown begins: the spawner's end is expected, not reported, and no
    /// replacement is made.
    pub fn stop(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
    }

    fn current(&self) -> Arc<Inner> {
        self.shared.current.read().expect("spawner lock").clone()
    }

    /// The live spawner; while a dead one is being replaced, waits for the new one.
    async fn live(&self) -> Result<Arc<Inner>> {
        let mut replaced = self.shared.replaced.subscribe();
        let give_up = tokio::time::Instant::now() + REPLACEMENT_WAIT;
        loop {
            let inner = self.current();
            if !inner.closed() || self.shared.stopping.load(Ordering::SeqCst) {
                return Ok(inner);
            }
            if !self.shared.replaceable.load(Ordering::SeqCst) {
                return Err(Error::Gone);
            }
            match tokio::time::timeout_at(give_up, replaced.changed()).await {
                Ok(Ok(())) => continue,
                _ => return Err(Error::Gone),
            }
        }
    }

    /// Asks the spawner for a sandbox running `spec`; resolves once the program runs.
    pub async fn spawn(&self, spec: SpawnSpec) -> Result<RemoteSandbox> {
        let mount = spec
            .workspace_mount
            .as_ref()
            .map(|m| std::os::fd::AsRawFd::as_raw_fd(&*m.0));
        let (sandbox, ports) = self
            .request(
                |id| Request::Spawn {
                    id,
                    spec: Box::new(spec),
                },
                mount.as_slice(),
            )
            .await?;
        if !ports.is_empty() {
            return Err(Error::Protocol("a sandbox came with a microVM's ports"));
        }
        Ok(sandbox)
    }

    /// Asks the spawner for a microVM's jailed QEMU: the jail (its stdout is the serial
    /// console, its fd 3 QMP) and the host ends of the VM's control, stdout, stderr and
    /// fd-3 ports, in that order. `ram`: the guest's RAM file when `vmm.machine` is
    /// file-backed (a template's, or the one a clone maps copy-on-write).
    pub async fn spawn_vmm(
        &self,
        vmm: VmmSpec,
        ram: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<(RemoteSandbox, [OwnedFd; 4])> {
        let ram = ram.map(|fd| std::os::fd::AsRawFd::as_raw_fd(&fd));
        let (sandbox, ports) = self
            .request(
                |id| Request::SpawnVmm {
                    id,
                    vmm: Box::new(vmm),
                },
                ram.as_slice(),
            )
            .await?;
        let ports: [OwnedFd; 4] = ports
            .try_into()
            .map_err(|_| Error::Protocol("a microVM's jail came without its four ports"))?;
        Ok((sandbox, ports))
    }

    /// Sends a spawn request (`make` gives it its id) and waits for the sandbox; the
    /// descriptors beyond the sandbox's own are returned beside it.
    async fn request(
        &self,
        make: impl FnOnce(u64) -> Request,
        fds_out: &[std::os::fd::RawFd],
    ) -> Result<(RemoteSandbox, Vec<OwnedFd>)> {
        let inner = self.live().await?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        {
            let mut w = inner.waiters.lock().expect("waiters lock");
            if w.closed {
                return Err(Error::Gone);
            }
            w.spawned.insert(id, tx);
            w.exited.insert(id, exit_tx);
        }
        // Until the reply is taken, dropping this request forgets its waiters and has the
        // spawner kill whatever it made for it (a spawn still queued is killed once made).
        let mut pending = PendingSpawn {
            inner: Some(inner.clone()),
            id,
        };
        inner.send_with(&make(id), fds_out).await?;
        let reply = rx.await;
        pending.inner = None;
        let Spawned {
            landlock,
            cgroups,
            egress: has_egress,
            zygote,
            vmm_ports,
            mut fds,
        } = match reply.map_err(|_| Error::Lost)? {
            Ok(v) => v,
            Err(message) => {
                inner
                    .waiters
                    .lock()
                    .expect("waiters lock")
                    .exited
                    .remove(&id);
                return Err(Error::Spawn { message });
            }
        };
        let ports = if vmm_ports { wire::VMM_PORT_FDS } else { 0 };
        if fds.len() != wire::SPAWNED_FDS + usize::from(has_egress) + ports {
            return Err(Error::Protocol("spawned without its descriptors"));
        }
        let extra = fds.split_off(fds.len() - ports);
        let egress = if has_egress { fds.pop() } else { None };
        let status = fds.pop().expect("status");
        let channel = fds.pop().expect("channel");
        let stderr = fds.pop().expect("stderr");
        let stdout = fds.pop().expect("stdout");
        let sandbox = RemoteSandbox {
            id,
            spawner: inner,
            stdout: Some(stdout),
            stderr: Some(stderr),
            channel: Some(channel),
            status: Some(status),
            egress,
            landlock,
            cgroups,
            zygote,
            exited: Some(exit_rx),
            started: Instant::now(),
            ended: false,
            until_gone: Vec::new(),
        };
        Ok((sandbox, extra))
    }
}

/// A spawn request in flight: dropped before its reply was taken, it removes its waiters
/// and asks the spawner to kill the sandbox (a `Kill` for an id the spawner does not know,
/// or no longer knows, is ignored; one for a request still queued arrives after it).
struct PendingSpawn {
    inner: Option<Arc<Inner>>,
    id: u64,
}

impl Drop for PendingSpawn {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            {
                let mut w = inner.waiters.lock().expect("waiters lock");
                w.spawned.remove(&self.id);
                w.exited.remove(&self.id);
            }
            inner.send_now(&Request::Kill { id: self.id });
        }
    }
}

async fn read_responses(inner: Arc<Inner>) {
    loop {
        let msg = loop {
            let mut guard = match inner.sock.readable().await {
                Ok(g) => g,
                Err(_) => break None,
            };
            match guard.try_io(|s| wire::recv::<Response>(s.get_ref().as_fd())) {
                Ok(Ok(m)) => break m,
                Ok(Err(e)) => {
                    if !inner.stopping.load(Ordering::SeqCst) {
                        tracing::warn!(?e, "reading from the spawner failed");
                    }
                    break None;
                }
                Err(_would_block) => continue,
            }
        };
        let mut w = inner.waiters.lock().expect("waiters lock");
        match msg {
            Some((
                Response::Spawned {
                    id,
                    landlock,
                    cgroups,
                    egress,
                    zygote,
                    vmm_ports,
                },
                fds,
            )) => {
                let spawned = Spawned {
                    landlock,
                    cgroups,
                    egress,
                    zygote,
                    vmm_ports,
                    fds,
                };
                let delivered = match w.spawned.remove(&id) {
                    Some(tx) => tx.send(Ok(spawned)).is_ok(),
                    None => false,
                };
                if !delivered {
                    // Nobody waits any more (the request was dropped: a cancelled call):
                    // nothing would ever end this sandbox but its deadline. Its
                    // descriptors closed with the message; the spawner kills it now.
                    w.exited.remove(&id);
                    tracing::debug!(sandbox = id, "a sandbox nobody waits for; killing it");
                    inner.send_now(&Request::Kill { id });
                }
            }
            Some((Response::Failed { id, error }, _)) => {
                if let Some(tx) = w.spawned.remove(&id) {
                    let _ = tx.send(Err(error));
                }
            }
            Some((Response::Exited { id, ending }, _)) => {
                // No waiter: the sandbox was dropped before it ended; nothing to report.
                if let Some(tx) = w.exited.remove(&id) {
                    let _ = tx.send(ending);
                }
            }
            Some((Response::Zygote { event }, _)) => {
                drop(w);
                inner
                    .status
                    .lock()
                    .expect("status lock")
                    .zygotes
                    .record(event);
                continue;
            }
            None => {
                // The spawner is gone: fail everyone who waits. Its replacement (if any)
                // logs the event once; a deliberate shutdown logs nothing.
                w.closed = true;
                w.spawned.clear();
                w.exited.clear();
                drop(w);
                tracing::debug!(
                    spawner = inner.pid.map(Pid::as_raw),
                    "the spawner's socket closed"
                );
                inner.gone.notify_one();
                return;
            }
        }
    }
}

/// Serves fd 3 after the boot frame (the tool proxy); dropped when the sandbox ends.
pub type ChannelService = Box<
    dyn FnOnce(
            tokio::net::UnixStream,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send,
>;

/// Who serves fd 3 after the boot frame, and where the runtime's exit notice arrives.
pub struct ChannelServer {
    pub service: ChannelService,
    /// The status of the runtime's `codebox/exit` (see [`RemoteSandbox::run_with_channel`]).
    pub exit_notice: Option<oneshot::Receiver<i32>>,
}

/// Where a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A running sandbox created by the spawner, driven from tokio. Dropping it before the
/// program ended kills the sandbox.
pub struct RemoteSandbox {
    id: u64,
    /// The spawner that made it (a replaced one stays here, dead).
    spawner: Arc<Inner>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    channel: Option<OwnedFd>,
    /// A reader of the init's status pipe: the program's status as soon as the init
    /// reports it, without waiting for the spawner to reap the sandbox and remove its
    /// cgroup (about a millisecond, more while the spawner is busy starting another).
    status: Option<OwnedFd>,
    /// Proxy mode: the egress listener in the sandbox's network namespace (see
    /// [`RemoteSandbox::take_egress_listener`]).
    egress: Option<OwnedFd>,
    landlock: Option<LandlockStatus>,
    cgroups: Vec<PathBuf>,
    /// Forked from the Python zygote.
    zygote: bool,
    exited: Option<oneshot::Receiver<Ending>>,
    started: Instant,
    ended: bool,
    /// Dropped only once the spawner reports the sandbox gone (reaped, cgroup removed):
    /// see [`RemoteSandbox::hold_until_gone`].
    until_gone: Vec<Box<dyn std::any::Any + Send>>,
}

impl RemoteSandbox {
    /// Whether the spawner forked it from the Python zygote.
    pub fn from_zygote(&self) -> bool {
        self.zygote
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn landlock(&self) -> Option<LandlockStatus> {
        self.landlock
    }

    /// Proxy mode: the listening socket on 127.0.0.1 inside the sandbox's network
    /// namespace, for the egress proxy to serve (once). Dropped with the sandbox if nobody
    /// takes it: then the program's connections are refused.
    pub fn take_egress_listener(&mut self) -> Option<OwnedFd> {
        self.egress.take()
    }

    /// The memory the sandbox's cgroup holds now, in bytes (`memory.current` on v2,
    /// `memory.usage_in_bytes` on v1); `None` without a memory controller.
    pub fn memory_bytes(&self) -> Option<u64> {
        cgroup_memory_bytes(&self.cgroups)
    }

    /// Keeps `held` until the spawner reports this sandbox gone: reaped and its cgroup
    /// removed. A result is known (from the status pipe) before that; what limits how
    /// many sandboxes exist at once (an admission slot, the pool's refill) must not be
    /// released until the sandbox really is gone, or the kernel briefly holds more.
    pub fn hold_until_gone(&mut self, held: impl std::any::Any + Send) {
        self.until_gone.push(Box::new(held));
    }

    /// The cgroup's figures, if its directories outlived reading them (else the spawner
    /// may have removed one midway and the figures are partial).
    fn figures_if_still_there(&self) -> Option<Option<crate::sandbox::CgroupStats>> {
        if self.cgroups.is_empty() {
            return Some(None);
        }
        let figures = crate::sandbox::CgroupStats::read_dirs(&self.cgroups);
        if !self.cgroups.iter().all(|d| d.exists()) {
            return None;
        }
        Some(
            figures
                .inspect_err(|e| tracing::warn!(error = %e, sandbox = self.id, "reading the cgroup's figures failed"))
                .ok(),
        )
    }

    /// The host directories of the sandbox's cgroup.
    pub fn cgroup_paths(&self) -> &[PathBuf] {
        &self.cgroups
    }

    /// Waits for the runtime's `codebox/ready` line on fd 3: the interpreter has started,
    /// loaded the codebox runtime and now blocks reading its code. Reads exactly that
    /// line (the runtime writes nothing else before its code arrives).
    pub async fn wait_ready(&mut self) -> Result<()> {
        const READY: &[u8] = b"{\"jsonrpc\":\"2.0\",\"method\":\"codebox/ready\"}\n";
        let io = |doing| move |source| Error::Io { doing, source };
        let channel = std::os::unix::net::UnixStream::from(self.channel.take().expect("channel"));
        channel
            .set_nonblocking(true)
            .map_err(io("setting up fd 3"))?;
        let stream = tokio::net::UnixStream::from_std(channel).map_err(io("setting up fd 3"))?;
        let mut got = Vec::with_capacity(READY.len());
        let read = async {
            let mut byte = [0u8; 1];
            while got.len() < READY.len() {
                stream.readable().await?;
                match stream.try_read(&mut byte) {
                    Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                    Ok(_) => got.push(byte[0]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        };
        let outcome = read.await;
        let std_stream = stream.into_std().map_err(io("taking back fd 3"))?;
        self.channel = Some(OwnedFd::from(std_stream));
        if let Err(source) = outcome {
            // fd 3 closed before ready: either the runtime died on its own (its exit
            // report follows) or the spawner died and took the sandbox along (the report
            // never comes). The second is the restart's to log, once.
            if let Ok(None) = tokio::time::timeout(LOSS_GRACE, self.ended()).await {
                return Err(Error::Lost);
            }
            return Err(Error::Io {
                doing: "waiting for the runtime to be ready",
                source,
            });
        }
        if got != READY {
            return Err(Error::Protocol(
                "the runtime announced something other than ready",
            ));
        }
        Ok(())
    }

    /// Resolves when the sandbox has ended (cancel-safe: awaiting it again after a
    /// cancelled wait still sees the end). `None` when the spawner is gone.
    pub async fn ended(&mut self) -> Option<Ending> {
        let rx = self.exited.as_mut()?;
        let ending = rx.await.ok();
        self.exited = None;
        self.ended = true;
        ending
    }

    /// Kills the sandbox and waits until the spawner has reaped it and removed its cgroup.
    pub async fn kill_and_wait(mut self) -> Option<Ending> {
        if self.ended {
            return None;
        }
        let _ = self.spawner.send(&Request::Kill { id: self.id }).await;
        self.ended().await
    }

    /// Hands over stdout, stderr and fd 3, keeping the exit report here: a microVM's
    /// jail, whose streams are QEMU's console, its stderr and QMP (`microvm::jail_process`).
    pub fn take_streams(&mut self) -> Option<(OwnedFd, OwnedFd, OwnedFd)> {
        Some((
            self.stdout.take()?,
            self.stderr.take()?,
            self.channel.take()?,
        ))
    }

    /// Hands over stdout, stderr, fd 3 and the exit notice (for a keep-alive driver).
    pub(super) fn take_io(&mut self) -> (OwnedFd, OwnedFd, OwnedFd, oneshot::Receiver<Ending>) {
        (
            self.stdout.take().expect("stdout"),
            self.stderr.take().expect("stderr"),
            self.channel.take().expect("channel"),
            self.exited.take().expect("exit receiver"),
        )
    }

    /// Kills the sandbox without waiting (best effort).
    pub(super) fn kill_now(&self) {
        self.spawner.send_now(&Request::Kill { id: self.id });
    }

    /// Gives the sandbox's init `left` from now before it ends the sandbox itself (see
    /// `sandbox/lifeline.rs`); best effort, without waiting.
    pub(super) fn arm_now(&self, left: Duration) {
        self.spawner.send_now(&Request::Arm {
            id: self.id,
            ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
        });
    }

    /// The sandbox's end was seen; dropping it need not kill it.
    pub(super) fn mark_ended(&mut self) {
        self.ended = true;
    }
}

impl Drop for RemoteSandbox {
    fn drop(&mut self) {
        if !self.ended {
            self.kill_now();
        }
        let held = std::mem::take(&mut self.until_gone);
        if let (Some(exited), false, Ok(rt)) = (
            self.exited.take(),
            held.is_empty(),
            tokio::runtime::Handle::try_current(),
        ) {
            // The spawner's exit report releases what was held (or its loss, if the
            // spawner is gone: its sandboxes die with it).
            rt.spawn(async move {
                let _ = exited.await;
                drop(held);
            });
        } else if !self.ended {
            let mut w = self.spawner.waiters.lock().expect("waiters lock");
            w.exited.remove(&self.id);
        }
    }
}

/// The memory a cgroup holds now, in bytes, from whichever of its directories has the
/// memory controller (`memory.current` on v2, `memory.usage_in_bytes` on v1).
pub fn cgroup_memory_bytes(dirs: &[PathBuf]) -> Option<u64> {
    dirs.iter().find_map(|dir| {
        ["memory.current", "memory.usage_in_bytes"]
            .iter()
            .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
            .and_then(|v| v.trim().parse().ok())
    })
}
