"""End-to-end tests of `codebox serve` with the official Python MCP SDK as the client.

Usage: stdio_client.py CODEBOX_BINARY
Prints one line per case and a closing "N passed, M failed"; exits non-zero on failure.
"""

import os
import json
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError as McpError

from helpers import processes_with, server_env

CODEBOX = sys.argv[1]
RESULTS = []


def server(*extra):
    env = server_env()
    return StdioServerParameters(command=CODEBOX, args=["serve", *extra], env=env)


def case(fn):
    RESULTS.append(fn)
    return fn




async def session_for(*extra):
    return stdio_client(server(*extra))


@case
async def initialize_and_list_tools(s):
    tools = (await s.list_tools()).tools
    names = sorted(t.name for t in tools)
    assert names == ["close_session", "delete_skill", "execute_python", "execute_typescript", "get_skill", "get_tool", "health", "list_servers", "list_skills", "save_skill", "search_tools"], names
    py = next(t for t in tools if t.name == "execute_python")
    assert py.input_schema["required"] == ["code"], py.input_schema
    # No outputSchema (it cost tokens no model needs); structuredContent still comes.
    assert py.output_schema is None, py.output_schema
    assert "sandbox" in py.description


@case
async def python_runs_with_structured_content(s):
    r = await s.call_tool("execute_python", {"code": "import sys; print(sum(range(10))); print('err', file=sys.stderr)"})
    assert not r.is_error, r
    sc = r.structured_content
    assert sc["stdout"] == "45\n" and sc["stderr"] == "err\n" and sc["exit_code"] == 0, sc
    assert sc["landlock"] == "fully_enforced", sc
    assert "45" in r.content[0].text, r.content


@case
async def typescript_runs(s):
    r = await s.call_tool("execute_typescript", {"code": "const xs: number[] = [1, 2, 3]; console.log(xs.map(x => x * 2).join(','))"})
    assert not r.is_error, r
    assert r.structured_content["stdout"] == "2,4,6\n", r.structured_content


@case
async def failing_code_is_a_tool_error_with_traceback(s):
    r = await s.call_tool("execute_python", {"code": "def f():\n    raise ValueError('boom')\nf()"})
    assert r.is_error, r
    sc = r.structured_content
    assert sc["exit_code"] == 1 and "ValueError: boom" in sc["stderr"] and "line 3" in sc["stderr"], sc


@case
async def files_are_placed_in_the_workspace(s):
    files = {"data.csv": "a,b\n1,2\n3,4\n", "lib/helper.py": "def double(x):\n    return 2 * x\n", "deep/er/ü.txt": "ünï"}
    code = (
        "import csv, os\n"
        "from lib.helper import double\n"
        "rows = list(csv.DictReader(open('data.csv')))\n"
        "print(sum(double(int(r['b'])) for r in rows))\n"
        "print(open('/workspace/deep/er/ü.txt').read(), os.getcwd())\n"
    )
    r = await s.call_tool("execute_python", {"code": code, "files": files})
    assert not r.is_error, r
    assert r.structured_content["stdout"] == "12\nünï /workspace\n", r.structured_content
    ts = (
        "import { double } from './lib/helper.ts';\n"
        "const text = await Deno.readTextFile('data.csv');\n"
        "console.log(double(text.trim().split('\\n').length - 1));\n"
        "console.log([...Deno.readDirSync('.')].map((e) => e.name).includes('\\ufeffbom.txt'));\n"
    )
    r = await s.call_tool(
        "execute_typescript",
        {"code": ts, "files": {
            "data.csv": files["data.csv"],
            "lib/helper.ts": "export const double = (x: number) => 2 * x;\n",
            # A name may start with U+FEFF: written as named, not with it stripped (found
            # by reading boot.js against the frame's specification for issue 22).
            "\ufeffbom.txt": "b",
        }},
    )
    assert not r.is_error, r
    assert r.structured_content["stdout"] == "4\ntrue\n", r.structured_content
    r = await s.call_tool(
        "execute_python",
        {"code": "import os; print('\\ufeffbom.txt' in os.listdir())", "files": {"\ufeffbom.txt": "b"}},
    )
    assert r.structured_content["stdout"] == "True\n", r.structured_content


@case
async def bad_files_are_refused_before_the_run(s):
    for files, why in [
        ({"../escape.txt": "x"}, ". or .."),
        ({"/etc/passwd": "x"}, "relative"),
        ({"a": "1", "a/b": "2"}, "both a file and a directory"),
        ({f"f{i}": "" for i in range(101)}, "at most 100"),
        ({"big": "x" * (10 * 1024 * 1024 + 1)}, "at most 10485760"),
        ({"x": 5}, "expected as a string (text) or"),
        ({"x": {"base64": "%%%"}}, "does not decode"),
    ]:
        r = await s.call_tool("execute_python", {"code": "print(1)", "files": files})
        assert r.is_error and r.structured_content is None, (list(files)[:3], r)
        assert why in r.content[0].text, (list(files)[:3], r.content[0].text)


@case
async def timeout_is_reported(s):
    r = await s.call_tool("execute_python", {"code": "while True: pass", "timeout_ms": 500})
    assert r.is_error and r.structured_content["timed_out"] is True, r.structured_content


