"""`codebox serve --http` behind a balancer: the PROXY protocol v2 from trusted addresses,
per-client connection caps, and refusals a client can read. Raw sockets (the script
plays the balancer and writes PROXY v2 headers itself), Python's http.client, and
Debian's HAProxy with deploy/haproxy/codebox.cfg (send-proxy-v2).

Usage: balancer_client.py CODEBOX_BINARY HAPROXY_CONFIG
The whole of 127.0.0.0/8 is local: the "balancer" connects from 127.0.0.2 (trusted),
strangers from 127.0.0.3 and up, HAProxy from 127.0.0.1.
Prints one line per case and "N passed, M failed".
"""

import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

from helpers import DrainedStderr, server_env

CODEBOX = sys.argv[1]
HAPROXY_CONFIG = sys.argv[2]
HAPROXY = "/usr/sbin/haproxy"
TOKEN = "balancer-test-token"
BALANCER = "127.0.0.2"
SIG = b"\r\n\r\n\0\r\nQUIT\n"
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def logged(proc, pattern, timeout=10):
    """Whether the server's log (colours stripped) has a line matching `pattern` within
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if re.search(pattern, ANSI.sub("", proc.log.text())):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def v2(command, family, addresses=b"", tlvs=b""):
    """A PROXY v2 header: command 0 LOCAL / 1 PROXY, family byte (0x11 TCP4, 0x21
    TCP6, 0x00 UNSPEC), address block and TLVs."""
    body = addresses + tlvs
    return SIG + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


def tcp4(src, sport=40000, dst="127.0.0.1", dport=8080):
    return v2(1, 0x11, socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!HH", sport, dport))


def tcp6(src, sport=40000):
    return v2(1, 0x21, socket.inet_pton(socket.AF_INET6, src)
              + socket.inet_pton(socket.AF_INET6, "::1") + struct.pack("!HH", sport, 8080))


class Server:
    """`codebox serve --http` on a loopback port, with a token; `env` adds settings."""

    def __init__(self, env=None, addr="127.0.0.1:0"):
        e = server_env()
        e.update({"CODEBOX_HTTP_TOKEN": TOKEN, "CODEBOX_POOL_SIZE": "0"})
        e.update(env or {})
        self.p = subprocess.Popen([CODEBOX, "serve", "--http", addr], env=e,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        self.log = DrainedStderr(self.p)
        m = self.log.wait_for(r"serving MCP at http://[^:]+:(\d+)/mcp", 60)
        assert m, f"the HTTP server did not start: {self.log.text()[-2000:]}"
        self.port = int(m.group(1))

    def connect(self, source):
        return socket.create_connection(("127.0.0.1", self.port), timeout=10,
                                        source_address=(source, 0))

    def close(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        assert self.p.returncode is not None


def read_response(sock, seconds=30):
    """One whole response (Content-Length bodies): (status, head text, body)."""
    sock.settimeout(seconds)
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 "):
        return 0, head.decode(errors="replace"), body
    m = re.search(rb"(?im)^content-length: *(\d+)", head)
    length = int(m.group(1)) if m else 0
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split(b" ", 2)[1]), head.decode(errors="replace"), body


def closed_answer(sock, seconds=30):
    """Everything the server sends until it closes (b"" if it closes without a word)."""
    sock.settimeout(seconds)
    got = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk
    raise AssertionError(f"still open after {seconds} s: {got[:200]!r}")


def get(path, port, extra=""):
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode()


def held(server, source, header=b"", tries=20):
    """A connection (from `source`, with `header` first) on which /healthz answered 200,
    kept open. One refused while earlier connections are still being closed is replaced."""
    for _ in range(tries):
        s = server.connect(source)
        s.sendall(header + get("/healthz", server.port))
        try:
            status, _, _ = read_response(s)
        except (ConnectionResetError, socket.timeout):
            status = 0
        if status == 200:
            return s
        s.close()
        time.sleep(0.2)
    raise AssertionError(f"no connection from {source} with {header[:20]!r} was admitted")


def refused_with_a_body(server, source, header=b"", body_len=256 << 10):
    """A POST with a body over a cap, as a client sends it: the whole body is written
    (no EPIPE), then the answer is read (no reset): 503, Retry-After, a clear body."""
    s = server.connect(source)
    s.sendall(header + f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                       f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {body_len}\r\n\r\n".encode())
    s.sendall(b" " * body_len)
    status, head, body = read_response(s)
    s.close()
    assert status == 503, (status, head, body[:200])
    assert re.search(r"(?im)^retry-after: 1$", head), head
    return body.decode()


@case
def caps_count_the_clients_a_trusted_balancer_names():
    server = Server({"CODEBOX_HTTP_TRUSTED_PROXIES": f"{BALANCER}, fd00::/8",
                     "CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER": "2",
                     "CODEBOX_HTTP_MAX_CONNECTIONS": "32",
                     "CODEBOX_HTTP_IDLE_TIMEOUT": "120s"})
    conns = []
    try:
        # Eight connections from the balancer's one address, for four clients (one of
        # them IPv6), two each: the cap of 2 counts clients, not the balancer.
        for client in ["192.0.2.10", "192.0.2.11", "198.51.100.7"]:
            conns += [held(server, BALANCER, tcp4(client)) for _ in range(2)]
        conns += [held(server, BALANCER, tcp6("2001:db8:1:2::5")) for _ in range(2)]
        # A client's third connection is refused, and the client (which sent a body)
        # reads why.
        why = refused_with_a_body(server, BALANCER, tcp4("192.0.2.10", 50000))
        assert "from this client (max_connections_per_peer = 2)" in why, why
        # Another address of the same IPv6 /64 is the same client.
        why = refused_with_a_body(server, BALANCER, tcp6("2001:db8:1:2::99"))
        assert "max_connections_per_peer" in why, why
        # The balancer's own health checks (LOCAL) count as the balancer: two fit.
        conns += [held(server, BALANCER, v2(0, 0x00)) for _ in range(2)]
        why = refused_with_a_body(server, BALANCER, v2(0, 0x00))
        assert "max_connections_per_peer" in why, why
        # A client's slot comes back when its connection closes.
        conns.pop(0).close()
        conns.append(held(server, BALANCER, tcp4("192.0.2.10")))
        # The log names the client and the balancer it came through.
        assert logged(server, r"connection refused.*client=192\.0\.2\.10:\d+ via=Some\(127\.0\.0\.2:"), \
            server.log.text()[-3000:]
    finally:
        for c in conns:
            c.close()
        server.close()


@case
def nobody_else_may_declare_a_client():
    server = Server({"CODEBOX_HTTP_TRUSTED_PROXIES": BALANCER,
                     "CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER": "2"})
    conns = []
    try:
        stranger = "127.0.0.3"
        for header in [tcp4("192.0.2.50"), tcp4("127.0.0.1"), v2(0, 0x00),
                       b"PROXY TCP4 192.0.2.50 127.0.0.1 1 8080\r\n"]:
            s = server.connect(stranger)
            s.sendall(header + get("/healthz", server.port))
            status, head, body = read_response(s)
            s.close()
            assert status == 400, (header, status, head)
            assert b"which http.trusted_proxies does not list" in body, body
        # Whatever it declared, the stranger counts as itself: two connections, then 503.
        conns += [held(server, stranger) for _ in range(2)]
        why = refused_with_a_body(server, stranger, tcp4("192.0.2.51"))
        assert "max_connections_per_peer = 2" in why, why
        assert logged(server, r"PROXY protocol header from 127\.0\.0\.3:\d+, which http.trusted_proxies does not list")
    finally:
        for c in conns:
            c.close()
        server.close()


@case
def bad_headers_from_the_balancer_are_refused_and_the_server_goes_on():
    server = Server({"CODEBOX_HTTP_TRUSTED_PROXIES": BALANCER,
                     "CODEBOX_HTTP_HEADER_TIMEOUT": "2s"})
    try:
        good = tcp4("192.0.2.60")
        for header, why in [
            (b"", b"a PROXY protocol v2 header is required from 127.0.0.2"),
            (b"PROXY TCP4 192.0.2.60 127.0.0.1 1 8080\r\n", b"only v2 is accepted"),
            (SIG + b"\x21\x11\xff\xff", b"at most 4096"),
            (SIG + b"\x11\x11\x00\x0c" + good[16:], b"malformed"),
            (SIG + b"\x2f\x11\x00\x0c" + good[16:], b"malformed"),
            (SIG + b"\x21\x11\x00\x04" + b"\x01\x02\x03\x04", b"malformed"),
            (SIG + b"\x21\x51\x00\x0c" + good[16:], b"malformed"),
        ]:
            s = server.connect(BALANCER)
            s.sendall(header + get("/healthz", server.port))
            status, head, body = read_response(s)
            s.close()
            assert status == 400 and why in body, (header, status, body)
        # Truncated: the balancer goes away mid-header, or stalls in it.
        for cut in [1, 11, 15, 20]:
            s = server.connect(BALANCER)
            s.sendall(good[:cut])
            s.shutdown(socket.SHUT_WR)
            assert closed_answer(s, 10) == b"", cut
            s.close()
        stalled = server.connect(BALANCER)
        stalled.sendall(good[:20])
        start = time.monotonic()
        assert closed_answer(stalled, 15) == b""
        assert time.monotonic() - start < 10
        # A header trickled a few bytes at a time within the timeout is fine.
        s = server.connect(BALANCER)
        for i in range(0, len(good), 7):
            s.sendall(good[i:i + 7])
            time.sleep(0.05)
        s.sendall(get("/healthz", server.port))
        assert read_response(s)[0] == 200
        s.close()
        # The largest header accepted (TLVs ignored), then a normal request.
        big = v2(1, 0x11, good[16:], b"\xee" * (4096 - 28))
        s = server.connect(BALANCER)
        s.sendall(big + get("/healthz", server.port))
        assert read_response(s)[0] == 200
        s.close()
        assert server.p.poll() is None, "the server is still up"
    finally:
        server.close()


@case
def a_declared_loopback_address_gains_nothing():
    server = Server({"CODEBOX_HTTP_TRUSTED_PROXIES": BALANCER})
    try:
        for header in [tcp4("127.0.0.1"), tcp6("::1"), v2(0, 0x00)]:
            # MCP needs the token.
            s = server.connect(BALANCER)
            body = b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}'
            s.sendall(header + f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                               f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                               f"MCP-Protocol-Version: 2026-07-28\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            status, head, _ = read_response(s)
            assert status == 401, (header, status, head)
            s.close()
            # /readyz gives a tokenless caller its status only, /metrics nothing.
            s = server.connect(BALANCER)
            s.sendall(header + get("/readyz", server.port))
            status, _, raw = read_response(s)
            assert sorted(json.loads(raw)) == ["draining", "ready"], raw
            s.close()
            s = server.connect(BALANCER)
            s.sendall(header + get("/metrics", server.port))
            assert read_response(s)[0] == 401
            s.close()
    finally:
        server.close()
    # Trusting a balancer without tokens is refused, also on loopback.
    e = {k: v for k, v in server_env().items() if not k.startswith("CODEBOX_HTTP_TOKEN")}
    e.update({"CODEBOX_HTTP_TRUSTED_PROXIES": BALANCER, "CODEBOX_POOL_SIZE": "0"})
    out = subprocess.run([CODEBOX, "serve", "--http", "127.0.0.1:0"], env=e,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "http.trusted_proxies is set" in out.stderr \
        and "bearer token is required" in out.stderr, (out.returncode, out.stderr[-1000:])
    # A bad entry is named.
    e["CODEBOX_HTTP_TOKEN"] = TOKEN
    e["CODEBOX_HTTP_TRUSTED_PROXIES"] = "10.1.2.3/8"
    out = subprocess.run([CODEBOX, "serve", "--http", "127.0.0.1:0"], env=e,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "10.1.2.3/8" in out.stderr and "10.0.0.0/8" in out.stderr, out.stderr[-1000:]


@case
def a_client_sending_a_body_reads_its_503():
    """http.client, as a program would use it: a POST with a 1 MiB body over the cap gets
    the 503 as a response, not a broken pipe or a reset."""
    server = Server({"CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER": "2",
                     "CODEBOX_HTTP_IDLE_TIMEOUT": "120s"})
    conns = []
    try:
        source = "127.0.0.4"
        conns += [held(server, source) for _ in range(2)]
        for body_len in [1 << 20, 16 << 10, 0]:
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30,
                                           source_address=(source, 0))
            c.request("POST", "/mcp", body=b"{" * body_len,
                      headers={"Authorization": f"Bearer {TOKEN}",
                               "Content-Type": "application/json"})
            r = c.getresponse()
            text = r.read().decode()
            assert r.status == 503 and r.getheader("Retry-After") == "1", (r.status, text)
            assert "max_connections_per_peer = 2" in text, text
            c.close()
        # Chunked, and one that waits for 100-continue before its body.
        s = server.connect(source)
        s.sendall(f"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                  + b"4000\r\n" + b"x" * 0x4000 + b"\r\n0\r\n\r\n")
        assert read_response(s)[0] == 503
        s.close()
        s = server.connect(source)
        s.sendall(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
        assert read_response(s, 10)[0] == 503
        s.close()
    finally:
        for c in conns:
            c.close()
        server.close()


@case
def haproxy_with_send_proxy_v2_counts_real_clients():
    """Debian's HAProxy with the shipped config (send-proxy-v2, health checks on /readyz
    as PROXY LOCAL) in front of one codebox trusting it: two clients of HAProxy at their
    own caps, and the refusal relayed to the client that went over it."""
    if not os.path.exists(HAPROXY):
        if os.environ.get("CODEBOX_TEST_STRICT") == "1":
            raise AssertionError(f"{HAPROXY} is not installed")
        print(f"SKIP    haproxy case: {HAPROXY} is not installed")
        return
    # A cap of 4: HAProxy's checks of its three servers (all this one codebox) may
    # overlap, and count as HAProxy itself.
    server = Server({"CODEBOX_HTTP_TRUSTED_PROXIES": "127.0.0.1",
                     "CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER": "4",
                     "CODEBOX_HTTP_BODY_TIMEOUT": "60s",
                     "CODEBOX_HTTP_IDLE_TIMEOUT": "120s"})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        front = s.getsockname()[1]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "CODEBOX_LB_BIND": f"127.0.0.1:{front}"}
    for i in range(3):
        env[f"CODEBOX_{i}"] = f"127.0.0.1:{server.port}"
    lb = subprocess.Popen([HAPROXY, "-db", "-f", HAPROXY_CONFIG], env=env,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    lb.log = DrainedStderr(lb)
    stalled = []
    try:
        def via_lb(source, request):
            s = socket.create_connection(("127.0.0.1", front), timeout=10, source_address=(source, 0))
            s.sendall(request)
            return s

        # HAProxy's checks (PROXY LOCAL + GET /readyz) mark the servers up.
        deadline = time.monotonic() + 60
        while True:
            try:
                s = via_lb("127.0.0.5", get("/healthz", front))
                status = read_response(s)[0]
                s.close()
            except OSError:
                status = 0
            if status == 200:
                break
            assert time.monotonic() < deadline and lb.poll() is None, \
                f"HAProxy never routed: {lb.log.text()[-2000:]} / {server.log.text()[-2000:]}"
            time.sleep(0.5)
        # Client 127.0.0.5 holds four requests open at codebox (bodies still coming).
        def open_post(source):
            return via_lb(source, f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{front}\r\n"
                                  f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                                  f"Content-Length: 100\r\n\r\n{{".encode())
        stalled += [open_post("127.0.0.5") for _ in range(4)]
        # Its next request is refused by codebox (its own cap), and HAProxy relays the
        # 503 with the reason; client 127.0.0.6 meanwhile gets through.
        deadline = time.monotonic() + 30
        while True:
            body = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
            s = via_lb("127.0.0.5", f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{front}\r\n"
                                    f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                                    f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status, head, text = read_response(s)
            s.close()
            if status == 503 and b"max_connections_per_peer = 4" in text:
                break
            assert time.monotonic() < deadline, (status, head, text[:300], server.log.text()[-2000:])
            time.sleep(0.3)
        s = via_lb("127.0.0.6", get("/healthz", front))
        assert read_response(s)[0] == 200
        s.close()
        assert logged(server, r"connection refused.*client=127\.0\.0\.5:\d+ via=Some\(127\.0\.0\.1:"), \
            server.log.text()[-3000:]
        # Nothing went wrong with HAProxy's own (LOCAL) checks or its headers.
        for bad in ["is required from", "malformed", "ended within"]:
            assert bad not in server.log.text(), server.log.text()[-3000:]
    finally:
        for s in stalled:
            s.close()
        if lb.poll() is None:
            lb.terminate()
            try:
                lb.wait(timeout=10)
            except subprocess.TimeoutExpired:
                lb.kill()
                lb.wait()
        server.close()


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
