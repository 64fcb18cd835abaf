"""codebox's Python zygote: one pre-initialised interpreter that forks a fresh sandbox per
execution (src/sandbox/zygote/ is the supervisor's side; docs/src/backends/zygote.md the argument).

The zygote runs as the program of an ordinary codebox sandbox, with two differences its
spawner made: no landlock (landlock forbids changing mounts) and a seccomp filter that
also allows `unshare` and `mount`. It never runs a program and never sees one's data: it
reads requests, forks, and reaps. All the policy comes from the supervisor as data.

fd 3 is a SOCK_SEQPACKET socket to the spawner. Messages are JSON:
- spawner -> zygote, first: CONFIG {"seccomp": hex BPF, "landlock": plan or null,
  "hostname", "id": sandbox uid/gid}
- zygote -> spawner: {"ready": true} once the interpreter and its preloads are loaded
- spawner -> zygote: FORK {"mounts": [...], "rlimits": {...}, "joins": n} with the
  descriptors [stdout, stderr, channel, errors, status, control, reply, join...]

A child is three processes (the same shape as a cold sandbox, see sandbox/init.rs):
1. C1, forked here: joins its cgroup (writes 0 to each join descriptor), unshares user,
   mount, pid, net, ipc, uts and cgroup namespaces, maps its own uid and gid, forks C2,
   sends C2's pidfd on the reply socket and exits (this process, a subreaper, reaps C2).
2. C2, pid 1 of the new pid namespace: a fresh procfs and fresh tmpfs on /tmp, /dev/shm
   and /workspace, the hostname, non-dumpable; forks C3, then reaps, enforces the
   deadline armed on the control pipe and reports C3's status (status pipe).
3. C3, pid 2: new session, stdio and fd 3, every other descriptor closed, rlimits, every
   capability dropped, no_new_privs, parent-death signal, landlock, seccomp; closing the
   errors pipe tells the spawner it is ready (what execve's close-on-exec tells for a cold
   sandbox); then boot.py's serve: `codebox/ready` on fd 3 and the program.

Failures are the records of sandbox/report.rs on the errors pipe (stage, detail, errno).
"""

import ctypes
import importlib.util
import json
import os
import posix
import resource
import select
import signal
import socket
import struct
import sys
import time

BOOT = "/opt/codebox/python/boot.py"
CONTROL_FD = 3

# sandbox/report.rs Stage values (repr(u32), in order from 1).
STAGE = {name: i + 1 for i, name in enumerate((
    "ArrangeFds", "ParentDeathSignal", "WaitForParent", "ClearGroups", "SetGid", "SetUid",
    "RaiseCaps", "NotDumpable", "Mount", "Hostname", "InitStdio", "ForkProgram", "Setsid",
    "ProgramStdio", "CloseFds", "Rlimit", "DropCaps", "NoNewPrivs", "Chdir", "Exec",
    "Landlock", "Seccomp", "CgroupNamespace", "JoinCgroup", "LoopbackUp", "EgressListener",
    "ZygoteNamespaces", "ZygoteFork"))}
FAILURE_LEN = 12
INFO_LANDLOCK = 0x100

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x08000000, 0x10000000, 0x20000000, 0x40000000
NAMESPACES = (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC
              | CLONE_NEWUTS | CLONE_NEWCGROUP)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT = 38, 22, 36, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
SYS_CAPSET, SYS_CLOSE_RANGE = 126, 436
SYS_LANDLOCK_CREATE, SYS_LANDLOCK_ADD, SYS_LANDLOCK_RESTRICT = 444, 445, 446
LANDLOCK_RULE_PATH_BENEATH, LANDLOCK_RULE_NET_PORT = 1, 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
IDLE_LIFETIME_MS = 60 * 60 * 1000

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                       ctypes.c_char_p]


class BecomeProgram(BaseException):
    """Raised in C3 once it is set up: unwinds the zygote's frames to the top level, which
    runs boot.py's serve like a script (its SystemExit is an ordinary interpreter exit)."""


class SetupError(Exception):
    def __init__(self, stage, detail, errno):
        super().__init__(stage, detail, errno)
        self.stage, self.detail, self.errno = STAGE[stage], detail, errno or 5


