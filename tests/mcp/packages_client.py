"""Packages on request through `codebox serve`, driven by the official Python MCP SDK.

Two servers:
- one whose index is a local one on 127.0.0.1 that this script builds and serves (wheels
  made here, one whose import would call the index back, a source-only package whose
  build would, a package with a denied dependency): offline and deterministic, it shows
  that installing never runs package code, and the errors;
- one with the default sources (the rootfs pip's index, the host npm's registry): real
  packages, one with native code, an npm package, reuse of a cached layer.

Usage: packages_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import base64
import hashlib
import http.server
import io
import json
import os
import sys
import tarfile
import tempfile
import threading
import time
import zipfile

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import server_env

CODEBOX = sys.argv[1]
LOCAL_CASES = []
TLS_CASES = []
REAL_CASES = []


def local(fn):
    LOCAL_CASES.append(fn)
    return fn


def real(fn):
    REAL_CASES.append(fn)
    return fn


def tls(fn):
    TLS_CASES.append(fn)
    return fn


def private_ca(tmp):
    """A CA and a 127.0.0.1 server certificate it signed, made with Debian's openssl:
    (ca.pem, an ssl.SSLContext serving the certificate)."""
    import ssl
    import subprocess

    def sh(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)

    sh("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
       "-subj", "/CN=codebox test private index CA",
       "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    sh("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=127.0.0.1")
    with open(os.path.join(tmp, "leaf.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    sh("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
       "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(os.path.join(tmp, "leaf.pem"), os.path.join(tmp, "leaf.key"))
    return os.path.join(tmp, "ca.pem"), context


# --- a local index --------------------------------------------------------------------

def wheel(name, version, files, requires=()):
    """A wheel (a zip with its .dist-info) as bytes."""
    dist = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    entries = dict(files)
    entries[f"{dist}/METADATA"] = meta
    entries[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    entries[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in entries.items():
            z.writestr(path, text)
    return buf.getvalue()


def sdist(name, version, setup_py):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, text in {f"{name}-{version}/setup.py": setup_py,
                           f"{name}-{version}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"}.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Index(http.server.BaseHTTPRequestHandler):
    """PEP 503 pages under /simple/<name>/, files under /files/; every path is logged."""
    files = {}      # filename -> bytes
    projects = {}   # name -> [filename]
    hits = []
    slow = set()    # files that never finish downloading

    def do_GET(self):  # noqa: N802 - the stdlib's name
        Index.hits.append(self.path)
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if len(parts) == 2 and parts[0] == "simple" and parts[1] in Index.projects:
            links = "".join(f'<a href="/files/{f}">{f}</a>\n' for f in Index.projects[parts[1]])
            self.answer(200, f"<html><body>\n{links}</body></html>".encode(), "text/html")
        elif len(parts) == 2 and parts[0] == "files" and parts[1] in Index.slow:
            self.send_response(200)
            self.send_header("content-length", str(len(Index.files[parts[1]])))
            self.end_headers()
            self.wfile.write(Index.files[parts[1]][:10])
            time.sleep(60)
        elif len(parts) == 2 and parts[0] == "files" and parts[1] in Index.files:
            self.answer(200, Index.files[parts[1]], "application/octet-stream")
        else:
            self.answer(404, b"not found", "text/plain")

    def answer(self, status, body, kind):
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def publish(filename, data):
    name = filename.split("-")[0].replace("_", "-")
    Index.files[filename] = data
    Index.projects.setdefault(name, []).append(filename)


class World:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-packages-test-")
        os.chmod(self.tmp.name, 0o755)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        marker = ("import urllib.request\ntry:\n    urllib.request.urlopen("
                  f"'http://127.0.0.1:{self.port}/marker-hit?by=%s', timeout=5)\n"
                  "except Exception:\n    pass\n")
        publish("cbxmarker-1.0-py3-none-any.whl", wheel("cbxmarker", "1.0", {
            "cbxmarker/__init__.py": marker % "import" + "VALUE = 42\n",
            "cbxmarker.pth": f"import cbxmarker\n",
        }))
        publish("cbxdep-1.0-py3-none-any.whl", wheel("cbxdep", "1.0", {"cbxdep.py": "X = 1\n"}))
        publish("cbxmain-1.0-py3-none-any.whl", wheel("cbxmain", "1.0", {"cbxmain.py": "import cbxdep\n"}, ["cbxdep"]))
        publish("cbxsdist-1.0.tar.gz", sdist("cbxsdist", "1.0", marker % "setup"))
        publish("cbxbig-1.0-py3-none-any.whl", wheel("cbxbig", "1.0", {
            "cbxbig/__init__.py": "", "cbxbig/blob.txt": base64.b64encode(os.urandom(3 << 20)).decode()}))
        Index.slow.add("cbxslow-1.0-py3-none-any.whl")
        publish("cbxslow-1.0-py3-none-any.whl", wheel("cbxslow", "1.0", {"cbxslow.py": ""}))
        # A wheel for another platform only.
        publish("cbxwin-1.0-cp311-cp311-win_amd64.whl", wheel("cbxwin", "1.0", {"cbxwin.py": ""}))
        self.config = os.path.join(self.tmp.name, "local.toml")
        with open(self.config, "w") as f:
            f.write(f"""
