"""Three `codebox serve --http --replica NAME` behind Debian's HAProxy, configured with
deploy/haproxy/codebox.cfg exactly as the README says, driven by the official Python SDK.
HAProxy sends a PROXY protocol v2 header on every connection (send-proxy-v2), which the
replicas require from its address (127.0.0.1, trusted_proxies) and refuse from anyone
else: this script's own connections to the replicas come from 127.0.0.9, and Prometheus
scrapes their plain metrics listeners.

Usage: replicas_client.py CODEBOX_BINARY HAPROXY_CONFIG
(needs /usr/sbin/haproxy and /usr/bin/prometheus)

- 300 sessionless executions (a 2026-07-28 client, 6 at a time) spread over all three
  replicas (each answer names its replica in `Codebox-Replica`), and Debian's Prometheus,
  scraping each replica's /metrics, counts the same per replica;
- sessions made through the balancer stay on their replica for 20 calls each: a
  2026-07-28 client's (routed by `Mcp-Param-Session`, which the SDK mirrors from the
  annotated `session` argument) and a 2025-11-25 client's (routed by `Mcp-Session-Id`);
- skills saved through one replica are read by the others at once (a shared directory);
- one replica killed (SIGKILL): only its sessions fail, with an error naming it, for
  both revisions; the other sessions go on; new work flows to the others;
- another replica sent SIGTERM: `/readyz` says draining (503, no token needed), new work
  goes to the last one, a running execution finishes, one that would outlive the drain
  bound is answered "stopping", and the process exits within the bound.

Every process (replicas, HAProxy) is started here and stopped by pid at the end.
Prints figures and "N passed, M failed".
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from helpers import DrainedStderr, server_env
from tasks_client import POLLED, Tasks

CODEBOX = sys.argv[1]
HAPROXY_CONFIG = sys.argv[2]
HAPROXY = "/usr/sbin/haproxy"
PROMETHEUS = "/usr/bin/prometheus"
TOKEN = "replica-test-token"
NAMES = ["codebox-0", "codebox-1", "codebox-2"]
DRAIN_S = 4
# What codebox adds to --drain-timeout before it exits (killed executions answered,
# answers written, the listener closed): src/cli/serve/mod.rs and src/server/transport/http.rs.
DRAIN_EXTRA_S = 12
PROCS = []
# This script's source address: the replicas trust HAProxy's (127.0.0.1) only.
DIRECT = "127.0.0.9"


def direct_client(**kw):
    return httpx2.AsyncClient(transport=httpx2.AsyncHTTPTransport(local_address=DIRECT), **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replica(name, skills):
    env = server_env()
    env.update({
        "CODEBOX_HTTP_TOKEN": TOKEN,
        "CODEBOX_POOL_SIZE": "1",
        "CODEBOX_SKILLS_DIR": skills,
        "CODEBOX_HTTP_TRUSTED_PROXIES": "127.0.0.1",
    })
    p = subprocess.Popen(
        [CODEBOX, "serve", "--http", "127.0.0.1:0", "--replica", name,
         "--metrics", "127.0.0.1:0", "--drain-timeout", f"{DRAIN_S}s"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    PROCS.append(p)
    p.log = DrainedStderr(p)
    m = p.log.wait_for(r"serving MCP at http://[^:]+:(\d+)/mcp", 60)
    if not m:
        raise AssertionError(f"{name} did not start: {p.poll()}: {p.log.text()[-2000:]}")
    p.name = name
    p.base = f"http://127.0.0.1:{m.group(1)}"
    m = p.log.wait_for(r"serving metrics at http://([^/]+)/metrics", 60)
    assert m, p.log.text()[-2000:]
    p.metrics = m.group(1)
    return p


def start_haproxy(replicas):
    port = free_port()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "CODEBOX_LB_BIND": f"127.0.0.1:{port}"}
    for i, r in enumerate(replicas):
        env[f"CODEBOX_{i}"] = r.base.removeprefix("http://")
    # -db: stay in the foreground; HAProxy's own checks decide who is up.
    p = subprocess.Popen([HAPROXY, "-db", "-f", HAPROXY_CONFIG], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    PROCS.append(p)
    p.log = DrainedStderr(p)
    p.url = f"http://127.0.0.1:{port}/mcp"
    return p


def start_prometheus(replicas, tmp):
    """Debian's Prometheus scraping every replica's plain metrics listener each second."""
    web = free_port()
    targets = ", ".join(f"'{r.metrics}'" for r in replicas)
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: codebox\n"
                f"    static_configs:\n      - targets: [{targets}]\n")
    p = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                          f"--storage.tsdb.path={os.path.join(tmp, 'prometheus-data')}",
                          f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    PROCS.append(p)
    p.log = DrainedStderr(p)
    p.api = f"http://127.0.0.1:{web}/api/v1/query"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx2.get(f"http://127.0.0.1:{web}/-/ready", timeout=2).status_code == 200:
                return p
        except httpx2.HTTPError:
            pass
        assert time.monotonic() < deadline, p.log.text()[-2000:]
        time.sleep(0.2)


def readyz(base, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx2.Client(transport=httpx2.HTTPTransport(local_address=DIRECT), timeout=5) as c:
        r = c.get(f"{base}/readyz", headers=headers)
    return r.status_code, r.json()


def wait_ready(replicas):
    deadline = time.monotonic() + 120
    for r in replicas:
        while readyz(r.base)[0] != 200:
            assert time.monotonic() < deadline, f"{r.name} never ready: {r.log.text()[-2000:]}"
            time.sleep(0.2)
    # HAProxy marks a server up after `rise 2` checks `inter 1s` apart.
    time.sleep(2.5)


class Seen:
    """Which replica answered each tools/call, and the routing headers it was sent with."""

    def __init__(self):
        self.calls = []

    async def on_response(self, response):
        request = response.request
        try:
            method = json.loads(request.content).get("method")
        except (ValueError, AttributeError):
            method = None
        if method == "tools/call":
            self.calls.append({
                "replica": response.headers.get("codebox-replica"),
                "param_session": request.headers.get("mcp-param-session"),
                "mcp_session": request.headers.get("mcp-session-id"),
            })


def client(url, seen, **kw):
    http = direct_client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120,
                         event_hooks={"response": [seen.on_response]})
    return Client(streamable_http_client(url, http_client=http), **kw)


async def run(c, code, **more):
    r = await c.call_tool("execute_python", {"code": code, **more})
    return r, r.structured_content or {}


def text_of(r):
    return " ".join(getattr(b, "text", "") for b in r.content)


COUNT = "import os\nwith open('/workspace/n', 'a') as f:\n    f.write('x')\nprint(len(open('/workspace/n').read()))"


async def sessionless_spread(lb):
    seen = Seen()
    started = time.monotonic()
    async with client(lb.url, seen) as c:
        await c.list_tools()
        failures = []

        async def worker(n):
            for _ in range(n):
                r, sc = await run(c, "print(6 * 7)")
                if r.is_error or sc.get("stdout") != "42\n":
                    failures.append(text_of(r))

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(worker, 50)
    took = time.monotonic() - started
    assert not failures, failures[:3]
    by = Counter(call["replica"] for call in seen.calls)
    assert sum(by.values()) == 300, by
    assert set(by) == set(NAMES) and min(by.values()) >= 30, by
    print(f"        300 sessionless executions in {took:.1f} s: " +
          ", ".join(f"{n} {by[n]}" for n in NAMES), flush=True)
    return by


async def prometheus_counts_what_each_replica_ran(prometheus, replicas, by):
    """Prometheus, scraping every replica, counts exactly the executions each answered."""
    port_of = {r.metrics: r.name for r in replicas}
    query = 'sum by (instance) (codebox_executions_total{language="python",outcome="ok"})'
    deadline = time.monotonic() + 60
    while True:
        r = httpx2.get(prometheus.api, params={"query": query}, timeout=10).json()
        seen = {port_of[x["metric"]["instance"]]: int(float(x["value"][1]))
                for x in r["data"]["result"]}
        if seen == dict(by):
            break
        assert time.monotonic() < deadline, (seen, dict(by))
        await anyio.sleep(0.5)
    up = httpx2.get(prometheus.api, params={"query": "sum(up{job='codebox'})"}, timeout=10).json()
    assert up["data"]["result"][0]["value"][1] == "3", up
    print(f"        Prometheus: {seen} executions by replica, as their answers said", flush=True)


async def sessions_stay_on_their_replica(lb, state):
    """A 2026-07-28 client's sessions (Mcp-Param-Session) and a legacy client's."""
    seen = Seen()
    sessions = []
    async with client(lb.url, seen) as c:
        await c.list_tools()
        for _ in range(6):
            r, sc = await run(c, COUNT, session="new")
            assert not r.is_error and sc["stdout"] == "1\n", text_of(r)
            sessions.append(sc["session"]["id"])
        for sid in sessions:
            for i in range(2, 21):
                r, sc = await run(c, COUNT, session=sid)
                assert not r.is_error and sc["stdout"] == f"{i}\n", (sid, text_of(r))
    owners = Counter(sid.split(".")[0] for sid in sessions)
    assert set(owners) <= set(NAMES) and len(owners) >= 2, owners
    for call in seen.calls:
        if call["param_session"] not in (None, "new"):
            assert call["replica"] == call["param_session"].split(".")[0], call
    routed = [c for c in seen.calls if c["param_session"] not in (None, "new")]
    assert len(routed) == 6 * 19, len(routed)
    state["sessions"] = sessions

    legacy_seen = Seen()
    async with client(lb.url, legacy_seen, mode="legacy") as c:
        assert c.protocol_version == "2025-11-25", c.protocol_version
        r, sc = await run(c, COUNT, session="new")
        assert not r.is_error, text_of(r)
        sid = sc["session"]["id"]
        for i in range(2, 21):
            r, sc = await run(c, COUNT, session=sid)
            assert not r.is_error and sc["stdout"] == f"{i}\n", text_of(r)
    replicas = {call["replica"] for call in legacy_seen.calls}
    mcp_ids = {call["mcp_session"] for call in legacy_seen.calls}
    assert len(mcp_ids) == 1 and len(replicas) == 1, (mcp_ids, replicas)
    (mcp_id,), (replica,) = mcp_ids, replicas
    assert mcp_id.startswith(replica + ".") and sid.startswith(replica + "."), (mcp_id, sid, replica)
    print(f"        sessions by replica: {dict(owners)}; the legacy client's MCP session "
          f"{mcp_id.split('.')[0]}.…, 20 calls on {replica}", flush=True)


async def the_session_header_must_agree_with_the_body(lb):
    """What the balancer routes on is what the replica reads: a 2026-07-28 call whose
    Mcp-Param-Session is missing or names another session is refused (400, -32020)."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28",
               "Mcp-Method": "tools/call", "Mcp-Name": "execute_python"}
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "execute_python", "arguments": {"code": "print(1)", "session": "new"}, "_meta": meta}}
    async with direct_client(timeout=30) as raw:
        for header in [None, "codebox-1.cbx_00", "new, codebox-1.cbx_00"]:
            h = dict(headers)
            if header is not None:
                h["Mcp-Param-Session"] = header
            r = await raw.post(lb.url, headers=h, json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == -32020, (header, r.status_code, r.text)


async def tasks_and_kept_outputs_stay_on_their_replica(lb):
    """A 2026-07-28 client's task (polled with tasks/get) and an execution's kept output
    (resources/read of codebox://executions/<id>/stdout) live in the process that ran
    them: their ids name it, and the balancer routes on Mcp-Name. Ten of each, so that a
    balancer sending them anywhere would fail one with near certainty."""
    seen = Seen()
    async with client(lb.url, seen) as c:
        await c.list_tools()
        for _ in range(10):
            r, sc = await run(c, "print('x' * 40000)", output_budget=2000)
            assert not r.is_error, text_of(r)
            uri = sc["output"]["stdout"]["resource"]
            replica = seen.calls[-1]["replica"]
            assert uri.startswith(f"codebox://executions/{replica}."), (uri, replica)
            read = await c.read_resource(uri)
            assert "x" * 1000 in read.contents[0].text, uri
    POLLED.clear()
    async with client(lb.url, seen, extensions=[Tasks()]) as c:
        for i in range(10):
            r = await c.call_tool("execute_python", {"code": f"print({i} * 7)"})
            assert not r.is_error and r.structured_content["stdout"] == f"{i * 7}\n", text_of(r)
    ids = {t["taskId"] for t in POLLED}
    assert len(ids) == 10 and all(i.split(".")[0] in NAMES for i in ids), ids
    print(f"        10 kept outputs and 10 tasks read back through the balancer "
          f"(tasks on {dict(Counter(i.split('.')[0] for i in ids))})", flush=True)


async def skills_are_shared(replicas):
    seen = Seen()
    async with client(replicas[0].base + "/mcp", seen) as c:
        r = await c.call_tool("save_skill", {
            "name": "triple", "description": "Triples a number", "language": "python",
            "code": "def triple(x):\n    return 3 * x\n"})
        assert not r.is_error, text_of(r)
    for other in replicas[1:]:
        async with client(other.base + "/mcp", seen) as c:
            r = await c.call_tool("get_skill", {"name": "triple"})
            assert not r.is_error and "3 * x" in json.dumps(r.structured_content), text_of(r)
            r, sc = await run(c, "from skills import triple\nprint(triple.triple(14))")
            assert not r.is_error and sc["stdout"] == "42\n", text_of(r)


async def a_killed_replica_fails_only_its_sessions(lb, replicas, state):
    victim = replicas[1]
    sessions = state["sessions"]
    mine = [s for s in sessions if s.startswith(victim.name + ".")]
    others = [s for s in sessions if not s.startswith(victim.name + ".")]
    if not mine:
        # Make one on the victim directly, so its loss is observable.
        async with client(victim.base + "/mcp", Seen()) as c:
            _, sc = await run(c, COUNT, session="new")
            mine = [sc["session"]["id"]]
    # And a legacy client whose MCP session lives there.
    legacy_id = None
    async with direct_client(timeout=30) as raw:
        init = await raw.post(victim.base + "/mcp", headers=legacy_headers(), json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}})
        legacy_id = init.headers["mcp-session-id"]
        assert legacy_id.startswith(victim.name + "."), legacy_id
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    killed_at = time.monotonic()

    seen = Seen()
    async with client(lb.url, seen) as c:
        await c.list_tools()
        # New work flows to the others at once (a refused connection is redispatched).
        for _ in range(30):
            r, sc = await run(c, "print(1)")
            assert not r.is_error and sc["stdout"] == "1\n", text_of(r)
        assert {call["replica"] for call in seen.calls} <= set(NAMES) - {victim.name}, seen.calls
        for sid in mine:
            r, _ = await run(c, "print(1)", session=sid)
            text = text_of(r)
            assert r.is_error and f'"{victim.name}"' in text and "start a new one" in text, text
        for sid in others:
            r, sc = await run(c, COUNT, session=sid)
            assert not r.is_error and sc["stdout"] == "21\n", (sid, text_of(r))
    async with direct_client(timeout=30) as raw:
        gone = await raw.post(lb.url, headers=legacy_headers(legacy_id), json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert gone.status_code == 404, (gone.status_code, gone.text)
        assert victim.name in gone.json()["error"]["message"], gone.text
    print(f"        {victim.name} killed: {len(mine)} of its sessions answered with its name, "
          f"{len(others)} others went on, 30 new executions on the rest "
          f"({time.monotonic() - killed_at:.1f} s)", flush=True)


def legacy_headers(session=None):
    h = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
         "Content-Type": "application/json", "MCP-Protocol-Version": "2025-11-25"}
    if session:
        h["Mcp-Session-Id"] = session
    return h


