//! A workspace as one byte stream, and back: what the `workspace` part of a snapshot
//! holds, and how a live session's workspace is copied into a fork.
//!
//! The workspace was written by untrusted code, and on restore the stream is only as
//! trustworthy as the snapshot's authentication, which completes at its end; so both
//! directions touch the tree only through directory descriptors:
//!
//! - Capture opens every directory relative to its parent with `O_NOFOLLOW |
//!   O_DIRECTORY`, every file with `O_NOFOLLOW` (and checks the opened inode is the one
//!   `fstatat(AT_SYMLINK_NOFOLLOW)` saw), reads symlinks as text and never resolves them.
//!   File data goes as extents (`SEEK_DATA`/`SEEK_HOLE`), so a sparse file stays sparse;
//!   hard links go as links. A directory or file the program made unreadable to its owner
//!   is made readable for the read and put back as it was.
//! - The stream is a walk, not a list of paths: `D name` creates a directory in the
//!   current one and enters it, `U` leaves it, `F`/`L`/`H` create a file, a symlink or a
//!   hard link in the current directory. A name is one component (1 to 255 bytes, no `/`
//!   or NUL, not `.` or `..`): there is no path to resolve, so nothing in a stream can
//!   point outside the tree it is restored into.
//! - Restore creates each entry new (`mkdirat`, `openat(O_CREAT | O_EXCL | O_NOFOLLOW)`,
//!   `symlinkat`, `linkat`), so an existing entry, a duplicate name or a link in the way is
//!   an error, never followed; symlinks are made as symlinks and never opened; modes,
//!   times and ownership are set on the new entry itself (`AT_SYMLINK_NOFOLLOW`).
//!   Directories are made writable to the restorer while filled and get their mode when
//!   left. It runs into a fresh filesystem of the session's quota, so the kernel refuses
//!   what does not fit (`ENOSPC` becomes [`ArchiveError::Quota`]), and that filesystem is
//!   thrown away whole on any error.
//! - Bounds: [`MAX_DEPTH`] directories deep (one descriptor each), [`MAX_LINKED`] files
//!   with several hard links, [`MAX_TARGET`] bytes of symlink text; special files (FIFOs,
//!   sockets, devices) are left out and counted; extended attributes are not kept.
//!
//! Format (integers little-endian): `CBXWS\x01\n\0`, `R mode:u32 mtime`, then records,
//! then `E entries:u64 data_bytes:u64` at the top level. `mtime` is `sec:i64 nsec:u32`.
//! A name is `len:u8` and its bytes. `D name mode mtime`; `U`; `F name flags:u8 mode
//! mtime size:u64` followed by extents `x offset:u64 len:u64 <bytes>` in increasing order
//! and `z`; `L name mtime len:u16 <target>`; `H name index:u64` (the index counts the `F`
//! records with flag 1, "has other links", from 0).

