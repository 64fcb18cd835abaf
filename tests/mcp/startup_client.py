"""Ready at once, honest about upstreams: `codebox serve` with upstreams that are slow,
hang, fail to start, flood stderr, use a transport codebox does not speak, or go away,
driven by the official Python MCP SDK.

Usage: startup_client.py CODEBOX_BINARY UPSTREAMS_DIR
UPSTREAMS_DIR holds python/ (mcp-server-time), as `cargo xtask test` installs it. The
other upstreams are tests/upstream/hostile_server.py in its start-up modes. Prints one line
per case and "N passed, M failed".
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import anyio
import mcp.types
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import DrainedStderr, server_env

CODEBOX = sys.argv[1]
UPSTREAMS = os.path.abspath(sys.argv[2])
HOSTILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "upstream", "hostile_server.py")
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def hostile(**env):
    return {"command": "/usr/bin/python3", "args": [HOSTILE], "env": {k: str(v) for k, v in env.items()}}


class World:
    """The .mcp.json with one upstream per start-up behaviour, and what the cases saw."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-startup-test-")
        os.chmod(self.tmp.name, 0o755)
        self.flaky_marker = os.path.join(self.tmp.name, "flaky-refuses")
        self.config = os.path.join(self.tmp.name, "mcp.json")
        with open(self.config, "w") as f:
            json.dump({"mcpServers": {
                "time": {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                         "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python")}},
                "slow": hostile(HOSTILE_DELAY_S=4),
                "hang": hostile(HOSTILE_HANG=1),
                "broken": hostile(HOSTILE_REFUSE_IF="/"),
                "flaky": hostile(HOSTILE_REFUSE_IF=self.flaky_marker),
                "noisy": hostile(HOSTILE_STDERR_FLOOD=20),
                "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
                "unset": {"command": "${CODEBOX_TEST_NOT_SET_ANYWHERE}"},
            }}, f)
        self.resource_changes = []
        self.initialized_after = None

    def env(self):
        env = server_env()
        env.update({
            "CODEBOX_MCP_CONFIG": self.config,
            "CODEBOX_POOL_SIZE": "1",
            # The hanging server stays "connecting" for the whole test; a call waits 3 s.
            "CODEBOX_UPSTREAM_CONNECT_TIMEOUT": "120s",
            "CODEBOX_UPSTREAM_WAIT": "3s",
        })
        return env

    async def on_message(self, message):
        if isinstance(message, mcp.types.ResourceListChangedNotification):
            self.resource_changes.append(time.monotonic())


async def run(s, language, code, **args):
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    return r, r.structured_content or {}


def ok(r, sc):
    assert not r.is_error, sc.get("stderr") or r.content


async def servers(s):
    r = await s.call_tool("list_servers", {})
    return {x["name"]: x for x in r.structured_content["servers"]}


