"""Sandboxed code calling real upstream MCP servers through codebox, driven by the official
Python MCP SDK as the model's client.

Usage: upstream_client.py CODEBOX_BINARY UPSTREAMS_DIR
UPSTREAMS_DIR holds node/node_modules/@modelcontextprotocol/server-{filesystem,memory,
everything} and python/ (mcp-server-time), as `cargo xtask test` installs them. The test
writes a .mcp.json in Claude Code's format with four stdio upstreams and one streamable
HTTP upstream (server-everything on an ephemeral port), starts `codebox serve` with it,
and checks what the issue asks. Prints one line per case and "N passed, M failed".
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError as McpError

from helpers import backend, on_backend, server_env

CODEBOX = sys.argv[1]
UPSTREAMS = os.path.abspath(sys.argv[2])
NODE_MODULES = os.path.join(UPSTREAMS, "node/node_modules/@modelcontextprotocol")
HOSTILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "upstream", "hostile_server.py")
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class World:
    """The data directory, the .mcp.json, and the HTTP upstream."""

    @staticmethod
    def start_http():
        """server-everything over streamable HTTP on a free port: (port, process). A start
        that dies (the port taken between our probe and its bind) is tried again on
        another port; one that never listens is reported with what it printed."""
        for attempt in range(3):
            port = free_port()
            log = tempfile.TemporaryFile()
            proc = subprocess.Popen(
                ["node", os.path.join(NODE_MODULES, "server-everything/dist/index.js"), "streamableHttp"],
                env={**os.environ, "PORT": str(port)},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            # A bound on a fixture's start on a loaded 2-core machine, not a measurement.
            deadline = time.monotonic() + 90
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return port, proc
                except OSError:
                    time.sleep(0.1)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.seek(0)
            said = log.read()[-2000:].decode(errors="replace")
            print(f"server-everything (HTTP) on port {port} did not start (attempt {attempt + 1}, "
                  f"exit {proc.returncode}): {said}", file=sys.stderr, flush=True)
        raise AssertionError("server-everything (HTTP) did not start: see stderr")

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-upstream-test-")
        root = self.tmp.name
        os.chmod(root, 0o755)
        self.data = os.path.join(root, "data")
        os.makedirs(os.path.join(self.data, "notes"))
        for i in range(6):
            kind = "todo" if i % 2 == 0 else "done"
            with open(os.path.join(self.data, "notes", f"note{i}.txt"), "w") as f:
                f.write(f"{kind}: item {i}\n")
        with open(os.path.join(self.data, "big.txt"), "w") as f:
            f.write(("x" * 99 + "\n") * 100_000)  # 10 MB, 100000 lines
        self.memory_file = os.path.join(root, "memory.jsonl")
        self.http_port, self.http = self.start_http()
        node = lambda pkg: os.path.join(NODE_MODULES, pkg, "dist/index.js")  # noqa: E731
        self.config = os.path.join(root, "mcp.json")
        with open(self.config, "w") as f:
            json.dump({"mcpServers": {
                "filesystem": {"command": "node", "args": [node("server-filesystem"), "${DATA_DIR}"]},
                "memory": {"command": "node", "args": [node("server-memory")],
                           "env": {"MEMORY_FILE_PATH": self.memory_file}},
                "everything": {"command": "node", "args": [node("server-everything"), "stdio"]},
                "time": {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                         "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python")}},
                "web": {"type": "http", "url": "http://127.0.0.1:${EVERYTHING_PORT}/mcp"},
                # Raw JSON-RPC, answers of any size (and bad ones on request).
                "hostile": {"command": "/usr/bin/python3", "args": [HOSTILE]},
            }}, f)

    def server(self, *extra):
        env = server_env()
        env.update({"CODEBOX_MCP_CONFIG": self.config, "DATA_DIR": self.data,
                    "EVERYTHING_PORT": str(self.http_port)})
        on_backend(env)
        return StdioServerParameters(command=CODEBOX, args=["serve", *extra], env=env)

    def close(self):
        try:
            os.killpg(self.http.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.http.wait(timeout=10)
        self.tmp.cleanup()


async def run(s, language, code, **args):
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    return r, r.structured_content or {}


def ok(r, sc):
    assert not r.is_error, sc.get("stderr") or r.content


@case
async def list_servers_shows_every_upstream_ready(s, w):
    deadline = time.monotonic() + 60
    while True:
        r = await s.call_tool("list_servers", {})
        servers = {x["name"]: x for x in r.structured_content["servers"]}
        if all(x["status"] == "ready" for x in servers.values()) and len(servers) == 6:
            break
        assert time.monotonic() < deadline, servers
        await anyio.sleep(0.5)
    assert servers["filesystem"]["tool_count"] >= 10, servers
    assert servers["web"]["tool_count"] == servers["everything"]["tool_count"], servers
    # The streamable-HTTP upstream answers calls like the stdio ones.
    r, sc = await run(s, "python", "from servers.web import echo, get_sum\nprint(echo(message='over http'), get_sum(a=1, b=2))")
    ok(r, sc)
    assert "over http" in sc["stdout"] and "3" in sc["stdout"], sc


@case
async def python_chains_filesystem_and_memory(s, w):
    code = f"""
