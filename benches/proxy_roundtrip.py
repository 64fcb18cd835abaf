"""Proxy round trip: sandbox → codebox proxy → upstream → sandbox, against the same
upstream call made directly by an MCP client, measured side by side in one run.

Usage (after `cargo xtask test` installed the SDK and the upstream servers):
    PYTHONPATH=target/mcp-pydeps CODEBOX_ROOTFS=target/rootfs \\
        /usr/bin/python3 benches/proxy_roundtrip.py target/release/codebox target/upstreams [CALLS]

The upstreams are mcp-server-time (Python) and server-everything (Node), over stdio.
Through codebox, one execute_python program makes CALLS sequential `codebox.call_tool`
calls and times each with perf_counter inside the sandbox; directly, the Python SDK makes
the same calls to its own copy of the same server. Rounds alternate between the two.
Prints median, p90 and p99 in milliseconds and the ratio of the medians.
"""

import json
import os
import statistics
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CODEBOX = sys.argv[1]
UPSTREAMS = os.path.abspath(sys.argv[2])
CALLS = int(sys.argv[3]) if len(sys.argv) > 3 else 200
ROUNDS = 4

TIME = {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python")}}
EVERYTHING = {"command": "node", "args": [os.path.join(
    UPSTREAMS, "node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"), "stdio"]}
TOOLS = {
    "time": ("get_current_time", {"timezone": "UTC"}),
    "everything": ("echo", {"message": "hi"}),
}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def through_codebox(s, server, n):
    tool, args = TOOLS[server]
    code = f"""
import codebox, json, time
name, args = {f"{server}__{tool}"!r}, {args!r}
codebox.call_tool(name, args)  # warm-up
out = []
for _ in range({n}):
    t = time.perf_counter()
    codebox.call_tool(name, args)
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"""
    r = await s.call_tool("execute_python", {"code": code, "timeout_ms": 120000})
    assert not r.is_error, r.structured_content
    return json.loads(r.structured_content["stdout"])


async def direct(s, server, n):
    tool, args = TOOLS[server]
    await s.call_tool(tool, args)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await s.call_tool(tool, args)
        out.append((time.perf_counter() - t) * 1000)
    return out


async def main():
    with tempfile.TemporaryDirectory(prefix="codebox-bench-") as tmp:
        config = os.path.join(tmp, "mcp.json")
        with open(config, "w") as f:
            json.dump({"mcpServers": {"time": TIME, "everything": EVERYTHING}}, f)
        env = {k: v for k, v in os.environ.items() if k.startswith(("CODEBOX_", "HOME", "PATH"))}
        env["CODEBOX_MCP_CONFIG"] = config
        samples = {(srv, how): [] for srv in TOOLS for how in ("codebox", "direct")}
        async with stdio_client(StdioServerParameters(command=CODEBOX, args=["serve"], env=env)) as cb:
            async with ClientSession(*cb) as codebox:
                await codebox.initialize()
                for server, spec in [("time", TIME), ("everything", EVERYTHING)]:
                    params = StdioServerParameters(command=spec["command"], args=spec["args"],
                                                   env={**os.environ, **spec.get("env", {})})
                    async with stdio_client(params) as up:
                        async with ClientSession(*up) as upstream:
                            await upstream.initialize()
                            for _ in range(ROUNDS):
                                samples[(server, "codebox")] += await through_codebox(codebox, server, CALLS // ROUNDS)
                                samples[(server, "direct")] += await direct(upstream, server, CALLS // ROUNDS)
    print(f"\n{CALLS} calls each, {ROUNDS} alternating rounds, ms")
    print(f"{'':58}{'median':>8}{'p90':>8}{'p99':>8}")
    for server in TOOLS:
        tool = TOOLS[server][0]
        for how, label in [("codebox", f"sandbox → proxy → {server} {tool} → sandbox"),
                           ("direct", f"MCP client → {server} {tool} (direct)")]:
            xs = samples[(server, how)]
            print(f"{label:58}{statistics.median(xs):8.2f}{pct(xs, 90):8.2f}{pct(xs, 99):8.2f}")
        ratio = statistics.median(samples[(server, "codebox")]) / statistics.median(samples[(server, "direct")])
        print(f"{'ratio proxy / direct (medians)':58}{ratio:8.2f}")


if __name__ == "__main__":
    anyio.run(main)
