//! The spawner process: a single-threaded loop that creates sandboxes on request and
//! reports when they end.
//!
//! It is forked before the supervisor starts any thread, so it may clone sandboxes (the
//! child of a clone runs ordinary code). For each sandbox it keeps the [`Watch`] (only
//! the cloning process can reap the init) and passes the program's I/O descriptors to
//! the supervisor. When the supervisor goes away (end of file on the socket), every
//! sandbox is killed and reaped, every cgroup removed, and the spawner exits.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::wire::{self, Request, Response, SpawnNetwork, SpawnSpec, VmmSpec};
use super::zygotes::{self, Zygotes};
use crate::egress::NetworkSection;
use crate::execution::Host;
use crate::profile::Profile;
use crate::sandbox::zygote::{PendingFork, Progress};
use crate::sandbox::{self, NetworkAccess, SandboxSpec, Watch};

/// Serves requests on `sock` until the supervisor closes it; returns when every sandbox
/// is gone.
pub fn serve(sock: OwnedFd, host: &Host) {
    let mut live: HashMap<u64, Watch> = HashMap::new();
    // Each profile is loaded (and its seccomp filter compiled) once, not per sandbox.
    let mut profiles: HashMap<String, Profile> = HashMap::new();
    let mut zygotes = Zygotes::new(host.zygote);
    // Forks from a zygote whose child is not ready yet, with the spec to start cold if
    // the fork fails.
    let mut pending: HashMap<u64, (PendingFork, SandboxSpec)> = HashMap::new();
    loop {
        let ids: Vec<u64> = live.keys().copied().collect();
        let mut pfds = vec![PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
        pfds.extend(
            ids.iter()
                .map(|id| PollFd::new(live[id].pidfd(), PollFlags::POLLIN)),
        );
        let forks: Vec<u64> = pending.keys().copied().collect();
        pfds.extend(
            forks
                .iter()
                .map(|id| PollFd::new(pending[id].0.poll_fd(), PollFlags::POLLIN)),
        );
        let zygote_fds = zygotes.poll_fds();
        let zygote_events: Vec<zygotes::Event> = zygote_fds.iter().map(|(_, e)| *e).collect();
        pfds.extend(
            zygote_fds
                .iter()
                .map(|(fd, _)| PollFd::new(*fd, PollFlags::POLLIN)),
        );
        // A zygote still loading is checked for its time limit now and then, a fork under
        // way at its deadline.
        let next_deadline = pending.values().map(|(p, _)| p.deadline()).min();
        let timeout = match (next_deadline, zygote_events.is_empty()) {
            (Some(at), _) => {
                let left = at.saturating_duration_since(std::time::Instant::now());
                PollTimeout::try_from(left.max(std::time::Duration::from_millis(1)))
                    .unwrap_or(PollTimeout::MAX)
            }
            (None, true) => PollTimeout::NONE,
            (None, false) => PollTimeout::from(5_000u16),
        };
        match poll(&mut pfds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::error!(?e, "spawner poll failed");
                break;
            }
        }
        let ready: Vec<bool> = pfds
            .iter()
            .map(|p| p.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(pfds);
        drop(zygote_fds);
        for (i, id) in ids.iter().enumerate() {
            if ready[i + 1] {
                let watch = live.remove(id).expect("live sandbox");
                zygotes.child_ended(*id);
                report_exit(&sock, *id, watch);
            }
        }
        for (i, id) in forks.iter().enumerate() {
            let (mut fork, spec) = pending.remove(id).expect("pending fork");
            let progress = if ready[1 + ids.len() + i] {
                fork.advance()
            } else if std::time::Instant::now() >= fork.deadline() {
                Progress::Failed(fork.expire())
            } else {
                pending.insert(*id, (fork, spec));
                continue;
            };
            match progress {
                Progress::Waiting => {
                    pending.insert(*id, (fork, spec));
                }
                Progress::Ready(sandbox) => {
                    if let Some(watch) = hand_over(&sock, *id, sandbox) {
                        live.insert(*id, watch);
                    } else {
                        zygotes.child_ended(*id);
                    }
                }
                Progress::Failed(e) => {
                    tracing::warn!(id, error = %crate::error_chain::error_chain(&e), "a fork from the zygote failed; starting the sandbox cold");
                    zygotes.fork_failed(*id, &e);
                    if let Some(watch) = spawn_cold(&sock, host, *id, &spec) {
                        live.insert(*id, watch);
                    }
                }
            }
        }
        let fired: Vec<zygotes::Event> = zygote_events
            .iter()
            .enumerate()
            .filter(|(i, _)| ready[1 + ids.len() + forks.len() + i])
            .map(|(_, e)| *e)
            .collect();
        zygotes.handle(&fired);
        send_zygote_events(&sock, &mut zygotes);
        if ready[0] {
            match wire::recv::<Request>(sock.as_fd()) {
                Ok(Some((Request::Spawn { id, spec }, fds))) => {
                    // At most one descriptor comes with a spawn: the workspace mount. Ours
                    // closes once the sandbox's init holds its own copy.
                    let mount = fds.first().map(AsRawFd::as_raw_fd);
                    match spawn_one(&sock, host, &mut profiles, &mut zygotes, id, &spec, mount) {
                        Spawning::Ready(watch) => {
                            live.insert(id, watch);
                        }
                        Spawning::Forking(fork) => {
                            pending.insert(id, *fork);
                        }
                        Spawning::Failed => {}
                    }
                }
                Ok(Some((Request::SpawnVmm { id, vmm }, fds))) => {
                    // At most one descriptor: the guest's RAM file (a template's, or the
                    // one a clone maps copy-on-write). Ours closes once QEMU holds it.
                    let ram = fds.into_iter().next();
                    if let Some(watch) = spawn_vmm(&sock, host, id, &vmm, ram.as_ref()) {
                        live.insert(id, watch);
                    }
                }
                Ok(Some((Request::Kill { id }, _))) => {
                    if let Some(w) = live.get(&id) {
                        if let Err(e) = w.kill() {
                            tracing::error!(?e, id, "kill failed");
                        }
                    }
                }
                Ok(Some((Request::Arm { id, ms }, _))) => {
                    if let Some(w) = live.get(&id) {
                        if let Err(e) = w.arm(std::time::Duration::from_millis(ms)) {
                            tracing::warn!(?e, id, "arming a sandbox failed");
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(?e, "bad spawner request");
                    break;
                }
            }
            // A spawn may have launched (or replaced) a zygote.
            send_zygote_events(&sock, &mut zygotes);
        }
    }
    // The supervisor is gone: nothing of ours may outlive it.
    pending.clear();
    zygotes.shutdown();
    for (id, watch) in live.drain() {
        let _ = watch.kill();
        if let Err(e) = watch.finish() {
            tracing::error!(?e, id, "clean-up after the supervisor left failed");
        }
    }
}

/// What became of a spawn request.
enum Spawning {
    Ready(Watch),
    /// Forked from a zygote; ready when the fork completes (the spec starts it cold if
    /// the fork fails).
    Forking(Box<(PendingFork, SandboxSpec)>),
    /// Failed, and the supervisor was told.
    Failed,
}

fn spawn_one(
    sock: &OwnedFd,
    host: &Host,
    profiles: &mut HashMap<String, Profile>,
    zygotes: &mut Zygotes,
    id: u64,
    spec: &SpawnSpec,
    mount: Option<std::os::fd::RawFd>,
) -> Spawning {
    let built = match build(host, profiles, spec, mount) {
        Ok(built) => built,
        Err(error) => {
            tracing::warn!(id, %error, "spawn failed");
            let _ = wire::send(sock.as_fd(), &Response::Failed { id, error }, &[]);
            return Spawning::Failed;
        }
    };
    // Every Python sandbox a zygote can serve is forked from one: a pooled one (which
    // waits for its code) from the zygote that preloaded the data set, warmed up before it
    // says ready; one a call waits for from the zygote of its kind without the data set,
    // whose fork copies little (see `build`).
    let fork = zygotes.start_fork(id, &built, host.cgroups.as_ref(), spec.pooled);
    if let Some(fork) = fork {
        return Spawning::Forking(Box::new((fork, built)));
    }
    match spawn_cold(sock, host, id, &built) {
        Some(watch) => Spawning::Ready(watch),
        None => Spawning::Failed,
    }
}

/// Clones a sandbox for `spec` and hands it over; tells the supervisor when it fails.
fn spawn_cold(sock: &OwnedFd, host: &Host, id: u64, spec: &SandboxSpec) -> Option<Watch> {
    match sandbox::spawn(spec, host.cgroups.as_ref()) {
        Ok(sandbox) => hand_over(sock, id, sandbox),
        Err(e) => {
            let error = format!("{:#}", anyhow::Error::new(e));
            tracing::warn!(id, %error, "spawn failed");
            let _ = wire::send(sock.as_fd(), &Response::Failed { id, error }, &[]);
            None
        }
    }
}

/// Starts a microVM's jailed QEMU and hands it over with the host ends of its ports;
/// tells the supervisor when it fails.
fn spawn_vmm(
    sock: &OwnedFd,
    host: &Host,
    id: u64,
    vmm: &VmmSpec,
    ram: Option<&OwnedFd>,
) -> Option<Watch> {
    let limits = crate::microvm::jail::JailLimits {
        lifetime: std::time::Duration::from_millis(vmm.lifetime_ms),
    };
    match crate::microvm::jail::launch(host, &vmm.guest_dir, vmm.machine.clone(), ram, &limits) {
        Ok(jailed) => {
            let crate::microvm::jail_process::JailProcess::Local(sandbox) = jailed.process else {
                unreachable!("jail::launch clones the jail here");
            };
            let ports = jailed.sockets;
            hand_over_with(
                sock,
                id,
                sandbox,
                &[&ports.control, &ports.stdout, &ports.stderr, &ports.channel],
            )
        }
        Err(e) => {
            let error = crate::error_chain::error_chain(&e);
            tracing::warn!(id, %error, "starting a microVM's jail failed");
            let _ = wire::send(sock.as_fd(), &Response::Failed { id, error }, &[]);
            None
        }
    }
}

/// Passes a ready sandbox's descriptors to the supervisor; keeps its watch.
fn hand_over(sock: &OwnedFd, id: u64, sandbox: sandbox::Sandbox) -> Option<Watch> {
    hand_over_with(sock, id, sandbox, &[])
}

/// [`hand_over`], with a microVM jail's port sockets after the sandbox's own descriptors.
fn hand_over_with(
    sock: &OwnedFd,
    id: u64,
    sandbox: sandbox::Sandbox,
    vmm_ports: &[&OwnedFd],
) -> Option<Watch> {
    let (io, watch) = sandbox.into_parts();
    let status = match watch.status_reader() {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(?e, id, "cannot share the status pipe; killing the sandbox");
            let error = format!("cannot share the status pipe: {e}");
            let _ = wire::send(sock.as_fd(), &Response::Failed { id, error }, &[]);
            return None;
        }
    };
    let mut fds = vec![
        io.stdout.as_raw_fd(),
        io.stderr.as_raw_fd(),
        io.channel.as_raw_fd(),
        status.as_raw_fd(),
    ];
    fds.extend(io.egress.as_ref().map(AsRawFd::as_raw_fd));
    fds.extend(vmm_ports.iter().map(|fd| fd.as_raw_fd()));
    let sent = wire::send(
        sock.as_fd(),
        &Response::Spawned {
            id,
            landlock: io.landlock,
            cgroups: watch.cgroup_paths(),
            egress: io.egress.is_some(),
            zygote: watch.from_zygote(),
            vmm_ports: !vmm_ports.is_empty(),
        },
        &fds,
    );
    // Our copies close here: the supervisor holds the only ones now (of the status
    // pipe, the watch keeps its own).
    drop((io, status));
    match sent {
        Ok(()) => Some(watch),
        Err(e) => {
            tracing::error!(?e, id, "cannot hand the sandbox over; killing it");
            None
        }
    }
}

fn build(
    host: &Host,
    profiles: &mut HashMap<String, Profile>,
    spec: &SpawnSpec,
    mount: Option<std::os::fd::RawFd>,
) -> Result<SandboxSpec, String> {
    let profile = match profiles.get(&spec.profile) {
        Some(p) => p,
        None => {
            let p = Profile::load(&spec.profile).map_err(|e| e.to_string())?;
            profiles.entry(spec.profile.clone()).or_insert(p)
        }
    };
    let mut program = spec.language.program().map_err(|e| e.to_string())?;
    if spec.language == crate::runtime::Language::Python {
        // A pooled sandbox (nothing waits for it yet) imports the preload list before it
        // says ready (boot.py); one a call waits for never would, and gets none: so its
        // zygote (`sandbox::zygote::key`: the environment is part of it) is one without
        // the data set, whose children are cheap to fork.
        let preload = match spec.pooled {
            true => host.python_preload.as_deref().unwrap_or(&profile.preload),
            false => &[],
        };
        let env = crate::runtime::thread_env(spec.limits.cpu_millicores)
            .into_iter()
            .chain(crate::runtime::preload_env(preload));
        program
            .set_env(&env.collect::<Vec<_>>())
            .map_err(|e| e.to_string())?;
    }
    let (policy, trust) = match &spec.network {
        // The profile's own mode (a proxy-mode profile still gets no trust bundle).
        None => (profile.policy.clone(), None),
        Some(network) => {
            let mut profile = profile.clone();
            profile
                .set_network(NetworkSection {
                    mode: Some(network.mode()),
                    ..NetworkSection::default()
                })
                .map_err(|e| format!("profile {}: {e}", profile.name))?;
            let trust = match network {
                SpawnNetwork::Proxy { trust } => trust.clone(),
                _ => None,
            };
            (profile.policy, trust)
        }
    };
    if let NetworkAccess::Proxy { port } = policy.network {
        program
            .set_env(&crate::runtime::egress_env(port, trust.is_some()))
            .map_err(|e| e.to_string())?;
    }
    if spec.packages.is_some() {
        program
            .set_env(&crate::runtime::packages_env(spec.language))
            .map_err(|e| e.to_string())?;
    }
    Ok(SandboxSpec {
        rootfs: host.rootfs.path.clone(),
        workspace: spec.workspace.clone(),
        workspace_mount: mount,
        servers: spec.servers.clone(),
        skills: spec.skills.clone(),
        trust,
        packages: spec.packages.clone(),
        program,
        limits: spec.limits.clone(),
        id_mapping: host.id_mapping,
        hostname: "codebox".into(),
        policy,
    })
}

/// Tells the supervisor what happened to the zygotes (best effort: `health` only).
fn send_zygote_events(sock: &OwnedFd, zygotes: &mut Zygotes) {
    for event in zygotes.take_events() {
        if let Err(e) = wire::send(sock.as_fd(), &Response::Zygote { event }, &[]) {
            tracing::debug!(?e, "cannot tell the supervisor about a zygote");
        }
    }
}

fn report_exit(sock: &OwnedFd, id: u64, watch: Watch) {
    let ending = match watch.finish() {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(?e, id, "finishing a sandbox failed");
            Default::default()
        }
    };
    match wire::send(sock.as_fd(), &Response::Exited { id, ending }, &[]) {
        Ok(()) => {}
        // The supervisor is gone (its sandboxes are being ended with it): nobody is left
        // to tell, which is not an error of ours.
        Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
            tracing::debug!(id, "a sandbox ended after the supervisor left");
        }
        Err(e) => tracing::error!(?e, id, "cannot report a sandbox exit"),
    }
}
