//! QEMU's process, whoever cloned its jail: this process (`codebox run`, a single-threaded
//! caller of `jail::launch`), or the spawner (`codebox serve`, whose tokio threads may not
//! clone: the spawner answers a `SpawnVmm` request with the jail's descriptors and keeps
//! its watch, as it does a language sandbox's).
//!
//! The VM's driver needs three things of it: the console, QEMU's stderr and QMP (the
//! jail's stdout, stderr and fd 3); to learn when the process is gone; and, at the end,
//! to kill it, reap it and read its cgroup's figures.

use std::os::fd::OwnedFd;

use tokio::io::unix::AsyncFd;

use crate::sandbox::{self, CgroupStats, Sandbox};
use crate::spawner::RemoteSandbox;

/// QEMU's jail and who reaps it.
pub enum JailProcess {
    /// Cloned by this process, which reaps it.
    Local(Sandbox),
    /// Cloned by the spawner, which reaps it and reports its end.
    Remote(RemoteSandbox),
}

/// The jail's stdout (the serial console), stderr and fd 3 (QMP).
pub struct JailStreams {
    pub console: OwnedFd,
    pub stderr: OwnedFd,
    pub qmp: OwnedFd,
}

impl JailProcess {
    /// Takes the jail's streams (once: `/dev/null` stays in their place).
    pub fn take_streams(&mut self) -> std::io::Result<JailStreams> {
        let null = || std::fs::File::open("/dev/null").map(OwnedFd::from);
        match self {
            JailProcess::Local(sb) => Ok(JailStreams {
                console: std::mem::replace(&mut sb.io.stdout, null()?),
                stderr: std::mem::replace(&mut sb.io.stderr, null()?),
                qmp: std::mem::replace(&mut sb.io.channel, null()?),
            }),
            JailProcess::Remote(sb) => {
                let (console, stderr, qmp) = sb.take_streams().ok_or_else(|| {
                    std::io::Error::other("the jail's streams were taken already")
                })?;
                Ok(JailStreams {
                    console,
                    stderr,
                    qmp,
                })
            }
        }
    }

    /// The host pid of the jail's init, when this process cloned it.
    pub fn init_pid(&self) -> Option<i32> {
        match self {
            JailProcess::Local(sb) => Some(sb.watch.pid().as_raw()),
            JailProcess::Remote(_) => None,
        }
    }

    /// Keeps `held` until the jail is gone: for a remote jail, until the spawner reports
    /// its end (a call's admission slot bounds the VMs that exist). A local jail
    /// (`codebox run`'s) has no admission to hold: `held` is dropped.
    pub fn hold_until_gone(&mut self, held: Box<dyn std::any::Any + Send>) {
        match self {
            JailProcess::Local(_) => drop(held),
            JailProcess::Remote(sb) => sb.hold_until_gone(held),
        }
    }

    /// Watches the process for its end.
    pub fn watcher(self) -> JailWatcher {
        match self {
            JailProcess::Local(sb) => {
                let exited = sb.watch.pidfd().try_clone_to_owned().ok().and_then(|fd| {
                    // SAFETY: `fd` is an open pidfd that this AsyncFd owns (and so keeps
                    // open, unchanged) until it is dropped.
                    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
                        .ok()
                });
                JailWatcher::Local { sb, exited }
            }
            JailProcess::Remote(sb) => JailWatcher::Remote { sb, gone: None },
        }
    }

    /// Kills and reaps the jail; its cgroup's figures.
    pub async fn finish(self) -> Option<CgroupStats> {
        self.watcher().finish().await
    }
}

/// How a watched jail's process was seen to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JailGone {
    /// It exited (or was killed and reaped).
    Exited,
    /// The spawner that watched it is gone, and the jail with it: nobody reports how.
    SpawnerLost,
}

/// A jail being watched by a VM's driver.
pub enum JailWatcher {
    Local {
        sb: Sandbox,
        /// Readable once QEMU's process (the jail's init) ended.
        exited: Option<AsyncFd<OwnedFd>>,
    },
    Remote {
        sb: RemoteSandbox,
        /// The spawner's report, once it came (`Some(None)`: the spawner is gone, and the
        /// jail with it).
        gone: Option<Option<sandbox::Ending>>,
    },
}

impl JailWatcher {
    /// Resolves once the jail's process is gone; cancel-safe. Never, when that cannot be
    /// watched (the driver then relies on QMP and the control port closing).
    pub async fn exited(&mut self) -> JailGone {
        match self {
            JailWatcher::Local { exited, .. } => match exited {
                Some(fd) => {
                    let _ = fd.readable().await;
                    JailGone::Exited
                }
                None => std::future::pending().await,
            },
            JailWatcher::Remote { sb, gone } => {
                let ending = match gone {
                    Some(ending) => ending,
                    None => gone.insert(sb.ended().await),
                };
                match ending {
                    Some(_) => JailGone::Exited,
                    None => JailGone::SpawnerLost,
                }
            }
        }
    }

    /// Kills and reaps the jail; its cgroup's figures.
    pub async fn finish(self) -> Option<CgroupStats> {
        match self {
            JailWatcher::Local { sb, exited } => {
                drop(exited);
                if let Err(e) = sb.watch.kill() {
                    tracing::warn!(?e, "killing the VMM jail failed");
                }
                let (io, watch) = sb.into_parts();
                drop(io);
                // On this thread (a killed QEMU is reaped at once): a blocking-pool thread
                // would make a single-threaded caller multi-threaded, and jails are
                // cloned only from single-threaded processes.
                match watch.finish() {
                    Ok(ending) => ending.cgroup,
                    Err(e) => {
                        tracing::warn!(?e, "finishing the VMM jail failed");
                        None
                    }
                }
            }
            JailWatcher::Remote { sb, gone } => match gone {
                Some(ending) => ending.and_then(|e| e.cgroup),
                None => sb.kill_and_wait().await.and_then(|e| e.cgroup),
            },
        }
    }
}
