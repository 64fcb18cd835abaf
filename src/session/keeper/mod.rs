//! The workspace keeper: a tiny process that creates each session's workspace
//! filesystem and hands out copies of its mount.
//!
//! A session's `/workspace` is a tmpfs of its own with `size=` and `nr_inodes=`, so the
//! kernel enforces the quota on allocated pages and inodes (whatever the names, the depth,
//! `fallocate`, unlinked-but-open files or writes between runs). It is made with the new
//! mount API as a *detached* mount (`fsopen` → `fsconfig` → `fsmount`): it is attached
//! nowhere on the host, and the supervisor reaches it only through the descriptor.
//!
//! `fsopen` needs `CAP_SYS_ADMIN` over the caller's mount namespace, which an unprivileged
//! supervisor does not have; and the kernel lets a detached mount be cloned
//! (`open_tree(OPEN_TREE_CLONE)`) only from the mount namespace it was made in. So both
//! happen here, in a process that (rootless) owns a user and mount namespace of its own:
//!
//! - `create(size, inodes)` → the session's mount, root owned by the sandbox user's host
//!   ids, mode 0700, nosuid/nodev/noexec. The supervisor keeps it for the session's life
//!   and does all host-side access relative to it.
//! - `clone(mount)` → a fresh detached copy of the same filesystem, which one run's
//!   sandbox init attaches at `/workspace` with `move_mount`.
//!
//! The keeper keeps no state: closing a session's descriptors (and ending its sandboxes)
//! frees the filesystem. Its loop uses only raw system calls on stack buffers, with no
//! allocation, so it may be forked from the threaded supervisor; it exits when the
//! supervisor's end of its socket closes.
//!
//! # A keeper that dies
//!
//! Its first message hands the supervisor descriptors of its namespaces
//! ([`Namespaces`]), which keep them alive whatever becomes of the process. A keeper
//! started with [`Keeper::start_in`] joins those (`setns`) instead of making its own: the
//! mounts the dead one made were made in the mount namespace it now works in, so it can
//! copy them whatever rule the kernel applies to copying a detached mount from elsewhere
//! (recent kernels let a keeper in other namespaces copy it too; earlier ones allowed
//! `open_tree` only in the namespace the mount belongs to), and the sessions go on with
//! their files. Rootless, joining the user
//! namespace needs `CAP_SYS_ADMIN` over it, which its owner (the supervisor's user, in
//! the parent namespace) has; joining takes a single-threaded process, which a freshly
//! forked keeper is.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

