"""Results an agent can use, through `codebox serve` and the official Python MCP SDK: the
value of a program's last expression in both languages (one-shot and keep-alive
sessions), Python's help(), output files (a matplotlib chart as image content, a 5 MB
binary file byte for byte, CSV and SVG embedded, an image over budget linked, hostile
files refused with reasons, thousands capped), and personal data in values and in output
file names and contents tokenized.

Usage: results_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import base64
import hashlib
import os
import sys
import tempfile

import anyio

from helpers import cases_over_stdio, cpu_seconds, namespace_only, our_serve_pids

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
async def a_program_that_garbles_fd_3_and_waits_costs_the_server_nothing(s):
    # A bad line on fd 3 makes the proxy close the channel; the program then sleeps. The
    # server must idle meanwhile (the microVM driver once polled the closed channel at
    # every turn: a core for the rest of the run).
    [serve] = our_serve_pids()
    before = cpu_seconds(serve)
    r, sc = await run(s, "import os, time\nos.write(3, b'not json\\n')\ntime.sleep(4)\nprint('slept')")
    used = cpu_seconds(serve) - before
    assert sc.get("stdout") == "slept\n", sc
    # The call's own work (a VM's boot under TCG included) is well under a second of the
    # server's CPU; a spinning loop takes the 4 s of the sleep.
    assert used < 2.0, f"the server used {used:.2f} s of CPU during a 4 s sleep"


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
    # Programs a careless rewrite would break run as written (the review's cases): the
    # lexer knows them, and a rewrite that does not parse falls back to the program.
    for code, out in [
        ("console.log('start')\n!function () { console.log('iife ran') }()", "start\niife ran\n"),
        ("class Base {}\nconsole.log('ok')\nclass Child\n  extends Base {}", "ok\n"),
        ("function dec(c: any) { return c }\nconsole.log(1)\n@dec class X {}", "1\n"),
        ("let t = 0\nfor (const x of [1, 2])\n  t += x\nconsole.log(t)", "3\n"),
    ]:
        r, sc = await run(s, code, "execute_typescript")
        assert not r.is_error and sc["stdout"] == out, (code, text_of(r))
    # An error in the last expression: Deno's report, the line of the program.
    r, sc = await run(s, "const o: any = {}\no.a.b", "execute_typescript")
    assert r.is_error and "value" not in sc, sc
    assert "TypeError" in sc["stderr"] and ".codebox-main.ts:2:" in sc["stderr"], sc["stderr"]


@case
@namespace_only("sessions")
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


def png_size(data):
    """(width, height) from a PNG's IHDR, after checking its signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


async def read_blob(s, uri):
    """A binary resource's bytes, page by page (the listing says how many)."""
    listed = {r.uri: r for r in (await s.list_resources()).resources}
    assert uri in listed, (uri, [u for u in listed if "/files/" in u][:5])
    pages = int(listed[uri].description.rsplit("..", 1)[1])
    data = b""
    for n in range(1, pages + 1):
        res = await s.read_resource(f"{uri}?page={n}" if n > 1 else uri)
        data += base64.b64decode(res.contents[0].blob)
    return data, pages


@case
async def a_matplotlib_chart_comes_back_as_image_content(s):
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n"
        "ax.bar(['a', 'b', 'c'], [3, 1, 2])\n"
        "ax.set_title('sales')\n"
        "print('plotted')\n"
    )
    r, sc = await run(s, code)
    assert not r.is_error, text_of(r)
    images = [c for c in r.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png", r.content
    assert png_size(base64.b64decode(images[0].data)) == (400, 300)
    [f] = sc["files"]
    assert f["path"] == "out/figure-1.png" and f["shown"] == "image" and f["mime"] == "image/png", f
    assert "out/figure-1.png (image/png" in text_of(r), text_of(r)
    # The same bytes as a blob resource.
    data, _ = await read_blob(s, f["resource"])
    assert base64.b64encode(data).decode() == images[0].data
    # plt.show() captures at that point (like a notebook) and closes the figure; a
    # figure the program saved itself is not added again at the end.
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2]); plt.show()\n"
        "plt.plot([2, 1]); plt.savefig('/workspace/out/mine.png')\n"
    )
    r, sc = await run(s, code)
    assert [f["path"] for f in sc["files"]] == ["out/figure-1.png", "out/mine.png"], sc["files"]
    assert sum(c.type == "image" for c in r.content) == 2
    assert "cannot be shown" not in sc["stderr"], sc["stderr"]


