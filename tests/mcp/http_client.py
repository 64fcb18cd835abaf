"""`codebox serve --http` with the official Python MCP SDK's streamable HTTP client, plus
raw HTTP checks of /healthz, Origin validation (403) and bearer auth (401).

Usage: http_client.py CODEBOX_BINARY
Every server is started on an ephemeral port, reached only through 127.0.0.1, and
stopped with SIGTERM at the end. Prints "N passed, M failed".
"""

import base64
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import anyio
import httpx2
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.client.streamable_http import streamable_http_client

from helpers import DrainedStderr, server_env

CODEBOX = sys.argv[1]
SERVERS = []
INIT = json.dumps({
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "1"}},
}).encode()


def start(*args, token=None, extra_env=None):
    env = server_env()
    env.pop("CODEBOX_HTTP_TOKEN", None)
    if token:
        env["CODEBOX_HTTP_TOKEN"] = token
    env.update(extra_env or {})
    p = subprocess.Popen([CODEBOX, "serve", *args], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    SERVERS.append(p)
    p.log = DrainedStderr(p)
    m = p.log.wait_for(r"serving MCP at http://[^:]+:(\d+)/mcp", 30)
    if m:
        return p, f"http://127.0.0.1:{m.group(1)}"
    raise AssertionError(f"server did not start: {p.poll()}: {p.log.text()[-2000:]}")


def raw(url, data=None, headers=None):
    req = urllib.request.Request(url, data=data, headers={
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **(headers or {}),
    }, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


async def sdk_session_runs_code(base):
    async with streamable_http_client(f"{base}/mcp") as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            names = sorted(t.name for t in (await s.list_tools()).tools)
            assert names == ["close_session", "delete_skill", "execute_python", "execute_typescript", "get_skill", "get_tool", "health", "list_servers", "list_skills", "save_skill", "search_tools"], names
            r = await s.call_tool("execute_python", {"code": "print('over http', 6 * 7)"})
            assert r.structured_content["stdout"] == "over http 42\n", r
            r = await s.call_tool("execute_typescript", {"code": "console.log([1,2].length)"})
            assert r.structured_content["stdout"] == "2\n", r
            seen = []

            async def on_progress(progress, total, message):
                seen.append(message)

            r = await s.call_tool(
                "execute_python",
                {"code": "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.3)"},
                progress_callback=on_progress,
            )
            assert not r.is_error and len(seen) >= 2, seen


class Warnings(logging.Handler):
    """Collects the SDK's warnings (a failed session termination is one)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = []

    def emit(self, record):
        self.seen.append(record.getMessage())


SDK_WARNINGS = Warnings()
logging.getLogger("mcp").addHandler(SDK_WARNINGS)


def rpc(url, body, token, session=None, method="POST"):
    """One raw request; returns (status, headers, body bytes)."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25", "Authorization": f"Bearer {token}"}
    if session:
        headers["Mcp-Session-Id"] = session
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def call_body(id, code, **more):
    return json.dumps({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                       "params": {"name": "execute_python", "arguments": {"code": code, **more}}}).encode()


async def sessions_belong_to_their_client(base):
    """alice's Mcp-Session-Id is unknown to bob: no calls, no vault, no GET, no DELETE."""
    url = f"{base}/mcp"
    ids = []

    async def seen(response):
        if response.headers.get("mcp-session-id"):
            ids.append(response.headers["mcp-session-id"])

    alice = httpx2.AsyncClient(headers={"Authorization": "Bearer alice-token"},
                               event_hooks={"response": [seen]})
    async with streamable_http_client(url, http_client=alice) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            sid = ids[0] if ids else None
            assert sid, "no session id"
            r = await s.call_tool("execute_python", {"code": "print('write to alice@example.com')"})
            out = r.structured_content["stdout"]
            assert "alice@example.com" not in out, out
            token = re.search(r"\[[A-Z_]+_\d+\]|<[A-Z_]+_\d+>|\{\{[^}]+\}\}|[A-Z]+_[0-9a-f]{4,}", out)
            # bob, with alice's session id: every method is told the session does not exist.
            unknown = rpc(url, INIT, "bob-token", session="no-such-session")
            assert unknown[0] == 404, unknown
            for method, body in [("POST", call_body(7, "print('bob runs')")),
                                 ("POST", call_body(8, f"print({out!r})", pii="output")),
                                 ("GET", None), ("DELETE", None)]:
                status, _, raw_body = rpc(url, body, "bob-token", session=sid, method=method)
                assert (status, raw_body) == (unknown[0], unknown[2]), (method, status, raw_body[:200])
            # bob's own session works, and alice's still does after bob's attempts.
            status, headers, _ = rpc(url, INIT, "bob-token")
            bob_sid = headers["mcp-session-id"]
            assert status == 200 and bob_sid != sid
            rpc(url, b'{"jsonrpc":"2.0","method":"notifications/initialized"}', "bob-token", bob_sid)
            status, _, raw_body = rpc(url, call_body(9, "print('bob own')"), "bob-token", bob_sid)
            assert status == 200 and b"bob own" in raw_body, raw_body[:300]
            # bob's SDK client presenting alice's session id is refused at once.
            bob = httpx2.AsyncClient(headers={"Authorization": "Bearer bob-token", "Mcp-Session-Id": sid})
            refused = None
            try:
                with anyio.fail_after(20):
                    async with streamable_http_client(url, http_client=bob) as (bread, bwrite):
                        async with ClientSession(bread, bwrite) as bs:
                            await bs.initialize()
                            await bs.call_tool("execute_python", {"code": "print('bob on alice')"})
            except TimeoutError:
                raise AssertionError("the SDK hung instead of being refused")
            except Exception as e:  # noqa: BLE001 - the SDK's own error type for a 404
                refused = e
            assert refused is not None, "bob ran on alice's session"
            assert "not found" in repr(refused).lower(), repr(refused)
            # alice cannot use bob's session either.
            status, _, _ = rpc(url, call_body(10, "print(1)"), "alice-token", bob_sid)
            assert status == 404, status
            r = await s.call_tool("execute_python", {"code": "print('alice still here')"})
            assert r.structured_content["stdout"] == "alice still here\n", r
            assert token is None or token.group(0) in out
    # The SDK ended alice's session with DELETE and logged no failure.
    assert not [w for w in SDK_WARNINGS.seen if "termination" in w], SDK_WARNINGS.seen
    status, _, _ = rpc(url, call_body(11, "print(1)"), "alice-token", sid)
    assert status == 404, status


def sessions_per_client_are_capped(base):
    """One token holds at most 128 sessions: the next initialize gets 429 (a JSON-RPC
    error), other clients are not affected, and ending a session makes room."""
    url = f"{base}/mcp"
    opened = []
    refused = None
    for _ in range(200):
        status, headers, body = rpc(url, INIT, "bob-token")
        if status != 200:
            refused = (status, body)
            break
        opened.append(headers["mcp-session-id"])
    try:
        assert refused is not None, f"{len(opened)} sessions opened without a cap"
        assert len(opened) <= 128, len(opened)
        status, body = refused
        error = json.loads(body)["error"]
        assert status == 429 and "128 MCP sessions" in error["message"], (status, body)
        status, _, _ = rpc(url, INIT, "alice-token")
        assert status == 200, status
        status, _, _ = rpc(url, None, "bob-token", opened.pop(), method="DELETE")
        assert status == 200, status
        status, headers, _ = rpc(url, INIT, "bob-token")
        assert status == 200, status
        opened.append(headers["mcp-session-id"])
    finally:
        for sid in opened:
            rpc(url, None, "bob-token", sid, method="DELETE")
    status, _, _ = rpc(url, INIT, "bob-token")
    assert status == 200, status


async def large_outputs_fit_the_sdk(base):
    """600 kB and 5 MB of output: the SDK accepts the result (it refuses events over 1 MiB)."""
    async with streamable_http_client(f"{base}/mcp") as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            seen = []

            async def on_progress(progress, total, message):
                seen.append(len(message or ""))

            for size in (600_000, 5_000_000):
                r = await s.call_tool(
                    "execute_python",
                    {"code": f"import sys; sys.stdout.write('x' * {size} + 'END')"},
                    progress_callback=on_progress)
                sc = r.structured_content
                out = sc["stdout"]
                # The output budget: head, marker, end.
                assert out.startswith("xxxx") and out.endswith("END") and len(out) < 21_000, len(out)
                assert "left out here" in out and out in r.content[0].text
                assert sc["stdout_truncated"] == (size > 1 << 20), sc
            assert seen and max(seen) <= 256 * 1024, max(seen)
            # A budget whose characters escape long (a control byte is 6 bytes of JSON)
            # is cut again to fit the SDK's 1 MiB.
            r = await s.call_tool(
                "execute_python",
                {"code": "import sys; sys.stdout.write(chr(1) * 600_000 + 'END')",
                 "output_budget": 200_000})
            sc = r.structured_content
            assert "cut here" in sc["stdout"] and "cut here" in r.content[0].text
            assert sc["wire_truncated"]["stdout_bytes_cut"] > 0, sc.get("wire_truncated")
            # Resources are not cut: one that fits is served whole, a larger one is refused
            # with an error the SDK can read (never an event it rejects).
            r = await s.call_tool("execute_python", {"session": "new", "code": (
                "open('/workspace/fits.txt', 'w').write('f' * 700_000)\n"
                "open('/workspace/big.txt', 'w').write('b' * 2_000_000)\n"
                "open('/workspace/escapes.txt', 'w').write(chr(1) * 300_000)\n")})
            sid = r.structured_content["session"]["id"]
            res = await s.read_resource(f"codebox://sessions/{sid}/workspace/fits.txt")
            assert len(res.contents[0].text) == 700_000
            # Text that escapes past one message is refused; a file larger than one
            # message comes as base64 blob pages, each within it.
            try:
                await s.read_resource(f"codebox://sessions/{sid}/workspace/escapes.txt")
                raise AssertionError("escapes.txt was served")
            except MCPError as e:
                assert "read it from code" in str(e), str(e)
            got = b""
            for page in (1, 2, 3, 4):
                res = await s.read_resource(f"codebox://sessions/{sid}/workspace/big.txt?page={page}")
                got += base64.b64decode(res.contents[0].blob)
            assert got == b"b" * 2_000_000, len(got)
            try:
                await s.read_resource(f"codebox://sessions/{sid}/workspace/big.txt?page=5")
                raise AssertionError("a fifth page was served")
            except MCPError as e:
                assert "there are 4 pages" in str(e), str(e)


async def main():
    passed = failed = 0

    def report(name, fn):
        nonlocal passed, failed
        try:
            fn()
            print(f"ok      {name}", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  {name}: {e!r}", flush=True)
            failed += 1

    try:
        _, base = start("--http", "127.0.0.1:0")
        report("healthz_without_auth", lambda: (lambda s: None if s == 200 else (_ for _ in ()).throw(AssertionError(s)))(raw(f"{base}/healthz")))
        def bad_origin():
            s = raw(f"{base}/mcp", INIT, {"Origin": "http://evil.example"})
            assert s == 403, s
            s = raw(f"{base}/mcp", INIT, {"Origin": "http://localhost:1234"})
            assert s == 200, s
        report("foreign_origin_gets_403", bad_origin)
        try:
            await sdk_session_runs_code(base)
            print("ok      sdk_session_over_http", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  sdk_session_over_http: {e!r}", flush=True)
            failed += 1

        try:
            await large_outputs_fit_the_sdk(base)
            print("ok      large_outputs_fit_the_sdk", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  large_outputs_fit_the_sdk: {e!r}", flush=True)
            failed += 1

        def http_without_address_takes_the_config():
            _, b = start("--http", extra_env={"CODEBOX_HTTP_ADDR": "127.0.0.1:0"})
            assert not b.endswith(":8080") and raw(f"{b}/healthz") == 200, b
        report("http_without_address_takes_the_config", http_without_address_takes_the_config)

        _, two = start("--http", "127.0.0.1:0", extra_env={
            "CODEBOX_HTTP_CLIENTS": "alice=alice-token,bob=bob-token", "CODEBOX_PII": "output"})
        try:
            await sessions_belong_to_their_client(two)
            print("ok      sessions_belong_to_their_client", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  sessions_belong_to_their_client: {e!r}", flush=True)
            failed += 1

        report("sessions_per_client_are_capped", lambda: sessions_per_client_are_capped(two))

        # A listener that is not on loopback: 0.0.0.0, reached through 127.0.0.1.
        def no_token_no_start():
            env = server_env()
            env.pop("CODEBOX_HTTP_TOKEN", None)
            r = subprocess.run([CODEBOX, "serve", "--http", "0.0.0.0:0"], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
            assert r.returncode != 0 and "bearer token is required" in r.stderr, r.stderr
        report("non_loopback_without_token_refuses_to_start", no_token_no_start)

        _, secured = start("--http", "0.0.0.0:0", token="s3cret-token")
        def auth():
            assert raw(f"{secured}/healthz") == 200
            assert raw(f"{secured}/mcp", INIT) == 401
            assert raw(f"{secured}/mcp", INIT, {"Authorization": "Bearer wrong"}) == 401
            assert raw(f"{secured}/mcp", INIT, {"Authorization": "Bearer s3cret-token"}) == 200
        report("bearer_token_required_off_loopback", auth)
        try:
            client = httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret-token"})
            async with streamable_http_client(f"{secured}/mcp", http_client=client) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    r = await s.call_tool("execute_python", {"code": "print('authed')"})
                    assert r.structured_content["stdout"] == "authed\n", r
            print("ok      sdk_session_with_token", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  sdk_session_with_token: {e!r}", flush=True)
            failed += 1

        try:
            drained_proc, drained = start("--http", "127.0.0.1:0", "--drain-timeout", "5s")
            async with streamable_http_client(f"{drained}/mcp", terminate_on_close=False) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    # The SDK lists the tools after a result unless it has their schemas:
                    # that request would meet a server that has stopped by then.
                    await s.list_tools()
                    results = []
                    running = anyio.Event()

                    async def on_progress(progress, total, message):
                        running.set()

                    async def long_call():
                        results.append(await s.call_tool(
                            "execute_python",
                            {"code": "import time; print('started', flush=True); time.sleep(1.2); print('finished')"},
                            progress_callback=on_progress))

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(long_call)
                        # SIGTERM once the program runs (its first output arrived).
                        with anyio.fail_after(30):
                            await running.wait()
                        drained_proc.send_signal(signal.SIGTERM)
                    assert results[0].structured_content["stdout"] == "started\nfinished\n", results
            assert drained_proc.wait(timeout=15) == 0
            print("ok      sigterm_drains_running_executions", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  sigterm_drains_running_executions: {e!r}", flush=True)
            failed += 1

        try:
            bound_proc, bound = start("--http", "127.0.0.1:0", "--drain-timeout", "1s",
                                      "--pool-size", "1")
            async with streamable_http_client(f"{bound}/mcp", terminate_on_close=False) as (read, write):
                async with ClientSession(read, write) as s:
                    await s.initialize()
                    await s.list_tools()  # see sigterm_drains_running_executions
                    results = []
                    running = anyio.Event()

                    async def on_progress(progress, total, message):
                        running.set()

                    async def spinning_call():
                        results.append(await s.call_tool(
                            "execute_python",
                            {"code": "print('spinning', flush=True)\nwhile True: pass",
                             "timeout_ms": 300000},
                            progress_callback=on_progress))

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(spinning_call)
                        with anyio.fail_after(30):
                            await running.wait()
                        bound_proc.send_signal(signal.SIGTERM)
                    r = results[0]
                    assert r.is_error, r
                    assert "server is stopping" in r.content[0].text, r
            assert bound_proc.wait(timeout=20) == 0
            log = bound_proc.log.text(wait_for_end=10)
            assert not [l for l in log.splitlines() if "ERROR" in l], log
            print("ok      sigterm_kills_at_the_drain_bound_and_answers", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  sigterm_kills_at_the_drain_bound_and_answers: {e!r}", flush=True)
            failed += 1

        def sigterm_stops_cleanly():
            live = [p for p in SERVERS if p.poll() is None]
            for p in live:
                p.send_signal(signal.SIGTERM)
            for p in live:
                code = p.wait(timeout=15)
                assert code == 0, code
        report("sigterm_stops_cleanly", sigterm_stops_cleanly)
    finally:
        for p in SERVERS:
            if p.poll() is None:
                p.kill()
                p.wait()
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