async def sigterm_drains_within_the_bound(lb, replicas):
    victim, last = replicas[2], replicas[0]
    seen = Seen()
    results = {}
    async with client(victim.base + "/mcp", seen) as direct:
        _, sc = await run(direct, "print(1)", session="new")
        sid = sc["session"]["id"]

    async def call(key, code):
        async with client(lb.url, seen) as c:
            await c.list_tools()
            results[key] = await run(c, code, session=sid)

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "finishes", "import time\ntime.sleep(2)\nprint('done')")
        await anyio.sleep(0.8)
        os.kill(victim.pid, signal.SIGTERM)
        termed = time.monotonic()
        await anyio.sleep(0.3)
        status, body = readyz(victim.base)
        assert status == 503 and body == {"ready": False, "draining": True}, (status, body)
        # Its own sessions get a clear refusal while it drains.
        async with client(lb.url, Seen()) as c:
            await c.list_tools()
            r, _ = await run(c, "print(1)", session=sid)
            assert r.is_error and "shutting down" in text_of(r), text_of(r)
        # Once HAProxy's check saw the 503, new work goes elsewhere.
        await anyio.sleep(2.5)
        after = Seen()
        async with client(lb.url, after) as c:
            await c.list_tools()
            for _ in range(10):
                r, sc = await run(c, "print(2)")
                assert not r.is_error, text_of(r)
        assert {x["replica"] for x in after.calls} == {last.name}, after.calls
    r, sc = results["finishes"]
    assert not r.is_error and sc["stdout"] == "done\n", text_of(r)
    while victim.poll() is None:
        assert time.monotonic() - termed < DRAIN_S + DRAIN_EXTRA_S, "still running"
        await anyio.sleep(0.05)
    took = time.monotonic() - termed
    assert victim.returncode == 0, (victim.returncode, victim.log.text()[-2000:])
    print(f"        SIGTERM: readyz 503 at once, running execution finished, exit after "
          f"{took:.1f} s (drain bound {DRAIN_S} s + {DRAIN_EXTRA_S} s)", flush=True)