@case
async def a_five_megabyte_binary_file_round_trips_byte_for_byte(s):
    blob = os.urandom(5 * 1000 * 1000)
    code = (
        "import hashlib, os, shutil\n"
        "os.makedirs('/workspace/out', exist_ok=True)\n"
        "shutil.copy('/workspace/in.bin', '/workspace/out/copy.bin')\n"
        "print(hashlib.sha256(open('/workspace/in.bin', 'rb').read()).hexdigest())\n"
    )
    r, sc = await run(s, code, files={"in.bin": {"base64": base64.b64encode(blob).decode()}})
    assert not r.is_error, text_of(r)
    assert sc["stdout"].strip() == hashlib.sha256(blob).hexdigest()
    [f] = sc["files"]
    assert f["shown"] == "link" and f["bytes"] == len(blob), f
    links = [c for c in r.content if c.type == "resource_link"]
    assert len(links) == 1 and links[0].size == len(blob) and str(links[0].uri) == f["resource"], links
    data, pages = await read_blob(s, f["resource"])
    assert pages == 10 and data == blob, (pages, len(data))


@case
async def csv_svg_and_an_image_over_budget_in_the_form_a_client_uses(s):
    code = (
        "import os, zlib, struct\n"
        "os.makedirs('/workspace/out', exist_ok=True)\n"
        "open('/workspace/out/table.csv', 'w').write('city,n\\nOslo,3\\n')\n"
        "open('/workspace/out/logo.svg', 'w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"/>')\n"
        # A 1000x1000 PNG of noise: about 3 MB, over the 512 KiB shown inline.
        "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
        "raw = b''.join(b'\\0' + os.urandom(3000) for _ in range(1000))\n"
        "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1000, 1000, 8, 2, 0, 0, 0))"
        " + chunk(b'IDAT', zlib.compress(raw, 0)) + chunk(b'IEND', b'')\n"
        "open('/workspace/out/noise.png', 'wb').write(png)\n"
    )
    r, sc = await run(s, code)
    assert not r.is_error, text_of(r)
    shown = {f["path"]: (f["shown"], f["mime"]) for f in sc["files"]}
    assert shown == {
        "out/table.csv": ("embedded", "text/csv"),
        "out/logo.svg": ("embedded", "image/svg+xml"),
        "out/noise.png": ("link", "image/png"),
    }, shown
    embedded = {str(c.resource.uri): c.resource for c in r.content if c.type == "resource"}
    table = next(v for k, v in embedded.items() if k.endswith("table.csv"))
    assert table.text == "city,n\nOslo,3\n" and table.mime_type == "text/csv", table
    [link] = [c for c in r.content if c.type == "resource_link"]
    assert link.mime_type == "image/png" and link.size > 3_000_000, link
    assert not [c for c in r.content if c.type == "image"], "over budget: a link, never inline"


