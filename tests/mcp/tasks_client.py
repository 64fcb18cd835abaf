"""Executions as tasks (MCP Tasks extension, SEP-2663) with the official Python SDK.

Usage: tasks_client.py CODEBOX_BINARY
Prints one line per case and a closing "N passed, M failed"; exits non-zero on failure.

The SDK has no tasks extension of its own; `Tasks` below is what a client implementing
it does: it declares `io.modelcontextprotocol/tasks`, claims the `resultType: "task"`
answer and polls `tasks/get` until the task ends.
"""

import json
import os
import subprocess
import sys
import time
from typing import Any, ClassVar, Literal

import anyio
import httpx2
import mcp_types as types
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from helpers import DrainedStderr, processes_with, server_env

CODEBOX = sys.argv[1]
TASKS = "io.modelcontextprotocol/tasks"
RESULTS = []
SERVERS = []


def case(fn):
    RESULTS.append(fn)
    return fn


class TaskHandle(types.Result):
    """A `CreateTaskResult`: the task at its creation, flat."""

    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class TaskRequest(types.Request[dict[str, Any], str]):
    """`tasks/get`, `tasks/update`, `tasks/cancel`: over HTTP at 2026-07-28 the task id
    also goes in the `Mcp-Name` header."""

    name_param: ClassVar[str | None] = "taskId"


async def raw(session, method, params):
    request = TaskRequest(method=method, params=params)
    return await session.send_request(request, TypeAdapter(dict))


async def wait_for_end(session, task_id, seen=None, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        task = await raw(session, "tasks/get", {"taskId": task_id})
        if seen is not None:
            seen.append(task)
        if task["status"] in ("completed", "failed", "cancelled"):
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task['status']}"
        await anyio.sleep(min(task.get("pollIntervalMs", 1000), 200) / 1000)


POLLED = []


async def poll_to_result(handle, ctx):
    """The claim's resolver: poll until the end, give the inlined tool result back."""
    task = await wait_for_end(ctx.session, handle.task_id, POLLED)
    assert task["status"] == "completed", task
    return types.CallToolResult.model_validate(task["result"])


class Tasks(ClientExtension):
    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=poll_to_result)]


def stdio(*extra):
    return StdioServerParameters(command=CODEBOX, args=["serve", *extra], env=server_env())


@case
async def a_task_client_gets_its_result_by_polling():
    POLLED.clear()
    async with Client(stdio(), extensions=[Tasks()]) as c:
        assert c.protocol_version == "2026-07-28", c.protocol_version
        caps = c.server_capabilities
        assert TASKS in (caps.extensions or {}), caps
        code = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(0.4)\n"
        r = await c.call_tool("execute_python", {"code": code})
        assert not r.is_error, r
        assert r.structured_content["stdout"] == "".join(f"tick {i}\n" for i in range(4)), r
        statuses = [t["status"] for t in POLLED]
        assert statuses[-1] == "completed" and "working" in statuses, statuses
        # The output so far was readable while it ran.
        running = [t.get("statusMessage", "") for t in POLLED if t["status"] == "working"]
        assert any("tick 0" in m for m in running), running
        # The inlined result carries no related-task metadata (the id is at the root).
        assert "io.modelcontextprotocol/related-task" not in (POLLED[-1]["result"].get("_meta") or {})


@case
async def the_task_answer_is_flat_and_typescript_runs_as_a_task_too():
    async with Client(stdio(), extensions=[Tasks()]) as c:
        h = await c.session.call_tool("execute_typescript", {"code": "console.log(6 * 7)"}, allow_claimed=True)
        assert isinstance(h, TaskHandle), h
        assert h.status == "working" and h.ttl_ms and h.ttl_ms >= 5 * 60 * 1000 and h.poll_interval_ms, h
        raw_answer = h.model_dump(by_alias=True)
        assert "task" not in raw_answer and "requestState" not in raw_answer, raw_answer
        done = await wait_for_end(c.session, h.task_id)
        assert done["status"] == "completed", done
        assert done["result"]["structuredContent"]["stdout"] == "42\n", done
        assert "requestState" not in done


@case
async def a_failing_program_is_a_completed_task_with_is_error():
    async with Client(stdio(), extensions=[Tasks()]) as c:
        h = await c.session.call_tool("execute_python", {"code": "raise SystemExit(3)"}, allow_claimed=True)
        done = await wait_for_end(c.session, h.task_id)
        assert done["status"] == "completed" and done["result"]["isError"] is True, done
        assert "error" in done["statusMessage"], done


@case
async def cancel_kills_the_sandbox_and_the_task_reads_cancelled():
    marker = f"codebox-task-cancel-{os.getpid()}"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600) # {marker}'])\n"
        "print('started', flush=True)\n"
        "while True: pass\n"
    )
    async with Client(stdio(), extensions=[Tasks()]) as c:
        h = await c.session.call_tool("execute_python", {"code": code, "timeout_ms": 120000}, allow_claimed=True)
        deadline = time.monotonic() + 20
        while not processes_with(marker):
            assert time.monotonic() < deadline, "the sandbox never started"
            await anyio.sleep(0.1)
        ack = await raw(c.session, "tasks/cancel", {"taskId": h.task_id})
        assert ack.get("resultType") == "complete" and "taskId" not in ack and "status" not in ack, ack
        done = await wait_for_end(c.session, h.task_id, timeout=15)
        assert done["status"] == "cancelled", done
        assert "result" not in done and "error" not in done, done
        deadline = time.monotonic() + 5
        while processes_with(marker):
            assert time.monotonic() < deadline, "the cancelled task's sandbox still runs"
            await anyio.sleep(0.1)
        # Cancelling an ended task is acknowledged the same way and changes nothing.
        again = await raw(c.session, "tasks/cancel", {"taskId": h.task_id})
        assert again.get("resultType") == "complete", again
        assert (await raw(c.session, "tasks/get", {"taskId": h.task_id}))["status"] == "cancelled"
        # The slot is free again.
        r = await c.call_tool("execute_python", {"code": "print('after cancel')"})
        assert r.structured_content["stdout"] == "after cancel\n", r


