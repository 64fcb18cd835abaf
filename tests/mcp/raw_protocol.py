"""Bad input at the JSON-RPC level, written byte by byte (no SDK), over stdio and HTTP.

Usage: raw_protocol.py CODEBOX_BINARY
Malformed JSON, invalid UTF-8, unknown methods, invalid requests, 10 MB of code, messages
over the 16 MiB frame limit, and clients that go away mid-run: each gets a clear error
(or a clean clean-up when nobody is left to answer), and the server keeps serving.
Prints one line per case and "N passed, M failed".
"""

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from helpers import DrainedStderr, processes_with, server_env

CODEBOX = sys.argv[1]
PROTOCOL = "2025-11-25"
CASES = []


def case(fn):
    CASES.append(fn)
    return fn






def wait_gone(marker, seconds):
    deadline = time.monotonic() + seconds
    while processes_with(marker):
        assert time.monotonic() < deadline, f"sandbox process {marker} still runs"
        time.sleep(0.1)


def lingering_code(marker):
    """A program that leaves a grandchild and spins: only killing the sandbox ends it."""
    return (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600) # {marker}'])\n"
        "while True: pass\n"
    )


def request(id, method, params=None):
    msg = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        msg["params"] = params
    return json.dumps(msg).encode()


INITIALIZE = request(1, "initialize", {
    "protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"},
})
INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'


def call(id, code):
    return request(id, "tools/call", {"name": "execute_python", "arguments": {"code": code}})