def check(result, stage, detail=0):
    """A libc call's result: -1 becomes a SetupError with errno."""
    if result == -1:
        raise SetupError(stage, detail, ctypes.get_errno())
    return result


def oserror(stage, detail=0):
    """Turns an OSError raised by the block into a SetupError."""
    class _Guard:
        def __enter__(self):
            return self

        def __exit__(self, kind, exc, tb):
            if isinstance(exc, OSError):
                raise SetupError(stage, detail, exc.errno) from exc
            return False
    return _Guard()


def fail(errors_fd, err, code=127):
    """Writes the failure record and ends this process."""
    try:
        posix.write(errors_fd, struct.pack("<IIi", err.stage, err.detail, err.errno))
    except OSError:
        pass
    posix._exit(code)


# --- the zygote itself --------------------------------------------------------------------

# What the zygote preloaded (boot.prepare's result), for the program's serve.
_PRELOADED = [()]


# `config["trace"]`: the zygote and each child's C1, C2 and C3 write the time of each
# step on the zygote's stderr (the spawner logs it), for finding where a fork's time goes.
_TRACE = [None]


def trace(step):
    if _TRACE[0] is not None:
        try:
            os.write(_TRACE[0], b"zygote trace %d %s %.3f\n" % (os.getpid(), step.encode(), time.monotonic() * 1000))
        except OSError:
            pass