mod child;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot start the workspace keeper")]
    Start(#[source] io::Error),
    #[error("the workspace keeper cannot set up its namespaces")]
    Setup(#[source] io::Error),
    #[error("the workspace keeper cannot {doing}")]
    Keeper {
        doing: &'static str,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

const OP_CREATE: u8 = 1;
const OP_CLONE: u8 = 2;
/// op, size (u64), inodes (u64), uid (u32), gid (u32).
const REQUEST_LEN: usize = 25;
/// How long the supervisor waits for an answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The namespaces a keeper works in (rootless: a user and a mount namespace; as root: a
/// mount namespace), held open by the supervisor so a replacement keeper can join them.
#[derive(Debug)]
pub struct Namespaces {
    user: Option<OwnedFd>,
    mnt: OwnedFd,
}

/// The supervisor's handle on the keeper process.
#[derive(Debug)]
pub struct Keeper {
    sock: Mutex<Option<OwnedFd>>,
    pid: libc::pid_t,
    /// How it ended, once reaped (its pid may name another process then).
    ended: Mutex<Option<String>>,
    owner: (u32, u32),
    /// Its namespaces, when it could hand them over.
    namespaces: Option<std::sync::Arc<Namespaces>>,
}

impl Keeper {
    /// Forks the keeper in namespaces of its own. `owner` are the host uid and gid of the
    /// sandbox user, which own every workspace's root. Safe to call from a threaded
    /// process: the child runs only async-signal-safe code.
    pub fn start(owner: (u32, u32)) -> Result<Keeper> {
        Self::fork(owner, None)
    }

    /// Forks a keeper that joins `namespaces` (a dead keeper's): it can copy every mount
    /// that keeper made.
    pub fn start_in(owner: (u32, u32), namespaces: &std::sync::Arc<Namespaces>) -> Result<Keeper> {
        Self::fork(owner, Some(namespaces))
    }

    fn fork(owner: (u32, u32), join: Option<&std::sync::Arc<Namespaces>>) -> Result<Keeper> {
        let rootless = !nix::unistd::geteuid().is_root();
        let join_fds = join.map(|ns| {
            (
                ns.user.as_ref().map_or(-1, AsRawFd::as_raw_fd),
                ns.mnt.as_raw_fd(),
            )
        });
        let (ours, theirs) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| Error::Start(e.into()))?;
        let theirs_raw = theirs.as_raw_fd();
        // SAFETY: the child runs `child_main` only, which uses raw system calls on stack
        // buffers (async-signal-safe) and ends in _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(Error::Start(io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: in the forked child; see above.
            unsafe { child::child_main(theirs_raw, owner, rootless, join_fds) }
        }
        drop(theirs);
        let mut keeper = Keeper {
            sock: Mutex::new(Some(ours)),
            pid,
            ended: Mutex::new(None),
            owner,
            namespaces: join.cloned(),
        };
        // From here on, dropping `keeper` closes the socket and reaps the child.
        let timeout = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as i64, 0);
        let sock = keeper
            .sock
            .get_mut()
            .map_err(|_| Error::Start(io::Error::other("lock")))?;
        let sock = sock.as_ref().expect("just made");
        nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| Error::Start(e.into()))?;
        let hello = match receive_hello(sock) {
            Ok(hello) => hello,
            Err(e) => {
                // SAFETY: kill(2) of our own child, not reaped yet.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Err(Error::Start(e));
            }
        };
        if hello.status != 0 {
            return Err(Error::Setup(io::Error::from_raw_os_error(hello.status)));
        }
        if keeper.namespaces.is_none() {
            keeper.namespaces = hello.namespaces(rootless).map(std::sync::Arc::new);
        }
        Ok(keeper)
    }

    /// The namespaces it works in, for a replacement to join (`None`: it could not hand
    /// them over, e.g. without `/proc`).
    pub fn namespaces(&self) -> Option<std::sync::Arc<Namespaces>> {
        self.namespaces.clone()
    }

    /// How it ended, once [`Keeper::alive`] found it gone.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A new workspace filesystem of `size` bytes and `inodes` inodes (its root
    /// directory included); returns its detached mount.
    pub fn create(&self, size: u64, inodes: u64) -> Result<OwnedFd> {
        // tmpfs reads 0 as "unlimited": never ask for that.
        let (size, inodes) = (size.max(1), inodes.max(1));
        let mut req = [0u8; REQUEST_LEN];
        req[0] = OP_CREATE;
        req[1..9].copy_from_slice(&size.to_le_bytes());
        req[9..17].copy_from_slice(&inodes.to_le_bytes());
        req[17..21].copy_from_slice(&self.owner.0.to_le_bytes());
        req[21..25].copy_from_slice(&self.owner.1.to_le_bytes());
        self.ask(&req, None, "create a workspace filesystem")
    }

    /// A fresh detached copy of `mount` (a mount [`Keeper::create`] returned), for one
    /// sandbox to attach.
    pub fn clone_mount(&self, mount: BorrowedFd<'_>) -> Result<OwnedFd> {
        let mut req = [0u8; REQUEST_LEN];
        req[0] = OP_CLONE;
        self.ask(&req, Some(mount.as_raw_fd()), "copy a workspace mount")
    }

    /// The keeper's pid.
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.pid)
    }

    /// Whether the keeper may still answer: its socket is open and it has not exited.
    /// Reaps it when it has (see [`Keeper::ended`]).
    pub fn alive(&self) -> bool {
        let open = self.sock.lock().map(|s| s.is_some()).unwrap_or(false);
        let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
        if ended.is_some() {
            return false;
        }
        let mut status = 0;
        // SAFETY: a non-blocking waitpid on our own child, not reaped yet (checked above,
        // under the lock that records the reaping).
        match unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } {
            0 => open,
            r if r == self.pid => {
                *ended = Some(describe_status(status));
                false
            }
            _ => {
                *ended = Some(format!(
                    "could not be waited for ({})",
                    io::Error::last_os_error()
                ));
                false
            }
        }
    }

    fn ask(&self, req: &[u8], fd: Option<RawFd>, doing: &'static str) -> Result<OwnedFd> {
        let mut guard = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sock) = guard.as_ref() else {
            return Err(Error::Keeper {
                doing,
                source: io::Error::other("the keeper is gone"),
            });
        };
        match exchange(sock, req, fd) {
            Ok(fd) => Ok(fd),
            Err(Failure::Refused(source)) => Err(Error::Keeper { doing, source }),
            Err(Failure::Transport(source)) => {
                // No answer, or a late one the next request would read: the keeper is no
                // longer usable. Closing our end makes a live one exit; one that hangs is
                // killed (its namespaces stay, held by `namespaces`).
                guard.take();
                let mut ended = self.ended.lock().unwrap_or_else(|p| p.into_inner());
                if ended.is_none() {
                    let mut status = 0;
                    // SAFETY: waitpid and kill of our own child, not reaped yet (checked
                    // under the lock that records the reaping); a null-free status int.
                    let how = unsafe {
                        match libc::waitpid(self.pid, &mut status, libc::WNOHANG) {
                            0 => {
                                libc::kill(self.pid, libc::SIGKILL);
                                libc::waitpid(self.pid, &mut status, 0);
                                format!(
                                    "{} after it stopped answering ({source})",
                                    describe_status(status)
                                )
                            }
                            r if r == self.pid => describe_status(status),
                            _ => {
                                format!("could not be waited for ({})", io::Error::last_os_error())
                            }
                        }
                    };
                    *ended = Some(how);
                }
                drop(ended);
                tracing::debug!(%source, pid = self.pid, "the workspace keeper stopped answering");
                Err(Error::Keeper { doing, source })
            }
        }
    }
}

