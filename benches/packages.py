"""Packages on request: what a cached layer adds to a cold execution, and what a first
install costs, as a client sees it (the official Python SDK over stdio, one server).

    CODEBOX_ROOTFS=target/rootfs PYTHONPATH=target/mcp-pydeps /usr/bin/python3 \
        benches/packages.py target/release/codebox [RUNS]

Cases, alternating in one run (RUNS rounds, default 30):
- `cold`: `execute_python print(1)` on a server without a warm pool;
- `cold + layer`: the same with `packages: ["six==1.17.0"]`, its layer already cached
  (the run binds it at /packages; a run with packages never takes a pooled sandbox);
- `cold + layer + import`: importing the package from the layer.
Then the first install of a few sets not seen before (each a new key) and the same call
again. The goal is ≤ 2 ms for `cold + layer` over `cold`.
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

BINARY = sys.argv[1]
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 30


def median(xs):
    return round(statistics.median(xs), 2)


async def timed(s, args):
    t0 = time.perf_counter()
    r = await s.call_tool("execute_python", args)
    ms = (time.perf_counter() - t0) * 1000
    assert not r.is_error, r.content
    return ms, r.structured_content


async def main():
    d = tempfile.mkdtemp(prefix="codebox-packages-bench-")
    os.chmod(d, 0o755)
    env = {k: v for k, v in os.environ.items() if k.startswith(("CODEBOX_", "HOME", "PATH"))}
    env["CODEBOX_STATE_DIR"] = os.path.join(d, "state")
    params = StdioServerParameters(command=BINARY, args=["serve", "--pool-size", "0"], env=env)
    try:
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                cases = {
                    "cold": {"code": "print(1)"},
                    "cold + layer": {"code": "print(1)", "packages": ["six==1.17.0"]},
                    "cold + layer + import": {"code": "import six; print(1)", "packages": ["six==1.17.0"]},
                }
                for args in cases.values():
                    await timed(s, args)  # warm up; installs six once
                times = {k: [] for k in cases}
                for _ in range(RUNS):
                    for k, args in cases.items():
                        ms, _ = await timed(s, args)
                        times[k].append(ms)
                base = median(times["cold"])
                print(f"{'case':<24}{'median ms':>10}{'over cold':>11}")
                for k, xs in times.items():
                    print(f"{k:<24}{median(xs):>10}{median(xs) - base:>+11.2f}")
                print("\nfirst install vs the same call again (a new set each):")
                for pkgs in (["attrs==24.2.0"], ["MarkupSafe==3.0.2"], ["tomli==2.2.1", "idna==3.10"]):
                    first, sc = await timed(s, {"code": "print(1)", "packages": pkgs})
                    again, _ = await timed(s, {"code": "print(1)", "packages": pkgs})
                    print(f"  {' '.join(pkgs):<32} first {first:7.0f} ms, again {again:6.1f} ms "
                          f"({sc['packages']['layer_bytes'] // 1024} KiB)")
    finally:
        shutil.rmtree(d, ignore_errors=True)


anyio.run(main)
