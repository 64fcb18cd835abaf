"""Results an agent can use, through `codebox serve` and the official Python MCP SDK: the
value of a program's last expression in both languages (one-shot and keep-alive
sessions), Python's help(), and personal data in a value tokenized.

Usage: results_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import os
import sys
import tempfile

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from helpers import server_env

CODEBOX = sys.argv[1]
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "text", None))


async def run(s, code, tool="execute_python", **args):
    r = await s.call_tool(tool, {"code": code, **args})
    return r, r.structured_content or {}


@case
async def the_last_python_expression_is_the_value(s):
    r, sc = await run(s, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf.a.sum() * 21")
    assert not r.is_error, text_of(r)
    assert sc["value"] == "np.int64(63)", sc
    assert text_of(r).endswith("--- value ---\nnp.int64(63)\n"), text_of(r)
    # Shown as a REPL shows it: repr, after what was printed; None shows nothing.
    r, sc = await run(s, "print('hi')\n'a' + 'b'")
    assert sc["stdout"] == "hi\n" and sc["value"] == "'ab'", sc
    for code in ["print('x')", "None", "x = 1", "def f():\n    return 1", "for i in range(2):\n    i"]:
        r, sc = await run(s, code)
        assert "value" not in sc, (code, sc)
        assert "--- value ---" not in text_of(r), (code, text_of(r))


@case
async def a_failing_last_expression_is_a_traceback_with_the_program_lines(s):
    r, sc = await run(s, "x = 1\n\nx / 0")
    assert r.is_error and "value" not in sc, sc
    err = sc["stderr"]
    assert err.startswith("Traceback (most recent call last):\n"), err
    # Only the program's frame: none of codebox's own.
    assert 'File "/codebox/main.py", line 3, in <module>' in err and "boot" not in err, err
    assert err.endswith("ZeroDivisionError: division by zero\n"), err
    # A syntax error is reported as before, with no frame at all.
    r, sc = await run(s, "1 +")
    assert r.is_error and "SyntaxError" in sc["stderr"] and "Traceback" not in sc["stderr"], sc


@case
async def hostile_values_never_break_the_run(s):
    code = (
        "class Loud:\n"
        "    def __repr__(self):\n"
        "        raise RuntimeError('no repr for you')\n"
        "Loud()"
    )
    r, sc = await run(s, code)
    assert not r.is_error, sc
    assert sc["value"] == "<repr() failed: RuntimeError: no repr for you>", sc
    # A huge repr is cut within the budget's share (a quarter), both ends kept.
    r, sc = await run(s, "list(range(1_000_000))")
    v = sc["value"]
    assert v.startswith("[0, 1, 2,") and v.endswith("]"), (v[:50], v[-50:])
    assert len(v) < 5_200 and "bytes of the value left out" in v, len(v)
    assert sc["output"]["value"]["left_out_bytes"] > 0, sc["output"]
    # A value that is not text of any kind: bytes, with control characters.
    r, sc = await run(s, "bytes(range(8)) + '\\u2028é'.encode()")
    assert sc["value"] == repr(bytes(range(8)) + "\u2028é".encode()), sc
    # A program that writes its own codebox/value line on fd 3 only sets its own value.
    code = (
        "import os\n"
        "os.write(3, b'{\"jsonrpc\":\"2.0\",\"method\":\"codebox/value\",\"params\":{\"repr\":\"forged\"}}\\n')\n"
        "print('after')"
    )
    r, sc = await run(s, code)
    assert sc["stdout"] == "after\n" and sc["value"] == "forged", sc


@case
async def help_prints_pydoc_text_without_a_pager(s):
    r, sc = await run(s, "help(len)")
    assert not r.is_error, sc
    assert sc["stdout"].startswith("Help on built-in function len in module builtins:"), sc["stdout"][:200]
    # Topics come from pydoc_data; interactive help() reads the empty stdin and returns.
    r, sc = await run(s, "help('if')\nhelp()\nprint('still here')", timeout_ms=20000)
    assert not r.is_error, sc
    assert "The \"if\" statement" in sc["stdout"], sc["stdout"][:300]
    assert sc["stdout"].endswith("still here\n"), sc["stdout"][-300:]
    assert "value" not in sc, sc


@case
async def the_last_typescript_expression_is_the_value(s):
    cases = [
        ("const x = 20\nx * 2 + 2", "42"),
        ("const o = { a: [1, 2], b: 'x' }\no;", '{ a: [ 1, 2 ], b: "x" }'),
        ("'str'", '"str"'),
        ("await Promise.resolve(7) // a comment", "7"),
        ("[1, 2, 3]\n  .map((n) => n * 2)\n  .filter((n) => n > 2)", "[ 4, 6 ]"),
        ("new Map([['k', 1]])", 'Map(1) { "k" => 1 }'),
    ]
    for code, expected in cases:
        r, sc = await run(s, code, "execute_typescript")
        assert not r.is_error, (code, text_of(r))
        assert sc.get("value") == expected, (code, sc)
    for code in ["console.log(1)", "const x = 1", "if (true) { 5 }", "undefined", "function f() {}"]:
        r, sc = await run(s, code, "execute_typescript")
        assert not r.is_error and "value" not in sc, (code, sc)
    # An error in the last expression: Deno's report, the line of the program.
    r, sc = await run(s, "const o: any = {}\no.a.b", "execute_typescript")
    assert r.is_error and "value" not in sc, sc
    assert "TypeError" in sc["stderr"] and ".codebox-main.ts:2:" in sc["stderr"], sc["stderr"]


@case
async def sessions_show_each_runs_value(s):
    for tool, runs in [
        ("execute_python", [("x = 5\nx", "5"), ("x + 1", "6"), ("_ * 10", "60"), ("y = 2", None)]),
        ("execute_typescript", [("const x = 5\nx", "5"), ("x + 1", "6"), ("let y = 2", None)]),
    ]:
        session = "new"
        for code, expected in runs:
            r, sc = await run(s, code, tool, session=session, keep_alive=True)
            assert not r.is_error, (tool, code, text_of(r))
            session = sc["session"]["id"]
            assert sc.get("value") == expected, (tool, code, sc)
        await s.call_tool("close_session", {"session": session})
    # A failing run of a session has no value and the next run has its own.
    r, sc = await run(s, "z = 1\nz", session="new", keep_alive=True)
    session = sc["session"]["id"]
    r, sc = await run(s, "1/0", session=session, keep_alive=True)
    assert r.is_error and "value" not in sc, sc
    assert 'File "/codebox/run-2.py", line 1, in <module>\n    1/0\n    ~^~' in sc["stderr"], sc["stderr"]
    r, sc = await run(s, "z + 1", session=session, keep_alive=True)
    assert sc["value"] == "2", sc
    await s.call_tool("close_session", {"session": session})


async def personal_data_in_a_value_is_tokenized(s):
    r, sc = await run(s, "{'who': 'alice@example.com'}")
    assert "alice@example.com" not in sc["value"] and "EMAIL" in sc["value"], sc
    assert "alice@example.com" not in text_of(r), text_of(r)


def server(config):
    env = server_env()
    env["CODEBOX_POOL_SIZE"] = "1"
    if config:
        env["CODEBOX_CONFIG"] = config
    return StdioServerParameters(command=CODEBOX, args=["serve"], env=env)


async def session_cases(config, cases):
    passed = failed = 0
    async with stdio_client(server(config)) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            for fn in cases:
                try:
                    with anyio.fail_after(120):
                        await fn(s)
                    print(f"ok      {fn.__name__}", flush=True)
                    passed += 1
                except Exception as e:  # noqa: BLE001 - report every failure
                    print(f"FAILED  {fn.__name__}: {e!r}", flush=True)
                    failed += 1
    return passed, failed


async def main():
    with tempfile.TemporaryDirectory(prefix="codebox-results-test-") as tmp:
        plain = os.path.join(tmp, "plain.toml")
        with open(plain, "w") as f:
            f.write("")
        pii = os.path.join(tmp, "pii.toml")
        with open(pii, "w") as f:
            f.write('[pii]\nmode = "output"\n')
        p1, f1 = await session_cases(plain, CASES)
        p2, f2 = await session_cases(pii, [personal_data_in_a_value_is_tokenized])
    print(f"{p1 + p2} passed, {f1 + f2} failed")
    return f1 + f2


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
