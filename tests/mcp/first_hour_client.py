"""What a new user meets in the first hour, through `codebox serve` and the official Python
MCP SDK: /workspace/out is there from the start (both languages, one-shot and sessions),
every limit or refusal a program meets is named with its value and the knob that moves
it (timeout, memory, tasks, the network being off, a missing package, a name from an
earlier call, a session lost to a restart), and the first calls after start-up meet the
upstream servers that were still connecting: a search, list_servers and the sandbox's own
search wait for them, and the warm pool keeps its sandboxes, whose /servers gains the
new tools.

Usage: first_hour_client.py CODEBOX_BINARY UPSTREAMS_DIR
UPSTREAMS_DIR holds python/ (mcp-server-time), as `cargo xtask test` installs it.
Prints one line per case and "N passed, M failed".
"""

import json
import os
import sys
import tempfile

import anyio
from mcp import ClientSession
from mcp.client.stdio import stdio_client

from helpers import cases_over_stdio, server_env, stdio_params

CODEBOX = sys.argv[1]
UPSTREAMS = os.path.abspath(sys.argv[2])
HOSTILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "upstream", "hostile_server.py")
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "text", None))


async def run(s, code, tool="execute_python", **args):
    r = await s.call_tool(tool, {"code": code, **args})
    return r, r.structured_content or {}


def hints_of(r, sc):
    """The hints, from structuredContent, checked to be in the text right under its first
    line (before any stderr)."""
    hints = sc.get("hints", [])
    lines = text_of(r).split("\n")
    shown = [line[len("hint: "):] for line in lines[1:1 + len(hints)] if line.startswith("hint: ")]
    assert shown == hints, (shown, hints, text_of(r)[:2000])
    return hints


@case
async def workspace_out_exists_from_the_start_in_python(s):
    code = (
        "import matplotlib.pyplot as plt, pandas as pd\n"
        "plt.plot([1, 2, 3])\n"
        "plt.savefig('/workspace/out/chart.png')\n"
        "pd.DataFrame({'a': [1, 2]}).to_csv('/workspace/out/x.csv')\n"
        "print('saved')"
    )
    r, sc = await run(s, code)
    assert not r.is_error, text_of(r)
    assert sc["stdout"] == "saved\n", sc
    paths = sorted(f["path"] for f in sc.get("files", []))
    assert paths == ["out/chart.png", "out/x.csv"], sc.get("files")
    assert any(c.type == "image" for c in r.content), [c.type for c in r.content]


@case
async def workspace_out_exists_from_the_start_in_typescript(s):
    code = "Deno.writeTextFileSync('/workspace/out/x.csv', 'a,b\\n1,2\\n'); console.log('saved')"
    r, sc = await run(s, code, tool="execute_typescript")
    assert not r.is_error, text_of(r)
    assert [f["path"] for f in sc.get("files", [])] == ["out/x.csv"], sc


@case
async def workspace_out_exists_in_every_run_of_a_session(s):
    for tool, write in [
        ("execute_python", "open('/workspace/out/n{i}.txt', 'w').write('x')"),
        ("execute_typescript", "Deno.writeTextFileSync('/workspace/out/t{i}.txt', 'x')"),
    ]:
        for keep_alive in (False, True):
            r, sc = await run(s, write.format(i=0), tool=tool, session="new", keep_alive=keep_alive)
            assert not r.is_error, text_of(r)
            sid = sc["session"]["id"]
            # The program removes out/ itself: the next run finds it again.
            rm = "import shutil; shutil.rmtree('/workspace/out')" if tool == "execute_python" else "Deno.removeSync('/workspace/out', {recursive: true})"
            r, sc = await run(s, rm, tool=tool, session=sid)
            assert not r.is_error, text_of(r)
            r, sc = await run(s, write.format(i=1), tool=tool, session=sid)
            assert not r.is_error, (tool, keep_alive, text_of(r))
            await s.call_tool("close_session", {"session": sid})


@case
async def a_timeout_names_its_value_and_timeout_ms(s):
    r, sc = await run(s, "while True: pass", timeout_ms=1500)
    assert r.is_error and sc["timed_out"], sc
    hints = hints_of(r, sc)
    assert len(hints) == 1 and "1500 ms" in hints[0] and "timeout_ms" in hints[0], hints


@case
async def an_oom_kill_names_the_memory_limit_and_where_it_is_set(s):
    r, sc = await run(s, "x = bytearray(3 * 1024 ** 3)")
    assert r.is_error and sc["oom_killed"], sc
    hints = hints_of(r, sc)
    assert len(hints) == 1 and "512 MiB" in hints[0] and "[limits] memory" in hints[0], hints


