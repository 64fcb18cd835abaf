"""PII tokenization, skills, sessions, the audit log and rate limits, end to end through
`codebox serve`, driven by the official Python MCP SDK as the model's client.

Usage: features_client.py CODEBOX_BINARY UPSTREAMS_DIR
UPSTREAMS_DIR holds node/node_modules/@modelcontextprotocol/server-memory, as `cargo xtask
test` installs it. Prints one line per case and "N passed, M failed".
"""

import glob
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
import httpx2

from helpers import DrainedStderr, processes_with, server_env

CODEBOX = sys.argv[1]
UPSTREAMS = os.path.abspath(sys.argv[2])
MEMORY = os.path.join(UPSTREAMS, "node/node_modules/@modelcontextprotocol/server-memory/dist/index.js")
EMAIL = "alice.liddell@example.com"
CASES = []
TTL_S = 4


def case(fn):
    CASES.append(fn)
    return fn


class World:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-features-test-")
        root = self.tmp.name
        os.chmod(root, 0o755)
        self.memory_file = os.path.join(root, "memory.jsonl")
        self.skills = os.path.join(root, "skills")
        self.audit = os.path.join(root, "audit", "audit.jsonl")
        self.config = os.path.join(root, "mcp.json")
        with open(self.config, "w") as f:
            json.dump({"mcpServers": {
                "memory": {"command": "node", "args": [MEMORY], "env": {"MEMORY_FILE_PATH": self.memory_file}},
            }}, f)

    def env(self, **extra):
        env = server_env()
        env.update({
            "CODEBOX_MCP_CONFIG": self.config,
            "CODEBOX_SKILLS_DIR": self.skills,
            "CODEBOX_AUDIT_LOG": self.audit,
            "CODEBOX_PII": "output",
            "CODEBOX_SESSION_QUOTA": "1MiB",
            "CODEBOX_SESSION_MAX_ENTRIES": "50",
            "CODEBOX_SESSION_TTL": f"{TTL_S}s",
        })
        env.update(extra)
        return env

    def server(self, **extra):
        return StdioServerParameters(command=CODEBOX, args=["serve"], env=self.env(**extra))


async def run(s, language, code, **args):
    r = await s.call_tool(f"execute_{language}", {"code": code, **args})
    return r, r.structured_content or {}


def ok(r, sc):
    assert not r.is_error, sc.get("stderr") or r.content


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "text", None))


async def wait_for_memory(s):
    deadline = time.monotonic() + 60
    while True:
        r = await s.call_tool("list_servers", {})
        if all(x["status"] == "ready" for x in r.structured_content["servers"]):
            return
        assert time.monotonic() < deadline, r.structured_content
        await anyio.sleep(0.3)


# --- PII ---------------------------------------------------------------------------

@case
async def pii_output_mode_tokenizes_output_and_restores_arguments(s, w):
    await wait_for_memory(s)
    create = f"""
import codebox
codebox.call_tool("memory__create_entities", {{"entities": [
    {{"name": "alice", "entityType": "person", "observations": ["email {EMAIL}", "phone +1 415 555 0123"]}}]}})
obs = codebox.call_tool("memory__open_nodes", {{"names": ["alice"]}})["entities"][0]["observations"]
print(obs)
print("code sees the real value:", {EMAIL!r} in obs[0])
"""
    r, sc = await run(s, "python", create)
    ok(r, sc)
    out = sc["stdout"]
    assert EMAIL not in out and "[EMAIL_1]" in out and "[PHONE_1]" in out, out
    assert "code sees the real value: True" in out, out
    assert EMAIL not in json.dumps(r.model_dump(mode="json")), "raw PII in the MCP result"
    # The model only knows the token; the code passes it to another tool, and the
    # upstream receives the real value.
    forward = """
import codebox
codebox.call_tool("memory__create_entities", {"entities": [
    {"name": "bob", "entityType": "person", "observations": ["friend of [EMAIL_1]"]}]})
print(codebox.call_tool("memory__open_nodes", {"names": ["bob"]})["entities"][0]["observations"])
"""
    r, sc = await run(s, "python", forward)
    ok(r, sc)
    assert sc["stdout"] == "['friend of [EMAIL_1]']\n", sc["stdout"]
    with open(w.memory_file) as f:
        stored = f.read()
    assert f"friend of {EMAIL}" in stored, stored


@case
async def pii_strict_mode_keeps_raw_values_out_of_the_sandbox(s, w):
    code = f"""
import codebox
obs = codebox.call_tool("memory__open_nodes", {{"names": ["alice"]}})["entities"][0]["observations"]
print(obs[0])
print("raw value visible:", "example.com" in " ".join(obs))
codebox.call_tool("memory__add_observations", {{"observations": [
    {{"entityName": "alice", "contents": ["strict copy: " + obs[0]]}}]}})
"""
    r, sc = await run(s, "python", code, pii="strict")
    ok(r, sc)
    assert "raw value visible: False" in sc["stdout"], sc["stdout"]
    assert "[EMAIL_1]" in sc["stdout"], sc["stdout"]
    with open(w.memory_file) as f:
        stored = f.read()
    assert f"strict copy: email {EMAIL}" in stored, "the token went upstream unrestored"
    # A call may not weaken the server's mode; the message names modes as they are
    # written, not as Rust spells them.
    r, _ = await run(s, "python", "print(1)", pii="off")
    assert r.is_error and 'pii "off" is weaker than this server\'s "output"' in text_of(r), text_of(r)