async def a_long_execution_is_answered_at_the_drain_bound(replicas):
    """The last replica: an execution that would outlive the drain is killed and answered."""
    victim = replicas[0]
    seen = Seen()
    result = {}

    async def call():
        async with client(victim.base + "/mcp", seen) as c:
            result["r"] = await run(c, "import time\ntime.sleep(60)")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.sleep(1.5)
        os.kill(victim.pid, signal.SIGTERM)
        termed = time.monotonic()
    r, _ = result["r"]
    answered = time.monotonic() - termed
    assert r.is_error and "stopping" in text_of(r), text_of(r)
    assert answered < DRAIN_S + DRAIN_EXTRA_S, answered
    victim.wait(timeout=DRAIN_EXTRA_S)
    print(f"        a 60 s execution answered \"stopping\" {answered:.1f} s after SIGTERM", flush=True)


async def main():
    passed = failed = 0
    state = {}
    with tempfile.TemporaryDirectory(prefix="codebox-replicas-") as tmp:
        os.chmod(tmp, 0o755)
        skills = os.path.join(tmp, "skills")
        try:
            replicas = [start_replica(n, skills) for n in NAMES]
            lb = start_haproxy(replicas)
            prometheus = start_prometheus(replicas, tmp)
            wait_ready(replicas)
            spread = {}

            async def spread_and_keep():
                spread.update(await sessionless_spread(lb))
            cases = [
                ("sessionless_executions_spread_over_all_replicas", spread_and_keep),
                ("prometheus_counts_what_each_replica_ran",
                 lambda: prometheus_counts_what_each_replica_ran(prometheus, replicas, spread)),
                ("sessions_stay_on_their_replica_for_both_revisions",
                 lambda: sessions_stay_on_their_replica(lb, state)),
                ("the_session_header_must_agree_with_the_body",
                 lambda: the_session_header_must_agree_with_the_body(lb)),
                ("tasks_and_kept_outputs_are_read_back_through_the_balancer",
                 lambda: tasks_and_kept_outputs_stay_on_their_replica(lb)),
                ("skills_saved_on_one_replica_are_read_by_the_others", lambda: skills_are_shared(replicas)),
                ("a_killed_replica_fails_only_its_sessions_with_a_clear_error",
                 lambda: a_killed_replica_fails_only_its_sessions(lb, replicas, state)),
                ("sigterm_stops_new_work_and_drains_within_the_bound",
                 lambda: sigterm_drains_within_the_bound(lb, replicas)),
                ("an_execution_outliving_the_drain_is_answered_stopping",
                 lambda: a_long_execution_is_answered_at_the_drain_bound(replicas)),
            ]
            for name, case in cases:
                try:
                    with anyio.fail_after(240):
                        await case()
                    print(f"ok      {name}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001
                    logs = "\n".join(f"--- {p.args[0]} ---\n{p.log.text()[-1500:]}" for p in PROCS)
                    print(f"FAILED  {name}: {e!r}\n{logs}", flush=True)
                    failed += 1
        finally:
            for p in PROCS:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in PROCS:
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    print(f"{passed} passed, {failed} failed", flush=True)
    return failed == 0


if __name__ == "__main__":
    sys.exit(0 if anyio.run(main) else 1)