import codebox
from servers.filesystem import list_directory, read_text_file
from servers.memory import create_entities, read_graph

listing = list_directory(path={w.data + '/notes'!r})["content"]
names = [l.split(' ', 1)[1] for l in listing.splitlines() if l.startswith('[FILE]')]
todo = [n for n in names if read_text_file(path={w.data + '/notes/'!r} + n)["content"].startswith('todo')]
create_entities(entities=[{{"name": "py-summary", "entityType": "summary",
                            "observations": [f"{{len(todo)}} of {{len(names)}} notes are todo"]}}])
graph = read_graph()
print(sorted(todo))
print([e["observations"] for e in graph["entities"] if e["name"] == "py-summary"])
"""
    r, sc = await run(s, "python", code)
    ok(r, sc)
    assert sc["stdout"] == "['note0.txt', 'note2.txt', 'note4.txt']\n[['3 of 6 notes are todo']]\n", sc
    names = [c["name"] for c in sc["tool_calls"]]
    assert names[0] == "filesystem__list_directory" and names[-1] == "memory__read_graph", names
    assert all(c["ok"] for c in sc["tool_calls"]), sc["tool_calls"]
    assert len(names) == 1 + 6 + 2, names


@case
async def typescript_chains_three_tools_from_two_servers(s, w):
    code = f"""
import {{ listDirectory, readTextFile }} from "/servers/filesystem/index.ts";
import {{ createEntities }} from "/servers/memory/index.ts";

const listing = await listDirectory({{ path: {json.dumps(w.data + '/notes')} }});
const names = listing.content.split("\\n").filter((l) => l.startsWith("[FILE]")).map((l) => l.slice(7));
const texts = await Promise.all(names.map((n) => readTextFile({{ path: {json.dumps(w.data + '/notes/')} + n }})));
const done = names.filter((_, i) => texts[i].content.startsWith("done"));
await createEntities({{ entities: [{{ name: "ts-summary", entityType: "summary", observations: done }}] }});
console.log(done.join(","));
"""
    r, sc = await run(s, "typescript", code)
    ok(r, sc)
    assert sc["stdout"] == "note1.txt,note3.txt,note5.txt\n", sc
    r, sc = await run(s, "python", "from servers.memory import open_nodes\n"
                      "print(open_nodes(names=['ts-summary'])['entities'][0]['observations'])")
    ok(r, sc)
    assert sc["stdout"] == "['note1.txt', 'note3.txt', 'note5.txt']\n", sc


@case
async def ten_megabytes_stay_in_the_sandbox(s, w):
    for language, code in [
        ("python", f"import codebox\nt = codebox.call_tool('filesystem__read_text_file', {{'path': {w.data + '/big.txt'!r}}})['content']\nprint(len(t), t.count('\\n'))"),
        ("typescript", f"import {{ callMCPTool }} from '/servers/client.ts';\nconst t = (await callMCPTool<{{ content: string }}>('filesystem__read_text_file', {{ path: {json.dumps(w.data + '/big.txt')} }})).content;\nconsole.log(t.length, t.split('\\n').length - 1);"),
    ]:
        r, sc = await run(s, language, code)
        ok(r, sc)
        assert sc["stdout"] == "10000000 100000\n", sc
        call = sc["tool_calls"][0]
        assert call["ok"] and call["bytes_out"] >= 10_000_000, call
        whole = json.dumps(r.model_dump(mode="json"))
        assert len(whole) < 10_000, f"the model's result is {len(whole)} bytes"


@case
async def nested_and_typed_arguments_from_the_schema(s, w):
    code = """
