"""Approval gates through `codebox serve`, driven by the official Python MCP SDK as a
2025-11-25 client (`mode="legacy"`) with and without an elicitation callback.

An upstream fixture (tests/upstream/approval_server.py) has a tool gated by a name
pattern (`fixture__delete_*`), one annotated destructiveHint (`destructive = "ask"`) and
one neither; the egress proxy allows a loopback echo origin that needs approval
(`[network] approve`). The user's answers come from the callback: accept, decline,
accept without ticking, or no answer (the configured 2 s timeout passes). Without a
callback the fallback applies (deny, then `fallback = "allow"`). The audit log must hold
one `approval` record per decision, without argument values.

Usage: approval_client.py CODEBOX_BINARY [UPSTREAMS_DIR]
Prints one line per case and "N passed, M failed".
"""

import http.server
import json
import os
import sys
import tempfile
import threading

import anyio
from typing import Any, ClassVar, Literal

from mcp import Client, StdioServerParameters
from mcp.client.extension import ClientExtension, ResultClaim
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult, Request, Result
from pydantic import TypeAdapter

from helpers import server_env

CODEBOX = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "upstream", "approval_server.py")
MARK = "arg-value-7f3a"  # an argument value that must never reach the audit log
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        body = b"echo\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class World:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-approval-test-")
        os.chmod(self.tmp.name, 0o755)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.calls = os.path.join(self.tmp.name, "calls.log")
        open(self.calls, "w").close()
        self.audit = os.path.join(self.tmp.name, "audit.jsonl")
        self.mcp = os.path.join(self.tmp.name, "mcp.json")
        with open(self.mcp, "w") as f:
            json.dump({"mcpServers": {"fixture": {
                "command": "/usr/bin/python3", "args": [FIXTURE],
                "env": {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "APPROVAL_CALLS": self.calls},
            }}}, f)
        # What the user answers next: "accept", "decline", "unticked", "silent".
        self.answer = "accept"
        self.questions = []

    def config(self, fallback="deny"):
        path = os.path.join(self.tmp.name, f"codebox-{fallback}.toml")
        with open(path, "w") as f:
            f.write(f"""
state_dir = "{self.tmp.name}/state"
mcp_config = "{self.mcp}"
[approval]
require_approval = ["fixture__delete_*"]
destructive = "ask"
timeout = "2s"
fallback = "{fallback}"
[network]
mode = "proxy"
allow = ["localhost:{self.port}"]
approve = ["localhost:{self.port}"]
allow_private = ["127.0.0.1:{self.port}"]
""")
        return path

    def server(self, fallback="deny"):
        env = server_env()
        env.update({"CODEBOX_CONFIG": self.config(fallback), "CODEBOX_AUDIT_LOG": self.audit,
                    "CODEBOX_POOL_SIZE": "1"})
        return StdioServerParameters(command=CODEBOX, args=["serve"], env=env)

    async def elicit(self, context, params):
        self.questions.append(params.message)
        if self.answer == "silent":
            await anyio.sleep(5)
        if self.answer == "decline":
            return ElicitResult(action="decline")
        if self.answer == "unticked":
            return ElicitResult(action="accept", content={"approve": False})
        return ElicitResult(action="accept", content={"approve": True})

    def upstream_calls(self):
        with open(self.calls) as f:
            return f.read().splitlines()

    def approvals(self):
        with open(self.audit) as f:
            return [r for r in map(json.loads, f) if r.get("event") == "approval"]

    def close(self):
        self.httpd.shutdown()
        self.tmp.cleanup()


async def run(c, code):
    r = await c.call_tool("execute_python", {"code": code})
    sc = r.structured_content or {}
    assert not r.is_error, (sc.get("stderr"), r.content)
    return sc


def calling(tool, args):
    return f"""
import codebox
try:
    r = codebox.call_tool({tool!r}, {args!r})
    print("ok:", r["result"] if "result" in r else r["content"][0]["text"])
except codebox.ToolError as e:
    print("ToolError", e.code, str(e))
"""


async def wait_ready(c):
    for _ in range(300):
        servers = (await c.call_tool("list_servers", {})).structured_content["servers"]
        if servers and servers[0]["status"] == "ready":
            return
        await anyio.sleep(0.1)
    raise AssertionError(servers)