def main(boot):
    control = socket.socket(fileno=CONTROL_FD)
    config = json.loads(control.recv(1 << 20))
    if config.get("trace"):
        _TRACE[0] = os.dup(2)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        config["cap_last"] = int(f.read())
    filter_bytes = bytes.fromhex(config["seccomp"])
    # Built once here: the children only point at it (no allocation after the fork).
    seccomp = SeccompProgram(filter_bytes) if filter_bytes else None
    check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "ZygoteFork")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "NotDumpable")
    _PRELOADED[0] = boot.prepare(preload_always=True)
    # Nothing may be buffered when the children inherit the streams.
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything loaded so far moves to the collector's permanent generation: no
    # collection in a child walks (and so copies) the zygote's objects.
    import gc

    gc.collect()
    gc.freeze()
    woken_r, woken_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(woken_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    control.send(b'{"ready":true}')
    poller = select.poll()
    poller.register(control.fileno(), select.POLLIN)
    poller.register(woken_r, select.POLLIN)
    while True:
        for fd, events in poller.poll():
            if fd == woken_r:
                _drain(woken_r)
                _reap_all()
            elif events & (select.POLLHUP | select.POLLERR) and not events & select.POLLIN:
                return
            else:
                message, fds, _, _ = socket.recv_fds(control, 1 << 16, 64)
                if not message:
                    return
                try:
                    request = json.loads(message)
                except ValueError:
                    request = None
                # Returns in this process only; a child leaves by BecomeProgram or _exit.
                trace("request")
                _fork_child(request, fds, config, seccomp, (control, woken_r, woken_w))
                trace("forked")
                for fd in fds:
                    os.close(fd)
        _reap_all()


def _load_boot():
    spec = importlib.util.spec_from_file_location("_codebox_boot", BOOT)
    boot = importlib.util.module_from_spec(spec)
    sys.modules["_codebox_boot"] = boot
    spec.loader.exec_module(boot)
    return boot


def _drain(fd):
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap_all():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _fork_child(request, fds, config, seccomp, zygote_fds):
    """Forks C1 for one request; the caller closes the descriptors in this process."""
    if not isinstance(request, dict) or len(fds) != 7 + int(request.get("joins", -1)):
        # Not what the spawner sends: refuse on the errors pipe when there is one.
        if len(fds) > 3:
            fail_no_exit(fds[3], SetupError("ZygoteFork", 2, 22))
        return
    stdout, stderr, channel, errors, status, control, reply = fds[:7]
    try:
        pid = os.fork()
    except OSError as exc:
        fail_no_exit(errors, SetupError("ZygoteFork", 0, exc.errno))
        return
    if pid:
        return
    # C1. Nothing of the zygote's own may stay open or be collected later (a socket object
    # closing its number would close whatever the child put there).
    trace("c1 start")
    try:
        control_sock, woken_r, woken_w = zygote_fds
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(control_sock.detach())
        os.close(woken_r)
        os.close(woken_w)
        c1(request, fds[7:], (stdout, stderr, channel, errors, status, control, reply),
           config, seccomp)
    except BecomeProgram:
        raise
    except SetupError as err:
        fail(errors, err)
    except BaseException:
        fail(errors, SetupError("ZygoteFork", 1, 5))
    posix._exit(0)


def fail_no_exit(errors_fd, err):
    try:
        posix.write(errors_fd, struct.pack("<IIi", err.stage, err.detail, err.errno))
    except OSError:
        pass


# --- C1: namespaces -----------------------------------------------------------------------

def c1(request, joins, fds, config, seccomp):
    stdout, stderr, channel, errors, status, control, reply = fds
    # 0. Into the execution's cgroups before anything else (this thread moves itself:
    #    writing 0 to a descriptor the spawner opened, checked with the spawner's rights).
    for i, fd in enumerate(joins):
        with oserror("JoinCgroup", i):
            os.write(fd, b"0")
        os.close(fd)
    trace("c1 joined")
    # 1. Fresh namespaces, under a user namespace of this child's own.
    check(libc.unshare(NAMESPACES), "ZygoteNamespaces")
    trace("c1 unshared")
    # 2. Map the sandbox uid and gid onto themselves (one id each: the only mapping an
    #    unprivileged process may write for itself; setgroups must be denied first).
    ident = int(config["id"])
    # The zygote is non-dumpable, which makes /proc/self/* root's: this process (in
    # its own user namespace now, seen by nobody but the zygote) must own its maps to
    # write them. C2 turns it off again first thing.
    check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "NotDumpable", 3)
    with oserror("SetUid", 1):
        _write_file("/proc/self/setgroups", b"deny")
        _write_file("/proc/self/uid_map", b"%d %d 1" % (ident, ident))
        _write_file("/proc/self/gid_map", b"%d %d 1" % (ident, ident))
    # 3. C2 is pid 1 of the new pid namespace. Its pidfd goes to the spawner (its watch);
    #    C1 ends and the zygote, a subreaper, inherits and reaps C2.
    try:
        pid = os.fork()
    except OSError as exc:
        raise SetupError("ForkProgram", 1, exc.errno)
    if pid == 0:
        os.close(reply)
        try:
            c2(request, fds, config, seccomp)
        except BecomeProgram:
            raise
        except SetupError as err:
            fail(errors, err)
        except BaseException:
            fail(errors, SetupError("ForkProgram", 2, 5))
        posix._exit(0)
    trace("c1 forked")
    with oserror("ForkProgram", 3):
        pidfd = os.pidfd_open(pid)
        socket.send_fds(socket.socket(fileno=reply), [b"P"], [pidfd])
    posix._exit(0)


def _write_file(path, data):
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# --- C2: the init of the child's pid namespace --------------------------------------------

def c2(request, fds, config, seccomp):
    stdout, stderr, channel, errors, status, control, _ = fds
    # 0. No Python handler the program could trigger (SIGINT would raise in here).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # 1. Keep the program (same uid) from ptracing this process or reading its /proc.
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "NotDumpable", 1)
    # 2. Fresh filesystems where the program may write, and a procfs of this pid
    #    namespace; everything else is the zygote's read-only view, locked by the kernel
    #    (copied into a less privileged mount namespace).
    for i, m in enumerate(request["mounts"]):
        if m["kind"] == "proc":
            check(libc.mount(b"proc", m["target"].encode(), b"proc", m["flags"], None), "Mount", i)
        else:
            data = m["data"].encode()
            check(libc.mount(b"tmpfs", m["target"].encode(), b"tmpfs", m["flags"], data), "Mount", i)
    trace("c2 mounted")
    # 3. The hostname of the child's own UTS namespace.
    with oserror("Hostname", 1):
        socket.sethostname(config["hostname"])
    # 4. stdio: /dev/null (the zygote's own output stays the zygote's).
    with oserror("InitStdio", 1):
        null = os.open("/dev/null", os.O_RDWR)
        for target in (0, 1, 2):
            os.dup2(null, target)
        os.close(null)
    # 5. The program, pid 2.
    try:
        pid = os.fork()
    except OSError as exc:
        raise SetupError("ForkProgram", 4, exc.errno)
    if pid == 0:
        c3(request, fds, config, seccomp)
        raise BecomeProgram()
    trace("c2 forked")
    for fd in (stdout, stderr, channel, errors):
        os.close(fd)
    _watch(pid, control, status)