use std::ffi::{CStr, CString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use nix::sys::time::TimeSpec;

use super::manifest::WorkspaceFacts;

const MAGIC: &[u8; 8] = b"CBXWS\x01\n\0";
/// Directories nested at most this deep (each holds a descriptor while walked).
pub const MAX_DEPTH: usize = 128;
/// Files with more than one hard link, at most (each holds a descriptor on restore).
pub const MAX_LINKED: u64 = 256;
/// Bytes of a symlink's text, at most.
pub const MAX_TARGET: usize = 4095;
/// The mode bits kept: permissions and sticky; never set-id.
const MODE_BITS: u32 = 0o1777;
/// Bytes read or written at once.
const BUF: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot {doing} {path:?}")]
    Io {
        doing: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the workspace is nested deeper than {MAX_DEPTH} directories ({path:?})")]
    TooDeep { path: String },
    #[error("the workspace has more than {MAX_LINKED} files with several hard links")]
    TooManyLinked,
    #[error("the workspace changed while it was being saved ({path:?})")]
    Changed { path: String },
    #[error("the workspace does not fit this server's session quota ({path:?})")]
    Quota { path: String },
    #[error("the workspace stream is malformed: {why}")]
    Malformed { why: String },
    #[error("cannot read the workspace stream")]
    Read(#[source] io::Error),
    #[error("cannot write the workspace stream")]
    Write(#[source] io::Error),
}

type Result<T> = std::result::Result<T, ArchiveError>;

fn malformed(why: impl Into<String>) -> ArchiveError {
    ArchiveError::Malformed { why: why.into() }
}

/// The time stamp of a stat as (sec, nsec).
fn mtime_of(st: &libc::stat) -> (i64, u32) {
    (st.st_mtime, st.st_mtime_nsec.clamp(0, 999_999_999) as u32)
}

fn kind_of(st: &libc::stat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

fn show(prefix: &str, name: &CStr) -> String {
    format!("{prefix}{}", String::from_utf8_lossy(name.to_bytes()))
}

// ------------------------------------------------------------------ capture

/// Writes the tree below `root` (a directory or mount descriptor) to `out`; returns what
/// it held.
pub fn capture(root: BorrowedFd<'_>, out: &mut dyn Write) -> Result<WorkspaceFacts> {
    capture_with(root, out, None)
}

/// [`capture`] of what host user `reader` (uid, gid) may read by the mode bits: a file
/// it may not read, or a directory it may not list and enter, is left out (counted as
/// skipped), and nothing is made readable for the walk. What a sandbox running as
/// `reader` would see of a directory bound into it (the microVM's `/servers` and
/// `/skills`, which travel as streams instead).
pub fn capture_readable_by(
    root: BorrowedFd<'_>,
    out: &mut dyn Write,
    reader: (u32, u32),
) -> Result<WorkspaceFacts> {
    capture_with(root, out, Some(reader))
}

/// Whether `reader` (uid, gid) has all of `need` (rwx bits, 0o4 read, 0o1 search) on
/// `st` by its mode.
fn may(st: &libc::stat, (uid, gid): (u32, u32), need: u32) -> bool {
    let bits = if st.st_uid == uid {
        (st.st_mode >> 6) & 7
    } else if st.st_gid == gid {
        (st.st_mode >> 3) & 7
    } else {
        st.st_mode & 7
    };
    bits & need == need
}

fn capture_with(
    root: BorrowedFd<'_>,
    out: &mut dyn Write,
    reader: Option<(u32, u32)>,
) -> Result<WorkspaceFacts> {
    let io_err = |doing| {
        move |e: Errno| ArchiveError::Io {
            doing,
            path: ".".into(),
            source: e.into(),
        }
    };
    let dir = openat(root, c".", dir_flags(), Mode::empty()).map_err(io_err("open"))?;
    let st = fstat(dir.as_fd()).map_err(io_err("stat"))?;
    let mut c = Capture {
        out: Out(out),
        facts: WorkspaceFacts::default(),
        linked: std::collections::HashMap::new(),
        buf: vec![0u8; BUF],
        reader,
    };
    if reader.is_some_and(|r| !may(&st, r, 0o5)) {
        return Err(ArchiveError::Io {
            doing: "read",
            path: ".".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        });
    }
    c.out.bytes(MAGIC)?;
    c.out.bytes(b"R")?;
    c.out.u32(st.st_mode & MODE_BITS)?;
    c.out.time(mtime_of(&st))?;
    c.walk(dir.as_fd(), "", 0)?;
    c.out.bytes(b"E")?;
    c.out.u64(c.facts.entries)?;
    c.out.u64(c.facts.data_bytes)?;
    if let Ok(vfs) = nix::sys::statvfs::fstatvfs(dir.as_fd()) {
        let used = vfs.blocks().saturating_sub(vfs.blocks_free());
        c.facts.allocated_bytes = used * vfs.fragment_size();
    }
    Ok(c.facts)
}

struct Out<'a>(&'a mut dyn Write);

impl Out<'_> {
    fn bytes(&mut self, b: &[u8]) -> Result<()> {
        self.0.write_all(b).map_err(ArchiveError::Write)
    }
    fn u32(&mut self, v: u32) -> Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> Result<()> {
        self.bytes(&v.to_le_bytes())
    }
    fn time(&mut self, (s, ns): (i64, u32)) -> Result<()> {
        self.bytes(&s.to_le_bytes())?;
        self.u32(ns)
    }
    fn name(&mut self, n: &CStr) -> Result<()> {
        let b = n.to_bytes();
        self.bytes(&[b.len() as u8])?;
        self.bytes(b)
    }
}

struct Capture<'a> {
    out: Out<'a>,
    facts: WorkspaceFacts,
    /// Inodes of files with several links → their index.
    linked: std::collections::HashMap<u64, u64>,
    buf: Vec<u8>,
    /// Only what this host user may read ([`capture_readable_by`]).
    reader: Option<(u32, u32)>,
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Opens `name` in `dir` with `flags`; when its owner may not read it (the program took
/// its own permissions away), adds them for the open and puts the mode back after.
fn open_even_if_locked(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: OFlag,
    mode: u32,
    add: u32,
) -> nix::Result<OwnedFd> {
    match openat(dir, name, flags, Mode::empty()) {
        Err(Errno::EACCES) => {
            let chmod = |m: u32| {
                nix::sys::stat::fchmodat(
                    dir,
                    name,
                    Mode::from_bits_truncate(m),
                    nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                )
            };
            chmod((mode & 0o7777) | add)?;
            let opened = openat(dir, name, flags, Mode::empty());
            let _ = chmod(mode & 0o7777);
            opened
        }
        other => other,
    }
}

impl Capture<'_> {
    /// Opens an entry: for a workspace, even one its owner locked
    /// ([`open_even_if_locked`]); for a reader's view, only as it is.
    fn open(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        flags: OFlag,
        mode: u32,
        add: u32,
    ) -> nix::Result<OwnedFd> {
        match self.reader {
            None => open_even_if_locked(dir, name, flags, mode, add),
            Some(_) => openat(dir, name, flags, Mode::empty()),
        }
    }

    fn walk(&mut self, dir: BorrowedFd<'_>, prefix: &str, depth: usize) -> Result<()> {
        let mut names = crate::session::disk::names(dir).map_err(|source| ArchiveError::Io {
            doing: "list",
            path: prefix.to_string(),
            source,
        })?;
        names.sort();
        for name in names {
            if name.as_bytes().len() > 255 {
                return Err(malformed(format!(
                    "{} has a name over 255 bytes",
                    show(prefix, &name)
                )));
            }
            let io = |doing| {
                let path = show(prefix, &name);
                move |e: Errno| ArchiveError::Io {
                    doing,
                    path,
                    source: e.into(),
                }
            };
            let st = match fstatat(dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => {
                    return Err(ArchiveError::Changed {
                        path: show(prefix, &name),
                    })
                }
                Err(e) => return Err(io("stat")(e)),
            };
            let hidden = |need| self.reader.is_some_and(|r| !may(&st, r, need));
            match kind_of(&st) {
                SFlag::S_IFDIR | SFlag::S_IFREG
                    if hidden(if kind_of(&st) == SFlag::S_IFDIR {
                        0o5
                    } else {
                        0o4
                    }) =>
                {
                    self.facts.skipped += 1;
                }
                SFlag::S_IFDIR => {
                    if depth + 1 > MAX_DEPTH {
                        return Err(ArchiveError::TooDeep {
                            path: show(prefix, &name),
                        });
                    }
                    let child = self
                        .open(dir, &name, dir_flags(), st.st_mode, 0o500)
                        .map_err(io("open the directory"))?;
                    self.same(&child, &st, prefix, &name)?;
                    self.out.bytes(b"D")?;
                    self.out.name(&name)?;
                    self.out.u32(st.st_mode & MODE_BITS)?;
                    self.out.time(mtime_of(&st))?;
                    self.facts.entries += 1;
                    let path = format!("{}/", show(prefix, &name));
                    self.walk(child.as_fd(), &path, depth + 1)?;
                    self.out.bytes(b"U")?;
                }
                SFlag::S_IFREG => self.file(dir, &name, &st, prefix)?,
                SFlag::S_IFLNK => {
                    let target = nix::fcntl::readlinkat(dir, name.as_c_str())
                        .map_err(io("read the link"))?;
                    let target = target.as_bytes();
                    if target.is_empty() || target.len() > MAX_TARGET {
                        return Err(malformed(format!(
                            "{} is a link of {} bytes",
                            show(prefix, &name),
                            target.len()
                        )));
                    }
                    self.out.bytes(b"L")?;
                    self.out.name(&name)?;
                    self.out.time(mtime_of(&st))?;
                    self.out.bytes(&(target.len() as u16).to_le_bytes())?;
                    self.out.bytes(target)?;
                    self.facts.entries += 1;
                }
                _ => self.facts.skipped += 1,
            }
        }
        Ok(())
    }

    /// Whether the opened `fd` is the inode `st` described (not swapped meanwhile).
    fn same(&self, fd: &OwnedFd, st: &libc::stat, prefix: &str, name: &CStr) -> Result<()> {
        match fstat(fd.as_fd()) {
            Ok(now) if now.st_ino == st.st_ino && now.st_dev == st.st_dev => Ok(()),
            _ => Err(ArchiveError::Changed {
                path: show(prefix, name),
            }),
        }
    }

    fn file(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        st: &libc::stat,
        prefix: &str,
    ) -> Result<()> {
        if st.st_nlink > 1 {
            if let Some(&index) = self.linked.get(&st.st_ino) {
                self.out.bytes(b"H")?;
                self.out.name(name)?;
                return self.out.u64(index);
            }
            if self.linked.len() as u64 >= MAX_LINKED {
                return Err(ArchiveError::TooManyLinked);
            }
        }
        let io = |doing| {
            let path = show(prefix, name);
            move |e: Errno| ArchiveError::Io {
                doing,
                path,
                source: e.into(),
            }
        };
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = self
            .open(dir, name, flags, st.st_mode, 0o400)
            .map_err(io("open"))?;
        self.same(&fd, st, prefix, name)?;
        let linked = st.st_nlink > 1;
        if linked {
            let index = self.linked.len() as u64;
            self.linked.insert(st.st_ino, index);
        }
        let size = st.st_size.max(0) as u64;
        self.out.bytes(b"F")?;
        self.out.name(name)?;
        self.out.bytes(&[u8::from(linked)])?;
        self.out.u32(st.st_mode & MODE_BITS)?;
        self.out.time(mtime_of(st))?;
        self.out.u64(size)?;
        self.facts.entries += 1;
        let mut off = 0u64;
        while off < size {
            use nix::unistd::{lseek, Whence};
            let data = match lseek(fd.as_fd(), off as i64, Whence::SeekData) {
                Ok(d) => d as u64,
                Err(Errno::ENXIO) => break,
                // No hole support: the rest is data.
                Err(Errno::EINVAL) => off,
                Err(e) => return Err(io("seek in")(e)),
            };
            if data >= size {
                break;
            }
            let hole = match lseek(fd.as_fd(), data as i64, Whence::SeekHole) {
                Ok(h) => (h as u64).min(size),
                Err(_) => size,
            };
            if hole <= data {
                return Err(ArchiveError::Changed {
                    path: show(prefix, name),
                });
            }
            self.extent(&fd, data, hole - data, prefix, name)?;
            off = hole;
        }
        self.out.bytes(b"z")
    }

    fn extent(&mut self, fd: &OwnedFd, at: u64, len: u64, prefix: &str, name: &CStr) -> Result<()> {
        self.out.bytes(b"x")?;
        self.out.u64(at)?;
        self.out.u64(len)?;
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(BUF as u64) as usize;
            let n =
                match nix::sys::uio::pread(fd.as_fd(), &mut self.buf[..want], (at + done) as i64) {
                    Ok(0) => {
                        return Err(ArchiveError::Changed {
                            path: show(prefix, name),
                        })
                    }
                    Ok(n) => n,
                    Err(Errno::EINTR) => continue,
                    Err(e) => {
                        return Err(ArchiveError::Io {
                            doing: "read",
                            path: show(prefix, name),
                            source: e.into(),
                        })
                    }
                };
            self.out
                .0
                .write_all(&self.buf[..n])
                .map_err(ArchiveError::Write)?;
            done += n as u64;
        }
        self.facts.data_bytes += len;
        Ok(())
    }
}

// ------------------------------------------------------------------ restore

/// Creates the tree the stream `inp` describes below `root` (an empty directory or mount
/// descriptor), every entry owned by `owner`. Returns what it held. On error, what was
/// made stays: the caller throws the filesystem away.
pub fn restore(
    inp: &mut dyn Read,
    root: BorrowedFd<'_>,
    owner: (u32, u32),
) -> Result<WorkspaceFacts> {
    let mut r = Restore {
        inp: In(inp),
        owner,
        chown: owner
            != (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            ),
        facts: WorkspaceFacts::default(),
        linked: Vec::new(),
        buf: vec![0u8; BUF],
    };
    let mut magic = [0u8; 8];
    r.inp.exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(malformed("not a workspace stream"));
    }
    if r.inp.u8()? != b'R' {
        return Err(malformed("no root record"));
    }
    let root_mode = r.inp.u32()?;
    let root_time = r.inp.time()?;
    let top = openat(root, c".", dir_flags(), Mode::empty()).map_err(|e| ArchiveError::Io {
        doing: "open",
        path: ".".into(),
        source: e.into(),
    })?;
    // (descriptor, mode, mtime, path) of the directories entered.
    let mut stack: Vec<(OwnedFd, u32, (i64, u32), String)> =
        vec![(top, root_mode, root_time, String::new())];
    loop {
        let tag = r.inp.u8()?;
        let depth = stack.len() - 1;
        let (dir, _, _, prefix) = stack.last().expect("the root stays");
        let dir = dir.as_fd();
        let prefix = prefix.clone();
        match tag {
            b'D' => {
                let name = r.inp.name()?;
                let mode = r.inp.u32()?;
                let time = r.inp.time()?;
                if depth + 1 > MAX_DEPTH {
                    return Err(malformed(format!(
                        "nested deeper than {MAX_DEPTH} directories"
                    )));
                }
                let path = show(&prefix, &name);
                nix::sys::stat::mkdirat(dir, name.as_c_str(), Mode::from_bits_truncate(0o700))
                    .map_err(|e| r.fail("make the directory", &path, e))?;
                let child = openat(dir, name.as_c_str(), dir_flags(), Mode::empty())
                    .map_err(|e| r.fail("open the directory", &path, e))?;
                r.own(child.as_fd(), &path)?;
                r.facts.entries += 1;
                stack.push((child, mode, time, format!("{path}/")));
            }
            b'U' => {
                if depth == 0 {
                    return Err(malformed("leaves the top directory"));
                }
                let (fd, mode, time, path) = stack.pop().expect("depth > 0");
                settle(fd.as_fd(), mode, time).map_err(|e| r.fail("set the mode of", &path, e))?;
            }
            b'F' => r.file(dir, &prefix)?,
            b'L' => {
                let name = r.inp.name()?;
                let time = r.inp.time()?;
                let len = u16::from_le_bytes([r.inp.u8()?, r.inp.u8()?]) as usize;
                if len == 0 || len > MAX_TARGET {
                    return Err(malformed(format!("a link of {len} bytes")));
                }
                let mut target = vec![0u8; len];
                r.inp.exact(&mut target)?;
                let target =
                    CString::new(target).map_err(|_| malformed("a link with a NUL byte"))?;
                let path = show(&prefix, &name);
                nix::unistd::symlinkat(target.as_c_str(), dir, name.as_c_str())
                    .map_err(|e| r.fail("make the link", &path, e))?;
                if r.chown {
                    nix::unistd::fchownat(
                        dir,
                        name.as_c_str(),
                        Some(nix::unistd::Uid::from_raw(r.owner.0)),
                        Some(nix::unistd::Gid::from_raw(r.owner.1)),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| r.fail("set the owner of", &path, e))?;
                }
                nix::sys::stat::utimensat(
                    dir,
                    name.as_c_str(),
                    &TimeSpec::UTIME_OMIT,
                    &TimeSpec::new(time.0, time.1 as i64),
                    nix::sys::stat::UtimensatFlags::NoFollowSymlink,
                )
                .map_err(|e| r.fail("set the time of", &path, e))?;
                r.facts.entries += 1;
            }
            b'H' => {
                let name = r.inp.name()?;
                let index = r.inp.u64()?;
                let path = show(&prefix, &name);
                let Some(target) = r.linked.get(index as usize) else {
                    return Err(malformed(format!(
                        "{path:?} links to file {index}, which is not there"
                    )));
                };
                let proc = format!("/proc/self/fd/{}", target.as_raw_fd());
                nix::unistd::linkat(
                    nix::fcntl::AT_FDCWD,
                    proc.as_str(),
                    dir,
                    name.as_c_str(),
                    AtFlags::AT_SYMLINK_FOLLOW,
                )
                .map_err(|e| r.fail("link", &path, e))?;
            }
            b'E' => {
                if depth != 0 {
                    return Err(malformed("ends inside a directory"));
                }
                let entries = r.inp.u64()?;
                let data = r.inp.u64()?;
                if entries != r.facts.entries || data != r.facts.data_bytes {
                    return Err(malformed(format!(
                        "its end counts {entries} entries and {data} bytes, the stream held {} and {}",
                        r.facts.entries, r.facts.data_bytes
                    )));
                }
                let (fd, mode, time, _) = stack.pop().expect("the root");
                settle(fd.as_fd(), mode, time).map_err(|e| r.fail("set the mode of", ".", e))?;
                if let Ok(vfs) = nix::sys::statvfs::fstatvfs(fd.as_fd()) {
                    let used = vfs.blocks().saturating_sub(vfs.blocks_free());
                    r.facts.allocated_bytes = used * vfs.fragment_size();
                }
                return Ok(r.facts);
            }
            other => return Err(malformed(format!("unknown record {other:#04x}"))),
        }
    }
}

