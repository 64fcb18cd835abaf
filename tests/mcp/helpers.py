"""What the MCP client scripts share: the server's environment and process lookups."""

import os


def server_env():
    """The environment a test starts `codebox serve` with: CODEBOX_*, HOME and PATH."""
    return {k: v for k, v in os.environ.items() if k.startswith(("CODEBOX_", "HOME", "PATH"))}


def our_serve_pids():
    """Pids of the `codebox serve` processes this script started (its children)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and argv[1:2] == [b"serve"]:
            found.append(int(pid))
    return found


def cpu_seconds(pid):
    """User and system CPU time a process has used so far (all its threads)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processes_with(marker):
    """Pids (other than ours) whose command line contains `marker`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if marker in open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            pass
    return found


class DrainedStderr:
    """Reads a server's stderr on a thread for as long as the server runs.

    A test that leaves `stderr=PIPE` unread stalls the server once 64 KiB of log fill
    the pipe: its next log line blocks the thread that writes it (in CI that was the
    HTTP accept loop, which then neither refused nor served connections). Every line
    is kept, for assertions on the log and for failure messages.
    """

    def __init__(self, proc):
        import threading

        self._lines = []
        self._cond = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in stream:
            if isinstance(line, bytes):
                line = line.decode(errors="replace")
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._done = True
            self._cond.notify_all()

    def wait_for(self, pattern, timeout):
        """The first match of the regex `pattern` in a line, or None when the stream ends
        or `timeout` seconds pass first."""
        import re
        import time

        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    m = re.search(pattern, line)
                    if m:
                        return m
                seen = len(self._lines)
                left = deadline - time.monotonic()
                if self._done or left <= 0:
                    return None
                self._cond.wait(left)

    def text(self, wait_for_end=0):
        """Everything read so far; first waits up to `wait_for_end` s for the stream to end."""
        self._thread.join(wait_for_end)
        with self._cond:
            return "".join(self._lines)


def backend():
    """The backend the client scripts' servers run on: `CODEBOX_TEST_BACKEND` (namespace,
    the default, or microvm). The same cases run on both; a case that needs what the
    microVM backend does not offer yet is marked `namespace_only` and skipped there."""
    return os.environ.get("CODEBOX_TEST_BACKEND", "namespace")


def namespace_only(why):
    """Marks a case that needs what the microVM backend does not offer yet (`why`)."""

    def mark(fn):
        fn.namespace_only = why
        return fn

    return mark


def on_backend(env):
    """Puts a server's `env` on the backend of `backend()`. On the microVM backend calls
    boot cold (`CODEBOX_POOL_SIZE=0`): warm clones have their own test
    (microvm_warm_client.py), and a template per language with its clones, made beside
    the cases, cost a TCG machine most of a minute of CPU that no case here measures."""
    if backend() != "namespace":
        env["CODEBOX_BACKEND"] = backend()
    if backend() == "microvm":
        env["CODEBOX_POOL_SIZE"] = "0"


def stdio_params(codebox, config=None):
    """`codebox serve` over stdio for the SDK's stdio_client: a pool of one per language,
    `config` a codebox.toml or None; on the backend of `backend()`."""
    from mcp import StdioServerParameters

    env = server_env()
    env["CODEBOX_POOL_SIZE"] = "1"
    on_backend(env)
    if config:
        env["CODEBOX_CONFIG"] = config
    return StdioServerParameters(command=codebox, args=["serve"], env=env)


async def cases_over_stdio(codebox, config, cases, timeout=120):
    """Runs `cases` (async functions of a ClientSession) one after another against one
    `codebox serve` over stdio (a pool of one per language; `config`: a codebox.toml or
    None); prints "ok"/"FAILED" per case and returns (passed, failed). With
    `CODEBOX_TEST_CASES=name,name` only those cases run."""
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    passed = failed = 0
    async with stdio_client(stdio_params(codebox, config)) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            only = os.environ.get("CODEBOX_TEST_CASES")
            for fn in cases:
                if only and fn.__name__ not in only.split(","):
                    continue
                why = getattr(fn, "namespace_only", None)
                if why and backend() != "namespace":
                    print(f"skip    {fn.__name__}: not on the {backend()} backend yet: {why}", flush=True)
                    continue
                try:
                    with anyio.fail_after(timeout):
                        await fn(s)
                    print(f"ok      {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure
                    print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                    failed += 1
    return passed, failed
