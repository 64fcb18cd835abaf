"""Hostile programs against the tool proxy (fd 3), end to end through `codebox serve` and
the official Python MCP SDK: what one execution can make the server hold and record.

Usage: proxy_flood_client.py CODEBOX_BINARY [--measure [--seconds N]] [--case NAME]
Without --measure, runs every case with its assertions and prints "N passed, M failed".
With --measure, runs only the fd-3 flood (N seconds, default 3) that never reads its
answers and prints the
server's memory before and after (VmRSS, and the peak VmHWM, from /proc/<pid>/status);
it asserts nothing, so it can be pointed at any build (the figures in the report of
issue 14 came from it). --case runs only the cases whose name contains NAME.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import server_env

CODEBOX = sys.argv[1]
MEASURE = "--measure" in sys.argv[2:]
SECONDS = int(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 3
CASES = []
MIB = 1 << 20

# Writes requests on fd 3 for SECONDS s (or until the write blocks), never reads an answer.
FLOOD = r'''
import json, os, time
one = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/get",
                  "params": {"name": "nope__" + "x" * 200}}) + "\n"
chunk = (one * 256).encode()
sent = 0
deadline = time.time() + SECONDS
while time.time() < deadline:
    sent += os.write(3, chunk)
print("sent", sent)
'''


def case(fn):
    CASES.append(fn)
    return fn


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def server_pid():
    """The `codebox serve` this script started: our child running CODEBOX."""
    me = os.getpid()
    target = os.path.realpath(CODEBOX)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == me and os.path.realpath(f"/proc/{pid}/exe") == target:
                return int(pid)
        except OSError:
            pass
    raise RuntimeError("codebox serve not found among our children")


class Sampler:
    """Samples the server's VmRSS every 20 ms while running."""

    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, status_kib(self.pid, "VmRSS"))
            except (OSError, KeyError):
                return
            time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


async def run(s, code, **args):
    r = await s.call_tool("execute_python", {"code": code, **args})
    return r, r.structured_content or {}


def last_json_line(sc):
    lines = [l for l in sc["stdout"].splitlines() if l.startswith("{")]
    assert lines, sc
    return json.loads(lines[-1])


async def flood(s, pid):
    """The flood; returns (rss before, peak rss during, rss after, hwm after) in KiB."""
    before = status_kib(pid, "VmRSS")
    with Sampler(pid) as sampler:
        code = FLOOD.replace("SECONDS", str(SECONDS))
        r, sc = await run(s, code, timeout_ms=(SECONDS + 5) * 1000)
    after = status_kib(pid, "VmRSS")
    return r, sc, before, max(sampler.peak, after), after, status_kib(pid, "VmHWM")


@case
async def a_flood_that_never_reads_answers_does_not_grow_the_server(s, w):
    # Warm up allocator and pools first, so the figure is the flood's own.
    await run(s, "print(1)")
    r, sc, before, peak, after, _ = await flood(s, w.pid)
    grown = (peak - before) / 1024
    print(f"        flood: server VmRSS {before / 1024:.1f} -> peak {peak / 1024:.1f} MiB "
          f"(+{grown:.1f}), stdout {sc.get('stdout', '')[:40]!r}", flush=True)
    assert grown < 64, f"the server grew by {grown:.1f} MiB"
    # Backpressure: the sandbox's write blocked, so it ran into its timeout, and the
    # result says why.
    assert sc["timed_out"], sc
    assert "answers unread on fd 3" in sc.get("tool_channel_error", ""), sc
    # The server is fine and the next execution can use the channel.
    r, sc = await run(s, "import codebox\nprint(codebox.search_tools('x'))")
    assert not r.is_error and sc["stdout"] == "[]\n", sc


HUGE_NAMES = r'''
import json, codebox
name = "nope__" + "n" * (1 << 20)
codes = []
for _ in range(1100):
    try:
        codebox.call_tool(name)
    except codebox.ToolError as e:
        codes.append(e.code)
        last = str(e)
print(json.dumps({"codes": {str(c): codes.count(c) for c in set(codes)}, "last": last[:300]}))
'''