import inspect
from servers.everything import get_structured_content, get_sum, trigger_long_running_operation
from servers.memory import create_entities
print(inspect.signature(get_sum))
print(inspect.signature(create_entities))
print(get_sum(a=2, b=40))
print(get_structured_content(location="Chicago")["conditions"] != "")
create_entities(entities=[{"name": "nested", "entityType": "t", "observations": ["a", "b"]}])
"""
    r, sc = await run(s, "python", code)
    ok(r, sc)
    lines = sc["stdout"].splitlines()
    assert lines[0].startswith("(a: 'float', b: 'float')") or lines[0].startswith("(a: float, b: float)"), lines
    assert "entities: 'list[" in lines[1] or "entities: list[" in lines[1], lines
    assert "42" in lines[2] and lines[3] == "True", lines


@case
async def generated_typescript_type_checks_in_the_sandbox(s, w):
    code = """
const files = [];
for (const server of Deno.readDirSync("/servers")) {
  if (server.isDirectory && server.name !== "__pycache__") files.push(`/servers/${server.name}/index.ts`);
}
const out = await new Deno.Command("deno", { args: ["check", "--quiet", ...files], stderr: "piped", stdout: "piped" }).output();
console.log(files.length, out.code);
console.error(new TextDecoder().decode(out.stderr));
"""
    r, sc = await run(s, "typescript", code, timeout_ms=120000)
    ok(r, sc)
    assert sc["stdout"] == "6 0\n", sc


@case
async def a_tool_outside_the_allowlist_is_denied_and_never_sent(s, w):
    code = """
import codebox
try:
    codebox.call_tool("memory__create_entities", {"entities": [{"name": "forbidden", "entityType": "t", "observations": []}]})
except codebox.ToolError as e:
    print("denied:", e.code, "allowed_tools" in str(e))
