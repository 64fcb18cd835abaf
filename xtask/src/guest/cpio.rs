//! A writer of the kernel's initramfs format: a "newc" cpio archive (`070701` headers,
//! ASCII hex fields, names and data padded to 4 bytes, `TRAILER!!!` at the end).
//!
//! Entries carry what the kernel's unpacker (`init/initramfs.c`) reads and nothing of the
//! build host: owner root, mtime 0, no device numbers, inode numbers counted from 1, so
//! the same inputs give the same bytes.

use std::io::{self, Write};

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node<'a> {
    Dir,
    File(&'a [u8]),
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;

/// Writes entries in order; `finish` appends the trailer.
pub struct Writer<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Writer {
            out,
            ino: 0,
            written: 0,
        }
    }

    /// One entry at `path` (relative, no leading `/`; parents first) with permission bits
    /// `mode`.
    pub fn add(&mut self, path: &str, mode: u32, node: Node<'_>) -> io::Result<()> {
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|c| c == "..") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad initramfs path {path:?}"),
            ));
        }
        let (kind, data): (u32, &[u8]) = match node {
            Node::Dir => (S_IFDIR, &[]),
            Node::File(bytes) => (S_IFREG, bytes),
        };
        self.ino += 1;
        let nlink = if kind == S_IFDIR { 2 } else { 1 };
        self.entry(self.ino, kind | (mode & 0o7777), nlink, path, data)
    }

    fn entry(
        &mut self,
        ino: u32,
        mode: u32,
        nlink: u32,
        name: &str,
        data: &[u8],
    ) -> io::Result<()> {
        let size = u32::try_from(data.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} is over 4 GiB, more than newc can say"),
            )
        })?;
        // magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
        // rdevmajor, rdevminor, namesize (with its NUL), check.
        let header = format!(
            "070701{ino:08X}{mode:08X}{:08X}{:08X}{nlink:08X}{:08X}{size:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..n])
    }

    /// The trailer; returns the writer and the archive's size.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        self.entry(0, 0, 1, "TRAILER!!!", &[])?;
        Ok((self.out, self.written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(header: &[u8], index: usize) -> u32 {
        let at = 6 + index * 8;
        u32::from_str_radix(std::str::from_utf8(&header[at..at + 8]).unwrap(), 16).unwrap()
    }

    #[test]
    fn entries_are_newc_aligned_and_end_with_the_trailer() {
        let mut w = Writer::new(Vec::new());
        w.add("init", 0o755, Node::File(b"hello")).unwrap();
        w.add("lib", 0o755, Node::Dir).unwrap();
        w.add("lib/x", 0o644, Node::File(b"")).unwrap();
        let (bytes, size) = w.finish().unwrap();
        assert_eq!(size as usize, bytes.len());
        assert_eq!(bytes.len() % 4, 0);
        // First entry: header, "init\0" padded, data padded.
        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(field(&bytes, 0), 1, "inode");
        assert_eq!(field(&bytes, 1), S_IFREG | 0o755);
        assert_eq!(field(&bytes, 2), 0, "uid");
        assert_eq!(field(&bytes, 5), 0, "mtime");
        assert_eq!(field(&bytes, 6), 5, "size");
        assert_eq!(field(&bytes, 11), 5, "name size with NUL");
        // 110-byte header + 5 name bytes = 115, padded to 116; data at 116..121, to 124.
        assert_eq!(&bytes[110..115], b"init\0");
        assert_eq!(&bytes[116..121], b"hello");
        let second = 124;
        assert_eq!(&bytes[second..second + 6], b"070701");
        assert_eq!(field(&bytes[second..], 1), S_IFDIR | 0o755);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("lib/x\0"));
        assert!(text.contains("TRAILER!!!\0"));
    }

    #[test]
    fn the_same_input_gives_the_same_bytes() {
        let build = || {
            let mut w = Writer::new(Vec::new());
            w.add("a", 0o644, Node::File(b"x")).unwrap();
            w.finish().unwrap().0
        };
        assert_eq!(build(), build());
    }

    #[test]
    fn paths_that_leave_the_archive_are_refused() {
        let mut w = Writer::new(Vec::new());
        for bad in ["", "/init", "a/../../etc"] {
            assert!(w.add(bad, 0o644, Node::Dir).is_err(), "{bad:?}");
        }
    }

    /// The archive as the kernel (or GNU cpio) reads it: Debian's cpio lists our entries.
    #[test]
    fn gnu_cpio_reads_it_back() {
        if !std::path::Path::new("/usr/bin/cpio").exists() {
            eprintln!("SKIP: /usr/bin/cpio is not installed");
            return;
        }
        let mut w = Writer::new(Vec::new());
        w.add("dir", 0o755, Node::Dir).unwrap();
        w.add("dir/file", 0o644, Node::File(b"contents\n")).unwrap();
        let (bytes, _) = w.finish().unwrap();
        let mut child = std::process::Command::new("/usr/bin/cpio")
            .args(["-t", "-v", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let listing = String::from_utf8(out.stdout).unwrap();
        assert!(listing.contains("dir/file"), "{listing}");
        assert!(listing.contains("-rw-r--r--"), "{listing}");
    }
}
