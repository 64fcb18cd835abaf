"""Controlled egress through `codebox serve`, driven by the official Python MCP SDK: a
server in proxy mode (codebox.toml [network]), a plain-HTTP origin on 127.0.0.1 that
echoes what it receives, and programs that reach it from warm and keep-alive sandboxes.

Usage: egress_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import http.server
import json
import os
import secrets
import sys
import tempfile
import threading
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import server_env

CODEBOX = sys.argv[1]
SECRET = "cbxsecret-" + secrets.token_hex(16)
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


class Echo(http.server.BaseHTTPRequestHandler):
    """GET /echo answers the request's headers (in the body and as x-echo-*)."""
    seen = []

    def do_GET(self):  # noqa: N802 - the stdlib's name
        Echo.seen.append(dict(self.headers))
        body = "".join(f"{k.lower()}: {v}\n" for k, v in self.headers.items()).encode()
        self.send_response(200)
        for k, v in self.headers.items():
            self.send_header(f"x-echo-{k.lower()}", v)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class World:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-egress-test-")
        os.chmod(self.tmp.name, 0o755)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.audit = os.path.join(self.tmp.name, "audit.jsonl")
        self.config = os.path.join(self.tmp.name, "codebox.toml")
        with open(self.config, "w") as f:
            f.write(f"""
state_dir = "{self.tmp.name}/state"
mcp_config = "{self.tmp.name}/none.json"
[network]
mode = "proxy"
allow = ["localhost:{self.port}", "*.example.org"]
allow_private = ["127.0.0.1:{self.port}"]
[[network.credentials]]
host = "localhost:{self.port}"
header = "X-Api-Key"
value = "env:EGRESS_TEST_KEY"
allow_plain_http = true
""")
        with open(os.path.join(self.tmp.name, "none.json"), "w") as f:
            json.dump({"mcpServers": {}}, f)

    def server(self):
        env = server_env()
        env.update({
            "CODEBOX_CONFIG": self.config,
            "CODEBOX_AUDIT_LOG": self.audit,
            "CODEBOX_POOL_SIZE": "1",
            "EGRESS_TEST_KEY": SECRET,
        })
        return StdioServerParameters(command=CODEBOX, args=["serve"], env=env)

    def close(self):
        self.httpd.shutdown()
        self.tmp.cleanup()


async def run(s, language, code, **args):
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    return r, r.structured_content or {}


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "text", None))


def no_secret(*things):
    for t in things:
        text = t if isinstance(t, str) else json.dumps(t, default=str)
        assert SECRET not in text, f"the secret came back: {text[:400]}"


async def pool_ready(s, language="python"):
    deadline = time.monotonic() + 30
    while True:
        h = (await s.call_tool("health", {})).structured_content
        if h["pool"]["languages"][language]["idle"] >= 1:
            return
        assert time.monotonic() < deadline, h["pool"]
        await anyio.sleep(0.05)


@case
async def the_execute_tools_say_what_network_the_code_has(s, w):
    tools = {t.name: t for t in (await s.list_tools()).tools}
    for name in ["execute_python", "execute_typescript"]:
        t = tools[name]
        assert "network" in t.input_schema["properties"], t.input_schema
        assert "allowed hosts only" in t.description, t.description
        assert "no network" not in t.description, t.description


@case
async def a_warm_python_sandbox_reaches_the_api_with_a_credential_it_never_sees(s, w):
    await pool_ready(s)
    code = f"""
import os, urllib.request
r = urllib.request.urlopen("http://localhost:{w.port}/echo")
print(r.status, r.headers.get("x-echo-x-api-key"))
print([l for l in r.read().decode().splitlines() if l.startswith("x-api-key")])
print("env", any("cbxsecret" in v for v in os.environ.values()))
"""
    r, sc = await run(s, "python", code)
    assert not r.is_error, sc
    assert sc["start"] == "warm", sc["start"]
    assert sc["stdout"].splitlines() == [
        "200 [REDACTED]", "['x-api-key: [REDACTED]']", "env False"], sc["stdout"]
    got = {k.lower(): v for k, v in Echo.seen[-1].items()}
    assert got.get("x-api-key") == SECRET, "the API did not get the credential"
    rec = sc["network"]["connections"][0]
    assert rec["host"] == "localhost" and rec["allowed"] and rec["credential_added"], rec
    assert rec["kind"] == "http" and rec["status"] == 200, rec
    no_secret(sc, text_of(r))


@case
async def a_warm_typescript_sandbox_fetches_through_the_proxy(s, w):
    await pool_ready(s, "typescript")
    code = f"""
const r = await fetch("http://localhost:{w.port}/echo");
console.log(r.status, r.headers.get("x-echo-x-api-key"));
try {{ await fetch("https://unlisted.example.com/"); }} catch (e) {{ console.log((e as Error).message); }}
"""
    r, sc = await run(s, "typescript", code)
    assert not r.is_error, sc
    assert sc["start"] == "warm", sc["start"]
    lines = sc["stdout"].splitlines()
    assert lines[0] == "200 [REDACTED]", lines
    assert lines[1] == ("fetch failed: codebox: egress to unlisted.example.com:443 denied "
                        "(not in allowlist)"), lines
    # The model reads the refusal in the result's text too.
    assert "denied unlisted.example.com:443: not in allowlist" in text_of(r), text_of(r)
    no_secret(sc, text_of(r))