def _watch(pid, control, status):
    """Reaps until the program ends or its deadline passes; reports its status and exits
    (the kernel then kills whatever is left in the namespace)."""
    woken_r, woken_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(woken_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    program = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(program, select.POLLIN)
    poller.register(woken_r, select.POLLIN)
    poller.register(control, select.POLLIN)
    deadline = time.monotonic() + IDLE_LIFETIME_MS / 1000
    result = None
    while result is None:
        result = _reap(pid)
        if result is not None:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            result = (2, signal.SIGKILL)
            break
        for fd, _ in poller.poll(int(left * 1000) + 1):
            if fd == woken_r:
                _drain(woken_r)
            elif fd == control:
                data = os.read(control, 64)
                if not data:
                    poller.unregister(control)
                elif len(data) >= 8:
                    whole = len(data) // 8 * 8
                    ms = struct.unpack("<Q", data[whole - 8:whole])[0]
                    deadline = time.monotonic() + max(ms, 1) / 1000
    try:
        os.write(status, struct.pack("<Ii", *result))
    except OSError:
        pass
    posix._exit(0)


def _reap(program):
    """Reaps every ended child; the program's (kind, value) status when it is among them."""
    result = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return result
        if pid == 0:
            return result
        if pid == program:
            result = (1, os.WEXITSTATUS(st)) if os.WIFEXITED(st) else (2, os.WTERMSIG(st))


# --- C3: the program ----------------------------------------------------------------------

def c3(request, fds, config, seccomp):
    """Sets up the program process; a failure ends it with a record on the errors pipe."""
    errors = [fds[3]]
    try:
        _c3(request, fds, config, seccomp, errors)
    except SetupError as err:
        fail(errors[0], err)
    except BaseException:
        fail(errors[0], SetupError("Exec", 1, 5))


def _c3(request, fds, config, seccomp, errors_slot):
    stdout, stderr, channel, errors, status, control, _ = fds
    # 1. No controlling terminal, own process group.
    with oserror("Setsid"):
        os.setsid()
    # 2. Default signal handling, as a fresh interpreter has it.
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    trace("c3 start")
    # The trace descriptor may sit where the errors pipe goes; the program never has it.
    _TRACE[0] = None
    # 3. stdout, stderr and the channel on 1, 2 and 3; the errors pipe on 4 until ready.
    with oserror("ProgramStdio"):
        for fd, target in ((stdout, 1), (stderr, 2), (channel, 3), (errors, 4)):
            if fd != target:
                # Move away anything sitting on the target number first.
                os.dup2(fd, target, inheritable=target != 4)
    # 4. Nothing else stays open.
    errors = errors_slot[0] = 4
    check(libc.syscall(SYS_CLOSE_RANGE, 5, 0xFFFFFFFF, 0), "CloseFds")
    # 5. Resource limits.
    limits = request["rlimits"]
    with oserror("Rlimit"):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits["nofile"], limits["nofile"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["fsize"], limits["fsize"]))
    # 6. Every capability: bounding set, ambient, then inheritable, effective, permitted.
    for cap in range(config["cap_last"] + 1):
        check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "DropCaps", 0)
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "DropCaps", 1)
    header = struct.pack("<Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)
    check(libc.syscall(SYS_CAPSET, header, data), "DropCaps", 4)
    # 7. Nothing it runs can gain privileges (inherited from the zygote; said again).
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "NoNewPrivs")
    # 7b. Die with C2 (pid 1 here; any other parent means it is gone).
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "ParentDeathSignal", 1)
    if os.getppid() != 1:
        raise SetupError("ParentDeathSignal", 2, 3)
    # 7c. The program's /proc/self is its own, as after an execve.
    check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "NotDumpable", 2)
    # 8. Landlock, as the supervisor planned it for this kernel.
    plan = config["landlock"]
    if plan is not None:
        _landlock(plan)
        posix.write(errors, struct.pack("<II4x", INFO_LANDLOCK, plan["status"]))
    # 9. Working directory.
    with oserror("Chdir"):
        os.chdir("/workspace")
    # 10. Seccomp, last.
    if seccomp is not None:
        seccomp.install()
    # 11. Ready: the spawner sees the errors pipe end, as at a cold sandbox's execve.
    os.close(errors)