print(codebox.call_tool("time__get_current_time", {"timezone": "UTC"})["timezone"])
print([t["name"] for t in codebox.search_tools("entities")])
"""
    r, sc = await run(s, "python", code, allowed_tools=["time__*"])
    ok(r, sc)
    assert sc["stdout"] == "denied: -32001 True\nUTC\n[]\n", sc
    denied = sc["tool_calls"][0]
    assert not denied["ok"] and "allowed_tools" in denied["error"], denied
    r, sc = await run(s, "python", "import codebox\nprint([e['name'] for e in codebox.call_tool('memory__read_graph', {})['entities']])")
    ok(r, sc)
    assert "forbidden" not in sc["stdout"], sc
    r, sc = await run(s, "typescript", "import { callMCPTool } from '/servers/client.ts';\n"
                      "try { await callMCPTool('time__get_current_time', { timezone: 'UTC' }); } catch (e) { console.log(e.name, e.code); }",
                      allowed_tools=[])
    ok(r, sc)
    assert sc["stdout"] == "ToolError -32001\n", sc
    bad = await s.call_tool("execute_python", {"code": "1", "allowed_tools": ["no spaces"]})
    assert bad.is_error and "allowed_tools pattern" in bad.content[0].text, bad


@case
async def tool_errors_raise_with_the_upstream_message(s, w):
    r, sc = await run(s, "python", "import codebox\ntry:\n    codebox.call_tool('filesystem__read_text_file', {'path': '/etc/shadow'})\n"
                      "except codebox.ToolError as e:\n    print('ToolError', 'denied' in str(e).lower() or 'outside' in str(e).lower())")
    ok(r, sc)
    assert sc["stdout"] == "ToolError True\n", sc


@case
async def search_tools_ranks_filters_and_pages(s, w):
    r = await s.call_tool("search_tools", {"query": "read a file"})
    assert not r.is_error, r
    tools = r.structured_content["tools"]
    assert tools[0]["name"].startswith("filesystem__read"), [t["name"] for t in tools]
    assert set(tools[0]) == {"name", "server", "description", "typescript", "python"}, tools[0]
    r = await s.call_tool("search_tools", {"query": "read", "server": "memory", "detail": "name"})
    names = [t["name"] for t in r.structured_content["tools"]]
    assert names and all(n.startswith("memory__") for n in names), names
    assert all(set(t) == {"name"} for t in r.structured_content["tools"])
    r = await s.call_tool("search_tools", {"query": "current time", "detail": "full", "limit": 1})
    full = r.structured_content["tools"][0]
    assert full["name"] == "time__get_current_time", full
    assert {"input_schema", "typescript", "python"} <= set(full), set(full)
    # Pagination walks every tool once.
    seen, cursor = [], None
    while True:
        args = {"query": "", "detail": "name", "limit": 7}
        if cursor:
            args["cursor"] = cursor
        page = (await s.call_tool("search_tools", args)).structured_content
        seen += [t["name"] for t in page["tools"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert len(seen) == len(set(seen)) == page["total"] >= 38 + 13, (len(seen), page["total"])
    for bad, why in [({"query": "x", "cursor": "garbage"}, "cursor"), ({"query": "x", "server": "nope"}, "unknown server"),
                     ({"query": "x", "detail": "all"}, "detail"), ({"query": "x", "limit": 0}, "limit")]:
        r = await s.call_tool("search_tools", bad)
        assert r.is_error and why in r.content[0].text, (bad, r.content)


@case
async def get_tool_gives_signatures_and_an_example(s, w):
    r = await s.call_tool("get_tool", {"name": "filesystem__read_text_file"})
    assert not r.is_error, r
    t = r.structured_content
    assert "readTextFile" in t["typescript"] and "def read_text_file" in t["python"], t
    assert "from servers.filesystem import read_text_file" in t["example"]["python"], t["example"]
    r = await s.call_tool("get_tool", {"name": "filesystem__no_such_tool"})
    assert r.is_error and "search_tools" in r.content[0].text, r


@case
async def search_from_inside_python_and_typescript(s, w):
    r, sc = await run(s, "python", "import codebox\n"
                      "print(codebox.search_tools('create entities in the knowledge graph', detail='name')[0]['name'])\n"
                      "print(codebox.get_tool('time__convert_time')['name'])")
    ok(r, sc)
    assert sc["stdout"] == "memory__create_entities\ntime__convert_time\n", sc
    r, sc = await run(s, "typescript", "import { searchTools, searchToolsPage } from '/servers/client.ts';\n"
                      "const [first] = await searchTools('read a file', { detail: 'name' }) as { name: string }[];\n"
                      "const page = await searchToolsPage('', { server: 'time', detail: 'name' });\n"
                      "console.log(first.name.startsWith('filesystem__read'), page.total);")
    ok(r, sc)
    assert sc["stdout"] == "true 2\n", sc


@case
async def wrappers_are_browsable_as_resources(s, w):
    resources = (await s.list_resources()).resources
    uris = {str(r.uri) for r in resources}
    assert "codebox://servers/filesystem/index.ts" in uris and "codebox://servers/client.ts" in uris, sorted(uris)[:5]
    text = (await s.read_resource("codebox://servers/time/index.ts")).contents[0].text
    assert "getCurrentTime" in text, text[:200]
    try:
        await s.read_resource("codebox://servers/../../etc/passwd")
    except McpError as e:
        assert "unknown resource" in str(e), e
    else:
        raise AssertionError("a path outside the wrappers was read")


@case
async def python_threads_and_asyncio_gather_call_tools_at_once(s, w):
    # Three 1-second tool calls: from threads, then through asyncio.gather over the
    # generated wrappers' coroutine forms. Serialised they would take 3 s each way.
    code = """