state_dir = "{self.tmp.name}/state-local"
[packages]
python_index = "http://127.0.0.1:{self.port}/simple"
allow_private = ["127.0.0.1:{self.port}"]
deny = ["cbxdep"]
max_layer_size = "2M"
install_timeout = "15s"
""")
        # The same index over HTTPS with a private CA, trusted through [network]
        # extra_roots (the sandboxes' network stays off).
        publish("cbxtls-1.0-py3-none-any.whl", wheel("cbxtls", "1.0", {"cbxtls.py": "OK = 'tls'\n"}))
        ca, context = private_ca(self.tmp.name)
        self.httpsd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
        self.httpsd.socket = context.wrap_socket(self.httpsd.socket, server_side=True)
        tls_port = self.httpsd.server_address[1]
        threading.Thread(target=self.httpsd.serve_forever, daemon=True).start()
        self.tls_config = os.path.join(self.tmp.name, "tls.toml")
        with open(self.tls_config, "w") as f:
            f.write(f"""
state_dir = "{self.tmp.name}/state-tls"
[network]
mode = "none"
extra_roots = ["{ca}"]
[packages]
python_index = "https://127.0.0.1:{tls_port}/simple"
allow_private = ["127.0.0.1:{tls_port}"]
install_timeout = "30s"
""")
        self.real_config = os.path.join(self.tmp.name, "real.toml")
        with open(self.real_config, "w") as f:
            f.write(f'state_dir = "{self.tmp.name}/state-real"\n')

    def server(self, config):
        env = server_env()
        env.update({"CODEBOX_CONFIG": config, "CODEBOX_POOL_SIZE": "1"})
        return StdioServerParameters(command=CODEBOX, args=["serve"], env=env)

    def marker_hits(self):
        return [h for h in Index.hits if "marker-hit" in h]

    def close(self):
        self.httpd.shutdown()
        self.httpsd.shutdown()
        self.tmp.cleanup()


async def run(s, language, code, **args):
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    return r, r.structured_content or {}


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "text", None))


def refused(r, *words):
    t = text_of(r)
    assert r.is_error, t
    for w in words:
        assert w in t, (w, t)


async def health(s):
    return (await s.call_tool("health", {})).structured_content["packages"]


# --- the local index over HTTPS with a private CA ----------------------------------------

@tls
async def a_private_index_over_https_is_trusted_through_extra_roots(s, w):
    r, sc = await run(s, "python", "import cbxtls\nprint(cbxtls.OK)", packages=["cbxtls"])
    assert not r.is_error, text_of(r)
    assert sc["stdout"] == "tls\n" and sc["packages"]["installed"] == ["cbxtls==1.0"], sc


# --- the local index -------------------------------------------------------------------

@local
async def installing_runs_no_package_code(s, w):
    code = """
