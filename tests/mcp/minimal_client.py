"""`tools = "minimal"` end to end, with the official Python MCP SDK as the model's client:
only the execute tools and search_tools are listed; skills and health are reached from
sandboxed code (Python `codebox.save_skill/list_skills/health`, TypeScript
`saveSkill/listSkills/health`) and as resources (`codebox://health`,
`codebox://sessions`). The server runs with `concurrency = 1`, so a skill saved from
code has its syntax check run while the execution holds the only slot: it must not
wait for itself.

Usage: minimal_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import json
import os
import sys
import tempfile
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError as McpError

from helpers import server_env

CODEBOX = sys.argv[1]
CASES = []
# A save from code waits at most 30 s for a slot; a hang would show as a much longer run.
SAVE_BOUND_S = 25


def case(fn):
    CASES.append(fn)
    return fn


class World:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="codebox-minimal-test-")
        root = self.tmp.name
        os.chmod(root, 0o755)
        self.skills = os.path.join(root, "skills")
        self.audit = os.path.join(root, "audit", "audit.jsonl")
        self.mcp = os.path.join(root, "mcp.json")
        with open(self.mcp, "w") as f:
            json.dump({"mcpServers": {}}, f)

    def params(self):
        env = server_env()
        env.update({
            "CODEBOX_TOOLS": "minimal",
            "CODEBOX_CONCURRENCY": "1",
            "CODEBOX_QUEUE": "4",
            "CODEBOX_SKILLS_DIR": self.skills,
            "CODEBOX_AUDIT_LOG": self.audit,
            "CODEBOX_MCP_CONFIG": self.mcp,
        })
        return StdioServerParameters(command=CODEBOX, args=["serve"], env=env)

    def audit_records(self):
        with open(self.audit) as f:
            return [json.loads(line) for line in f if line.strip()]


async def py(s, code, **extra):
    r = await s.call_tool("execute_python", {"code": code, **extra})
    return r, r.structured_content


async def ts(s, code, **extra):
    r = await s.call_tool("execute_typescript", {"code": code, **extra})
    return r, r.structured_content


@case
async def only_the_minimal_tools_are_listed(s, w):
    tools = (await s.list_tools()).tools
    names = sorted(t.name for t in tools)
    assert names == ["execute_python", "execute_typescript", "search_tools"], names
    by = {t.name: t for t in tools}
    assert "codebox.save_skill(" in by["execute_python"].description, by["execute_python"].description
    assert "saveSkill" in by["execute_typescript"].description, by["execute_typescript"].description
    props = by["execute_python"].input_schema["properties"]
    assert "session" in props and "pii" not in props and "allowed_tools" not in props, props


@case
async def a_hidden_tool_is_refused_naming_the_setting(s, w):
    for name in ["save_skill", "health", "list_skills"]:
        try:
            r = await s.call_tool(name, {})
        except McpError as e:
            assert 'tools = "minimal"' in str(e) and "CODEBOX_TOOLS" in str(e), e
            continue
        assert r.is_error and 'tools = "minimal"' in r.content[0].text, r


@case
async def python_saves_a_skill_from_code_at_concurrency_one(s, w):
    code = (
        "import codebox\n"
        "r = codebox.save_skill('py_double', 'def double(x):\\n    return 2 * x\\n', 'doubles a number')\n"
        "print(r['name'], r['language'], r['import'])\n"
    )
    started = time.monotonic()
    # allowed_tools = []: saving a skill is codebox's own capability, not an upstream tool.
    r, sc = await py(s, code, allowed_tools=[])
    took = time.monotonic() - started
    assert not r.is_error and sc["stdout"].startswith("py_double python "), sc
    assert took < SAVE_BOUND_S, f"the save took {took:.1f} s"
    r, sc = await py(s, "from skills import py_double\nprint(py_double.double(21))")
    assert not r.is_error and sc["stdout"] == "42\n", sc


@case
async def typescript_saves_a_skill_from_code(s, w):
    code = (
        'import { saveSkill } from "/opt/codebox/deno/codebox.ts";\n'
        "const r = await saveSkill({ name: 'ts_triple', description: 'triples a number',\n"
        "  code: 'export function triple(x: number): number { return 3 * x; }\\n' });\n"
        "console.log(r.name, r.language);\n"
    )
    r, sc = await ts(s, code)
    assert not r.is_error and sc["stdout"] == "ts_triple typescript\n", sc
    r, sc = await ts(s, 'import { triple } from "/skills/ts_triple/skill.ts";\nconsole.log(triple(14));')
    assert not r.is_error and sc["stdout"] == "42\n", sc


@case
async def skills_and_health_are_read_from_code(s, w):
    code = (
        "import codebox\n"
        "names = sorted(k['name'] for k in codebox.list_skills())\n"
        "h = codebox.health()\n"
        "print(names, h['version'] != '', h['concurrency'], h['context_tokens']['tools'])\n"
    )
    r, sc = await py(s, code)
    assert not r.is_error and sc["stdout"] == "['py_double', 'ts_triple'] True 1 minimal\n", sc
    code = (
        'import { health, listSkills } from "/opt/codebox/deno/codebox.ts";\n'
        "const h = await health();\n"
        "const skills = await listSkills('triples') as { name: string }[];\n"
        "console.log(skills.map((k) => k.name).join(','), typeof h.version);\n"
    )
    r, sc = await ts(s, code)
    assert not r.is_error and sc["stdout"] == "ts_triple string\n", sc


@case
async def hostile_saves_are_refused_with_reasons(s, w):
    code = (
        "import codebox\n"
        "tries = {\n"
        "  'big': dict(name='big', code='x = 1\\n' * 50000, description='too large'),\n"
        "  'path': dict(name='../escape', code='x = 1\\n', description='bad name'),\n"
        "  'syntax': dict(name='broken', code='def (:\\n', description='bad code'),\n"
        "  'lang': dict(name='odd', code='x = 1\\n', description='d', language='cobol'),\n"
        "}\n"
        "for what, kw in tries.items():\n"
        "    try:\n"
        "        codebox.save_skill(**kw)\n"
        "        print(what, 'SAVED')\n"
        "    except codebox.ToolError as e:\n"
        "        print(what, e.code, str(e)[:200].replace('\\n', ' '))\n"
        "try:\n"
        "    codebox._channel.request('codebox/save_skill', ['not', 'an', 'object'])\n"
        "except codebox.ToolError as e:\n"
        "    print('array', e.code)\n"
    )
    r, sc = await py(s, code)
    assert not r.is_error, sc
    lines = dict(line.split(" ", 1) for line in sc["stdout"].splitlines())
    assert "SAVED" not in sc["stdout"], sc["stdout"]
    assert lines["big"].startswith("-32006") and "code" in lines["big"], lines
    assert lines["path"].startswith("-32006"), lines
    assert lines["syntax"].startswith("-32006") and "syntax" in lines["syntax"].lower(), lines
    assert lines["lang"].startswith("-32006"), lines
    assert lines["array"] == "-32602", lines
    # Nothing of them was saved, and nothing outside the skills store was written.
    r, sc = await py(s, "import codebox; print(sorted(k['name'] for k in codebox.list_skills()))")
    assert sc["stdout"] == "['py_double', 'ts_triple']\n", sc
    assert not os.path.exists(os.path.join(w.skills, "..", "escape")), os.listdir(os.path.dirname(w.skills))


@case
async def saves_from_code_are_audited_for_the_calling_client(s, w):
    saves = [r for r in w.audit_records() if r.get("event") == "skill"]
    by_name = {(r["name"], r["outcome"]) for r in saves}
    assert ("py_double", "ok") in by_name and ("ts_triple", "ok") in by_name, saves
    assert ("broken", "invalid") in by_name, saves
    assert all(r["client"] == "stdio" for r in saves), saves


@case
async def health_and_sessions_are_resources(s, w):
    uris = {str(r.uri) for r in (await s.list_resources()).resources}
    assert {"codebox://health", "codebox://sessions"} <= uris, uris
    assert "codebox://skills/py_double/skill.py" in uris, uris
    health = json.loads((await s.read_resource("codebox://health")).contents[0].text)
    assert health["concurrency"] == 1 and health["context_tokens"]["tools"] == "minimal", health
    sessions = json.loads((await s.read_resource("codebox://sessions")).contents[0].text)
    assert sessions["sessions"] == [], sessions
    r, sc = await py(s, "open('kept.txt', 'w').write('x' * 10)", session="new")
    assert not r.is_error, sc
    sid = sc["session"]["id"]
    sessions = json.loads((await s.read_resource("codebox://sessions")).contents[0].text)
    assert [x["id"] for x in sessions["sessions"]] == [sid], sessions
    assert sessions["sessions"][0]["workspace_entries"] >= 1, sessions


async def main():
    w = World()
    passed = failed = 0
    async with stdio_client(w.params()) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for fn in CASES:
                try:
                    with anyio.fail_after(120):
                        await fn(s, w)
                    print(f"ok   {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure and go on
                    print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
                    failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
