"""codebox's package installer: runs as the program of an installer sandbox.

The request is /workspace/request.json; the installed set goes to /workspace/layer (the
only writable host directory this sandbox has); the last stdout line is the report,
`CODEBOX-INSTALL {json}`. The sandbox's only way out is the egress proxy, narrowed to the
configured index and registries.

No package code runs here: pip installs binary wheels only (`--only-binary=:all:`:
unpacking a wheel and byte-compiling its modules execute none of them), and Deno's
`cache` downloads and transpiles npm/jsr packages without running them or their
lifecycle scripts. Everything is first written under /tmp (a size-limited tmpfs, so an
oversized set fails with ENOSPC there), then copied to the layer.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

REQUEST = json.load(open("/workspace/request.json"))
STAGE = "/tmp/layer"
OUT = "/workspace/layer"
PIP_DIR = "/opt/codebox/installer"
ROOTFS_DENO_CACHE = "/opt/codebox/deno-cache"
TAIL = 1500


def report(**fields):
    print("CODEBOX-INSTALL " + json.dumps(fields), flush=True)
    sys.exit(0)


def fail(package, reason):
    report(ok=False, package=package, reason=reason)


def tail(text):
    text = text.strip()
    return text if len(text) <= TAIL else "..." + text[-TAIL:]


def no_space(text):
    return any(m in text for m in ("No space left on device", "Errno 28",
                                   "File too large", "Errno 27"))


def finish(installed):
    try:
        shutil.copytree(STAGE, OUT, symlinks=True, dirs_exist_ok=True)
    except OSError as e:
        if e.errno in (27, 28):
            fail(None, "the packages exceed the size limit")
        raise
    report(ok=True, installed=installed)


# --- Python -------------------------------------------------------------------------

def pip(*args):
    code = ("import sys; sys.path.insert(0, %r); import runpy; "
            "runpy.run_module('pip', run_name='__main__', alter_sys=True)" % PIP_DIR)
    env = dict(os.environ, PIP_CONFIG_FILE="/dev/null", PIP_NO_INPUT="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", HOME="/tmp")
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, *args],
                          capture_output=True, text=True, env=env)


def index_page(index, name):
    """The index's files of `name` (PEP 691 JSON, or PEP 503 HTML): [(filename, yanked)],
    or None when the index does not know the name."""
    url = index.rstrip("/") + "/" + name + "/"
    req = urllib.request.Request(url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read(32 << 20)
            kind = r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
    if "json" in kind:
        data = json.loads(body)
        return [(f["filename"], bool(f.get("yanked"))) for f in data.get("files", [])]
    text = body.decode("utf-8", "replace")
    files = []
    for m in re.finditer(r'<a\s[^>]*href="([^"#?]+)[^"]*"([^>]*)>', text, re.I):
        files.append((m.group(1).rsplit("/", 1)[-1], "data-yanked" in m.group(2)))
    return files


def why_unavailable(index, requirement):
    """Why pip found nothing for `requirement`, in words the model can act on."""
    sys.path.insert(0, PIP_DIR)
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename

    req = Requirement(requirement)
    name = canonicalize_name(req.name)
    try:
        files = index_page(index, name)
    except Exception as e:  # noqa: BLE001 - any failure is reported as such
        return "the index could not be asked about it (%s)" % e
    if files is None:
        return "no such package on the index"
    wheels = []
    for filename, yanked in files:
        if filename.endswith(".whl") and not yanked:
            try:
                wheels.append(parse_wheel_filename(filename))
            except Exception:  # noqa: BLE001 - a name pip would skip too
                pass
    if not wheels:
        return ("it has no binary wheel, only source distributions, which codebox never "
                "builds (building runs the package's code)")
    supported = set(sys_tags())
    ours = [w for w in wheels if w[3] & supported]
    if not ours:
        return ("it has no wheel for this platform (CPython %d.%d, Linux x86_64)"
                % sys.version_info[:2])
    versions = sorted({w[1] for w in ours}, reverse=True)
    matches = lambda vs: any(req.specifier.contains(v, prereleases=True) for v in vs)
    if req.specifier and not matches(versions):
        shown = ", ".join(str(v) for v in versions[:8])
        if matches({w[1] for w in wheels}):
            return ("no wheel of %s%s for this platform (CPython %d.%d, Linux x86_64); "
                    "versions that have one: %s" % (name, req.specifier, *sys.version_info[:2], shown))
        return "no version matches %s (available: %s)" % (req.specifier, shown)
    return None


def install_python():
    index = REQUEST["python_index"]
    specs = REQUEST["specs"]
    # --no-compile, then compileall with unchecked hashes: pip's own pycs carry the
    # install's timestamps, so two installs of one set would differ in bytes (and a layer
    # is named by its bytes). A read-only layer needs no timestamp check anyway.
    args = ["install", "--only-binary=:all:", "--no-cache-dir", "--progress-bar", "off",
            "--no-compile",
            "--no-warn-script-location", "--target", STAGE + "/site",
            "--report", "/tmp/report.json", "--index-url", index]
    host = re.match(r"^http://([^/:]+)", index)
    if host:
        args += ["--trusted-host", host.group(1)]
    done = pip(*args, *specs)
    if done.returncode != 0:
        err = done.stderr + done.stdout
        if no_space(err):
            fail(None, "the packages exceed the size limit")
        missing = re.search(r"No matching distribution found for (\S+)", err)
        if missing:
            wanted = missing.group(1)
            asked = next((s for s in specs if re.split(r"[\[<>=!~]", s)[0] == re.split(r"[\[<>=!~]", wanted)[0]), None)
            reason = why_unavailable(index, asked or wanted)
            if asked is None:
                fail(wanted, "a dependency cannot be installed: " + (reason or tail(err)))
            fail(asked, reason or tail(err))
        if "ResolutionImpossible" in err or "conflict" in err.lower():
            lines = [l for l in err.splitlines() if "conflict" in l.lower() or "requires" in l or l.strip().startswith("The user requested")]
            fail(None, "the requested packages conflict: " + tail("\n".join(lines) or err))
        fail(None, "pip failed: " + tail(err))
    compiled = subprocess.run(
        [sys.executable, "-I", "-S", "-m", "compileall", "-q", "-j0",
         "--invalidation-mode", "unchecked-hash", STAGE + "/site"],
        capture_output=True, text=True)
    if compiled.returncode != 0 and no_space(compiled.stderr + compiled.stdout):
        fail(None, "the packages exceed the size limit")
    try:
        installed = json.load(open("/tmp/report.json")).get("install", [])
        names = sorted("%s==%s" % (i["metadata"]["name"], i["metadata"]["version"]) for i in installed)
    except (OSError, ValueError, KeyError):
        names = []
    finish(names)


# --- TypeScript ---------------------------------------------------------------------

def install_typescript():
    specs = REQUEST["specs"]
    entry = "/tmp/codebox-packages.ts"
    with open(entry, "w") as f:
        for s in specs:
            f.write("import %s;\n" % json.dumps(s))
    # The layer replaces the rootfs's cache as DENO_DIR: it starts as a copy of it, so what
    # the rootfs holds stays importable next to what is installed now.
    if os.path.isdir(ROOTFS_DENO_CACHE):
        shutil.copytree(ROOTFS_DENO_CACHE, STAGE + "/deno", symlinks=True)
        for root, dirs, files in os.walk(STAGE + "/deno"):
            for n in dirs + files:
                p = os.path.join(root, n)
                if not os.path.islink(p):
                    os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
    env = dict(os.environ, DENO_DIR=STAGE + "/deno", DENO_NO_UPDATE_CHECK="1",
               NO_COLOR="1", HOME="/tmp")
    for k in ("DENO_EMIT_CACHE_MODE", "DENO_CACHE_DB_MODE"):
        env.pop(k, None)
    if REQUEST.get("npm_registry"):
        env["NPM_CONFIG_REGISTRY"] = REQUEST["npm_registry"]
    if REQUEST.get("jsr_registry"):
        env["JSR_URL"] = REQUEST["jsr_registry"]
    done = subprocess.run(["/usr/bin/deno", "cache", "--no-config", "--no-lock", entry],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        err = done.stderr + done.stdout
        if no_space(err):
            fail(None, "the packages exceed the size limit")
        for s in specs:
            name = s.split(":", 1)[1]
            bare = name.rsplit("@", 1)[0] if name.count("@") > (1 if name.startswith("@") else 0) else name
            if bare in err:
                if "Could not find npm package" in err or "not found" in err.lower():
                    fail(s, "no such package (or version) on the registry: " + tail(err))
                fail(s, tail(err))
        fail(None, "deno cache failed: " + tail(err))
    finish(sorted(specs))


if REQUEST["language"] == "python":
    install_python()
else:
    install_typescript()
