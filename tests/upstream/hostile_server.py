"""A stdio MCP server that speaks raw JSON-RPC (no SDK) and can answer badly on purpose.

Tools (all take optional `bytes` and `id_last`):
- `echo(text)`: answers `text`
- `big(bytes, id_last)`: a text result of `bytes` bytes; with `id_last` the `id` member
  comes after `result`, as the TypeScript SDK writes it
- `bad_utf8`: an answer with invalid UTF-8 in its text
- `not_jsonrpc`: `{"jsonrpc": "1.0", ...}` with the request's id
- `unknown_id`: first an answer to an id nobody asked for, then the real answer
- `big_noid(bytes)`: an oversized line without any id, and no answer
- `pid`: this process's pid

With `HOSTILE_BANNER=1` it prints a line that is not JSON before anything else.
"""

import json
import os
import sys

out = sys.stdout.buffer

TOOLS = ["echo", "big", "bad_utf8", "not_jsonrpc", "unknown_id", "big_noid", "pid"]
SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "bytes": {"type": "integer"},
        "id_last": {"type": "boolean"},
    },
}


def write(raw: bytes):
    out.write(raw + b"\n")
    out.flush()


def send(obj):
    write(json.dumps(obj).encode())


def text_result(text: str):
    return {"content": [{"type": "text", "text": text}]}


def answer(rid, result, id_last=False):
    if id_last:
        send({"jsonrpc": "2.0", "result": result, "id": rid})
    else:
        send({"jsonrpc": "2.0", "id": rid, "result": result})


def call(rid, name, args):
    n = int(args.get("bytes", 0))
    if name == "echo":
        answer(rid, text_result(args.get("text", "")))
    elif name == "big":
        answer(rid, text_result("x" * n), bool(args.get("id_last")))
    elif name == "bad_utf8":
        head = json.dumps({"jsonrpc": "2.0", "id": rid}).encode()[:-1]
        write(head + b',"result":{"content":[{"type":"text","text":"bad \xff\xfe bytes"}]}}')
    elif name == "not_jsonrpc":
        send({"jsonrpc": "1.0", "id": rid, "result": text_result("old")})
    elif name == "unknown_id":
        answer(987654321, text_result("for nobody"))
        answer(rid, text_result("for you"))
    elif name == "big_noid":
        send({"jsonrpc": "2.0", "result": text_result("y" * n)})
    elif name == "pid":
        answer(rid, text_result(str(os.getpid())))
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no such tool"}})


def main():
    if os.environ.get("HOSTILE_BANNER") == "1":
        write(b"hostile server starting")
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = json.loads(line)
        method, rid = msg.get("method"), msg.get("id")
        if rid is None:
            continue
        if method == "initialize":
            answer(
                rid,
                {
                    "protocolVersion": msg["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "1"},
                },
            )
        elif method == "tools/list":
            tools = [{"name": t, "description": f"hostile {t}", "inputSchema": SCHEMA} for t in TOOLS]
            answer(rid, {"tools": tools})
        elif method == "tools/call":
            params = msg.get("params") or {}
            call(rid, params.get("name"), params.get("arguments") or {})
        else:
            answer(rid, {})


if __name__ == "__main__":
    main()