/// Why a request to the keeper failed.
enum Failure {
    /// The keeper answered with the kernel's refusal.
    Refused(io::Error),
    /// The socket failed or the answer was malformed.
    Transport(io::Error),
}

fn exchange(
    sock: &OwnedFd,
    req: &[u8],
    fd: Option<RawFd>,
) -> std::result::Result<OwnedFd, Failure> {
    use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
    use std::io::{IoSlice, IoSliceMut};
    let transport = |e: nix::Error| Failure::Transport(e.into());
    let fds = fd.map(|f| [f]);
    let cmsg = fds.as_ref().map(|f| ControlMessage::ScmRights(f));
    let cmsgs: &[ControlMessage] = match &cmsg {
        Some(c) => std::slice::from_ref(c),
        None => &[],
    };
    let iov = [IoSlice::new(req)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
        .map_err(transport)?;
    let mut answer = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut answer)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(transport)?;
    let mut got = None;
    for c in msg.cmsgs().map_err(transport)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for r in raw {
                // SAFETY: the kernel installed this descriptor for this message.
                let owned = unsafe { OwnedFd::from_raw_fd(r) };
                got.get_or_insert(owned);
            }
        }
    }
    if msg.bytes != 4 {
        return Err(Failure::Transport(io::Error::other("the keeper is gone")));
    }
    match (i32::from_le_bytes(answer), got) {
        (0, Some(fd)) => Ok(fd),
        (0, None) => Err(Failure::Transport(io::Error::other(
            "no descriptor in the keeper's answer",
        ))),
        (e, _) => Err(Failure::Refused(io::Error::from_raw_os_error(e))),
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Closing our end ends the keeper's loop; reap it so no zombie stays.
        drop(self.sock.get_mut().map(Option::take));
        let ended = self.ended.get_mut().unwrap_or_else(|p| p.into_inner());
        if ended.is_none() {
            // SAFETY: waitpid on our own child, not reaped yet; no memory but a null status.
            unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
        }
    }
}

