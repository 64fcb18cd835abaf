"""The generated wrappers as a new user meets them, through the official Python MCP SDK:
`codebox serve` with the real filesystem, memory, time, git and everything servers (and
the raw test server for result shapes no real one sends), and sandboxed Python and
TypeScript calling them.

- Python wrappers take the required arguments by position or by name (in the order of
  the schema's `required`), the optional ones by name; a missing one is Python's own
  TypeError naming it; the `aio` forms take the same arguments.
- A result is the tool's value: its structuredContent, else its text parsed as JSON,
  else the text; the text it came with, its content blocks and the whole MCP result stay
  reachable (`.text`, `.content`, `.structured`, `.result` in Python; `resultOf` and
  `callMCPToolResult` in TypeScript).
- search_tools' text shows the Python signature beside the TypeScript one.

Usage: wrappers_client.py CODEBOX_BINARY UPSTREAMS_DIR
Prints one line per case and "N passed, M failed".
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import server_env

CODEBOX = sys.argv[1]
UPSTREAMS = os.path.abspath(sys.argv[2])
NODE_MODULES = os.path.join(UPSTREAMS, "node/node_modules/@modelcontextprotocol")
HOSTILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "upstream", "hostile_server.py")
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


class World:
    """A data directory (two files and a git repository) and the .mcp.json."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-wrappers-test-")
        root = self.tmp.name
        os.chmod(root, 0o755)
        self.data = os.path.join(root, "data")
        os.makedirs(self.data)
        with open(os.path.join(self.data, "a.txt"), "w") as f:
            f.write("hello\nworld")
        with open(os.path.join(self.data, "b.json"), "w") as f:
            f.write('{"x": 1}\n')
        self.repo = os.path.join(self.data, "repo")
        os.makedirs(self.repo)
        git = ["git", "-C", self.repo, "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
        subprocess.run(["git", "init", "-q", self.repo], check=True)
        with open(os.path.join(self.repo, "f.txt"), "w") as f:
            f.write("x\n")
        subprocess.run(git + ["add", "f.txt"], check=True)
        subprocess.run(git + ["commit", "-q", "-m", "first"], check=True)
        node = lambda pkg: os.path.join(NODE_MODULES, pkg, "dist/index.js")  # noqa: E731
        self.config = os.path.join(root, "mcp.json")
        with open(self.config, "w") as f:
            json.dump({"mcpServers": {
                "filesystem": {"command": "node", "args": [node("server-filesystem"), self.data]},
                "memory": {"command": "node", "args": [node("server-memory")],
                           "env": {"MEMORY_FILE_PATH": os.path.join(root, "memory.jsonl")}},
                "everything": {"command": "node", "args": [node("server-everything"), "stdio"]},
                "time": {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
                         "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python")}},
                "git": {"command": "/usr/bin/python3", "args": ["-m", "mcp_server_git", "--repository", self.repo],
                        "env": {"PYTHONPATH": os.path.join(UPSTREAMS, "python-git")}},
                "hostile": {"command": "/usr/bin/python3", "args": [HOSTILE]},
            }}, f)

    def server(self):
        env = server_env()
        env["CODEBOX_MCP_CONFIG"] = self.config
        return StdioServerParameters(command=CODEBOX, args=["serve"], env=env)

    def close(self):
        self.tmp.cleanup()


async def run(s, language, code, **args):
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    sc = r.structured_content or {}
    assert not r.is_error, sc.get("stderr") or r.content
    return sc


def lines(sc):
    assert sc.get("exit_code") == 0, sc.get("stderr")
    return sc["stdout"].splitlines()


@case
async def every_server_is_ready(s, w):
    deadline = time.monotonic() + 60
    while True:
        r = await s.call_tool("list_servers", {})
        servers = {x["name"]: x["status"] for x in r.structured_content["servers"]}
        if len(servers) == 6 and all(v == "ready" for v in servers.values()):
            return
        assert time.monotonic() < deadline, servers
        await anyio.sleep(0.5)


