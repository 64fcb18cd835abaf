"""Warm microVM clones in `codebox serve`, through the official Python MCP SDK: each
language's template boots once, clones wait with their program started, and a call takes
one. What a warm clone must still do as a cold VM does: see the `/servers` of its call
(the trees come after the clone's start and fill its empty mounts), run under the call's
own timeout (its deadline is armed when it is handed out), and share no randomness with
another clone (the kernel's pool reseeded, each interpreter started in its own clone).

Usage: microvm_warm_client.py CODEBOX_BINARY UPSTREAMS_DIR
Needs the guest (`CODEBOX_GUEST`); the server runs with `CODEBOX_BACKEND=microvm`.
Prints one line per case and "N passed, M failed".
"""

import json
import os
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import our_serve_pids, processes_with, server_env

CODEBOX = sys.argv[1]
UPSTREAMS = os.path.abspath(sys.argv[2])
MEMORY = os.path.join(UPSTREAMS, "node/node_modules/@modelcontextprotocol/server-memory/dist/index.js")
CASES = []
# The server's profile: the shipped default with this timeout, so that a call may ask
# for a longer one without the test waiting 30 s.
PROFILE_TIMEOUT_S = 10
# Under TCG a template boots in ~10 s and a clone is restored in a few; on a loaded
# 2-core machine several times that.
WARM_WAIT = 300


def case(fn):
    CASES.append(fn)
    return fn


async def warm_state(s, language):
    h = (await s.call_tool("health", {})).structured_content
    return h["backend"]["microvm"]["warm"][language]


async def clone_waiting(s, language):
    """Waits until `language` has a clone waiting (the next call of it is warm)."""
    deadline = time.monotonic() + WARM_WAIT
    while True:
        w = await warm_state(s, language)
        if w["waiting"] >= 1:
            return w
        assert w["template"]["state"] != "failed", w
        assert time.monotonic() < deadline, w
        await anyio.sleep(0.2)


async def warm(s, language, code, **args):
    """`code` on a waiting clone: structuredContent, checked to be a warm microVM run."""
    await clone_waiting(s, language)
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    sc = r.structured_content or {}
    assert sc.get("start") == "warm" and sc.get("backend") == "microvm", sc
    return r, sc


@case
async def a_warm_clone_sees_the_servers_of_its_call(s):
    r, sc = await warm(
        s,
        "python",
        "from servers.memory import create_entities, read_graph\n"
        'create_entities(entities=[{"name": "warm-py", "entityType": "t", "observations": ["a"]}])\n'
        'print([e["name"] for e in read_graph()["entities"]])\n',
    )
    assert not r.is_error and sc["exit_code"] == 0, sc
    assert sc["stdout"] == "['warm-py']\n", sc
    assert [c["name"] for c in sc["tool_calls"]] == ["memory__create_entities", "memory__read_graph"], sc
    r, sc = await warm(
        s,
        "typescript",
        'import { readGraph } from "/servers/memory/index.ts";\n'
        "const g = await readGraph();\n"
        "console.log(g.entities.map((e) => e.name).join(','));\n",
    )
    assert not r.is_error and sc["exit_code"] == 0, sc
    assert sc["stdout"] == "warm-py\n", sc
    # The trees are read-only for the program, as a namespace sandbox's binds are.
    r, sc = await warm(
        s,
        "python",
        "import os\n"
        "try:\n"
        "    open('/servers/x.py', 'w')\n"
        "    print('written')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n",
    )
    assert sc["stdout"] in ("OSError\n", "PermissionError\n"), sc


@case
async def two_warm_clones_share_no_randomness(s):
    py = (
        "import os, random, uuid, json\n"
        "print(json.dumps([os.urandom(16).hex(), random.random(), str(uuid.uuid4()), hash('codebox')]))\n"
    )
    ts = (
        "const b = new Uint8Array(16); crypto.getRandomValues(b);\n"
        "console.log(JSON.stringify([Array.from(b).join('.'), Math.random(), crypto.randomUUID()]));\n"
    )
    for language, code in (("python", py), ("typescript", ts)):
        seen = []
        for _ in range(2):
            _, sc = await warm(s, language, code)
            assert sc["exit_code"] == 0, sc
            seen.append(json.loads(sc["stdout"]))
        a, b = seen
        for i, (x, y) in enumerate(zip(a, b)):
            assert x != y, f"{language}: value {i} is the same in two clones: {x!r}"


@case
async def a_warm_clone_runs_under_the_timeout_of_its_call(s):
    _, sc = await warm(s, "python", "import time\ntime.sleep(60)\n", timeout_ms=2000)
    assert sc["timed_out"] is True, sc
    # Longer than the profile's (PROFILE_TIMEOUT_S, what the template's program was
    # started with): the guest arms the call's own deadline, so the program is not ended
    # at the profile's.
    _, sc = await warm(s, "python", f"import time\ntime.sleep({PROFILE_TIMEOUT_S + 2})\nprint(6 * 7)\n",
                       timeout_ms=(PROFILE_TIMEOUT_S + 20) * 1000)
    assert sc["stdout"] == "42\n" and sc["exit_code"] == 0 and not sc["timed_out"], sc


@case
async def health_names_the_templates_and_what_they_served(s):
    for language in ("python", "typescript"):
        w = await warm_state(s, language)
        assert w["template"]["state"] == "ready" and w["template"]["stage"] == "kernel", w
        assert w["handed_out"] >= 2 and w["target"] == 1, w
        assert w["template"]["device_state_bytes"] > 0, w


async def main():
    tmp = tempfile.TemporaryDirectory(prefix="codebox-warm-vm-test-")
    os.chmod(tmp.name, 0o755)
    config = os.path.join(tmp.name, "mcp.json")
    with open(config, "w") as f:
        json.dump({"mcpServers": {"memory": {"command": "node", "args": [MEMORY],
                                             "env": {"MEMORY_FILE_PATH": os.path.join(tmp.name, "memory.jsonl")}}}}, f)
    shipped = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "policies", "profiles", "default.toml")
    profile = os.path.join(tmp.name, "short.toml")
    text = open(shipped).read()
    assert 'timeout = "30s"' in text, "the shipped default profile's timeout moved"
    with open(profile, "w") as f:
        f.write(text.replace('timeout = "30s"', f'timeout = "{PROFILE_TIMEOUT_S}s"', 1))
    env = server_env()
    env.update(CODEBOX_BACKEND="microvm", CODEBOX_POOL_SIZE="1", CODEBOX_PROFILE=profile)
    params = StdioServerParameters(command=CODEBOX, args=["serve", "--mcp-config", config], env=env)
    passed = failed = 0
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for fn in CASES:
                try:
                    with anyio.fail_after(WARM_WAIT + 120):
                        await fn(s)
                    print(f"ok      {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure
                    print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                    failed += 1
    # The server is gone with its clones and templates: no QEMU is left (the tests of one
    # binary run one at a time; nothing else here starts QEMU).
    deadline = time.monotonic() + 20
    while (our_serve_pids() or processes_with("qemu-system")) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = our_serve_pids() + processes_with("qemu-system")
    if left:
        print(f"FAILED  nothing_is_left_after_the_server: {left}", flush=True)
        failed += 1
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
