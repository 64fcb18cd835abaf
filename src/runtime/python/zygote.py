"""codebox's Python zygote: one pre-initialised interpreter that forks a fresh sandbox per
execution (src/sandbox/zygote/ is the supervisor's side; docs/src/backends/zygote.md the argument).

The zygote runs as the program of an ordinary codebox sandbox, with two differences its
spawner made: no landlock (landlock forbids changing mounts) and a seccomp filter that
also allows `unshare` and `mount`. It never runs a program and never sees one's data: it
reads requests, forks, and reaps. All the policy comes from the supervisor as data.

fd 3 is a SOCK_SEQPACKET socket to the spawner:
- spawner -> zygote, first: CONFIG, JSON {"seccomp": hex BPF, "landlock": plan or null,
  "hostname", "id": sandbox uid/gid, "trace"}
- zygote -> spawner: {"ready": true} once the interpreter and its preloads are loaded
- spawner -> zygote: fork requests (binary, `ForkRequest::to_bytes` in plan.rs) with the
  descriptors [stdout, stderr, channel, errors, status, control, reply, join...]

The fork path is native (src/runtime/zygote/fork.c, loaded from the rootfs): once the
zygote is ready it calls that library's loop, which never comes back here while the
spawner is there. It makes each child (C1: cgroups and namespaces; C2: pid 1, mounts, then
the small init src/runtime/zygote/init.c; C3: the program, every layer applied) and
returns only in C3, set up, where this file then runs the program under boot.py. So no
Python runs in the zygote between forks: its pages, shared with every child, stay
untouched.

Failures are the records of sandbox/report.rs on the errors pipe (stage, detail, errno).
"""

import ctypes
import importlib.util
import json
import os
import signal
import socket
import sys

BOOT = "/opt/codebox/python/boot.py"
NATIVE = "/opt/codebox/zygote/fork.so"
INIT = "/opt/codebox/zygote/init"
CONTROL_FD = 3

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
# What the native loop returns in a program process: CHILD | request flags << 8.
CHILD = 1
FLAG_WARM_UP = 1


class BecomeProgram(BaseException):
    """Raised in C3 once it is set up: unwinds the zygote's frames to the top level, which
    runs boot.py's serve like a script (its SystemExit is an ordinary interpreter exit)."""

    def __init__(self, warm_up):
        super().__init__()
        self.warm_up = warm_up


class ZygoteError(Exception):
    pass


# What the zygote preloaded (boot.prepare's result), for the program's serve.
_PRELOADED = [()]


def _native():
    """The native fork path. PyDLL: calls keep the GIL (the loop forks with it held, as
    os.fork does)."""
    lib = ctypes.PyDLL(NATIVE, use_errno=True)
    u32, u64, i32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    lib.codebox_zygote_configure.argtypes = [
        ctypes.c_char_p, u32, i32, u64, u64, u64, u32, u32,
        u32, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(u64),
        u32, ctypes.POINTER(u64), ctypes.POINTER(u64),
        ctypes.c_char_p, u32, u32, ctypes.c_char_p, i32]
    lib.codebox_zygote_configure.restype = i32
    lib.codebox_zygote_serve.argtypes = [i32]
    lib.codebox_zygote_serve.restype = ctypes.c_long
    return lib


def _configure(lib, config, trace_fd):
    with open("/proc/sys/kernel/cap_last_cap") as f:
        cap_last = int(f.read())
    seccomp = bytes.fromhex(config["seccomp"])
    plan = config["landlock"]
    u64 = ctypes.c_uint64
    paths = plan["paths"] if plan else []
    ports = plan["ports"] if plan else []
    path_names = (ctypes.c_char_p * max(len(paths), 1))(*[p.encode() for p, _ in paths])
    path_access = (u64 * max(len(paths), 1))(*[a for _, a in paths])
    port_numbers = (u64 * max(len(ports), 1))(*[p for p, _ in ports])
    port_access = (u64 * max(len(ports), 1))(*[a for _, a in ports])
    rc = lib.codebox_zygote_configure(
        seccomp, len(seccomp), int(plan is not None),
        plan["handled_fs"] if plan else 0, plan["handled_net"] if plan else 0,
        plan["scoped"] if plan else 0, plan["attr_size"] if plan else 0,
        plan["status"] if plan else 0,
        len(paths), path_names, path_access, len(ports), port_numbers, port_access,
        config["hostname"].encode(), int(config["id"]), cap_last, INIT.encode(), trace_fd)
    if rc != 0:
        raise ZygoteError("configuring the fork path failed: %s" % os.strerror(ctypes.get_errno()))


