use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn open(p: &Path) -> OwnedFd {
    nix::fcntl::open(p, dir_flags(), Mode::empty()).unwrap()
}

fn me() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

fn stream_of(dir: &Path) -> (Vec<u8>, WorkspaceFacts) {
    let mut out = Vec::new();
    let facts = capture(open(dir).as_fd(), &mut out).unwrap();
    (out, facts)
}

/// Everything below `dir` as (path, kind, mode, content or link text), sorted.
fn tree(dir: &Path) -> Vec<(String, String, u32, Vec<u8>)> {
    let mut out = Vec::new();
    fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String, u32, Vec<u8>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p
                .strip_prefix(base)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let rel = String::from_utf8_lossy(&rel).into_owned();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let mode = md.mode() & 0o7777;
            if md.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((rel, "link".into(), 0, t.as_os_str().as_bytes().to_vec()));
            } else if md.is_dir() {
                out.push((rel, "dir".into(), mode, vec![]));
                walk(base, &p, out);
            } else if md.is_file() {
                let content = if mode & 0o400 != 0 || nix::unistd::geteuid().is_root() {
                    std::fs::read(&p).unwrap()
                } else {
                    b"(unreadable)".to_vec()
                };
                out.push((rel, "file".into(), mode, content));
            } else {
                out.push((rel, "other".into(), mode, vec![]));
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

#[test]
fn a_tree_round_trips_with_links_holes_modes_and_byte_names() {
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir_all(s.join("a/b/c")).unwrap();
    std::fs::write(s.join("a/b/c/deep.txt"), "deep").unwrap();
    std::fs::write(s.join("small"), "hello").unwrap();
    let big: Vec<u8> = (0..3 * BUF + 17).map(|i| (i % 253) as u8).collect();
    std::fs::write(s.join("big.bin"), &big).unwrap();
    // A sparse file: 64 MiB long, 4 KiB of data in the middle.
    let sparse = std::fs::File::create(s.join("sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    nix::sys::uio::pwrite(&sparse, &[9u8; 4096], 32 << 20).unwrap();
    drop(sparse);
    std::os::unix::fs::symlink("/etc/passwd", s.join("abs-link")).unwrap();
    std::os::unix::fs::symlink("../../outside", s.join("a/rel-link")).unwrap();
    std::os::unix::fs::symlink("dangling", s.join("dangling")).unwrap();
    std::fs::hard_link(s.join("small"), s.join("a/hard")).unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"n\xffme \n\t");
    std::fs::write(s.join(odd), "odd").unwrap();
    std::fs::create_dir(s.join("out")).unwrap();
    nix::unistd::mkfifo(&s.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
    std::fs::write(s.join("ro"), "read only").unwrap();
    std::fs::set_permissions(s.join("ro"), std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(s.join("a/b"), std::fs::Permissions::from_mode(0o555)).unwrap();
    let old = nix::sys::time::TimeSpec::new(1_000_000_000, 123);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &s.join("small"),
        &old,
        &old,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();

    let (stream, facts) = stream_of(s);
    assert_eq!(facts.skipped, 1, "the FIFO");
    // a, a/b, a/b/c, deep.txt, small, big.bin, sparse, 3 links, odd, out, ro (the hard
    // link is no new inode).
    assert_eq!(facts.entries, 13);
    assert_eq!(facts.data_bytes, 4 + 5 + big.len() as u64 + 4096 + 3 + 9);
    assert!(
        stream.len() < 1 << 20,
        "the hole is not in the stream: {}",
        stream.len()
    );

    let dst = tempfile::tempdir().unwrap();
    let back = restore(&mut stream.as_slice(), open(dst.path()).as_fd(), me()).unwrap();
    assert_eq!(back.entries, facts.entries);
    assert_eq!(back.data_bytes, facts.data_bytes);
    let mut want = tree(s);
    want.retain(|e| e.1 != "other");
    assert_eq!(tree(dst.path()), want);
    let d = dst.path();
    assert_eq!(std::fs::read(d.join("big.bin")).unwrap(), big);
    let sp = std::fs::metadata(d.join("sparse")).unwrap();
    assert_eq!(sp.len(), 64 << 20);
    assert!(
        sp.blocks() * 512 < 1 << 20,
        "still sparse: {} blocks",
        sp.blocks()
    );
    assert_eq!(
        std::fs::metadata(d.join("small")).unwrap().ino(),
        std::fs::metadata(d.join("a/hard")).unwrap().ino(),
        "a hard link stays one"
    );
    let md = std::fs::metadata(d.join("small")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 123));
    assert!(std::fs::symlink_metadata(d.join("abs-link"))
        .unwrap()
        .file_type()
        .is_symlink());
    // Let the temp dirs be removed.
    for dir in [s, d] {
        std::fs::set_permissions(dir.join("a/b"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn what_the_owner_made_unreadable_is_saved_and_left_as_it_was() {
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir(s.join("locked")).unwrap();
    std::fs::write(s.join("locked/inside"), "x").unwrap();
    std::fs::write(s.join("secret"), "y").unwrap();
    std::fs::set_permissions(s.join("secret"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::set_permissions(s.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let (stream, facts) = stream_of(s);
    assert_eq!(facts.entries, 3);
    let mode = |p: &str| std::fs::metadata(s.join(p)).unwrap().mode() & 0o777;
    assert_eq!((mode("locked"), mode("secret")), (0, 0), "put back");
    let dst = tempfile::tempdir().unwrap();
    restore(&mut stream.as_slice(), open(dst.path()).as_fd(), me()).unwrap();
    let d = dst.path();
    for p in [s, d] {
        std::fs::set_permissions(p.join("locked"), std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(p.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    assert_eq!(std::fs::read(d.join("locked/inside")).unwrap(), b"x");
    assert_eq!(std::fs::read(d.join("secret")).unwrap(), b"y");
}

#[test]
fn a_tree_too_deep_is_refused_on_capture() {
    let src = tempfile::tempdir().unwrap();
    let mut p = src.path().to_path_buf();
    for _ in 0..=MAX_DEPTH {
        p.push("d");
    }
    std::fs::create_dir_all(&p).unwrap();
    let e = capture(open(src.path()).as_fd(), &mut Vec::new()).unwrap_err();
    assert!(matches!(e, ArchiveError::TooDeep { .. }), "{e}");
}

/// A stream writer for hostile cases.
struct Forge(Vec<u8>);

impl Forge {
    fn new() -> Forge {
        let mut f = Forge(MAGIC.to_vec());
        f.0.push(b'R');
        f.0.extend_from_slice(&0o755u32.to_le_bytes());
        f.time();
        f
    }
    fn time(&mut self) -> &mut Self {
        self.0.extend_from_slice(&0i64.to_le_bytes());
        self.0.extend_from_slice(&0u32.to_le_bytes());
        self
    }
    fn name(&mut self, n: &[u8]) -> &mut Self {
        self.0.push(n.len() as u8);
        self.0.extend_from_slice(n);
        self
    }
    fn dir(&mut self, n: &[u8]) -> &mut Self {
        self.0.push(b'D');
        self.name(n);
        self.0.extend_from_slice(&0o755u32.to_le_bytes());
        self.time()
    }
    fn up(&mut self) -> &mut Self {
        self.0.push(b'U');
        self
    }
    fn file(&mut self, n: &[u8], size: u64, extents: &[(u64, &[u8])]) -> &mut Self {
        self.0.push(b'F');
        self.name(n);
        self.0.push(0);
        self.0.extend_from_slice(&0o644u32.to_le_bytes());
        self.time();
        self.0.extend_from_slice(&size.to_le_bytes());
        for (at, data) in extents {
            self.0.push(b'x');
            self.0.extend_from_slice(&at.to_le_bytes());
            self.0.extend_from_slice(&(data.len() as u64).to_le_bytes());
            self.0.extend_from_slice(data);
        }
        self.0.push(b'z');
        self
    }
    fn link(&mut self, n: &[u8], target: &[u8]) -> &mut Self {
        self.0.push(b'L');
        self.name(n);
        self.time();
        self.0
            .extend_from_slice(&(target.len() as u16).to_le_bytes());
        self.0.extend_from_slice(target);
        self
    }
    fn hard(&mut self, n: &[u8], index: u64) -> &mut Self {
        self.0.push(b'H');
        self.name(n);
        self.0.extend_from_slice(&index.to_le_bytes());
        self
    }
    fn end(&mut self, entries: u64, data: u64) -> Vec<u8> {
        self.0.push(b'E');
        self.0.extend_from_slice(&entries.to_le_bytes());
        self.0.extend_from_slice(&data.to_le_bytes());
        self.0.clone()
    }
}

/// Restores `stream` into `box/inside`, next to `box/outside/canary`; returns the
/// result and checks nothing outside `inside` changed.
fn restore_boxed(stream: &[u8]) -> (Result<WorkspaceFacts>, tempfile::TempDir) {
    let b = tempfile::tempdir().unwrap();
    std::fs::create_dir(b.path().join("inside")).unwrap();
    std::fs::create_dir(b.path().join("outside")).unwrap();
    std::fs::write(b.path().join("outside/canary"), "untouched").unwrap();
    let r = restore(
        &mut &stream[..],
        open(&b.path().join("inside")).as_fd(),
        me(),
    );
    let outside: Vec<_> = std::fs::read_dir(b.path().join("outside"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, ["canary"], "nothing new outside the tree");
    assert_eq!(
        std::fs::read(b.path().join("outside/canary")).unwrap(),
        b"untouched"
    );
    let top: Vec<_> = std::fs::read_dir(b.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(top.len(), 2, "nothing new beside the tree: {top:?}");
    (r, b)
}

#[test]
fn hostile_streams_are_refused_and_never_reach_outside_the_tree() {
    let ok = Forge::new()
        .dir(b"d")
        .file(b"f", 3, &[(0, b"abc")])
        .up()
        .link(b"l", b"../outside")
        .end(3, 3);
    let (r, b) = restore_boxed(&ok);
    r.unwrap();
    assert_eq!(std::fs::read(b.path().join("inside/d/f")).unwrap(), b"abc");

    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dot-dot name",
            Forge::new().file(b"..", 1, &[(0, b"x")]).end(1, 1),
        ),
        (
            "dot-dot dir",
            Forge::new().dir(b"..").file(b"x", 0, &[]).up().end(2, 0),
        ),
        (
            "slash in a name",
            Forge::new()
                .file(b"../outside/canary", 1, &[(0, b"x")])
                .end(1, 1),
        ),
        (
            "absolute name",
            Forge::new().file(b"/tmp/x", 1, &[(0, b"x")]).end(1, 1),
        ),
        ("empty name", Forge::new().file(b"", 0, &[]).end(1, 0)),
        (
            "NUL in a name",
            Forge::new().file(b"a\0b", 0, &[]).end(1, 0),
        ),
        ("dot", Forge::new().dir(b".").up().end(1, 0)),
        // A link planted, then written through: refused (the name exists), never followed.
        (
            "write through a link",
            Forge::new()
                .link(b"l", b"../outside/canary")
                .file(b"l", 1, &[(0, b"x")])
                .end(2, 1),
        ),
        (
            "enter through a link",
            Forge::new()
                .link(b"l", b"../outside")
                .dir(b"l")
                .file(b"x", 0, &[])
                .up()
                .end(3, 0),
        ),
        (
            "duplicate file",
            Forge::new().file(b"a", 0, &[]).file(b"a", 0, &[]).end(2, 0),
        ),
        ("leave the top", Forge::new().up().end(0, 0)),
        ("end inside a directory", Forge::new().dir(b"d").end(1, 0)),
        (
            "extent past the size",
            Forge::new().file(b"f", 2, &[(0, b"abc")]).end(1, 3),
        ),
        (
            "extents out of order",
            Forge::new()
                .file(b"f", 10, &[(5, b"ab"), (0, b"cd")])
                .end(1, 4),
        ),
        (
            "empty extent",
            Forge::new().file(b"f", 10, &[(0, b"")]).end(1, 0),
        ),
        ("hard link to nothing", Forge::new().hard(b"h", 0).end(0, 0)),
        (
            "wrong end counts",
            Forge::new().file(b"f", 1, &[(0, b"x")]).end(5, 1),
        ),
        ("empty link", Forge::new().link(b"l", b"").end(1, 0)),
        ("NUL in a link", Forge::new().link(b"l", b"a\0b").end(1, 0)),
        ("unknown record", {
            let mut f = Forge::new();
            f.0.push(b'Q');
            f.end(0, 0)
        }),
        ("not a stream", b"hello world, not a workspace".to_vec()),
    ];
    for (what, stream) in cases {
        let (r, _b) = restore_boxed(&stream);
        let e = r.expect_err(what);
        assert!(matches!(e, ArchiveError::Malformed { .. }), "{what}: {e}");
    }
    // Too deep.
    let mut deep = Forge::new();
    for _ in 0..=MAX_DEPTH {
        deep.dir(b"d");
    }
    let (r, _b) = restore_boxed(&deep.end(0, 0));
    assert!(matches!(r, Err(ArchiveError::Malformed { .. })));
    // Every cut of a good stream fails (and never reaches outside).
    for cut in 0..ok.len() {
        let (r, _b) = restore_boxed(&ok[..cut]);
        assert!(r.is_err(), "cut at {cut}");
    }
}

#[test]
fn a_restore_beyond_the_filesystems_size_is_a_quota_error() {
    let ids = me();
    let keeper = match crate::session::keeper::Keeper::start(ids) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("skipped: no workspace keeper on this host ({e})");
            return;
        }
    };
    let mount = keeper.create(1 << 20, 100).unwrap();
    let big = vec![1u8; 2 << 20];
    let stream = Forge::new()
        .file(b"big", big.len() as u64, &[(0, &big)])
        .end(1, big.len() as u64);
    let e = restore(&mut stream.as_slice(), mount.as_fd(), ids).unwrap_err();
    assert!(matches!(e, ArchiveError::Quota { .. }), "{e}");
    // Inodes too.
    let mount = keeper.create(1 << 20, 5).unwrap();
    let mut many = Forge::new();
    for i in 0..10 {
        many.file(format!("f{i}").as_bytes(), 0, &[]);
    }
    let e = restore(&mut many.end(10, 0).as_slice(), mount.as_fd(), ids).unwrap_err();
    assert!(matches!(e, ArchiveError::Quota { .. }), "{e}");
}

#[test]
fn a_reader_s_view_leaves_out_what_it_may_not_read_and_changes_no_mode() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let set = |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
    std::fs::write(d.join("open.txt"), b"o").unwrap();
    set(&d.join("open.txt"), 0o644).unwrap();
    std::fs::write(d.join("secret.env"), b"s").unwrap();
    set(&d.join("secret.env"), 0o600).unwrap();
    std::fs::create_dir(d.join("private")).unwrap();
    std::fs::write(d.join("private/x"), b"x").unwrap();
    set(&d.join("private"), 0o700).unwrap();
    std::fs::create_dir(d.join("pub")).unwrap();
    std::fs::write(d.join("pub/y"), b"y").unwrap();
    set(&d.join("pub/y"), 0o644).unwrap();
    set(&d.join("pub"), 0o755).unwrap();
    set(d, 0o755).unwrap();
    // Neither the owner nor in the group: only the "other" bits count for it.
    let (uid, gid) = me();
    let reader = (uid.wrapping_add(4242), gid.wrapping_add(4242));
    let mut out = Vec::new();
    let facts = capture_readable_by(open(d).as_fd(), &mut out, reader).unwrap();
    assert_eq!(facts.skipped, 2, "secret.env and private/ are left out");
    let back = tempfile::tempdir().unwrap();
    restore(&mut &out[..], open(back.path()).as_fd(), me()).unwrap();
    let names: Vec<String> = tree(back.path()).into_iter().map(|e| e.0).collect();
    assert_eq!(names, ["open.txt", "pub", "pub/y"], "{names:?}");
    // Nothing was made readable on the way.
    assert_eq!(
        std::fs::metadata(d.join("secret.env")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::metadata(d.join("private")).unwrap().mode() & 0o777,
        0o700
    );
    // The owner itself sees it all.
    let mut own = Vec::new();
    let facts = capture_readable_by(open(d).as_fd(), &mut own, me()).unwrap();
    assert_eq!(facts.skipped, 0);
}