@case
async def resources_list_tokenizes_workspace_file_names(s, w):
    r, sc = await run(s, "python", f"open({EMAIL + '.txt'!r}, 'w').write('mail ' + {EMAIL!r})", session="new")
    ok(r, sc)
    sid = sc["session"]["id"]
    listed = await s.list_resources()
    dumped = json.dumps(listed.model_dump(mode="json"))
    assert EMAIL not in dumped and "example.com" not in dumped, "raw PII in resources/list"
    ours = [x for x in listed.resources if f"/{sid}/" in str(x.uri)]
    assert len(ours) == 1 and "EMAIL_" in ours[0].name, [(str(x.uri), x.name) for x in ours]
    # The tokenized URI reads the real file, whose text comes back tokenized.
    res = await s.read_resource(ours[0].uri)
    assert res.contents[0].text.startswith("mail [EMAIL_"), res.contents[0].text
    assert EMAIL not in res.contents[0].text
    await s.call_tool("close_session", {"session": sid})


@case
async def resources_list_of_long_workspace_paths_fits_one_message(s, w):
    # 35 files under a 3.5 KB directory path of control bytes (each escaped as six in
    # JSON): listed whole, 1.5 MB, more than a client accepts in one message. The
    # listing stops at its budget instead.
    code = ("import os\nd = '/'.join(['\\x01' * 250] * 14)\nos.makedirs(d)\n"
            "for i in range(35):\n    open(os.path.join(d, 'f%03d' % i + '\\x01' * 200), 'w').write('x')\n")
    r, sc = await run(s, "python", code, session="new")
    ok(r, sc)
    sid = sc["session"]["id"]
    try:
        listed = await s.list_resources()
        size = len(json.dumps(listed.model_dump(mode="json", by_alias=True, exclude_none=True)))
        ours = [x for x in listed.resources if f"/{sid}/" in str(x.uri)]
        assert size < 1_000_000 and 0 < len(ours) < 35, (size, len(ours))
    finally:
        await s.call_tool("close_session", {"session": sid})


# --- skills -------------------------------------------------------------------------

@case
async def skills_save_list_import_and_delete(s, w):
    r = await s.call_tool("save_skill", {
        "name": "double", "description": "Doubles a number", "language": "python",
        "code": "def double(x):\n    return 2 * x\n"})
    assert not r.is_error, text_of(r)
    r = await s.call_tool("save_skill", {
        "name": "shout", "description": "Upper-cases text with a bang", "language": "typescript",
        "code": "export function shout(s: string): string { return s.toUpperCase() + '!'; }\n"})
    assert not r.is_error, text_of(r)
    r = await s.call_tool("list_skills", {})
    names = [x["name"] for x in r.structured_content["skills"]]
    assert names == ["double", "shout"], names
    assert "code" not in json.dumps(r.structured_content), "list_skills carries no code"
    r = await s.call_tool("list_skills", {"query": "bang"})
    assert [x["name"] for x in r.structured_content["skills"]] == ["shout"], r.structured_content
    r, sc = await run(s, "python", "from skills import double\nfrom skills.double import double as d2\nprint(double.double(21), d2(4))")
    ok(r, sc)
    assert sc["stdout"] == "42 8\n", sc
    r, sc = await run(s, "typescript", 'import { shout } from "/skills/shout/skill.ts";\nconsole.log(shout("hi"));')
    ok(r, sc)
    assert sc["stdout"] == "HI!\n", sc
    # Read-only in the sandbox.
    r, sc = await run(s, "python", "open('/skills/double/skill.py', 'w').write('x')")
    assert r.is_error and ("Read-only" in sc["stderr"] or "Permission" in sc["stderr"]), sc["stderr"]
    r = await s.call_tool("get_skill", {"name": "double"})
    assert r.structured_content["code"].startswith("def double"), r.structured_content
    res = await s.read_resource("codebox://skills/double/SKILL.md")
    assert "name: double" in res.contents[0].text, res
    r = await s.call_tool("delete_skill", {"name": "shout"})
    assert not r.is_error
    r = await s.call_tool("get_skill", {"name": "shout"})
    assert r.is_error


@case
async def bad_skill_names_are_refused_and_concurrent_saves_are_safe(s, w):
    for bad in ["../evil", "a/b", "Upper", "1x", "class", "", "x" * 65]:
        r = await s.call_tool("save_skill", {"name": bad, "description": "d", "language": "python", "code": "x = 1\n"})
        assert r.is_error and "name" in text_of(r), (bad, text_of(r))
    assert not os.path.exists(os.path.join(w.tmp.name, "evil"))

    async def save(i):
        r = await s.call_tool("save_skill", {
            "name": f"s{i % 4}", "description": f"version {i}", "language": "python",
            "code": f"VALUE = {i}\n"})
        assert not r.is_error, text_of(r)

    async with anyio.create_task_group() as tg:
        for i in range(16):
            tg.start_soon(save, i)
    r = await s.call_tool("list_skills", {"query": "version"})
    assert sorted(x["name"] for x in r.structured_content["skills"]) == ["s0", "s1", "s2", "s3"]
    r, sc = await run(s, "python", "from skills import s0, s1, s2, s3\nprint(sorted(m.VALUE % 4 for m in (s0, s1, s2, s3)))")
    ok(r, sc)
    assert sc["stdout"] == "[0, 1, 2, 3]\n", sc
    assert not glob.glob(os.path.join(w.skills, "**", ".tmp-*"), recursive=True), "temp dirs left"


