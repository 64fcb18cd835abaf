//! The spawner protocol: JSON messages over a `SOCK_SEQPACKET` socketpair (one message
//! per record, so no framing), with file descriptors passed as `SCM_RIGHTS`.
//!
//! supervisor → spawner: [`Request::Spawn`], [`Request::SpawnVmm`], [`Request::Kill`],
//! [`Request::Arm`]
//! spawner → supervisor: [`Response::Spawned`] (+ stdout, stderr, channel fds),
//! [`Response::Failed`], [`Response::Exited`], and unasked [`Response::Zygote`] (a
//! zygote launched or ended, for `health`)

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

use crate::runtime::Language;
use crate::sandbox::{Ending, LandlockStatus, Limits};

/// Largest message either side sends.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// Descriptors passed with [`Response::Spawned`]: stdout, stderr, channel, and a reader of
/// the init's status pipe; then, in proxy mode, the egress listener.
pub const SPAWNED_FDS: usize = 4;
/// Descriptors that follow those of a microVM's jail ([`Request::SpawnVmm`]): the host
/// ends of the VM's control, stdout, stderr and fd-3 ports.
pub const VMM_PORT_FDS: usize = 4;
/// The most descriptors a [`Response::Spawned`] carries (a jail has no egress listener
/// today; the room for one keeps a future one from truncating the message).
pub const MAX_SPAWNED_FDS: usize = SPAWNED_FDS + 1 + VMM_PORT_FDS;

/// A microVM's jailed QEMU (`microvm::jail`), started by the spawner because only a
/// single-threaded process may clone a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmSpec {
    /// The guest tree (`cargo xtask guest`), the jail's root.
    pub guest_dir: PathBuf,
    /// The machine; its descriptor numbers are the jail's to set.
    pub machine: crate::microvm::qemu::Machine,
    /// The whole VM's life, armed as the jail's own deadline.
    pub lifetime_ms: u64,
}

/// What to run; the spawner resolves the profile and the program itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpawnSpec {
    pub language: Language,
    /// A profile name or path, as `Profile::load` takes it.
    pub profile: String,
    /// The profile's limits with the request's overrides applied.
    pub limits: Limits,
    /// Host directory bound at `/workspace`.
    pub workspace: Option<PathBuf>,
    /// Host directory of generated tool wrappers, bound read-only at `/servers`.
    #[serde(default)]
    pub servers: Option<PathBuf>,
    /// Host directory of saved skills, bound read-only at `/skills`.
    #[serde(default)]
    pub skills: Option<PathBuf>,
    /// A session's workspace filesystem (a detached mount), attached at `/workspace`.
    /// Travels as a descriptor with the [`Request::Spawn`], not in its JSON.
    #[serde(skip)]
    pub workspace_mount: Option<MountFd>,
    /// The network mode when it is not the profile's own (a server's `codebox.toml` may
    /// set it). In proxy mode the sandbox gets the egress listener (handed back with
    /// [`Response::Spawned`]), the proxy environment and, when given, the trust bundle.
    #[serde(default)]
    pub network: Option<SpawnNetwork>,
    /// An installed package layer, bound read-only at `/packages` (Python finds its
    /// modules in `/packages/site`, Deno its cache in `/packages/deno`).
    #[serde(default)]
    pub packages: Option<PathBuf>,
    /// For the warm pool: a Python sandbox may then be forked from the zygote (whose
    /// children copy the zygote's memory before they are ready, which a sandbox started
    /// for a waiting call should not pay for).
    #[serde(default)]
    pub pooled: bool,
}

/// A sandbox's network mode, with what proxy mode needs beyond the profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnNetwork {
    None,
    Loopback,
    Proxy {
        /// Host directory holding `ca-bundle.pem`, bound read-only at `/etc/codebox`.
        trust: Option<PathBuf>,
    },
}

impl SpawnNetwork {
    pub fn mode(&self) -> crate::egress::NetworkMode {
        match self {
            SpawnNetwork::None => crate::egress::NetworkMode::None,
            SpawnNetwork::Loopback => crate::egress::NetworkMode::Loopback,
            SpawnNetwork::Proxy { .. } => crate::egress::NetworkMode::Proxy,
        }
    }
}

/// A detached mount shared by the specs that carry it; equal only to itself.
#[derive(Debug, Clone)]
pub struct MountFd(pub std::sync::Arc<OwnedFd>);

