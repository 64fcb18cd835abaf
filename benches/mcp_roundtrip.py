"""MCP round trip vs the CLI, side by side in one run.

Alternates `tools/call execute_python {"code": "print(1)"}` through the official Python
MCP SDK (one stdio session to `codebox serve`) with a cold `codebox run python -c
'print(1)'` process, and prints median/p90/p99 of each and their ratio.

    PYTHONPATH=target/mcp-pydeps /usr/bin/python3 benches/mcp_roundtrip.py \
        target/release/codebox [RUNS]
"""

import os
import statistics
import subprocess
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

CODEBOX = sys.argv[1]
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 100


def pct(xs, q):
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * q)]


async def main():
    env = {k: v for k, v in os.environ.items() if k.startswith(("CODEBOX_", "HOME", "PATH"))}
    params = StdioServerParameters(command=CODEBOX, args=["serve"], env=env)
    mcp_ms, cli_ms = [], []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for i in range(RUNS + 1):
                t = time.perf_counter()
                r = await s.call_tool("execute_python", {"code": "print(1)"})
                dt = (time.perf_counter() - t) * 1000
                assert r.structured_content["stdout"] == "1\n", r
                t = time.perf_counter()
                out = subprocess.run([CODEBOX, "run", "python", "-c", "print(1)"], env=env,
                                     capture_output=True, check=True).stdout
                dc = (time.perf_counter() - t) * 1000
                assert out == b"1\n", out
                if i > 0:  # the first round warms caches
                    mcp_ms.append(dt)
                    cli_ms.append(dc)
    print(f"\n{RUNS} runs each, alternating, ms")
    print(f"{'':44} {'median':>8} {'p90':>8} {'p99':>8}")
    for name, xs in [("MCP tools/call execute_python print(1)", mcp_ms),
                     ("codebox run python -c 'print(1)'", cli_ms)]:
        print(f"{name:44} {statistics.median(xs):8.2f} {pct(xs, 0.9):8.2f} {pct(xs, 0.99):8.2f}")
    print(f"ratio MCP / CLI (medians): {statistics.median(mcp_ms) / statistics.median(cli_ms):.2f}")


anyio.run(main)