@case
async def skills_reach_the_model_tokenized_and_round_trip(s, w):
    code = f"CONTACT = {EMAIL!r}\n"
    r = await s.call_tool("save_skill", {"name": "contact", "description": f"Mails {EMAIL}",
                                         "language": "python", "code": code})
    assert not r.is_error, text_of(r)
    seen = []
    seen.append(await s.call_tool("list_skills", {}))
    got = await s.call_tool("get_skill", {"name": "contact"})
    seen.append(got)
    seen.append(await s.list_resources())
    seen.append(await s.read_resource("codebox://skills/contact/skill.py"))
    for x in seen:
        dumped = json.dumps(x.model_dump(mode="json"))
        assert EMAIL not in dumped and "example.com" not in dumped, dumped
    assert "[EMAIL_" in got.structured_content["code"], got.structured_content
    # The model saves back what it saw: the skill keeps the real value.
    r = await s.call_tool("save_skill", {"name": "contact", "description": got.structured_content["description"],
                                         "language": "python", "code": got.structured_content["code"]})
    assert not r.is_error, text_of(r)
    files = glob.glob(os.path.join(w.skills, "by-client", "*", "own", "contact", "skill.py"))
    assert len(files) == 1, files
    with open(files[0]) as f:
        assert f.read() == code
    r, sc = await run(s, "python", "from skills import contact\nprint(contact.CONTACT.endswith('example.com'))")
    ok(r, sc)
    assert sc["stdout"] == "True\n", sc
    await s.call_tool("delete_skill", {"name": "contact"})


