#!/usr/bin/env python3
"""Keep-alive sessions of the runtime files, end to end, without the supervisor.

Runs the rootfs's interpreters with the rootfs's boot files as the sandbox does (chrooted
into the rootfs, working directory /workspace, the same command line and environment as
src/runtime/mod.rs, fd 3 a socketpair) inside an unprivileged user + mount namespace
(`unshare -rm`) where /workspace and /tmp are bound to fresh temporary directories, and
speaks the fd-3 protocol of src/runtime/boot.rs to them: a boot frame with a SESSION
record, `codebox/done` after every run, `codebox/run` for the next, tool calls answered
as the proxy would.

    usage: session_harness.py ROOTFS [python] [typescript]

Exit status 0 when every check passed, 1 when one failed, 77 when this host cannot create
the namespace (the caller reports a skip).
"""

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time

# Inside the namespace: bind the scratch directories, chroot, put the socket on fd 3, exec.
LAUNCHER = r"""
import ctypes, os, sys
rootfs, workspace, tmp, fd = sys.argv[1:5]
argv = sys.argv[5:]
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC = 4096, 16384
def bind(src, dst):
    if libc.mount(src.encode(), dst.encode(), None, MS_BIND | MS_REC, None) != 0:
        e = ctypes.get_errno()
        sys.exit("launcher: mount %s on %s: %s" % (src, dst, os.strerror(e)))
bind(workspace, rootfs + "/workspace")
bind(tmp, rootfs + "/tmp")
bind("/dev", rootfs + "/dev")
bind("/proc", rootfs + "/proc")
os.chroot(rootfs)
os.chdir("/workspace")
fd = int(fd)
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.set_inheritable(3, True)
env = dict(e.split("=", 1) for e in os.environ["HARNESS_ENV"].split("\n"))
os.execve(argv[0], argv[1:], env)
"""

COMMON_ENV = ["PATH=/usr/bin", "HOME=/workspace", "LANG=C.UTF-8", "TMPDIR=/tmp"]
PROGRAMS = {
    "python": (
        ["/usr/bin/python3", "python3", "-I", "-S", "-B", "/opt/codebox/python/boot.py"],
        COMMON_ENV + ["PYTHONDONTWRITEBYTECODE=1"],
    ),
    "typescript": (
        [
            "/usr/bin/deno", "deno", "run", "--allow-all", "--no-prompt", "--no-config",
            "--no-lock", "/opt/codebox/deno/boot.js",
        ],
        COMMON_ENV + [
            "DENO_DIR=/tmp/.deno", "DENO_NO_UPDATE_CHECK=1", "DENO_NO_PROMPT=1", "NO_COLOR=1",
        ],
    ),
}

TIMEOUT = 60.0


def session_frame(code, files=None):
    """runtime::boot::session_boot_frame."""
    out = bytearray(b"SESSION 0\n")
    for path, content in sorted((files or {}).items()):
        payload = path.encode() + b"\0" + content.encode()
        out += b"FILE %d\n" % len(payload) + payload
    body = code.encode()
    out += b"CODE %d\n" % len(body) + body
    return bytes(out)


def run_message(code, files=None):
    """runtime::boot::session_run_message."""
    params = {"code": code}
    if files:
        params["files"] = files
    return json.dumps({"jsonrpc": "2.0", "method": "codebox/run", "params": params}).encode() + b"\n"


class Ended(Exception):
    pass