@case
async def a_fork_bomb_names_the_pids_limit_first(s):
    r, sc = await run(s, "import os\nwhile True:\n    os.fork()", timeout_ms=20000)
    assert r.is_error and sc["pids_limited"], sc
    hints = hints_of(r, sc)
    assert any("128 processes and threads" in h and "[limits] pids" in h for h in hints), hints
    # Before the tracebacks: the second line of the text.
    assert text_of(r).split("\n")[1].startswith("hint: the sandbox reached its task limit"), text_of(r)[:500]


@case
async def a_refused_socket_says_the_network_is_off_and_how_hosts_are_allowed(s):
    for tool, code in [
        ("execute_python", "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=2)"),
        ("execute_python", "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)"),
        ("execute_typescript", "await fetch('http://example.com')"),
        ("execute_typescript", "await Deno.connect({hostname: '192.0.2.1', port: 80})"),
    ]:
        r, sc = await run(s, code, tool=tool)
        assert r.is_error, text_of(r)
        hints = hints_of(r, sc)
        assert any("network is off" in h and 'mode = "proxy"' in h for h in hints), (code, hints, sc["stderr"])


@case
async def a_missing_module_points_at_packages(s):
    r, sc = await run(s, "import sklearn")
    assert r.is_error, sc
    hints = hints_of(r, sc)
    assert any('packages: ["scikit-learn"]' in h for h in hints), hints


@case
async def a_name_from_an_earlier_call_hints_at_sessions(s):
    r, sc = await run(s, "df = 1")
    assert not r.is_error and "hints" not in sc, sc
    for tool, code in [("execute_python", "print(df)"), ("execute_typescript", "console.log(df)")]:
        r, sc = await run(s, code, tool=tool)
        assert r.is_error, sc
        hints = hints_of(r, sc)
        assert any(h.startswith("df is not defined") and "keep_alive: true" in h for h in hints), hints
    # In a keep-alive session the names are kept, and a NameError is the program's own.
    r, sc = await run(s, "df = 1", session="new", keep_alive=True)
    sid = sc["session"]["id"]
    r, sc = await run(s, "print(df)\nprint(other)", session=sid)
    assert r.is_error and sc["stdout"] == "1\n" and "hints" not in sc, sc
    await s.call_tool("close_session", {"session": sid})


@case
async def a_typescript_error_shows_the_programs_own_line(s):
    # The last expression is rewritten to capture its value; the error shows the line as
    # written, its column, and none of codebox's own frames.
    r, sc = await run(s, "const x: number = 1;\nconsole.log(y);", tool="execute_typescript")
    err = sc["stderr"]
    assert r.is_error and err.startswith("error: Uncaught (in promise) ReferenceError: y is not defined\n"), err
    assert "\nconsole.log(y);\n            ^\n" in err and ".codebox-main.ts:2:13" in err, err
    assert "codebox.value" not in err and "boot.js" not in err, err
    r, sc = await run(s, "const a = 1; a.b.c", tool="execute_typescript")
    assert "\nconst a = 1; a.b.c\n                 ^\n" in sc["stderr"] and ":1:18" in sc["stderr"], sc["stderr"]
    # A syntax error and a missing module: no codebox frame, no import query.
    for code in ["let s = 1\ns +", "import x from './nope.ts'"]:
        r, sc = await run(s, code, tool="execute_typescript")
        assert r.is_error and "boot.js" not in sc["stderr"] and "as-written" not in sc["stderr"], sc["stderr"]
    # What the program wrote before it failed comes back; what it left pending does not
    # keep it alive.
    code = "Deno.writeTextFileSync('/workspace/out/a.txt', 'x');\nsetInterval(() => {}, 100);\nundefinedFn()"
    r, sc = await run(s, code, tool="execute_typescript", timeout_ms=20000)
    assert r.is_error and sc["exit_code"] == 1 and not sc["timed_out"], sc
    assert [f["path"] for f in sc.get("files", [])] == ["out/a.txt"], sc


@case
async def success_has_no_hint(s):
    for tool, code in [("execute_python", "print(1)"), ("execute_typescript", "console.log(1)")]:
        r, sc = await run(s, code, tool=tool)
        assert not r.is_error and "hints" not in sc and "hint:" not in text_of(r), text_of(r)


