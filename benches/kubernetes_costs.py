"""What one codebox replica costs: the warm pool per sandbox (health), executions' peak
memory (their results), and the supervisor's RSS idle and under load. Run by
benches/kubernetes_pod.sh against `codebox serve --http` in pod-like conditions; the
figures are in docs/src/operations/kubernetes-deployment.md ("Resources").

usage: kubernetes_costs.py URL TOKEN SERVE_PID   (with the official Python MCP SDK)
"""
import os
import sys

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

url, token, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])

def tree_rss(root):
    """RSS (KiB) of root and its descendants that run the codebox binary: the server, the
    spawner factory, the spawner, the keeper, and each sandbox's init before it execs."""
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                st = open(f"/proc/{p}/stat").read()
                ppid = int(st.rsplit(")", 1)[1].split()[1])
                kids.setdefault(ppid, []).append(int(p))
            except OSError:
                pass
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        try:
            exe = os.readlink(f"/proc/{p}/exe")
            rss = [int(l.split()[1]) for l in open(f"/proc/{p}/status") if l.startswith("VmRSS")]
        except OSError:
            continue
        if os.path.basename(exe).startswith("codebox"):
            out[p] = rss[0] if rss else 0
        todo += kids.get(p, [])
    return out

WORK = {
    "print(1)": "print(1)",
    "json 1e5 items": "import json; d=[{'i':i,'s':str(i)} for i in range(100000)]; print(len(json.dumps(d)))",
    "pandas 1e6 rows": "import pandas as pd, numpy as np; df=pd.DataFrame({'a':np.arange(1_000_000),'b':np.random.rand(1_000_000)}); print(df.groupby(df.a % 10).b.mean().shape)",
}
TS = {"console.log(1)": "console.log(1)",
      "ts 1e5 objects": "const a=[]; for (let i=0;i<100000;i++) a.push({i, s:String(i)}); console.log(JSON.stringify(a).length)"}

async def main():
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    async with streamable_http_client(url, http_client=http) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for _ in range(50):
                h = (await s.call_tool("health", {})).structured_content
                if h.get("ready"):
                    break
                await anyio.sleep(0.2)
            await anyio.sleep(2)
            h = (await s.call_tool("health", {})).structured_content
            for lang, p in h["pool"]["languages"].items():
                print(f"warm pool {lang}: {p['idle']} idle, {p['memory_per_sandbox_bytes'] / 2**20:.1f} MiB each")
            rss = tree_rss(pid); print("idle supervisor RSS KiB:", rss, "sum", sum(rss.values()))
            for lang, work in (("execute_python", WORK), ("execute_typescript", TS)):
                for name, code in work.items():
                    peaks = []
                    for _ in range(3):
                        res = (await s.call_tool(lang, {"code": code})).structured_content
                        peaks.append(res.get("peak_memory_bytes") or res.get("usage", {}).get("peak_memory_bytes"))
                    print(f"{lang} {name}: peak {[round(p / 2**20, 1) if p else p for p in peaks]} MiB")
            # 4 at once, pandas, while sampling the supervisor's RSS
            peak = [0]
            async def sample():
                for _ in range(200):
                    peak[0] = max(peak[0], sum(tree_rss(pid).values()))
                    await anyio.sleep(0.05)
            async with anyio.create_task_group() as tg:
                tg.start_soon(sample)
                for _ in range(4):
                    tg.start_soon(s.call_tool, "execute_python", {"code": WORK["pandas 1e6 rows"]})
            print("supervisor RSS peak under 4 concurrent pandas runs (KiB):", peak[0])
            rss = tree_rss(pid); print("after: supervisor RSS KiB sum", sum(rss.values()))

anyio.run(main)