/// A directory's final mode and time, once its entries are in.
fn settle(fd: BorrowedFd<'_>, mode: u32, (s, ns): (i64, u32)) -> nix::Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode & MODE_BITS))?;
    nix::sys::stat::futimens(fd, &TimeSpec::UTIME_OMIT, &TimeSpec::new(s, ns as i64))
}

struct In<'a>(&'a mut dyn Read);

impl In<'_> {
    fn exact(&mut self, b: &mut [u8]) -> Result<()> {
        self.0.read_exact(b).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                malformed("it ends early")
            } else {
                ArchiveError::Read(e)
            }
        })
    }
    fn u8(&mut self) -> Result<u8> {
        let mut b = [0u8; 1];
        self.exact(&mut b)?;
        Ok(b[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn time(&mut self) -> Result<(i64, u32)> {
        let mut b = [0u8; 8];
        self.exact(&mut b)?;
        let ns = self.u32()?;
        if ns > 999_999_999 {
            return Err(malformed("a time stamp with more than 1e9 ns"));
        }
        Ok((i64::from_le_bytes(b), ns))
    }
    /// One path component: 1 to 255 bytes, no `/` or NUL, not `.` or `..`.
    fn name(&mut self) -> Result<CString> {
        let len = self.u8()? as usize;
        let mut b = vec![0u8; len];
        self.exact(&mut b)?;
        if len == 0 || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
            return Err(malformed(format!(
                "the name {:?} is not a single path component",
                String::from_utf8_lossy(&b)
            )));
        }
        Ok(CString::new(b).expect("no NUL, checked"))
    }
}

struct Restore<'a> {
    inp: In<'a>,
    owner: (u32, u32),
    /// Whether entries need a chown (the restorer is not the owner: as root).
    chown: bool,
    facts: WorkspaceFacts,
    /// Files with other links, in order (their index).
    linked: Vec<OwnedFd>,
    buf: Vec<u8>,
}

