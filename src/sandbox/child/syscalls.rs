//! The privileged filesystem operations the sandbox init performs, behind a trait.
//!
//! [`Linux`] makes the real system calls. [`Recorder`] (tests only) writes down what would
//! have been called, so the order and arguments of the mount procedure are unit-tested
//! without root or namespaces.

use std::io;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;

/// The system calls the mount procedure needs.
pub trait Syscalls {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()>;
    fn umount_detach(&self, target: &Path) -> io::Result<()>;
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()>;
    fn chdir(&self, path: &Path) -> io::Result<()>;
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()>;
    fn create_file(&self, path: &Path) -> io::Result<()>;
    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()>;
    /// Attaches the detached mount `fd` at `target` (`move_mount`), then closes `fd`.
    fn attach_mount(&self, fd: std::os::fd::RawFd, target: &Path) -> io::Result<()>;
}

/// The real system calls.
pub struct Linux;

impl Syscalls for Linux {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()> {
        nix::mount::mount(source, target, fstype, flags, data).map_err(io::Error::from)
    }

    fn umount_detach(&self, target: &Path) -> io::Result<()> {
        nix::mount::umount2(target, MntFlags::MNT_DETACH).map_err(io::Error::from)
    }

    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        nix::unistd::pivot_root(new_root, put_old).map_err(io::Error::from)
    }

    fn chdir(&self, path: &Path) -> io::Result<()> {
        nix::unistd::chdir(path).map_err(io::Error::from)
    }

    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        nix::unistd::mkdir(path, Mode::from_bits_truncate(mode)).map_err(io::Error::from)
    }

    fn create_file(&self, path: &Path) -> io::Result<()> {
        use nix::fcntl::{open, OFlag};
        let fd = open(
            path,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )?;
        drop(fd);
        Ok(())
    }

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    fn attach_mount(&self, fd: std::os::fd::RawFd, target: &Path) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let target = std::ffi::CString::new(target.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: both paths are NUL-terminated and outlive the call; `fd` is a descriptor
        // number (a bad one yields EBADF).
        let r = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                libc::MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        let result = if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
        // SAFETY: closing the descriptor this step consumes; the mount stays attached.
        unsafe { libc::close(fd) };
        result
    }
}

/// One recorded call, rendered as text for easy assertions.
#[cfg(test)]
pub struct Recorder {
    pub calls: std::cell::RefCell<Vec<String>>,
    /// Fail the call whose rendering starts with this prefix.
    pub fail_on: Option<&'static str>,
}

#[cfg(test)]
impl Recorder {
    pub fn new() -> Self {
        Recorder {
            calls: Default::default(),
            fail_on: None,
        }
    }

    fn record(&self, call: String) -> io::Result<()> {
        let fail = self.fail_on.is_some_and(|p| call.starts_with(p));
        self.calls.borrow_mut().push(call);
        if fail {
            Err(io::Error::from_raw_os_error(libc::EPERM))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
impl Syscalls for Recorder {
    fn mount(
        &self,
        source: Option<&Path>,
        target: &Path,
        fstype: Option<&str>,
        flags: MsFlags,
        data: Option<&str>,
    ) -> io::Result<()> {
        self.record(format!(
            "mount {:?} {} {:?} {:?} {:?}",
            source,
            target.display(),
            fstype,
            flags,
            data
        ))
    }
    fn umount_detach(&self, target: &Path) -> io::Result<()> {
        self.record(format!("umount2 {} MNT_DETACH", target.display()))
    }
    fn pivot_root(&self, new_root: &Path, put_old: &Path) -> io::Result<()> {
        self.record(format!(
            "pivot_root {} {}",
            new_root.display(),
            put_old.display()
        ))
    }
    fn chdir(&self, path: &Path) -> io::Result<()> {
        self.record(format!("chdir {}", path.display()))
    }
    fn mkdir(&self, path: &Path, mode: u32) -> io::Result<()> {
        self.record(format!("mkdir {} {mode:o}", path.display()))
    }
    fn create_file(&self, path: &Path) -> io::Result<()> {
        self.record(format!("create {}", path.display()))
    }
    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        self.record(format!(
            "symlink {} -> {}",
            link.display(),
            target.display()
        ))
    }
    fn attach_mount(&self, fd: std::os::fd::RawFd, target: &Path) -> io::Result<()> {
        self.record(format!("move_mount {fd} {}", target.display()))
    }
}