import asyncio, threading, time
from servers.everything import trigger_long_running_operation as op, aio
t = time.monotonic()
results = []
threads = [threading.Thread(target=lambda: results.append(op(duration=1, steps=1))) for _ in range(3)]
for th in threads: th.start()
for th in threads: th.join()
in_threads = time.monotonic() - t
async def fan_out():
    t = time.monotonic()
    got = await asyncio.gather(*(aio.trigger_long_running_operation(duration=1, steps=1) for _ in range(3)))
    return time.monotonic() - t, got
gathered, got = asyncio.run(fan_out())
print(len(results), len(got), "completed" in str(got[0]))
print(round(in_threads, 2), round(gathered, 2))
"""
    r, sc = await run(s, "python", code, timeout_ms=30000)
    ok(r, sc)
    counts, times = sc["stdout"].splitlines()
    assert counts == "3 3 True", sc["stdout"]
    in_threads, gathered = (float(x) for x in times.split())
    print(f"        three 1-second calls: threads {in_threads} s, asyncio.gather {gathered} s")
    assert in_threads < 2.5 and gathered < 2.5, "the calls ran one after another: " + times


def process_tree():
    """{parent pid: [(pid, command line with spaces)]} of every process on the host."""
    children = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").replace("\0", " ")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append((int(pid), cmd))
    return children


def upstream_pid(serve_pid, marker):
    """The pid of the upstream whose command line has `marker`, below `serve_pid`."""
    children = process_tree()
    todo = [serve_pid]
    while todo:
        for pid, cmd in children.get(todo.pop(), []):
            if marker in cmd:
                return pid
            todo.append(pid)
    return None


@case
async def a_call_in_flight_when_its_upstream_dies_fails_clearly_then_reconnects(s, w):
    serve_pid = w.serve_pid
    code = """
import codebox, time
try:
    codebox.call_tool("everything__trigger_long_running_operation", {"duration": 20, "steps": 2})
    print("returned")
except codebox.ToolError as e:
    print("ToolError:", e)