@case
async def hostile_output_files_are_refused_with_reasons(s):
    # A symlink in /workspace/out is never followed; a file named in outputs may not
    # leave /workspace; a symlinked /workspace/out is not walked.
    code = (
        "import os\n"
        "os.makedirs('/workspace/out/d', exist_ok=True)\n"
        "os.symlink('/etc/passwd', '/workspace/out/passwd')\n"
        "os.symlink('/etc', '/workspace/out/etc')\n"
        "os.mkfifo('/workspace/out/fifo')\n"
        "os.symlink('/etc/hostname', '/workspace/named')\n"
        "open('/workspace/out/d/ok.txt', 'w').write('ok')\n"
    )
    r, sc = await run(s, code, outputs=["named"])
    assert not r.is_error, text_of(r)
    assert [f["path"] for f in sc["files"]] == ["out/d/ok.txt"], sc["files"]
    why = {k["path"]: k["why"] for k in sc["files_skipped"]}
    assert why["out/passwd"] == "a symlink (never followed)", why
    assert why["out/etc"] == "a symlink (never followed)", why
    assert why["out/fifo"] == "not a regular file", why
    assert "symlink" in why["named"], why
    assert "root:" not in text_of(r)
    # Output files and a cut stdout of one run: both readable.
    code = (
        "open('/workspace/out/a.txt', 'w').write('hi')\n"
        "for i in range(20000): print('line', i)\n"
    )
    r, sc = await run(s, code)
    res = await s.read_resource(sc["output"]["stdout"]["resource"])
    assert res.contents[0].text.startswith("line 0\n"), res.contents[0].text[:50]
    res = await s.read_resource(sc["files"][0]["resource"])
    assert res.contents[0].text == "hi", res
    # /workspace/out is there from the start; a program that swaps it for a symlink
    # gets nothing through it.
    r, sc = await run(s, "import os\nos.rmdir('/workspace/out')\nos.symlink('/etc', '/workspace/out')")
    assert "files" not in sc and sc["files_skipped"][0]["path"] == "out", sc
    for bad in ["../etc/passwd", "/etc/passwd", "a/../../b", ""]:
        r = await s.call_tool("execute_python", {"code": "1", "outputs": [bad]})
        assert r.is_error and "outputs: file path" in text_of(r), (bad, text_of(r))
    # Thousands of files: capped at the count returned, the rest counted.
    code = (
        "for i in range(3000): open(f'/workspace/out/f{i:04d}.txt', 'w').write('x')\n"
    )
    r, sc = await run(s, code)
    assert len(sc["files"]) == 50 and sc["files_omitted"] == 2950, (len(sc["files"]), sc.get("files_omitted"))
    assert "2950 more files not returned" in text_of(r), text_of(r)[-300:]
    # Lines the program writes itself on fd 3 only make its own result: a path that
    # escapes is refused there too.
    code = (
        "import os\n"
        "os.write(3, b'{\"jsonrpc\":\"2.0\",\"method\":\"codebox/file\",\"params\":"
        "{\"path\":\"../../etc/shadow\",\"offset\":0,\"base64\":\"eA==\"}}\\n')\n"
    )
    r, sc = await run(s, code)
    assert "files" not in sc and "file path" in sc["files_skipped"][0]["why"], sc


@case
@namespace_only("sessions")
async def typescript_files_and_sessions_return_what_each_run_wrote(s):
    code = (
        "Deno.writeTextFileSync('/workspace/out/a.json', JSON.stringify({ x: 1 }));\n"
        "Deno.symlinkSync('/etc/passwd', '/workspace/out/evil');\n"
        "Deno.writeTextFileSync('/workspace/report.md', '# hi');\n"
    )
    r, sc = await run(s, code, "execute_typescript", outputs=["report.md"])
    assert not r.is_error, text_of(r)
    assert [f["path"] for f in sc["files"]] == ["report.md", "out/a.json"], sc["files"]
    assert sc["files_skipped"] == [{"path": "out/evil", "why": "a symlink (never followed)"}], sc
    # Deno.exit() before the end: the files still go.
    r, sc = await run(s, "Deno.writeTextFileSync('/workspace/out/x.txt', 'x'); Deno.exit(3)", "execute_typescript")
    assert sc["exit_code"] == 3 and [f["path"] for f in sc["files"]] == ["out/x.txt"], sc
    # In a session each run returns the files it wrote, not the earlier runs' again.
    for tool, runs in [
        ("execute_python", ["open('/workspace/out/1.txt', 'w').write('1')",
                            "open('/workspace/out/2.txt', 'w').write('2')", "print('nothing new')"]),
        ("execute_typescript", ["Deno.writeTextFileSync('/workspace/out/1.txt', '1')",
                                "Deno.writeTextFileSync('/workspace/out/2.txt', '2')", "console.log('nothing new')"]),
    ]:
        session = "new"
        got = []
        for code in runs:
            r, sc = await run(s, code, tool, session=session, keep_alive=True)
            assert not r.is_error, (tool, text_of(r))
            session = sc["session"]["id"]
            got.append([f["path"] for f in sc.get("files", [])])
        assert got == [["out/1.txt"], ["out/2.txt"], []], (tool, got)
        await s.call_tool("close_session", {"session": session})