@case
async def one_mib_names_are_counted_clipped_and_not_all_recorded(s, w):
    r, sc = await run(s, HUGE_NAMES, timeout_ms=120000)
    out = last_json_line(sc)
    # 1000 answered (unknown tool), then the limit for every further request.
    assert out["codes"] == {"-32002": 1000, "-32004": 100}, out
    calls = sc["tool_calls"]
    assert len(calls) == 100, len(calls)
    for c in calls:
        assert len(c["name"]) < 400 and "…[truncated, 1048582 bytes]" in c["name"], c["name"][-60:]
        assert len(c["error"]) < 1200, len(c["error"])
    assert sc["tool_calls_dropped"] == {"count": 1000, "by_outcome": {"unknown_tool": 900, "limit": 100}}, sc["tool_calls_dropped"]
    size = len(json.dumps(sc))
    assert size < 256 * 1024, f"the result is {size} bytes"


TEN_THOUSAND = r'''
import json, codebox
codes = {}
for i in range(10000):
    try:
        codebox.call_tool("nope__t%d" % i)
    except codebox.ToolError as e:
        codes[str(e.code)] = codes.get(str(e.code), 0) + 1
print(json.dumps(codes))
'''


@case
async def ten_thousand_unknown_tools_are_limited_and_audited_within_bounds(s, w):
    r, sc = await run(s, TEN_THOUSAND, timeout_ms=120000)
    assert last_json_line(sc) == {"-32002": 1000, "-32004": 9000}, sc["stdout"][-300:]
    assert len(sc["tool_calls"]) == 100
    assert sc["tool_calls_dropped"]["count"] == 9900, sc["tool_calls_dropped"]
    assert sc["tool_calls_dropped"]["by_outcome"] == {"unknown_tool": 900, "limit": 9000}
    # The audit log holds at most 100 call lines for the execution, one summary line and
    # the execution's own record; the chain verifies.
    time.sleep(1)
    records = [json.loads(l) for l in open(w.audit)]
    omitted = [x for x in records if x["event"] == "tool_calls_omitted"]
    assert omitted and omitted[-1]["count"] == 9900, omitted
    assert omitted[-1]["by_outcome"] == {"unknown_tool": 900, "limit": 9000}, omitted[-1]
    execution = [x for x in records if x["event"] == "execution"][-1]
    assert execution["tools_called_omitted"] == 9900 and len(execution["tools_called"]) == 100
    size = os.path.getsize(w.audit)
    assert size < 2 * MIB, f"the audit log is {size} bytes"
    check = subprocess.run([CODEBOX, "audit", "verify", w.audit], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


SEARCH_GET = r'''
import json, codebox
codes = {}
ok = 0
for i in range(700):
    try:
        codebox.search_tools("anything %d" % i)
        ok += 1
    except codebox.ToolError as e:
        codes[str(e.code)] = codes.get(str(e.code), 0) + 1
for i in range(700):
    try:
        codebox.get_tool("nope__%d" % i)
    except codebox.ToolError as e:
        codes[str(e.code)] = codes.get(str(e.code), 0) + 1
print(json.dumps({"ok": ok, "codes": codes}))
'''


@case
async def searches_and_gets_count_against_the_same_limit(s, w):
    r, sc = await run(s, SEARCH_GET, timeout_ms=60000)
    out = last_json_line(sc)
    assert out == {"ok": 700, "codes": {"-32002": 300, "-32004": 400}}, out
    assert "tool_calls" not in sc, sc.get("tool_calls")


MIX = r'''
import json, os, codebox
junk = [
    {"jsonrpc": "2.0", "id": "j1", "method": "tools/" + "m" * 100000},
    {"jsonrpc": "2.0", "id": "x" * 1000, "method": "tools/get", "params": {"name": "a"}},
    {"jsonrpc": "2.0", "id": {"an": "object"}, "method": "tools/get"},
    {"jsonrpc": "2.0", "id": "j2", "method": 5},
    {"jsonrpc": "2.0", "method": "codebox/done", "params": {"status": "ok"}},
    {"jsonrpc": "2.0", "method": "notifications/" + "n" * 100000},
    [1, 2, 3],
    {"jsonrpc": "2.0", "id": "j3", "method": "tools/search", "params": {"query": "q" * 100000}},
]
for _ in range(50):
    for j in junk:
        os.write(3, (json.dumps(j) + "\n").encode())
    os.write(3, b"\n   \n")
# The module's own request skips the answers to the junk and gets its own.
print(json.dumps(codebox.search_tools("time")))
try:
    codebox.get_tool("nope__" + "g" * 5000)
except codebox.ToolError as e:
    print(json.dumps({"code": e.code, "len": len(str(e)), "msg": str(e)[-80:]}))
'''


@case
async def a_mix_of_junk_is_answered_briefly_and_the_channel_stays_usable(s, w):
    r, sc = await run(s, MIX, timeout_ms=30000)
    assert not r.is_error, sc
    lines = sc["stdout"].splitlines()
    assert lines[0] == "[]", lines
    err = json.loads(lines[1])
    assert err["code"] == -32002 and err["len"] < 600 and "truncated, 5006 bytes]" in err["msg"], err
    assert not sc.get("tool_channel_error"), sc


AMPLIFIED = r'''
import json, codebox
rows = [{"a": 0}] * 1000000
codes = []
for _ in range(4):
    try:
        codebox.call_tool("nope__x", {"rows": rows})
    except codebox.ToolError as e:
        codes.append(e.code)
        last = str(e)
print(json.dumps({"codes": codes, "last": last}))
'''


@case
async def params_that_parse_into_gigabytes_are_refused_before_parsing(s, w):
    # Each request is 8 MiB of text that would parse into about 700 MiB of values.
    before = status_kib(w.pid, "VmRSS")
    with Sampler(w.pid) as sampler:
        r, sc = await run(s, AMPLIFIED, timeout_ms=120000)
    grown = (sampler.peak - before) / 1024
    print(f"        amplified params: server VmRSS {before / 1024:.1f} -> peak "
          f"{sampler.peak / 1024:.1f} MiB (+{grown:.1f})", flush=True)
    out = last_json_line(sc)
    assert out["codes"] == [-32602] * 4 and "would take about" in out["last"], out
    assert grown < 128, f"the server grew by {grown:.1f} MiB"


PIPELINED_TS = r'''
import { searchTools } from "/opt/codebox/deno/client.ts";
// Synchronous writes of 1500 requests before any answer is read: the proxy keeps
// reading while the answers fit its queue, so this must not deadlock.
const rs = await Promise.allSettled(Array.from({ length: 1500 }, (_, i) => searchTools("q" + i)));
const codes: Record<string, number> = {};
let ok = 0;
for (const r of rs) {
  if (r.status === "fulfilled") ok++;
  else codes[String((r.reason as { code?: number }).code)] = (codes[String((r.reason as { code?: number }).code)] ?? 0) + 1;
}
console.log(JSON.stringify({ ok, codes }));
'''


@case
async def typescript_pipelining_many_requests_does_not_deadlock(s, w):
    r = await s.call_tool("execute_typescript", {"code": PIPELINED_TS, "timeout_ms": 60000})
    sc = r.structured_content or {}
    assert not r.is_error and not sc.get("timed_out"), sc
    assert last_json_line(sc) == {"ok": 1000, "codes": {"-32004": 500}}, sc["stdout"]


class World:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-flood-test-")
        self.audit = os.path.join(self.tmp.name, "audit", "audit.jsonl")
        self.config = os.path.join(self.tmp.name, "mcp.json")
        with open(self.config, "w") as f:
            json.dump({"mcpServers": {}}, f)
        self.pid = None

    def server(self):
        env = server_env()
        env.update({"CODEBOX_MCP_CONFIG": self.config, "CODEBOX_AUDIT_LOG": self.audit})
        return StdioServerParameters(command=CODEBOX, args=["serve"], env=env)


async def main():
    passed = failed = 0
    w = World()
    try:
        async with stdio_client(w.server()) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                w.pid = server_pid()
                if MEASURE:
                    await run(s, "print(1)")
                    r, sc, before, peak, after, hwm = await flood(s, w.pid)
                    print(json.dumps({
                        "rss_before_mib": round(before / 1024, 1),
                        "rss_peak_mib": round(peak / 1024, 1),
                        "rss_after_mib": round(after / 1024, 1),
                        "hwm_after_mib": round(hwm / 1024, 1),
                        "growth_mib": round((peak - before) / 1024, 1),
                        "timed_out": sc.get("timed_out"),
                        "stdout": sc.get("stdout", "")[:60],
                    }))
                    return 0
                only = sys.argv[sys.argv.index("--case") + 1] if "--case" in sys.argv else ""
                for fn in (c for c in CASES if only in c.__name__):
                    try:
                        with anyio.fail_after(300):
                            await fn(s, w)
                        print(f"ok      {fn.__name__}", flush=True)
                        passed += 1
                    except Exception as e:  # noqa: BLE001 - report every failure
                        print(f"FAILED  {fn.__name__}: {e!r}"[:2000], flush=True)
                        failed += 1
    finally:
        w.tmp.cleanup()
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
