"""Per-client skills and the warm pool: how many executions a pooled sandbox serves and
their client-side latency, for a client without skills of its own (its runs bind the
shared set, as the pool's sandboxes do) and for one with a skill of its own (its runs bind
its own view and start cold); then the latency of `save_skill`, whose syntax check runs in
a sandbox. One stdio session to `codebox serve --pool-size 2` per case.

    CODEBOX_ROOTFS=target/rootfs PYTHONPATH=target/mcp-pydeps /usr/bin/python3 \
        benches/skills_pool.py target/release/codebox [RUNS]

Give an older binary as a second path to compare the first case with it:
`... skills_pool.py NEW OLD`.
"""

import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

RUNS = int(os.environ.get("RUNS", "40"))


def pct(xs, q):
    xs = sorted(xs)
    return round(xs[round((len(xs) - 1) * q)], 1)


async def session(binary, body):
    d = tempfile.mkdtemp(prefix="codebox-skills-bench-")
    try:
        os.chmod(d, 0o755)
        with open(os.path.join(d, "mcp.json"), "w") as f:
            f.write('{"mcpServers": {}}')
        env = {k: v for k, v in os.environ.items() if k.startswith(("CODEBOX_", "HOME", "PATH"))}
        env.update({"CODEBOX_SKILLS_DIR": os.path.join(d, "skills"),
                    "CODEBOX_MCP_CONFIG": os.path.join(d, "mcp.json")})
        params = StdioServerParameters(command=binary, args=["serve", "--pool-size", "2"], env=env)
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                await body(s)
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def executions(binary, own_skill):
    async def body(s):
        if own_skill:
            res = await s.call_tool("save_skill", {"name": "mine", "description": "d",
                                                   "language": "python", "code": "X = 1\n"})
            assert not res.is_error, res
        await anyio.sleep(2)  # the pool fills
        lat, warm = [], 0
        for _ in range(RUNS):
            t = time.perf_counter()
            res = await s.call_tool("execute_python", {"code": "print(1)"})
            lat.append((time.perf_counter() - t) * 1000)
            sc = res.structured_content or {}
            assert sc.get("stdout") == "1\n", sc
            warm += sc.get("start") == "warm"
            await anyio.sleep(0.15)  # let the pool refill, as between a model's calls
        print(json.dumps({"binary": binary, "own_skill": own_skill, "runs": RUNS, "warm": warm,
                          "p50_ms": pct(lat, 0.5), "p90_ms": pct(lat, 0.9)}), flush=True)
    await session(binary, body)


async def saves(binary):
    async def body(s):
        await anyio.sleep(2)
        for lang, code in [("python", "def f(x):\n    return x\n"),
                           ("typescript", "export const f = (x: number) => x;\n")]:
            lat = []
            for i in range(10):
                t = time.perf_counter()
                res = await s.call_tool("save_skill", {"name": f"s{i}", "description": "d",
                                                       "language": lang, "code": code})
                lat.append((time.perf_counter() - t) * 1000)
                assert not res.is_error, res
                await anyio.sleep(0.3)
            print(json.dumps({"save_skill": lang, "saves": 10, "p50_ms": pct(lat, 0.5),
                              "p90_ms": pct(lat, 0.9)}), flush=True)
    await session(binary, body)


async def main(binaries):
    new = binaries[0]
    for _ in range(2):
        for b in binaries:
            await executions(b, False)
        await executions(new, True)
    await saves(new)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