class Session:
    def __init__(self, rootfs, lang, code, files=None, extra=b""):
        self.lang = lang
        self.workspace = tempfile.mkdtemp(prefix="codebox-session-ws-")
        self.tmp = tempfile.mkdtemp(prefix="codebox-session-tmp-")
        ours, theirs = socket.socketpair()
        argv, env = PROGRAMS[lang]
        cmd = [
            "unshare", "-rm", sys.executable, "-I", "-c", LAUNCHER,
            rootfs, self.workspace, self.tmp, str(theirs.fileno()), *argv,
        ]
        try:
            self.proc = subprocess.Popen(
                cmd,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(os.environ, HARNESS_ENV="\n".join(env)),
            )
        except BaseException:
            ours.close()
            shutil.rmtree(self.workspace, ignore_errors=True)
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.buf = b""
        self.out = b""
        self.err = b""
        self.requests = []
        for f in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), False)
        self.send(session_frame(code, files) + extra)

    def send(self, data):
        self.sock.sendall(data)

    def run(self, code, files=None, extra_before=b""):
        self.send(extra_before + run_message(code, files))
        return self.wait()

    def _drain(self, fd_obj, blocking_ok=False):
        data = b""
        while True:
            try:
                chunk = os.read(fd_obj.fileno(), 65536)
            except BlockingIOError:
                return data, False
            if not chunk:
                return data, True
            data += chunk

    def wait(self, answer=None):
        """Waits for `codebox/done`: returns (status, stdout, stderr) of the run. Tool
        requests are answered by answer(msg) -> bytes to send (or recorded if None).
        Raises Ended(returncode, stdout, stderr) when the process exits first."""
        deadline = time.monotonic() + TIMEOUT
        out_open = err_open = True
        while True:
            done = self._lines(answer)
            if done:
                return done
            fds = [self.sock] + ([self.proc.stdout] if out_open else []) + ([self.proc.stderr] if err_open else [])
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise AssertionError("timed out waiting for codebox/done; stdout %r stderr %r" % (self.out, self.err))
            ready, _, _ = select.select(fds, [], [], left)
            if self.proc.stdout in ready:
                data, eof = self._drain(self.proc.stdout)
                self.out += data
                out_open = not eof
            if self.proc.stderr in ready:
                data, eof = self._drain(self.proc.stderr)
                self.err += data
                err_open = not eof
            if self.sock in ready:
                chunk = self.sock.recv(65536)
                if not chunk:
                    self.sock_closed()
                    continue
                self.buf += chunk

    def _lines(self, answer):
        while b"\n" in self.buf:
            line, _, self.buf = self.buf.partition(b"\n")
            msg = json.loads(line)
            if msg.get("method") == "codebox/ready":
                continue  # the runtime started; it says so once, before its code
            if msg.get("method") == "codebox/done":
                assert "id" not in msg, msg
                # everything the run wrote is in the pipes already
                for name in ("out", "err"):
                    data, _ = self._drain(getattr(self.proc, "std" + name))
                    setattr(self, name, getattr(self, name) + data)
                result = (msg["params"]["status"], self.out.decode(), self.err.decode())
                self.out = self.err = b""
                return result
            self.requests.append(msg)
            if answer is not None:
                self.send(answer(msg))
        return None

    def sock_closed(self):
        # fd 3 closed by the other side: the process is ending
        rest_out = self.proc.stdout.read() or b""
        rest_err = self.proc.stderr.read() or b""
        for f in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), True)
        rest_out += self.proc.stdout.read() or b""
        rest_err += self.proc.stderr.read() or b""
        code = self.proc.wait(timeout=TIMEOUT)
        out, err = (self.out + rest_out).decode(), (self.err + rest_err).decode()
        self.out = self.err = b""
        raise Ended(code, out, err)

    def close_channel(self):
        """Closes our end of fd 3; returns (returncode, stdout, stderr)."""
        self.sock.close()
        for f in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(f.fileno(), True)
        out, err = self.proc.communicate(timeout=TIMEOUT)
        return self.proc.returncode, (self.out + out).decode(), (self.err + err).decode()

    def expect_exit(self):
        try:
            status = self.wait()
        except Ended as e:
            return e.args
        raise AssertionError("expected the process to exit, got done %r" % (status,))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def cleanup(self):
        self.kill()
        try:
            self.sock.close()
        except OSError:
            pass
        shutil.rmtree(self.workspace, ignore_errors=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


FAILURES = []


def check(cond, what, detail=""):
    if cond:
        print("  ok   %s" % what)
    else:
        print("  FAIL %s\n%s" % (what, detail))
        FAILURES.append(what)


def show(result):
    return "    status/stdout/stderr: %r" % (result,)


def echo_tool(msg):
    return json.dumps({
        "jsonrpc": "2.0", "id": msg["id"],
        "result": {"content": [{"type": "text", "text": "x"}], "structuredContent": {"echo": msg["params"]}},
    }).encode() + b"\n"


# Lines the runtime must skip: a response nobody waits for, another notification.
STALE_JSON = (
    b'{"jsonrpc":"2.0","id":999,"result":{"content":[]}}\n'
    b'{"jsonrpc":"2.0","method":"notifications/other","params":{}}\n'
)
# While idle, a line that is not JSON is skipped too (during a call it breaks the channel).
STALE = STALE_JSON + b"this is not json\n"


def python_checks(rootfs):
    print("python:")
    # a workspace codebox.py must not replace the runtime's module
    files = {"in/data.txt": "boot file", "codebox.py": "raise RuntimeError('the workspace codebox.py')\n"}
    s = Session(rootfs, "python", 'x = 41\nprint("one")\n', files=files, extra=STALE)
    try:
        r = s.wait()
        check(r == ("ok", "one\n", ""), "run 1 prints and reports ok", show(r))
        r = s.run("print(x + 1)")
        check(r == ("ok", "42\n", ""), "run 2 sees run 1's variable", show(r))
        r = s.run("import codebox\nprint(codebox.__file__)")
        check(r == ("ok", "/opt/codebox/python/codebox.py\n", ""), "the runtime's codebox module, not the workspace's", show(r))
        r = s.run('print(open("in/data.txt").read(), end="")')
        check(r == ("ok", "boot file", ""), "FILE records of the boot frame written; partial line flushed", show(r))
        r = s.run('import sys\nprint("to err", file=sys.stderr)\nraise ValueError("bad value")')
        check(r[0] == "error", "an uncaught exception reports error", show(r))
        check(r[2].startswith("to err\nTraceback (most recent call last):\n"), "stderr: output, then the traceback", show(r))
        check('  File "/codebox/run-5.py", line 3, in <module>\n' in r[2], "the traceback names the run and line", show(r))
        check(r[2].endswith("ValueError: bad value\n"), "the traceback ends with the exception", show(r))
        check("boot.py" not in r[2], "no frame of boot.py", show(r))
        r = s.run("print(x)")
        check(r == ("ok", "41\n", ""), "the session goes on after an error", show(r))
        r = s.run('def boom():\n    y = 1\n    raise RuntimeError("deep")\n')
        check(r == ("ok", "", ""), "a run defines a function", show(r))
        r = s.run("z = 2")
        check(r == ("ok", "", ""), "another run", show(r))
        r = s.run("boom()")
        check(r[0] == "error", "calling it two runs later raises", show(r))
        check('  File "/codebox/run-9.py", line 1, in <module>\n    boom()\n' in r[2], "the caller's frame and line", show(r))
        check('  File "/codebox/run-7.py", line 3, in boom\n    raise RuntimeError("deep")\n' in r[2],
              "the earlier run's frame shows its source line", show(r))
        r = s.run("x y")
        check(r[0] == "error" and "SyntaxError" in r[2] and '"/codebox/run-10.py", line 1' in r[2] and "boot.py" not in r[2],
              "a syntax error reports error, without boot.py frames", show(r))
        r = s.run('print(open("sub/dir/f.txt").read())', files={"sub/dir/f.txt": "from run message"}, extra_before=STALE)
        check(r == ("ok", "from run message\n", ""), "stale lines skipped; files of a run message written", show(r))
        r = s.run('print(list(open("b.bin", "rb").read()))', files={"b.bin": {"base64": "AP8KgA=="}})
        check(r == ("ok", "[0, 255, 10, 128]\n", ""), "a binary file of a run message (base64) written as bytes", show(r))
        s.send(run_message('print("bye")\nimport sys\nsys.exit(3)'))
        rc, out, err = s.expect_exit()
        check((rc, out) == (3, "bye\n"), "sys.exit(3) ends the process with 3", repr((rc, out, err)))
    finally:
        s.cleanup()
    s2 = None
    try:
        # tool calls: answered by the harness; stale responses and a run queued behind the
        # response in the same write must not be lost between the two readers
        s2 = Session(rootfs, "python", "import codebox\nprint(codebox.call_tool('srv__echo', {'a': 1}))\ncounter = 1\n")
        # (the queued run starts right after the first done, so its output may be drained
        # with the first run's: compare the two together)
        r1 = s2.wait(answer=lambda m: STALE_JSON + echo_tool(m) + run_message("counter += 1\nprint(counter)"))
        check(s2.requests and s2.requests[0].get("method") == "tools/call", "the request went out on fd 3", repr(s2.requests))
        r2 = s2.wait()
        check((r1[0], r2[0], r1[1] + r2[1], r1[2] + r2[2]) == ("ok", "ok", "{'echo': {'name': 'srv__echo', 'arguments': {'a': 1}}}\n2\n", ""),
              "a tool call during a run; a run that arrived with the response is not lost", show((r1, r2)))
        rc, out, err = s2.close_channel()
        check((rc, out, err) == (0, "", ""), "EOF on fd 3 while idle: exit 0 quietly", repr((rc, out, err)))
    finally:
        if s2:
            s2.cleanup()
    s3 = Session(rootfs, "python", "exit(5)")
    try:
        rc, out, err = s3.expect_exit()
        check(rc == 5, "exit() in the first run ends the process", repr((rc, out, err)))
    finally:
        s3.cleanup()


def ts_checks(rootfs):
    print("typescript:")
    s = Session(rootfs, "typescript", 'let x = 41\nconsole.log("one")\n', files={"lib.ts": "export const double = (n: number) => n * 2;\n", "types.ts": "export interface Shape { a: number }\nexport const VERSION = 3;\n"}, extra=STALE)
    try:
        r = s.wait()
        check(r == ("ok", "one\n", ""), "run 1 prints and reports ok", show(r))
        r = s.run("console.log(x + 1)")
        check(r == ("ok", "42\n", ""), "run 2 sees run 1's let", show(r))
        r = s.run("x = x + 10")
        r = s.run("console.log(x)")
        check(r == ("ok", "51\n", ""), "an assignment to an earlier variable persists", show(r))
        r = s.run('function f(): string {\n  return "from f";\n}\nclass Point {\n  constructor(public n: number) {}\n  twice() { return this.n * 2; }\n}\nconst { a, b: [c, d] } = { a: 1, b: [2, 3] };\nenum Color { Red = 1, Green }')
        check(r == ("ok", "", ""), "declarations", show(r))
        r = s.run("console.log(f(), new Point(21).twice(), a + c + d, Color.Green)")
        check(r == ("ok", "from f 42 6 2\n", ""), "function, class, destructured const and enum persist", show(r))
        r = s.run('import { double } from "./lib.ts";\nimport { Shape, VERSION } from "./types.ts";\nconst s: Shape = { a: VERSION };')
        check(r == ("ok", "", ""), "imports, one of them a type only", show(r))
        r = s.run("console.log(double(s.a), VERSION)")
        check(r == ("ok", "6 3\n", ""), "imported bindings persist", show(r))
        r = s.run('console.error("to err");\nthrow new Error("boom");')
        check(r[0] == "error", "an uncaught error reports error", show(r))
        check(r[2].startswith("to err\nerror: Uncaught (in promise) Error: boom\n"), "stderr: output, then the error as Deno prints it", show(r))
        check('throw new Error("boom");\n      ^\n' in r[2], "the source line and caret", show(r))
        check(".codebox-run-9.ts:2:7" in r[2], "the stack names the run, line and column", show(r))
        check("boot.js" not in r[2] and "session.js" not in r[2], "no frame of the runtime", show(r))
        r = s.run("console.log(x)")
        check(r == ("ok", "51\n", ""), "the session goes on after an error", show(r))
        r = s.run('function boom(): never {\n  const local = 1;\n  throw new TypeError("deep");\n}')
        r = s.run("let later = 1;")
        r = s.run("boom()")
        check(r[0] == "error" and "TypeError: deep" in r[2] and ".codebox-run-11.ts:3:9" in r[2] and ".codebox-run-13.ts:1:1" in r[2],
              "an error in a function of an earlier run: its file and line; line 1 columns are the user's", show(r))
        r = s.run("const v = await new Promise((r) => setTimeout(() => r(5), 10));\nconsole.log(v);")
        check(r == ("ok", "5\n", ""), "top-level await", show(r))
        r = s.run("console.log(v * 2)")
        check(r == ("ok", "10\n", ""), "a value from an awaited run", show(r))
        r = s.run("const x = 'shadow';\nconsole.log(x);")
        check(r == ("ok", "shadow\n", ""), "redeclaring an earlier name", show(r))
        r = s.run("console.log(x)")
        check(r == ("ok", "shadow\n", ""), "the later declaration wins", show(r))
        r = s.run("let y = 1 +;")
        check(r[0] == "error" and "error: Uncaught (in promise)" in r[2] and "SyntaxError" in r[2], "a syntax error reports error", show(r))
        r = s.run('console.log(await Deno.readTextFile("sub/f.txt"))', files={"sub/f.txt": "from run message"}, extra_before=STALE)
        check(r == ("ok", "from run message\n", ""), "stale lines skipped; files of a run message written", show(r))
        r = s.run('console.log([...await Deno.readFile("b.bin")].join(","))', files={"b.bin": {"base64": "AP8KgA=="}})
        check(r == ("ok", "0,255,10,128\n", ""), "a binary file of a run message (base64) written as bytes", show(r))
        r = s.run("Promise.reject(new Error('nobody waits'));\nconsole.log('after')")
        check(r[0] == "error" and r[1] == "after\n" and "error: Uncaught (in promise) Error: nobody waits" in r[2],
              "an unhandled rejection fails the run but not the session", show(r))
        r = s.run("console.log(typeof x)")
        check(r == ("ok", "string\n", ""), "still alive", show(r))
        left = [n for n in os.listdir(s.workspace) if n.startswith(".codebox-run-")]
        check(left == [], "run files are removed", repr(left))
        s.send(run_message('console.log("bye");\nDeno.exit(3);'))
        rc, out, err = s.expect_exit()
        check((rc, out) == (3, "bye\n"), "Deno.exit(3) ends the process with 3", repr((rc, out, err)))
    finally:
        s.cleanup()
    s2 = Session(rootfs, "typescript", 'import { callMCPTool } from "/opt/codebox/deno/client.ts";\nconst got = await callMCPTool("srv__echo", { a: 1 });\nconsole.log(JSON.stringify(got));\nlet counter = 1;')
    try:
        r1 = s2.wait(answer=lambda m: STALE_JSON + echo_tool(m) + run_message("counter += 1;\nconsole.log(counter, typeof callMCPTool);"))
        r2 = s2.wait()
        check((r1[0], r2[0], r1[1] + r2[1], r1[2] + r2[2]) == ("ok", "ok", '{"echo":{"name":"srv__echo","arguments":{"a":1}}}\n2 function\n', ""),
              "a tool call during a run; a run that arrived with the response is not lost", show((r1, r2)))
        r = s2.run('const p = callMCPTool("srv__slow", {});\nconsole.log("abandoned")')
        check(r == ("ok", "abandoned\n", ""), "a run may abandon a call", show(r))
        late = json.dumps({"jsonrpc": "2.0", "id": s2.requests[-1]["id"], "result": {"content": []}}).encode() + b"\n"
        r = s2.run("console.log(JSON.stringify(await p) === '[]' ? 'late answer' : 'no')", extra_before=late)
        check(r[0] == "ok" and "late answer" in r[1], "a late response reaches the abandoned call, not the session", show(r))
        rc, out, err = s2.close_channel()
        check((rc, out, err) == (0, "", ""), "EOF on fd 3 while idle: exit 0 quietly", repr((rc, out, err)))
    finally:
        s2.cleanup()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rootfs = os.path.abspath(sys.argv[1])
    langs = sys.argv[2:] or ["python", "typescript"]
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        print("cannot create a user + mount namespace: %s" % probe.stderr.strip())
        sys.exit(77)
    for lang in langs:
        {"python": python_checks, "typescript": ts_checks}[lang](rootfs)
    if FAILURES:
        print("%d check(s) failed: %s" % (len(FAILURES), ", ".join(FAILURES)))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