@case
async def a_live_session_sees_skills_saved_after_it_started(s, w):
    r, sc = await run(s, "python", "import os\nbefore = sorted(os.listdir('/skills'))", session="new", keep_alive=True)
    ok(r, sc)
    sid = sc["session"]["id"]
    r = await s.call_tool("save_skill", {"name": "fresh", "description": "Saved later", "language": "python",
                                         "code": "def hello():\n    return 'fresh'\n"})
    assert not r.is_error, text_of(r)
    r, sc = await run(s, "python", "from skills import fresh\nprint(fresh.hello(), 'fresh' in before)", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "fresh False\n" and sc["session"]["interpreter"] == "kept", sc
    await s.call_tool("delete_skill", {"name": "fresh"})
    await s.call_tool("close_session", {"session": sid})


@case
async def skills_with_bad_syntax_are_refused_with_the_compilers_message(s, w):
    r = await s.call_tool("save_skill", {
        "name": "broken_py", "description": "Broken", "language": "python",
        "code": "def f(:\n    return 1\n"})
    assert r.is_error and "does not compile" in text_of(r) and "SyntaxError" in text_of(r), text_of(r)
    assert "skill.py" in text_of(r) and "line 1" in text_of(r), text_of(r)
    r = await s.call_tool("save_skill", {
        "name": "broken_ts", "description": "Broken", "language": "typescript",
        "code": "export function f(x: number): number { return x +; }\n"})
    assert r.is_error and "does not compile" in text_of(r), text_of(r)
    assert "skill.ts:1" in text_of(r) and "/tmp/codebox-skill-check" not in text_of(r), text_of(r)
    # The check compiles, never runs: code with effects at import time saves fine and
    # its effects did not happen during the save.
    for lang, code in [("python", "open('/tmp/ran', 'w')\nraise SystemExit(3)\n"),
                       ("typescript", "await Deno.writeTextFile('/tmp/ran', 'x');\nDeno.exit(3);\nexport const x: number = 1;\n")]:
        r = await s.call_tool("save_skill", {"name": f"effects_{lang[:2]}", "description": "Effects", "language": lang, "code": code})
        assert not r.is_error, text_of(r)
        await s.call_tool("delete_skill", {"name": f"effects_{lang[:2]}"})
    r = await s.call_tool("list_skills", {})
    names = [x["name"] for x in r.structured_content["skills"]]
    assert "broken_py" not in names and "broken_ts" not in names, names
    # A skill importing another skill as it sits in /skills is checked where it will live.
    r = await s.call_tool("save_skill", {"name": "base_ts", "description": "Base", "language": "typescript",
                                         "code": "export const base = 40;\n"})
    assert not r.is_error, text_of(r)
    r = await s.call_tool("save_skill", {"name": "uses_base", "description": "Uses base", "language": "typescript",
                                         "code": "import { base } from '../base_ts/skill.ts';\nexport const answer = base + 2;\n"})
    assert not r.is_error, text_of(r)
    r, sc = await run(s, "typescript", 'import { answer } from "/skills/uses_base/skill.ts";\nconsole.log(answer);')
    ok(r, sc)
    assert sc["stdout"] == "42\n", sc
    r = await s.call_tool("save_skill", {"name": "uses_missing", "description": "Broken import", "language": "typescript",
                                         "code": "import { nope } from '../missing_skill/skill.ts';\nexport const x = nope;\n"})
    assert r.is_error and "missing_skill" in text_of(r), text_of(r)
    for n in ("uses_base", "base_ts"):
        await s.call_tool("delete_skill", {"name": n})
    # Type errors are not syntax errors (no type check): saved.
    r = await s.call_tool("save_skill", {
        "name": "typed", "description": "Typed", "language": "typescript",
        "code": "export const n: number = 'not a number' as unknown as number;\n"})
    assert not r.is_error, text_of(r)
    await s.call_tool("delete_skill", {"name": "typed"})


# --- sessions -----------------------------------------------------------------------

@case
async def keep_alive_sessions_keep_interpreter_state(s, w):
    r, sc = await run(s, "python", "x = 41\nimport math\ndef f(v):\n    return v * 2\n", session="new", keep_alive=True)
    ok(r, sc)
    sid = sc["session"]["id"]
    assert sc["session"]["interpreter"] == "new", sc["session"]
    r, sc = await run(s, "python", "print(x + 1, math.pi > 3, f(5))", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "42 True 10\n" and sc["session"]["interpreter"] == "kept", sc
    # An uncaught error fails the run, not the session.
    r, sc = await run(s, "python", "raise ValueError('boom')", session=sid)
    assert r.is_error and "ValueError: boom" in sc["stderr"], sc
    r, sc = await run(s, "python", "x += 1\nprint(x)", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "42\n", sc
    # TypeScript in the same session has its own interpreter.
    r, sc = await run(s, "typescript", "let y = 41;\nconst { a, b } = { a: 1, b: 2 };\nfunction g(v: number) { return v + a + b; }", session=sid, keep_alive=True)
    ok(r, sc)
    r, sc = await run(s, "typescript", "console.log(y + 1, g(10));", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "42 13\n", sc
    # Files written in one run are in the workspace of the next, listed and readable.
    r, sc = await run(s, "python", "open('notes.txt', 'w').write('kept ' + str(x))", session=sid)
    ok(r, sc)
    assert any(e["path"] == "notes.txt" for e in sc["workspace_files"]), sc
    res = await s.read_resource(f"codebox://sessions/{sid}/workspace/notes.txt")
    assert res.contents[0].text == "kept 42", res
    r = await s.call_tool("close_session", {"session": sid})
    assert not r.is_error, text_of(r)
    r, sc = await run(s, "python", "print(x)", session=sid)
    assert r.is_error and "was closed" in text_of(r), text_of(r)


@case
async def sessions_without_keep_alive_share_only_the_workspace(s, w):
    r, sc = await run(s, "python", "x = 1\nopen('a.txt', 'w').write('one')", session="new",
                      files={"in/data.txt": "given"})
    ok(r, sc)
    sid = sc["session"]["id"]
    r, sc = await run(s, "typescript", "console.log(Deno.readTextFileSync('a.txt'), Deno.readTextFileSync('in/data.txt'));", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "one given\n", sc
    r, sc = await run(s, "python", "print('x' in globals())", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "False\n", "a fresh interpreter per run without keep_alive"
    await s.call_tool("close_session", {"session": sid})


ENOSPC_PROBE = """
import errno
def enospc(fn):
    try:
        fn()
    except OSError as e:
        return e.errno == errno.ENOSPC
    return False
"""


async def usage_of(s, sid):
    r, sc = await run(s, "python", "pass", session=sid)
    return sc["workspace_usage"]


@case
async def workspace_quota_exceeded_fails_cleanly(s, w):
    r, sc = await run(s, "python", "open('keep.txt', 'w').write('small')", session="new")
    ok(r, sc)
    sid = sc["session"]["id"]
    # All at once: the kernel refuses the write past the quota; the run says so.
    r, sc = await run(s, "python", ENOSPC_PROBE + "print(enospc(lambda: open('big.bin', 'wb').write(b'x' * 2_000_000)))", session=sid)
    assert r.is_error and sc["workspace_quota_exceeded"] and sc["stdout"] == "True\n", sc
    assert "quota" in sc["stderr"], sc["stderr"]
    assert sc["workspace_usage"]["bytes"] <= 1024 * 1024, sc["workspace_usage"]
    # /workspace/out is there from the start, and one of the workspace's entries.
    assert {e["path"] for e in sc["workspace_files"]} == {"keep.txt", "big.bin", "out"}, sc["workspace_files"]
    # Deleting makes room again.
    r, sc = await run(s, "python", "import os\nos.remove('big.bin')\nopen('ok.bin', 'wb').write(b'y' * 500_000)", session=sid)
    ok(r, sc)
    assert not sc.get("workspace_quota_exceeded"), sc
    # Little by little: the write that crosses the quota fails while the run goes on.
    slow = ENOSPC_PROBE + "f = open('grow.bin', 'wb')\ndef grow():\n    for i in range(100):\n        f.write(b'x' * 100_000); f.flush()\nprint(enospc(grow))"
    r, sc = await run(s, "python", slow, session=sid)
    assert r.is_error and sc["workspace_quota_exceeded"] and sc["stdout"] == "True\n", sc
    r, sc = await run(s, "python", "import os\nos.remove('grow.bin')\nos.remove('ok.bin')", session=sid)
    ok(r, sc)
    # Too many entries.
    r, sc = await run(s, "python", ENOSPC_PROBE + "import os\ndef many():\n    for i in range(80):\n        open(f'f{i}', 'w').close()\nprint(enospc(many))", session=sid)
    assert r.is_error and sc["workspace_quota_exceeded"] and sc["stdout"] == "True\n", sc
    assert sc["workspace_usage"]["entries"] <= 50, sc["workspace_usage"]
    r, sc = await run(s, "python", "import os\nfor n in os.listdir('.'):\n    n in ('keep.txt', 'out') or os.remove(n)\nprint(sorted(os.listdir('.')))", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "['keep.txt', 'out']\n", sc
    r = await s.call_tool("close_session", {"session": sid})
    assert not r.is_error and "deleted" in text_of(r), text_of(r)


@case
async def the_quota_cannot_be_walked_around(s, w):
    """Each way around the old tree-walking quota, now against the kernel's limit."""
    r, sc = await run(s, "python", "open('old.bin', 'wb').write(b'o' * 600_000)", session="new")
    ok(r, sc)
    sid = sc["session"]["id"]
    # Blocks past the end of a file (fallocate with FALLOC_FL_KEEP_SIZE).
    falloc = ENOSPC_PROBE + """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open('sparse', os.O_CREAT | os.O_WRONLY)
r = libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(50 << 20))
print(r, ctypes.get_errno(), os.stat('sparse').st_size)
"""
    r, sc = await run(s, "python", falloc, session=sid)
    assert sc["stdout"] == "-1 28 0\n", sc
    # Growing a file that existed before the run.
    r, sc = await run(s, "python", ENOSPC_PROBE + "print(enospc(lambda: open('old.bin', 'ab').write(b'g' * 1_000_000)))", session=sid)
    assert sc["stdout"] == "True\n" and sc["workspace_quota_exceeded"], sc
    assert sc["workspace_usage"]["bytes"] <= 1024 * 1024, sc["workspace_usage"]
    # Names that are not UTF-8.
    names = ENOSPC_PROBE + "import os\nos.remove('old.bin')\ndef bad():\n    for i in range(4):\n        open(b'\\xff\\xfe' + bytes([0x80 + i]), 'wb').write(b'n' * 400_000)\nprint(enospc(bad), len(os.listdir(b'.')))"
    r, sc = await run(s, "python", names, session=sid)
    assert sc["stdout"].startswith("True") and sc["workspace_quota_exceeded"], sc
    assert sc["workspace_usage"]["bytes"] <= 1024 * 1024, sc["workspace_usage"]
    assert any("\ufffd" in e["path"] for e in sc["workspace_files"]), sc["workspace_files"]
    # Hard links (no new inode, but a name each) and extended attributes count too.
    links = ENOSPC_PROBE + "import os\nfor n in os.listdir(b'.'):\n    n == b'out' or os.remove(n)\nopen('t', 'w').close()\ndef link():\n    for i in range(200):\n        os.link('t', f'l{i}')\ndef xattr():\n    for i in range(10000):\n        os.setxattr('t', f'user.a{i}', b'x' * 4000)\nprint(enospc(link), enospc(xattr))"
    r, sc = await run(s, "python", links, session=sid)
    assert sc["stdout"] == "True True\n", sc
    # Deeper than any walk went: depth is no way around the entry limit either.
    deep = ENOSPC_PROBE + "import os\nfor n in os.listdir(b'.'):\n    n == b'out' or os.remove(n)\ndef dig():\n    for i in range(1000):\n        os.mkdir('d'); os.chdir('d')\nprint(enospc(dig))"
    r, sc = await run(s, "python", deep, session=sid)
    assert sc["stdout"] == "True\n" and sc["workspace_quota_exceeded"], sc
    assert sc["workspace_usage"]["entries"] <= 50, sc["workspace_usage"]
    # Closing really deletes, whatever the names and the depth.
    r = await s.call_tool("close_session", {"session": sid})
    assert not r.is_error and "deleted" in text_of(r), text_of(r)


@case
async def a_session_workspace_is_nosuid_nodev_noexec_and_stays_so(s, w):
    code = """import ctypes, os, subprocess
opts = [l.split()[5] for l in open('/proc/self/mountinfo') if l.split()[4] == '/workspace']
print(sorted(set(opts[0].split(',')) & {'nosuid', 'nodev', 'noexec'}))
open('x.py', 'w').write('#!/usr/bin/python3\\nprint(1)\\n'); os.chmod('x.py', 0o755)
try:
    subprocess.run(['./x.py']); print('executed')
except PermissionError:
    print('noexec')
libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_BIND = 32, 4096
r = libc.mount(None, b'/workspace', None, MS_REMOUNT | MS_BIND, None)
print(r, ctypes.get_errno())
"""
    r, sc = await run(s, "python", code, session="new")
    ok(r, sc)
    assert sc["stdout"] == "['nodev', 'noexec', 'nosuid']\nnoexec\n-1 1\n", sc
    await s.call_tool("close_session", {"session": sc["session"]["id"]})


@case
async def a_session_that_locks_its_workspace_is_still_deleted(s, w):
    code = "import os\nos.makedirs('a/b')\nopen('a/b/f', 'w').write('x')\nos.chmod('a/b', 0)\nos.chmod('a', 0)\nos.chmod('/workspace', 0)\nprint('locked')"
    r, sc = await run(s, "python", code, session="new")
    assert sc["stdout"] == "locked\n", sc
    r = await s.call_tool("close_session", {"session": sc["session"]["id"]})
    assert not r.is_error and "deleted" in text_of(r), text_of(r)


@case
async def keep_alive_interpreters_cannot_escape_the_quota(s, w):
    # A file unlinked but held open by the live interpreter still counts.
    held = ENOSPC_PROBE + "import os\nf = open('held', 'wb')\nos.remove('held')\nfull = enospc(lambda: [f.write(b'h' * 100_000) for _ in range(30)])\nf.flush()\nprint(full, os.listdir('.'))"
    r, sc = await run(s, "python", held, session="new", keep_alive=True)
    assert sc["stdout"] == "True ['out']\n", sc
    sid = sc["session"]["id"]
    r, sc = await run(s, "python", ENOSPC_PROBE + "print(enospc(lambda: open('new', 'wb').write(b'n' * 200_000)))", session=sid)
    assert sc["stdout"] == "True\n", sc
    r, sc = await run(s, "python", "f.close()\nopen('new', 'wb').write(b'n' * 200_000)\nprint('room again')", session=sid)
    ok(r, sc)
    # A background thread writing between runs meets the same limit.
    bg = ENOSPC_PROBE + """import os, threading, time
import os
os.remove('new')
state = {"errno": None, "written": 0}
def writer():
    with open('bg.bin', 'wb') as f:
        while True:
            try:
                f.write(b'b' * 65536); f.flush(); state["written"] += 65536
            except OSError as e:
                state["errno"] = e.errno
                return
            time.sleep(0.01)
threading.Thread(target=writer, daemon=True).start()
print('started')
"""
    r, sc = await run(s, "python", bg, session=sid)
    ok(r, sc)
    await anyio.sleep(2.5)
    r, sc = await run(s, "python", "print(state['errno'], state['written'] <= 1024 * 1024)", session=sid)
    assert sc["stdout"] == "28 True\n", sc
    assert sc["workspace_usage"]["bytes"] <= 1024 * 1024, sc
    # A run that only reads a workspace filled earlier is not failed for it.
    r, sc = await run(s, "python", "print(len(os.listdir('.')))", session=sid)
    ok(r, sc)
    assert not sc.get("workspace_quota_exceeded"), sc
    # Filled again, to the last inode.
    r, sc = await run(s, "python", ENOSPC_PROBE + "def fill():\n    i = 0\n    while True:\n        open(f'i{i}', 'w').close(); i += 1\nprint(enospc(fill))", session=sid)
    assert sc["stdout"] == "True\n" and sc["workspace_quota_exceeded"], sc
    r, sc = await run(s, "typescript", "console.log('ts runs')", session=sid)
    # TypeScript writes its entry module into the workspace: refused, with the reason.
    assert r.is_error and "No space left on device" in sc["stderr"], sc
    assert "workspace is full" in sc["stderr"] or "codebox-main.ts" in sc["stderr"], sc
    r = await s.call_tool("close_session", {"session": sid})
    assert not r.is_error and "deleted" in text_of(r), text_of(r)


@case
async def idle_sessions_expire_with_their_interpreter_and_directory(s, w):
    r, sc = await run(s, "python", "x = 1\nopen('f', 'w').write('x')", session="new", keep_alive=True)
    ok(r, sc)
    sid = sc["session"]["id"]
    h = await s.call_tool("health", {})
    assert h.structured_content["sessions"]["live_interpreters"] >= 1, h.structured_content
    await anyio.sleep(TTL_S + 2.5)
    r, sc = await run(s, "python", "print(x)", session=sid)
    assert r.is_error and "expired" in text_of(r), text_of(r)
    h = await s.call_tool("health", {})
    assert h.structured_content["sessions"]["live_interpreters"] == 0, h.structured_content


@case
async def keep_alive_timeout_ends_the_interpreter_clearly(s, w):
    r, sc = await run(s, "python", "x = 5", session="new", keep_alive=True)
    ok(r, sc)
    sid = sc["session"]["id"]
    r, sc = await run(s, "python", "while True: pass", session=sid, timeout_ms=500)
    assert r.is_error and sc["timed_out"] and sc["session"]["interpreter"] == "ended", sc
    r, sc = await run(s, "python", "print('x' in globals())", session=sid)
    ok(r, sc)
    assert sc["stdout"] == "False\n" and sc["session"]["interpreter"] == "new", sc
    await s.call_tool("close_session", {"session": sid})


# --- audit --------------------------------------------------------------------------

@case
async def audit_log_chains_records_without_pii_or_code(s, w):
    secret_code = "print('audit-canary-7731')"
    r, sc = await run(s, "python", secret_code)
    ok(r, sc)
    await anyio.sleep(0.5)  # appends run on the blocking pool
    with open(w.audit) as f:
        lines = f.read().splitlines()
    records = [json.loads(l) for l in lines]
    execs = [x for x in records if x["event"] == "execution"]
    calls = [x for x in records if x["event"] == "tool_call"]
    assert len(execs) >= 10 and len(calls) >= 5, (len(execs), len(calls))
    last = execs[-1]
    assert last["code_sha256"] == hashlib.sha256(secret_code.encode()).hexdigest(), last
    assert last["language"] == "python" and last["exit_code"] == 0 and last["rootfs_manifest_sha256"], last
    whole = "\n".join(lines)
    assert "audit-canary-7731" not in whole, "code text in the audit log"
    assert EMAIL not in whole and "example.com" not in whole, "PII in the audit log"
    assert any("workspace_quota" in x["limits_hit"] for x in execs), "limits are recorded"
    check = subprocess.run([CODEBOX, "audit", "verify", w.audit], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + check.stdout
    # Tampering is found.
    tampered = w.audit + ".tampered"
    lines[3] = lines[3].replace('"exit_code":0', '"exit_code":1') if '"exit_code":0' in lines[3] else lines[3].replace('"ok":true', '"ok":false')
    with open(tampered, "w") as f:
        f.write("\n".join(lines) + "\n")
    check = subprocess.run([CODEBOX, "audit", "verify", tampered], capture_output=True, text=True)
    assert check.returncode == 1 and "line 5" in check.stderr, (check.returncode, check.stderr)


async def main():
    passed = failed = 0
    w = World()

    async def report(fn, *args):
        nonlocal passed, failed
        try:
            with anyio.fail_after(120):
                await fn(*args)
            print(f"ok      {fn.__name__}", flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001 - report every failure
            print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
            failed += 1

    try:
        async with stdio_client(w.server()) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                only = os.environ.get("FEATURES_ONLY")
                for fn in CASES:
                    if not only or fn.__name__ in only.split(","):
                        await report(fn, s, w)
        only = os.environ.get("FEATURES_ONLY")
        if not only or "a_killed_server_leaves_no_workspace_behind" in only:
            await report(a_killed_server_leaves_no_workspace_behind, w)
        if not only:
            await report(rate_limit_refuses_with_retry_after, w)
            await report(another_clients_session_is_refused_over_http, w)
            await report(skills_belong_to_their_client_over_http, w)
            await report(an_unwritable_audit_log_is_reported_and_can_refuse, w)
    finally:
        w.tmp.cleanup()
    print(f"{passed} passed, {failed} failed")
    return failed


# --- rate limits, HTTP clients, audit failure (servers of their own) ----------------------

def children_of(pid):
    out = []
    for p in os.listdir("/proc"):
        try:
            st = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            if p.isdigit() and int(st[1]) == int(pid) and st[0] != "Z":
                out.append(int(p))
        except OSError:
            pass
    return out


def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def a_killed_server_leaves_no_workspace_behind(w):
    """SIGKILL to the server: its keeper and spawner go, and with them every session's
    filesystem (there is nothing of it on disk to clean up at the next start)."""
    seen = {}
    try:
        async with stdio_client(w.server()) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                r, sc = await run(s, "python", "open('f', 'wb').write(b'x' * 500_000)\nx = 1", session="new", keep_alive=True)
                ok(r, sc)
                servers = [p for p in children_of(os.getpid()) if b"serve" in open(f"/proc/{p}/cmdline", "rb").read()]
                seen["servers"] = servers
                seen["helpers"] = children_of(servers[0]) if len(servers) == 1 else []
                os.kill(servers[0], 9)
                await anyio.sleep(0.5)
    except Exception:  # noqa: BLE001 - the client sees its server vanish
        pass
    assert len(seen.get("servers", [])) == 1, seen
    helpers = seen["helpers"]
    assert len(helpers) >= 2, f"spawner and keeper expected: {seen}"
    deadline = time.monotonic() + 10
    while any(alive(p) for p in helpers):
        assert time.monotonic() < deadline, f"left behind: {[p for p in helpers if alive(p)]}"
        await anyio.sleep(0.1)


async def rate_limit_refuses_with_retry_after(w):
    params = w.server(CODEBOX_RATE_PER_MINUTE="2", CODEBOX_AUDIT_LOG=w.audit + ".rate")
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for _ in range(2):
                r, sc = await run(s, "python", "print(1)")
                ok(r, sc)
            r, sc = await run(s, "python", "print(1)")
            assert r.is_error and "rate limit" in text_of(r), text_of(r)
            assert sc["error"] == "rate_limited" and 0 < sc["retry_after_ms"] <= 30_000, sc
            # Other tools are not executions and still answer.
            h = await s.call_tool("health", {})
            assert h.structured_content["rate_limits"]["per_minute"] == 2


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def another_clients_session_is_refused_over_http(w):
    port = free_port()
    env = w.env(CODEBOX_HTTP_CLIENTS="alice=token-alice-1,bob=token-bob-2", CODEBOX_AUDIT_LOG=w.audit + ".http")
    proc = subprocess.Popen([CODEBOX, "serve", "--http", f"127.0.0.1:{port}"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    DrainedStderr(proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "serve --http did not start"
                await anyio.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"

        def session_of(token):
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
            return streamable_http_client(url, http_client=client)

        async with session_of("token-alice-1") as (ra, wa):
            async with ClientSession(ra, wa) as alice:
                await alice.initialize()
                r, sc = await run(alice, "python", "secret = 7", session="new", keep_alive=True)
                ok(r, sc)
                sid = sc["session"]["id"]
                async with session_of("token-bob-2") as (rb, wb):
                    async with ClientSession(rb, wb) as bob:
                        await bob.initialize()
                        r, sc = await run(bob, "python", "print(secret)", session=sid)
                        assert r.is_error and "no session" in text_of(r), text_of(r)
                        r = await bob.call_tool("close_session", {"session": sid})
                        assert r.is_error, "bob closed alice's session"
                        try:
                            await bob.read_resource(f"codebox://sessions/{sid}/workspace/x")
                            raise AssertionError("bob read alice's workspace")
                        except Exception as e:  # noqa: BLE001 - the SDK raises McpError
                            assert "no session" in str(e), e
                r, sc = await run(alice, "python", "print(secret)", session=sid)
                ok(r, sc)
                assert sc["stdout"] == "7\n", sc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def write_shared_skill(root, name, code):
    d = os.path.join(root, name)
    os.makedirs(d, mode=0o755)
    with open(os.path.join(d, "SKILL.md"), "w") as f:
        f.write(f'---\nname: {name}\ndescription: "Shared by the operator"\nlanguage: python\n---\nUse it.\n')
    with open(os.path.join(d, "skill.py"), "w") as f:
        f.write(code)
    with open(os.path.join(d, "__init__.py"), "w") as f:
        f.write("from .skill import *\n")
    for p in [d] + [os.path.join(d, x) for x in os.listdir(d)]:
        os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)


async def pool_ready(s):
    deadline = time.monotonic() + 30
    while True:
        h = (await s.call_tool("health", {})).structured_content
        if h["pool"]["languages"]["python"]["idle"] >= 1:
            return
        assert time.monotonic() < deadline, h["pool"]
        await anyio.sleep(0.05)


async def skills_belong_to_their_client_over_http(w):
    """alice and bob (two bearer tokens) each have their own skills; bob can neither see
    nor overwrite alice's; the operator's shared skill is visible to both, read-only."""
    port = free_port()
    shared = os.path.join(w.tmp.name, "shared-skills")
    os.makedirs(shared, mode=0o755)
    write_shared_skill(shared, "common", "WHO = 'operator'\n")
    skills_root = os.path.join(w.tmp.name, "skills-http")
    audit = w.audit + ".skills"
    env = w.env(CODEBOX_HTTP_CLIENTS="alice=token-alice-1,bob=token-bob-2", CODEBOX_AUDIT_LOG=audit,
                CODEBOX_SKILLS_DIR=skills_root, CODEBOX_SKILLS_SHARED=shared)
    proc = subprocess.Popen([CODEBOX, "serve", "--http", f"127.0.0.1:{port}", "--pool-size", "1"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    DrainedStderr(proc)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "serve --http did not start"
                await anyio.sleep(0.1)
        url = f"http://127.0.0.1:{port}/mcp"

        def session_of(token):
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
            return streamable_http_client(url, http_client=client)

        def listed(r):
            return sorted((x["name"], x["origin"]) for x in r.structured_content["skills"])

        alice_code = "WHO = 'alice'\ndef who():\n    return WHO\n"
        async with session_of("token-alice-1") as (ra, wa), session_of("token-bob-2") as (rb, wb):
            async with ClientSession(ra, wa) as alice, ClientSession(rb, wb) as bob:
                await alice.initialize()
                await bob.initialize()
                # Both see the shared skill and import it, from a pooled sandbox: without
                # skills of their own they bind what the pool's sandboxes bind.
                for c in (alice, bob):
                    r = await c.call_tool("list_skills", {})
                    assert listed(r) == [("common", "shared")], r.structured_content
                    await pool_ready(c)
                    r, sc = await run(c, "python", "from skills import common\nprint(common.WHO)")
                    ok(r, sc)
                    assert sc["stdout"] == "operator\n" and sc["start"] == "warm", sc
                r = await alice.call_tool("save_skill", {"name": "tool", "description": "alice's tool",
                                                         "language": "python", "code": alice_code})
                assert not r.is_error, text_of(r)
                r = await alice.call_tool("save_skill", {"name": "secret", "description": "only alice",
                                                         "language": "python", "code": "KEY = 42\n"})
                assert not r.is_error, text_of(r)
                # bob saves the same name: his own skill, not a replacement of alice's.
                r = await bob.call_tool("save_skill", {"name": "tool", "description": "bob's tool",
                                                       "language": "python", "code": "WHO = 'bob'\ndef who():\n    return WHO\n"})
                assert not r.is_error, text_of(r)
                r = await bob.call_tool("list_skills", {})
                assert listed(r) == [("common", "shared"), ("tool", "own")], r.structured_content
                r = await bob.call_tool("get_skill", {"name": "secret"})
                assert r.is_error and "no skill" in text_of(r), text_of(r)
                r = await bob.call_tool("delete_skill", {"name": "secret"})
                assert r.is_error, text_of(r)
                try:
                    await bob.read_resource("codebox://skills/secret/skill.py")
                    raise AssertionError("bob read alice's skill")
                except Exception as e:  # noqa: BLE001 - the SDK raises McpError
                    assert "no skill" in str(e), e
                res = await bob.list_resources()
                assert not any("secret" in str(x.uri) for x in res.resources), res
                await pool_ready(bob)
                r, sc = await run(bob, "python", "import os\nprint(sorted(os.listdir('/skills')))\nfrom skills import tool\nprint(tool.who())")
                ok(r, sc)
                # A pooled sandbox was made before anyone knew whose it would be: a client
                # with skills of its own never gets one.
                assert sc["stdout"] == "['common', 'tool']\nbob\n" and sc["start"] == "cold", sc
                r, sc = await run(bob, "typescript", "console.log([...Deno.readDirSync('/skills')].map(e => e.name).sort().join(','))")
                ok(r, sc)
                assert sc["stdout"] == "common,tool\n", sc
                # alice's runs import hers, and the shared one.
                r, sc = await run(alice, "python", "from skills import tool, secret, common\nprint(tool.who(), secret.KEY, common.WHO)")
                ok(r, sc)
                assert sc["stdout"] == "alice 42 operator\n", sc
                r = await alice.call_tool("get_skill", {"name": "tool"})
                assert r.structured_content["code"] == alice_code and r.structured_content["origin"] == "own"
                # The shared skill is read-only to both.
                for c in (alice, bob):
                    r = await c.call_tool("save_skill", {"name": "common", "description": "mine now",
                                                         "language": "python", "code": "WHO = 'thief'\n"})
                    assert r.is_error and "read-only" in text_of(r), text_of(r)
                    r = await c.call_tool("delete_skill", {"name": "common"})
                    assert r.is_error and "read-only" in text_of(r), text_of(r)
                with open(os.path.join(shared, "common", "skill.py")) as f:
                    assert f.read() == "WHO = 'operator'\n"
                r = await alice.call_tool("delete_skill", {"name": "secret"})
                assert not r.is_error, text_of(r)
        await anyio.sleep(0.5)  # appends run on the blocking pool
        with open(audit) as f:
            records = [json.loads(l) for l in f.read().splitlines()]
        skill_records = [x for x in records if x["event"] == "skill"]
        mine = [x for x in skill_records if x["client"] == "token:alice" and x["name"] == "tool"]
        assert mine and mine[0]["action"] == "save" and mine[0]["outcome"] == "ok", skill_records
        assert mine[0]["code_sha256"] == hashlib.sha256(alice_code.encode()).hexdigest(), mine
        assert mine[0]["code_bytes"] == len(alice_code) and mine[0]["language"] == "python", mine
        assert any(x["action"] == "delete" and x["name"] == "secret" and x["outcome"] == "ok" for x in skill_records)
        assert sum(x["outcome"] == "read_only" for x in skill_records) == 4, skill_records
        assert "alice'" not in json.dumps(skill_records), "code text in the audit log"
        check = subprocess.run([CODEBOX, "audit", "verify", audit], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr + check.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def an_unwritable_audit_log_is_reported_and_can_refuse(w):
    for policy, refused in [("continue", False), ("refuse", True)]:
        config = os.path.join(w.tmp.name, f"audit-{policy}.toml")
        with open(config, "w") as f:
            f.write(f'[audit]\npath = "/dev/full"\non_failure = "{policy}"\n')
        env = w.env(CODEBOX_CONFIG=config)
        del env["CODEBOX_AUDIT_LOG"]
        params = StdioServerParameters(command=CODEBOX, args=["serve"], env=env)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                r, sc = await run(s, "python", "print(1)")
                await anyio.sleep(0.5)
                h = (await s.call_tool("health", {})).structured_content
                assert h["audit"]["healthy"] is False and h["audit"]["last_error"], h["audit"]
                r, sc = await run(s, "python", "print(2)")
                if refused:
                    assert r.is_error and "audit log is unavailable" in text_of(r), text_of(r)
                else:
                    ok(r, sc)
                r = await s.call_tool("save_skill", {"name": "unrecorded", "description": "d",
                                                     "language": "python", "code": "X = 1\n"})
                if refused:
                    assert r.is_error and "audit log is unavailable" in text_of(r), text_of(r)
                else:
                    assert not r.is_error, text_of(r)


if __name__ == "__main__":
    code = anyio.run(main)
    left = processes_with("codebox-features-test")
    sys.exit(1 if code or left else 0)