import os, sys
print("installed", os.path.exists("/packages/site/cbxmarker/__init__.py"))
print("pth", os.path.exists("/packages/site/cbxmarker.pth"))
print("on path", "/packages/site" in sys.path)
"""
    r, sc = await run(s, "python", code, packages=["cbxmarker==1.0"])
    assert not r.is_error, text_of(r)
    assert sc["stdout"] == "installed True\npth True\non path True\n", sc["stdout"]
    assert sc["packages"]["installed"] == ["cbxmarker==1.0"], sc["packages"]
    assert sc.get("start") == "cold", sc.get("start")
    # pip unpacked the wheel and compiled its modules; nothing imported them (the .pth
    # file is not read either: Python runs without the site module).
    assert w.marker_hits() == [], w.marker_hits()
    # The control: the same code does call back when it runs (here, on the host).
    with zipfile.ZipFile(io.BytesIO(Index.files["cbxmarker-1.0-py3-none-any.whl"])) as z:
        exec(compile(z.read("cbxmarker/__init__.py"), "cbxmarker", "exec"), {})
    assert w.marker_hits() == ["/marker-hit?by=import"], w.marker_hits()
    Index.hits.clear()


@local
async def a_source_only_package_is_refused_without_being_built(s, w):
    r, _ = await run(s, "python", "pass", packages=["cbxsdist"])
    refused(r, "cbxsdist", "no binary wheel", "never builds")
    assert w.marker_hits() == [], w.marker_hits()


@local
async def unknown_names_missing_versions_and_other_platforms_are_named(s, w):
    r, _ = await run(s, "python", "pass", packages=["cbx-nope"])
    refused(r, "packages: cbx-nope: no such package on the index")
    r, _ = await run(s, "python", "pass", packages=["cbxmarker==9.9"])
    refused(r, "cbxmarker==9.9", "no version matches ==9.9 (available: 1.0)")
    r, _ = await run(s, "python", "pass", packages=["cbxwin"])
    refused(r, "cbxwin", "no wheel for this platform")


@local
async def installs_past_their_size_or_time_are_refused_and_nothing_is_kept(s, w):
    r, _ = await run(s, "python", "pass", packages=["cbxbig"])
    refused(r, "size limit")
    t0 = time.monotonic()
    r, _ = await run(s, "python", "pass", packages=["cbxslow"])
    refused(r, "took longer than 15 s", "install_timeout")
    assert time.monotonic() - t0 < 40, "the install was not cut at its timeout"
    layers = os.path.join(w.tmp.name, "state-local", "layers")
    staged = [n for n in os.listdir(layers) if n.startswith(".staging")]
    assert staged == [], staged
    r, sc = await run(s, "python", "print(1)")
    assert sc["stdout"] == "1\n", "the server goes on"


@local
async def denied_names_and_denied_dependencies_are_refused(s, w):
    before = len(Index.hits)
    r, _ = await run(s, "python", "pass", packages=["cbxdep"])
    refused(r, "cbxdep", "denied by packages.deny rule cbxdep")
    assert len(Index.hits) == before, "a denied name reached the index"
    r, _ = await run(s, "python", "pass", packages=["cbxmain"])
    refused(r, "a dependency is refused")


@local
async def bad_specifiers_are_refused_before_anything_runs(s, w):
    before = len(Index.hits)
    for bad in ["cbxmarker @ http://127.0.0.1:1/x.whl", "--index-url=http://evil/simple", "../x"]:
        r, _ = await run(s, "python", "pass", packages=[bad])
        refused(r, "packages:")
    r, _ = await run(s, "python", "pass", packages=["npm:lodash"])
    refused(r, "TypeScript specifier")
    assert len(Index.hits) == before


@local
async def concurrent_first_requests_install_once_and_the_layer_is_reused(s, w):
    h0 = await health(s)
    code = "import cbxmarker; print(cbxmarker.VALUE)"
    results = []

    async def one():
        results.append(await run(s, "python", code, packages=["cbxmarker"]))

    async with anyio.create_task_group() as tg:
        tg.start_soon(one)
        tg.start_soon(one)
    for r, sc in results:
        assert not r.is_error and sc["stdout"] == "42\n", text_of(r)
    h1 = await health(s)
    assert h1["installed"] == h0["installed"] + 1, (h0, h1)
    assert h1["reused"] >= h0["reused"] + 1, (h0, h1)
    # The import's call-back failed silently (no network): it never reached the index.
    assert w.marker_hits() == [], w.marker_hits()


@local
async def the_layer_is_read_only_and_a_session_keeps_it(s, w):
    code = """
try:
    open("/packages/site/cbxmarker/evil.py", "w")
    print("writable")
except OSError as e:
    print("read-only", e.errno)
