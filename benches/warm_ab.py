"""Two builds side by side: a warm `print(1)` / `console.log(1)` as the official Python
SDK sees it, from two `codebox serve` processes (say the build before a change and the
one after), calls alternating in one run.

    PYTHONPATH=target/mcp-pydeps /usr/bin/python3 benches/warm_ab.py \\
        OLD_BINARY:OLD_ROOTFS NEW_BINARY:NEW_ROOTFS [ROUNDS]

Prints per language the medians of ROUNDS calls (default 30, after 5 warm-up rounds)
and their ratio. Each server has a pool of 2 per language; a pause after every call lets
the pool refill (a pooled Python interpreter preloads the data set, about a second of
CPU), so every measured call is warm.
"""

import os
import statistics
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "mcp"))
from helpers import server_env  # noqa: E402

CASES = [("execute_python", "print(1)"), ("execute_typescript", "console.log(1)")]
WARM_UP = 5


def params(binary, rootfs):
    env = server_env()
    env["CODEBOX_ROOTFS"] = rootfs
    env["CODEBOX_POOL_SIZE"] = "2"
    return StdioServerParameters(command=binary, args=["serve"], env=env)


async def main():
    (old_bin, old_root), (new_bin, new_root) = [a.split(":", 1) for a in sys.argv[1:3]]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    async with stdio_client(params(old_bin, old_root)) as (r1, w1), \
            stdio_client(params(new_bin, new_root)) as (r2, w2):
        async with ClientSession(r1, w1) as old, ClientSession(r2, w2) as new:
            await old.initialize()
            await new.initialize()
            for tool, code in CASES:
                times = {"old": [], "new": []}
                for i in range(rounds + WARM_UP):
                    order = (("old", old), ("new", new)) if i % 2 else (("new", new), ("old", old))
                    for name, s in order:
                        start = time.perf_counter()
                        r = await s.call_tool(tool, {"code": code})
                        elapsed = (time.perf_counter() - start) * 1000
                        assert not r.is_error, r
                        if i >= WARM_UP:
                            times[name].append(elapsed)
                        await anyio.sleep(1.2)
                before, after = statistics.median(times["old"]), statistics.median(times["new"])
                print(f"{tool} {code!r}: before {before:.2f} ms, after {after:.2f} ms, "
                      f"ratio {after / before:.2f} (medians of {rounds})")


if __name__ == "__main__":
    anyio.run(main)