@case
async def python_required_arguments_by_position_or_name(s, w):
    a = os.path.join(w.data, "a.txt")
    sc = await run(s, "python", f"""
from servers.filesystem import read_text_file, list_directory
from servers.time import convert_time
from servers.git import git_log
by_position = read_text_file({a!r})
by_name = read_text_file(path={a!r})
print(by_position == by_name, by_position["content"] == "hello\\nworld")
print(read_text_file({a!r}, head=1)["content"] == "hello")
# Several required arguments in the order of the schema's `required`.
t = convert_time("UTC", "12:00", "Asia/Tokyo")
print(t["source"]["timezone"], t["target"]["timezone"], t["target"]["datetime"][11:16])
print(convert_time("UTC", target_timezone="Asia/Tokyo", time="12:00") == t)
print("first" in git_log({w.repo!r}, max_count=1))
for call in (lambda: read_text_file(), lambda: convert_time("UTC", "12:00"), lambda: read_text_file({a!r}, 1)):
    try:
        call()
    except TypeError as e:
        print("TypeError:", e)
""")
    assert lines(sc) == [
        "True True",
        "True",
        "UTC Asia/Tokyo 21:00",
        "True",
        "True",
        "TypeError: read_text_file() missing 1 required positional argument: 'path'",
        "TypeError: convert_time() missing 1 required positional argument: 'target_timezone'",
        "TypeError: read_text_file() takes 1 positional argument but 2 were given",
    ], sc["stdout"]
    # The missing argument never reached the server.
    assert [c["name"] for c in sc["tool_calls"]] == [
        "filesystem__read_text_file", "filesystem__read_text_file", "filesystem__read_text_file",
        "time__convert_time", "time__convert_time", "git__git_log"], sc["tool_calls"]


@case
async def python_coroutine_forms_take_the_same_arguments(s, w):
    a = os.path.join(w.data, "a.txt")
    sc = await run(s, "python", f"""
import asyncio, inspect
from servers.filesystem import aio, read_text_file
from servers import time as t
async def main():
    return await asyncio.gather(aio.read_text_file({a!r}), aio.read_text_file(path={a!r}, tail=1),
                                t.aio.convert_time("UTC", "00:00", "UTC"))
first, last, same = asyncio.run(main())
print(first["content"] == "hello\\nworld", last["content"], same["time_difference"])
print(inspect.signature(aio.read_text_file) == inspect.signature(read_text_file))
try:
    asyncio.run(aio.read_text_file())
except TypeError as e:
    print("TypeError:", e)
""")
    assert lines(sc) == [
        "True world +0.0h",
        "True",
        "TypeError: read_text_file() missing 1 required positional argument: 'path'",
    ], sc["stdout"]


@case
async def python_results_are_the_value_and_keep_the_text(s, w):
    b = os.path.join(w.data, "b.json")
    sc = await run(s, "python", f"""
import json, pickle, codebox
from servers.filesystem import read_text_file, list_directory
from servers.memory import create_entities, read_graph
from servers.time import get_current_time
from servers.git import git_status
from servers.everything import echo, get_env, get_tiny_image
# structuredContent that mirrors the text (server-filesystem): the structured value.
f = read_text_file({b!r})
print(type(f).__name__, isinstance(f, dict), f == {{"content": '{{"x": 1}}\\n'}}, f.text == f["content"], f.structured == f)
print(json.dumps(f), repr(f) == repr(dict(f)), pickle.loads(pickle.dumps(f)) == f)
listing = list_directory({w.data!r})
print(sorted(l for l in listing.text.splitlines()))
# structuredContent with its JSON as text (memory, time): the structured value.
made = create_entities([{{"name": "w", "entityType": "t", "observations": ["o"]}}])
g = read_graph()
print(type(g).__name__, [e["name"] for e in g["entities"]], json.loads(g.text) == g, made["entities"][0]["name"])
now = get_current_time("UTC")
print(type(now).__name__, now["timezone"], json.loads(now.text) == now, now.content[0]["type"])
# Plain text (git, everything): the text, no structured value.
st = git_status({w.repo!r})
print(type(st).__name__, isinstance(st, str), st.text == st, st.structured, st.startswith("Repository status:"))
e = echo("hi")
print(e, e == "Echo: hi", e.result["content"] == [{{"type": "text", "text": "Echo: hi"}}])
# JSON text without structuredContent: parsed, the text kept.
env = get_env()
print(type(env).__name__, isinstance(env, dict), json.loads(env.text) == env, env.structured)
# Content that is not all text: the content list.
img = get_tiny_image()
print(type(img).__name__, [c["type"] for c in img][:2], img.content == list(img))
# The whole result, unread: isError comes back instead of raising.
raw = codebox.call_tool_result("filesystem__read_text_file", {{"path": {b!r} + ".missing"}})
print(type(raw).__name__, raw["isError"], "ENOENT" in raw["content"][0]["text"])
try:
    read_text_file({b!r} + ".missing")
except codebox.ToolError as err:
    print("ToolError", err.result["isError"])
""")
    assert lines(sc) == [
        "ToolDict True True True True",
        '{"content": "{\\"x\\": 1}\\n"} True True',
        "['[DIR] repo', '[FILE] a.txt', '[FILE] b.json']",
        "ToolDict ['w'] True w",
        "ToolDict UTC True text",
        "ToolText True True None True",
        "Echo: hi True True",
        "ToolDict True True None",
        "ToolList ['text', 'image'] True",
        "dict True True",
        "ToolError True",
    ], sc["stdout"]