impl Restore<'_> {
    fn fail(&self, doing: &'static str, path: &str, e: Errno) -> ArchiveError {
        match e {
            Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG => {
                ArchiveError::Quota { path: path.into() }
            }
            Errno::EEXIST => malformed(format!("{path:?} is in the stream twice")),
            e => ArchiveError::Io {
                doing,
                path: path.into(),
                source: e.into(),
            },
        }
    }

    fn own(&self, fd: BorrowedFd<'_>, path: &str) -> Result<()> {
        if self.chown {
            nix::unistd::fchown(
                fd,
                Some(nix::unistd::Uid::from_raw(self.owner.0)),
                Some(nix::unistd::Gid::from_raw(self.owner.1)),
            )
            .map_err(|e| self.fail("set the owner of", path, e))?;
        }
        Ok(())
    }

    fn file(&mut self, dir: BorrowedFd<'_>, prefix: &str) -> Result<()> {
        let name = self.inp.name()?;
        let flags = self.inp.u8()?;
        let mode = self.inp.u32()?;
        let time = self.inp.time()?;
        let size = self.inp.u64()?;
        if flags > 1 || size > i64::MAX as u64 {
            return Err(malformed("a file record out of range"));
        }
        let path = show(prefix, &name);
        let fd = openat(
            dir,
            name.as_c_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| self.fail("create", &path, e))?;
        self.facts.entries += 1;
        nix::unistd::ftruncate(fd.as_fd(), size as i64).map_err(|e| self.fail("size", &path, e))?;
        let mut end = 0u64;
        loop {
            match self.inp.u8()? {
                b'z' => break,
                b'x' => {
                    let at = self.inp.u64()?;
                    let len = self.inp.u64()?;
                    if len == 0 || at < end || at.checked_add(len).is_none_or(|e| e > size) {
                        return Err(malformed(format!(
                            "{path:?} has an extent out of order or past its size"
                        )));
                    }
                    self.write_extent(&fd, at, len, &path)?;
                    end = at + len;
                    self.facts.data_bytes += len;
                }
                other => {
                    return Err(malformed(format!(
                        "{path:?}: unknown record {other:#04x} in a file"
                    )))
                }
            }
        }
        self.own(fd.as_fd(), &path)?;
        nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(mode & MODE_BITS))
            .map_err(|e| self.fail("set the mode of", &path, e))?;
        nix::sys::stat::futimens(
            fd.as_fd(),
            &TimeSpec::UTIME_OMIT,
            &TimeSpec::new(time.0, time.1 as i64),
        )
        .map_err(|e| self.fail("set the time of", &path, e))?;
        if flags == 1 {
            if self.linked.len() as u64 >= MAX_LINKED {
                return Err(malformed(format!("more than {MAX_LINKED} linked files")));
            }
            self.linked.push(fd);
        }
        Ok(())
    }

    fn write_extent(&mut self, fd: &OwnedFd, at: u64, len: u64, path: &str) -> Result<()> {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(BUF as u64) as usize;
            let mut chunk = std::mem::take(&mut self.buf);
            let got = self.inp.exact(&mut chunk[..n]);
            let mut written = 0;
            let result = got.and_then(|()| {
                while written < n {
                    match nix::sys::uio::pwrite(
                        fd.as_fd(),
                        &chunk[written..n],
                        (at + done) as i64 + written as i64,
                    ) {
                        Ok(k) => written += k,
                        Err(Errno::EINTR) => {}
                        Err(e) => return Err(self.fail("write", path, e)),
                    }
                }
                Ok(())
            });
            self.buf = chunk;
            result?;
            done += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