@case
async def clients_without_the_extension_get_the_synchronous_answer():
    # 2026-07-28 without the extension.
    async with Client(stdio()) as c:
        r = await c.session.call_tool("execute_python", {"code": "print('sync')"})
        assert isinstance(r, types.CallToolResult) and r.structured_content["stdout"] == "sync\n", r
        # The task methods want the extension declared: -32021 names the capability.
        try:
            await raw(c.session, "tasks/get", {"taskId": "anything"})
            raise AssertionError("tasks/get without the extension was answered")
        except MCPError as e:
            assert e.error.code == -32021, e.error
    # 2025-11-25 (initialize) without the extension.
    async with stdio_client(stdio()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r = await s.call_tool("execute_python", {"code": "print('legacy sync')"})
            assert r.structured_content["stdout"] == "legacy sync\n", r


@case
async def bad_arguments_and_unknown_ids_are_refused_without_a_task():
    async with Client(stdio(), extensions=[Tasks()]) as c:
        try:
            await c.session.call_tool("execute_python", {"kode": "print(1)"}, allow_claimed=True)
            raise AssertionError("bad arguments made a task")
        except MCPError as e:
            assert e.error.code == -32602 and "kode" in e.error.message, e.error
        # Out-of-range values are the tool's own error, inlined in a completed task.
        h = await c.session.call_tool("execute_python", {"code": "1", "timeout_ms": 0}, allow_claimed=True)
        done = await wait_for_end(c.session, h.task_id)
        assert done["result"]["isError"] is True and "timeout_ms" in json.dumps(done["result"]), done
        for method in ("tasks/get", "tasks/cancel"):
            try:
                await raw(c.session, method, {"taskId": "no-such-task"})
                raise AssertionError(f"{method} of an unknown id was answered")
            except MCPError as e:
                assert e.error.code == -32602 and "unknown task" in e.error.message, e.error
        # The caller's tasks are a resource too.
        listed = await c.read_resource("codebox://tasks")
        tasks = json.loads(listed.contents[0].text)["tasks"]
        assert [t["taskId"] for t in tasks] == [h.task_id], tasks


def start_http(extra_env):
    env = server_env()
    env.pop("CODEBOX_HTTP_TOKEN", None)
    env.update(extra_env)
    p = subprocess.Popen([CODEBOX, "serve", "--http", "127.0.0.1:0"], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    SERVERS.append(p)
    p.log = DrainedStderr(p)
    m = p.log.wait_for(r"serving MCP at http://[^:]+:(\d+)/mcp", 30)
    assert m, f"server did not start: {p.poll()}: {p.log.text()[-2000:]}"
    return f"http://127.0.0.1:{m.group(1)}/mcp"


def as_client(url, token):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    return Client(streamable_http_client(url, http_client=http), extensions=[Tasks()])


@case
async def a_task_belongs_to_the_client_that_created_it():
    url = start_http({"CODEBOX_HTTP_CLIENTS": "alice=alice-token,bob=bob-token"})
    async with as_client(url, "alice-token") as alice, as_client(url, "bob-token") as bob:
        h = await alice.session.call_tool(
            "execute_python", {"code": "import time\ntime.sleep(1.5)\nprint('alice only')"}, allow_claimed=True)
        # bob learns nothing: the same answer as for an id that does not exist.
        for method in ("tasks/get", "tasks/cancel"):
            for task_id in (h.task_id, "no-such-task"):
                try:
                    await raw(bob.session, method, {"taskId": task_id})
                    raise AssertionError(f"bob's {method} of {task_id} was answered")
                except MCPError as e:
                    assert e.error.code == -32602 and e.error.message == f"unknown task: {task_id}", e.error
        try:
            await raw(bob.session, "tasks/update", {"taskId": h.task_id, "inputResponses": {}})
            raise AssertionError("bob's tasks/update was answered")
        except MCPError as e:
            assert e.error.code == -32602, e.error
        listed = json.loads((await bob.read_resource("codebox://tasks")).contents[0].text)
        assert listed["tasks"] == [], listed
        # bob's cancel did not stop it: alice gets her result, over requests of their own.
        done = await wait_for_end(alice.session, h.task_id)
        assert done["status"] == "completed", done
        assert done["result"]["structuredContent"]["stdout"] == "alice only\n", done


async def main():
    passed = failed = 0
    try:
        for fn in RESULTS:
            try:
                with anyio.fail_after(120):
                    await fn()
                print(f"ok      {fn.__name__}", flush=True)
                passed += 1
            except Exception as e:  # noqa: BLE001 - report every failure
                print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                failed += 1
    finally:
        for p in SERVERS:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
