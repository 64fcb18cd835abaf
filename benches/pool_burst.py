"""Bursts of back-to-back calls against one `codebox serve` over stdio, as the official
Python SDK sees them: which calls of each burst were served warm (W) or cold (c), and
their latencies.

    PYTHONPATH=target/mcp-pydeps /usr/bin/python3 benches/pool_burst.py \\
        BINARY [BURSTS] [CALLS] [PAUSE_S] [-- SERVE_ARGS...]

Per language (`execute_python print(1)`, then `execute_typescript console.log(1)`): waits
until `health` shows the pool settled (every sandbox it keeps idle), then runs BURSTS
(default 3) bursts of CALLS (default 20) calls, each call sent as soon as the previous
answered, PAUSE_S (default 5) seconds apart. Prints per burst the pattern, the warm count,
the median and the slowest call, and what `health` says of the pool after it (with more
than 10 bursts, e.g. lone calls with CALLS 1, only the summary of all calls). SERVE_ARGS
go to `codebox serve` (e.g. `--pool-size 2 --pool-max 8`); the environment's CODEBOX_*
apply too.
"""

import json
import os
import statistics
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "mcp"))
from helpers import server_env  # noqa: E402

CASES = [("python", "execute_python", "print(1)"), ("typescript", "execute_typescript", "console.log(1)")]


def args():
    argv = sys.argv[1:]
    serve = []
    if "--" in argv:
        i = argv.index("--")
        argv, serve = argv[:i], argv[i + 1:]
    binary = argv[0]
    bursts = int(argv[1]) if len(argv) > 1 else 3
    calls = int(argv[2]) if len(argv) > 2 else 20
    pause = float(argv[3]) if len(argv) > 3 else 5.0
    return binary, bursts, calls, pause, serve


async def health(s):
    r = await s.call_tool("health", {})
    if r.structured_content is not None:
        return r.structured_content
    return json.loads(r.content[0].text)


def pool_of(h, language):
    return h.get("pool", {}).get("languages", {}).get(language, {})


async def settled(s, language, timeout=120):
    """Waits until the pool keeps as many idle as its size and starts none."""
    deadline = time.monotonic() + timeout
    while True:
        p = pool_of(await health(s), language)
        if p.get("idle", 0) >= p.get("size", 0) and p.get("starting", 0) == 0:
            return p
        if time.monotonic() > deadline:
            raise SystemExit(f"the {language} pool never settled: {p}")
        await anyio.sleep(0.1)


def summary(p):
    keys = ["floor", "ceiling", "target", "size", "idle", "starting", "arrival_rate_per_s", "ready_ms",
            "handed_out", "missed", "shrunk", "memory_per_sandbox_bytes"]
    return ", ".join(f"{k} {p[k]}" for k in keys if k in p)


async def main():
    binary, bursts, calls, pause, serve = args()
    # Many bursts (e.g. lone calls: CALLS 1): only the summary.
    quiet = bursts > 10
    env = server_env()
    params = StdioServerParameters(command=binary, args=["serve", *serve], env=env)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for language, tool, code in CASES:
                print(f"{tool} {code!r}: {bursts} bursts of {calls} back-to-back calls, {pause} s apart")
                print(f"  settled: {summary(await settled(s, language))}")
                every, warm_all = [], 0
                for b in range(bursts):
                    pattern, times = "", []
                    for _ in range(calls):
                        start = time.perf_counter()
                        res = await s.call_tool(tool, {"code": code})
                        times.append((time.perf_counter() - start) * 1000)
                        assert not res.is_error, res
                        pattern += "W" if res.structured_content.get("start") == "warm" else "c"
                    every += times
                    warm_all += pattern.count("W")
                    if not quiet:
                        print(f"  burst {b + 1}: {pattern}  warm {pattern.count('W')}/{calls}, "
                              f"median {statistics.median(times):.2f} ms, max {max(times):.2f} ms")
                        print(f"    after: {summary(pool_of(await health(s), language))}")
                    await anyio.sleep(pause)
                print(f"  all {len(every)} calls: warm {warm_all}, median {statistics.median(every):.2f} ms, "
                      f"p90 {statistics.quantiles(every, n=10)[-1]:.2f} ms")
                print(f"  pool now: {summary(pool_of(await health(s), language))}")


anyio.run(main)