"""
    r, sc = await run(s, "python", code, packages=["cbxmarker==1.0"], session="new")
    assert sc["stdout"] in ("read-only 30\n", "read-only 13\n"), sc["stdout"]
    sid = sc["session"]["id"]
    r, sc = await run(s, "python", "import cbxmarker; print(cbxmarker.VALUE)", session=sid)
    assert sc["stdout"] == "42\n", text_of(r)
    await s.call_tool("close_session", {"session": sid})


@local
async def requests_that_resolve_alike_share_one_layer(s, w):
    # `cbxmarker==1.0` and `cbxmarker` (cases above) were two installs of the same files:
    # one layer, named by its content, and two requests resolved to it.
    layers = os.path.join(w.tmp.name, "state-local", "layers", "python")
    holding = [n for n in os.listdir(layers)
               if os.path.isdir(os.path.join(layers, n, "site", "cbxmarker"))]
    assert len(holding) == 1, holding
    resolved = []
    for name in os.listdir(os.path.join(layers, "requests")):
        with open(os.path.join(layers, "requests", name)) as f:
            resolved.append(json.load(f)["layer"])
    assert resolved.count(holding[0]) == 2, (holding, resolved)


# --- the real sources ---------------------------------------------------------------

@real
async def a_real_package_installs_once_and_then_costs_little(s, w):
    code = "import six; print(six.__version__)"
    t0 = time.monotonic()
    r, sc = await run(s, "python", code, packages=["six==1.17.0"])
    first = time.monotonic() - t0
    assert not r.is_error and sc["stdout"] == "1.17.0\n", text_of(r)
    t0 = time.monotonic()
    r, sc = await run(s, "python", code, packages=["six==1.17.0"])
    again = time.monotonic() - t0
    assert not r.is_error and sc["stdout"] == "1.17.0\n", text_of(r)
    print(f"        six: first call {first * 1000:.0f} ms (install), again {again * 1000:.0f} ms (cached layer)")


@real
async def a_package_with_native_code_works(s, w):
    code = "import markupsafe, markupsafe._speedups as s; print(markupsafe.escape('<b>'), s.__file__.endswith('.so'))"
    r, sc = await run(s, "python", code, packages=["MarkupSafe==3.0.2"])
    assert not r.is_error, text_of(r)
    assert sc["stdout"] == "&lt;b&gt; True\n", sc["stdout"]
    assert "MarkupSafe==3.0.2" in sc["packages"]["installed"], sc["packages"]


@real
async def real_errors_name_the_package(s, w):
    r, _ = await run(s, "python", "pass", packages=["no-such-package-cbx-zz9"])
    refused(r, "no-such-package-cbx-zz9", "no such package on the index")
    r, _ = await run(s, "python", "pass", packages=["six==99.0"])
    refused(r, "six==99.0", "no version matches ==99.0")


@real
async def typescript_imports_of_npm_packages_are_installed(s, w):
    code = 'import isNumber from "npm:is-number@7.0.0";\nconsole.log(isNumber(5), isNumber("x"));'
    r, sc = await run(s, "typescript", code)
    assert not r.is_error, text_of(r)
    assert sc["stdout"] == "true false\n", sc["stdout"]
    assert sc["packages"]["requested"] == ["npm:is-number@7.0.0"], sc["packages"]
    r, _ = await run(s, "typescript", 'import x from "npm:no-such-package-cbx-zz9@1";')
    refused(r, "npm:no-such-package-cbx-zz9@1")
    # What the rootfs's cache holds needs no install, and stays importable next to a
    # package that is installed.
    h0 = await health(s)
    r, sc = await run(s, "typescript", 'import _ from "npm:lodash@4";\nconsole.log(_.chunk([1, 2, 3], 2).length);')
    assert not r.is_error and sc["stdout"] == "2\n", text_of(r)
    assert "packages" not in sc, sc.get("packages")
    code = ('import _ from "npm:lodash@4";\nimport isNumber from "npm:is-number@7.0.0";\n'
            'console.log(_.chunk([1, 2, 3], 2).length, isNumber(1));')
    r, sc = await run(s, "typescript", code)
    assert not r.is_error and sc["stdout"] == "2 true\n", text_of(r)
    assert sc["packages"]["requested"] == ["npm:is-number@7.0.0"], sc["packages"]
    h1 = await health(s)
    assert h1["installed"] == h0["installed"], "is-number's layer was already there"


async def session_cases(w, config, cases):
    passed = failed = 0
    async with stdio_client(w.server(config)) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for fn in cases:
                try:
                    with anyio.fail_after(300):
                        await fn(s, w)
                    print(f"ok      {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure
                    print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                    failed += 1
    return passed, failed


async def main():
    w = World()
    try:
        p1, f1 = await session_cases(w, w.config, LOCAL_CASES)
        pt, ft = await session_cases(w, w.tls_config, TLS_CASES)
        p1, f1 = p1 + pt, f1 + ft
        p2, f2 = (0, 0)
        if os.environ.get("CODEBOX_TEST_OFFLINE") != "1":
            p2, f2 = await session_cases(w, w.real_config, REAL_CASES)
    finally:
        w.close()
    print(f"{p1 + p2} passed, {f1 + f2} failed")
    return f1 + f2


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
