"""Hostile cases for approval questions of 2026-07-28 clients over HTTP with two bearer
tokens (alice, bob): input rounds (`input_required` results with a `requestState`) and
tasks asking through their `input_required` status.

- another client's requestState, a used one, one for another tool: refused, and the
  owner's call is unharmed;
- an answer that is not an elicitation result: a refusal, never an approval;
- a task cancelled while its question is open: it reads cancelled, its sandbox dies;
- a parked call nobody comes back for: its sandbox is killed at the park's end
  (approval timeout + 30 s grace), even on an otherwise quiet server.

Usage: hostile_rounds_client.py CODEBOX_BINARY [UPSTREAMS_DIR]
Prints one line per case and "N passed, M failed".
"""

import os
import subprocess
import sys
import time

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from approval_client import TASKS, TaskHandle, World, calling, task_request, wait_ready
from helpers import DrainedStderr, processes_with, server_env

CODEBOX = sys.argv[1]
SERVERS = []
CASES = []
GRACE = 30  # input_rounds::PARK_GRACE


def case(fn):
    CASES.append(fn)
    return fn


def start_http(w):
    env = server_env()
    env.pop("CODEBOX_HTTP_TOKEN", None)
    env.update({"CODEBOX_CONFIG": w.config(), "CODEBOX_AUDIT_LOG": w.audit,
                "CODEBOX_HTTP_CLIENTS": "alice=alice-token,bob=bob-token"})
    p = subprocess.Popen([CODEBOX, "serve", "--http", "127.0.0.1:0"], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    SERVERS.append(p)
    p.log = DrainedStderr(p)
    m = p.log.wait_for(r"serving MCP at http://[^:]+:(\d+)/mcp", 30)
    assert m, f"server did not start: {p.poll()}: {p.log.text()[-2000:]}"
    return f"http://127.0.0.1:{m.group(1)}/mcp"


def as_client(url, token, w, **kw):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    return Client(streamable_http_client(url, http_client=http), elicitation_callback=w.elicit, **kw)


ACCEPT = {"action": "accept", "content": {"approve": True}}


async def first_question(c, code, tool="execute_python", **args):
    r = await c.session.call_tool(tool, {"code": code, **args}, allow_input_required=True)
    assert getattr(r, "result_type", None) == "input_required", r
    (key,) = r.input_requests.keys()
    return key, r.request_state


async def resume(c, state, responses, tool="execute_python"):
    return await c.session.call_tool(tool, {"code": "ignored"}, request_state=state,
                                     input_responses=responses, allow_input_required=True)


async def refused(c, state, responses, tool="execute_python"):
    try:
        r = await resume(c, state, responses, tool)
    except MCPError as e:
        assert e.error.code == -32602 and "requestState" in e.error.message, e.error
        return
    raise AssertionError(f"a foreign or used requestState was answered: {r}")


@case
async def another_clients_or_a_used_request_state_is_refused(url, w):
    async with as_client(url, "alice-token", w) as alice, as_client(url, "bob-token", w) as bob:
        await wait_ready(alice)
        key, state = await first_question(alice, calling("fixture__delete_repo", {"name": "x-client"}))
        # bob, with alice's state and an approval: refused as unknown; nothing deleted.
        await refused(bob, state, {key: ACCEPT})
        # alice's own state for the other tool: refused too.
        await refused(alice, state, {key: ACCEPT}, tool="execute_typescript")
        assert not any("x-client" in line for line in w.upstream_calls())
        # alice's call is still parked: she declines it.
        r = await resume(alice, state, {key: {"action": "decline"}})
        assert "approval declined" in r.structured_content["stdout"], r
        # The state is used up: a replay (with an approval) is refused.
        await refused(alice, state, {key: ACCEPT})
        assert not any("x-client" in line for line in w.upstream_calls())


@case
async def an_answer_that_is_not_an_elicitation_result_is_a_refusal(url, w):
    async with as_client(url, "alice-token", w) as alice:
        # (The SDK itself refuses to send what is not a client result at all.)
        for i, bad in enumerate([{"action": "accept", "content": {"approve": "true"}},
                                 {"action": "accept", "content": {"approve": 1}},
                                 {"action": "accept", "content": {"Approve": True}},
                                 {"action": "accept"}, {"action": "cancel"}]):
            key, state = await first_question(alice, calling("fixture__delete_repo", {"name": f"bad-{i}"}))
            r = await resume(alice, state, {key: bad})
            out = r.structured_content["stdout"]
            assert out.startswith("ToolError -32007 approval"), (bad, out)
            assert not any(f"bad-{i}" in line for line in w.upstream_calls()), bad


@case
async def a_task_cancelled_while_its_question_is_open_kills_the_sandbox(url, w):
    marker = f"codebox-hostile-task-{os.getpid()}"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600) # {marker}'])\n"
        + calling("fixture__delete_repo", {"name": "task-cancelled"})
        + "import time\ntime.sleep(600)\n"
    )

    from mcp.client.extension import ClientExtension, ResultClaim

    class Declared(ClientExtension):
        identifier = TASKS

        def claims(self):
            return [ResultClaim(result_type="task", model=TaskHandle, resolve=None)]

    async with as_client(url, "alice-token", w, extensions=[Declared()]) as alice, \
            as_client(url, "bob-token", w, extensions=[Declared()]) as bob:
        h = await alice.session.call_tool("execute_python", {"code": code, "timeout_ms": 300000},
                                          allow_claimed=True)
        assert isinstance(h, TaskHandle), h
        deadline = time.monotonic() + 30
        while True:
            t = await task_request(alice.session, "tasks/get", {"taskId": h.task_id})
            if t["status"] == "input_required":
                break
            assert time.monotonic() < deadline, t
            await anyio.sleep(0.1)
        (key,) = t["inputRequests"].keys()
        # bob cannot answer it.
        try:
            await task_request(bob.session, "tasks/update", {"taskId": h.task_id, "inputResponses": {key: ACCEPT}})
            raise AssertionError("bob answered alice's question")
        except MCPError as e:
            assert e.error.code == -32602, e.error
        assert processes_with(marker), "the sandbox is not running"
        await task_request(alice.session, "tasks/cancel", {"taskId": h.task_id})
        deadline = time.monotonic() + 15
        while (t := await task_request(alice.session, "tasks/get", {"taskId": h.task_id}))["status"] != "cancelled":
            assert time.monotonic() < deadline, t
            await anyio.sleep(0.1)
        deadline = time.monotonic() + 10
        while processes_with(marker):
            assert time.monotonic() < deadline, "the cancelled task's sandbox still runs"
            await anyio.sleep(0.1)
        # A late answer changes nothing.
        try:
            await task_request(alice.session, "tasks/update", {"taskId": h.task_id, "inputResponses": {key: ACCEPT}})
        except MCPError:
            pass
        assert not any("task-cancelled" in line for line in w.upstream_calls())


@case
async def a_parked_call_nobody_comes_back_for_has_its_sandbox_killed(url, w):
    marker = f"codebox-hostile-parked-{os.getpid()}"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600) # {marker}'])\n"
        + calling("fixture__delete_repo", {"name": "never-answered"})
        + "import time\ntime.sleep(600)\n"
    )
    async with as_client(url, "alice-token", w) as alice:
        await first_question(alice, code, timeout_ms=300000)
        deadline = time.monotonic() + 10
        while not processes_with(marker):
            assert time.monotonic() < deadline, "the sandbox is not running"
            await anyio.sleep(0.1)
        # Nobody comes back, and nothing else happens on the server: the approval wait
        # (2 s) plus the grace, and the sandbox must be gone.
        deadline = time.monotonic() + 2 + GRACE + 10
        while processes_with(marker):
            assert time.monotonic() < deadline, "the abandoned call's sandbox still runs"
            await anyio.sleep(0.5)


async def main():
    passed = failed = 0
    w = World()
    try:
        url = start_http(w)
        for fn in CASES:
            try:
                with anyio.fail_after(120):
                    await fn(url, w)
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
        w.close()
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