def main(boot):
    control = socket.socket(fileno=CONTROL_FD)
    config = json.loads(control.recv(1 << 20))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 or libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise ZygoteError("prctl failed: %s" % os.strerror(ctypes.get_errno()))
    lib = _native()
    # The trace descriptor is close-on-exec (os.dup) and closed in every program process.
    _configure(lib, config, os.dup(2) if config.get("trace") else -1)
    _PRELOADED[0] = boot.prepare(preload_always=True)
    # Nothing may be buffered when the children inherit the streams.
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything loaded so far moves to the collector's permanent generation: no
    # collection in a child walks (and so copies) the zygote's objects.
    import gc

    gc.collect()
    gc.freeze()
    # Each child shares this process's memory while it is made (fork.c): no thread may
    # run beside the loop (a library's thread pool would; `zygote::key` gives such
    # sandboxes no zygote).
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        raise ZygoteError("the zygote runs %d threads; it forks only with one" % threads)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    control.send(b'{"ready":true}')
    api = ctypes.pythonapi
    api.PyOS_BeforeFork()
    result = lib.codebox_zygote_serve(CONTROL_FD)
    if result <= 0:
        api.PyOS_AfterFork_Parent()
        if result < 0:
            raise ZygoteError("the fork loop failed: %s" % os.strerror(ctypes.get_errno()))
        return  # the spawner left
    # C3, set up: every layer is in force. fd 3 is the program's channel now: the socket
    # object that held the zygote's must forget it without closing it.
    api.PyOS_AfterFork_Child()
    control.detach()
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    # Ready: the spawner sees the errors pipe end, as at a cold sandbox's execve.
    os.close(4)
    raise BecomeProgram(bool(result >> 8 & FLAG_WARM_UP))


def _load_boot():
    spec = importlib.util.spec_from_file_location("_codebox_boot", BOOT)
    boot = importlib.util.module_from_spec(spec)
    sys.modules["_codebox_boot"] = boot
    spec.loader.exec_module(boot)
    return boot


def _reseed():
    """What a fork copies but a fresh interpreter would draw anew: the random generators
    seeded at import (random's own at-fork hook already reseeds its instance)."""
    import random

    random.seed()
    # tempfile draws names from a generator it makes once per pid, and every child is
    # pid 2, as the zygote is in its own namespace.
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:
            pass


def _warm_up(boot):
    """A pooled sandbox (one the pool keeps waiting) rehearses a one-shot call before it
    says ready (boot.rehearse: receive, run `print(...)`, value, output files, on a socket
    pair and /dev/null): the pages that path writes are copied from the zygote's now,
    while the sandbox waits, instead of on the request's path. A failure only leaves the
    copying to the request."""
    try:
        boot.rehearse()
    except BaseException:
        pass


if __name__ == "__main__":
    _boot = _load_boot()
    _became = None
    try:
        main(_boot)
    except BecomeProgram as became:
        _became = became
    if _became is not None:
        # C3, set up, outside every handler: the zygote's frames and the exception are
        # gone (sys.exc_info() is empty, tracebacks are the program's own); run the
        # program as boot.py would.
        _warm = _became.warm_up
        del _became
        _reseed()
        if _warm:
            _warm_up(_boot)
        _boot.serve(_PRELOADED[0])
