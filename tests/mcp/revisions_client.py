"""Both MCP revisions codebox serves, side by side, through the official Python SDK:
a 2026-07-28 client (stateless: server/discover, no session) and a legacy 2025-11-25
client (initialize, Mcp-Session-Id).

Usage: revisions_client.py CODEBOX_BINARY
Over HTTP both talk to one server, each with its own bearer token (alice: 2026-07-28,
bob: 2025-11-25): executions and progress on both; PII tokens of the stateless client
stable and restored across separate requests; a codebox session continued across
requests and refused to the other client; kept output unreadable by the other client;
the per-request logLevel opt-in. Over stdio each revision gets a server of its own (one
process, one client). Servers listen on 127.0.0.1 and are stopped (SIGTERM, then
waited for) at the end. Prints "N passed, M failed".
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from helpers import DrainedStderr, server_env, stdio_params

CODEBOX = sys.argv[1]
SERVERS = []
TOKEN = re.compile(r"\[EMAIL_\d+\]")
SLOW = "import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.3)\n"


def start_http(extra_env):
    env = server_env()
    env.pop("CODEBOX_HTTP_TOKEN", None)
    env.update(extra_env)
    p = subprocess.Popen([CODEBOX, "serve", "--http", "127.0.0.1:0"], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    SERVERS.append(p)
    p.log = DrainedStderr(p)
    m = p.log.wait_for(r"serving MCP at http://[^:]+:(\d+)/mcp", 30)
    if not m:
        raise AssertionError(f"server did not start: {p.poll()}: {p.log.text()[-2000:]}")
    return f"http://127.0.0.1:{m.group(1)}/mcp"


def http_client(url, token, **kw):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120)
    return Client(streamable_http_client(url, http_client=http), **kw)


async def run(c, code, **more):
    r = await c.call_tool("execute_python", {"code": code, **more})
    return r, r.structured_content or {}


async def progress_of(c):
    seen = []

    async def on_progress(progress, total, message):
        seen.append(message)

    r = await c.call_tool("execute_python", {"code": SLOW}, progress_callback=on_progress)
    assert not r.is_error, r
    assert len(seen) >= 2 and any("tick" in (m or "") for m in seen), seen


async def both_revisions_run_code_with_progress(alice, bob):
    assert alice.protocol_version == "2026-07-28", alice.protocol_version
    assert bob.protocol_version == "2025-11-25", bob.protocol_version
    for c, who in [(alice, "alice"), (bob, "bob")]:
        r, sc = await run(c, f"print('{who}', 6 * 7)")
        assert not r.is_error and sc["stdout"] == f"{who} 42\n", sc
        await progress_of(c)
    names = [p.name for p in (await alice.list_prompts()).prompts]
    assert names == ["use_upstream_servers"], names
    got = await bob.get_prompt("use_upstream_servers", {"language": "python"})
    text = got.messages[0].content.text
    assert "execute_python" in text and "No upstream MCP servers are configured" in text, text


async def stateless_pii_tokens_last_across_requests(alice, bob):
    # Each call is a request of its own, answered by a fresh server value.
    _, first = await run(alice, "print('write to alice@example.com')", pii="output")
    token = TOKEN.search(first["stdout"]).group(0)
    _, second = await run(alice, "print('zed@example.org', 'alice@example.com')", pii="output")
    tokens = TOKEN.findall(second["stdout"])
    assert len(tokens) == 2 and tokens[1] == token and tokens[0] != token, (token, second["stdout"])
    # A token the model hands back is restored with alice's map, in a later request.
    r = await alice.call_tool("save_skill", {
        "name": "contact", "description": "who to write to", "language": "python",
        "code": f"def address():\n    return \"{token}\"\n"})
    assert not r.is_error, r
    probe = "from skills import contact\nprint(contact.address().split('@')[-1], len(contact.address()))"
    _, sc = await run(alice, probe)
    assert sc["stdout"] == "example.com 17\n", sc
    # bob's map does not know alice's token: his skill keeps it as written.
    r = await bob.call_tool("save_skill", {
        "name": "contact", "description": "who to write to", "language": "python",
        "code": f"def address():\n    return \"{token}\"\n"})
    assert not r.is_error, r
    _, sc = await run(bob, "from skills import contact\nprint(contact.address())")
    assert sc["stdout"] == f"{token}\n", sc


async def sessions_continue_across_requests_and_stay_their_clients(alice, bob):
    _, sc = await run(alice, "open('/workspace/note.txt', 'w').write('kept')", session="new")
    sid = sc["session"]["id"]
    _, sc = await run(alice, "print(open('/workspace/note.txt').read())", session=sid)
    assert sc["stdout"] == "kept\n", sc
    r, _ = await run(bob, "print(open('/workspace/note.txt').read())", session=sid)
    assert r.is_error, r
    # And the other way round: bob's (legacy) session is not alice's.
    _, sc = await run(bob, "print(1)", session="new")
    r, _ = await run(alice, "print(1)", session=sc["session"]["id"])
    assert r.is_error, r


async def kept_output_belongs_to_its_client(alice, bob):
    code = "for i in range(3000):\n    print(f'row {i:05d} ' + 'x' * 40)\n"
    for owner, other in [(alice, bob), (bob, alice)]:
        _, sc = await run(owner, code, output_budget=1000)
        uri = sc["output"]["stdout"]["resource"]
        read = await owner.read_resource(uri)
        assert "row 00000" in read.contents[0].text, read
        try:
            await other.read_resource(uri)
        except MCPError as e:
            assert "uri" in (e.error.data or {}), e.error
        else:
            raise AssertionError(f"{uri} was readable by the other client")


async def log_messages_follow_each_revisions_opt_in(url):
    for level, expect in [(None, False), ("info", True)]:
        got = []

        async def on_log(params):
            got.append(params)

        async with http_client(url, "alice-token", logging_callback=on_log, log_level=level) as c:
            r, _ = await run(c, "print(1)")
            assert not r.is_error, r
        assert bool(got) == expect, (level, got)


async def unauthenticated_loopback_is_one_client():
    """Without tokens a stateless caller is the one loopback client: its session and
    kept output are found again by its next requests, whichever connection they use."""
    url = start_http({"CODEBOX_POOL_SIZE": "0"})
    async with Client(url) as first, Client(url) as second:
        assert first.protocol_version == "2026-07-28", first.protocol_version
        _, sc = await run(first, "open('/workspace/n.txt', 'w').write('same client')", session="new")
        _, sc = await run(second, "print(open('/workspace/n.txt').read())", session=sc["session"]["id"])
        assert sc["stdout"] == "same client\n", sc


async def a_listen_stream_ends_cleanly_at_shutdown():
    """SIGTERM ends open subscriptions/listen streams with their final result: the
    server does not wait out its answers' bound for them, and logs no error."""
    url = start_http({"CODEBOX_POOL_SIZE": "0"})
    server = SERVERS[-1]
    async with Client(url) as c:
        async with c.listen(resources_list_changed=True) as sub:
            assert sub.honored.resources_list_changed, sub.honored
            server.send_signal(signal.SIGTERM)
            with anyio.fail_after(4):
                async for event in sub:
                    raise AssertionError(f"unexpected event {event!r}")
    started = time.monotonic()
    assert server.wait(timeout=30) == 0
    assert time.monotonic() - started < 4, "shutdown waited for the listen stream"
    assert "ERROR" not in server.log.text(), server.log.text()[-2000:]