@case
async def an_accepted_call_by_name_pattern_goes_through(c, w):
    await wait_ready(c)
    w.answer, before = "accept", len(w.questions)
    sc = await run(c, calling("fixture__delete_repo", {"name": MARK}))
    assert sc["stdout"] == f"ok: deleted {MARK}\n", sc
    q = w.questions[before:]
    assert len(q) == 1, q
    assert "fixture__delete_repo (server \"fixture\", tool \"delete_repo\")" in q[0], q[0]
    assert 'require_approval rule "fixture__delete_*"' in q[0], q[0]
    assert f'{{"name":"{MARK}"}}' in q[0], q[0]
    assert f"delete_repo {MARK}" in w.upstream_calls()


@case
async def a_destructive_hint_is_asked_about_and_others_are_not(c, w):
    w.answer, before = "accept", len(w.questions)
    sc = await run(c, calling("fixture__drop_table", {"table": "t1"}) + calling("fixture__read_note", {}))
    assert sc["stdout"] == "ok: dropped t1\nok: a note\n", sc
    q = w.questions[before:]
    assert len(q) == 1 and "destructiveHint" in q[0], q


@case
async def a_declined_call_raises_tool_error_and_never_reaches_the_upstream(c, w):
    w.answer, before = "decline", len(w.calls and w.upstream_calls())
    sc = await run(c, calling("fixture__delete_repo", {"name": "keep-me"}) * 2)
    expected = "ToolError -32007 approval declined by the user for fixture__delete_repo\n"
    again = ("ToolError -32007 approval declined by the user for fixture__delete_repo "
             "earlier in this execution (same request); not asked again\n")
    assert sc["stdout"] == expected + again, sc
    assert not any("keep-me" in line for line in w.upstream_calls()[before:]), w.upstream_calls()
    w.answer = "unticked"
    sc = await run(c, calling("fixture__delete_repo", {"name": "keep-me-too"}))
    assert "ToolError -32007 approval declined by the user" in sc["stdout"], sc
    assert not any("keep-me" in line for line in w.upstream_calls()), w.upstream_calls()


@case
async def an_unanswered_question_times_out(c, w):
    w.answer = "silent"
    sc = await run(c, calling("fixture__delete_repo", {"name": "slow"}))
    assert sc["stdout"] == "ToolError -32007 approval for fixture__delete_repo timed out after 2 s\n", sc
    assert not any("slow" in line for line in w.upstream_calls())


@case
async def the_execution_deadline_abandons_an_open_question(c, w):
    w.answer = "silent"
    r = await c.call_tool("execute_python", {"code": calling("fixture__delete_repo", {"name": "late"}),
                                             "timeout_ms": 1000})
    sc = r.structured_content or {}
    assert sc.get("timed_out") is True, (sc, r.content)
    assert not any("late" in line for line in w.upstream_calls())
    for _ in range(50):
        if any(r["decision"] == "abandoned" for r in w.approvals()):
            break
        await anyio.sleep(0.1)
    else:
        raise AssertionError(w.approvals())
    w.answer = "accept"


EGRESS = """
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen("http://localhost:{port}/echo", timeout=30).read().decode().strip())
except urllib.error.HTTPError as e:
    print("HTTPError", e.code, e.reason)
"""


@case
async def an_egress_host_that_needs_approval_waits_for_it(c, w):
    w.answer, before = "accept", len(w.questions)
    sc = await run(c, EGRESS.format(port=w.port) * 2)
    # Approved once, approved for the execution: one question for two requests.
    assert sc["stdout"] == "echo\necho\n", sc
    q = w.questions[before:]
    assert len(q) == 1 and f"connect to localhost:{w.port}" in q[0], q
    assert f'[network] approve rule "localhost:{w.port}"' in q[0], q[0]
    w.answer = "decline"
    sc = await run(c, EGRESS.format(port=w.port))
    assert sc["stdout"].startswith("HTTPError 403 "), sc
    assert f"approval declined by the user for egress to localhost:{w.port}" in sc["stdout"], sc
    denied = [x for x in sc["network"]["connections"] if not x["allowed"]]
    assert denied and "approval declined" in denied[0]["reason"], sc["network"]
    # The proxy's `why` endpoint reports the refusal too (what Deno's fetch error shows).
    why = EGRESS.format(port=w.port) + (
        "\nprint(urllib.request.urlopen('http://egress.codebox.invalid/why?target=localhost:{port}')"
        ".read().decode().strip())").format(port=w.port)
    sc = await run(c, why)
    lines = sc["stdout"].splitlines()
    # A new execution asks again (what a user declined is remembered per execution).
    assert lines[0].startswith("HTTPError 403 ") and "approval declined" in lines[0], sc
    assert lines[1].startswith(f"codebox: egress to localhost:{w.port} denied (approval declined"), sc