async def a_session_lost_to_a_restart_says_so():
    """Across two server processes: a session id of the first is answered, by the second,
    as an earlier run's; a closed one (same process) as closed."""
    async with stdio_client(stdio_params(CODEBOX)) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r, sc = await run(s, "x = 1", session="new", keep_alive=True)
            sid = sc["session"]["id"]
            r, sc = await run(s, "x = 1", session="new")
            closed = sc["session"]["id"]
            await s.call_tool("close_session", {"session": closed})
            r, _ = await run(s, "print(1)", session=closed)
            assert r.is_error and "was closed" in text_of(r), text_of(r)
    async with stdio_client(stdio_params(CODEBOX)) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r, _ = await run(s, "print(x)", session=sid)
            text = text_of(r)
            assert r.is_error and "earlier run of this server" in text and "restarted" in text, text
            # An id that was never made is still just unknown.
            r, _ = await run(s, "print(1)", session="cbx_nope")
            assert r.is_error and "no session" in text_of(r), text_of(r)


async def the_first_calls_meet_the_servers_that_were_still_connecting():
    """A server whose upstreams come up seconds after start: once the warm pool is full
    (while "slow" still sleeps), the first search finds the tools of both; list_servers
    shows them ready; code's own search finds them; the pooled sandboxes made before
    they came up are kept (none retired) and serve the next calls warm, with the typed
    wrappers of the new tools."""
    from mcp import StdioServerParameters

    with tempfile.TemporaryDirectory(prefix="codebox-first-hour-") as tmp:
        os.chmod(tmp, 0o755)
        config = os.path.join(tmp, "mcp.json")
        go = os.path.join(tmp, "go")
        with open(config, "w") as f:
            json.dump({"mcpServers": {
                "time": {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                         "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python")}},
                "slow": {"command": "/usr/bin/python3", "args": [HOSTILE], "env": {"HOSTILE_START_WHEN": go}},
            }}, f)
        env = server_env()
        # The waits count from a server's first attempt: room for a loaded machine.
        env.update({"CODEBOX_MCP_CONFIG": config, "CODEBOX_POOL_SIZE": "1",
                    "CODEBOX_UPSTREAM_WAIT": "60s", "CODEBOX_UPSTREAM_CONNECT_TIMEOUT": "120s"})
        params = StdioServerParameters(command=CODEBOX, args=["serve"], env=env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                # The pool fills while "slow" waits for its go (health never waits).
                for _ in range(1200):
                    h = (await s.call_tool("health", {})).structured_content
                    pool = h["pool"]["languages"]
                    if pool["python"]["idle"] >= 1 and pool["typescript"]["idle"] >= 1:
                        break
                    await anyio.sleep(0.05)
                slow = [u for u in h["upstreams"] if u["name"] == "slow"]
                assert slow and slow[0]["status"] == "connecting", h["upstreams"]
                assert pool["python"]["idle"] >= 1 and pool["typescript"]["idle"] >= 1, pool
                open(go, "w").close()
                r = await s.call_tool("search_tools", {"query": "hostile echo"})
                names = [t["name"] for t in r.structured_content["tools"]]
                assert "slow__echo" in names, (names, text_of(r))
                assert "still connecting" not in text_of(r), text_of(r)
                r = await s.call_tool("search_tools", {"query": "current time timezone"})
                assert "time__get_current_time" in [t["name"] for t in r.structured_content["tools"]], text_of(r)
                r = await s.call_tool("list_servers", {})
                states = {x["name"]: x["status"] for x in r.structured_content["servers"]}
                assert states == {"time": "ready", "slow": "ready"}, states
                # Code's own search and a call through the typed wrapper, in pooled
                # sandboxes made before the servers came up.
                code = (
                    "import codebox, inspect, servers.slow as slow\n"
                    "found = [t['name'] for t in codebox.search_tools('hostile echo')]\n"
                    "print('slow__echo' in found, 'text' in inspect.signature(slow.echo).parameters)\n"
                    "print(slow.echo(text='hi'))"
                )
                r, sc = await run(s, code)
                assert not r.is_error, text_of(r)
                assert sc["stdout"] == "True True\nhi\n", sc
                assert sc.get("start") == "warm", sc.get("start")
                ts = 'import slow from "/servers/slow/index.ts";\nconsole.log(await slow.echo({text: "hi"}));'
                r, sc = await run(s, ts, tool="execute_typescript")
                assert not r.is_error and sc["stdout"] == "hi\n", sc
                assert sc.get("start") == "warm", sc.get("start")
                pool = (await s.call_tool("health", {})).structured_content["pool"]["languages"]
                assert pool["python"]["retired"] == 0 and pool["typescript"]["retired"] == 0, pool


async def main():
    passed, failed = await cases_over_stdio(CODEBOX, None, CASES)
    for fn in [a_session_lost_to_a_restart_says_so, the_first_calls_meet_the_servers_that_were_still_connecting]:
        try:
            with anyio.fail_after(120):
                await fn()
            print(f"ok      {fn.__name__}", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001 - report every failure
            print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
            failed += 1
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


anyio.run(main)
