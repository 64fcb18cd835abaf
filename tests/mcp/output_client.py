"""The model-facing output budget through `codebox serve`, driven by the official Python
MCP SDK: a noisy program's result keeps the head, a marker and the end within the
budget; the whole output is readable as the caller's resource, page by page; a call may
ask for another budget within the server's bounds; personal data is tokenized in kept
output too.

Usage: output_client.py CODEBOX_BINARY
Prints one line per case and "N passed, M failed".
"""

import os
import sys
import tempfile

import anyio
from mcp import ClientSession
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError as McpError

from helpers import cases_over_stdio, stdio_params

CODEBOX = sys.argv[1]
CASES = []


def case(fn):
    CASES.append(fn)
    return fn


def text_of(r):
    return "\n".join(c.text for c in r.content if getattr(c, "text", None))


async def run(s, code, **args):
    r = await s.call_tool("execute_python", {"code": code, **args})
    return r, r.structured_content or {}


async def read_all_pages(s, uri):
    """Every page of a kept stream, concatenated, and the number of pages."""
    listed = {r.uri: r for r in (await s.list_resources()).resources}
    assert uri in listed, (uri, list(listed)[:5])
    pages = int(listed[uri].description.rsplit("..", 1)[1])
    text = ""
    for n in range(1, pages + 1):
        res = await s.read_resource(f"{uri}?page={n}")
        text += res.contents[0].text
    try:
        await s.read_resource(f"{uri}?page={pages + 1}")
        raise AssertionError("a page past the last one was served")
    except McpError as e:
        assert f"there are {pages} pages" in str(e), e
    return text, pages


@case
async def ten_megabytes_then_a_final_line_keep_head_marker_and_end(s):
    code = (
        "import sys\n"
        "for i in range(100_000):\n"
        "    sys.stdout.write(f'line {i:06d} ' + 'x' * 88 + '\\n')\n"
        "print('FINAL: 42 rows failed')\n"
    )
    r, sc = await run(s, code)
    assert not r.is_error, text_of(r)
    text = text_of(r)
    out = sc["stdout"]
    assert out.startswith("line 000000 "), out[:100]
    assert out.endswith("FINAL: 42 rows failed\n"), out[-200:]
    assert "lines) of stdout left out here; the whole stdout: codebox://executions/" in out
    cut = sc["output"]["stdout"]
    assert sc["output"]["budget_chars"] == 20000
    assert cut["kept_chars"] <= 20000 and cut["left_out_lines"] > 0, cut
    # The text and structuredContent carry the same kept output, once each.
    assert out in text
    assert len(text) < 20000 + 1000, len(text)
    assert sc["stdout_total_bytes"] == 100_000 * 101 + 22, sc["stdout_total_bytes"]
    # The whole captured stream (1 MiB: its head and its end) is the caller's resource.
    whole, pages = await read_all_pages(s, cut["resource"])
    assert pages > 1, pages
    assert whole.startswith("line 000000 ") and whole.endswith("FINAL: 42 rows failed\n")
    assert "bytes of stdout were not kept here" in whole
    print(f"        10 MB of stdout: {len(text)} characters returned "
          f"(stdout {len(out)}); the kept stream {len(whole)} bytes in {pages} pages")


@case
async def a_call_chooses_its_budget_within_the_bounds(s):
    code = "print('y' * 50_000)\nimport sys; print('the end', file=sys.stderr)"
    r, sc = await run(s, code, output_budget=5000)
    assert not r.is_error, text_of(r)
    assert sc["output"]["budget_chars"] == 5000
    assert len(sc["stdout"]) < 5000 + 300, len(sc["stdout"])
    assert sc["stderr"] == "the end\n", "the small stream is whole"
    assert sc["output"]["stderr"] is None
    for bad in (10, 10**9):
        r, _ = await run(s, "print(1)", output_budget=bad)
        assert r.is_error and "output_budget must be between 1000 and 200000" in text_of(r), text_of(r)
    r, sc = await run(s, "print('short')")
    assert "output" not in sc and sc["stdout"] == "short\n", sc