@case
async def every_decision_is_audited_without_argument_values(c, w):
    await anyio.sleep(0.5)  # appends run on the blocking pool
    records = w.approvals()
    decisions = [(r["kind"], r["name"], r["decision"]) for r in records]
    for expected in [("tool", "fixture__delete_repo", "accepted"), ("tool", "fixture__drop_table", "accepted"),
                     ("tool", "fixture__delete_repo", "declined"),
                     ("tool", "fixture__delete_repo", "already_declined"),
                     ("tool", "fixture__delete_repo", "timed_out"),
                     ("egress", f"localhost:{w.port}", "accepted"), ("egress", f"localhost:{w.port}", "declined")]:
        assert expected in decisions, (expected, decisions)
    assert not any(r["name"] == "fixture__read_note" for r in records), decisions
    timed = next(r for r in records if r["decision"] == "timed_out")
    assert 1900 <= timed["wait_ms"] <= 4000, timed
    assert "fixture__delete_*" in records[0]["rule"], records[0]
    with open(w.audit) as f:
        assert MARK not in f.read()


TASKS = "io.modelcontextprotocol/tasks"


class TaskHandle(Result):
    result_type: Literal["task"]
    task_id: str
    status: str


class TaskRequest(Request[dict[str, Any], str]):
    name_param: ClassVar[str | None] = "taskId"


async def task_request(session, method, params):
    return await session.send_request(TaskRequest(method=method, params=params), TypeAdapter(dict))


class TasksAnsweringQuestions(ClientExtension):
    """The Tasks extension as a client with elicitation implements it: poll tasks/get;
    on input_required ask the user (the world's callback) and answer with tasks/update."""

    identifier = TASKS

    def __init__(self, w):
        self.w = w
        self.statuses = []

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle, ctx):
        answered = set()
        while True:
            task = await task_request(ctx.session, "tasks/get", {"taskId": handle.task_id})
            self.statuses.append(task["status"])
            if task["status"] == "completed":
                return CallToolResult.model_validate(task["result"])
            assert task["status"] in ("working", "input_required"), task
            for key, req in (task.get("inputRequests") or {}).items():
                if key in answered:
                    continue
                answered.add(key)
                assert req["method"] == "elicitation/create", req
                params = TypeAdapter(ElicitRequestParams).validate_python(req["params"])
                answer = await self.w.elicit(None, params)
                await task_request(ctx.session, "tasks/update", {
                    "taskId": handle.task_id,
                    "inputResponses": {key: answer.model_dump(by_alias=True, exclude_none=True)}})
            await anyio.sleep(0.1)