impl PartialEq for MountFd {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Spawn {
        id: u64,
        spec: Box<SpawnSpec>,
    },
    /// A microVM's jail: answered like a `Spawn` (QEMU's console, stderr, QMP and the
    /// status pipe), followed by the host ends of the VM's four ports. The guest's RAM
    /// file, when the machine is file-backed, comes as the request's one descriptor.
    SpawnVmm {
        id: u64,
        vmm: Box<VmmSpec>,
    },
    Kill {
        id: u64,
    },
    /// Gives the sandbox's init `ms` from now before it ends the sandbox itself.
    Arm {
        id: u64,
        ms: u64,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Response {
    Spawned {
        id: u64,
        landlock: Option<LandlockStatus>,
        /// The host directories of the sandbox's cgroup, for reading its memory use.
        #[serde(default)]
        cgroups: Vec<PathBuf>,
        /// The egress listener follows the four descriptors.
        #[serde(default)]
        egress: bool,
        /// Forked from the Python zygote rather than started anew.
        #[serde(default)]
        zygote: bool,
        /// A microVM's jail: the four port sockets follow.
        #[serde(default)]
        vmm_ports: bool,
    },
    Failed {
        id: u64,
        error: String,
    },
    Exited {
        id: u64,
        ending: Ending,
    },
    /// Something happened to one of the spawner's zygotes.
    Zygote {
        event: ZygoteEvent,
    },
}

/// A zygote's life, as the spawner tells it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ZygoteEvent {
    Launched {
        /// Its init's host pid.
        pid: i32,
    },
    Ended {
        pid: i32,
        /// Died (or gave up) rather than retired, replaced or shut down.
        unexpected: bool,
        /// What was seen and how it ended.
        how: String,
    },
}

/// Sends one message with optional descriptors.
pub fn send(sock: BorrowedFd<'_>, msg: &impl Serialize, fds: &[RawFd]) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    if bytes.len() > MAX_MESSAGE {
        return Err(std::io::Error::other("spawner message too large"));
    }
    let iov = [IoSlice::new(&bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one message and the descriptors that came with it. `Ok(None)`: the other
/// side closed the socket.
pub fn recv<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
) -> std::io::Result<Option<(T, Vec<OwnedFd>)>> {
    // One zeroed buffer per thread, reused: a fresh 64 KiB one per message was 40 % of the
    // supervisor's instructions on a warm call (its zeroing), for messages of ~200 bytes.
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MAX_MESSAGE]);
    }
    BUF.with(|buf| match buf.try_borrow_mut() {
        Ok(mut buf) => recv_into(sock, &mut buf),
        // Not reentrant; should a caller ever nest, it gets a buffer of its own.
        Err(_) => recv_into(sock, &mut vec![0u8; MAX_MESSAGE]),
    })
}

fn recv_into<T: for<'de> Deserialize<'de>>(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> std::io::Result<Option<(T, Vec<OwnedFd>)>> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_SPAWNED_FDS]);
    let (len, fds) = loop {
        let mut iov = [IoSliceMut::new(buf)];
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(msg) => {
                let mut fds = Vec::new();
                for c in msg.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmRights(raw) = c {
                        // SAFETY: the kernel installed these descriptors in this process
                        // for this message; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                if msg.flags.contains(MsgFlags::MSG_TRUNC)
                    || msg.flags.contains(MsgFlags::MSG_CTRUNC)
                {
                    return Err(std::io::Error::other("spawner message truncated"));
                }
                break (msg.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    if len == 0 {
        return Ok(None);
    }
    let msg = serde_json::from_slice(&buf[..len]).map_err(std::io::Error::other)?;
    Ok(Some((msg, fds)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsFd;

    #[test]
    fn messages_and_descriptors_round_trip() {
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        send(
            a.as_fd(),
            &Response::Spawned {
                id: 7,
                landlock: Some(LandlockStatus::FullyEnforced),
                cgroups: vec![],
                egress: false,
                zygote: false,
                vmm_ports: false,
            },
            &[r.as_raw_fd(), w.as_raw_fd()],
        )
        .unwrap();
        let (msg, fds): (Response, _) = recv(b.as_fd()).unwrap().unwrap();
        assert!(matches!(msg, Response::Spawned { id: 7, .. }));
        assert_eq!(fds.len(), 2);
        // The passed write end works.
        nix::unistd::write(&fds[1], b"x").unwrap();
        let mut byte = [0u8; 1];
        nix::unistd::read(r.as_fd(), &mut byte).unwrap();
        assert_eq!(&byte, b"x");
        // A microVM's jail: its four descriptors and the four ports all arrive.
        let eight: Vec<i32> = (0..SPAWNED_FDS + VMM_PORT_FDS)
            .map(|_| r.as_raw_fd())
            .collect();
        send(
            a.as_fd(),
            &Response::Spawned {
                id: 8,
                landlock: None,
                cgroups: vec![],
                egress: false,
                zygote: false,
                vmm_ports: true,
            },
            &eight,
        )
        .unwrap();
        let (msg, fds): (Response, _) = recv(b.as_fd()).unwrap().unwrap();
        assert!(matches!(
            msg,
            Response::Spawned {
                id: 8,
                vmm_ports: true,
                ..
            }
        ));
        assert_eq!(fds.len(), SPAWNED_FDS + VMM_PORT_FDS);
        drop(a);
        assert!(recv::<Response>(b.as_fd()).unwrap().is_none());
    }
}
