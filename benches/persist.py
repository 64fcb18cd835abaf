"""Paused sessions, measured as an MCP client sees them (official Python SDK over stdio,
one `codebox serve` with a snapshot key): pause, resume, fork and the snapshot's bytes
against the workspace's size, medians of --rounds rounds. Namespace backend: a pause
saves the workspace (sealed: encrypted and authenticated), a resume restores it into a
new tmpfs (`state: "files"`: a new interpreter).

    PYTHONPATH=target/mcp-pydeps CODEBOX_ROOTFS=target/rootfs /usr/bin/python3 \\
        benches/persist.py --codebox target/release/codebox [--rounds 5] [--sizes-mib 0,1,16,64]

Per workspace size (one file of random bytes, which no compression shrinks, plus a small
one), each call timed from the SDK's `call_tool` to its return:
- pause_session of a live session (save, seal, free);
- resume_session of that paused session (restore, a new interpreter);
- the first execute_python on it after the resume;
- fork_session of a live session, and of a paused one;
- the snapshot's bytes on disk (`snapshot_bytes`) over the workspace's.
The floor (a `list_servers` call: what any codebox tool call costs this client) is
printed beside them. Results are checked; timings never are.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mcp"))
from helpers import server_env  # noqa: E402


async def timed(s, tool, args):
    t = time.perf_counter()
    r = await s.call_tool(tool, args)
    ms = (time.perf_counter() - t) * 1000
    if r.is_error:
        raise RuntimeError(f"{tool} failed: {''.join(getattr(c, 'text', '') for c in r.content)[:400]}")
    return ms, r.structured_content or {}


async def new_session(s, mib):
    code = (
        "import os\n"
        f"open('big.bin', 'wb').write(os.urandom({mib} << 20))\n"
        "open('notes.txt', 'w').write('kept')\n"
    )
    _, sc = await timed(s, "execute_python", {"code": code, "session": "new", "timeout_ms": 120000})
    assert sc.get("exit_code") == 0, sc
    return sc["session"]["id"]


async def close(s, sid):
    await s.call_tool("close_session", {"session": sid})


async def measure(s, mib, rounds):
    rows = {k: [] for k in ("pause", "resume", "first call", "fork live", "fork paused")}
    snap_bytes = []
    for _ in range(rounds):
        sid = await new_session(s, mib)
        ms, sc = await timed(s, "fork_session", {"session": sid})
        rows["fork live"].append(ms)
        forks = [sc["session"]]
        ms, sc = await timed(s, "pause_session", {"session": sid})
        assert sc["paused"] is True, sc
        rows["pause"].append(ms)
        snap_bytes.append(sc["snapshot_bytes"])
        ms, sc = await timed(s, "fork_session", {"session": sid})
        rows["fork paused"].append(ms)
        forks.append(sc["session"])
        ms, sc = await timed(s, "resume_session", {"session": sid})
        assert sc["resumed"] is True, sc
        rows["resume"].append(ms)
        ms, sc = await timed(s, "execute_python", {
            "code": "import os; print(open('notes.txt').read(), os.path.getsize('big.bin') >> 20)",
            "session": sid})
        assert sc["stdout"] == f"kept {mib}\n", sc
        rows["first call"].append(ms)
        for f in forks + [sid]:
            await close(s, f)
    return rows, statistics.median(snap_bytes)


async def main(args):
    tmp = tempfile.TemporaryDirectory(prefix="codebox-bench-persist-")
    os.chmod(tmp.name, 0o755)
    mcp = os.path.join(tmp.name, "mcp.json")
    with open(mcp, "w") as f:
        f.write('{"mcpServers": {}}')
    biggest = max(args.sizes_mib)
    env = server_env()
    env.update({
        "CODEBOX_STATE_DIR": os.path.join(tmp.name, "state"),
        "CODEBOX_POOL_SIZE": "0",
        "CODEBOX_SESSIONS_SNAPSHOT_KEY": "env:CODEBOX_BENCH_SNAPSHOT_KEY",
        "CODEBOX_BENCH_SNAPSHOT_KEY": os.urandom(32).hex(),
        "CODEBOX_SESSION_QUOTA": f"{biggest + 32}MiB",
    })
    params = StdioServerParameters(command=args.codebox, args=["serve", "--mcp-config", mcp], env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            floor = []
            for _ in range(20):
                ms, _ = await timed(s, "list_servers", {})
                floor.append(ms)
            results = [(mib, *await measure(s, mib, args.rounds)) for mib in args.sizes_mib]
    print(f"\ncodebox {args.codebox} serve, namespace backend; {args.rounds} rounds per size; "
          f"medians in ms (floor: list_servers {statistics.median(floor):.2f} ms)")
    cols = ("pause", "resume", "first call", "fork live", "fork paused")
    print(f"{'workspace':>10} " + " ".join(f"{c:>11}" for c in cols) + f" {'snapshot':>12}")
    for mib, rows, snap in results:
        print(f"{str(mib) + ' MiB':>10} " + " ".join(f"{statistics.median(rows[c]):11.1f}" for c in cols)
              + f" {snap / (1 << 20):9.2f} MiB")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--codebox", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes-mib", default="0,1,16,64",
                   type=lambda v: [int(x) for x in v.split(",")])
    a = p.parse_args()
    if a.rounds < 1 or any(m < 0 for m in a.sizes_mib):
        p.error("--rounds must be at least 1 and sizes not negative")
    return a


if __name__ == "__main__":
    anyio.run(main, parse())
