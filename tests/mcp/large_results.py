"""Large upstream results, measured: how long one reaches TypeScript and Python in the
sandbox, and the supervisor's memory around several at once.

Usage: large_results.py CODEBOX_BINARY [MEGABYTES] [CONCURRENT] [SANDBOX_MEMORY]
(PYTHONPATH = the Python MCP SDK, CODEBOX_ROOTFS = the rootfs, as for the other scripts.)
The sandboxes run the default profile with SANDBOX_MEMORY (default 2G) as their memory
limit, so that a client that needs several copies of the result can still be timed.

The upstream is tests/upstream/hostile_server.py, whose `big` tool answers a text of the
asked size. Prints one line per figure. Not a pass/fail test: it is how the figures in
the README and the commit messages were measured; run it against two binaries to compare.
"""

import json
import os
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import our_serve_pids, server_env

CODEBOX = sys.argv[1]
MB = int(sys.argv[2]) if len(sys.argv) > 2 else 50
CONCURRENT = int(sys.argv[3]) if len(sys.argv) > 3 else 4
HERE = os.path.dirname(os.path.abspath(__file__))
HOSTILE = os.path.join(HERE, "..", "upstream", "hostile_server.py")
SANDBOX_MEMORY = sys.argv[4] if len(sys.argv) > 4 else "2G"
SIZE = MB * 1_000_000
PROFILE = os.path.join(HERE, "..", "..", "policies", "profiles", "default.toml")


def status_kb(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def serve_pid():
    pids = our_serve_pids()
    assert len(pids) == 1, f"codebox serve not found once among our children: {pids}"
    return pids[0]


PY = f"""
import time, codebox
t = time.monotonic()
r = codebox.call_tool("hostile__big", {{"bytes": {SIZE}}})
print(len(r), round(time.monotonic() - t, 2))
"""

TS = f"""
import {{ callMCPTool }} from "/servers/client.ts";
const t = performance.now();
const r = await callMCPTool("hostile__big", {{ bytes: {SIZE} }}) as string;
console.log(r.length, ((performance.now() - t) / 1000).toFixed(2));
"""


async def run(s, language, code):
    t = time.monotonic()
    r = await s.call_tool(f"execute_{language}", {"code": code, "timeout_ms": 300000})
    sc = r.structured_content or {}
    assert not r.is_error and sc.get("exit_code") == 0, (sc.get("stderr"), r.content)
    size, inside = sc["stdout"].split()
    assert int(size) == SIZE, sc["stdout"]
    return float(inside), time.monotonic() - t


async def main():
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "mcp.json")
        with open(config, "w") as f:
            json.dump({"mcpServers": {"hostile": {"command": "/usr/bin/python3", "args": [HOSTILE]}}}, f)
        profile = os.path.join(tmp, "profile.toml")
        with open(PROFILE) as f, open(profile, "w") as g:
            text = f.read()
            assert 'memory = "512M"' in text
            g.write(text.replace('memory = "512M"', f'memory = "{SANDBOX_MEMORY}"'))
        env = server_env()
        env["CODEBOX_MCP_CONFIG"] = config
        if "GLIBC_TUNABLES" in os.environ:  # to compare malloc settings
            env["GLIBC_TUNABLES"] = os.environ["GLIBC_TUNABLES"]
        params = StdioServerParameters(command=CODEBOX, args=["serve", "--profile", profile], env=env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                pid = serve_pid()
                # Warm both runtimes up.
                await s.call_tool("execute_python", {"code": "print(1)"})
                await s.call_tool("execute_typescript", {"code": "console.log(1)"})
                idle = status_kb(pid, "VmRSS")
                print(f"supervisor RSS idle: {idle // 1024} MB", flush=True)
                for language, code in (("typescript", TS), ("python", PY)):
                    inside, total = await run(s, language, code)
                    print(f"{MB} MB to {language}: {inside:.2f} s in the sandbox's call, "
                          f"{total:.2f} s execution round trip", flush=True)
                await anyio.sleep(1)
                before = status_kb(pid, "VmRSS")
                print(f"supervisor RSS after one result to each language: {before // 1024} MB (peak "
                      f"{status_kb(pid, 'VmHWM') // 1024} MB)", flush=True)
                # Resets VmHWM (the peak) to the current RSS.
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
                t = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for _ in range(CONCURRENT):
                        tg.start_soon(run, s, "python", PY)
                took = time.monotonic() - t
                await anyio.sleep(2)
                peak = status_kb(pid, "VmHWM")
                after = status_kb(pid, "VmRSS")
                print(f"{CONCURRENT} x {MB} MB concurrently ({took:.1f} s): supervisor RSS "
                      f"before {before // 1024} MB, peak {peak // 1024} MB, "
                      f"after {after // 1024} MB", flush=True)


if __name__ == "__main__":
    anyio.run(main)