async def stateless_clients(w, report):
    """2026-07-28 clients: no server->client request can reach them; the question comes
    back in an input_required result (the SDK's driver asks the callback and calls
    again) or, in a task, as its input_required status answered with tasks/update."""
    async with Client(w.server(), elicitation_callback=w.elicit) as c:
        assert c.protocol_version == "2026-07-28", c.protocol_version
        await wait_ready(c)

        async def rounds_accepted():
            w.answer, before = "accept", len(w.questions)
            sc = await run(c, calling("fixture__delete_repo", {"name": "rounds-ok"}) + EGRESS.format(port=w.port))
            assert sc["stdout"] == "ok: deleted rounds-ok\necho\n", sc
            assert len(w.questions[before:]) == 2, w.questions[before:]
            assert "delete_repo rounds-ok" in w.upstream_calls()
        await report("a_2026_client_approves_through_input_required_results", rounds_accepted)

        async def rounds_declined():
            w.answer = "decline"
            sc = await run(c, calling("fixture__delete_repo", {"name": "rounds-no"}))
            assert sc["stdout"] == "ToolError -32007 approval declined by the user for fixture__delete_repo\n", sc
            assert not any("rounds-no" in line for line in w.upstream_calls())
        await report("a_2026_client_declines_through_input_required_results", rounds_declined)

        async def rounds_silent():
            # The user answers after the 2 s wait: the code already went on without it.
            w.answer = "silent"
            sc = await run(c, calling("fixture__delete_repo", {"name": "rounds-late"}))
            assert sc["stdout"] == "ToolError -32007 approval for fixture__delete_repo timed out after 2 s\n", sc
            assert not any("rounds-late" in line for line in w.upstream_calls())
            w.answer = "accept"
        await report("a_2026_question_unanswered_in_time_times_out", rounds_silent)

        async def forged_state():
            try:
                await c.session.call_tool("execute_python", {"code": "print(1)"}, request_state="00" * 16,
                                          input_responses={"q1": {"action": "accept", "content": {"approve": True}}},
                                          allow_input_required=True)
                raise AssertionError("a made-up requestState was accepted")
            except MCPError as e:
                assert e.error.code == -32602 and "requestState" in e.error.message, e.error
        await report("a_made_up_request_state_is_refused", forged_state)

    tasks = TasksAnsweringQuestions(w)
    async with Client(w.server(), elicitation_callback=w.elicit, extensions=[tasks]) as c:
        await wait_ready(c)

        async def task_accepted():
            w.answer, before = "accept", len(w.questions)
            sc = await run(c, calling("fixture__delete_repo", {"name": "task-ok"}))
            assert sc["stdout"] == "ok: deleted task-ok\n", sc
            assert len(w.questions[before:]) == 1, w.questions[before:]
            assert "input_required" in tasks.statuses, tasks.statuses
        await report("a_task_asks_through_its_input_required_status", task_accepted)

        async def task_declined():
            w.answer = "decline"
            sc = await run(c, calling("fixture__delete_repo", {"name": "task-no"}))
            assert sc["stdout"] == "ToolError -32007 approval declined by the user for fixture__delete_repo\n", sc
            assert not any("task-no" in line for line in w.upstream_calls())
            w.answer = "accept"
        await report("a_task_question_declined_with_tasks_update", task_declined)

    async with Client(w.server()) as c:
        async def no_callback():
            await wait_ready(c)
            sc = await run(c, calling("fixture__delete_repo", {"name": "stateless-fallback"}))
            assert "approval fallback is deny" in sc["stdout"], sc
            assert not any("stateless-fallback" in line for line in w.upstream_calls())
        await report("a_2026_client_without_elicitation_gets_the_fallback", no_callback)


async def without_callback(w, fallback):
    """A legacy client that declares no elicitation: the fallback decides."""
    async with Client(w.server(fallback), mode="legacy") as c:
        await wait_ready(c)
        return await run(c, calling("fixture__delete_repo", {"name": f"fallback-{fallback}"}))


async def main():
    passed = failed = 0
    w = World()
    try:
        async with Client(w.server(), mode="legacy", elicitation_callback=w.elicit) as c:
            for fn in CASES:
                try:
                    with anyio.fail_after(120):
                        await fn(c, w)
                    print(f"ok      {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure
                    print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                    failed += 1
        for fallback, expected in [
            ("deny", "ToolError -32007 fixture__delete_repo needs approval (require_approval rule "
                     "\"fixture__delete_*\"), but the client cannot ask the user (no elicitation "
                     "capability); approval fallback is deny\n"),
            ("allow", "ok: deleted fallback-allow\n"),
        ]:
            name = f"a_client_without_elicitation_gets_fallback_{fallback}"
            try:
                with anyio.fail_after(120):
                    sc = await without_callback(w, fallback)
                    assert sc["stdout"] == expected, sc
                    assert (f"delete_repo fallback-{fallback}" in w.upstream_calls()) == (fallback == "allow")
                    await anyio.sleep(0.5)
                    assert any(r["decision"] == f"fallback_{'denied' if fallback == 'deny' else 'allowed'}"
                               for r in w.approvals()), w.approvals()
                print(f"ok      {name}", flush=True)
                passed += 1
            except Exception as e:  # noqa: BLE001 - report every failure
                print(f"FAILED  {name}: {e!r}", flush=True)
                failed += 1
        counts = {"passed": 0, "failed": 0}

        async def report(name, fn):
            try:
                with anyio.fail_after(120):
                    await fn()
                print(f"ok      {name}", flush=True)
                counts["passed"] += 1
            except Exception as e:  # noqa: BLE001 - report every failure
                print(f"FAILED  {name}: {e!r}", flush=True)
                counts["failed"] += 1

        try:
            await stateless_clients(w, report)
        except Exception as e:  # noqa: BLE001 - a client that did not start
            print(f"FAILED  stateless_clients: {e!r}", flush=True)
            counts["failed"] += 1
        passed += counts["passed"]
        failed += counts["failed"]
    finally:
        w.close()
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