def _landlock(plan):
    attr = struct.pack("<QQQ", plan["handled_fs"], plan["handled_net"], plan["scoped"])
    attr = attr[:plan["attr_size"]]
    ruleset = check(libc.syscall(SYS_LANDLOCK_CREATE, attr, len(attr), 0), "Landlock", 0)
    try:
        for i, (path, access) in enumerate(plan["paths"]):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # as the Rust ruleset does: a missing path has no rule
            try:
                rule = struct.pack("<Qi", access, fd)
                check(libc.syscall(SYS_LANDLOCK_ADD, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0),
                      "Landlock", 10 + i)
            finally:
                os.close(fd)
        for i, (port, access) in enumerate(plan["ports"]):
            rule = struct.pack("<QQ", access, port)
            check(libc.syscall(SYS_LANDLOCK_ADD, ruleset, LANDLOCK_RULE_NET_PORT, rule, 0),
                  "Landlock", 100 + i)
        check(libc.syscall(SYS_LANDLOCK_RESTRICT, ruleset, 0), "Landlock", 1)
    finally:
        os.close(ruleset)


class SeccompProgram:
    """A `sock_fprog` over the filter's bytes, built in the zygote."""

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    def __init__(self, program):
        if len(program) % 8:
            raise ValueError("a BPF program is a whole number of 8-byte instructions")
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._fprog = self._Fprog(len(program) // 8, ctypes.addressof(self._buffer))

    def install(self):
        check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(self._fprog), 0, 0),
              "Seccomp")


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
    """Runs a throwaway program through boot.py's path (compile, exec, print) before the
    child announces ready: the pages that path writes (reference counts all over the
    interpreter) are copied from the zygote's now, while the sandbox waits in the pool,
    instead of on the request's path. Its output goes nowhere."""
    import io

    real = sys.stdout
    sys.stdout = io.StringIO()
    try:
        boot.run_program("print(1, 'x', [2.5], {'k': None})\n", "<warm-up>", {"__name__": "__warm_up__"})
    except Exception:
        pass
    finally:
        sys.stdout = real
    real.write("")
    real.flush()
    _own_heap()


MADV_POPULATE_WRITE = 23


def _own_heap():
    """Makes this child's private copy of the zygote's writable anonymous memory now, in one
    pass, instead of page by page as the program touches it (every allocation from the
    zygote's free lists and every reference count update would otherwise copy a page on
    the request's path). Only pages the zygote has (present in /proc/self/pagemap) are
    copied: reserved but untouched memory stays untouched."""
    import re

    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/maps") as f:
        ranges = []
        for line in f:
            fields = line.split()
            if len(fields) > 5 and fields[5] != "[heap]":
                continue  # file-backed, or a named special mapping
            if fields[1][:2] != "rw" or fields[1][3] != "p":
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    fd = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    try:
        for start, end in ranges:
            entries = os.pread(fd, (end - start) // page * 8, start // page * 8)
            # Bit 63 of each little-endian 8-byte entry: the page is present.
            present = entries[7::8]
            for run in re.finditer(rb"[\x80-\xff]+", present):
                at = start + run.start() * page
                libc.madvise(at, (run.end() - run.start()) * page, MADV_POPULATE_WRITE)
    finally:
        os.close(fd)


if __name__ == "__main__":
    _boot = _load_boot()
    _became = False
    try:
        main(_boot)
    except BecomeProgram:
        _became = True
    if _became:
        # C3, set up, outside every handler: the zygote's frames and the exception are
        # gone (sys.exc_info() is empty, tracebacks are the program's own); run the
        # program as boot.py would.
        _reseed()
        _warm_up(_boot)
        _boot.serve(_PRELOADED[0])