@case
async def python_result_shapes_no_real_server_sends(s, w):
    sc = await run(s, "python", """
from servers.hostile import echo
for text in ["42", "4.5", "true", "null", "[1, 2]", '"quoted"', "not json", ""]:
    v = echo(text=text)
    print(repr(v), type(v).__name__, getattr(v, "text", None) == text)
""")
    assert lines(sc) == [
        "42 ToolInt True",
        "4.5 ToolFloat True",
        "True bool False",
        "None NoneType False",
        "[1, 2] ToolList True",
        "'quoted' ToolText True",
        "'not json' ToolText True",
        "'' ToolText True",
    ], sc["stdout"]


@case
async def typescript_results_keep_their_result(s, w):
    b = os.path.join(w.data, "b.json")
    sc = await run(s, "typescript", f"""
import {{ readTextFile }} from "/servers/filesystem/index.ts";
import {{ readGraph }} from "/servers/memory/index.ts";
import {{ gitStatus }} from "/servers/git/index.ts";
import {{ getTinyImage }} from "/servers/everything/index.ts";
import {{ callMCPTool, callMCPToolResult, resultOf, ToolError }} from "/servers/client.ts";
const f = await readTextFile({{ path: {json.dumps(b)} }});
const info = resultOf<{{ content: string }}>(f);
console.log(JSON.stringify(f), info?.text === f.content, info?.structured === f, info?.content.length);
const g = await readGraph();
const parsed = JSON.parse(resultOf(g)!.text);
console.log(Array.isArray(g.entities), parsed.entities.length === g.entities.length && parsed.entities[0].name === g.entities[0].name);
const st = await gitStatus({{ repo_path: {json.dumps(w.repo)} }});
console.log(typeof st, (st as string).startsWith("Repository status:"), resultOf(st));
const img = await getTinyImage() as {{ type: string }}[];
console.log(img.map((c) => c.type).slice(0, 2).join(","), resultOf(img)?.content === img);
const raw = await callMCPToolResult("filesystem__read_text_file", {{ path: {json.dumps(b + ".missing")} }});
console.log(raw.isError, raw.content?.[0].text?.includes("ENOENT"));
try {{
  await readTextFile({{}} as {{ path: string }});
}} catch (e) {{
  console.log((e as Error).name, (e as Error).message.includes("path"), (e as ToolError).result !== undefined);
}}
console.log(await callMCPTool("hostile__echo", {{ text: "42" }}), resultOf(await callMCPTool("hostile__echo", {{ text: "[1]" }}))?.text);
""")
    assert lines(sc) == [
        '{"content":"{\\"x\\": 1}\\n"} true true 1',
        "true true",
        "string true undefined",
        "text,image true",
        "true true",
        "ToolError true true",
        "42 [1]",
    ], sc["stdout"]


@case
async def search_tools_text_shows_both_signatures(s, w):
    r = await s.call_tool("search_tools", {"query": "read a text file", "server": "filesystem", "limit": 3})
    assert not r.is_error, r
    text = r.content[0].text
    entries = {t["name"]: t for t in r.structured_content["tools"]}
    t = entries["filesystem__read_text_file"]
    assert t["python"] == "def read_text_file(path: str, *, head: float | None = None, tail: float | None = None) -> Any", t
    assert t["typescript"].startswith("function readTextFile(input: {"), t
    assert f"\n  ts: {t['typescript']}\n  py: {t['python']}\n" in text, text
    # Every entry of the text has its two signature lines.
    assert text.count("\n  ts: function ") == text.count("\n  py: def ") == len(entries), text
    r = await s.call_tool("search_tools", {"query": "convert time", "server": "time", "detail": "full", "limit": 1})
    text = r.content[0].text
    assert "\n  py: def convert_time(source_timezone: str, time: str, target_timezone: str) -> Any\n" in text, text
    assert "\n  ts: " in text and "export function convertTime(input: ConvertTimeInput)" in text, text
    r = await s.call_tool("get_tool", {"name": "time__convert_time"})
    got = r.structured_content
    assert got["python"] == "def convert_time(source_timezone: str, time: str, target_timezone: str) -> Any", got
    assert got["example"]["python"].endswith('\nconvert_time(source_timezone="...", time="...", target_timezone="...")'), got
    r = await s.call_tool("get_tool", {"name": "filesystem__list_directory"})
    assert r.structured_content["example"]["python"].endswith('\nlist_directory("...")'), r.structured_content
    # And from inside: the summary has the Python signature too.
    sc = await run(s, "python", "import codebox\n"
                   "print(codebox.search_tools('git status', server='git', limit=1)[0]['python'])")
    assert lines(sc) == ["def git_status(repo_path: str) -> Any"], sc["stdout"]


async def main():
    passed = failed = 0
    w = World()
    try:
        async with stdio_client(w.server()) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                only = os.environ.get("WRAPPERS_ONLY")
                for fn in CASES:
                    if only and fn is not CASES[0] and fn.__name__ not in only.split(","):
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


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
