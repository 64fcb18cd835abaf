"""Start-up as clients see it: from exec of `codebox serve` to its `initialize` answer,
with no upstream servers, with five real ones, and with the five plus one that hangs in
`initialize` — side by side in one run, rounds alternating.

    CODEBOX_ROOTFS=target/rootfs PYTHONPATH=target/mcp-pydeps /usr/bin/python3 \\
        benches/startup.py target/release/codebox [ROUNDS]

The five upstreams are those `cargo xtask test` installs in target/upstreams:
server-filesystem, server-memory, server-everything (Node), mcp-server-time and
mcp-server-git (Python). Per configuration it prints the medians of ROUNDS (default 10):
- `raw`: exec → the `initialize` response, read by a bare JSON-RPC client;
- `sdk`: the official Python SDK's `stdio_client` + `initialize`, minus the SDK's own floor
  (the same against tests/upstream/hostile_server.py, a trivial stdio MCP server);
- `all ready`: exec → `list_servers` shows every upstream that can be ready as ready.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "mcp"))
from helpers import server_env  # noqa: E402

UPSTREAMS = os.path.join(ROOT, "target", "upstreams")
NODE = os.path.join(UPSTREAMS, "node/node_modules/@modelcontextprotocol")
HOSTILE = os.path.join(ROOT, "tests", "upstream", "hostile_server.py")
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}


def five(data):
    node = lambda pkg, *a: {"command": "node", "args": [os.path.join(NODE, pkg, "dist/index.js"), *a]}  # noqa: E731
    return {
        "filesystem": node("server-filesystem", data),
        "memory": {**node("server-memory"), "env": {"MEMORY_FILE_PATH": os.path.join(data, "memory.jsonl")}},
        "everything": node("server-everything", "stdio"),
        "time": {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                 "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python")}},
        "git": {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_git", "--repository", ROOT],
                "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python-git")}},
    }


def configs(tmp):
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    hang = {"command": "/usr/bin/python3", "args": [HOSTILE], "env": {"HOSTILE_HANG": "1"}}
    out = {}
    for name, servers in [("no upstreams", {}), ("five upstreams", five(data)),
                          ("five + one hanging", {**five(data), "hang": hang})]:
        path = os.path.join(tmp, name.replace(" ", "-") + ".json")
        with open(path, "w") as f:
            json.dump({"mcpServers": servers}, f)
        out[name] = (path, len(servers) - (1 if "hang" in servers else 0))
    return out


def env_for(config):
    env = server_env()
    env["CODEBOX_MCP_CONFIG"] = config
    env["CODEBOX_POOL_SIZE"] = "1"
    return env


def raw_round(binary, config, expected_ready):
    """exec → initialize answer, then → every upstream ready (seconds)."""
    started = time.monotonic()
    p = subprocess.Popen([binary, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env_for(config))
    try:
        p.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
        p.stdin.flush()
        json.loads(p.stdout.readline())
        initialized = time.monotonic() - started
        p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        ready = None
        for i in range(2, 100_000):
            call = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "list_servers", "arguments": {}}}
            p.stdin.write(json.dumps(call).encode() + b"\n")
            p.stdin.flush()
            while True:
                msg = json.loads(p.stdout.readline())
                if msg.get("id") == i:
                    break
            servers = msg["result"]["structuredContent"]["servers"]
            if sum(s["status"] == "ready" for s in servers) >= expected_ready:
                ready = time.monotonic() - started
                break
            if time.monotonic() - started > 60:
                break
            time.sleep(0.02)
        return initialized, ready
    finally:
        p.stdin.close()
        p.wait(timeout=30)


async def sdk_round(command, args, env):
    started = time.monotonic()
    params = StdioServerParameters(command=command, args=args, env=env)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            return time.monotonic() - started


def main():
    binary = os.path.abspath(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    with tempfile.TemporaryDirectory(prefix="codebox-startup-bench-") as tmp:
        cases = configs(tmp)
        raw = {n: [] for n in cases}
        ready = {n: [] for n in cases}
        sdk = {n: [] for n in cases}
        floor = []
        for _ in range(rounds):
            for name, (config, expected) in cases.items():
                r, all_ready = raw_round(binary, config, expected)
                raw[name].append(r)
                if all_ready is not None:
                    ready[name].append(all_ready)
                sdk[name].append(anyio.run(sdk_round, binary, ["serve"], env_for(config)))
            floor.append(anyio.run(sdk_round, "/usr/bin/python3", [HOSTILE], server_env()))
        ms = lambda xs: statistics.median(xs) * 1000  # noqa: E731
        print(f"codebox serve start-up, medians of {rounds} rounds ({binary})")
        print(f"SDK floor (stdio_client + initialize against a trivial server): {ms(floor):.0f} ms")
        for name in cases:
            line = f"{name:20}  raw {ms(raw[name]):6.0f} ms   sdk {ms(sdk[name]) - ms(floor):6.0f} ms"
            if ready[name]:
                line += f"   all ready {ms(ready[name]):6.0f} ms"
            print(line)


if __name__ == "__main__":
    main()