/// A wait status in words: "exited with status 1", "killed by SIGKILL".
pub(crate) fn describe_status(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with status {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        let sig = libc::WTERMSIG(status);
        match nix::sys::signal::Signal::try_from(sig) {
            Ok(s) => format!("killed by {}", s.as_str()),
            Err(_) => format!("killed by signal {sig}"),
        }
    } else {
        format!("ended with wait status {status:#x}")
    }
}

/// The keeper's first message: how its namespaces' setup went and, when it went well,
/// descriptors of them.
struct Hello {
    status: i32,
    fds: Vec<OwnedFd>,
}

impl Hello {
    /// Rootless: the user then the mount namespace; as root: the mount namespace.
    fn namespaces(mut self, rootless: bool) -> Option<Namespaces> {
        match (rootless, self.fds.len()) {
            (true, 2) => {
                let mnt = self.fds.pop()?;
                let user = self.fds.pop();
                Some(Namespaces { user, mnt })
            }
            (false, 1) => Some(Namespaces {
                user: None,
                mnt: self.fds.pop()?,
            }),
            _ => None,
        }
    }
}

fn receive_hello(sock: &OwnedFd) -> io::Result<Hello> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::io::IoSliceMut;
    let mut status = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let mut iov = [IoSliceMut::new(&mut status)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these descriptors for this message.
            fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
        }
    }
    if msg.bytes != 4 {
        return Err(io::Error::other("the keeper ended before it said hello"));
    }
    Ok(Hello {
        status: i32::from_le_bytes(status),
        fds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_never_means_unlimited() {
        use std::os::fd::AsFd;
        let ids = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let k = Keeper::start(ids).unwrap();
        let fs = k.create(0, 0).unwrap();
        let st = nix::sys::statvfs::fstatvfs(fs.as_fd()).unwrap();
        assert!(st.blocks() <= 1 && st.files() <= 1, "{st:?}");
        let copy = k.clone_mount(fs.as_fd()).unwrap();
        let st = nix::sys::statvfs::fstatvfs(copy.as_fd()).unwrap();
        assert!(st.blocks() <= 1, "a copy is the same filesystem");
    }

    /// A keeper that dies leaves its namespaces with the supervisor; a replacement that
    /// joins them copies the dead one's mounts (the sessions keep their files), and says
    /// how the dead one ended.
    #[test]
    fn a_replacement_joins_the_dead_keepers_namespaces() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let ids = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let first = Keeper::start(ids).unwrap();
        let ns = first
            .namespaces()
            .expect("the keeper hands over its namespaces");
        let fs = first.create(1 << 20, 10).unwrap();
        let file = nix::fcntl::openat(
            fs.as_fd(),
            "kept",
            nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        std::fs::File::from(file).write_all(b"still here").unwrap();
        nix::sys::signal::kill(first.pid(), nix::sys::signal::Signal::SIGKILL).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while first.alive() {
            assert!(std::time::Instant::now() < until, "the keeper did not die");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(first.ended().as_deref(), Some("killed by SIGKILL"));
        assert!(
            first.clone_mount(fs.as_fd()).is_err(),
            "a dead keeper copies nothing"
        );
        drop(first);

        let second = Keeper::start_in(ids, &ns).unwrap();
        let copy = second.clone_mount(fs.as_fd()).unwrap();
        let file = nix::fcntl::openat(
            copy.as_fd(),
            "kept",
            nix::fcntl::OFlag::O_RDONLY,
            nix::sys::stat::Mode::empty(),
        )
        .unwrap();
        let mut text = String::new();
        std::fs::File::from(file).read_to_string(&mut text).unwrap();
        assert_eq!(text, "still here");
        // The replacement still makes new workspaces.
        second.create(1 << 20, 10).unwrap();
    }
}
