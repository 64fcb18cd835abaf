//! A host directory made writable by the sandbox user when codebox runs as root.
//!
//! As root the sandbox user is an unprivileged host id (`nobody` by default), so a
//! directory owned by anyone else, bound as it is, is read-only to the program. An
//! idmapped mount fixes that without touching the directory: a detached copy of it
//! (`open_tree(OPEN_TREE_CLONE)`) gets the idmapping of a user namespace whose map
//! reads "the directory's owner is the sandbox user's host id"
//! (`mount_setattr(MOUNT_ATTR_IDMAP)`), and the sandbox attaches that copy at
//! `/workspace`. Files the program creates land on disk owned by the directory's owner.
//!
//! The directory's owner must not be root: the program may set the set-user-id bit on
//! what it owns, and on the host that would be root's. Mapped onto an unprivileged
//! owner, it gains what it has when codebox runs as that user (rootless).
//!
//! Needs a filesystem that supports idmapped mounts (ext4, xfs, btrfs, tmpfs, overlayfs
//! on recent kernels, ...); where it is missing, [`Error`] names the fixes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "--workspace {path} is owned by {uid}:{gid} ({which}): as root codebox \
         maps the sandbox user onto the directory's owner and group to let it write, and files \
         it made set-user-id or set-group-id there would be root's; fix: give the directory to \
         an unprivileged user and group (`chown -R {host_id}:{host_id} {path}`, or your own) or \
         run codebox as an unprivileged user"
    )]
    RootOwned {
        path: PathBuf,
        uid: u32,
        gid: u32,
        /// Which of the two is root's, in words.
        which: &'static str,
        host_id: u32,
    },
    #[error(
        "--workspace {path}: as root the sandbox user is host uid {host_id}, and an idmapped \
         mount of the directory (which would let it write there) is not possible on this \
         host ({doing}); fix: `chown -R {host_id}:{host_id} {path}`, or run codebox as an \
         unprivileged user, or use a filesystem with idmapped mounts"
    )]
    Unsupported {
        path: PathBuf,
        host_id: u32,
        doing: &'static str,
        #[source]
        source: io::Error,
    },
}

/// A detached mount of `dir` on which its owner (uid and gid) appears as `host_id`, with
/// nosuid, nodev and noexec set. `None` when no mapping is needed (the directory already
/// belongs to `host_id`).
///
/// Forks (a child that holds the user namespace for a moment): single-threaded callers.
pub fn workspace_mount(dir: &Path, host_id: u32) -> Result<Option<OwnedFd>, Error> {
    let fail = |doing, source| Error::Unsupported {
        path: dir.to_path_buf(),
        host_id,
        doing,
        source,
    };
    let meta = std::fs::metadata(dir).map_err(|e| fail("reading the directory's owner", e))?;
    if meta.uid() == host_id && meta.gid() == host_id {
        return Ok(None);
    }
    // The program may chmod what it owns, set-user-id bits included (nosuid guards only
    // this mount): mapped onto root, that would plant root's set-user-id files on the host.
    let which = match (meta.uid() == 0, meta.gid() == 0) {
        (true, true) => Some("root's user and group"),
        (true, false) => Some("uid 0 is root"),
        (false, true) => Some("gid 0 is root's group"),
        (false, false) => None,
    };
    if let Some(which) = which {
        return Err(Error::RootOwned {
            path: dir.to_path_buf(),
            uid: meta.uid(),
            gid: meta.gid(),
            which,
            host_id,
        });
    }
    let userns = mapping_namespace(meta.uid(), meta.gid(), host_id)
        .map_err(|e| fail("creating the user namespace of the mapping", e))?;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
        fail(
            "naming the directory",
            io::Error::from_raw_os_error(libc::EINVAL),
        )
    })?;
    // SAFETY: the path is NUL-terminated and outlives the call.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            (libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC) as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(fail(
            "cloning the directory's mount",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP
            | libc::MOUNT_ATTR_NOSUID
            | libc::MOUNT_ATTR_NODEV
            | libc::MOUNT_ATTR_NOEXEC,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: `attr` is a live mount_attr of the size passed; the path is an empty string.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if r != 0 {
        return Err(fail(
            "idmapping the mount (the filesystem may not support it)",
            io::Error::last_os_error(),
        ));
    }
    Ok(Some(tree))
}

/// A user namespace mapping `uid`/`gid` (the on-disk owner) to `host_id`.
fn mapping_namespace(uid: u32, gid: u32, host_id: u32) -> io::Result<OwnedFd> {
    let (ready_r, ready_w) = nix::unistd::pipe()?;
    let (done_r, done_w) = nix::unistd::pipe()?;
    // SAFETY: the caller is single-threaded; the child only calls unshare, write, read
    // and _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: raw system calls in the forked child, then _exit.
        unsafe {
            let ok: u8 = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                1
            } else {
                0
            };
            libc::write(ready_w.as_raw_fd(), (&ok as *const u8).cast(), 1);
            let mut b = 0u8;
            // Wait until the parent holds the namespace (end of file on `done`).
            libc::close(done_w.as_raw_fd());
            libc::read(done_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
            libc::_exit(0)
        }
    }
    drop((ready_w, done_r));
    let result = (|| {
        let mut ok = [0u8; 1];
        nix::unistd::read(&ready_r, &mut ok)?;
        if ok[0] != 1 {
            return Err(io::Error::other("unshare(CLONE_NEWUSER) failed"));
        }
        let proc = PathBuf::from(format!("/proc/{pid}"));
        // On-disk id `uid` read through this namespace is host id `host_id`.
        std::fs::write(proc.join("uid_map"), format!("{uid} {host_id} 1\n"))?;
        std::fs::write(proc.join("gid_map"), format!("{gid} {host_id} 1\n"))?;
        Ok(OwnedFd::from(std::fs::File::open(proc.join("ns/user"))?))
    })();
    drop(done_w);
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    result
}