@case
async def non_utf8_output_is_shown_escaped_never_a_crash(s):
    code = "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe ' * 10_000)\nsys.stdout.buffer.write(b'\\nend\\n')"
    r, sc = await run(s, code)
    assert not r.is_error, text_of(r)
    assert "\ufffd" in sc["stdout"] and sc["stdout"].endswith("end\n")


@case
async def another_connection_cannot_read_the_kept_output(s):
    r, sc = await run(s, "print('secret ' * 10_000)")
    uri = sc["output"]["stdout"]["resource"]
    async with stdio_client(stdio_params(CODEBOX)) as (read, write):
        async with ClientSession(read, write) as other:
            await other.initialize()
            try:
                await other.read_resource(uri)
                raise AssertionError("another server process served it")
            except McpError as e:
                assert "unknown resource" in str(e), e
    # Nor is a made-up id or stream readable here.
    for bad in (uri.replace("stdout", "stdin"), uri[:-20] + "0" * 14 + "/stdout", uri + "?page=0"):
        try:
            await s.read_resource(bad)
            raise AssertionError(f"{bad} was served")
        except McpError:
            pass


@case
async def a_binary_file_round_trips_in_and_out_byte_for_byte(s):
    import base64
    import hashlib
    data = os.urandom(5 << 20)
    code = ("import hashlib\n"
            "b = open('/workspace/in.bin', 'rb').read()\n"
            "open('/workspace/out.bin', 'wb').write(b[::-1])\n"
            "print(len(b), hashlib.sha256(b).hexdigest())")
    r, sc = await run(s, code, session="new",
                      files={"in.bin": {"base64": base64.b64encode(data).decode()}, "note.txt": "text"})
    assert not r.is_error, text_of(r)
    assert sc["stdout"] == f"{len(data)} {hashlib.sha256(data).hexdigest()}\n", sc["stdout"]
    uri = f"codebox://sessions/{sc['session']['id']}/workspace/out.bin"
    got, page = b"", 1
    while True:
        try:
            res = await s.read_resource(f"{uri}?page={page}")
        except McpError as e:
            assert "pages" in str(e), e
            break
        got += base64.b64decode(res.contents[0].blob)
        page += 1
    assert got == data[::-1], (len(got), page)
    print(f"        5 MiB binary file in as base64 and out as {page - 1} blob pages, byte for byte")
    await s.call_tool("close_session", {"session": sc["session"]["id"]})
    r, _ = await run(s, "pass", files={"x.bin": {"base64": "not base64!"}})
    assert r.is_error and "\"x.bin\"" in text_of(r) and "base64" in text_of(r), text_of(r)
    big = base64.b64encode(b"\0" * (11 << 20)).decode()
    r, _ = await run(s, "pass", files={"big.bin": {"base64": big}})
    assert r.is_error and "at most 10485760" in text_of(r), text_of(r)


async def personal_data_in_kept_output_is_tokenized(s):
    code = "for i in range(3000):\n    print(f'row {i}: contact alice.smith@example.com')"
    r, sc = await run(s, code)
    assert not r.is_error, text_of(r)
    assert "alice.smith@example.com" not in text_of(r)
    whole, _ = await read_all_pages(s, sc["output"]["stdout"]["resource"])
    assert "alice.smith@example.com" not in whole
    assert "[EMAIL_1]" in whole, whole[:200]



async def main():
    with tempfile.TemporaryDirectory(prefix="codebox-output-test-") as tmp:
        plain = os.path.join(tmp, "plain.toml")
        with open(plain, "w") as f:
            f.write("")
        pii = os.path.join(tmp, "pii.toml")
        with open(pii, "w") as f:
            f.write('[pii]\nmode = "output"\n')
        p1, f1 = await cases_over_stdio(CODEBOX, plain, CASES)
        p2, f2 = await cases_over_stdio(CODEBOX, pii, [personal_data_in_kept_output_is_tokenized])
    print(f"{p1 + p2} passed, {f1 + f2} failed")
    return f1 + f2


if __name__ == "__main__":
    sys.exit(1 if anyio.run(main) else 0)
