"""Warm (or, with POOL=0, cold) `execute_python` of one build with the Python zygote on and
off, side by side: two `codebox serve` processes (CODEBOX_ZYGOTE=0 and 1), calls alternating
in one run, each after a `list_servers` call whose median is subtracted as the floor.

    CODEBOX_ROOTFS=target/rootfs PYTHONPATH=target/mcp-pydeps /usr/bin/python3 \\
        benches/zygote_ab.py target/release/codebox [ROUNDS] [CODE]

POOL (environment, default 2) sets the pool size; a pause after every call lets it refill.
Prints per server the median, the floor and what the call adds, and the starts seen.
"""
import sys, time, anyio, os, statistics
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
def params(binary, zygote):
    env = dict(os.environ); env["CODEBOX_POOL_SIZE"] = os.environ.get("POOL", "2"); env["CODEBOX_ZYGOTE"] = zygote
    return StdioServerParameters(command=binary, args=["serve"], env=env)
async def main():
    binary = sys.argv[1]; rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    code = sys.argv[3] if len(sys.argv) > 3 else "print(1)"
    async with stdio_client(params(binary, "0")) as (r1, w1), stdio_client(params(binary, "1")) as (r2, w2):
        async with ClientSession(r1, w1) as fresh, ClientSession(r2, w2) as zyg:
            await fresh.initialize(); await zyg.initialize()
            await anyio.sleep(8)
            t = {"fresh": [], "zygote": [], "floor_f": [], "floor_z": []}
            kinds = {"fresh": [], "zygote": []}
            for i in range(rounds + 3):
                for name, s in ((("fresh", fresh), ("zygote", zyg)) if i % 2 else (("zygote", zyg), ("fresh", fresh))):
                    st = time.perf_counter(); await s.call_tool("list_servers", {}); fl = (time.perf_counter() - st) * 1000
                    st = time.perf_counter(); r = await s.call_tool("execute_python", {"code": code}); el = (time.perf_counter() - st) * 1000
                    sc = r.structured_content
                    if i >= 3:
                        t[name].append(el); t["floor_" + name[0]].append(fl); kinds[name].append((sc.get("start"), sc.get("zygote", False)))
                    await anyio.sleep(1.5)
            for name in ("fresh", "zygote"):
                f = statistics.median(t["floor_" + name[0]])
                print(f"{name}: median {statistics.median(t[name]):.2f} ms, floor {f:.2f}, over floor {statistics.median(t[name]) - f:.2f}; starts {sorted(set(map(str, kinds[name])))}")
anyio.run(main)