"""
    async def kill_soon():
        await anyio.sleep(2)
        pid = upstream_pid(serve_pid, "server-everything/dist/index.js stdio")
        assert pid, "the everything upstream is not running"
        os.kill(pid, signal.SIGKILL)

    async with anyio.create_task_group() as tg:
        tg.start_soon(kill_soon)
        r, sc = await run(s, "python", code, timeout_ms=60000)
    assert sc["stdout"].startswith("ToolError:"), sc
    deadline = time.monotonic() + 60
    while True:
        r, sc = await run(s, "python", "import codebox\nprint(codebox.call_tool('everything__echo', {'message': 'back'}))")
        if sc.get("stdout", "").strip().endswith("back"):
            break
        assert time.monotonic() < deadline, sc
        await anyio.sleep(1)


# Sizes around the clients' read sizes and buffer growth, several answers per read.
SIZES = [0, 1, 4095, 65535, 65536, 65537, 1048575, 1048576, 1048577, 4194305, 5000000, 20000000]


@case
async def results_of_every_size_reach_typescript_and_python_whole(s, w):
    r, sc = await run(s, "typescript", "import { callMCPTool } from '/servers/client.ts';\n"
                      f"const sizes = {json.dumps(SIZES)};\n"
                      "const rs = await Promise.all(sizes.map((bytes) => callMCPTool('hostile__big', { bytes })));\n"
                      "const bad = rs.filter((r, i) => r !== 'x'.repeat(sizes[i]));\n"
                      "console.log(rs.map((r) => (r as string).length).join(','), bad.length);",
                      timeout_ms=120000)
    ok(r, sc)
    assert sc["stdout"] == ",".join(map(str, SIZES)) + " 0\n", sc["stdout"][:500]
    r, sc = await run(s, "python", "import codebox\n"
                      f"sizes = {SIZES!r}\n"
                      "rs = [codebox.call_tool('hostile__big', {'bytes': n}) for n in sizes]\n"
                      "print(','.join(str(len(r)) for r in rs), sum(r != 'x' * n for r, n in zip(rs, sizes)))",
                      timeout_ms=120000)
    ok(r, sc)
    assert sc["stdout"] == ",".join(map(str, SIZES)) + " 0\n", sc["stdout"][:500]
    # An answer over the upstream limit (64 MiB) fails at once, naming the limit.
    r, sc = await run(s, "typescript", "import { callMCPTool } from '/servers/client.ts';\n"
                      "const t = performance.now();\n"
                      "try { await callMCPTool('hostile__big', { bytes: 70000000 }); console.log('returned'); }\n"
                      "catch (e) { console.log((e as Error).message, (performance.now() - t) < 30000); }",
                      timeout_ms=120000)
    ok(r, sc)
    assert "over the limit of 64 MiB" in sc["stdout"] and sc["stdout"].endswith("true\n"), sc


@case
async def typescript_pipelines_many_large_calls_without_deadlock(s, w):
    # 300 echoes of 100 KB each, all in flight at once: 30 MB of requests and of answers.
    # The supervisor holds at most 16 MiB of unread answers and then stops reading fd 3;
    # a client that wrote its requests with blocking writes on the event loop would never
    # read those answers (the run would end at its timeout).
    r, sc = await run(s, "typescript", "import { callMCPTool } from '/servers/client.ts';\n"
                      "const msg = 'y'.repeat(100000);\n"
                      "const rs = await Promise.all(Array.from({ length: 300 }, (_, i) =>\n"
                      "  callMCPTool('everything__echo', { message: `${i}:${msg}` })));\n"
                      "const good = rs.filter((r, i) => String(r).includes(`${i}:${msg}`)).length;\n"
                      "console.log(good);",
                      timeout_ms=120000)
    ok(r, sc)
    assert not sc.get("timed_out"), sc
    assert sc["stdout"] == "300\n", sc["stdout"][:500]


@case
async def promise_all_past_the_answer_queue_does_not_deadlock(s, w):
    # 1000 calls at once, 50 MB of answers: more than the proxy queues (16 MiB) while the
    # program still has requests to write. The client used to write them all before
    # reading any answer, and both sides waited until the timeout.
    r, sc = await run(s, "typescript", "import { callMCPTool } from '/servers/client.ts';\n"
                      "const pad = 'y'.repeat(400);\n"
                      "const rs = await Promise.all(Array.from({ length: 1000 }, "
                      "() => callMCPTool('hostile__big', { bytes: 50000, pad })));\n"
                      "console.log(rs.length, rs.every((r) => (r as string).length === 50000));",
                      timeout_ms=60000)
    ok(r, sc)
    assert sc["stdout"] == "1000 true\n" and not sc.get("tool_channel_error"), sc


@case
async def answers_that_parse_into_gigabytes_fail_unparsed(s, w):
    # 16 MB of `[0,0,…]` as structuredContent: the supervisor's peak went past 1 GB.
    def peak_kib():
        with open(f"/proc/{w.serve_pid}/status") as f:
            return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])
    before = peak_kib()
    r, sc = await run(s, "typescript", "import { callMCPTool } from '/servers/client.ts';\n"
                      "try { await callMCPTool('hostile__zeros', { bytes: 16000000 }); console.log('returned'); }\n"
                      "catch (e) { console.log((e as Error).message); }\n"
                      "console.log(JSON.stringify(await callMCPTool('hostile__zeros', { bytes: 20 })));",
                      timeout_ms=60000)
    ok(r, sc)
    assert "of memory to parse" in sc["stdout"], sc
    assert sc["stdout"].endswith('{"zeros":[0,0,0,0,0,0,0,0,0,0]}\n'), sc
    grew = (peak_kib() - before) >> 10
    assert grew < 300, f"the supervisor's peak grew by {grew} MiB"


async def memory_status(s):
    r = await s.call_tool("list_servers", {})
    return {x["name"]: x for x in r.structured_content["servers"]}["memory"]


@case
async def a_reconnecting_upstream_keeps_its_tools_and_calls_say_so(s, w):
    serve_pid = w.serve_pid
    marker = "server-memory/dist/index.js"
    before = await memory_status(s)
    assert before["status"] == "ready", before
    # The first kill reconnects at once (the server was up long enough); the second,
    # right after, waits out the backoff (1 s), which is the window looked at here.
    for round in range(2):
        pid = upstream_pid(serve_pid, marker)
        assert pid, "the memory upstream is not running"
        os.kill(pid, signal.SIGKILL)
        if round == 0:
            deadline = time.monotonic() + 60
            while upstream_pid(serve_pid, marker) in (None, pid) or (await memory_status(s))["status"] != "ready":
                assert time.monotonic() < deadline, "memory did not come back"
                await anyio.sleep(0.05)
    # Until the loss is noticed the server still reads as ready, and a call made then
    # waits through the reconnection (upstream_wait): look once it is noticed.
    deadline = time.monotonic() + 10
    while (status := await memory_status(s))["status"] == "ready":
        assert time.monotonic() < deadline, "the loss was not noticed"
        await anyio.sleep(0.01)
    # While it reconnects its tools stay listed, marked, and say so.
    assert status["tool_count"] == before["tool_count"], status
    r = await s.call_tool("search_tools", {"query": "read graph", "server": "memory", "detail": "name"})
    found = {t["name"]: t for t in (r.structured_content or {}).get("tools", [])}
    assert "memory__read_graph" in found, r
    marked = found["memory__read_graph"].get("server_status")
    assert marked in (None, "reconnecting", "failed"), found
    # A call made now waits for the server (upstream_wait, 10 s, covers the 1 s backoff)
    # instead of failing (tests/upstream.rs times the wait).
    code = ("import codebox\ntry:\n    codebox.call_tool('memory__read_graph', {})\n    print('ok')\n"
            "except codebox.ToolError as e:\n    print('ToolError:', e)")
    r, sc = await run(s, "python", code)
    ok(r, sc)
    assert sc["stdout"] == "ok\n", sc
    call = sc["tool_calls"][0]
    assert call["ok"], call
    assert (await memory_status(s))["status"] == "ready"


async def main():
    passed = failed = 0
    w = World()
    try:
        async with stdio_client(w.server()) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                w.serve_pid = find_serve_pid()
                # UPSTREAM_ONLY=name,name runs those cases (after the readiness case).
                only = os.environ.get("UPSTREAM_ONLY")
                for fn in CASES:
                    if only and fn is not CASES[0] and fn.__name__ not in only.split(","):
                        continue
                    why = getattr(fn, "namespace_only", None)
                    if why and backend() != "namespace":
                        print(f"skip    {fn.__name__}: not on the {backend()} backend yet: {why}", flush=True)
                        continue
                    try:
                        with anyio.fail_after(180):
                            await fn(s, w)
                        print(f"ok      {fn.__name__}", flush=True)
                        passed += 1
                    except Exception as e:  # noqa: BLE001 - report every failure
                        print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                        failed += 1
    finally:
        w.close()
    print(f"{passed} passed, {failed} failed")
    return failed


def find_serve_pid():
    """Our `codebox serve` child (the SDK does not expose the pid)."""
    for pid, cmd in process_tree().get(os.getpid(), []):
        if cmd.split()[1:2] == ["serve"]:
            return pid
    raise AssertionError("codebox serve not found")


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