class Stdio:
    """`codebox serve` on stdio, spoken to a line at a time."""

    def __init__(self):
        self.p = subprocess.Popen([CODEBOX, "serve"], env=server_env(), stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.buf = b""
        self.send(INITIALIZE)
        assert self.response(1)["result"]["protocolVersion"] == PROTOCOL
        self.send(INITIALIZED)

    def send(self, line):
        self.p.stdin.write(line + b"\n")
        self.p.stdin.flush()

    def message(self, timeout=30):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, "no message from the server"
            ready, _, _ = select.select([self.p.stdout], [], [], left)
            if ready:
                chunk = os.read(self.p.stdout.fileno(), 1 << 20)
                assert chunk, "the server closed stdout"
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def response(self, id=None, timeout=30):
        """The next response (skipping notifications); with `id`, it must carry it."""
        while True:
            m = self.message(timeout)
            if "method" in m:
                continue
            assert id is None or m.get("id") == id, m
            return m

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@case
def stdio_malformed_messages_get_parse_errors_and_the_server_goes_on():
    s = Stdio()
    try:
        for bad, why in [
            (b'{"jsonrpc": "2.0", "id": 2, "method": ', "EOF while parsing"),
            (b'\xff\xfe{"jsonrpc":"2.0","id":3,"method":"tools/list"}', "not UTF-8"),
            (b'{"jsonrpc":"2.0","id":4} trailing', "trailing characters"),
        ]:
            s.send(bad)
            m = s.response()
            assert m["id"] is None and m["error"]["code"] == -32700, m
            assert why in m["error"]["message"], m
        s.send(request(5, "no/such/method"))
        m = s.response(5)
        assert m["error"]["code"] == -32601, m
        s.send(b'{"id": 6}')
        assert s.response()["error"]["code"] == -32600
        s.send(request(7, "tools/call", {"name": "no_such_tool", "arguments": {}}))
        m = s.response(7)
        assert m["error"]["code"] == -32602 and "not found" in m["error"]["message"], m
        s.send(call(8, "print('still serving')"))
        m = s.response(8)
        assert m["result"]["structuredContent"]["stdout"] == "still serving\n", m
    finally:
        s.close()


@case
def stdio_ten_megabytes_of_code_is_a_clear_tool_error():
    s = Stdio()
    try:
        s.send(call(2, "#" * (10 * 1024 * 1024)))
        m = s.response(2)
        assert m["result"]["isError"] is True, m
        assert "the limit is 1048576 bytes" in m["result"]["content"][0]["text"], m
        # Over the 16 MiB frame limit: a parse error, and the next message still works.
        s.send(b'"' + b"x" * (17 * 1024 * 1024) + b'"')
        m = s.response()
        assert m["error"]["code"] == -32700 and "larger than" in m["error"]["message"], m
        s.send(call(3, "print(3)"))
        assert s.response(3)["result"]["structuredContent"]["stdout"] == "3\n"
    finally:
        s.close()


@case
def stdio_client_gone_mid_run_kills_the_sandbox_and_the_server_exits():
    marker = f"codebox-raw-stdio-gone-{os.getpid()}"
    s = Stdio()
    try:
        s.send(call(2, lingering_code(marker)))
        deadline = time.monotonic() + 10
        while not processes_with(marker):
            assert time.monotonic() < deadline, "the program did not start"
            time.sleep(0.05)
        s.p.stdin.close()  # the client goes away
        assert s.p.wait(timeout=15) == 0
        wait_gone(marker, 5)
    finally:
        s.close()


class Http:
    """`codebox serve --http` on an ephemeral loopback port, spoken to with raw requests."""

    def __init__(self, extra_env=None):
        env = server_env()
        env.update(extra_env or {})
        self.p = subprocess.Popen([CODEBOX, "serve", "--http", "127.0.0.1:0"], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        self.log = DrainedStderr(self.p)
        m = self.log.wait_for(r"serving MCP at http://[^:]+:(\d+)/mcp", 30)
        assert m, f"the HTTP server did not start: {self.log.text()[-2000:]}"
        self.port = int(m.group(1))
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        status, headers, _ = self.post(INITIALIZE)
        assert status == 200, status
        self.session = headers["mcp-session-id"]
        assert self.post(INITIALIZED)[0] == 202

    def headers(self):
        h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
             "MCP-Protocol-Version": PROTOCOL}
        if getattr(self, "session", None):
            h["Mcp-Session-Id"] = self.session
        return h

    def post(self, body, method="POST"):
        req = urllib.request.Request(self.url, data=body, headers=self.headers(), method=method)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def rpc(self, body):
        """POSTs one request and returns its JSON-RPC response (from JSON or SSE)."""
        status, headers, raw = self.post(body)
        if "text/event-stream" in (headers.get("content-type") or ""):
            for line in raw.decode().splitlines():
                if line.startswith("data: {"):
                    m = json.loads(line[6:])
                    if "method" not in m:
                        return status, m
            raise AssertionError(f"no response in the stream: {raw[:300]!r}")
        return status, json.loads(raw)

    def close(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


@case
def http_malformed_bodies_get_400_with_a_parse_error():
    h = Http()
    try:
        for body, why in [
            (b'{"jsonrpc": "2.0", "id": 2, "method": ', "EOF while parsing"),
            (b'\xff\xfe{}', "not UTF-8"),
        ]:
            status, m = h.rpc(body)
            assert status == 400 and m["error"]["code"] == -32700 and why in m["error"]["message"], (status, m)
        status, _, raw = h.post(b'"' + b"x" * (17 * 1024 * 1024) + b'"')
        assert status == 413 and b"larger than" in raw, (status, raw[:200])
        status, m = h.rpc(request(3, "no/such/method"))
        assert m["error"]["code"] == -32601, m
        status, m = h.rpc(call(4, "#" * (10 * 1024 * 1024)))
        assert m["result"]["isError"] and "the limit is 1048576 bytes" in m["result"]["content"][0]["text"], m
        status, m = h.rpc(call(5, "print('still serving')"))
        assert m["result"]["structuredContent"]["stdout"] == "still serving\n", m
    finally:
        h.close()


@case
def http_client_gone_mid_run_then_session_deleted_kills_the_sandbox():
    # A dropped connection is not a cancellation (the client may resume the stream);
    # ending the session is: its running executions are killed.
    marker = f"codebox-raw-http-gone-{os.getpid()}"
    h = Http()
    try:
        body = call(2, lingering_code(marker))
        sock = socket.create_connection(("127.0.0.1", h.port))
        head = "".join(f"{k}: {v}\r\n" for k, v in h.headers().items())
        sock.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{h.port}\r\n{head}"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 10
        while not processes_with(marker):
            assert time.monotonic() < deadline, "the program did not start"
            time.sleep(0.05)
        sock.close()
        # Another client is served while the abandoned run goes on.
        other = Http.__new__(Http)
        other.port, other.url, other.session = h.port, h.url, None
        status, headers, _ = other.post(INITIALIZE)
        other.session = headers["mcp-session-id"]
        other.post(INITIALIZED)
        status, m = other.rpc(call(3, "print('other client')"))
        assert m["result"]["structuredContent"]["stdout"] == "other client\n", m
        status, _, _ = h.post(None, method="DELETE")
        assert status == 200, status
        wait_gone(marker, 10)
        status, m = other.rpc(call(4, "print('after')"))
        assert m["result"]["structuredContent"]["stdout"] == "after\n", m
    finally:
        h.close()


def closed_within(sock, seconds, log=None):
    """Reads until the server closes `sock`; returns what it sent. Fails after `seconds`,
    with the tail of the server's `log` (a DrainedStderr) if given."""
    sock.settimeout(seconds)
    got = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got
        except socket.timeout:
            break
        if not chunk:
            return got
        got += chunk
    tail = log.text()[-3000:] if log else ""
    raise AssertionError(f"the server kept the connection open for {seconds} s: {got[:200]!r}; "
                         f"its log: {tail}")


def connect(port, source="127.0.0.1"):
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def response_head(sock, seconds=30):
    """Reads one response head (and leaves the connection open): its status."""
    sock.settimeout(seconds)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0


def admitted(port, source="127.0.0.1", tries=20):
    """A connection the server kept: it answered a request on it with 200 (one over a
    cap is answered 503 and closed, and is replaced by a new one)."""
    for _ in range(tries):
        sock = connect(port, source)
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        try:
            status = response_head(sock)
        except (ConnectionResetError, socket.timeout):
            status = 0
        if status == 200:
            sock.settimeout(10)
            return sock
        sock.close()
        time.sleep(0.2)
    raise AssertionError(f"every connection from {source} was refused")


def refused(port, source="127.0.0.1", log=None):
    """A request on a new connection, which must be answered 503 and closed."""
    sock = connect(port, source)
    sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    answer = closed_within(sock, 30, log)
    assert answer.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in answer, answer[:300]
    return answer


@case
def http_slow_and_idle_connections_are_closed():
    # Small bounds; every assertion allows many times the bound (no latency is timed).
    h = Http({"CODEBOX_HTTP_HEADER_TIMEOUT": "1s", "CODEBOX_HTTP_BODY_TIMEOUT": "1s",
              "CODEBOX_HTTP_IDLE_TIMEOUT": "2s", "CODEBOX_HTTP_MAX_CONNECTIONS": "8",
              "CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER": "4"})
    try:
        host = f"Host: 127.0.0.1:{h.port}\r\n".encode()
        # Never finishes its headers.
        stalled = connect(h.port)
        stalled.sendall(b"POST /mcp HTTP/1.1\r\n" + host)
        # Trickles its headers a byte at a time, forever.
        trickle = connect(h.port)
        trickle_start = time.monotonic()
        trickle_closed = False
        try:
            for i in range(200):
                trickle.sendall(b"X" if i else b"P")
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            trickle_closed = True
        assert trickle_closed or closed_within(trickle, 10) is not None
        assert time.monotonic() - trickle_start < 15
        closed_within(stalled, 10)
        # Sends its headers, then stalls its body: 408 with a JSON-RPC error, closed.
        body_staller = connect(h.port)
        head = "".join(f"{k}: {v}\r\n" for k, v in h.headers().items())
        body_staller.sendall(b"POST /mcp HTTP/1.1\r\n" + host + head.encode()
                             + b"Content-Length: 1000\r\n\r\n{\"jsonrpc\":")
        answer = closed_within(body_staller, 10)
        assert answer.startswith(b"HTTP/1.1 408") and b"-32700" in answer, answer[:300]
        # Connects and says nothing.
        silent = connect(h.port)
        closed_within(silent, 10)
        # Completes a request, then keeps the connection without a word: closed too.
        kept = connect(h.port)
        kept.sendall(b"GET /healthz HTTP/1.1\r\n" + host + b"\r\n")
        answer = closed_within(kept, 10)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        # A run longer than the idle timeout keeps its SSE stream (keep-alive comments).
        status, m = h.rpc(call(2, "import time; time.sleep(5); print('long run')"))
        assert m["result"]["structuredContent"]["stdout"] == "long run\n", m
    finally:
        h.close()


@case
def http_connections_over_the_caps_get_503():
    # Long timeouts here: a held connection must not be closed while the caps are tested.
    h = Http({"CODEBOX_HTTP_HEADER_TIMEOUT": "60s", "CODEBOX_HTTP_IDLE_TIMEOUT": "60s",
              "CODEBOX_HTTP_MAX_CONNECTIONS": "8", "CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER": "4"})
    held = []
    try:
        # Per peer: the fifth open connection from 127.0.0.1 is answered 503 and closed.
        # The connections the constructor's requests used count until the server has
        # seen them close, so one of the four held ones may be refused: it is replaced.
        held = [admitted(h.port) for _ in range(4)]
        # Generous bounds: a refusal answers once the request is read, but a loaded
        # machine may not schedule the accept loop for a while.
        answer = refused(h.port, log=h.log)
        assert b"max_connections_per_peer = 4" in answer, answer
        # Another address still gets in: four from 127.0.0.2 fill the server (8 in all);
        # then one from 127.0.0.3 is refused by the total cap.
        held += [admitted(h.port, "127.0.0.2") for _ in range(4)]
        answer = refused(h.port, "127.0.0.3", h.log)
        assert b"max_connections = 8" in answer, answer
        # Slots come back when connections close.
        for s in held:
            s.close()
        held = []
        time.sleep(0.3)
        status, m = h.rpc(call(2, "print('slots freed')"))
        assert m["result"]["structuredContent"]["stdout"] == "slots freed\n", m
    finally:
        for s in held:
            s.close()
        h.close()


@case
def http_bodies_that_parse_into_gigabytes_are_refused_unparsed():
    # 16 MiB of `[0,0,…]` in the arguments: its parse took the server to a 1.9 GB peak.
    h = Http()
    try:
        def peak_kib():
            with open(f"/proc/{h.p.pid}/status") as f:
                return int(next(l for l in f if l.startswith("VmHWM:")).split()[1])
        before = peak_kib()
        zeros = b"0," * ((8 << 20) - 200)
        body = (b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"execute_python",'
                b'"arguments":{"code":"1","x":[' + zeros + b'0]}}}')
        status, _, raw = h.post(body)
        m = json.loads(raw)
        assert status == 400 and m["id"] == 5 and m["error"]["code"] == -32700, (status, raw[:300])
        assert "MiB of memory" in m["error"]["message"], m
        grew = (peak_kib() - before) >> 10
        assert grew < 200, f"the server's peak grew by {grew} MiB"
        # The session still works.
        _, m = h.rpc(call(6, "print('still here')"))
        assert m["result"]["structuredContent"]["stdout"] == "still here\n", m
    finally:
        h.close()


@case
def protocol_errors_carry_the_id_and_echo_bounded():
    s = Stdio()
    h = Http()
    try:
        deep = "[" * 200 + "]" * 200
        for body, code, id in [
            (request(2, "tools/list", None)[:-1] + b',"params":7}', -32602, 2),
            (request(3, "tools/call", {"name": "execute_python", "arguments": "print(1)"}), -32602, 3),
            # Deeper than the parser's 128 levels: a parse error, still with the id.
            (('{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"execute_python",'
              '"arguments":{"code":"1","x":' + deep + '}}}').encode(), -32700, 4),
            (request(5, "m" * (1 << 20)), -32601, 5),
            (b'{"jsonrpc":"2.0","id":6,"result":7,"method":3}', -32600, 6),
            (b'{"jsonrpc":"2.0","id":7}', -32600, 7),
        ]:
            s.send(body)
            m = s.response()
            assert m["error"]["code"] == code and m.get("id") == id, m
            assert len(json.dumps(m)) < 1000, len(json.dumps(m))
            status, m = h.rpc(body)
            assert status == 400 and m["error"]["code"] == code and m.get("id") == id, (status, m)
        # The server still serves both.
        s.send(call(9, "print('ok')"))
        assert s.response(9)["result"]["structuredContent"]["stdout"] == "ok\n"
        status, m = h.rpc(call(9, "print('ok')"))
        assert m["result"]["structuredContent"]["stdout"] == "ok\n", m
    finally:
        s.close()
        h.close()


def main():
    passed = failed = 0
    for fn in CASES:
        try:
            fn()
            print(f"ok      {fn.__name__}", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001 - report every failure
            print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return failed


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