async def over_http():
    tmp = tempfile.TemporaryDirectory(prefix="codebox-revisions-test-")
    os.chmod(tmp.name, 0o755)
    url = start_http({
        "CODEBOX_HTTP_CLIENTS": "alice=alice-token,bob=bob-token",
        "CODEBOX_PII": "output", "CODEBOX_POOL_SIZE": "1",
        "CODEBOX_SKILLS_DIR": os.path.join(tmp.name, "skills"),
    })
    passed = failed = 0
    async with http_client(url, "alice-token") as alice, \
            http_client(url, "bob-token", mode="legacy") as bob:
        for fn in [both_revisions_run_code_with_progress, stateless_pii_tokens_last_across_requests,
                   sessions_continue_across_requests_and_stay_their_clients,
                   kept_output_belongs_to_its_client]:
            try:
                with anyio.fail_after(120):
                    await fn(alice, bob)
                print(f"ok      http: {fn.__name__}", flush=True)
                passed += 1
            except Exception as e:  # noqa: BLE001 - report every failure
                print(f"FAILED  http: {fn.__name__}: {e!r}", flush=True)
                failed += 1
    try:
        with anyio.fail_after(120):
            await unauthenticated_loopback_is_one_client()
        print("ok      http: unauthenticated_loopback_is_one_client", flush=True)
        passed += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAILED  http: unauthenticated_loopback_is_one_client: {e!r}", flush=True)
        failed += 1
    try:
        with anyio.fail_after(120):
            await a_listen_stream_ends_cleanly_at_shutdown()
        print("ok      http: a_listen_stream_ends_cleanly_at_shutdown", flush=True)
        passed += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAILED  http: a_listen_stream_ends_cleanly_at_shutdown: {e!r}", flush=True)
        failed += 1
    try:
        with anyio.fail_after(120):
            await log_messages_follow_each_revisions_opt_in(url)
        print("ok      http: log_messages_follow_each_revisions_opt_in", flush=True)
        passed += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAILED  http: log_messages_follow_each_revisions_opt_in: {e!r}", flush=True)
        failed += 1
    return passed, failed, tmp