async def personal_data_in_a_value_is_tokenized(s):
    r, sc = await run(s, "{'who': 'alice@example.com'}")
    assert "alice@example.com" not in sc["value"] and "EMAIL" in sc["value"], sc
    assert "alice@example.com" not in text_of(r), text_of(r)


async def personal_data_in_output_files_is_tokenized_and_images_withheld(s):
    code = (
        "import os\n"
        "os.makedirs('/workspace/out', exist_ok=True)\n"
        "open('/workspace/out/alice@example.com.csv', 'w').write('who\\nbob@example.org\\n')\n"
        "open('/workspace/out/chart.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + bytes(100))\n"
    )
    r, sc = await run(s, code)
    assert not r.is_error, text_of(r)
    whole = text_of(r) + str(sc) + str([c.model_dump() for c in r.content])
    assert "alice@example.com" not in whole and "bob@example.org" not in whole, whole
    by_mime = {f["mime"]: f for f in sc["files"]}
    csv = by_mime["text/csv"]
    assert "EMAIL" in csv["path"] and csv["shown"] == "embedded", csv
    png = by_mime["image/png"]
    assert png["shown"] == "withheld" and "resource" not in png, png
    assert not [c for c in r.content if c.type == "image"]
    # The tokenized name is the resource's; reading it gives tokenized text.
    res = await s.read_resource(csv["resource"])
    assert "EMAIL" in res.contents[0].text and "bob@" not in res.contents[0].text, res
    # Reasons for skipped files are tokenized too, whoever wrote them: an unreadable
    # directory (Deno's own error would name it) and a summary the program forged.
    code = (
        "Deno.mkdirSync('/workspace/out/bob@example.org', { recursive: true });\n"
        "Deno.chmodSync('/workspace/out/bob@example.org', 0o000);\n"
    )
    r, sc = await run(s, code, "execute_typescript")
    assert "bob@example.org" not in text_of(r) + str(sc), sc
    code = (
        "import os, json\n"
        "os.write(3, json.dumps({'jsonrpc': '2.0', 'method': 'codebox/files', 'params': "
        "{'skipped': [{'path': 'out/x', 'why': 'customer alice@example.com'}]}}).encode() + b'\\n')\n"
    )
    r, sc = await run(s, code)
    assert "alice@example.com" not in text_of(r) + str(sc) and "EMAIL" in str(sc["files_skipped"]), sc



async def main():
    with tempfile.TemporaryDirectory(prefix="codebox-results-test-") as tmp:
        plain = os.path.join(tmp, "plain.toml")
        with open(plain, "w") as f:
            f.write("")
        pii = os.path.join(tmp, "pii.toml")
        with open(pii, "w") as f:
            f.write('[pii]\nmode = "output"\n')
        p1, f1 = await cases_over_stdio(CODEBOX, plain, CASES)
        p2, f2 = await cases_over_stdio(CODEBOX, pii, [
            personal_data_in_a_value_is_tokenized,
            personal_data_in_output_files_is_tokenized_and_images_withheld,
        ])
    print(f"{p1 + p2} passed, {f1 + f2} failed")
    return f1 + f2


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