async def until(s, predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        found = await servers(s)
        if predicate(found):
            return found
        assert time.monotonic() < deadline, f"{what}: {found}"
        await anyio.sleep(0.2)


@case
async def initialize_does_not_wait_for_upstreams(s, w):
    print(f"        initialize answered {w.initialized_after * 1000:.0f} ms after the server was started", flush=True)
    found = await servers(s)
    # Answered while the hanging server is connecting (its connect timeout is 120 s) and
    # the slow one sleeps its 4 s.
    assert found["hang"]["status"] == "connecting", found["hang"]
    assert found["slow"]["status"] in ("connecting", "ready"), found["slow"]
    assert set(found) == {"time", "slow", "hang", "broken", "flaky", "noisy", "legacy", "unset"}, found


@case
async def unusable_entries_are_listed_as_failed_and_the_rest_is_used(s, w):
    found = await until(s, lambda f: f["time"]["status"] == "ready", "time never became ready")
    legacy = found["legacy"]
    assert legacy["status"] == "failed" and "sse" in legacy["note"] and "not started" in legacy["note"], legacy
    unset = found["unset"]
    assert unset["status"] == "failed" and "CODEBOX_TEST_NOT_SET_ANYWHERE" in unset["note"], unset
    r, sc = await run(s, "python", "from servers.time import get_current_time\nprint(get_current_time(timezone='UTC')['timezone'])")
    ok(r, sc)
    assert sc["stdout"] == "UTC\n", sc


@case
async def a_connecting_server_is_waited_for_and_list_changed_is_sent(s, w):
    # The sandbox may have started before "slow" listed its tools: its module then calls
    # by name, and the call waits for the server.
    r, sc = await run(s, "python", "from servers.slow import echo\nprint(echo(text='waited'))")
    if r.is_error or "waited" not in sc.get("stdout", ""):
        # Within the 3 s wait or not, once ready the call must work.
        await until(s, lambda f: f["slow"]["status"] == "ready", "slow never became ready")
        r, sc = await run(s, "python", "from servers.slow import echo\nprint(echo(text='waited'))")
    ok(r, sc)
    assert "waited" in sc["stdout"], sc
    await until(s, lambda f: f["slow"]["status"] == "ready", "slow never became ready")
    deadline = time.monotonic() + 10
    while not w.resource_changes:
        assert time.monotonic() < deadline, "no notifications/resources/list_changed reached the client"
        await anyio.sleep(0.1)
    listed = [str(r.uri) for r in (await s.list_resources()).resources]
    assert any(u.startswith("codebox://servers/slow/") for u in listed), listed


@case
async def a_hanging_server_reads_as_an_outage(s, w):
    code = (
        "import codebox\nfrom servers.hang import anything\n"
        "try:\n    anything(x=1)\nexcept codebox.ToolError as e:\n    print('ToolError:', e)\n"
    )
    r, sc = await run(s, "python", code)
    ok(r, sc)
    out = sc["stdout"]
    assert 'server "hang" is still connecting' in out and "retry" in out and "waited" in out, out
    ts = (
        'import hang from "/servers/hang/index.ts";\n'
        "try { await hang.anything({}); } catch (e) { console.log(e.name, e.message); }\n"
    )
    r, sc = await run(s, "typescript", ts)
    ok(r, sc)
    assert sc["stdout"].startswith("ToolError") and "still connecting" in sc["stdout"], sc


@case
async def a_server_that_fails_to_start_reads_as_an_outage(s, w):
    await until(s, lambda f: f["broken"]["attempts"] >= 1 and f["broken"]["status"] != "connecting", "broken")
    code = (
        "import codebox\nfrom servers.broken import echo\n"
        "try:\n    echo(text='x')\nexcept codebox.ToolError as e:\n    print('ToolError:', e)\n"
    )
    r, sc = await run(s, "python", code)
    ok(r, sc)
    out = sc["stdout"]
    assert 'server "broken"' in out and ("is down" in out or "reconnecting" in out), out
    assert "refusing to start" in out or "status 3" in out or "exit" in out, out
    r = await s.call_tool("search_tools", {"query": "echo"})
    notes = {n["server"]: n for n in r.structured_content.get("servers_not_ready", [])}
    assert {"broken", "hang", "legacy"} <= set(notes), notes
    assert "note:" in r.content[0].text, r.content[0].text


@case
async def a_call_while_the_server_is_down_then_success_after_reconnect(s, w):
    await until(s, lambda f: f["flaky"]["status"] == "ready", "flaky never became ready")
    r, sc = await run(s, "python", "from servers.flaky import pid\nprint(pid())")
    ok(r, sc)
    digits = "".join(ch for ch in sc["stdout"] if ch.isdigit())
    assert digits, sc
    flaky_pid = int(digits)
    open(w.flaky_marker, "w").close()
    os.kill(flaky_pid, signal.SIGKILL)
    await until(s, lambda f: f["flaky"]["status"] != "ready", "flaky still ready after its process was killed")
    code = (
        "import codebox\nfrom servers.flaky import echo\n"
        "try:\n    echo(text='x')\nexcept codebox.ToolError as e:\n    print('ToolError:', e)\n"
    )
    r, sc = await run(s, "python", code)
    ok(r, sc)
    out = sc["stdout"]
    assert out.startswith("ToolError:") and 'server "flaky"' in out and "attempt" in out, out
    os.unlink(w.flaky_marker)
    await until(s, lambda f: f["flaky"]["status"] == "ready", "flaky did not come back", timeout=90)
    r, sc = await run(s, "python", "from servers.flaky import echo\nprint(echo(text='back'))")
    ok(r, sc)
    assert "back" in sc["stdout"], sc


@case
async def a_server_flooding_stderr_works_and_codebox_stays_up(s, w):
    found = await until(s, lambda f: f["noisy"]["status"] == "ready", "noisy never became ready")
    assert found["noisy"]["tool_count"] > 0, found["noisy"]
    r, sc = await run(s, "python", "from servers.noisy import echo\nprint(echo(text='heard'))")
    ok(r, sc)
    assert "heard" in sc["stdout"], sc


async def stdio_cases(w):
    params = StdioServerParameters(command=CODEBOX, args=["serve"], env=w.env())
    passed = failed = 0
    started = time.monotonic()
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, message_handler=w.on_message) as s:
            await s.initialize()
            w.initialized_after = time.monotonic() - started
            for fn in CASES:
                try:
                    with anyio.fail_after(180):
                        await fn(s, w)
                    print(f"ok      {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure
                    print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                    failed += 1
    return passed, failed


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_readiness(w):
    """Over HTTP: /healthz answers at once whatever the upstreams do; /readyz is 503
    until the sandbox checks passed and the pool is warm, then 200, naming the upstreams
    by state (the hanging one pending, the broken ones failed)."""
    port = free_port()
    env = w.env()
    proc = subprocess.Popen([CODEBOX, "serve", "--http", f"127.0.0.1:{port}"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log = DrainedStderr(proc)
    try:
        started = time.monotonic()
        while True:
            try:
                status, body = get(f"http://127.0.0.1:{port}/healthz")
                break
            except OSError:
                assert time.monotonic() - started < 30, log.text()
                time.sleep(0.01)
        print(f"        /healthz answered {(time.monotonic() - started) * 1000:.0f} ms after the server was started", flush=True)
        assert status == 200, (status, body)
        deadline = time.monotonic() + 60
        while True:
            status, body = get(f"http://127.0.0.1:{port}/readyz")
            value = json.loads(body)
            if status == 200:
                break
            assert status == 503 and value["ready"] is False, (status, value)
            assert time.monotonic() < deadline, value
            time.sleep(0.1)
        assert value["ready"] is True and value["sandbox_checks"] == "passed" and value["pool_warm"] is True, value
        assert "hang" in value["upstreams"]["pending"], value
        assert {"legacy", "unset"} <= set(value["upstreams"]["failed"]), value
        # A page loaded from a name rebound to this address (no tokens here) gets the
        # status only, not the detail.
        status, body = get(f"http://127.0.0.1:{port}/readyz", {"Host": f"rebound.example:{port}"})
        assert status == 200 and json.loads(body) == {"ready": True, "draining": False}, (status, body)
        print("ok      http_healthz_at_once_and_readyz_names_the_upstreams", flush=True)
        return 1, 0
    except Exception as e:  # noqa: BLE001
        print(f"FAILED  http_healthz_at_once_and_readyz_names_the_upstreams: {e!r}\n{log.text()[-3000:]}", flush=True)
        return 0, 1
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    w = World()
    try:
        passed, failed = anyio.run(stdio_cases, w)
        p, f = http_readiness(w)
        passed, failed = passed + p, failed + f
    finally:
        w.tmp.cleanup()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