async def a_listener_hears_the_catalog_change(tmpdir):
    """A 2026-07-28 client's `subscriptions/listen` stream carries resources/list_changed
    when an upstream server that starts slowly becomes ready (its wrappers are
    resources); the prompt then lists it."""
    hostile = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "upstream",
                           "hostile_server.py")
    config = os.path.join(tmpdir, "slow.mcp.json")
    with open(config, "w") as f:
        json.dump({"mcpServers": {"slow": {"command": "/usr/bin/python3", "args": [hostile],
                                           "env": {"HOSTILE_DELAY_S": "3"}}}}, f)
    params = stdio_params(CODEBOX)
    params.args = ["serve", "--mcp-config", config]
    async with Client(params) as c:
        assert c.protocol_version == "2026-07-28", c.protocol_version
        async with c.listen(resources_list_changed=True, tools_list_changed=True) as sub:
            assert sub.honored.resources_list_changed and not sub.honored.tools_list_changed, sub.honored
            with anyio.fail_after(30):
                event = await sub.__anext__()
            assert "resources" in repr(event).lower(), event
        got = await c.get_prompt("use_upstream_servers", {"server": "slow"})
        text = got.messages[0].content.text
        assert "- slow (ready): 8 tools" in text and "Tools of slow (8):" in text, text


async def over_stdio(tmpdir):
    passed = failed = 0
    try:
        with anyio.fail_after(120):
            await a_listener_hears_the_catalog_change(tmpdir)
        print("ok      stdio: a_listener_hears_the_catalog_change", flush=True)
        passed += 1
    except Exception as e:  # noqa: BLE001
        print(f"FAILED  stdio: a_listener_hears_the_catalog_change: {e!r}", flush=True)
        failed += 1
    for mode, version in [("auto", "2026-07-28"), ("legacy", "2025-11-25")]:
        name = f"stdio {version}: code, progress, stable PII tokens"
        try:
            with anyio.fail_after(120):
                async with Client(stdio_params(CODEBOX), mode=mode) as c:
                    assert c.protocol_version == version, c.protocol_version
                    await progress_of(c)
                    _, a = await run(c, "print('a@example.com')", pii="output")
                    _, b = await run(c, "print('b@example.com', 'a@example.com')", pii="output")
                    first = TOKEN.search(a["stdout"]).group(0)
                    later = TOKEN.findall(b["stdout"])
                    assert later[1] == first and later[0] != first, (a, b)
            print(f"ok      {name}", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAILED  {name}: {e!r}", flush=True)
            failed += 1
    return passed, failed


async def main():
    tmp = None
    try:
        p1, f1, tmp = await over_http()
        p2, f2 = await over_stdio(tmp.name)
        passed, failed = p1 + p2, f1 + f2
    finally:
        for p in SERVERS:
            p.send_signal(signal.SIGTERM)
        for p in SERVERS:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if tmp:
            tmp.cleanup()
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