@case
async def progress_streams_output_while_running(s):
    seen = []
    started = time.monotonic()

    async def on_progress(progress, total, message):
        seen.append((time.monotonic() - started, message))

    r = await s.call_tool(
        "execute_python",
        {"code": "import time\nfor i in range(4):\n    print('line', i)\n    time.sleep(0.35)"},
        progress_callback=on_progress,
    )
    took = time.monotonic() - started
    assert not r.is_error, r
    assert len(seen) >= 2, seen
    assert "line 0" in seen[0][1], seen
    assert seen[0][0] < took - 0.5, (seen, took)


@case
async def cancel_kills_the_sandbox(s):
    marker = f"codebox-mcp-cancel-{os.getpid()}"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600) # {marker}'])\n"
        "while True: pass\n"
    )
    with anyio.move_on_after(1.5):
        await s.call_tool("execute_python", {"code": code, "timeout_ms": 60000})
        raise AssertionError("the call returned instead of being cancelled")
    deadline = time.monotonic() + 5
    while processes_with(marker):
        assert time.monotonic() < deadline, "the cancelled sandbox still runs"
        await anyio.sleep(0.1)
    # The slot is free again: a new run goes through.
    r = await s.call_tool("execute_python", {"code": "print('after cancel')"})
    assert r.structured_content["stdout"] == "after cancel\n", r


@case
async def bad_arguments_are_tool_errors_and_unknown_tools_protocol_errors(s):
    # MCP 2025-11-25: input validation failures are tool execution errors (the model can
    # correct them); an unknown tool is a protocol error.
    for args, why in [
        ({"code": 5}, "expected a string"),
        ({}, "missing field `code`"),
        ({"code": "1", "bogus": True}, "unknown field `bogus`"),
        ({"code": "1", "timeout_ms": 10**9}, "timeout_ms must be between 1 and"),
        ({"code": "1", "timeout_ms": -1}, "invalid value"),
    ]:
        r = await s.call_tool("execute_python", args)
        assert r.is_error and why in r.content[0].text, (args, r.content[0].text)
    try:
        await s.call_tool("no_such_tool", {"code": "1"})
    except McpError as e:
        assert "tool not found" in str(e), e
    else:
        raise AssertionError("an unknown tool was not a protocol error")


@case
async def oversized_code_is_refused(s):
    r = await s.call_tool("execute_python", {"code": "#" * (2 * 1024 * 1024)})
    assert r.is_error and "the limit is 1048576 bytes" in r.content[0].text, r


@case
async def large_outputs_fit_on_the_wire(s):
    # 600 kB and 5 MB of output: the output budget keeps the head and the end.
    for size in (600_000, 5_000_000):
        r = await s.call_tool("execute_python", {"code": f"import sys; sys.stdout.write('x' * {size} + 'END')"})
        sc = r.structured_content
        wire = len(json.dumps(sc)) + len(r.content[0].text)
        assert wire < 50_000, wire
        assert sc["output"]["stdout"]["left_out_bytes"] > 0, sc.get("output")
        assert sc["stdout"].startswith("xxxx") and sc["stdout"].endswith("END"), sc["stdout"][-40:]
    # The wire limit (1 MiB, what every SDK accepts) is the backstop for a budget whose
    # characters escape long: a control byte is 6 bytes of JSON.
    r = await s.call_tool("execute_python", {
        "code": "import sys; sys.stdout.write(chr(1) * 600_000 + 'END')", "output_budget": 200_000})
    sc = r.structured_content
    wire = len(json.dumps(sc)) + len(json.dumps(r.content[0].text))
    assert wire < 1024 * 1024 - 64 * 1024, wire
    assert sc["wire_truncated"]["stdout_bytes_cut"] > 0 and "cut here" in r.content[0].text, sc.get("wire_truncated")


@case
async def health_reports_layers_and_counts(s):
    r = await s.call_tool("health", {})
    h = r.structured_content
    layers = {l["layer"]: l["status"] for l in h["layers"]}
    for layer in ["user namespaces", "seccomp", "cgroups", "landlock", "rootfs"]:
        assert layers.get(layer) == "ok", (layer, layers)
    assert h["executions"]["run"] >= 1 and h["queue_depth"] == 0, h


async def busy_when_the_queue_is_full():
    async with stdio_client(server("--concurrency", "1", "--queue", "0")) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            results = []

            async def call(code):
                results.append(await s.call_tool("execute_python", {"code": code}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "import time; time.sleep(1.5); print('first')")
                await anyio.sleep(0.5)
                tg.start_soon(call, "print('second')")
            busy = [r for r in results if r.is_error]
            assert len(busy) == 1 and "busy" in busy[0].content[0].text, results
            ok = [r for r in results if not r.is_error]
            assert ok[0].structured_content["stdout"] == "first\n", ok


async def main():
    passed = failed = 0
    async with stdio_client(server()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for fn in RESULTS:
                try:
                    await fn(s)
                    print(f"ok      {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure
                    print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                    failed += 1
    try:
        await busy_when_the_queue_is_full()
        print("ok      busy_when_the_queue_is_full", flush=True)
        passed += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAILED  busy_when_the_queue_is_full: {e!r}", flush=True)
        failed += 1
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
