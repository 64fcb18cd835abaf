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
- `zeros(bytes)`: structuredContent `{"zeros": [0, 0, ...]}` of about `bytes` bytes (a
  small answer on the wire that parses into a value per two bytes)

With `HOSTILE_BANNER=1` it prints a line that is not JSON before anything else. How it
starts (for codebox's start-up and reconnection tests):
- `HOSTILE_REFUSE_IF=PATH`: while PATH exists, exits at once with status 3 (a server
  that fails to start);
- `HOSTILE_HANG=1`: reads its input and never answers (hangs in `initialize`);
- `HOSTILE_DELAY_S=N`: sleeps N seconds before it reads anything (a slow start);
- `HOSTILE_START_WHEN=PATH`: reads nothing until PATH exists (a start the test decides);
- `HOSTILE_STDERR_FLOOD=N`: a thread writes N MB of lines to stderr as fast as it can.

`hostile_server.py --http PORT` serves the same over streamable HTTP at
http://127.0.0.1:PORT/mcp, without sessions: each answer is the POST's response body,
as `application/json`, or as one `text/event-stream` event when the call has `sse`.
"""

import json
import os
import sys
import threading

out = sys.stdout.buffer
# Lines of the answer being built (HTTP mode collects them per request).
local = threading.local()

TOOLS = ["echo", "big", "bad_utf8", "not_jsonrpc", "unknown_id", "big_noid", "pid", "zeros"]
SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "bytes": {"type": "integer"},
        "id_last": {"type": "boolean"},
        "sse": {"type": "boolean"},
    },
}


def write(raw: bytes):
    lines = getattr(local, "lines", None)
    if lines is not None:
        lines.append(raw)
        return
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
    elif name == "zeros":
        head = json.dumps({"jsonrpc": "2.0", "id": rid}).encode()[:-1]
        body = b",".join([b"0"] * max(1, n // 2))
        write(head + b',"result":{"content":[],"structuredContent":{"zeros":[' + body + b"]}}}")
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "no such tool"}})


def handle(msg):
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        return
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

def stdio():
    refuse = os.environ.get("HOSTILE_REFUSE_IF")
    if refuse and os.path.exists(refuse):
        sys.stderr.write(f"hostile server: refusing to start while {refuse} exists\n")
        sys.exit(3)
    if os.environ.get("HOSTILE_STDERR_FLOOD"):
        megabytes = int(os.environ["HOSTILE_STDERR_FLOOD"])
        def flood():
            line = "hostile server: noise " + "x" * 200 + "\n"
            for _ in range(megabytes * 1_000_000 // len(line)):
                sys.stderr.write(line)
        threading.Thread(target=flood, daemon=True).start()
    if os.environ.get("HOSTILE_DELAY_S"):
        import time
        time.sleep(float(os.environ["HOSTILE_DELAY_S"]))
    if os.environ.get("HOSTILE_START_WHEN"):
        import time
        while not os.path.exists(os.environ["HOSTILE_START_WHEN"]):
            time.sleep(0.05)
    if os.environ.get("HOSTILE_HANG") == "1":
        for _ in sys.stdin.buffer:
            pass
        return
    if os.environ.get("HOSTILE_BANNER") == "1":
        write(b"hostile server starting")
    for line in sys.stdin.buffer:
        if line.strip():
            handle(json.loads(line))


def http(port):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            msg = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            local.lines = []
            try:
                handle(msg)
                lines = local.lines
            finally:
                local.lines = None
            if not lines:
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            args = (msg.get("params") or {}).get("arguments") or {}
            if args.get("sse"):
                body = b"".join(b"event: message\ndata: " + l + b"\n\n" for l in lines)
                kind = "text/event-stream"
            else:
                body, kind = lines[-1], "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_DELETE = do_GET

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            pass  # clients hang up on answers they refuse

    Server(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        http(int(sys.argv[2]))
    else:
        stdio()