@case
async def a_request_narrows_the_allowlist_and_cannot_widen_it(s, w):
    code = f"""
import urllib.request
for u in ["http://localhost:{w.port}/echo", "https://api.example.org/"]:
    try:
        urllib.request.urlopen(u, timeout=10)
        print(u, "reached")
    except Exception as e:
        print(u, "refused", e)
"""
    r, sc = await run(s, "python", code, network=["*.example.org"])
    assert not r.is_error, text_of(r)
    assert f"http://localhost:{w.port}/echo refused HTTP Error 403: codebox: egress to localhost:{w.port} denied" in sc["stdout"], sc["stdout"]
    rec = [c for c in sc["network"]["connections"] if c["host"] == "localhost"][0]
    assert not rec["allowed"], rec
    # [] allows nothing.
    r, sc = await run(s, "python", code, network=[])
    assert sc["network"]["allowed"] == 0, ("[]", sc.get("network"), text_of(r))
    # A host outside the server's allowlist is an error the model can read, not a widening.
    r, sc = await run(s, "python", code, network=["evil.example.com"])
    assert r.is_error and "outside the server's allowlist" in text_of(r), ("widen", text_of(r))


@case
async def a_keep_alive_interpreter_keeps_its_way_out_across_runs(s, w):
    code = f"""
import urllib.request
n = globals().get("n", 0) + 1
print(n, urllib.request.urlopen("http://localhost:{w.port}/echo").status)
"""
    r, sc = await run(s, "python", code, session="new", keep_alive=True)
    assert not r.is_error, sc
    sid = sc["session"]["id"]
    for expect in [2, 3]:
        r, sc = await run(s, "python", code, session=sid)
        assert sc["stdout"] == f"{expect} 200\n", sc
        assert sc["session"]["interpreter"] == "kept", sc["session"]
        assert len(sc["network"]["connections"]) == 1, sc["network"]
    # This run may reach nothing: the narrowing applies to the kept interpreter too.
    r, sc = await run(s, "python", code, session=sid, network=[])
    assert "403" in sc["stderr"] and sc["network"]["denied"] == 1, sc
    await s.call_tool("close_session", {"session": sid})


@case
async def a_secret_in_output_is_redacted_in_the_result_and_in_progress(s, w):
    """However the value got into the program (here: written into the code itself), it
    never comes back: not in the result, not in streamed progress, not in a workspace
    file read as a resource."""
    seen = []

    async def on_progress(progress, total, message):
        seen.append(message or "")

    half = len(SECRET) // 2
    code = f"""
import sys, time
s = {SECRET[:half]!r} + {SECRET[half:]!r}
open("/workspace/leak.txt", "w").write(s)
for i in range(3):
    print("line", i, s); sys.stdout.flush(); time.sleep(0.25)
sys.stdout.write("no newline " + s)
"""
    r = await s.call_tool("execute_python", {"code": code, "session": "new"},
                          progress_callback=on_progress)
    sc = r.structured_content
    assert not r.is_error, sc
    assert sc["stdout"].count("[REDACTED]") == 4, sc["stdout"]
    assert len(seen) >= 2 and "".join(seen).count("[REDACTED]") == 4, seen
    sid = sc["session"]["id"]
    res = await s.read_resource(f"codebox://sessions/{sid}/workspace/leak.txt")
    assert res.contents[0].text == "[REDACTED]", res.contents
    no_secret(sc, text_of(r), seen, res.contents[0].text)
    await s.call_tool("close_session", {"session": sid})


@case
async def health_shows_the_policy_and_counters_but_no_secret(s, w):
    h = (await s.call_tool("health", {})).structured_content
    n = h["network"]
    assert n["mode"] == "proxy", n
    assert f"localhost:{w.port}" in json.dumps(n["policy"]), n
    c = n["counters"]
    assert c["connections_allowed"] >= 3 and c["connections_denied"] >= 2, n
    assert any(c["layer"] == "egress" and c["status"] == "ok" for c in h["layers"]), h["layers"]
    no_secret(h)


@case
async def the_audit_log_has_every_connection_and_no_secret(s, w):
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(x) for x in open(w.audit)] if os.path.exists(w.audit) else []
        egress = [x for x in lines if x.get("event") == "egress"]
        if len(egress) >= 5 or time.monotonic() > deadline:
            break
        await anyio.sleep(0.1)
    assert any(x["allowed"] and x["credential_added"] for x in egress), egress
    assert any(not x["allowed"] and "not in allowlist" in (x["reason"] or "") for x in egress), egress
    execs = [x for x in lines if x.get("event") == "execution"]
    assert any(x.get("egress_denied", 0) >= 1 for x in execs), execs
    no_secret(open(w.audit).read())


async def main():
    passed = failed = 0
    w = World()
    try:
        async with stdio_client(w.server()) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                for fn in CASES:
                    try:
                        with anyio.fail_after(120):
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
