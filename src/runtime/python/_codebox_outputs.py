"""Output files: what the program left under /workspace/out (and the workspace files the
call named in `outputs`), sent to the supervisor on fd 3 at the end of a run.

Protocol (src/runtime/boot.rs, OUTPUTS record, read by boot.py): per file, lines
`codebox/file {"path", "offset", "base64"}` with at most CHUNK bytes each (a file's
chunks in order; an empty file is one line at offset 0), then, when anything was left
out, one `codebox/files {"skipped": [{"path", "why"}], "omitted": n}`. The supervisor checks
everything again: this is the program's sandbox, and the program could write such lines
itself.

Nothing is followed: the tree is walked with directory fds and O_NOFOLLOW, a symlink is
reported as skipped, and only regular files are read (O_NONBLOCK: a FIFO never blocks
the open).
"""

import posix
import stat

CHUNK = 1 << 20
OUT_DIR = "out"
# Entries looked at in /workspace/out, whatever their kind: a program that leaves a
# million files there is told so, not walked.
MAX_ENTRIES = 10_000
MAX_DEPTH = 16
# Skipped files reported by name; the rest are counted in "omitted".
MAX_SKIPPED = 100

_DIR_FLAGS = posix.O_RDONLY | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC
_FILE_FLAGS = posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK


class _Walk:
    def __init__(self):
        self.found = []  # paths relative to /workspace, in walk order
        self.skipped = []
        self.omitted = 0
        self.entries = 0

    def skip(self, path, why):
        if len(self.skipped) < MAX_SKIPPED:
            self.skipped.append({"path": path, "why": why})
        else:
            self.omitted += 1


def _open_dir(parent_fd, name):
    return posix.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def _walk(walk, dir_fd, prefix, depth):
    """Appends the path (relative to /workspace) of every regular file below dir_fd."""
    try:
        entries = sorted(posix.scandir(dir_fd), key=lambda e: e.name)
    except OSError as e:
        walk.skip(prefix.rstrip("/") or OUT_DIR, "cannot be listed: %s" % e.strerror)
        return
    for entry in entries:
        walk.entries += 1
        if walk.entries > MAX_ENTRIES:
            walk.omitted += 1
            continue
        path = prefix + entry.name
        try:
            path.encode("utf-8")
        except UnicodeError:
            walk.skip(path.encode("utf-8", "replace").decode(), "its name is not UTF-8")
            continue
        if entry.is_symlink():
            walk.skip(path, "a symlink (never followed)")
        elif entry.is_dir(follow_symlinks=False):
            if depth >= MAX_DEPTH:
                walk.skip(path, "deeper than %d directories" % MAX_DEPTH)
                continue
            try:
                child = _open_dir(dir_fd, entry.name)
            except OSError as e:
                walk.skip(path, "cannot be opened: %s" % e.strerror)
                continue
            try:
                _walk(walk, child, path + "/", depth + 1)
            finally:
                posix.close(child)
        elif entry.is_file(follow_symlinks=False):
            walk.found.append(path)
        else:
            walk.skip(path, "not a regular file")


def _open_file(path):
    """An fd of the regular file at `path` (relative to /workspace), opened without
    following any symlink on the way; raises OSError or ValueError(why)."""
    *dirs, name = path.split("/")
    fd = posix.open("/workspace", _DIR_FLAGS)
    try:
        for d in dirs:
            child = _open_dir(fd, d)
            posix.close(fd)
            fd = child
        out = posix.open(name, _FILE_FLAGS, dir_fd=fd)
    finally:
        posix.close(fd)
    if not stat.S_ISREG(posix.fstat(out).st_mode):
        posix.close(out)
        raise ValueError("not a regular file")
    return out


def _line(method, params_json):
    return b'{"jsonrpc":"2.0","method":"%s","params":%s}\n' % (method, params_json)


def send(write_line, spec, seen=None, paths=None):
    """Sends the output files with `write_line(bytes)`. `spec`: the OUTPUTS record as
    boot.py read it ({"max_files", "max_bytes", "paths"}); `seen`: in a session, what the
    last run's call returned, so that only files under /workspace/out that are new or
    changed since go (named paths always); `paths`: the workspace files the call named
    (`outputs`; None: the record's). Returns what to pass as `seen` next time: each
    file's (inode, size, mtime, ctime)."""
    import _json
    import binascii

    quote = _json.encode_basestring_ascii
    max_files = int(spec.get("max_files", 0))
    budget = int(spec.get("max_bytes", 0))
    walk = _Walk()
    fingerprints = {}
    out_fd = None
    workspace = posix.open("/workspace", _DIR_FLAGS)
    try:
        out_fd = _open_dir(workspace, OUT_DIR)
    except FileNotFoundError:
        pass
    except OSError as e:
        if e.errno == 40 or e.errno == 20:  # ELOOP (a symlink), ENOTDIR
            walk.skip(OUT_DIR, "not a directory (a symlink is never followed)")
    finally:
        posix.close(workspace)
    if out_fd is not None:
        try:
            _walk(walk, out_fd, OUT_DIR + "/", 1)
        finally:
            posix.close(out_fd)
    if paths is None:
        paths = spec.get("paths") or []
    named = [p for p in paths if isinstance(p, str)]
    wanted = []
    listed = set()
    for p in named + walk.found:
        if p not in listed:
            listed.add(p)
            wanted.append((p, p in named))
    sent = 0
    for path, was_named in wanted:
        try:
            fd = _open_file(path)
        except FileNotFoundError:
            walk.skip(path, "no such file")
            continue
        except ValueError as e:
            walk.skip(path, str(e))
            continue
        except OSError as e:
            why = "a symlink (never followed)" if e.errno == 40 else e.strerror
            walk.skip(path, why)
            continue
        try:
            st = posix.fstat(fd)
            mark = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if not was_named:
                fingerprints[path] = mark
                if seen is not None and seen.get(path) == mark:
                    continue
            if sent >= max_files:
                walk.omitted += 1
                continue
            if st.st_size > budget:
                walk.skip(path, "%d bytes: over what is left of the output files' %d bytes"
                          % (st.st_size, int(spec.get("max_bytes", 0))))
                continue
            # The file as it is now: at most the size fstat gave, should it still grow.
            offset = 0
            while True:
                chunk = posix.read(fd, min(CHUNK, st.st_size - offset))
                if not chunk and offset > 0:
                    break
                params = b'{"path":%s,"offset":%d,"base64":"%s"}' % (
                    quote(path).encode("ascii"),
                    offset,
                    binascii.b2a_base64(chunk, newline=False),
                )
                write_line(_line(b"codebox/file", params))
                offset += len(chunk)
                if not chunk or offset >= st.st_size:
                    break
            budget -= offset
            sent += 1
        finally:
            posix.close(fd)
    if walk.skipped or walk.omitted:
        import json

        summary = json.dumps({"skipped": walk.skipped, "omitted": walk.omitted})
        write_line(_line(b"codebox/files", summary.encode()))
    return fingerprints
