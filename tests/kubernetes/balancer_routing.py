"""The shipped balancer config (deploy/kubernetes/balancer/haproxy.cfg) routes by session.

Runs the real HAProxy on loopback with the shipped file, changed in exactly two lines:
the resolvers ask a DNS server this script runs (instead of the pod's resolv.conf) and the
frontend binds a loopback port. The DNS server plays the cluster's: replica names of the
headless Service resolve to loopback addresses where small HTTP servers answer with their
name; the Service `codebox` resolves to another one (any replica).

Checks: no session → any replica; a session (Mcp-Session-Id, Mcp-Param-Session, the
former winning) → its replica; a task (Mcp-Name of tasks/get, update, cancel) or a kept
output (Mcp-Name of resources/read codebox://executions/<id>/…) → its replica; a replica name that does not resolve → any replica; one
that resolves outside the pod network → 502; hostile values (other hosts, addresses,
near-miss names, commas, huge values) never reach anything but a replica or the Service.
Every connection to a backend starts with a PROXY protocol v2 header (the backends refuse
a request without one) naming the client; a client's X-Forwarded-For is not believed,
unless a second HAProxy, run with TRUSTED_FORWARDERS naming the client's network, takes
the last address in it.

usage: balancer_routing.py HAPROXY_CFG   (haproxy on PATH; exit 0 when every check held)
"""

import http.client
import http.server
import os
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time

NAMESPACE = "codebox"
DOMAIN = "cluster.local"
REPLICAS = {"codebox-0": "127.0.0.11", "codebox-1": "127.0.0.12", "codebox-2": "127.0.0.13"}
SERVICE = "127.0.0.20"
# A replica name whose record points outside the pod network (127.0.0.0/8 here).
OUTSIDE = ("codebox-5", "192.0.2.1")


def fqdn(name, service="codebox-replicas"):
    return f"{name}.{service}.{NAMESPACE}.svc.{DOMAIN}" if service else f"{name}.{NAMESPACE}.svc.{DOMAIN}"


RECORDS = {fqdn(n): ip for n, ip in REPLICAS.items()}
RECORDS[fqdn(OUTSIDE[0])] = OUTSIDE[1]
RECORDS[fqdn("codebox", service=None)] = SERVICE
QUERIES = []


def dns_answer(query):
    """An answer to one DNS query: A records from RECORDS, NXDOMAIN for other names."""
    ident, _flags, qdcount = struct.unpack("!HHH", query[:6])
    if qdcount != 1:
        return None
    labels, i = [], 12
    while query[i] != 0:
        n = query[i]
        labels.append(query[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype, _qclass = struct.unpack("!HH", query[i + 1 : i + 5])
    question = query[12 : i + 5]
    name = ".".join(labels).lower()
    QUERIES.append(name)
    ip = RECORDS.get(name)
    if ip is None:
        return struct.pack("!HHHHHH", ident, 0x8183, 1, 0, 0, 0) + question
    if qtype != 1:
        return struct.pack("!HHHHHH", ident, 0x8180, 1, 0, 0, 0) + question
    answer = struct.pack("!HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(ip)
    return struct.pack("!HHHHHH", ident, 0x8180, 1, 1, 0, 0) + question + answer


def serve_dns(sock):
    while True:
        try:
            query, peer = sock.recvfrom(4096)
        except OSError:
            return
        try:
            reply = dns_answer(query)
        except (IndexError, struct.error):
            reply = None
        if reply:
            sock.sendto(reply, peer)


PROXY_V2 = b"\r\n\r\n\0\r\nQUIT\n"


def read_proxy_v2(rfile):
    """The client a PROXY protocol v2 header names ("ip:port", or "LOCAL"); None when the
    connection does not start with one."""
    fixed = rfile.read(16)
    if len(fixed) < 16 or fixed[:12] != PROXY_V2 or fixed[12] >> 4 != 2:
        return None
    command, family = fixed[12] & 0xF, fixed[13]
    rest = rfile.read(struct.unpack("!H", fixed[14:16])[0])
    if command == 0:
        return "LOCAL"
    if family == 0x11:
        return f"{socket.inet_ntoa(rest[0:4])}:{struct.unpack('!H', rest[8:10])[0]}"
    if family == 0x21:
        return f"[{socket.inet_ntop(socket.AF_INET6, rest[0:16])}]:{struct.unpack('!H', rest[32:34])[0]}"
    return f"family {family:#x}"


class Named(http.server.BaseHTTPRequestHandler):
    """Answers every request with the name of the server it reached and the client its
    connection's PROXY v2 header named; refuses a connection without one, as codebox
    does from a trusted balancer."""

    def handle(self):
        self.client = read_proxy_v2(self.rfile)
        if self.client is None:
            self.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 15\r\n"
                             b"Connection: close\r\n\r\nno PROXY header\n")
            return
        super().handle()

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        reply = f"{self.server.name} {self.headers.get('Authorization')} {len(body)} {self.client}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = answer
    do_POST = answer

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_backends():
    """One HTTP server per replica address and one for the Service, on one shared port
    (the config sets one destination port for every replica). Retries another port when
    one of the addresses has it taken."""
    for _ in range(20):
        port = free_port()
        servers = []
        try:
            for name, ip in list(REPLICAS.items()) + [("service", SERVICE)]:
                s = Server((ip, port), Named)
                s.name = name
                servers.append(s)
        except OSError:
            for s in servers:
                s.server_close()
            continue
        for s in servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()
        return port, servers
    raise SystemExit("no free port on the loopback addresses")


def test_config(shipped, dns_port, front_port):
    """The shipped config with the resolvers and the bind address changed, nothing else."""
    text = open(shipped, encoding="utf-8").read()
    for old, new in [
        ("    parse-resolv-conf\n", f"    nameserver test 127.0.0.1:{dns_port}\n"),
        ("    bind :8080\n", f"    bind 127.0.0.1:{front_port}\n"),
    ]:
        if text.count(old) != 1:
            raise SystemExit(f"{shipped}: expected exactly one line {old.strip()!r}")
        text = text.replace(old, new)
    return text


def ask(port, headers, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST" if body else "GET", "/mcp", body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def start_haproxy(shipped, dns_port, backend_port, extra_env):
    """HAProxy on the shipped file (resolvers and bind changed), once it routes: the
    process, its front port and its config file."""
    front = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False)
    cfg.write(test_config(shipped, dns_port, front))
    cfg.close()
    env = dict(
        os.environ,
        POD_NAMESPACE=NAMESPACE,
        CLUSTER_DOMAIN=DOMAIN,
        POD_CIDR="127.0.0.0/8",
        CODEBOX_PORT=str(backend_port),
        **extra_env,
    )
    proxy = subprocess.Popen(
        ["haproxy", "-db", "-f", cfg.name],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    # The Service's address comes from the resolvers shortly after start.
    deadline = time.monotonic() + 15
    while True:
        try:
            status, body = ask(front, {})
            if status == 200 and body.startswith("service"):
                return proxy, front, cfg.name
        except OSError:
            pass
        if proxy.poll() is not None or time.monotonic() > deadline:
            if proxy.poll() is None:
                proxy.kill()
            raise SystemExit(
                "haproxy did not come up or never resolved the Service: "
                + proxy.stderr.read().decode(errors="replace")[-2000:]
            )
        time.sleep(0.2)


def stop(proxy, cfg_name):
    proxy.terminate()
    try:
        proxy.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proxy.kill()
        proxy.wait()
    os.unlink(cfg_name)


def main():
    shipped = sys.argv[1]
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind(("127.0.0.1", 0))
    threading.Thread(target=serve_dns, args=(dns,), daemon=True).start()
    backend_port, servers = start_backends()
    failures = []
    proxy, front, cfg_name = start_haproxy(shipped, dns.getsockname()[1], backend_port, {})
    try:
        def check(what, headers, want_status, want_name, body=None, port=None):
            status, text = ask(port or front, headers, body)
            name = text.split(" ")[0] if status == 200 else None
            ok = status == want_status and (want_name is None or name == want_name)
            print(f"{'ok  ' if ok else 'FAIL'} {what}: {status} {name}")
            if not ok:
                failures.append(what)
            return text

        sid, psid = "Mcp-Session-Id", "Mcp-Param-Session"
        check("no session: any replica (the Service)", {}, 200, "service")
        for name in REPLICAS:
            check(f"{sid} of {name}", {sid: f"{name}.6f1c0e"}, 200, name)
            check(f"{psid} of {name}", {psid: f"{name}.77aa"}, 200, name)
        check(
            "both headers: the MCP session wins",
            {sid: "codebox-0.a1", psid: "codebox-2.b2"},
            200,
            "codebox-0",
        )
        text = check(
            "a POST with a token and a body reaches the replica whole",
            {psid: "codebox-1.x", "Authorization": "Bearer t0k", "Content-Type": "application/json"},
            200,
            "codebox-1",
            body=b"x" * 70000,
        )
        if not text.startswith("codebox-1 Bearer t0k 70000 127.0.0.1:"):
            failures.append(f"request altered on the way, or no PROXY header naming the client: {text!r}")
        # Both backends get the client in a PROXY v2 header; a client's own
        # X-Forwarded-For is not believed.
        for what, headers in [("the Service", {}), ("a replica", {psid: "codebox-2.c"})]:
            text = check(f"PROXY header to {what}, X-Forwarded-For ignored",
                         {**headers, "X-Forwarded-For": "203.0.113.9"}, 200, None)
            if not text.split(" ")[-1].startswith("127.0.0.1:"):
                failures.append(f"PROXY header to {what} does not name the client: {text!r}")
        # A 2026-07-28 client polls its task and reads its execution's kept output by ids
        # that name the replica; the SDKs put them in Mcp-Name (rmcp checks it against
        # the body).
        method, mname = "Mcp-Method", "Mcp-Name"
        for verb in ("get", "update", "cancel"):
            check(f"tasks/{verb} of codebox-1", {method: f"tasks/{verb}", mname: "codebox-1.0f3e-9a"}, 200, "codebox-1")
        for tail in ("stdout", "stderr?page=2", "files/out/a%20b.csv"):
            check(
                f"resources/read of codebox-2's kept {tail}",
                {method: "resources/read", mname: f"codebox://executions/codebox-2.00ff/{tail}"},
                200,
                "codebox-2",
            )
        check(
            "an MCP session still wins over Mcp-Name",
            {sid: "codebox-0.a1", method: "tasks/get", mname: "codebox-2.b2"},
            200,
            "codebox-0",
        )
        for what, headers in [
            ("a tool's name is not a session", {method: "tools/call", mname: "codebox-1.x"}),
            ("a prompt's name is not a session", {method: "prompts/get", mname: "codebox-1.x"}),
            ("another resource", {method: "resources/read", mname: "codebox://servers/codebox-1.ts"}),
            ("a kept output's URI under another method", {method: "tasks/list", mname: "codebox://executions/codebox-1.a/stdout"}),
            ("a near-miss method", {method: "tasks/getx", mname: "codebox-1.x"}),
            ("a near-miss URI", {method: "resources/read", mname: "xcodebox://executions/codebox-1.a/stdout"}),
            ("a host in the URI", {method: "resources/read", mname: "codebox://executions/evil.example.com/stdout"}),
        ]:
            check(f"{what}: any replica", headers, 200, "service")
        check("a replica name that does not resolve: any replica", {psid: "codebox-7.ab"}, 200, "service")
        check("a replica record outside the pod network: refused", {psid: f"{OUTSIDE[0]}.ab"}, 502, None)
        hostile = [
            "evil.example.com",
            "127.0.0.11.x",
            "codebox-1x.ab",
            "Codebox-1.ab",
            "codebox-12345.ab",
            "codebox-0,codebox-1.ab",
            "codebox-.ab",
            "codebox--1.ab",
            "codebox-1%2e.ab",
            "codebox-1:8080.ab",
            "x" * 6000,
        ]
        for value in hostile:
            for header in (sid, psid):
                check(f"hostile {header} {value[:40]!r}: any replica", {header: value}, 200, "service")
        # Only the replica's own label is used: the rest of the id never reaches DNS.
        check("a long tail after the replica name", {psid: "codebox-2." + "a.b" * 500}, 200, "codebox-2")
        asked = sorted(set(QUERIES))
        allowed = set(RECORDS) | {fqdn("codebox-7")}
        stray = [q for q in asked if q not in allowed]
        print(f"DNS names asked: {asked}")
        if stray:
            failures.append(f"the balancer asked DNS for names it should never build: {stray}")
    finally:
        stop(proxy, cfg_name)
    # Behind a trusted forwarder (an Ingress controller on 127.0.0.0/8 here): the last
    # address of its X-Forwarded-For is the client; without a usable one, the forwarder.
    proxy, front, cfg_name = start_haproxy(
        shipped, dns.getsockname()[1], backend_port, {"TRUSTED_FORWARDERS": "127.0.0.0/8"}
    )
    try:
        for what, headers, want in [
            ("the forwarder's client", {"X-Forwarded-For": "198.51.100.1, 203.0.113.9"}, "203.0.113.9:"),
            ("one address", {"X-Forwarded-For": "198.51.100.1"}, "198.51.100.1:"),
            ("IPv6", {"X-Forwarded-For": "2001:db8::7"}, "[2001:db8::7]:"),
            ("garbage: the forwarder", {"X-Forwarded-For": "not-an-address"}, "127.0.0.1:"),
            ("none: the forwarder", {}, "127.0.0.1:"),
        ]:
            for target in ({}, {"Mcp-Param-Session": "codebox-0.x"}):
                text = check(f"TRUSTED_FORWARDERS, {what}", {**headers, **target}, 200, None, port=front)
                if not text.split(" ")[-1].startswith(want):
                    failures.append(f"TRUSTED_FORWARDERS, {what}: {text!r}, want {want}")
    finally:
        stop(proxy, cfg_name)
        for s in servers:
            s.shutdown()
            s.server_close()
        dns.close()
    if failures:
        print(f"{len(failures)} failed: {failures}")
        return 1
    print("balancer routing: every check held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
